"""Small fakes of the sequence side of the spine, for the trainer and contract tests: a recurrent agent
that learns from tapes (`FakeRecurrent`) and a generator of sequences (`FakeSequenceGenerator`), each a
few lines of honest maths, so the spine's wiring is tested before NEUBAY's real parts are registered.

`FakeRecurrent`'s policy is an Elman network over `history_inputs` rows (state reset at starts, one
tensor per layer, batch first), a Gaussian around tanh of its output; ``update`` regresses the rewards
on the encoder's features with the tape's per-row ``weights``. `FakeSequenceGenerator` copies a real
prefix of a dataset row, then rolls the policy out through made-up dynamics, returning whole episodes
concatenated with ``starts``, and counts its rows as ``transitions``.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Optional

import numpy as np
import torch

from mbrl_offline.buffer import MixingConfig
from mbrl_offline.config import require_positive
from mbrl_offline.data.envs import get_env_info
from mbrl_offline.policies import checked_observations, history_inputs
from mbrl_offline.roles import GeneratorConfig
from mbrl_offline.utils import adam_kernel


@dataclass
class FakeRecurrentConfig:
    batch_size: int = 24  # the tape's length
    hidden_size: int = 8
    lr: float = 1e-2

    def __post_init__(self):
        require_positive(self, "batch_size", "hidden_size", section="algo")


@dataclass
class FakeSequenceGeneratorConfig(GeneratorConfig):
    kind: str = "fake-sequences"
    every: int = 0
    utd: Optional[float] = 0.5  # None: the every schedule
    episodes: int = 3
    prefix: int = 2  # real rows before each rollout
    horizon: int = 5  # longest rollout (lengths are drawn 1..horizon)
    buffer_rows: int = 200
    mixing: MixingConfig = field(default_factory=lambda: MixingConfig(rule="tape", kappa=0.3))


class FakeRecurrent:
    name = "fake-recurrent"
    summary = "a tiny recurrent agent of sequences, for the contract tests"
    defaults_from = "the tests"
    consumes = "sequences"
    recurrent = True
    needs_dynamics = False
    divergence_metric = "q_mean"
    config_class = FakeRecurrentConfig

    def __init__(self, obs_dim, act_dim, action_low, action_high, config=FakeRecurrentConfig(), device="cpu"):
        self.obs_dim, self.act_dim, self.config, self.device = obs_dim, act_dim, config, torch.device(device)
        self.input_dim = obs_dim + act_dim + 1
        h = config.hidden_size
        self.net = torch.nn.ModuleDict({"inp": torch.nn.Linear(self.input_dim, h), "rec": torch.nn.Linear(h, h, bias=False),
                                        "act": torch.nn.Linear(h, act_dim), "rew": torch.nn.Linear(h, 1)}).to(self.device)
        self.optim = torch.optim.Adam(self.net.parameters(), lr=config.lr, **adam_kernel())
        self.low = torch.as_tensor(np.asarray(action_low), dtype=torch.float32, device=self.device)
        self.high = torch.as_tensor(np.asarray(action_high), dtype=torch.float32, device=self.device)
        self.updates = 0
        self.total_updates: list[int] = []  # set_total_updates calls
        self.episode_policies: list[bool] = []  # episode_policy calls (deterministic)

    # -------------------------------------------------------------------------- the recurrent policy
    @property
    def policy(self):
        return self

    def initial_state(self, batch_size: int) -> list[torch.Tensor]:
        return [torch.zeros(batch_size, self.config.hidden_size, device=self.device)]

    def encode(self, x: torch.Tensor, starts: Optional[torch.Tensor], state) -> tuple[torch.Tensor, list]:
        """Features ``(B, T, H)`` of inputs ``(B, T, D)``, state reset where ``starts`` ``(B, T)``."""
        b, t = x.shape[:2]
        h = (state or self.initial_state(b))[0]
        starts = torch.zeros(b, t, dtype=torch.bool, device=x.device) if starts is None else starts
        out = []
        for k in range(t):
            h = torch.where(starts[:, k, None], torch.zeros_like(h), h)
            h = torch.tanh(self.net["inp"](x[:, k]) + self.net["rec"](h))
            out.append(h)
        return torch.stack(out, 1), [h]

    def mean(self, features: torch.Tensor) -> torch.Tensor:
        centre, scale = (self.high + self.low) / 2, (self.high - self.low) / 2
        return centre + scale * torch.tanh(self.net["act"](features))

    def _steps(self, observations, starts):
        if observations.dim() == 2:  # one step
            return observations[:, None], None if starts is None else starts.to(torch.bool)[:, None]
        return observations, None if starts is None else starts.to(torch.bool)

    @torch.no_grad()
    def sample(self, observations, state=None, starts=None):
        x, s = self._steps(observations, starts)
        features, state = self.encode(x, s, state)
        mean = self.mean(features[:, -1])
        return torch.minimum(torch.maximum(mean + 0.1 * torch.randn_like(mean), self.low), self.high), state

    @torch.no_grad()
    def deterministic(self, observations, state=None, starts=None):
        x, s = self._steps(observations, starts)
        features, state = self.encode(x, s, state)
        return self.mean(features[:, -1]), state

    def log_prob(self, observations, actions, state=None, starts=None):
        x, s = self._steps(observations, starts)
        features, _ = self.encode(x, s, state)
        diff = (actions - self.mean(features[:, -1])) / 0.1
        return (-0.5 * diff.pow(2) - math.log(0.1) - 0.5 * math.log(2 * math.pi)).sum(-1)

    @torch.no_grad()
    def act(self, obs, deterministic=True):
        """An observation seen as an episode's first step (no history)."""
        obs_t = checked_observations(obs, self.obs_dim, self.device, f"{self.name}.act")
        one = obs_t.dim() == 1
        obs_t = obs_t.view(-1, self.obs_dim)
        n = obs_t.shape[0]
        x = history_inputs(obs_t, torch.zeros(n, self.act_dim, device=self.device), torch.zeros(n, device=self.device),
                           torch.ones(n, dtype=torch.bool, device=self.device))
        features, _ = self.encode(x[:, None], None, None)
        action = self.mean(features[:, -1]).cpu().numpy()
        return action[0] if one else action

    def episode_policy(self, deterministic: bool):
        self.episode_policies.append(deterministic)
        return FakeEpisodePolicy(self)

    def set_total_updates(self, total: int) -> None:
        self.total_updates.append(total)

    # -------------------------------------------------------------------------- learning from tapes
    @staticmethod
    def tape_inputs(tape) -> torch.Tensor:
        """x_k = [s_k, a_{k-1}, r_{k-1}] with zeros at starts (the contract's input building)."""
        previous = lambda v: torch.cat([torch.zeros_like(v[:1]), v[:-1]])  # noqa: E731
        return history_inputs(tape["observations"], previous(tape["actions"]), previous(tape["rewards"]), tape["starts"])

    def update(self, tape):
        x = self.tape_inputs(tape)
        features, _ = self.encode(x[None], tape["starts"][None], None)
        prediction = self.net["rew"](features[0]).squeeze(-1)
        loss = (tape["weights"] * (prediction - tape["rewards"]).pow(2)).sum()
        self.optim.zero_grad()
        loss.backward()
        self.optim.step()
        self.updates += 1
        return {"critic_loss": loss.detach(), "q_mean": prediction.detach().mean()}

    # -------------------------------------------------------------------------- state, construction
    def state_dict(self):
        return {"config": asdict(self.config), "net": self.net.state_dict(), "optim": self.optim.state_dict(),
                "updates": self.updates}

    def load_state_dict(self, state):
        self.net.load_state_dict(state["net"])
        self.optim.load_state_dict(state["optim"])
        self.updates = int(state["updates"])

    @classmethod
    def for_dataset(cls, dataset, config=None, device="cpu", **parts):
        env = get_env_info(dataset.env_name)
        low, high = env.action_bounds()
        return cls(env.obs_dim, env.act_dim, low, high, config or FakeRecurrentConfig(), device)

    @classmethod
    def published_generator(cls):
        return FakeSequenceGeneratorConfig()


