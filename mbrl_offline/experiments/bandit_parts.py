"""The parts of NEUBAY's bandit illustration (Ni et al., 2025, Section 3 and Figure 3), as the official code
runs it (the twni2016/neubay repository: ``offline_bandit.py``, ``offline_world/bandit_data.py``,
``offline_world/bandit_ensemble.py``, ``online_rl/q_modules.py``, ``online_rl/q_losses.py``,
``configs/offline_bandit.yaml``); the command-line tool is `mbrl_offline.experiments.bandit`.

A two-armed Bernoulli bandit is played for ``horizon`` (100) pulls an episode. The offline data are
``data_episodes`` (10) episodes of always pulling arm 0, whose payout probability is 0.5: nothing is
known about arm 1. The posterior over bandits is an ensemble of ``ensemble_size`` (128) Gaussian
reward models r ~ N(mu(a), sigma(a)^2), fitted to the data (`fit_reward_ensemble`); its members agree
on arm 0 and disagree on arm 1. A recurrent agent (`RecurrentDQN`: NEUBAY's LRU history encoder with
a dueling double-DQN head) is trained in rollouts of the ensemble (`LearnedBandit`: rollout i plays
member i for a whole episode, each pull paying mu + eps sigma, minus ``penalty`` x U, U the std of the
members' mu for the pulled arm), then evaluated greedily on real bandits that pay 0.5 on arm 0 and
p1 in {0.01, 0.15, ..., 0.99} on arm 1 (`evaluate`).

The paper's finding: with penalty 0 the agent is Bayesian: the posterior says arm 1 may pay more,
so it tries arm 1 and keeps pulling it where it does pay more (return per pull near p1 for p1 > 0.5);
with a penalty it never leaves arm 0 (return 0.5 everywhere). `run_bandit` trains one agent per
penalty from one fitted ensemble, `results_table` and `plot_results` report it.

The pieces, each as the official code has it:

* the agent's input at step t is ``[0, one_hot(a_{t-1}), r_t]`` (the bandit's dummy observation 0,
  ``ActionRewardWrapper``), with ``one_hot(0)`` and reward 0 before the first pull;
* reward ensemble (``EnsembleBanditModel``): per member one_hot(a) -> 2 x [Linear(., 16) -> LayerNorm
  -> leaky ReLU] -> mu and log sigma, log sigma soft-clamped to [-5, 0.25] (PETS' clamp, in log-std
  space); U(+-1/sqrt(fan_in)) init; rewards unnormalised; loss the Gaussian NLL averaged over members
  and rows; AdamW (lr 1e-3, decoupled weight decay 1e-4 on every parameter), batch 128, each member its
  own shuffle per epoch, the last partial batch trained; 20 % holdout; a member's snapshot is taken
  when its holdout NLL drops by more than 0.001 (absolute) below its best, training stops after 5
  epochs without any member improving (at most 500); the ``elites`` (100) members with the lowest
  holdout NLL are the posterior;
* rollouts (``BanditCollector``, ``LearnedBanditEnv``): ``parallel`` (100) episodes at a time from
  t = 0, rollout n B + b playing elite n (B = parallel / elites), U = the population std over the
  elites of mu(a) for the pulled arm, the TD reward mu + eps sigma - penalty U (penalty not
  normalised) while the next input carries the unpenalised mu + eps sigma; epsilon-greedy with epsilon
  going linearly from 1.0 to 0.1 over the first 10 % of the updates;
* the agent (``RecurrentQNetwork``, ``QHead``): `RecurrentEncoder` (Block(4 -> d_model), 2 LRU
  layers), 2 Blocks of ``head_hidden``, value and advantage layers U(+-sqrt(0.01/fan_in)) with zero
  bias, Q = V + A - mean(A);
* the loss (``ddqn_loss``) on a tape of ``tape_length`` (1000) rows, whole episodes drawn uniformly
  from the buffer and concatenated, zero initial state: Huber (delta 1) of Q(h_k, a_k) - (r_k +
  gamma Q_target(h_{k+1}, argmax_a Q(h_{k+1}, a))), averaged over the rows with mask 1 - start_{k+1};
  each episode's final row (after the last pull) is an input only, as the official collector's dummy
  row; the target network is the online one at init, Polyak tau 0.005;
* optimisers: the encoder and the head are two parameter groups, each with NaN gradients zeroed and
  its own gradient norm clipped to ``grad_clip`` (1.0) (the library's `mbrl_offline.utils.clean_and_clip`,
  as NEUBAY's agent), Adam without weight decay (eps 1e-8) at a
  constant rate (encoder 3e-6, head 1e-4); ``utd`` 0.02 updates per collected transition, i.e. 200
  updates after each collection of 100 x 100 pulls, ``updates`` (20,000) in all;
* evaluation (``BanditEvaluator``): greedy, ``eval_episodes`` (20) episodes per p1, the mean reward
  per pull (return / T) and the best-arm rate (the share of pulls of arm 1 if p1 > 0.5, else of arm 0).

Deviations from the official code, each with its reason:

* the sizes: `BanditConfig`'s defaults are CPU sizes, chosen for a 2-core CPU (width 64/32 instead
  of 256/128, 5,000 updates instead of 20,000 on 303-row tapes instead of 1000, learning rates
  1e-3/3e-3 instead of 3e-6/1e-4, the target network's tau 0.05 instead of 0.005, epsilon annealed
  over 30 % of the updates instead of 10 %; docs/bandit.md has the runs that chose them);
  `BanditConfig.paper()` has the official sizes;
* a tape of whole episodes runs through the networks as a batch of episodes, its rows concatenated
  and cut after (`RecurrentDQN.loss`): the values of the official single pass, with a shorter scan;
* the data are drawn afresh from the seed (the official code ships one dataset, ``bandit.pkl``), and
  the holdout split is a seeded torch permutation (sklearn's ``train_test_split(random_state=42)``
  there);
* the official loop runs until the update count exceeds ``grad_steps`` (20,200 updates); here it stops
  at ``updates``;
* the buffer keeps whole episodes (all episodes have the same length), first in first out, up to
  ``buffer_rows`` rows; the official ring buffer of rows may overwrite the start of its oldest episode;
* the official elites are ordered by holdout NLL, here by index: rollout n still plays one elite for
  its whole episode and every elite is played equally often.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Optional

import torch
from torch import nn
from torch.nn import functional as F

from mbrl_offline.config import require_above_zero, require_fraction, require_nonnegative, require_positive
from mbrl_offline.errors import ConfigError, InputError
from mbrl_offline.models.ensemble import EnsembleLayerNorm, EnsembleLinear
from mbrl_offline.models.fitting import fit_ensemble, select_elites, split_holdout
from mbrl_offline.models.recurrent import Block, RecurrentEncoder
from mbrl_offline.utils import adam_kernel, clean_and_clip, progress_bar

EVAL_PROBS = (0.01, 0.15, 0.3, 0.45, 0.55, 0.7, 0.85, 0.99)
ARMS = 2
INPUT_DIM = 1 + ARMS + 1  # [dummy observation 0, one_hot(previous action), previous reward]


@dataclass
class BanditConfig:
    """The bandit experiment. Defaults: CPU sizes (for 2 cores); `paper` gives the official ones."""

    # the problem
    known_p: float = 0.5  # payout probability of arm 0, the arm in the data (and of arm 1 in the data's bandit)
    horizon: int = 100  # pulls per episode
    data_episodes: int = 10  # episodes of the offline data (always arm 0)
    eval_probs: tuple = EVAL_PROBS  # arm 1's payout probabilities of the test bandits
    eval_episodes: int = 20  # greedy episodes per test bandit
    evaluations: int = 10  # evaluations during training, evenly spaced (official: 100), plus one before it
    # the reward ensemble (the posterior)
    ensemble_size: int = 128  # members trained together
    elites: int = 100  # members with the lowest holdout NLL kept as the posterior
    model_hidden: int = 16  # width of each member's 2 hidden layers
    model_lr: float = 1e-3  # AdamW
    model_weight_decay: float = 1e-4  # AdamW's decoupled weight decay, on every parameter
    model_batch_size: int = 128  # rows per member and step
    model_max_epochs: int = 500
    model_patience: int = 5  # epochs without any member improving before stopping
    model_improvement: float = 0.001  # a member improves when its holdout NLL drops by more than this (absolute)
    holdout_ratio: float = 0.2
    # the agent
    d_model: int = 64  # LRU encoder width (official 256)
    d_hidden: int = 32  # LRU complex states per layer (official 128)
    encoder_layers: int = 2
    r_min: float = 0.0  # LRU eigenvalue radii at init
    r_max: float = 0.9
    head_hidden: int = 64  # width of the Q head's 2 Blocks (official 256)
    head_layers: int = 2
    gamma: float = 0.99
    tau: float = 0.05  # Polyak rate of the target network (official 0.005: too slow a value propagation here)
    encoder_lr: float = 1e-3  # Adam, constant (official 3e-6, tuned at width 256 for 20,000 updates)
    head_lr: float = 3e-3  # (official 1e-4)
    grad_clip: float = 1.0  # gradient norm of each parameter group (encoder, head)
    adam_eps: float = 1e-8
    # training
    updates: int = 5000  # gradient steps in all (official 20,000)
    tape_length: int = 303  # rows of one update's tape, whole episodes concatenated, cut (official 1000)
    buffer_rows: int = 1_000_000  # rollout rows kept (whole episodes, first in first out)
    parallel: int = 100  # rollouts per collection, a multiple of elites
    utd: float = 0.02  # updates per collected transition: ceil(utd x parallel x horizon) after each collection
    eps_start: float = 1.0  # epsilon-greedy exploration in the rollouts,
    eps_end: float = 0.1  # annealed linearly
    eps_fraction: float = 0.3  # over this fraction of the updates (official 0.1)

    @classmethod
    def paper(cls, **overrides) -> "BanditConfig":
        """The official sizes (``configs/offline_bandit.yaml``)."""
        official = dict(d_model=256, d_hidden=128, head_hidden=256, encoder_lr=3e-6, head_lr=1e-4, updates=20_000,
                        evaluations=100, tau=0.005, tape_length=1000, eps_fraction=0.1)
        return cls(**{**official, **overrides})

    def validate(self, section: str = "bandit") -> "BanditConfig":
        """Every setting checked, the first bad one refused in one line (`ConfigError`)."""
        require_positive(self, "horizon", "data_episodes", "eval_episodes", "evaluations", "ensemble_size", "elites",
                         "model_hidden", "model_batch_size", "model_max_epochs", "model_patience", "d_model",
                         "d_hidden", "encoder_layers", "head_hidden", "head_layers", "updates", "tape_length",
                         "buffer_rows", "parallel", section=section)
        require_fraction(self, "known_p", "holdout_ratio", "gamma", "tau", "eps_start", "eps_end", section=section)
        require_above_zero(self, "model_lr", "encoder_lr", "head_lr", "grad_clip", "adam_eps", "utd", "eps_fraction",
                           section=section)
        require_nonnegative(self, "model_weight_decay", "model_improvement", "r_min", section=section)
        if not 0.0 <= self.r_min < self.r_max <= 1.0:
            raise ConfigError(f"{section}.r_min and {section}.r_max need 0 <= r_min < r_max <= 1, got {self.r_min} "
                              f"and {self.r_max}.")
        if self.elites > self.ensemble_size:
            raise ConfigError(f"{section}.elites = {self.elites} cannot exceed {section}.ensemble_size = "
                              f"{self.ensemble_size}.")
        if self.parallel % self.elites:
            raise ConfigError(f"{section}.parallel = {self.parallel} must be a multiple of {section}.elites = "
                              f"{self.elites} (each elite plays the same number of rollouts).")
        if self.buffer_rows < self.horizon + 1:
            raise ConfigError(f"{section}.buffer_rows = {self.buffer_rows} must hold one episode "
                              f"({self.horizon + 1} rows).")
        probs = tuple(self.eval_probs)
        if not probs or any(isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0
                            for p in probs):
            raise ConfigError(f"{section}.eval_probs = {list(probs)} must be a non-empty list of probabilities.")
        return self


# ----------------------------------------------------------------------------------------------- the bandit
class BanditEnv:
    """Bernoulli bandits played in parallel: ``probs (n, arms)``, row i the payout probabilities of bandit i.
    `step` pulls one arm of each and returns rewards 1 or 0 ``(n,)``."""

    def __init__(self, probs: torch.Tensor):
        probs = torch.as_tensor(probs, dtype=torch.float32)
        if probs.dim() != 2 or probs.shape[1] < 2 or not bool(((probs >= 0) & (probs <= 1)).all()):
            raise InputError(f"BanditEnv: probs must be (bandits, arms >= 2) probabilities, got shape "
                             f"{tuple(probs.shape)}.")
        self.probs = probs
        self.arms = probs.shape[1]

    def __len__(self) -> int:
        return self.probs.shape[0]

    def step(self, actions: torch.Tensor, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        p = self.probs.to(actions.device).gather(1, actions.long()[:, None]).squeeze(1)
        return (torch.rand(p.shape, generator=generator, device=p.device) < p).float()


def agent_inputs(actions: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
    """The agent's inputs ``[0, one_hot(a), r]`` ``(..., 4)`` after pulling ``actions`` and receiving ``rewards``."""
    onehot = F.one_hot(actions.long(), ARMS).float()
    return torch.cat([torch.zeros_like(rewards)[..., None], onehot, rewards[..., None]], dim=-1)


