"""NEUBAY's agent: recurrent SAC on tapes of whole episodes (Ni et al. 2025, "Long-Horizon Model-Based
Offline Reinforcement Learning Without Conservatism"; official code twni2016/neubay,
``online_rl/ac_{modules,losses}.py`` and ``offline_cont.py``).

The actor and the critic each read the history through their own `RecurrentEncoder` (a per-row
`Block` then a stacked LRU, or a GRU); the inputs are x_k = [s_k, a_{k-1}, r_{k-1}] (zeros for the
previous action and reward at an episode's first row), unnormalised, actions in the env's units. On
the encoder's features h_k the critic has 10 heads Q_n(h_k, a) (`EnsembleHeads`, output layer
U(+-sqrt(0.01 / fan_in)), zero biases) and the actor one head giving a tanh-Gaussian (log-std clamped
to [-5, 2]). The target critic is a copy of the whole critic, encoder included.

An update takes one tape of T rows (`mbrl_offline.buffer.SequenceBuffer.tape`: episodes concatenated
whole, each ending with its final-observation row, the last one cut), runs every encoder over it from
the zero state, resetting at ``starts``, and, with the row mask m_k = 1 - starts_{k+1} (k < T - 1:
the pair from an episode's final row to the next episode's start is no transition):

1. critic:  y_k = r_k + gamma (1 - terminal_k) (min_{j in J} Qbar_j(h_{k+1}, a'_{k+1}) - alpha log pi(a'_{k+1}|h_{k+1})),
            a' ~ pi(.|h_{k+1}), J two heads drawn without replacement, afresh each update;
            L(Q) = sum_k w_k mean_n huber(Q_n(h_k, a_k) - y_k)      (Huber with delta 1);
2. Polyak averaging of the target critic (encoder and heads) with rate tau;
3. actor:   L(pi) = sum_k w_k (alpha log pi(a_k|h_k) - mean_n Q_n(h_k, a_k)),  a_k ~ pi(.|h_k), with the
            critic just updated;
4. alpha:   L(alpha) = sum_k w_k alpha (H_k - H_target),  H_k = -log pi(a_k|h_k) from step 3,
            alpha = exp(log_alpha), H_target = -|A| target_alpha_ratio (``target_alpha_ratio`` None: alpha fixed).

The row weights w_k are the tape's ``weights`` field (the ``tape`` mixing rule:
w_k = m_k (kappa real_k / max(1, sum m real) + (1 - kappa) synthetic_k / max(1, sum m synthetic)), the
official real/imagined mixing); without it, the masked mean w_k = m_k / max(1, sum m).

Optimisers as the official ``optax.partition`` into encoder (``pre`` + memory) and head for both
networks: four parameter groups, each with its own chain: NaN gradients set to 0 (infinities kept, as
``optax.zero_nans``), the group's global norm clipped to ``grad_clip`` (1000), AdamW without decay and a
cosine schedule lr_n = lr ((1 - ratio) (1 + cos(pi min(n, N) / N)) / 2 + ratio) over N =
``schedule_updates`` (None: the trainer's total, `set_total_updates`) with ratio 1 for the critic
(constant) and 0 for the actor (to 0). alpha has a plain Adam. The AdamW steps run as torch's fused
kernel (``fused_adam``, on by default: one pass per parameter, the same update as the per-tensor loop
up to float rounding), and each group's norm and clipping as one operator over its gradients.

Deviations from the official code, none of which changes a loss's expectation:

* one actor pass over the tape serves both the critic target's a' (detached) and the actor loss (its
  own noise draw): the actor has not changed in between, so the distributions are the official ones,
  with one encoder pass fewer per update;
* in the actor step the (updated) critic's encoder runs without an autograd graph, and its heads with
  their parameters out of autograd (`mbrl_offline.utils.frozen`): the actor's gradient reaches the
  critic through the actions only, which enter at the heads;
* the plain masked mean divides by max(1, sum m) (the official code by sum m, which is 0 only for a
  tape of starts alone);
* the two target heads are drawn with torch's RNG (``randperm``), the noise likewise;
* ``q_mean`` is the masked mean over all heads (the official logs head 0's);
* `act` on a bare observation acts as at an episode's first step (zero state, no previous action and
  reward): evaluation goes through `episode_policy`, which carries the state;
* on an AMD CPU with AVX-512 the encoders' products and the critic heads' first layer run on oneDNN
  rather than MKL (`mbrl_offline.models.recurrent`, `mbrl_offline.models.products`): float rounding only;
* on a CPU the LRU's recurrence and its adjoint run as compiled C loops over the rows
  (`mbrl_offline.models.scan_kernel`; the official code runs ``jax.lax.associative_scan``): float rounding
  only. Without a C compiler they run as torch operators, after one warning;
* on a CPU, at sizes where it pays (10 heads x 2047 rows x 256 does), the critic heads' LayerNorm,
  affine map, leaky ReLU and output column run as compiled fused kernels (``fused_heads``,
  `mbrl_offline.models.recurrent.FusedKernels`; the official code's XLA fuses them too): float rounding
  only. Without a C++ compiler they run eagerly, after one warning.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from mbrl_offline.algorithms.sac import load_soft_actor_critic_state, soft_actor_critic_state
from mbrl_offline.buffer import tape_weights
from mbrl_offline.config import (check_field_types, config_argument, require_above_zero, require_fraction,
                                 require_in_range, require_nonnegative, require_positive)
from mbrl_offline.errors import ConfigError, InputError
from mbrl_offline.models.networks import tanh_gaussian_draw, tanh_gaussian_log_prob, tanh_gaussian_log_prob_of
from mbrl_offline.models.recurrent import ENCODERS, Block, EnsembleHeads, RecurrentEncoder
from mbrl_offline.policies import agent_for_dataset, checked_observations, history_inputs
from mbrl_offline.utils import adam_kernel, clean_and_clip, cosine_decay, frozen, soft_update
from mbrl_offline.registry import register_agent


@dataclass
class NEUBAYConfig:
    batch_size: int = 2048  # rows per tape (one tape per update)
    encoder: str = "lru"  # history encoder: "lru" (official) or "gru" (library extension)
    d_model: int = 256  # encoder width (the pre Block's output and every LRU layer's input/output)
    d_hidden: int = 128  # complex states per LRU layer (unused by the GRU, whose state is d_model wide)
    encoder_layers: int = 2  # stacked LRU (or GRU) layers
    r_min: float = 0.0  # LRU eigenvalue moduli start uniform-squared on [r_min, r_max]
    r_max: float = 0.9
    max_phase: float = 6.28  # LRU eigenvalue phases start uniform on [0, max_phase)
    head_hidden: int = 256  # width of the actor's and every critic head's hidden Blocks
    head_layers: int = 2  # hidden Blocks per head
    num_critics: int = 10  # critic heads; the actor uses their mean
    sampled_critics: int = 2  # target heads drawn (without replacement) per update; the target is their min
    gamma: float = 0.99  # discount
    tau: float = 0.005  # Polyak rate of the target critic (encoder and heads)
    init_alpha: float = 0.2  # initial entropy temperature
    target_alpha_ratio: Optional[float] = 1.0  # H_target = -|A| * this; None: alpha stays init_alpha (hopper presets)
    encoder_lr: float = 1e-5  # learning rate of both encoders (tuned per task in the presets)
    critic_encoder_lr: Optional[float] = None  # None: encoder_lr
    actor_encoder_lr: Optional[float] = None  # None: encoder_lr
    critic_head_lr: float = 1e-4
    actor_head_lr: float = 1e-4
    alpha_lr: float = 1e-4  # plain Adam on log alpha, no clipping, no schedule
    critic_lr_ratio: float = 1.0  # cosine schedule's final fraction of the critic's rates (1: constant)
    actor_lr_ratio: float = 0.0  # ... of the actor's rates (0: anneal to 0)
    adam_eps: float = 1e-8
    grad_clip: float = 1000.0  # global-norm clip, per parameter group (encoder / head of actor / critic)
    fused_adam: bool = True  # AdamW as torch's fused kernel (one pass per parameter; rounds differently, same maths)
    fused_heads: bool = True  # the critic heads' LayerNorm, affine map, leaky ReLU and output column as compiled fused kernels on CPU, from 1M activations (rounds differently, same maths; needs a C++ compiler, else eager)
    backup_entropy: bool = True  # keep -alpha log pi(a'|h') in the critic target
    schedule_updates: Optional[int] = None  # length of the cosine schedules; None: the trainer's total updates

    def __post_init__(self):
        check_field_types(self, "algo")  # types first; nested mappings become configs
        require_positive(self, "batch_size", "d_model", "d_hidden", "encoder_layers", "head_hidden", "head_layers",
                         "num_critics", "sampled_critics", "schedule_updates")
        if self.batch_size < 2:
            raise ConfigError(f"algo.batch_size must be at least 2 (a tape needs a next row), got {self.batch_size}.")
        if self.encoder not in ENCODERS:
            raise ConfigError(f"algo.encoder = '{self.encoder}' is unknown; choose one of {', '.join(ENCODERS)}.")
        if self.sampled_critics > self.num_critics:
            raise ConfigError(f"algo.sampled_critics ({self.sampled_critics}) must not exceed algo.num_critics "
                              f"({self.num_critics}).")
        require_in_range(self, "r_min", 0.0, 1.0, high_open=True)
        require_in_range(self, "r_max", 0.0, 1.0, low_open=True)
        if self.r_min >= self.r_max:
            raise ConfigError(f"algo.r_min ({self.r_min}) must be below algo.r_max ({self.r_max}).")
        require_above_zero(self, "max_phase", "init_alpha", "encoder_lr", "critic_encoder_lr", "actor_encoder_lr",
                           "critic_head_lr", "actor_head_lr", "alpha_lr", "adam_eps", "grad_clip")
        require_in_range(self, "gamma", 0.0, 1.0, low_open=True, hint=" (the discount; usually 0.99)")
        require_in_range(self, "tau", 0.0, 1.0, low_open=True, hint=" (the target critic's Polyak rate; usually 5e-3)")
        require_nonnegative(self, "target_alpha_ratio")
        require_fraction(self, "critic_lr_ratio", "actor_lr_ratio")


def tape_inputs(tape: dict[str, torch.Tensor]) -> torch.Tensor:
    """x_k = [observations_k, actions_{k-1}, observed_rewards_{k-1} (else rewards_{k-1})] for every row
    of a tape ``(T, S + A + 1)``, zeros where ``starts_k``: the policy's input carries the reward the
    model gave (raw), while TD targets use ``rewards`` (penalised where a generator penalises)."""
    actions = tape["actions"]
    rewards = tape["observed_rewards"] if "observed_rewards" in tape else tape["rewards"]
    previous_actions = torch.cat([torch.zeros_like(actions[:1]), actions[:-1]])
    previous_rewards = torch.cat([torch.zeros_like(rewards[:1]), rewards[:-1]])
    return history_inputs(tape["observations"], previous_actions, previous_rewards, tape["starts"])


def loss_weights(tape: dict[str, torch.Tensor]) -> torch.Tensor:
    """The weight w_k of TD row k ``(T - 1,)``: the tape's ``weights`` (kappa mixing) or, without them, the
    masked mean's m_k / max(1, sum m) with m_k = 1 - starts_{k+1} (`mbrl_offline.buffer.tape_weights`
    with every row real and kappa 1)."""
    if "weights" in tape:
        return tape["weights"][:-1].float()
    return tape_weights(tape["starts"].bool(), torch.zeros_like(tape["starts"], dtype=torch.bool), 1.0)[:-1]


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``sum(values * mask) / max(1, sum(mask))`` (a metric over a group of rows that may be empty)."""
    mask = mask.float()
    return (values * mask).sum() / mask.sum().clamp_min(1.0)


