"""MOReL: Model-Based Offline Reinforcement Learning (Kidambi, Rajeswaran, Netrapalli & Joachims, NeurIPS
2020; official code: aravindr93/mjrl, branch v2, ``projects/morel/`` and ``mjrl/algos/mbrl/``).

MOReL plans in a *pessimistic MDP*: an ensemble of dynamics models, and an unknown-state detector
(USAD) that halts a rollout where the members disagree, delta(s, a) = max_{i<j} |f_i(s, a) - f_j(s, a)|_2
> max_D delta / kappa_p, with a HALT reward on the halting transition and nothing bootstrapped after
it. The pessimistic MDP is the generator's (`mbrl_offline.generators.rollouts`, ``halt="usad"``), so
any learner can plan in it. Two agents are registered here; say ``algo=`` which:

* ``algo=morel`` (`MOReL`, the default and the official algorithm): on-policy natural policy gradient
  on long model rollouts, as ``run_morel.py``. Per update (one NPG iteration) the generator rolls out
  the current Gaussian policy (with its noise) from 50 start states drawn from the dataset's episode
  starts, in every one of the 4 deterministic members, for up to 700 steps (actions and states clamped
  to ±100; paths shorter than 5 steps dropped; USAD halting, at least 4 steps kept); the update reads
  exactly those paths (``mixing.rule=latest`` with ``generator.every=1``: the contract's on-policy
  rule, `mbrl_offline.buffer`): returns with gamma 0.999, GAE(lambda 0.97) advantages against an MLP
  baseline (2 x 128 ReLU on [clip(s, ±10)/10, t/1000, ..., (t/1000)^4]; ``mjrl/baselines/mlp_baseline.py``),
  whitened; the vanilla gradient g of mean(log pi(a|s) A); the natural direction x = F^-1 g by 20
  conjugate-gradient iterations (``mjrl/utils/cg_solve.py``, started from x0 = g, as the official code)
  on products with the Fisher matrix, the mean KL's Hessian (damping 1e-3); the step
  theta += sqrt(delta / g^T x) x with normalised step delta = 0.02 (``mjrl/algos/npg_cg.py``); then one
  epoch of the baseline's regression on the returns (Adam 1e-3, L2 1e-3, batches of 256). The policy
  (``mjrl/policies/gaussian_mlp.py``) is a 2 x 64 tanh MLP mean (last layer's init scaled by 1e-2) with
  a state-independent log-std, initialised at -0.25 and clamped to [-1, 1]; it starts from 5 epochs of
  MSE behaviour cloning (``mjrl/algos/behavior_cloning.py``: batches of 256 drawn with replacement, Adam
  1e-3). The dynamics are the ``"morel"`` recipe (`mbrl_offline.models.dynamics`): 4 deterministic
  2 x 512 ReLU members trained by squared error for 25 epochs.
* ``algo=morel_sac`` (`MOReLSAC`, an option; what most reimplementations run): the SAC learner of
  OfflineRL-Kit's model-based agents (`mbrl_offline.algorithms.model_based.OfflineRLKitSACConfig`) on
  the same pessimistic MDP with MBPO's branched rollouts (50k starts from any dataset state, 5 steps,
  a generation per 1000 updates, 5% real rows), halting at the first unknown step. Its rollout
  settings are MBPO's, not MOReL's: no official code runs SAC in MOReL's pessimistic MDP.

Any pairing the contract allows works by configuration: ``algo=morel_sac generator=rollouts`` (plain
MBPO), ``algo=iql generator=morel`` (any transition learner in the pessimistic MDP),
``generator.rollout.halt_reward=-100`` (the paper's HALT reward -kappa), ``generator.rollout.halt=none``
(no pessimism: the official ``pessimism_coef=None``). USAD on the simulator or on a one-member model is
refused in one line (it measures the members' disagreement).

Differences from the official code, and why:

* Rewards are predicted by the ensemble (one more output of each member). The official code uses a
  hand-written reward and termination function and ships one for hopper only
  (``projects/model_based_npg/utils/reward_functions/gym_hopper.py``), so halfcheetah and walker2d cannot
  be run as published; mjrl issue #42 reports that its learned reward did much worse. Termination is
  the library's Gymnasium-v5 function (hopper: |angle| < 0.2; the official reward file uses 0.15).
* Observations are not rescaled by default (the official hopper data multiplies velocities by 0.02, ``obs_mask``),
  so the disagreement weighs the velocity dimensions more than the official one does, and the policy and
  the baseline see velocities 50 times larger than the official ones. On hopper-medium this and the
  bootstrapping below (`MOReLConfig.bootstrap_every_path`) together make our model rollouts' paths 2-3
  times as long as the official ones; with both taken from the official code (`MOReLConfig.observation_scale`
  set to ``obs_mask``, as ``preset=morel-hopper-medium`` sets it), the path lengths agree, and with USAD's
  disagreement also in the official coordinates the scores agree too (``benchmarks/vs_mjrl.py --learn
  --ours-variant``, docs/parity.md); ``observation_scale`` leaves USAD and the model in the env's units. The model's
  inputs and targets are scaled as the official ones (mean and mean absolute deviation of the inputs
  and of the state change, ``statistics="mean_absolute_deviation"``), from the training rows; 1000
  rows are held out and each member keeps its best holdout snapshot (the official: no holdout, the
  last epoch). Before this recipe took mjrl's scales, its inputs were standardised by mean and std and
  its targets divided by the observations' std; on hopper-medium, at the same seeds, mjrl's scales
  lowered our members' holdout error by 14-29% (``benchmarks/vs_mjrl.py --dynamics``, docs/parity.md).
* The baseline's features are computed in float32 (the official: float64, then cast).
* The Fisher-vector products are the mean KL's Hessian-vector products in closed form (`GaussianFisher`:
  a forward-mode pass and a backward pass per product), where the official code differentiates the
  KL's gradient again for each product (``mjrl/algos/npg_cg.py``, ``HVP``): the same matrix, rounded
  differently, in less time (docs/performance.md). The KL leaves out the 1e-8 that mjrl's
  ``kl_divergence`` adds to its denominator (2 sigma^2 + 1e-8; a relative change below 1e-7 at the
  log-std floor).
* The generator logs every uncertainty it computes for USAD (``generator.rollout`` statistics): the
  aleatoric one means nothing for these deterministic members (their variance head is not trained).
* USAD's truncation: see `mbrl_offline.generators.rollouts` (the official code tests every step of a
  path but its last, and drops short paths before the truncation).
* Which paths are terminal in GAE. Here a path that the termination function or USAD ended is terminal
  (the paper's pessimistic MDP: HALT is absorbing; a fall ends the episode). mjrl's ``train_step`` sets
  ``path["terminated"]`` after cutting the path to its length T, so the test ``T ==
  path['observations'].shape[0]`` always holds and every path bootstraps from its last state's own
  baseline value, a fall and a halt included (read as an oversight: the line compares the cut path with
  itself). ``algo.bootstrap_every_path=true`` takes the official code's choice. On hopper-medium it
  accounts for about half of the difference in the planner's path lengths over three seeds, and all of it
  in one (``benchmarks/vs_mjrl.py --learn --ours-variant mjrl-bootstrap``, docs/parity.md).
* Evaluation: the trainer's deterministic episodes (``trainer.eval_episodes``; the official: 4 per
  iteration with the mean action), actions clipped to the env's bounds (MuJoCo clips them anyway).

``benchmarks/vs_mjrl.py`` runs the official NPG update, GAE and baseline on the same paths from the
same weights (docs/parity.md).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Optional

import numpy as np
import torch
from torch import nn

from mbrl_offline.algorithms.model_based import OfflineRLKitSACConfig
from mbrl_offline.algorithms.model_free import action_box
from mbrl_offline.algorithms.sac import SAC
from mbrl_offline.buffer import MixingConfig
from mbrl_offline.config import (check_field_types, config_argument, require_above_zero, require_in_range,
                                 require_nonnegative, require_positive)
from mbrl_offline.errors import ConfigError
from mbrl_offline.generators.rollouts import RolloutConfig, RolloutGeneratorConfig
from mbrl_offline.models.dynamics import dynamics_recipe
from mbrl_offline.policies import FeedForwardAgent, agent_for_dataset
from mbrl_offline.registry import register_agent
from mbrl_offline.utils import adam_kernel


# ------------------------------------------------------------------------------------------ config
@dataclass
class MOReLConfig:
    """The NPG planner's settings; defaults: ``projects/morel/configs/d4rl_hopper_medium.txt`` and the
    mjrl classes it builds (``run_morel.py``)."""

    hidden_size: int = 64  # the policy mean's hidden width (policy_size (64, 64)), tanh units
    hidden_layers: int = 2
    init_log_std: float = -0.25  # the state-independent log-std's start (init_log_std)
    min_log_std: float = -1.0  # its floor (min_log_std), applied after every step
    max_log_std: float = 1.0  # its ceiling (mjrl's MLP default)
    bc_epochs: int = 5  # MSE behaviour-cloning epochs before planning (bc_init: True); 0: none
    bc_lr: float = 1e-3  # Adam's rate for behaviour cloning (mjrl's BC default)
    # Rows per mini-batch of behaviour cloning and of the baseline's regression (both 256 in the
    # official code); the NPG updates take every row of the newest generation (mixing.rule=latest).
    batch_size: int = 256
    gamma: float = 0.999  # discount of the returns and of GAE
    gae_lambda: float = 0.97  # GAE's lambda
    step_size: float = 0.02  # NPG's normalised step delta: theta += sqrt(delta / g^T F^-1 g) F^-1 g
    cg_iters: int = 20  # conjugate-gradient iterations (FIM_invert_args iters)
    cg_damping: float = 1e-3  # added to the Fisher matrix: (F + damping I) x = g
    cg_residual_tol: float = 1e-10  # CG stops early once |r|^2 falls below this (mjrl's cg_solve default)
    baseline_hidden_size: int = 128  # the value baseline's hidden width (mjrl's MLPBaseline: (128, 128) ReLU)
    baseline_hidden_layers: int = 2
    baseline_lr: float = 1e-3  # Adam's rate for the baseline
    baseline_l2: float = 1e-3  # Adam's weight decay on the baseline (reg_coef)
    baseline_epochs: int = 1  # epochs of the baseline's regression per update
    # GAE after a path's last step: False (the paper's pessimistic MDP) takes a path that the termination
    # function or USAD ended as terminal (nothing bootstrapped); True ends every path on its last state's
    # own baseline value, as mjrl's train_step leaves them (its "terminated" is always False after USAD's
    # truncation): the official code's paths, for parity (docs/parity.md, "MOReL: whole runs").
    bootstrap_every_path: bool = False
    # Factors, one per observation dimension, by which the policy and the baseline's features see the
    # observations (null: the env's units). The official hopper data scales the velocities by 0.02
    # (prep_d4rl_dataset.py with gym_hopper.py's obs_mask: 1 for the 5 positions, 0.02 for the 6 velocities),
    # so its policy and baseline see them so; the hopper-medium preset sets that. The model, its rollouts and
    # USAD stay in the env's units. With it and bootstrap_every_path, the paths agree with the official ones
    # (docs/parity.md, "MOReL: whole runs").
    observation_scale: Optional[tuple] = None

    def __post_init__(self):
        check_field_types(self, "algo")  # types first; nested mappings become configs
        require_positive(self, "hidden_size", "hidden_layers", "batch_size", "cg_iters", "baseline_hidden_size",
                         "baseline_hidden_layers", "baseline_epochs")
        require_nonnegative(self, "bc_epochs", "cg_damping", "cg_residual_tol", "baseline_l2")
        require_above_zero(self, "bc_lr", "step_size", "baseline_lr")
        require_in_range(self, "gamma", 0.0, 1.0, low_open=True, hint=" (the discount; MOReL: 0.999)")
        require_in_range(self, "gae_lambda", 0.0, 1.0, hint=" (GAE's lambda; MOReL: 0.97)")
        require_in_range(self, "init_log_std")
        if self.observation_scale is not None and not (len(self.observation_scale) > 0 and all(
                isinstance(f, (int, float)) and not isinstance(f, bool) and 0 < f < math.inf
                for f in self.observation_scale)):
            raise ConfigError(f"algo.observation_scale must be null or a list of numbers > 0 (one per observation "
                              f"dimension), got {list(self.observation_scale)!r}.")
        if not self.min_log_std <= self.init_log_std <= self.max_log_std:
            raise ConfigError(f"algo.init_log_std = {self.init_log_std} must lie in [algo.min_log_std, "
                              f"algo.max_log_std] = [{self.min_log_std}, {self.max_log_std}].")


def morel_generator(halt_min_steps: int = 4) -> RolloutGeneratorConfig:
    """The official pessimistic MDP as NPG reads it: before every update (``every=1``), 50 start states
    drawn from the dataset's episode starts, each rolled out in every member (deterministic means) for up
    to 700 steps, actions and states clamped to ±100, USAD with kappa_p = 3 and HALT reward 0 (at least
    4 steps kept), paths under 5 steps dropped, path labels; the update takes that generation whole."""
    rollout = RolloutConfig(horizon=700, rollouts_per_epoch=50, retain_epochs=1, deterministic_model=True,
                            member="every", halt="usad", pessimism_coef=3.0, halt_reward=0.0,
                            halt_min_steps=halt_min_steps, start="initial", min_length=5, clamp=100.0,
                            label_paths=True)
    return RolloutGeneratorConfig(every=1, rollout=rollout, dynamics=dynamics_recipe("morel"),
                                  mixing=MixingConfig(rule="latest"))


def check_observation_scale(config: MOReLConfig, obs_dim: int) -> None:
    if config.observation_scale is not None and len(config.observation_scale) != obs_dim:
        raise ConfigError(f"algo.observation_scale has {len(config.observation_scale)} factors, but the "
                          f"observations have {obs_dim} dimensions; give one per dimension, or null.")


# ------------------------------------------------------------------------------------------ policy
class GaussianMLP(nn.Module):
    """mjrl's ``MLP`` policy: a tanh MLP mean (its last layer's torch init scaled by 1e-2) and a
    state-independent log-std. `flat` orders the parameters as mjrl's ``get_param_values``: the log-std
    first, then each layer's weight and bias."""

    def __init__(self, obs_dim: int, act_dim: int, hidden_size: int, hidden_layers: int, init_log_std: float,
                 input_scale: Optional[torch.Tensor] = None):
        super().__init__()
        self.log_std = nn.Parameter(torch.full((act_dim,), float(init_log_std)))
        # the factors the observations are multiplied by before the first layer (`MOReLConfig.observation_scale`;
        # ones: the env's units); from the config, so not in the state dict
        self.register_buffer("input_scale", torch.ones(obs_dim) if input_scale is None else input_scale.float(),
                             persistent=False)
        sizes = [obs_dim] + [hidden_size] * hidden_layers + [act_dim]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))
        with torch.no_grad():
            self.layers[-1].weight.mul_(1e-2)
            self.layers[-1].bias.mul_(1e-2)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """The mean action."""
        x = obs * self.input_scale
        for layer in self.layers[:-1]:
            x = torch.tanh(layer(x))
        return self.layers[-1](x)

    def log_likelihood(self, obs: torch.Tensor, actions: torch.Tensor,
                       mean: Optional[torch.Tensor] = None) -> torch.Tensor:
        """log N(a; mu(s), diag(exp(2 log_std))) per row; ``mean``: mu(obs) where it was computed already."""
        z = (actions - (self(obs) if mean is None else mean)) / self.log_std.exp()
        return -0.5 * z.pow(2).sum(-1) - self.log_std.sum() - 0.5 * actions.shape[-1] * math.log(2 * math.pi)

    def flat(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in self.parameters()])

    def layer_inputs(self, obs: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """`forward`'s mean action (with its graph) and each layer's input (``obs`` scaled by ``input_scale``,
        then the tanh units)."""
        inputs = [obs * self.input_scale]
        for layer in self.layers[:-1]:
            inputs.append(torch.tanh(layer(inputs[-1])))
        return self.layers[-1](inputs[-1]), inputs

    def set_flat(self, values: torch.Tensor, min_log_std: float, max_log_std: float) -> None:
        """Set every parameter from a flat vector (`flat`'s order), the log-std clamped as mjrl's
        ``set_param_values``."""
        start = 0
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(values[start:start + p.numel()].view_as(p))
                start += p.numel()
            self.log_std.clamp_(min_log_std, max_log_std)


def gaussian_kl(mean_old: torch.Tensor, log_std_old: torch.Tensor, mean_new: torch.Tensor,
                log_std_new: torch.Tensor) -> torch.Tensor:
    """Mean over rows of KL(old || new) between diagonal Gaussians (mjrl's ``kl_divergence``; its
    1e-8 in the denominator left out)."""
    var_old, var_new = (2 * log_std_old).exp(), (2 * log_std_new).exp()
    kl = ((mean_old - mean_new).pow(2) + var_old - var_new) / (2 * var_new) + log_std_new - log_std_old
    return kl.sum(-1).mean()


class GaussianFisher:
    """Products ``F v`` with the Fisher matrix of a `GaussianMLP` at its parameters on the states ``obs``:
    the Hessian of `gaussian_kl`(old || new) at new = old, the matrix whose products mjrl's NPG takes by
    differentiating the KL's gradient again (``mjrl/algos/npg_cg.py``, ``HVP``).

    At new = old every term of that Hessian that holds the means' difference vanishes, which leaves
    ``F = J^T Sigma^-1 J / N`` for the mean's parameters (``J``: the mean action's Jacobian over the N rows,
    ``Sigma``: the action variances), ``2 I`` for the log-std (the KL sums over the action's dimensions) and
    no cross terms. So a product is ``J v`` by forward-mode differentiation, written out below for the tanh
    MLP from the activations kept at construction, then ``J^T u`` by autograd through the one forward graph
    kept here (the mean action's). `tests/test_morel.py` checks it against autograd's Hessian of the KL.
    (`torch.func.jvp` for ``J v`` was slower than the double backward: docs/performance.md.)
    """

    def __init__(self, pi: GaussianMLP, obs: torch.Tensor):
        self.pi = pi
        self.mean, self.inputs = pi.layer_inputs(obs)  # the graph the backward products run through
        self.slopes = [1.0 - a.detach().square() for a in self.inputs[1:]]  # tanh' = 1 - tanh^2
        self.scale = (-2.0 * pi.log_std.detach()).exp() / len(obs)  # Sigma^-1 / N, per action dimension
        self.sizes = [p.numel() for p in pi.parameters()]  # flat's order: the log-std, then each layer's W, b

    @torch.no_grad()
    def jvp(self, direction: list[torch.Tensor]) -> torch.Tensor:
        """``J v``: the mean action's derivative along the layers' parameter ``direction`` (W, b, W, b, ...)."""
        tangent = None
        for i, layer in enumerate(self.pi.layers):
            weight, bias = direction[2 * i].view_as(layer.weight), direction[2 * i + 1]
            z = torch.addmm(bias, self.inputs[i].detach(), weight.t())  # the layer's map moved along v
            if tangent is not None:
                z.addmm_(tangent, layer.weight.t())  # and its input's move through the map
            tangent = z * self.slopes[i] if i < len(self.slopes) else z
        return tangent

    def __call__(self, v: torch.Tensor) -> torch.Tensor:
        log_std_part, *layer_parts = torch.split(v, self.sizes)
        u = self.jvp(layer_parts) * self.scale
        params = list(self.pi.layers.parameters())
        back = torch.autograd.grad(self.mean, params, grad_outputs=u, retain_graph=True)
        return torch.cat([2.0 * log_std_part] + [d.reshape(-1) for d in back])


# ------------------------------------------------------------------------------------------ paths
def path_grid(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rows labelled with ``path`` and ``step`` (`RolloutConfig.label_paths`) as padded ``(P, T, ...)``
    grids, paths in the order of their labels: ``observations``, ``actions``, ``rewards``, ``mask``
    (True on a path's steps), ``lengths`` ``(P,)`` and ``terminated`` ``(P,)`` (the path's last
    transition is terminal: nothing is bootstrapped after it)."""
    labels, path = torch.unique(batch["path"], return_inverse=True)
    step = batch["step"]
    paths, horizon = len(labels), int(step.max().item()) + 1
    flat = path * horizon + step

    def grid(values: torch.Tensor) -> torch.Tensor:
        out = values.new_zeros((paths * horizon, *values.shape[1:]))
        out[flat] = values
        return out.view(paths, horizon, *values.shape[1:])

    mask = grid(torch.ones_like(step, dtype=torch.bool))
    terminated = torch.zeros(paths, dtype=torch.bool, device=step.device)
    terminated[path[batch["terminals"].bool()]] = True
    return {"observations": grid(batch["observations"]), "actions": grid(batch["actions"]),
            "rewards": grid(batch["rewards"]), "mask": mask, "lengths": mask.sum(1), "terminated": terminated}


def discounted_sum(x: torch.Tensor, discount: float) -> torch.Tensor:
    """``y[p, t] = sum_{k >= t} discount^(k - t) x[p, k]`` for ``(P, T)`` rows zero-padded past each
    path's end (mjrl's ``discount_sum``), as one product with the ``(T, T)`` matrix of powers."""
    horizon = x.shape[-1]
    t = torch.arange(horizon, device=x.device, dtype=x.dtype)
    gap = t[:, None] - t[None, :]  # k - t, rows k, columns t
    powers = torch.where(gap >= 0, discount ** gap.clamp(min=0), torch.zeros((), dtype=x.dtype, device=x.device))
    return x @ powers


def gae_advantages(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, terminated: torch.Tensor,
                   gamma: float, lam: float) -> torch.Tensor:
    """GAE(lambda) as mjrl's ``compute_advantages``: ``delta_t = r_t + gamma b_{t+1} - b_t`` with, after a
    path's last step, ``b = 0`` if it terminated and else the last step's own baseline (mjrl's
    ``b[-1]``); ``A_t = sum_k (gamma lambda)^k delta_{t+k}`` within the path. ``(P, T)`` grids."""
    lengths = mask.sum(1)
    last = torch.arange(values.shape[1], device=values.device)[None, :] == (lengths - 1)[:, None]
    following = torch.cat([values[:, 1:], torch.zeros_like(values[:, :1])], dim=1)
    tail = torch.where(terminated[:, None], torch.zeros_like(values), values)
    following = torch.where(last, tail, following)
    deltas = (rewards + gamma * following - values) * mask
    return discounted_sum(deltas, gamma * lam) * mask


def baseline_features(observations: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """mjrl's ``MLPBaseline`` features of ``(P, T, obs_dim)`` paths: ``clip(s, ±10) / 10`` and the
    powers 1..4 of ``t / 1000``, ``(P, T, obs_dim + 4)``."""
    t = (torch.arange(mask.shape[1], device=mask.device, dtype=observations.dtype) / 1000.0)
    time = torch.stack([t ** k for k in range(1, 5)], dim=-1).expand(mask.shape[0], -1, -1)
    return torch.cat([observations.clamp(-10, 10) / 10.0, time], dim=-1)


def conjugate_gradient(fvp, b: torch.Tensor, x0: torch.Tensor, iters: int, residual_tol: float = 1e-10) -> torch.Tensor:
    """Solve ``A x = b`` for ``A`` given by products ``fvp(v)`` (mjrl's ``cg_solve``: from ``x0``, at
    most ``iters`` iterations, stopping once ``|r|^2 < residual_tol``)."""
    x = x0.clone()
    r = b - fvp(x)
    p = r.clone()
    rdotr = r.dot(r)
    for _ in range(iters):
        ap = fvp(p)
        alpha = rdotr / p.dot(ap)
        x = x + alpha * p
        r = r - alpha * ap
        new_rdotr = r.dot(r)
        p = r + (new_rdotr / rdotr) * p
        rdotr = new_rdotr
        if rdotr < residual_tol:
            break
    return x


def npg_step_size(step_size: float, g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """mjrl's normalised step: ``alpha = sqrt(|delta / (g^T x + 1e-10)|)`` with ``x = F^-1 g``, so that
    the quadratic KL model of the step, ``alpha^2 x^T F x / 2``, is ``delta / 2``."""
    return torch.sqrt(torch.abs(step_size / (g.dot(x) + 1e-10)))


# ------------------------------------------------------------------------------------------ agent
@register_agent
class MOReL(FeedForwardAgent):
    """MOReL's official planner: NPG with GAE on whole paths of the pessimistic MDP (module docstring)."""

    name = "morel"
    summary = "natural policy gradient on long rollouts of the pessimistic MDP (USAD halts, deterministic ensemble)"
    defaults_from = "the official MOReL code (mjrl v2, `configs/d4rl_hopper_medium.txt`)"
    config_class = MOReLConfig
    divergence_metric = None  # no value estimate to watch
    on_policy = True  # each update takes a fresh generation of paths whole (`mbrl_offline.roles.AgentClass`)

    def __init__(self, obs_dim: int, act_dim: int, action_low, action_high, config: Optional[MOReLConfig] = None,
                 device: str | torch.device = "cpu"):
        config = config_argument(config, type(self).config_class, f"{type(self).__name__}'s config")
        self.config, self.device = config, torch.device(device)
        self.obs_dim, self.act_dim = obs_dim, act_dim
        self.action_low, self.action_high, _, _ = action_box(action_low, action_high, self.device)
        check_observation_scale(config, obs_dim)
        scale = None if config.observation_scale is None else torch.tensor([float(f) for f in config.observation_scale])
        self.pi = GaussianMLP(obs_dim, act_dim, config.hidden_size, config.hidden_layers,
                              config.init_log_std, scale).to(self.device)
        with torch.no_grad():
            self.pi.log_std.clamp_(config.min_log_std, config.max_log_std)
        sizes = [obs_dim + 4] + [config.baseline_hidden_size] * config.baseline_hidden_layers + [1]
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            layers += [nn.Linear(a, b)] + ([nn.ReLU()] if i < len(sizes) - 2 else [])
        self.baseline = nn.Sequential(*layers).to(self.device)
        self.baseline_optim = torch.optim.Adam(self.baseline.parameters(), lr=config.baseline_lr,
                                               weight_decay=config.baseline_l2, **adam_kernel())
        self.updates = 0

    @classmethod
    def published_generator(cls) -> RolloutGeneratorConfig:
        """The official pessimistic MDP, one generation per NPG update (`morel_generator`)."""
        return morel_generator()

    @classmethod
    def check_dataset(cls, config: MOReLConfig, dataset) -> None:
        """``observation_scale`` needs one factor per dimension of ``dataset``'s observations."""
        check_observation_scale(config, np.asarray(dataset.observations).shape[1])

    @classmethod
    def for_dataset(cls, dataset, config: Optional[MOReLConfig] = None, device: str | torch.device = "cpu",
                    **parts) -> "MOReL":
        """The agent for ``dataset``'s env, its policy initialised by behaviour cloning on the dataset."""
        agent = agent_for_dataset(cls, dataset, config, device, parts)
        agent.behaviour_cloning(torch.as_tensor(np.asarray(dataset.observations), dtype=torch.float32),
                                torch.as_tensor(np.asarray(dataset.actions), dtype=torch.float32))
        return agent

    def behaviour_cloning(self, observations: torch.Tensor, actions: torch.Tensor,
                          generator: Optional[torch.Generator] = None) -> None:
        """mjrl's ``BC(loss_type='MSE')``: ``bc_epochs`` epochs of ``N // batch_size`` batches drawn with
        replacement, Adam on every policy parameter (the log-std gets no gradient)."""
        cfg = self.config
        observations, actions = observations.to(self.device), actions.to(self.device)
        optim = torch.optim.Adam(self.pi.parameters(), lr=cfg.bc_lr, **adam_kernel())
        rows = len(observations)
        for _ in range(cfg.bc_epochs * (rows // cfg.batch_size)):
            index = torch.randint(0, rows, (cfg.batch_size,), device=self.device, generator=generator)
            loss = (self.pi(observations[index]) - actions[index]).pow(2).mean()
            optim.zero_grad()
            loss.backward()
            optim.step()
        with torch.no_grad():
            self.pi.log_std.clamp_(cfg.min_log_std, cfg.max_log_std)

    # ---------------------------------------------------------------- the policy role
    @torch.no_grad()
    def sample(self, observations: torch.Tensor, state=None, starts=None) -> tuple[torch.Tensor, None]:
        """mu(s) + exp(log_std) eps, unbounded (the generator clamps at ±100, as the official rollouts)."""
        mean = self.pi(observations)
        return mean + torch.randn_like(mean) * self.pi.log_std.exp(), None

    def log_prob(self, observations: torch.Tensor, actions: torch.Tensor, state=None, starts=None) -> torch.Tensor:
        return self.pi.log_likelihood(observations, actions)

    @torch.no_grad()
    def act(self, obs: np.ndarray, deterministic: bool = True) -> np.ndarray:
        """The mean action (`mode`) or a sample, clipped to the env's bounds."""
        obs_t = self.act_input(obs)
        if deterministic:
            return self.mode(obs_t).cpu().numpy()
        return torch.maximum(torch.minimum(self.sample(obs_t)[0], self.action_high), self.action_low).cpu().numpy()

    @torch.no_grad()
    def mode(self, observations: torch.Tensor) -> torch.Tensor:
        """The Gaussian's mean, clipped to the env's bounds: the action of evaluation."""
        return torch.maximum(torch.minimum(self.pi(observations), self.action_high), self.action_low)

    # ---------------------------------------------------------------- one NPG iteration
    def update(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """One NPG iteration on the paths of the newest generation (rows labelled ``path``/``step``)."""
        if "path" not in batch:
            raise ConfigError("algo=morel learns from whole paths: set generator.rollout.label_paths=true and "
                              "generator.mixing.rule=latest (its published generator, generator=morel, does).")
        self.updates += 1
        if len(batch["rewards"]) == 0:  # every path was dropped (shorter than min_length): nothing to learn from
            return {"paths": torch.zeros((), device=self.device)}
        paths = path_grid(batch)
        mask = paths["mask"]
        advantages, returns, features = self.advantages(paths)
        metrics = self.npg_step(paths["observations"][mask], paths["actions"][mask], advantages[mask])
        metrics["baseline_loss"] = self.fit_baseline(features[mask], returns[mask])
        path_returns = paths["rewards"].sum(1)
        metrics.update(path_return_mean=path_returns.mean(), path_length_mean=paths["lengths"].float().mean(),
                       paths=torch.tensor(float(len(path_returns)), device=self.device))
        return metrics

    @torch.no_grad()
    def advantages(self, paths: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(GAE advantages, returns, baseline features)`` as ``(P, T)`` grids: returns and advantages in
        float64 (mjrl's numpy), with the baseline before this update's fit."""
        cfg, mask = self.config, paths["mask"]
        features = baseline_features(paths["observations"] * self.pi.input_scale, mask)
        values = self.baseline(features).squeeze(-1).double() * mask
        rewards = paths["rewards"].double() * mask
        returns = discounted_sum(rewards, cfg.gamma)
        terminated = paths["terminated"] & (not cfg.bootstrap_every_path)
        advantages = gae_advantages(rewards, values, mask, terminated, cfg.gamma, cfg.gae_lambda)
        return advantages, returns, features

    def npg_step(self, obs: torch.Tensor, actions: torch.Tensor, advantages: torch.Tensor) -> dict[str, torch.Tensor]:
        """mjrl's ``NPG.train_from_paths`` on rows: whitened advantages, g = grad mean(log pi A), x = (F +
        damping I)^-1 g by CG from x0 = g, theta += sqrt(delta / g^T x) x (log-std clamped)."""
        cfg, pi = self.config, self.pi
        adv = ((advantages - advantages.mean()) / (advantages.std(correction=0) + 1e-6)).to(obs.dtype)
        params = list(pi.parameters())
        fisher = GaussianFisher(pi, obs)  # the mean KL's Hessian at the current policy, and mu(obs) with its graph
        surrogate = (pi.log_likelihood(obs, actions, fisher.mean) * adv).mean()
        g = torch.cat([d.reshape(-1) for d in torch.autograd.grad(surrogate, params, retain_graph=True)])

        old_mean, old_log_std = fisher.mean.detach(), pi.log_std.detach().clone()
        x = conjugate_gradient(lambda v: fisher(v) + cfg.cg_damping * v, g, g, cfg.cg_iters, cfg.cg_residual_tol)
        alpha = npg_step_size(cfg.step_size, g, x)
        pi.set_flat(pi.flat() + alpha * x, cfg.min_log_std, cfg.max_log_std)
        with torch.no_grad():
            new_mean = pi(obs)
            surrogate_after = (pi.log_likelihood(obs, actions, new_mean) * adv).mean()
            kl_after = gaussian_kl(old_mean, old_log_std, new_mean, pi.log_std)
        return {"alpha": alpha.detach(), "kl": kl_after, "surrogate_improvement": surrogate_after - surrogate.detach(),
                "log_std_mean": pi.log_std.detach().mean()}

    def fit_baseline(self, features: torch.Tensor, returns: torch.Tensor,
                     order: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``baseline_epochs`` epochs of MSE regression of the returns on ``max(N // batch_size - 1, 1)``
        slices of one permutation per epoch (mjrl's ``fit_data``, which leaves the last full slice out;
        ``order`` fixes the permutation: the parity harness); returns the last epoch's mean loss."""
        cfg = self.config
        targets = returns.float().unsqueeze(-1)
        rows = len(features)
        loss_sum = torch.zeros((), device=self.device)
        for _ in range(cfg.baseline_epochs):
            perm = order if order is not None else torch.randperm(rows, device=self.device)
            batches = max(rows // cfg.batch_size - 1, 1)
            loss_sum = torch.zeros((), device=self.device)
            for b in range(batches):
                index = perm[b * cfg.batch_size:(b + 1) * cfg.batch_size]
                loss = (self.baseline(features[index]) - targets[index]).pow(2).mean()
                self.baseline_optim.zero_grad()
                loss.backward()
                self.baseline_optim.step()
                loss_sum = loss_sum + loss.detach()
        return loss_sum / max(rows // cfg.batch_size - 1, 1)

    # ---------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict:
        return {"config": asdict(self.config), "pi": self.pi.state_dict(), "baseline": self.baseline.state_dict(),
                "baseline_optim": self.baseline_optim.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.pi.load_state_dict(state["pi"])
        self.baseline.load_state_dict(state["baseline"])
        self.baseline_optim.load_state_dict(state["baseline_optim"])
        self.updates = int(state["updates"])


@dataclass
class MOReLSACConfig(OfflineRLKitSACConfig):
    """The SAC learner of OfflineRL-Kit's model-based agents (`OfflineRLKitSACConfig`: 2 critics of 256 x 2,
    actor lr 1e-4 cosine-annealed, critic lr 3e-4, alpha from 1 at 1e-4, gamma 0.99, tau 5e-3); MOReL's
    pessimism is in its generator (`MOReLSAC.published_generator`)."""


@register_agent
class MOReLSAC(SAC):
    """SAC planning in MOReL's pessimistic MDP (an option; the official MOReL is `MOReL`, NPG)."""

    name = "morel_sac"
    summary = "SAC on branched rollouts of MOReL's pessimistic MDP (USAD halts); MOReL's own planner is algo=morel"
    defaults_from = "OfflineRL-Kit's SAC (`run_mopo.py`) with the official MOReL's USAD"
    config_class = MOReLSACConfig

    @classmethod
    def published_generator(cls) -> RolloutGeneratorConfig:
        """MBPO's branched rollouts (every 1000 updates 50k starts from any dataset state, 5 steps, 5
        generations kept, 5% real rows) in MOReL's deterministic ensemble, halted by USAD (kappa_p = 3,
        HALT reward 0 plus termination, at the first unknown step)."""
        rollout = RolloutConfig(horizon=5, deterministic_model=True, halt="usad", pessimism_coef=3.0,
                                halt_reward=0.0, halt_min_steps=1)
        return RolloutGeneratorConfig(every=1000, rollout=rollout, dynamics=dynamics_recipe("morel"),
                                      mixing=MixingConfig(rule="fraction", real_ratio=0.05))


__all__ = ["GaussianMLP", "MOReL", "MOReLConfig", "MOReLSAC", "MOReLSACConfig", "conjugate_gradient",
           "discounted_sum", "gae_advantages", "morel_generator", "npg_step_size", "path_grid"]
