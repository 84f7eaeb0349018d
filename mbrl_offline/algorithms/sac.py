"""SAC-N and EDAC: soft actor-critic with an ensemble of N critics (Haarnoja et al. 2018; An et al. 2021).

N = 2 is the usual clipped double-Q SAC, which the dataset collector trains as the behaviour policy;
larger N with the min over all critics is SAC-N, and ``eta > 0`` adds EDAC's gradient-diversity
term: the core of EDAC, RAVL, MOPO, MOBILE and COPlanner here.

Per update, in the order of CORL's EDAC and the official RAVL code (``update_order="corl"``):

1. alpha:  L(log a) = -log a * E[log pi(a|s) + H_target],           H_target = -|A|
2. actor:  L(pi)   = E[a log pi(a|s) - min_i Q_i(s, a)],            a ~ pi(.|s)
3. critics: L(Q)   = sum_i E[(Q_i(s, a) - y)^2] + eta E[1/(N-1) sum_{i != j} <g_i, g_j>],
            y = r + gamma (1 - terminal) (min_i Qbar_i(s', a') - a log pi(a'|s')),  a' ~ pi(.|s'),
            g_i = grad_a Q_i(s, a) / (|grad_a Q_i(s, a)| + 1e-10)   (EDAC, on the update's own batch)
4. Polyak averaging of the target critics with rate tau.

``update_order="official"`` (the official EDAC code's) computes every loss from the networks as they
were before the update: the actor's with alpha before its step, the critics' target with the actor
and alpha before theirs. ``update_order="offlinerlkit"`` (OfflineRL-Kit's EDAC) takes the actor's
loss with alpha before its step and the target after both steps. ``update_order="offlinerlkit_sac"``
(OfflineRL-Kit's ``SACPolicy.learn``, which its MOPO and RAMBO run) steps the critics first, towards
the target from the actor and alpha before the update, then the actor against the stepped critics with
the alpha before its step, then alpha; its draws come in Kit's order (a' for the target, then the
actor's). ``alpha_max`` caps the alpha the losses use (OfflineRL-Kit: 1).

Every E[.] above is a mean over the batch's rows; a batch with per-row loss weights (``weights``, from
the ``weights`` mixing rule) takes ``sum_b w_b (.)`` instead (`mbrl_offline.algorithms.weights`).

Deviations, on purpose, none of which changes the losses or their gradients:

* the alpha loss reuses the log-probabilities of the actor step's sample instead of drawing a second
  one (CORL draws two); the expectation is the same and one actor pass is saved. Its gradient,
  -mean(log pi + H_target), is set directly;
* the diversity term's gradients g_i come from the TD loss's own forward pass through an explicit
  backward of the ReLU critic (`EnsembleMLP.forward_with_input_gradient`), where CORL/RAVL run a
  second forward and autograd's double backward: the same values with less than half the matmuls
  (8 of the (N, B, H) x (H, H) products of a hidden layer against CORL's 18, at 3 hidden layers), and
  one hand-written backward gives the weight gradients of both the TD and the diversity term, from
  the losses' gradients in q and g_i, which `critic_losses` writes out;
* the actor step takes grad_a min_i Q_i(s, a) from an explicit pass through each row's lowest
  critic only (`EnsembleMLP.lowest_with_input_gradient`, no graph through the critics) and passes
  it, with alpha for log pi, into the actor's hand-written backward
  (`TanhGaussianActor.sample_with_backward`): the same actor gradient as autograd's through the min;
* sum_{i != j} <g_i, g_j> is computed as |sum_i g_i|^2 - sum_i |g_i|^2 (an N x N product in CORL);
* RAVL's extra critic pass that only logs the Q spread at random actions is not run; ``q_std``
  reports the spread at the batch's actions instead.
"""
from __future__ import annotations

import copy
from dataclasses import asdict, dataclass
from typing import Optional

import numpy as np
import torch