class RecurrentActor(nn.Module):
    """History encoder -> ``head_layers`` Blocks -> Linear(2A): the tanh-Gaussian's mean and raw
    log-std for every row (official ``RecurrentActor``)."""

    def __init__(self, input_dim: int, act_dim: int, config: NEUBAYConfig, action_low, action_high):
        super().__init__()
        self.encoder = _encoder(input_dim, config)
        layers, width = [], config.d_model
        for _ in range(config.head_layers):
            layers.append(Block(width, config.head_hidden))
            width = config.head_hidden
        layers.append(nn.Linear(width, 2 * act_dim))  # default init: U(+-1/sqrt(fan_in))
        self.head = nn.Sequential(*layers)
        self.register_buffer("action_scale", (torch.as_tensor(action_high, dtype=torch.float32)
                                              - torch.as_tensor(action_low, dtype=torch.float32)) / 2)
        self.register_buffer("action_offset", (torch.as_tensor(action_high, dtype=torch.float32)
                                               + torch.as_tensor(action_low, dtype=torch.float32)) / 2)

    def forward(self, x: torch.Tensor, starts: torch.Tensor, state=None):
        """``(mu, raw_log_std, state)``, each of the first two ``(..., T, A)``."""
        features, state = self.encoder(x, starts, state)
        mu, raw_log_std = self.head(features).chunk(2, dim=-1)
        return mu, raw_log_std, state

    def draw(self, mu: torch.Tensor, raw_log_std: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(action, log_prob)`` drawn from the tanh-Gaussian, reparameterised."""
        log_std, _, noise, u, _, action = tanh_gaussian_draw(mu, raw_log_std, self.action_scale, self.action_offset)
        return action, tanh_gaussian_log_prob(noise, log_std, u, self.action_scale)

    def mode(self, mu: torch.Tensor) -> torch.Tensor:
        return torch.tanh(mu) * self.action_scale + self.action_offset


class RecurrentCritic(nn.Module):
    """History encoder + ``num_critics`` heads on [h_k, a] (official ``RecurrentCritic``)."""

    def __init__(self, input_dim: int, act_dim: int, config: NEUBAYConfig):
        super().__init__()
        self.encoder = _encoder(input_dim, config)
        self.heads = EnsembleHeads(config.d_model + act_dim, 1, config.num_critics, config.head_hidden,
                                   config.head_layers, final_scale=0.01, fused=config.fused_heads)

    def q(self, features: torch.Tensor, actions: torch.Tensor, members: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Q_n(h, a) ``(N, R)`` for features ``(R, d_model)`` and actions ``(R, A)`` (``members``: those heads).
        The heads read [h, a] as two parts (`EnsembleHeads`): the actor step's gradient in a then costs
        no product over h's 256 columns."""
        return self.heads([features, actions], members).squeeze(-1)


def _encoder(input_dim: int, config: NEUBAYConfig) -> RecurrentEncoder:
    return RecurrentEncoder(input_dim, config.encoder, config.d_model, config.d_hidden, config.encoder_layers,
                            config.r_min, config.r_max, config.max_phase)


class RecurrentEpisodePolicy:
    """The agent's policy for acting in envs, episode by episode (``Agent.episode_policy``): it keeps,
    for each of ``episodes`` slots, the recurrent state and the previous action, and each call steps
    the slots ``rows`` once. ``rewards`` are those received on each slot's previous step; ``starts``
    marks slots whose episode begins now (their state and previous action and reward are dropped).
    Slots not in ``rows`` are untouched."""

    def __init__(self, agent: "NEUBAY", deterministic: bool):
        self.agent, self.deterministic = agent, deterministic
        self.reset(1)

    def reset(self, episodes: int) -> None:
        if isinstance(episodes, bool) or not isinstance(episodes, (int, np.integer)) or episodes < 1:
            raise InputError(f"neubay episode policy: reset takes the number of episodes (a whole number of at "
                             f"least 1), got {episodes!r}.")
        self.episodes = int(episodes)
        self.state = self.agent.actor.encoder.initial_state(self.episodes)
        self.previous_actions = torch.zeros(episodes, self.agent.act_dim, device=self.agent.device)

    @torch.no_grad()
    def __call__(self, observations, rewards, starts, rows) -> np.ndarray:
        agent = self.agent
        obs = checked_observations(observations, agent.obs_dim, agent.device, "neubay episode policy")
        obs = obs.reshape(-1, agent.obs_dim)
        rows = torch.as_tensor(np.asarray(rows), dtype=torch.long, device=agent.device).reshape(-1)
        starts = torch.as_tensor(np.asarray(starts), dtype=torch.bool, device=agent.device).reshape(-1)
        rewards = torch.as_tensor(np.asarray(rewards, dtype=np.float32), device=agent.device).reshape(-1)
        if not len(rows) == len(starts) == len(rewards) == len(obs):
            raise InputError(f"neubay episode policy: observations ({len(obs)}), rewards ({len(rewards)}), starts "
                             f"({len(starts)}) and rows ({len(rows)}) must have one entry per stepped episode.")
        if len(rows) and (int(rows.min()) < 0 or int(rows.max()) >= self.episodes):
            raise InputError(f"neubay episode policy: rows must be episode indices in 0..{self.episodes - 1} (it was "
                             f"reset for {self.episodes} episode(s)), got {int(rows.min())}..{int(rows.max())}; call "
                             f"reset(episodes) with the number of episodes you step.")
        x = history_inputs(obs, self.previous_actions[rows], rewards, starts)
        state = [s[rows] for s in self.state]
        mu, raw_log_std, state = agent.actor(x.unsqueeze(1), starts.unsqueeze(1), state)
        mu, raw_log_std = mu[:, 0], raw_log_std[:, 0]
        action = agent.actor.mode(mu) if self.deterministic else agent.actor.draw(mu, raw_log_std)[0]
        for stored, new in zip(self.state, state):
            stored[rows] = new
        self.previous_actions[rows] = action
        return action.cpu().numpy()


@register_agent
class NEUBAY:
    """Recurrent SAC on tapes (see the module docstring): ``update(tape) -> metrics``, the recurrent
    policy role (``sample``, ``log_prob``, ``initial_state`` on history inputs [s_k, a_{k-1}, r_{k-1}]),
    ``episode_policy`` for evaluation, ``act``, ``state_dict``."""

    name = "neubay"
    # what it is, for the docs' tables
    summary = "recurrent SAC (LRU encoders, 10 critic heads) on tapes of whole episodes, no penalty"
    defaults_from = "the official NEUBAY code"  # the code its defaults come from
    config_class = NEUBAYConfig
    recurrent = True  # the policy carries a state from step to step
    needs_dynamics = False
    consumes = "sequences"  # learns from tapes of whole episodes
    divergence_metric = "q_mean"  # the update metric the trainer's divergence guard watches

    def __init__(self, obs_dim: int, act_dim: int, action_low, action_high, config: Optional[NEUBAYConfig] = None,
                 device: str | torch.device = "cpu"):
        config = config_argument(config, type(self).config_class, f"{type(self).__name__}'s config")
        self.config, self.device = config, torch.device(device)
        self.obs_dim, self.act_dim = obs_dim, act_dim
        self.input_dim = obs_dim + act_dim + 1
        self.actor = RecurrentActor(self.input_dim, act_dim, config, action_low, action_high).to(self.device)
        self.critic = RecurrentCritic(self.input_dim, act_dim, config).to(self.device)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)  # equal at init, as the official
        self.auto_alpha = config.target_alpha_ratio is not None
        self.log_alpha = torch.tensor(math.log(config.init_alpha), device=self.device, requires_grad=self.auto_alpha)
        self.target_entropy = -act_dim * config.target_alpha_ratio if self.auto_alpha else None
        critic_encoder_lr = config.critic_encoder_lr if config.critic_encoder_lr is not None else config.encoder_lr
        actor_encoder_lr = config.actor_encoder_lr if config.actor_encoder_lr is not None else config.encoder_lr
        # One optimiser per network, one parameter group per partition (encoder, head), each with its
        # own clip and schedule: (base lr, final ratio) per group, in the optimiser's group order.
        self.critic_optim = self._adamw([self.critic.encoder, self.critic.heads], [critic_encoder_lr, config.critic_head_lr])
        self.actor_optim = self._adamw([self.actor.encoder, self.actor.head], [actor_encoder_lr, config.actor_head_lr])
        self.critic_schedule = [(critic_encoder_lr, config.critic_lr_ratio), (config.critic_head_lr, config.critic_lr_ratio)]
        self.actor_schedule = [(actor_encoder_lr, config.actor_lr_ratio), (config.actor_head_lr, config.actor_lr_ratio)]
        self.alpha_optim = (torch.optim.Adam([self.log_alpha], lr=config.alpha_lr, **adam_kernel()) if self.auto_alpha
                            else None)
        self.updates = 0  # optimiser steps taken: the schedules' clock
        self.total_updates = config.schedule_updates  # None until `set_total_updates` (then: constant rates)

    def _adamw(self, modules: list[nn.Module], rates: list[float]) -> torch.optim.AdamW:
        groups = [{"params": list(module.parameters()), "lr": lr} for module, lr in zip(modules, rates)]
        return torch.optim.AdamW(groups, betas=(0.9, 0.999), eps=self.config.adam_eps, weight_decay=0.0,
                                 **adam_kernel(self.config.fused_adam))

    @property
    def alpha(self) -> torch.Tensor:
        return self.log_alpha.detach().exp()

    @property
    def policy(self) -> "NEUBAY":
        """The policy generators roll out: this agent's actor."""
        return self

    @classmethod
    def for_dataset(cls, dataset, config=None, device: str | torch.device = "cpu", **parts):
        """The agent for ``dataset``'s env (its sizes and action bounds)."""
        return agent_for_dataset(cls, dataset, config, device, parts)

    @classmethod
    def published_generator(cls):
        """NEUBAY was published with posterior rollouts (`mbrl_offline.generators.posterior`)."""
        from mbrl_offline.generators.posterior import PosteriorGeneratorConfig  # lands with the posterior generator
        return PosteriorGeneratorConfig()

    def set_total_updates(self, total: int) -> None:
        """The run's number of updates, which the cosine schedules span unless ``schedule_updates`` is set
        (the trainer calls this once)."""
        if self.config.schedule_updates is None:
            self.total_updates = int(total)

    # ------------------------------------------------------------------ the policy role
    def initial_state(self, batch_size: int) -> list[torch.Tensor]:
        """The zero state, one tensor per encoder layer, batch first."""
        return self.actor.encoder.initial_state(batch_size)

    def _last_step(self, observations, state, starts):
        if observations.dim() == 2:
            observations = observations.unsqueeze(1)
            starts = None if starts is None else starts.reshape(-1, 1)
        if observations.dim() != 3 or observations.shape[-1] != self.input_dim:
            raise InputError(f"neubay policy: inputs must be (B, {self.input_dim}) or (B, T, {self.input_dim}) history "
                             f"inputs [s, previous a, previous r], got {tuple(observations.shape)}.")
        if starts is None:
            starts = torch.zeros(observations.shape[:2], dtype=torch.bool, device=observations.device)
        mu, raw_log_std, state = self.actor(observations, starts, state)
        return mu[:, -1], raw_log_std[:, -1], state

    @torch.no_grad()
    def sample(self, observations: torch.Tensor, state=None, starts: Optional[torch.Tensor] = None):
        """Actions ``(B, A)`` sampled for the last step of history inputs ``(B, D)`` or ``(B, T, D)``
        (``starts`` ``(B,)`` or ``(B, T)``; None: no starts), and the state after it."""
        mu, raw_log_std, state = self._last_step(observations, state, starts)
        return self.actor.draw(mu, raw_log_std)[0], state

    @torch.no_grad()
    def deterministic(self, observations: torch.Tensor, state=None, starts: Optional[torch.Tensor] = None):
        """The policy's mode (the tanh of the mean, in the env's units) for the last step of history inputs
        ``(B, D)`` or ``(B, T, D)``, and the state after it: what evaluation and an exported policy take."""
        mu, _, state = self._last_step(observations, state, starts)
        return self.actor.mode(mu), state

    def log_prob(self, observations: torch.Tensor, actions: torch.Tensor, state=None,
                 starts: Optional[torch.Tensor] = None) -> torch.Tensor:
        """log pi(a|h) ``(B,)`` of env-unit actions at the last step, differentiable in ``actions``."""
        mu, raw_log_std, _ = self._last_step(observations, state, starts)
        return tanh_gaussian_log_prob_of(mu, raw_log_std, actions, self.actor.action_scale, self.actor.action_offset)

    @torch.no_grad()
    def act(self, obs, deterministic: bool = False) -> np.ndarray:
        """Action(s) for one observation ``(S,)`` or a batch ``(B, S)`` as the first step of an episode
        (zero state); `episode_policy` carries the history."""
        obs_t = checked_observations(obs, self.obs_dim, self.device, f"{self.name}.act")
        batch = obs_t.reshape(-1, self.obs_dim)
        starts = torch.ones(len(batch), dtype=torch.bool, device=self.device)
        x = history_inputs(batch, batch.new_zeros(len(batch), self.act_dim), batch.new_zeros(len(batch)), starts)
        mu, raw_log_std, _ = self._last_step(x, None, starts)
        action = self.actor.mode(mu) if deterministic else self.actor.draw(mu, raw_log_std)[0]
        return action.reshape(*obs_t.shape[:-1], self.act_dim).cpu().numpy()

    def episode_policy(self, deterministic: bool = True) -> RecurrentEpisodePolicy:
        return RecurrentEpisodePolicy(self, deterministic)

    # ------------------------------------------------------------------ learning
    def draw_heads(self) -> torch.Tensor:
        """``sampled_critics`` distinct target heads, drawn afresh for each update."""
        return torch.randperm(self.config.num_critics, device=self.device)[:self.config.sampled_critics]

    @torch.no_grad()
    def critic_target(self, x: torch.Tensor, tape: dict[str, torch.Tensor], next_actions: torch.Tensor,
                      next_log_prob: torch.Tensor, heads: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        """y_k for TD rows k = 0..T-2 ``(T - 1,)`` from the target critic at rows k + 1, with a' and its
        log pi ``(T - 1, ...)`` drawn at rows 1..T-1 and the target ``heads``."""
        features, _ = self.target_critic.encoder(x, tape["starts"])
        next_q = self.target_critic.q(features[1:], next_actions, heads).min(dim=0).values
        if self.config.backup_entropy:
            next_q = next_q - alpha * next_log_prob
        not_done = 1.0 - tape["terminals"][:-1].float()
        return tape["rewards"][:-1].float() + self.config.gamma * not_done * next_q

    def critic_loss(self, x: torch.Tensor, tape: dict[str, torch.Tensor], target: torch.Tensor,
                    weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(sum_k w_k mean_n huber(Q_n(h_k, a_k) - y_k), per-row Huber (T - 1,), Q (N, T - 1))``."""
        features, _ = self.critic.encoder(x, tape["starts"])
        q = self.critic.q(features[:-1], tape["actions"][:-1])
        per_row = F.huber_loss(q, target.expand_as(q), reduction="none", delta=1.0).mean(dim=0)
        return (weights * per_row).sum(), per_row, q

    def _step(self, optimizer: torch.optim.Optimizer, schedule, loss: torch.Tensor) -> list[torch.Tensor]:
        """Gradients of ``loss`` for the optimiser's parameters only, cleaned and clipped group by group
        (`clean_and_clip`), each group's rate from its schedule, one step. Returns the groups' norms."""
        params = [p for group in optimizer.param_groups for p in group["params"]]
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        grads = [torch.zeros_like(p) if g is None else g.contiguous() for p, g in zip(params, grads)]  # our own storage: cleaned in place
        norms, offset = [], 0
        for group, (base_lr, ratio) in zip(optimizer.param_groups, schedule):
            count = len(group["params"])
            group_grads = grads[offset:offset + count]
            offset += count
            norms.append(clean_and_clip(group_grads, self.config.grad_clip))
            for p, g in zip(group["params"], group_grads):
                p.grad = g
            if self.total_updates is not None:  # optax's cosine_decay_schedule(base_lr, N, alpha=ratio)
                progress = min(self.updates, self.total_updates) / self.total_updates
                group["lr"] = base_lr * cosine_decay(progress, 1.0, ratio)
            else:
                group["lr"] = base_lr
        optimizer.step()
        return norms

    def _alpha_step(self, entropy: torch.Tensor, weights: torch.Tensor) -> None:
        """``sum_k w_k alpha (H_k - H_target)``, alpha = exp(log_alpha): one Adam step on log_alpha."""
        alpha_loss = (weights * (self.log_alpha.exp() * (entropy - self.target_entropy))).sum()
        self.alpha_optim.zero_grad(set_to_none=True)
        alpha_loss.backward()
        self.alpha_optim.step()

    def update(self, tape: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """One update on a tape (see the module docstring); metrics as detached scalar tensors."""
        if tape["starts"].dim() != 1 or len(tape["starts"]) < 2:
            raise InputError(f"neubay.update takes one tape of at least 2 rows (fields of shape (T, ...)), got starts "
                             f"of shape {tuple(tape['starts'].shape)}.")
        x = tape_inputs(tape)
        starts = tape["starts"]
        weights = loss_weights(tape)
        mask = ~starts[1:].bool()
        real = ~tape["synthetic"][:-1].bool() if "synthetic" in tape else torch.ones_like(mask)
        alpha = self.alpha

        # The actor's pass over the tape: a' at rows 1.. for the target (detached), a at rows ..T-2 below.
        mu, raw_log_std, _ = self.actor(x, starts)
        with torch.no_grad():
            next_actions, next_log_prob = self.actor.draw(mu[1:], raw_log_std[1:])

        # 1. Critic, then 2. its target.
        target = self.critic_target(x, tape, next_actions, next_log_prob, self.draw_heads(), alpha)
        critic_loss, per_row, q = self.critic_loss(x, tape, target, weights)
        critic_norms = self._step(self.critic_optim, self.critic_schedule, critic_loss)
        soft_update(self.target_critic, self.critic, self.config.tau)

        # 3. Actor, against the critic just updated (its encoder needs no graph: the actions enter at the heads).
        actions, log_prob = self.actor.draw(mu[:-1], raw_log_std[:-1])
        with torch.no_grad():
            features, _ = self.critic.encoder(x, starts)
        with frozen(self.critic):  # the gradient is wanted in the actions only (the compiled heads' backward would compute the heads' too)
            q_new = self.critic.q(features[:-1], actions).mean(dim=0)
        actor_loss = (weights * (alpha * log_prob - q_new)).sum()
        actor_norms = self._step(self.actor_optim, self.actor_schedule, actor_loss)

        # 4. alpha, from the actor step's entropy.
        entropy = -log_prob.detach()
        if self.auto_alpha:
            self._alpha_step(entropy, weights)
        self.updates += 1

        return {
            "critic_loss": critic_loss.detach(),
            "critic_loss_real": masked_mean(per_row.detach(), mask & real),
            "critic_loss_synthetic": masked_mean(per_row.detach(), mask & ~real),
            "q_mean": masked_mean(q.detach().mean(dim=0), mask),
            "actor_loss": actor_loss.detach(),
            "alpha": alpha,
            "entropy_real": masked_mean(entropy, mask & real),
            "entropy_synthetic": masked_mean(entropy, mask & ~real),
            "critic_encoder_grad_norm": critic_norms[0],
            "critic_head_grad_norm": critic_norms[1],
            "actor_encoder_grad_norm": actor_norms[0],
            "actor_head_grad_norm": actor_norms[1],
        }

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        return {**soft_actor_critic_state(self), "updates": self.updates, "total_updates": self.total_updates}

    def load_state_dict(self, state: dict) -> None:
        load_soft_actor_critic_state(self, state)
        self.updates = int(state["updates"])
        self.total_updates = state["total_updates"]


__all__ = ["NEUBAY", "NEUBAYConfig"]
