"""CQL: conservative Q-learning (Kumar, Zhou, Tucker & Levine, NeurIPS 2020), the CQL(H) variant with
SAC, with the settings of OfflineRL-Kit's ``run_cql.py`` / ``policy/model_free/cql.py`` and, by
configuration, the update of CORL's ``algorithms/offline/cql.py``.

Per update, on a batch (s, a, r, s', d) of B rows, two critics Q_1, Q_2 (targets Qbar_i), a tanh-Gaussian
actor pi, R = ``num_repeats``, w = ``cql_weight``, T = ``temperature``:

1. actor:   L(pi) = E[alpha log pi(a~|s) - min_i Q_i(s, a~)],  a~ ~ pi(.|s)
            (for the first ``bc_warmup_steps`` updates E[alpha log pi(a~|s) - log pi(a|s)], behaviour
            cloning, the original code's ``policy_eval_start``);
2. alpha:   L(log alpha) = -log alpha E[log pi(a~|s) + H_target],  H_target = -|A|, no clamp;
3. critics: y = r + gamma (1 - d) min_i Qbar_i(s', a'), a' ~ pi(.|s') (``deterministic_backup``: no
            entropy term; ``max_q_backup``: min_i max_k Qbar_i(s', a'_k) over R samples), and

            L(Q_i) = E[(Q_i(s, a) - y)^2] + w (T E_s[log sum_j exp(v_ij / T)] - E_{s,a}[Q_i(s, a)])

            where the 3R importance-weighted scores of a state s are, for k = 1..R,
                v = Q_i(s, a_k) - log pi(a_k|s),      a_k ~ pi(.|s),
                v = Q_i(s, a'_k) - log pi(a'_k|s'),   a'_k ~ pi(.|s')   (scored at s, as every peer),
                v = Q_i(s, u_k) - log U(u_k),         u_k ~ U[low, high]^|A|,
            the samples drawn without gradient. ``lse_mode``: "joint" takes the log-sum-exp over all
            3R scores of a state (the paper, the original code and CORL); "per_repeat" over the 3
            scores of each repeat k, then the mean over k (OfflineRL-Kit, see below);
4. Lagrange (``with_lagrange``): with alpha' = clamp(exp(log alpha'), 0, 1e6) and C_i the conservative
   term above, the critics take alpha' (C_i - tau_L) ("official": the original code's and Kit's, log
   alpha' from 0) or alpha' w (C_i / w - tau_L) ("corl", log alpha' from 1), and alpha' steps on
   -mean_i of that (it rises while the gap C_i exceeds the threshold tau_L);
5. Polyak averaging of the target critics with rate tau.

``update_order``: "kit" steps the actor, then alpha, then computes the critics' losses with the updated
actor and alpha (OfflineRL-Kit); "corl" computes every loss from the networks as they were before the
update, then steps alpha, the actor and the critics (CORL's, from young-geng/CQL). Every E[.] over the
batch's rows becomes ``sum_b w_b (.)`` with per-row loss ``weights`` (`mbrl_offline.algorithms.weights`).

The conservative term is `CQLRegulariser`: the 3R scores of any states and their log-sum-exp in
either mode (``ood_values``, `conservative_logsumexp`); `CQL.conservative_gap` subtracts the data term.
COMBO overrides that one method to take the log-sum-exp over its mixed real and model rows and the
data term over the real ones.

**OfflineRL-Kit's log-sum-exp.** Kit's ``learn`` calls ``value.reshape(batch_size, R, 1)`` on each score
tensor and drops the result, so the tensors stay ``(B R, 1)``, their concatenation is ``(B R, 3)`` and
``logsumexp(dim=1)`` runs over the 3 scores of one (state, repeat): mean_{b,k} log sum_{j=1..3} exp(v),
where the paper and its code take log sum_{j,k} exp(v) over all 3R. ``tests/test_cql.py`` shows it on
Kit's own code when a checkout is given, and on the formula written out otherwise. The default here
follows the paper (``lse_mode=joint``); ``lse_mode=per_repeat`` gives Kit's number, which is at least
T log R lower (Jensen), so that parity with Kit can be measured.

Defaults are ``run_cql.py``'s, the same for every D4RL locomotion dataset ("cql-weight=5.0,
temperature=1.0 for all D4RL-Gym tasks"; presets ``mbrl_offline/configs/preset/cql-*.yaml``): w = 5,
T = 1, R = 10, no Lagrange (tau_L = 10 and alpha' at 3e-4 when on), deterministic backup, no max
backup, actor and critics of 3 x 256 ReLU, Adam at 1e-4 (actor), 3e-4 (critics), 1e-4 (alpha from 1),
gamma 0.99, tau 5e-3, batch 256, no state or reward normalisation. The paper's schedule is 1M updates.
CORL's settings are ``CQLConfig.corl()``: ``cql_weight=10 actor_lr=3e-5 alpha_lr=3e-5 update_order=corl
lagrange_form=corl lagrange_threshold=-1 normalize_states=true init=corl-cql`` (and
``normalize_reward=true`` on hopper-medium), from its ``configs/offline/cql/*/*.yaml``.

Written with autograd, top to bottom. Differences from OfflineRL-Kit, and why:

* ``lse_mode=joint`` by default (above); ``per_repeat`` is Kit's;
* the regulariser's policy samples are drawn without gradient (CORL does the same). Kit lets the critic
  losses backpropagate into the actor, whose gradient it then zeroes before the actor's next step,
  so the critics' gradients and every update are the same, without the backward pass through the
  actor for its 2 B R samples;
* for those samples the actor's network runs once per state and its R draws share the output
  (`TanhGaussianActor.repeated_draws`), where Kit and CORL run it on the B R repeated rows: the same
  numbers from the same noise (to rounding), with a tenth of that pass's products;
* the uniform samples are drawn from the env's box [low, high] with density prod 1 / (high - low); Kit
  draws from [low[0], high[0]] with density 0.5^|A| and CORL from [-1, 1]: the same for the unit bounds
  of every MuJoCo task, but the correct importance weight elsewhere (pendulum's bounds are +-2);
* the two critics are one `CriticEnsemble` (one batched matmul per layer, initialised as ``nn.Linear``)
  with one Adam, where Kit has two critics and two Adams: the losses of the two are independent, so the
  steps are the same; the 3R scores of both critics come from one forward pass over all 3 B R rows;
* the actor is the library's `TanhGaussianActor`: Kit's ``ActorProb`` (state-dependent log-std clamped
  to [-5, 2], an unbounded mean, tanh scaled to the bounds) with the mean and log-std heads as one
  linear layer, and log(1 - tanh(u)^2) computed exactly where Kit adds 1e-6 inside the log;
* ``init`` picks the networks: "torch" (default) is Kit's (``ActorProb`` and ``Critic``, torch's
  init); "corl-cql" is CORL's (a learnt log-std multiplier and offset, the clamp at [-20, 2], the
  head at Xavier-uniform 1e-2, orthogonally initialised critics; `TanhGaussianActor`,
  `CriticEnsemble`). ``CQLConfig.corl()`` sets it with CORL's other settings. CORL scales tanh by
  the largest bound and leaves log(max_action) out of log pi, where ours scales to the env's box
  and keeps it: the same for the unit bounds of the locomotion tasks. CORL's ``cql_clip_diff``
  (+-inf in every locomotion config) is not offered;
* state and reward normalisation (CORL's, off by default as in Kit) are kept inside the agent
  (`CQL.for_dataset`, in its state), so data from any generator and the raw env work unchanged.
"""
from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch

from mbrl_offline.algorithms import model_free
from mbrl_offline.algorithms.model_free import ObservationNormaliser, new_agent_for
from mbrl_offline.algorithms.sac import load_soft_actor_critic_state, soft_actor_critic_state
from mbrl_offline.algorithms.weights import batch_mean, row_weights
from mbrl_offline.config import (check_field_types, config_argument, require_above_zero, require_in_range,
                                 require_nonnegative, require_positive)
from mbrl_offline.errors import ConfigError
from mbrl_offline.models.networks import INITS, CriticEnsemble, TanhGaussianActor
from mbrl_offline.policies import CriticValue, FeedForwardAgent
from mbrl_offline.registry import register_agent
from mbrl_offline.utils import adam_kernel, soft_update

LSE_MODES = ("joint", "per_repeat")  # the paper's 3R-way log-sum-exp; OfflineRL-Kit's 3-way one, averaged
UPDATE_ORDERS = ("kit", "corl")
LAGRANGE_FORMS = ("official", "corl")


def conservative_logsumexp(scores: torch.Tensor, temperature: float, mode: str = "joint") -> torch.Tensor:
    """``T log sum exp(v / T)`` of each state's importance-weighted scores ``(N, K, B, R)`` (N critics,
    K kinds of sample, B states, R repeats): ``(N, B)``. ``joint``: over all K R scores of a state (the
    paper's estimator); ``per_repeat``: over the K scores of each repeat, then the mean over the
    repeats (OfflineRL-Kit's, whose reshape has no effect; module docstring)."""
    if mode == "joint":
        return torch.logsumexp(scores / temperature, dim=(1, 3)) * temperature
    if mode == "per_repeat":
        return (torch.logsumexp(scores / temperature, dim=1) * temperature).mean(dim=-1)
    raise ConfigError(f"unknown lse_mode '{mode}'; choose one of {', '.join(LSE_MODES)}.")