from mbrl_offline.algorithms import model_free
from mbrl_offline.algorithms.weights import batch_mean, row_weights
from mbrl_offline.config import (check_field_types, config_argument, require_above_zero, require_in_range,
                                 require_nonnegative, require_positive)
from mbrl_offline.errors import ConfigError
from mbrl_offline.models.networks import CriticEnsemble, TanhGaussianActor, check_init
from mbrl_offline.policies import CriticValue, FeedForwardAgent
from mbrl_offline.utils import CUDAGraphed, adam_kernel, anneal_cosine, soft_update


def _adam(params, lr: float, fused: bool, capturable: bool) -> torch.optim.Adam:
    return torch.optim.Adam(list(params), lr=lr, capturable=capturable, **adam_kernel(fused))


@torch.no_grad()
def critic_losses(q: torch.Tensor, action_grad: Optional[torch.Tensor], target: torch.Tensor, eta: float,
                  weights: Optional[torch.Tensor] = None):
    """The TD loss, EDAC's diversity loss and the gradient of ``td + eta * diversity`` with respect to
    ``q`` ``(N, B)`` and, when ``eta > 0``, to the action gradients ``action_grad`` ``(N, B, A)``:
    ``(td, diversity, grads)``, ``grads`` a tuple of one or two tensors for ``torch.autograd.backward``.

        td = sum_i mean_b (q_ib - y_b)^2,                    d td / dq = 2 (q - y) / B,
        u_i = g_i / (|g_i| + 1e-10),  T = sum_i u_i,         diversity = mean_b (|T|^2 - sum_i |u_i|^2) / (N - 1),
        v_i = d (eta diversity) / du_i = 2 c (T - u_i),      c = eta / (B (N - 1)),
        d / dg_i = (v_i - u_i <g_i, v_i> / |g_i|) / (|g_i| + 1e-10)   (0 where g_i = 0, as autograd's norm).

    With per-row loss ``weights`` ``(B,)`` (`mbrl_offline.algorithms.weights`) both means over the rows
    become ``sum_b w_b (...)``: the 1/B above becomes w_b, so d td / dq = 2 w_b (q - y) and
    c = eta w_b / (N - 1) for row b. Without them, the code is the unweighted one exactly.

    By hand because autograd takes 55 operators for these losses and their backward, this 26 (counted
    with a dispatch mode); tested against autograd and, through the critics, CORL's double backward.
    """
    rows = q.shape[1]
    error = q - target
    if weights is None:
        td = (error * error).sum() / rows
        d_q = error.mul_(2.0 / rows)
    else:
        td = (error * error * weights).sum()
        d_q = error.mul_(2.0 * weights)
    if action_grad is None:
        return td, torch.zeros((), device=q.device), (d_q,)
    grad = action_grad.detach()
    norm = grad.norm(dim=-1, keepdim=True)
    scale = norm + 1e-10
    unit = grad / scale
    total = unit.sum(dim=0)
    if weights is None:
        pairs = rows * (q.shape[0] - 1)  # B (N - 1)
        diversity = ((total * total).sum() - (unit * unit).sum()) / pairs
        v = (total - unit).mul_(2.0 * eta / pairs)
    else:
        per_row = (total * total).sum(-1) - (unit * unit).sum(dim=(0, 2))  # (B,)
        diversity = (per_row * weights).sum() / (q.shape[0] - 1)
        v = (total - unit).mul_(weights.unsqueeze(-1) * (2.0 * eta / (q.shape[0] - 1)))
    along = (grad * v).sum(-1, keepdim=True).div_(norm.clamp_min(torch.finfo(norm.dtype).tiny))
    d_grad = v.sub_(unit.mul_(along)).div_(scale)
    return td, diversity, (d_q, d_grad)


UPDATE_ORDERS = ("corl", "official", "offlinerlkit", "offlinerlkit_sac")  # SACConfig.update_order