class FakeEpisodePolicy:
    """The fake's episode policy: one state and previous action per episode, updated only for ``rows``."""

    def __init__(self, agent: FakeRecurrent):
        self.agent = agent

    def reset(self, episodes: int) -> None:
        self.state = self.agent.initial_state(episodes)
        self.previous = torch.zeros(episodes, self.agent.act_dim, device=self.agent.device)

    @torch.no_grad()
    def __call__(self, observations, rewards, starts, rows):
        agent, rows_t = self.agent, torch.as_tensor(rows, device=self.agent.device)
        x = history_inputs(torch.as_tensor(observations, dtype=torch.float32, device=agent.device), self.previous[rows_t],
                           torch.as_tensor(rewards, dtype=torch.float32, device=agent.device),
                           torch.as_tensor(starts, device=agent.device))
        features, (h,) = agent.encode(x[:, None], torch.as_tensor(starts, device=agent.device)[:, None],
                                      [self.state[0][rows_t]])
        self.state[0][rows_t] = h
        actions = agent.mean(features[:, -1])
        self.previous[rows_t] = actions
        return actions.cpu().numpy()


class FakeSequenceGenerator:
    model = None  # no fitted model
    config_class = FakeSequenceGeneratorConfig
    summary = "short random episodes, for the contract tests"
    produces = "sequences"
    recurrent_policy = True
    provides_dynamics = False

    def __init__(self, config: FakeSequenceGeneratorConfig, obs_dim: int, act_dim: int, device="cpu"):
        self.config, self.obs_dim, self.act_dim, self.device = config, obs_dim, act_dim, torch.device(device)
        self.generations = 0
        self.log: list[int] = []  # transitions of each generation

    @property
    def buffer_capacity(self) -> int:
        return self.config.buffer_rows

    @property
    def extra_fields(self) -> dict:
        return {"synthetic": ((), torch.bool), "member": ((), torch.long)}

    @torch.no_grad()
    def generate(self, policy, real, rng=None):
        cfg, episodes = self.config, []
        n_real = real["rewards"].shape[0]
        for _ in range(cfg.episodes):
            i = int(torch.randint(0, n_real - cfg.prefix, (1,), device=self.device, generator=rng))
            prefix = {k: real[k][i:i + cfg.prefix] for k in ("observations", "actions", "rewards", "next_observations",
                                                              "terminals", "timeouts")}
            starts = torch.arange(cfg.prefix, device=self.device) == 0
            x = history_inputs(prefix["observations"], torch.cat([torch.zeros_like(prefix["actions"][:1]),
                                                                 prefix["actions"][:-1]]),
                               torch.cat([torch.zeros_like(prefix["rewards"][:1]), prefix["rewards"][:-1]]), starts)
            _, state = policy.sample(x[None], policy.initial_state(1), starts[None])  # warm-up on the prefix
            obs, prev_a, prev_r = prefix["next_observations"][-1:], prefix["actions"][-1:], prefix["rewards"][-1:]
            length = int(torch.randint(1, cfg.horizon + 1, (1,), device=self.device, generator=rng))
            rows = {k: [v] for k, v in prefix.items()}
            for _ in range(length):
                action, state = policy.sample(history_inputs(obs, prev_a, prev_r, torch.zeros(1, dtype=torch.bool,
                                                                                             device=self.device)), state)
                next_obs = obs + 0.1 * action.mean(-1, keepdim=True)
                reward = -obs.pow(2).sum(-1)
                for key, value in zip(rows, (obs, action, reward, next_obs, torch.zeros(1, dtype=torch.bool),
                                             torch.zeros(1, dtype=torch.bool))):
                    rows[key].append(value.to(self.device))
                obs, prev_a, prev_r = next_obs, action, reward
            ep = {k: torch.cat(v) for k, v in rows.items()}
            ep["synthetic"] = torch.arange(cfg.prefix + length, device=self.device) >= cfg.prefix
            ep["member"] = torch.where(ep["synthetic"], 0, -1)
            ep["starts"] = torch.arange(cfg.prefix + length, device=self.device) == 0
            episodes.append(ep)
        out = {k: torch.cat([e[k] for e in episodes]) for k in episodes[0]}
        self.generations += 1
        self.log.append(int(out["rewards"].shape[0]))
        return out, {"transitions": float(out["rewards"].shape[0])}

    def state_dict(self):
        return {"generations": self.generations}

    def load_state_dict(self, state):
        self.generations = state["generations"]

    @classmethod
    def for_dataset(cls, config, dataset, device="cpu", cache_dir=None, model_path=None, progress=True):
        return cls(config, dataset.obs_dim, dataset.act_dim, device)