class CQLRegulariser:
    """CQL's push-down term on the critics: the importance-weighted log-sum-exp over R policy samples at
    s, R policy samples at s' and R uniform actions, each scored at s. COMBO reuses it on its mixed
    real and model rows (its data term is its own)."""

    def __init__(self, repeats: int, temperature: float, mode: str, action_low, action_high,
                 device: torch.device):
        self.repeats, self.temperature, self.mode = repeats, temperature, mode
        self.low = torch.as_tensor(np.asarray(action_low, dtype=np.float32), device=device)
        self.width = torch.as_tensor(np.asarray(action_high, dtype=np.float32), device=device) - self.low
        self.log_uniform = -float(torch.log(self.width).sum())  # log U(u) on the box (Kit: log 0.5^|A|)

    def ood_values(self, critic: CriticEnsemble, sample: Callable, obs: torch.Tensor,
                   next_obs: torch.Tensor) -> torch.Tensor:
        """``T log sum exp(v / T)`` per critic and state ``(N, B)`` (`conservative_logsumexp`), with
        ``sample(states, R) -> (actions, log pi)`` the policy's R draws per state, row ``b R + k`` (e.g.
        `TanhGaussianActor.repeated_draws`); differentiable in the critic only.

        The random draws come in OfflineRL-Kit's order (uniform actions, then pi at s, then pi at s'),
        each state repeated R times in a row (Kit's and CORL's layout)."""
        rows, repeats = obs.shape[0], self.repeats
        obs_rep = obs.repeat_interleave(repeats, dim=0)  # (B R, obs_dim), row b R + k
        with torch.no_grad():
            uniform = torch.rand(rows * repeats, self.low.shape[0], device=obs.device) * self.width + self.low
            pi, log_pi = sample(obs, repeats)
            pi_next, log_pi_next = sample(next_obs, repeats)
            log_density = torch.cat([log_pi, log_pi_next, log_pi.new_full((rows * repeats,), self.log_uniform)])
        q = critic(obs_rep.repeat(3, 1), torch.cat([pi, pi_next, uniform]))  # (N, 3 B R): every score at s
        scores = (q - log_density).view(q.shape[0], 3, rows, repeats)
        return conservative_logsumexp(scores, self.temperature, self.mode)