@dataclass
class SACConfig:
    num_critics: int = 2  # N: size of the critic ensemble; targets and the actor use the min over all N
    eta: float = 0.0  # weight of EDAC's gradient-diversity term (0: plain SAC-N)
    hidden_size: int = 256  # width of actor and critic hidden layers
    hidden_layers: int = 2  # hidden layers in actor and critics
    init: str = "torch"  # "torch": nn.Linear's init; "edac": EDAC/CORL's (biases 0.1, small output layers)
    actor_lr: float = 3e-4  # Adam learning rates
    critic_lr: float = 3e-4
    alpha_lr: float = 3e-4
    gamma: float = 0.99  # discount
    tau: float = 5e-3  # Polyak rate of the target critics
    init_alpha: float = 1.0  # initial entropy temperature (log alpha starts at log of this)
    auto_alpha: bool = True  # tune alpha towards the target entropy; False keeps init_alpha fixed
    target_entropy: Optional[float] = None  # None means -|A|
    batch_size: int = 256  # transitions per update
    fused_adam: bool = False  # torch's fused Adam kernel: faster, rounds differently from the default
    deterministic_backup: bool = False  # leave the entropy term -alpha log pi out of the critic target (MOBILE)
    actor_lr_cosine: bool = False  # anneal the actor's learning rate to 0 over the run's epochs (OfflineRL-Kit)
    cuda_graph: bool = True  # on a CUDA device, record the update once and replay it as a CUDA graph (see `SAC`)
    # Which networks each loss reads (`UPDATE_ORDERS`): "corl" (CORL's and RAVL's order: alpha, then the
    # actor with the new alpha, then the critics' target from the updated actor and alpha), "official"
    # (the official EDAC code's: every loss from the networks as they were before the update),
    # "offlinerlkit" (OfflineRL-Kit's EDACPolicy: the actor with the alpha before its step, the target from
    # the updated actor and alpha) or "offlinerlkit_sac" (OfflineRL-Kit's SACPolicy, under its MOPO and
    # RAMBO: the critics first, their target from the actor and alpha before the update, then the actor
    # against the stepped critics with the alpha before its step).
    update_order: str = "corl"
    alpha_max: Optional[float] = None  # the losses use min(alpha, alpha_max) (OfflineRL-Kit's SAC and EDAC: 1); None: no cap

    def __post_init__(self):
        check_field_types(self, "algo")  # types first; nested mappings become configs
        require_positive(self, "num_critics", "batch_size", "hidden_size", "hidden_layers")
        require_above_zero(self, "actor_lr", "critic_lr", "alpha_lr", "init_alpha")
        require_in_range(self, "gamma", 0.0, 1.0, low_open=True, hint=" (the discount; usually 0.99)")
        require_in_range(self, "tau", 0.0, 1.0, low_open=True, hint=" (the target networks' Polyak rate; usually 5e-3)")
        require_in_range(self, "target_entropy")  # any finite number, or None for -|A|
        require_nonnegative(self, "eta")
        if self.eta < 0 or (self.eta > 0 and self.num_critics < 2):
            raise ConfigError(f"eta = {self.eta} needs eta >= 0, and at least 2 critics when eta > 0 "
                              f"(num_critics = {self.num_critics}).")
        check_init(self.init)
        if self.update_order not in UPDATE_ORDERS:
            raise ConfigError(f"algo.update_order must be one of {', '.join(UPDATE_ORDERS)}, got '{self.update_order}'.")
        require_above_zero(self, "alpha_max")