def first_inputs(n: int, device=None) -> torch.Tensor:
    """The inputs before the first pull: ``[0, one_hot(0), 0]`` (the official wrapper's null action is arm 0)."""
    return agent_inputs(torch.zeros(n, dtype=torch.long, device=device), torch.zeros(n, device=device))


def bandit_data(config: BanditConfig, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The offline data: ``data_episodes`` x ``horizon`` pulls of arm 0 of a bandit paying ``known_p`` on
    both arms: ``(actions (rows,) long, rewards (rows,))``."""
    env = BanditEnv(torch.full((config.data_episodes, ARMS), config.known_p))
    actions = torch.zeros(config.data_episodes, dtype=torch.long)
    rewards = torch.stack([env.step(actions, generator) for _ in range(config.horizon)], dim=1)
    return torch.zeros(rewards.numel(), dtype=torch.long), rewards.reshape(-1)


# --------------------------------------------------------------------------------------- the reward ensemble
def soft_clamp(x: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """PETS' differentiable clamp (official ``modules.soft_clamp``): below ``high``, then above ``low``."""
    x = high - F.softplus(high - x)
    return low + F.softplus(x - low)


class RewardEnsemble(nn.Module):
    """``members`` Gaussian reward models of one-hot actions, one batched matmul per layer:
    ``forward(x (B, arms) | (N, B, arms), members=None) -> (mean (N, B), log_std (N, B))``."""

    LOG_STD_MIN, LOG_STD_MAX = -5.0, 0.25

    def __init__(self, members: int, arms: int = ARMS, hidden: int = 16, layers: int = 2):
        super().__init__()
        self.members = members
        widths = [arms] + [hidden] * layers
        self.linears = nn.ModuleList(EnsembleLinear(i, o, members) for i, o in zip(widths[:-1], widths[1:]))
        self.norms = nn.ModuleList(EnsembleLayerNorm(hidden, members) for _ in range(layers))
        self.out = EnsembleLinear(hidden, 2, members)  # mu and log sigma: two Linear(hidden, 1) as one

    def forward(self, x: torch.Tensor, members: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        for linear, norm in zip(self.linears, self.norms):
            x = F.leaky_relu(norm(linear(x, members), members), 0.01)
        out = self.out(x, members)
        return out[..., 0], soft_clamp(out[..., 1], self.LOG_STD_MIN, self.LOG_STD_MAX)

    @staticmethod
    def nll(mean: torch.Tensor, log_std: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The Gaussian negative log-likelihood of ``y`` elementwise."""
        return 0.5 * math.log(2 * math.pi) + log_std + 0.5 * ((y - mean) * torch.exp(-log_std)) ** 2

    @torch.no_grad()
    def holdout_mse(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Each member's mean holdout NLL ``(members,)`` (named for `fit_ensemble`'s protocol: the bandit's
        early stopping and elites use the NLL, as the official code does)."""
        mean, log_std = self(x)
        return self.nll(mean, log_std, y).mean(1)

    def copy_members(self, state: dict, members: torch.Tensor) -> None:
        """Copy the current parameters of the members in the bool mask ``members`` into ``state``."""
        for name, value in self.named_parameters():
            state[name][members] = value[members].detach()


def fit_reward_ensemble(actions: torch.Tensor, rewards: torch.Tensor, config: BanditConfig,
                        generator: torch.Generator, progress: bool = False) -> tuple[RewardEnsemble, torch.Tensor, list]:
    """Fit `RewardEnsemble` to the data (module docstring): ``(model, elites (elites,) long, epoch log)``.
    The model's parameters are drawn from torch's global generator, the holdout and batches from
    ``generator``."""
    x = F.one_hot(actions.long(), ARMS).float()
    y = rewards.float()
    model = RewardEnsemble(config.ensemble_size, ARMS, config.model_hidden)
    fit = SimpleNamespace(batch_size=config.model_batch_size, bootstrap="none", ensemble_size=config.ensemble_size,
                          max_epochs=config.model_max_epochs, min_epochs=0, patience=config.model_patience,
                          improvement_threshold=config.model_improvement, improvement="absolute", drop_last=False)
    train, holdout = split_holdout(len(x), config.holdout_ratio, None, 1, generator, x.device)
    train_x, train_y = x[train], y[train]
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.model_lr, weight_decay=config.model_weight_decay,
                                  **adam_kernel())

    def train_batch(rows: torch.Tensor) -> torch.Tensor:  # rows (members, batch): member i trains on rows[i]
        mean, log_std = model(train_x[rows])
        loss = model.nll(mean, log_std, train_y[rows]).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.detach()

    log, best_nll = fit_ensemble(model, (train_x, train_y), (x[holdout], y[holdout]), fit, train_batch, optimizer,
                                 generator, progress, desc="reward ensemble")
    model.eval()
    return model, select_elites(best_nll, config.elites), log


class LearnedBandit:
    """The posterior as a batch of simulated bandits (official ``LearnedBanditEnv``): rollout ``n B + b``
    of ``parallel`` plays elite ``n`` (B = parallel / elites). `step` returns the rewards ``mu + eps sigma``
    of each rollout's member and the penalised ``mu + eps sigma - penalty U``, U the population std over
    the elites of mu for the pulled arm."""

    def __init__(self, model: RewardEnsemble, elites: torch.Tensor, penalty: float, parallel: int):
        if parallel % len(elites):
            raise InputError(f"LearnedBandit: parallel = {parallel} must be a multiple of the {len(elites)} elites.")
        self.model, self.elites, self.penalty, self.parallel = model, elites, float(penalty), parallel
        self.member = torch.arange(parallel, device=elites.device) // (parallel // len(elites))  # index into elites

    @torch.no_grad()
    def uncertainty(self, actions: torch.Tensor) -> torch.Tensor:
        """U ``(P,)``: the std over the elites of their mean reward for ``actions``."""
        mean, _ = self.model(F.one_hot(actions.long(), ARMS).float(), self.elites)
        return mean.std(0, unbiased=False)

    @torch.no_grad()
    def step(self, actions: torch.Tensor, generator: Optional[torch.Generator] = None):
        """``actions (P,)`` -> ``(raw rewards (P,), penalised rewards (P,))``."""
        mean, log_std = self.model(F.one_hot(actions.long(), ARMS).float(), self.elites)  # (E, P): every elite, every row
        rows = torch.arange(len(actions), device=actions.device)
        mu, sigma = mean[self.member, rows], torch.exp(log_std[self.member, rows])
        raw = mu + torch.randn(mu.shape, generator=generator, device=mu.device) * sigma
        return raw, raw - self.penalty * mean.std(0, unbiased=False)


# -------------------------------------------------------------------------------------------------- the agent
class QNetwork(nn.Module):
    """NEUBAY's recurrent Q network for discrete actions (official ``RecurrentQNetwork`` + ``QHead``):
    `RecurrentEncoder` -> ``head_layers`` Blocks -> dueling value/advantage layers.
    ``forward(x (B, T, in) | (T, in), starts, state=None) -> (q (..., T, actions), state)``."""

    def __init__(self, in_dim: int, actions: int, config: BanditConfig):
        super().__init__()
        self.encoder = RecurrentEncoder(in_dim, "lru", config.d_model, config.d_hidden, config.encoder_layers,
                                        config.r_min, config.r_max)
        widths = [config.d_model] + [config.head_hidden] * config.head_layers
        self.blocks = nn.Sequential(*[Block(i, o) for i, o in zip(widths[:-1], widths[1:])])
        self.value = nn.Linear(widths[-1], 1)
        self.advantage = nn.Linear(widths[-1], actions)
        with torch.no_grad():  # official final_linear: U(+-sqrt(0.01 / fan_in)), zero bias
            bound = math.sqrt(0.01 / widths[-1])
            for layer in (self.value, self.advantage):
                layer.weight.uniform_(-bound, bound)
                layer.bias.zero_()

    def forward(self, x: torch.Tensor, starts: torch.Tensor, state=None):
        y, state = self.encoder(x, starts, state)
        h = self.blocks(y)
        advantage = self.advantage(h)
        return self.value(h) + advantage - advantage.mean(-1, keepdim=True), state

    def encoder_parameters(self) -> list[nn.Parameter]:
        return list(self.encoder.parameters())

    def head_parameters(self) -> list[nn.Parameter]:
        return [p for name, p in self.named_parameters() if not name.startswith("encoder.")]


class RecurrentDQN:
    """Dueling double DQN on tapes with NEUBAY's recurrent encoder (official ``ddqn_loss``/``ddqn_update``)."""

    def __init__(self, config: BanditConfig, device="cpu"):
        self.config = config
        self.q = QNetwork(INPUT_DIM, ARMS, config).to(device)
        self.target = copy.deepcopy(self.q).requires_grad_(False)
        self.groups = [self.q.encoder_parameters(), self.q.head_parameters()]
        self.optimizer = torch.optim.Adam([{"params": self.groups[0], "lr": config.encoder_lr},
                                           {"params": self.groups[1], "lr": config.head_lr}], eps=config.adam_eps,
                                          **adam_kernel())

    def loss(self, tape: dict) -> tuple[torch.Tensor, dict]:
        """The masked Huber TD loss on one tape: ``observations (T, in)``, ``actions (T,)``, ``rewards (T,)``
        (the reward of row k's pull), ``terminals (T,)``, ``starts (T,)``. The fields may also come as
        whole episodes ``(n, L, ...)`` with the tape's ``length`` (`EpisodeBuffer.tape`): the networks then
        run over the n episodes as a batch and the rows are concatenated and cut to ``length`` after,
        which gives the values of one pass over the tape (the state is dropped at every start, and no row
        depends on later ones) with a shorter scan."""
        starts = tape["starts"]
        q, _ = self.q(tape["observations"], starts)  # (T, A) or (n, L, A)
        with torch.no_grad():
            target_q, _ = self.target(tape["observations"], starts)
        length = tape.get("length", starts.numel())
        q, target_q = q.reshape(-1, ARMS)[:length], target_q.reshape(-1, ARMS)[:length]
        starts, actions, rewards, terminals = (tape[k].reshape(-1)[:length]
                                               for k in ("starts", "actions", "rewards", "terminals"))
        selected = q.gather(1, actions.long()[:, None]).squeeze(1)[:-1]
        with torch.no_grad():
            next_actions = q.argmax(-1)  # double DQN: the online network picks, the target evaluates
            next_q = target_q.gather(1, next_actions[:, None]).squeeze(1)[1:]
            target = rewards[:-1] + (1.0 - terminals[:-1].float()) * self.config.gamma * next_q
        mask = 1.0 - starts[1:].float()  # the pair (an episode's last row, the next one's first) is no transition
        errors = F.huber_loss(selected, target, reduction="none", delta=1.0)
        denominator = mask.sum()
        loss = (errors * mask).sum() / denominator
        return loss, {"q_mean": (selected.detach() * mask).sum() / denominator,
                      "target_mean": (target * mask).sum() / denominator}

    def update(self, tape: dict) -> dict:
        loss, info = self.loss(tape)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        norms = [clean_and_clip([p.grad for p in group if p.grad is not None], self.config.grad_clip)
                 for group in self.groups]
        self.optimizer.step()
        with torch.no_grad():
            online, target = list(self.q.parameters()), list(self.target.parameters())
            torch._foreach_lerp_(target, online, self.config.tau)
        return {"loss": loss.detach(), **info, "encoder_grad_norm": norms[0], "head_grad_norm": norms[1]}

    @torch.no_grad()
    def act(self, inputs: torch.Tensor, starts: torch.Tensor, state, epsilon: float = 0.0,
            generator: Optional[torch.Generator] = None):
        """One step of ``n`` episodes: ``inputs (n, in)``, ``starts (n,)`` -> ``(actions (n,), state)``;
        epsilon-greedy (greedy at 0)."""
        q, state = self.q(inputs[:, None], starts[:, None], state)
        actions = q[:, 0].argmax(-1)
        if epsilon > 0:
            explore = torch.rand(actions.shape, generator=generator, device=actions.device) < epsilon
            random_actions = torch.randint(0, ARMS, actions.shape, generator=generator, device=actions.device)
            actions = torch.where(explore, random_actions, actions)
        return actions, state


# --------------------------------------------------------------------------------------- rollouts and tapes
@torch.no_grad()
def play(agent: RecurrentDQN, env, episodes: int, horizon: int, epsilon: float = 0.0,
         generator: Optional[torch.Generator] = None) -> dict:
    """``episodes`` episodes of ``horizon`` pulls played by ``agent`` in ``env`` (a `BanditEnv`, or a
    `LearnedBandit`, whose TD rewards are the penalised ones), all in parallel: ``observations (n, H + 1, in)``,
    ``actions (n, H + 1)``, ``rewards (n, H + 1)`` (row H, after the last pull, is an input only: its
    action and reward repeat row H - 1's, as the official collector's dummy row), ``raw_rewards (n, H)``."""
    device = next(agent.q.parameters()).device
    inputs = first_inputs(episodes, device)
    starts = torch.ones(episodes, dtype=torch.bool, device=device)
    state = agent.q.encoder.initial_state(episodes)
    observations, actions, rewards, raw_rewards = [inputs], [], [], []
    for _ in range(horizon):
        action, state = agent.act(inputs, starts, state, epsilon, generator)
        if isinstance(env, LearnedBandit):
            raw, reward = env.step(action, generator)
        else:
            raw = reward = env.step(action, generator)
        inputs = agent_inputs(action, raw)  # the next input carries the unpenalised reward
        starts = torch.zeros_like(starts)
        observations.append(inputs)
        actions.append(action)
        rewards.append(reward)
        raw_rewards.append(raw)
    actions.append(actions[-1])
    rewards.append(rewards[-1])
    return {"observations": torch.stack(observations, 1), "actions": torch.stack(actions, 1),
            "rewards": torch.stack(rewards, 1), "raw_rewards": torch.stack(raw_rewards, 1)}


class EpisodeBuffer:
    """Whole episodes of one length, first in first out; `tape` concatenates episodes drawn uniformly
    (with replacement) and cuts the result to the tape's length (official ``TapeBuffer.sample``)."""

    def __init__(self, capacity_rows: int, episode_rows: int, in_dim: int, device="cpu"):
        self.capacity = max(1, capacity_rows // episode_rows)
        self.rows = episode_rows
        self.observations = torch.zeros(self.capacity, episode_rows, in_dim, device=device)
        self.actions = torch.zeros(self.capacity, episode_rows, dtype=torch.long, device=device)
        self.rewards = torch.zeros(self.capacity, episode_rows, device=device)
        self.size, self.next = 0, 0

    def add(self, observations: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor) -> None:
        for i in range(0, len(observations), self.capacity):  # more episodes than fit: the last ones stay
            part = slice(i, i + self.capacity)
            n = len(observations[part])
            slots = (self.next + torch.arange(n)) % self.capacity
            self.observations[slots] = observations[part]
            self.actions[slots] = actions[part]
            self.rewards[slots] = rewards[part]
            self.next = (self.next + n) % self.capacity
            self.size = min(self.size + n, self.capacity)

    def tape(self, length: int, generator: Optional[torch.Generator] = None, episodes: bool = True) -> dict:
        """A tape of ``length`` rows. With ``episodes`` (for `RecurrentDQN.loss`) the fields stay whole
        episodes ``(n, L, ...)``, ``n = ceil(length / L)``, with ``length``; else they are ``(length, ...)``."""
        count = -(-length // self.rows)
        ids = torch.randint(0, self.size, (count,), generator=generator).to(self.observations.device)
        starts = torch.zeros(count, self.rows, dtype=torch.bool, device=self.observations.device)
        starts[:, 0] = True
        tape = {"observations": self.observations[ids], "actions": self.actions[ids], "rewards": self.rewards[ids],
                "starts": starts, "terminals": torch.zeros_like(starts)}  # the bandit never terminates
        if episodes:
            return {**tape, "length": length}
        return {k: v.flatten(0, 1)[:length] for k, v in tape.items()}


# ------------------------------------------------------------------------------------ training and evaluation
@torch.no_grad()
def evaluate(agent: RecurrentDQN, config: BanditConfig, generator: Optional[torch.Generator] = None) -> dict:
    """Greedy play on the test bandits ``[known_p, p1]``, ``eval_episodes`` each, all in parallel:
    ``{"return": (P1,) mean reward per pull, "best_arm": (P1,) share of pulls of the better arm}``."""
    probs = torch.tensor([[config.known_p, p] for p in config.eval_probs for _ in range(config.eval_episodes)])
    played = play(agent, BanditEnv(probs), len(probs), config.horizon, 0.0, generator)
    shape = (len(config.eval_probs), config.eval_episodes * config.horizon)
    best = (torch.tensor(config.eval_probs) > config.known_p).long().to(played["actions"].device)
    pulls = played["actions"][:, :-1].reshape(shape)
    return {"return": played["raw_rewards"].reshape(shape).mean(1).cpu(),
            "best_arm": (pulls == best[:, None]).float().mean(1).cpu()}


def train_agent(posterior_model: RewardEnsemble, elites: torch.Tensor, penalty: float, config: BanditConfig,
                seed: int = 0, device="cpu", progress: bool = False,
                on_evaluation: Optional[Callable[[dict], None]] = None) -> tuple[RecurrentDQN, list[dict]]:
    """Train a `RecurrentDQN` in rollouts of the posterior with ``penalty`` (module docstring); returns the
    agent and its evaluations ``[{"updates", "return" (P1,), "best_arm" (P1,), "rollout_return", ...}]``,
    one before training and ``evaluations`` evenly spaced after (official: before each collection once
    the update count passes the next multiple of ``updates / evaluations``)."""
    torch.manual_seed(seed)
    agent = RecurrentDQN(config, device)
    env = LearnedBandit(posterior_model.to(device), elites.to(device), penalty, config.parallel)
    buffer = EpisodeBuffer(config.buffer_rows, config.horizon + 1, INPUT_DIM, device)
    rng = torch.Generator(device=device).manual_seed(seed)
    tape_rng = torch.Generator().manual_seed(seed + 1)
    eval_rng = torch.Generator(device=device).manual_seed(seed + 1000)  # official eval seed: seed + 1000
    every = max(1, config.updates // config.evaluations)
    history: list[dict] = []
    updates, evaluated, stats, rollout_return = 0, -1, {}, float("nan")
    per_collection = math.ceil(config.utd * config.parallel * config.horizon)
    bar = progress_bar(total=config.updates, desc=f"penalty {penalty:g}", disable=not progress)
    start = time.perf_counter()
    while True:
        if updates // every > evaluated or updates >= config.updates:
            evaluated = updates // every
            result = {"updates": updates, **evaluate(agent, config, eval_rng), "rollout_return": rollout_return,
                      "seconds": time.perf_counter() - start, **{k: float(v) for k, v in stats.items()}}
            history.append(result)
            if on_evaluation is not None:
                on_evaluation(result)
        if updates >= config.updates:
            break
        progress_now = min(updates / (config.updates * config.eps_fraction), 1.0)
        epsilon = config.eps_start + (config.eps_end - config.eps_start) * progress_now
        played = play(agent, env, config.parallel, config.horizon, epsilon, rng)
        buffer.add(played["observations"], played["actions"], played["rewards"])
        rollout_return = played["rewards"][:, :-1].sum(1).mean().item() / config.horizon
        for _ in range(min(per_collection, config.updates - updates)):
            stats = agent.update(buffer.tape(config.tape_length, tape_rng))
            updates += 1
            bar.update(1)
    bar.close()
    return agent, history


def run_bandit(config: BanditConfig, penalties, seed: int = 0, device="cpu", progress: bool = False,
               log: Callable[[str], None] = lambda line: None) -> dict:
    """The experiment: the data and the reward ensemble from ``seed``, then one agent per penalty, each
    trained from ``seed`` on the same posterior. Returns ``{"config", "penalties", "ensemble": {...},
    "runs": {penalty: history}}`` (`train_agent`'s histories; the last entry is the final evaluation)."""
    config.validate()
    device = torch.device(device)
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    actions, rewards = bandit_data(config, generator)
    start = time.perf_counter()
    model, elites, fit_log = fit_reward_ensemble(actions, rewards, config, generator, progress)
    with torch.no_grad():
        mean, _ = model(torch.eye(ARMS), elites)
    ensemble = {"epochs": len(fit_log), "seconds": time.perf_counter() - start, "data_mean": rewards.mean().item(),
                "mean_by_arm": mean.mean(0).tolist(),
                "std_by_arm": mean.std(0, unbiased=False).tolist()}
    log(f"data: {len(actions)} pulls of arm 0, mean reward {ensemble['data_mean']:.3f}; reward ensemble: "
        f"{config.ensemble_size} members, {ensemble['epochs']} epochs ({ensemble['seconds']:.1f} s), {config.elites} "
        f"elites: mu(arm 0) = {ensemble['mean_by_arm'][0]:.3f} +- {ensemble['std_by_arm'][0]:.3f}, "
        f"mu(arm 1) = {ensemble['mean_by_arm'][1]:.3f} +- {ensemble['std_by_arm'][1]:.3f}")
    runs = {}
    for penalty in penalties:
        def report(result, penalty=penalty):
            log(f"penalty {penalty:g}, {result['updates']} updates ({result['seconds']:.0f} s): return/T "
                + " ".join(f"{r:.2f}" for r in result["return"].tolist())
                + f"; rollout return/T {result['rollout_return']:.3f}, Q {result.get('q_mean', float('nan')):.2f}")

        _, runs[float(penalty)] = train_agent(model, elites, float(penalty), config, seed, device, progress, report)
    return {"config": dataclasses.asdict(config), "penalties": [float(p) for p in penalties], "ensemble": ensemble,
            "runs": runs}


# ------------------------------------------------------------------------------------------------- reporting
def results_table(results: dict) -> str:
    """A markdown table of the final evaluation: one row per penalty, return/T and (in parentheses) the
    best-arm rate per test bandit p1."""
    probs = results["config"]["eval_probs"]
    head = ["penalty", *[f"p1={p:g}" for p in probs]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for penalty, history in results["runs"].items():
        final = history[-1]
        cells = [f"{penalty:g}", *[f"{r:.3f} ({b:.2f})" for r, b in zip(final["return"].tolist(),
                                                                        final["best_arm"].tolist())]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_results(results: dict, path, title: str = "") -> Path:
    """A PNG like the paper's Figure 3: one panel per test bandit p1, return/T against updates, one curve
    per penalty."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    probs = results["config"]["eval_probs"]
    cols = min(4, len(probs))
    rows = -(-len(probs) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.7 * rows), dpi=100, squeeze=False)
    for i, p in enumerate(probs):
        ax = axes[i // cols][i % cols]
        for penalty, history in results["runs"].items():
            ax.plot([h["updates"] for h in history], [h["return"][i].item() for h in history], label=f"{penalty:g}")
        ax.axhline(max(p, results["config"]["known_p"]), color="grey", lw=0.8, ls=":")
        ax.set_title(f"p1 = {p:g}", color="green" if p > results["config"]["known_p"] else "red", fontsize=10)
        ax.set_xlabel("updates", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(True, alpha=0.3)
        if i % cols == 0:
            ax.set_ylabel("return / T", fontsize=8)
    for j in range(len(probs), rows * cols):
        axes[j // cols][j % cols].axis("off")
    axes[0][0].legend(title="penalty", fontsize=7, title_fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    from mbrl_offline.utils import save_figure

    try:
        return save_figure(fig, Path(path))
    finally:
        plt.close(fig)