@dataclass
class CQLConfig:
    # The conservative term w (T E[log sum exp(v / T)] - E[Q(s, a)]): its weight w (Kit: 5.0 for every
    # D4RL-Gym task; CORL: 10.0), the temperature T and R, the samples of each kind per state.
    cql_weight: float = 5.0
    temperature: float = 1.0
    num_repeats: int = 10
    # "joint": the log-sum-exp over all 3R scores (paper, original code, CORL); "per_repeat": OfflineRL-Kit's.
    lse_mode: str = "joint"
    # The Lagrange variant: alpha' tuned so that the conservative gap stays near lagrange_threshold
    # (Kit: 10; CORL's cql_target_action_gap: -1); "official" alpha' (C - tau), "corl" alpha' w (C/w - tau).
    with_lagrange: bool = False
    lagrange_threshold: float = 10.0
    lagrange_form: str = "official"
    cql_alpha_lr: float = 3e-4  # Adam for log alpha' (Kit's run script; CORL: the critics' rate, 3e-4)
    # Backups: no entropy term in the target (Kit and CORL); the max over R target actions (off).
    deterministic_backup: bool = True
    max_q_backup: bool = False
    # "kit": actor, alpha, then the critics with the updated actor; "corl": all losses first, then the steps.
    update_order: str = "kit"
    # Behaviour cloning for the actor's first updates (the original code: 40,000; Kit and CORL: 0).
    bc_warmup_steps: int = 0
    actor_lr: float = 1e-4  # Adam (CORL: 3e-5)
    critic_lr: float = 3e-4
    alpha_lr: float = 1e-4  # (CORL: 3e-5)
    gamma: float = 0.99  # discount
    tau: float = 5e-3  # Polyak rate of the target critics
    init_alpha: float = 1.0  # the entropy temperature's start (log alpha from 0)
    auto_alpha: bool = True  # tune alpha towards the target entropy; False keeps init_alpha
    target_entropy: Optional[float] = None  # None means -|A|
    hidden_size: int = 256  # actor and critics: hidden_layers x hidden_size ReLU (Kit and CORL: 3 x 256)
    hidden_layers: int = 3
    # The networks' form and initialisation: "torch" (Kit's: torch's init, log-std clamped to [-5, 2]) or
    # "corl-cql" (CORL's: learnt log-std multiplier and offset, [-20, 2], orthogonal critics); any of
    # `mbrl_offline.models.networks.INITS`.
    init: str = "torch"
    batch_size: int = 256  # transitions per update
    # CORL's normalisations (Kit: none): states by the dataset's mean and std + state_std_eps; rewards
    # times 1000 / (max - min episode return of the dataset) (CORL: hopper-medium only).
    normalize_states: bool = False
    state_std_eps: float = 1e-3
    normalize_reward: bool = False

    def __post_init__(self):
        check_field_types(self, "algo")  # types first; nested mappings become configs
        require_positive(self, "batch_size", "hidden_size", "hidden_layers", "num_repeats")
        require_nonnegative(self, "cql_weight", hint=" (0 turns the conservative term off: SAC)")
        require_nonnegative(self, "bc_warmup_steps", "state_std_eps")
        require_above_zero(self, "temperature", "actor_lr", "critic_lr", "alpha_lr", "cql_alpha_lr", "init_alpha")
        require_in_range(self, "lagrange_threshold")
        require_in_range(self, "gamma", 0.0, 1.0, low_open=True, hint=" (the discount; usually 0.99)")
        require_in_range(self, "tau", 0.0, 1.0, low_open=True, hint=" (the target networks' Polyak rate; usually 5e-3)")
        require_in_range(self, "target_entropy")  # any finite number, or None for -|A|
        for name, choices in (("lse_mode", LSE_MODES), ("update_order", UPDATE_ORDERS),
                              ("lagrange_form", LAGRANGE_FORMS), ("init", INITS)):
            if getattr(self, name) not in choices:
                raise ConfigError(f"algo.{name} = '{getattr(self, name)}' is unknown; choose one of {', '.join(choices)}.")

    @classmethod
    def corl(cls, **changes) -> "CQLConfig":
        """CORL's ``algorithms/offline/cql.py`` with its locomotion configs (``configs/offline/cql/*/*.yaml``:
        ``cql_alpha`` 10, ``policy_lr`` 3e-5 for the actor and alpha, its update order and Lagrange form,
        ``cql_target_action_gap`` -1, states normalised, its networks); ``changes`` on top (CORL also
        sets ``normalize_reward`` on hopper-medium)."""
        corl = dict(cql_weight=10.0, actor_lr=3e-5, alpha_lr=3e-5, update_order="corl", lagrange_form="corl",
                    lagrange_threshold=-1.0, normalize_states=True, init="corl-cql")
        return dataclasses.replace(cls(), **{**corl, **changes})