class SAC(CriticValue, FeedForwardAgent):
    """A SAC-N agent: ``act(obs)``, ``update(batch) -> metrics``, ``state_dict()``.

    The agent knows nothing of where its batches come from: the trainer draws them from the dataset
    and, when the run has a generator, from its synthetic data (`mbrl_offline.roles`). Model-based
    agents such as `mbrl_offline.algorithms.ravl.RAVL` are this class with other settings and a
    published generator (`published_generator`), which configuration may replace.

    On a GPU, an update at the paper's sizes is a few hundred small kernels whose launches, not the
    GPU's arithmetic, set the pace (docs/gpu.md). With ``cuda_graph`` (the default; it does nothing on
    a CPU) the first three updates run as usual, the fourth is recorded as one CUDA graph, and every
    update after that copies its batch in and replays it (`mbrl_offline.utils.CUDAGraphed`): the same
    kernels, so the same arithmetic, in one launch.
    For that the optimisers are capturable (their step counts live on the GPU) and nothing in the
    update waits for the GPU. The graph is recorded again after `load_state_dict` (the optimisers'
    state tensors are new) and after a learning-rate change.
    Agents whose update has data-dependent shapes (MOBILE) set ``graph_capturable = False`` and run
    eagerly.
    """

    name = "sac"
    config_class = SACConfig
    graph_capturable = True  # whether `update` can be recorded as a CUDA graph (no data-dependent shapes)
    warmup_updates = 3  # eager updates on a side stream before the graph is recorded

    def __init__(self, obs_dim: int, act_dim: int, action_low, action_high,
                 config: Optional[SACConfig] = None, device: str | torch.device = "cpu"):
        config = config_argument(config, type(self).config_class, f"{type(self).__name__}'s config")
        self.config, self.device = config, torch.device(device)
        self.obs_dim, self.act_dim = obs_dim, act_dim
        self.actor = TanhGaussianActor(obs_dim, act_dim, action_low, action_high, config.hidden_size,
                                       config.hidden_layers, init=config.init).to(self.device)
        self.critic = CriticEnsemble(obs_dim, act_dim, config.num_critics, config.hidden_size,
                                     config.hidden_layers, init=config.init).to(self.device)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = torch.tensor(float(np.log(config.init_alpha)), device=self.device,
                                      requires_grad=config.auto_alpha)
        self.target_entropy = -float(act_dim) if config.target_entropy is None else config.target_entropy
        self.graphed = config.cuda_graph and self.device.type == "cuda" and self.graph_capturable
        self.actor_optim = _adam(self.actor.parameters(), config.actor_lr, config.fused_adam, self.graphed)
        self.critic_optim = _adam(self.critic.parameters(), config.critic_lr, config.fused_adam, self.graphed)
        self.alpha_optim = (_adam([self.log_alpha], config.alpha_lr, config.fused_adam, self.graphed)
                            if config.auto_alpha else None)
        self._graphed_update = CUDAGraphed(self._packed_update, self.warmup_updates)

    @property
    def alpha(self) -> torch.Tensor:
        """The entropy temperature the losses use: exp(log alpha), at most ``alpha_max`` where set."""
        alpha = self.log_alpha.detach().exp()
        return alpha if self.config.alpha_max is None else alpha.clamp(max=self.config.alpha_max)

    @torch.no_grad()
    def act(self, obs: np.ndarray, deterministic: bool = False) -> np.ndarray:
        """Action(s) for one observation ``(obs_dim,)`` or a batch ``(B, obs_dim)``, as numpy."""
        obs_t = self.act_input(obs)  # checked: shape (obs_dim,) or (B, obs_dim), finite
        action, _ = self.actor(obs_t, deterministic=deterministic, with_log_prob=False)
        return action.cpu().numpy()

    @classmethod
    def published_generator(cls):
        """The generator the algorithm was published with (``generator=`` unset): none for SAC, as for
        the other model-free agents (`mbrl_offline.algorithms.model_free.published_generator`)."""
        return model_free.published_generator()

    # ------------------------------------------------------------------ the policy role (with FeedForwardAgent's)
    @torch.no_grad()
    def sample(self, observations: torch.Tensor, state=None, starts=None) -> tuple[torch.Tensor, None]:
        """Actions sampled from the current policy (model rollouts sample, as RAVL's and MBPO's code)."""
        return self.actor(observations, with_log_prob=False)[0], None

    def log_prob(self, observations: torch.Tensor, actions: torch.Tensor, state=None, starts=None) -> torch.Tensor:
        """log pi(a|s) of given env-unit actions under the tanh-Gaussian actor, differentiable in them."""
        return self.actor.log_prob_of(observations, actions)

    # ------------------------------------------------------------------ the value role (`policies.CriticValue`)
    @torch.no_grad()
    def mode(self, observations: torch.Tensor) -> torch.Tensor:
        """The deterministic action: the tanh of the Gaussian's mean, in the env's units."""
        return self.actor(observations, deterministic=True, with_log_prob=False)[0]

    def update(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """One gradient step on each of alpha, actor and critics; returns detached scalar tensors
        (no device sync here: callers average them when they need numbers)."""
        if not self.graphed:
            return self._update(batch)
        values = self._graphed_update(batch).clone()  # the graph's output is overwritten by its next replay
        return dict(zip(self._metric_names, values.unbind()))

    def _packed_update(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """`_update`'s metrics as one tensor, for the CUDA graph (names in ``_metric_names``)."""
        metrics = self._update(batch)
        self._metric_names = list(metrics)
        return torch.stack(list(metrics.values()))

    def _update(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        obs, actions = batch["observations"], batch["actions"]
        weights = row_weights(batch)  # per-row loss weights (B,), or None for plain means
        cfg = self.config
        order = cfg.update_order
        if order == "offlinerlkit_sac":  # the critics first, their target from the actor and alpha as they are
            q, td_loss, diversity = self._critic_step(batch, self.critic_target(batch, self.alpha), weights)

        # Actor (and alpha from the same sample), with hand-written gradients: no autograd graph.
        new_actions, log_prob, actor_backward = self.actor.sample_with_backward(obs)
        rows = len(log_prob)
        if order != "corl":
            alpha = self.alpha  # the actor's loss reads the alpha before this update's step
            if order == "official":  # ... and so does the critics' target, with the actor before its step
                target = self.critic_target(batch, alpha)
        if self.alpha_optim is not None:
            # d/d(log a) of -log a * mean(log pi + H_target)
            self.log_alpha.grad = batch_mean(log_prob + self.target_entropy, weights).neg_()
            self.alpha_optim.step()
        if order == "corl":
            alpha = self.alpha
        # d(-min_i Q_i)/da is the minimising critic's action gradient, from an explicit pass for that
        # critic only: L(pi) = mean(alpha log pi - min_i Q_i) has dL/da = -grad_a min_i Q_i / B and
        # dL/dlog pi = alpha / B (with weights: w_b in place of 1 / B, row by row).
        q_new, q_new_grad = self.critic.min_q_and_action_gradient(obs, new_actions)
        actor_loss = batch_mean(alpha * log_prob - q_new, weights)
        if weights is None:
            actor_backward(q_new_grad.mul_(-1.0 / rows), alpha / rows)
        else:
            actor_backward(q_new_grad.mul_(weights.unsqueeze(-1)).neg_(), alpha * weights)
        self.actor_optim.step()

        if order in ("corl", "offlinerlkit"):  # the target from the updated actor and alpha
            target = self.critic_target(batch, self.alpha)
        if order != "offlinerlkit_sac":
            q, td_loss, diversity = self._critic_step(batch, target, weights)

        soft_update(self.target_critic, self.critic, cfg.tau)

        q = q.detach()
        return {
            "critic_loss": td_loss.detach(),
            "diversity_loss": diversity.detach(),
            "actor_loss": actor_loss.detach(),
            "alpha": self.alpha,
            "q_mean": q.mean(),
            "q_std": q.std(dim=0).mean() if cfg.num_critics > 1 else torch.zeros((), device=self.device),
            "entropy": -log_prob.mean(),
        }

    def _critic_step(self, batch: dict[str, torch.Tensor], target: torch.Tensor,
                     weights: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step of the critics towards ``target``: the losses' gradients in q and in the action
        gradients, by hand (`critic_losses`), then one backward through the critic ensemble. Returns
        the critics' q ``(N, B)`` and the TD and diversity losses."""
        obs, actions = batch["observations"], batch["actions"]
        if self.config.eta > 0:
            q, action_grad = self.critic.q_and_action_gradient(obs, actions)
            outputs = (q, action_grad)
        else:
            q, action_grad = self.critic(obs, actions), None
            outputs = (q,)
        td_loss, diversity, output_grads = critic_losses(q.detach(), action_grad, target, self.config.eta, weights)
        self.critic_optim.zero_grad(set_to_none=True)
        torch.autograd.backward(outputs, output_grads)
        self.critic_optim.step()
        return q, td_loss, diversity

    def on_epoch_end(self, epoch: int, total_epochs: int) -> None:
        """Called by the trainer after each epoch: with ``actor_lr_cosine`` the actor's learning rate
        follows ``actor_lr (1 + cos(pi epoch / total_epochs)) / 2``, torch's ``CosineAnnealingLR`` with
        ``T_max = total_epochs`` stepped once per epoch (as OfflineRL-Kit's MOPO and MOBILE); computed
        from the epoch, so a resumed run continues it exactly."""
        if self.config.actor_lr_cosine:
            anneal_cosine(self.actor_optim, self.config.actor_lr, epoch, total_epochs)
            self._graphed_update.reset()  # the recorded optimiser step holds the old rate

    @torch.no_grad()
    def critic_target(self, batch: dict[str, torch.Tensor], alpha: torch.Tensor) -> torch.Tensor:
        """``y = r + gamma (1 - terminal) (min_i Qbar_i(s', a') - alpha log pi(a'|s'))``, a' ~ pi(.|s'), for
        each row ``(B,)``; without the entropy term when ``deterministic_backup``. Agents that penalise
        the target (MOBILE) override this."""
        next_actions, next_log_prob = self.actor(batch["next_observations"])
        next_q = self.target_critic(batch["next_observations"], next_actions).min(dim=0).values
        if not self.config.deterministic_backup:
            next_q = next_q - alpha * next_log_prob
        not_done = 1.0 - batch["terminals"].float()
        return batch["rewards"] + self.config.gamma * not_done * next_q

    def state_dict(self) -> dict:
        return soft_actor_critic_state(self)

    def load_state_dict(self, state: dict) -> None:
        load_soft_actor_critic_state(self, state)
        self._graphed_update.reset()  # the loaded optimiser state is in new tensors: record again


def soft_actor_critic_state(agent) -> dict:
    """The checkpoint state every soft actor-critic agent shares (SAC's family and NEUBAY): its config,
    actor, critic and target critic, log alpha, and optimisers (the alpha optimiser where alpha is
    learnt)."""
    state = {
        "config": asdict(agent.config),
        "actor": agent.actor.state_dict(),
        "critic": agent.critic.state_dict(),
        "target_critic": agent.target_critic.state_dict(),
        "log_alpha": agent.log_alpha.detach().clone(),
        "actor_optim": agent.actor_optim.state_dict(),
        "critic_optim": agent.critic_optim.state_dict(),
    }
    if agent.alpha_optim is not None:
        state["alpha_optim"] = agent.alpha_optim.state_dict()
    return state


def load_soft_actor_critic_state(agent, state: dict) -> None:
    """Load what `soft_actor_critic_state` saved into ``agent``, in place."""
    agent.actor.load_state_dict(state["actor"])
    agent.critic.load_state_dict(state["critic"])
    agent.target_critic.load_state_dict(state["target_critic"])
    with torch.no_grad():
        agent.log_alpha.copy_(state["log_alpha"])
    agent.actor_optim.load_state_dict(state["actor_optim"])
    agent.critic_optim.load_state_dict(state["critic_optim"])
    if agent.alpha_optim is not None:
        agent.alpha_optim.load_state_dict(state["alpha_optim"])


__all__ = ["SAC", "SACConfig"]
