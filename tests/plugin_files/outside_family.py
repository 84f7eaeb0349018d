"""An agent and a generator written outside the package, as a user would write them, for
``tests/test_plugins.py``: one module, registered by decorators, with nothing in ``mbrl_offline`` edited.

* ``outside-bc``: Gaussian behaviour cloning. A small MLP gives a mean and a state-independent
  log-std; ``update`` maximises the (per-row weighted) log-likelihood of the batch's actions, squashed
  into the env's bounds by a clamp. It has no value estimate, so no metric for the divergence guard.
* ``outside-jitter``: copies of real transitions with Gaussian noise on the states, ``rows`` per
  generation, a data augmentation (the policy is not read).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from mbrl_offline.algorithms.weights import batch_mean, row_weights
from mbrl_offline.buffer import MixingConfig
from mbrl_offline.config import check_field_types, require_positive
from mbrl_offline.errors import ConfigError
from mbrl_offline.policies import FeedForwardAgent
from mbrl_offline.registry import register_agent, register_generator
from mbrl_offline.roles import GeneratorConfig
from mbrl_offline.utils import adam_kernel


@dataclass
class JitterConfig(GeneratorConfig):
    kind: str = "outside-jitter"
    every: int = 50  # updates between generations
    rows: int = 256  # transitions per generation
    scale: float = 0.05  # the noise's standard deviation, in units of each state dimension's std
    mixing: MixingConfig = field(default_factory=lambda: MixingConfig(rule="fraction", real_ratio=0.5))

    def __post_init__(self):
        super().__post_init__()
        require_positive(self, "rows", section="generator")


@register_generator
class Jitter:
    """Real transitions with noisy states."""

    config_class = JitterConfig
    summary = "real transitions with Gaussian noise on the states (an outside plugin)"
    produces = "transitions"
    recurrent_policy = True  # the policy is not read
    provides_dynamics = False

    model = None  # no fitted model

    def __init__(self, config: JitterConfig, state_std: torch.Tensor):
        self.config, self.state_std, self.generations = config, state_std, 0

    @classmethod
    def for_dataset(cls, config, dataset, device="cpu", cache_dir=None, model_path=None, progress=True):
        if model_path is not None:
            raise ConfigError("generator=outside-jitter fits no model; leave dynamics_path unset.")
        return cls(config, torch.as_tensor(dataset.observations.std(0) + 1e-6, device=device))

    @property
    def buffer_capacity(self) -> int:
        return 4 * self.config.rows

    @property
    def extra_fields(self) -> dict:
        return {}

    def generate(self, policy, real, rng=None):
        n = real["observations"].shape[0]
        index = torch.randint(0, n, (self.config.rows,), generator=rng, device=real["observations"].device)
        rows = {k: real[k][index] for k in ("observations", "actions", "rewards", "next_observations", "terminals",
                                            "timeouts")}
        for key in ("observations", "next_observations"):
            noise = torch.randn(rows[key].shape, generator=rng, device=rows[key].device)
            rows[key] = rows[key] + self.config.scale * self.state_std * noise
        self.generations += 1
        return rows, {"transitions": float(self.config.rows)}

    def state_dict(self) -> dict:
        return {"generations": self.generations}

    def load_state_dict(self, state: dict) -> None:
        self.generations = int(state["generations"])


@dataclass
class BCConfig:
    batch_size: int = 256
    hidden_size: int = 64
    lr: float = 1e-3

    def __post_init__(self):
        check_field_types(self, "algo")
        require_positive(self, "batch_size", "hidden_size", section="algo")


@register_agent
class GaussianBC(FeedForwardAgent):
    name = "outside-bc"
    summary = "Gaussian behaviour cloning (an outside plugin)"
    defaults_from = "this test"
    config_class = BCConfig
    divergence_metric = None  # no value estimate

    @classmethod
    def published_generator(cls):
        return JitterConfig()

    def __init__(self, obs_dim, act_dim, action_low, action_high, config=BCConfig(), device="cpu"):
        self.obs_dim, self.act_dim, self.config, self.device = obs_dim, act_dim, config, torch.device(device)
        self.low = torch.as_tensor(np.asarray(action_low, np.float32), device=self.device)
        self.high = torch.as_tensor(np.asarray(action_high, np.float32), device=self.device)
        h = config.hidden_size
        self.net = torch.nn.Sequential(torch.nn.Linear(obs_dim, h), torch.nn.ReLU(), torch.nn.Linear(h, h),
                                       torch.nn.ReLU(), torch.nn.Linear(h, act_dim)).to(self.device)
        self.log_std = torch.zeros(act_dim, device=self.device, requires_grad=True)
        self.optim = torch.optim.Adam([*self.net.parameters(), self.log_std], lr=config.lr, **adam_kernel())

    def _log_prob(self, obs, actions):
        mean, std = self.net(obs), self.log_std.clamp(-5, 2).exp()
        return torch.distributions.Normal(mean, std).log_prob(actions).sum(-1)

    def sample(self, observations, state=None, starts=None):
        with torch.no_grad():
            mean = self.net(observations)
            actions = mean + self.log_std.clamp(-5, 2).exp() * torch.randn_like(mean)
        return torch.maximum(torch.minimum(actions, self.high), self.low), None

    def log_prob(self, observations, actions, state=None, starts=None):
        return self._log_prob(observations, actions)

    @torch.no_grad()
    def deterministic(self, observations, state=None, starts=None):
        return torch.maximum(torch.minimum(self.net(observations), self.high), self.low), None

    @torch.no_grad()
    def act(self, obs, deterministic=True):
        obs_t = self.act_input(obs)
        mean = self.net(obs_t)
        actions = mean if deterministic else mean + self.log_std.clamp(-5, 2).exp() * torch.randn_like(mean)
        return torch.maximum(torch.minimum(actions, self.high), self.low).cpu().numpy()

    def update(self, batch):
        loss = -batch_mean(self._log_prob(batch["observations"], batch["actions"]), row_weights(batch))
        self.optim.zero_grad(set_to_none=True)
        loss.backward()
        self.optim.step()
        return {"nll": loss.detach(), "std_mean": self.log_std.detach().exp().mean()}

    def state_dict(self) -> dict:
        return {"config": asdict(self.config), "net": self.net.state_dict(), "log_std": self.log_std.detach().clone(),
                "optim": self.optim.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.net.load_state_dict(state["net"])
        with torch.no_grad():
            self.log_std.copy_(state["log_std"])
        self.optim.load_state_dict(state["optim"])