@register_agent
class CQL(CriticValue, FeedForwardAgent):
    """A CQL agent: ``act(obs)``, ``update(batch) -> metrics``, ``state_dict()`` (module docstring).

    Model-free: published without a generator (every batch real), and takes any transition
    generator's data by configuration. Build it with `CQL.for_dataset`, which takes the state and
    reward normalisation from the dataset where they are on."""

    name = "cql"
    # what it is, for the docs' tables
    summary = ("SAC whose critics push Q down at policy and uniform actions (an importance-weighted log-sum-exp) "
               "and up on the data; the Lagrange variant by configuration")
    defaults_from = "OfflineRL-Kit's `run_cql.py` (the paper's 3R-way log-sum-exp); CORL's `cql.py` by configuration"
    config_class = CQLConfig
    # fine-tuning with penalty=off (mbrl_offline/finetune.py): no conservative term, plain SAC on the data
    penalty_off = {"cql_weight": 0.0, "with_lagrange": False}
    published_generator = staticmethod(model_free.published_generator)

    def __init__(self, obs_dim: int, act_dim: int, action_low, action_high,
                 config: Optional[CQLConfig] = None, device: str | torch.device = "cpu"):
        config = config_argument(config, type(self).config_class, f"{type(self).__name__}'s config")
        self.config, self.device = config, torch.device(device)
        self.obs_dim, self.act_dim = obs_dim, act_dim
        # the identity until for_dataset (or a loaded state) sets the dataset's statistics
        self.normalise = ObservationNormaliser(obs_dim, self.device)
        self.reward_scale = 1.0

        h, layers = config.hidden_size, config.hidden_layers
        self.actor = TanhGaussianActor(obs_dim, act_dim, action_low, action_high, h, layers,
                                       init=config.init).to(self.device)
        self.critic = CriticEnsemble(obs_dim, act_dim, 2, h, layers, init=config.init).to(self.device)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = torch.tensor(math.log(config.init_alpha), device=self.device,
                                      requires_grad=config.auto_alpha)
        self.target_entropy = -float(act_dim) if config.target_entropy is None else config.target_entropy
        # log alpha' of the Lagrange variant: from 0 (official, Kit) or 1 (CORL)
        self.log_alpha_prime = torch.tensor(1.0 if config.lagrange_form == "corl" else 0.0, device=self.device,
                                            requires_grad=config.with_lagrange)
        self.regulariser = CQLRegulariser(config.num_repeats, config.temperature, config.lse_mode,
                                          action_low, action_high, self.device)
        self.actor_optim = torch.optim.Adam(self.actor.parameters(), lr=config.actor_lr, **adam_kernel())
        self.critic_optim = torch.optim.Adam(self.critic.parameters(), lr=config.critic_lr, **adam_kernel())
        self.alpha_optim = (torch.optim.Adam([self.log_alpha], lr=config.alpha_lr, **adam_kernel()) if config.auto_alpha
                            else None)
        self.alpha_prime_optim = (torch.optim.Adam([self.log_alpha_prime], lr=config.cql_alpha_lr, **adam_kernel())
                                  if config.with_lagrange else None)
        self.updates = 0

    @classmethod
    def for_dataset(cls, dataset, config: Optional[CQLConfig] = None, device: str | torch.device = "cpu",
                    **parts) -> "CQL":
        """The agent for ``dataset``'s env, with the dataset's state statistics and reward scale where
        ``normalize_states`` / ``normalize_reward`` are on."""
        return new_agent_for(cls, dataset, config, device, parts)

    def set_reward_scale(self, scale: float) -> None:
        self.reward_scale = model_free.checked_reward_scale(scale)

    @property
    def alpha(self) -> torch.Tensor:
        return self.log_alpha.detach().exp()

    @torch.no_grad()
    def act(self, obs: np.ndarray, deterministic: bool = True) -> np.ndarray:
        """Action(s) for one observation ``(obs_dim,)`` or a batch ``(B, obs_dim)``, as numpy: the
        policy's mode (Kit's evaluation), or with ``deterministic=False`` a sample."""
        obs_t = self.act_input(obs)  # checked: shape (obs_dim,) or (B, obs_dim), finite
        action, _ = self.actor(self.normalise(obs_t), deterministic=deterministic, with_log_prob=False)
        return action.cpu().numpy()

    # ------------------------------------------------------------------ the policy role (with FeedForwardAgent's)
    @torch.no_grad()
    def sample(self, observations: torch.Tensor, state=None, starts=None) -> tuple[torch.Tensor, None]:
        """Actions sampled from the current policy (for generators' rollouts)."""
        return self.actor(self.normalise(observations), with_log_prob=False)[0], None

    def log_prob(self, observations: torch.Tensor, actions: torch.Tensor, state=None, starts=None) -> torch.Tensor:
        """log pi(a|s) of env-unit actions ``(B,)``, differentiable in them (states normalised here)."""
        return self.actor.log_prob_of(self.normalise(observations), actions)

    # ------------------------------------------------------------------ the value role (`policies.CriticValue`)
    @torch.no_grad()
    def mode(self, observations: torch.Tensor) -> torch.Tensor:
        """The deterministic action (the tanh of the Gaussian's mean), states normalised here."""
        return self.actor(self.normalise(observations), deterministic=True, with_log_prob=False)[0]

    # ------------------------------------------------------------------ learning
    def update(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """One step on each of the actor, alpha, (alpha') and the critics, in ``update_order``; returns
        detached scalar tensors."""
        cfg = self.config
        self.updates += 1
        obs, next_obs = self.normalise(batch["observations"]), self.normalise(batch["next_observations"])
        weights = row_weights(batch)  # per-row loss weights (B,), or None for plain means

        # 1-2. actor and alpha, from one sample a~ ~ pi(.|s)
        alpha = self.alpha
        new_actions, log_pi = self.actor(obs)
        if self.updates <= cfg.bc_warmup_steps:
            fit = self.actor.log_prob_of(obs, batch["actions"])  # behaviour cloning
        else:
            fit = self.critic(obs, new_actions).min(dim=0).values
        actor_loss = batch_mean(alpha * log_pi - fit, weights)
        alpha_loss = -self.log_alpha * batch_mean(log_pi.detach() + self.target_entropy, weights)
        if cfg.update_order == "kit":  # Kit: step them now; the critics' losses then use the new actor and alpha
            self._step_actor_and_alpha(actor_loss, alpha_loss)

        # 3-4. critics (and alpha')
        critic_loss, metrics = self.critic_loss(batch, obs, next_obs, weights)
        if cfg.update_order == "corl":  # CORL: every loss from the networks before the update, then the steps
            self._step_actor_and_alpha(actor_loss, alpha_loss)
        self.critic_optim.zero_grad(set_to_none=True)  # also clears what the actor's loss left in the critics
        critic_loss.backward()
        self.critic_optim.step()

        # 5. targets
        soft_update(self.target_critic, self.critic, cfg.tau)
        return {**metrics, "actor_loss": actor_loss.detach(), "alpha": alpha, "entropy": -log_pi.detach().mean()}

    def _step_actor_and_alpha(self, actor_loss: torch.Tensor, alpha_loss: torch.Tensor) -> None:
        self.actor_optim.zero_grad(set_to_none=True)
        actor_loss.backward()
        self.actor_optim.step()
        if self.alpha_optim is not None:
            self.alpha_optim.zero_grad(set_to_none=True)
            alpha_loss.backward()
            self.alpha_optim.step()

    def _regulariser_sample(self, normalised_obs: torch.Tensor, repeats: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.actor.repeated_draws(normalised_obs, repeats)

    @torch.no_grad()
    def critic_target(self, next_obs: torch.Tensor, rewards: torch.Tensor, terminals: torch.Tensor) -> torch.Tensor:
        """``y = r + gamma (1 - d) min_i Qbar_i(s', a')`` ``(B,)`` from normalised ``next_obs``: a' ~ pi(.|s')
        (minus alpha log pi(a'|s') unless ``deterministic_backup``), or with ``max_q_backup`` the max of
        each target critic over R samples, then the min over the critics (Kit's and the original code's)."""
        cfg = self.config
        if cfg.max_q_backup:
            repeated = next_obs.repeat_interleave(cfg.num_repeats, dim=0)
            next_actions, _ = self.actor(repeated)
            q = self.target_critic(repeated, next_actions).view(2, -1, cfg.num_repeats)
            next_q = q.max(dim=-1).values.min(dim=0).values
        else:
            next_actions, next_log_pi = self.actor(next_obs)
            next_q = self.target_critic(next_obs, next_actions).min(dim=0).values
            if not cfg.deterministic_backup:
                next_q = next_q - self.alpha * next_log_pi
        return rewards * self.reward_scale + cfg.gamma * (1.0 - terminals.float()) * next_q

    def conservative_gap(self, batch: dict[str, torch.Tensor], obs: torch.Tensor, next_obs: torch.Tensor,
                         q: torch.Tensor, weights: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(gap, ood)``: each critic's ``T E_s[log sum exp(v / T)] - E_{s,a}[Q(s, a)]`` ``(N,)`` and the
        log-sum-exp per state ``(N, B)``, both expectations over the batch's rows (``q``: the critics at
        the batch's actions). COMBO overrides this to take the first over its mixed rows and the second
        over the real ones."""
        ood = self.regulariser.ood_values(self.critic, self._regulariser_sample, obs, next_obs)
        return batch_mean(ood, weights) - batch_mean(q, weights), ood

    def critic_loss(self, batch: dict[str, torch.Tensor], obs: torch.Tensor, next_obs: torch.Tensor,
                    weights: Optional[torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The critics' TD and conservative losses (summed over the two critics) and metrics; with the
        Lagrange variant alpha' steps here, and the loss takes alpha' as it was before."""
        cfg = self.config
        target = self.critic_target(next_obs, batch["rewards"], batch["terminals"])
        q = self.critic(obs, batch["actions"])  # (2, B)
        td = batch_mean((q - target) ** 2, weights)  # (2,): each critic's MSE
        gap, ood = self.conservative_gap(batch, obs, next_obs, q, weights)
        conservative = cfg.cql_weight * gap
        metrics = {}
        if cfg.with_lagrange:
            alpha_prime = self.log_alpha_prime.exp().clamp(0.0, 1e6)
            if cfg.lagrange_form == "official":
                constraint = conservative - cfg.lagrange_threshold
            else:
                constraint = cfg.cql_weight * (gap - cfg.lagrange_threshold)
            alpha_prime_loss = -(alpha_prime * constraint.detach()).mean()
            self.alpha_prime_optim.zero_grad(set_to_none=True)
            alpha_prime_loss.backward()
            self.alpha_prime_optim.step()
            conservative = alpha_prime.detach() * constraint
            metrics["alpha_prime"] = alpha_prime.detach()
        critic_loss = td.sum() + conservative.sum()
        q = q.detach()
        metrics.update(critic_loss=td.detach().sum(), cql_loss=conservative.detach().sum(),
                       cql_gap=gap.detach().mean(), ood_mean=ood.detach().mean(), q_mean=q.mean(),
                       q_std=q.std(dim=0).mean())
        return critic_loss, metrics

    def on_epoch_end(self, epoch: int, total_epochs: int) -> None:
        """Nothing to do: CQL's learning rates are constant."""

    def state_dict(self) -> dict:
        state = {**soft_actor_critic_state(self),
                 "log_alpha_prime": self.log_alpha_prime.detach().clone(),
                 "normalise": self.normalise.state_dict(), "reward_scale": self.reward_scale,
                 "updates": self.updates}
        if self.alpha_prime_optim is not None:
            state["alpha_prime_optim"] = self.alpha_prime_optim.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        load_soft_actor_critic_state(self, state)
        with torch.no_grad():
            self.log_alpha_prime.copy_(state["log_alpha_prime"])
        if self.alpha_prime_optim is not None:
            self.alpha_prime_optim.load_state_dict(state["alpha_prime_optim"])
        self.normalise.load_state_dict(state["normalise"])
        self.set_reward_scale(state["reward_scale"])
        self.updates = int(state["updates"])


__all__ = ["CQL", "CQLConfig", "CQLRegulariser", "conservative_logsumexp"]
