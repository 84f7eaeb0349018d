"""IQL: implicit Q-learning (Kostrikov, Nair & Levine, ICLR 2022), as in CORL's
``algorithms/offline/iql.py``, the reference both diffusion papers report with.

IQL never queries the critics at actions outside the data. Per update, with states normalised by the
dataset's mean and std (+ 1e-3), in CORL's order:

1. value:   u = min_j Qbar_j(s, a) - V(s),   L(V) = mean |tau_e - 1(u < 0)| u^2   (expectile tau_e);
2. critics: y = r + gamma (1 - terminal) V(s')  (V before step 1's update),
            L(Q) = mean_j mean (Q_j(s, a) - y)^2, then Polyak averaging of the target critics;
3. actor:   advantage-weighted regression with the advantage u of step 1:
            L(pi) = mean min(exp(beta u), 100) * (-log pi(a|s))        (Gaussian actor), or
            L(pi) = mean min(exp(beta u), 100) * |pi(s) - a|^2         (deterministic actor),
            the actor's learning rate cosine-annealed to 0 over the run.

Every mean over the batch's rows in the three losses becomes ``sum_b w_b (.)`` for a batch with
per-row loss weights ``weights`` (the ``weights`` mixing rule).

Defaults are CORL's for every locomotion dataset except three (presets ``mbrl_offline/configs/preset/iql-*.yaml``:
hopper-medium and hopper-medium-replay take a deterministic actor, reward normalisation and
tau = 0.001; hopper-medium-expert beta 6 and tau_e 0.5): tau_e 0.7, beta 3.0, gamma 0.99, tau 5e-3,
Adam at 3e-4 for V, critics and actor, batch 256, networks of 2 x 256 ReLU; the Gaussian actor has a
tanh on its mean and a state-independent log-std (a parameter, initially 0, clamped to [-20, 2]),
and acts with its mean. Reward normalisation scales rewards by 1000 / (max - min episode return of the
dataset). The paper's schedule is 1M updates.

Written with autograd, top to bottom: the reference style for new agents. Differences from CORL, none
of which changes the losses:

* the two critics are one `CriticEnsemble` of 2 members (one batched matmul per layer, initialised as
  CORL's ``nn.Linear`` stacks);
* the actor's learning rate follows the cosine once per epoch (torch's ``CosineAnnealingLR`` with
  ``T_max`` = the run's epochs, as the SAC agents here), where CORL steps it every update with
  ``T_max`` = the run's updates: with 1000 updates per epoch the rate lags CORL's by at most 1/1000
  of the schedule;
* the agent keeps the dataset's state statistics and reward scale (`IQL.for_dataset`, saved in its
  state) and applies them inside ``act`` and ``update``, where CORL wraps the env and rewrites the
  dataset, so data from any generator and the raw env work unchanged;
* the policy lives in the action space scaled to [-1, 1] (dataset actions are mapped there, actions
  mapped back to [low, high]). For the symmetric unit bounds of every MuJoCo task this is CORL's
  policy exactly; CORL's own code mixes the two scales when max_action is not 1.
"""
from __future__ import annotations

import copy
from dataclasses import asdict, dataclass
from typing import Optional

import numpy as np
import torch
from torch import nn

from mbrl_offline.algorithms import model_free
from mbrl_offline.algorithms.model_free import ObservationNormaliser, action_box, new_agent_for
from mbrl_offline.algorithms.weights import batch_mean, row_weights
from mbrl_offline.config import (check_field_types, config_argument, require_above_zero, require_in_range,
                                 require_nonnegative, require_positive)
from mbrl_offline.models.networks import CriticEnsemble, mlp
from mbrl_offline.policies import CriticValue, FeedForwardAgent
from mbrl_offline.utils import adam_kernel, anneal_cosine, soft_update
from mbrl_offline.registry import register_agent

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0  # CORL's clamp of the actor's log-std


@dataclass
class IQLConfig:
    # The value's expectile tau_e (0.5: the mean, larger: towards the max over the data's actions).
    expectile: float = 0.7
    # The actor's inverse temperature beta on the advantage, and the clip of exp(beta * advantage).
    beta: float = 3.0
    exp_adv_max: float = 100.0
    # A deterministic actor (regresses onto the weighted actions) instead of CORL's Gaussian one.
    deterministic_actor: bool = False
    actor_lr: float = 3e-4  # Adam; cosine-annealed to 0 over the run's epochs
    critic_lr: float = 3e-4  # Adam, constant (the twin Q-functions)
    value_lr: float = 3e-4  # Adam, constant (V)
    gamma: float = 0.99  # discount
    tau: float = 5e-3  # Polyak rate of the target critics
    hidden_size: int = 256  # width of every network's hidden layers
    hidden_layers: int = 2
    batch_size: int = 256  # transitions per update
    # Rewards times 1000 / (max - min episode return of the dataset) (CORL: per dataset, off by default).
    normalize_reward: bool = False
    # States are normalised with the dataset's mean and std + state_std_eps (CORL: on, 1e-3).
    normalize_states: bool = True
    state_std_eps: float = 1e-3

    def __post_init__(self):
        check_field_types(self, "algo")  # types first; nested mappings become configs
        require_positive(self, "batch_size", "hidden_size", "hidden_layers")
        require_in_range(self, "expectile", 0.0, 1.0, low_open=True, high_open=True, hint=" (CORL: 0.7)")
        require_nonnegative(self, "beta", "state_std_eps")
        require_above_zero(self, "exp_adv_max", "actor_lr", "critic_lr", "value_lr")
        require_in_range(self, "gamma", 0.0, 1.0, low_open=True, hint=" (the discount; usually 0.99)")
        require_in_range(self, "tau", 0.0, 1.0, low_open=True, hint=" (the target networks' Polyak rate; usually 5e-3)")


def expectile_loss(diff: torch.Tensor, expectile: float, weights: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``mean |tau - 1(diff < 0)| diff^2``: the asymmetric squared loss whose minimiser over a constant
    is the tau-expectile of ``diff``'s distribution; with per-row ``weights`` the weighted sum."""
    weight = torch.where(diff < 0, 1.0 - expectile, expectile)
    return batch_mean(weight * diff ** 2, weights)


@register_agent
class IQL(CriticValue, FeedForwardAgent):
    """An IQL agent: ``act(obs)``, ``update(batch) -> metrics``, ``state_dict()`` (module docstring).

    Model-free: published without a generator (every batch real), and takes any transition
    generator's data by configuration. Build it with `IQL.for_dataset`, which takes the state
    normalisation and the reward scale from the dataset."""

    name = "iql"
    # what it is, for the docs' tables
    summary = "expectile regression of V onto Q, advantage-weighted regression of the actor"
    defaults_from = "CORL's `iql.py`"  # the code its defaults come from
    config_class = IQLConfig
    published_generator = staticmethod(model_free.published_generator)

    @property
    def deterministic_policy(self) -> bool:
        """With ``deterministic_actor`` the policy has no distribution: online interaction adds noise."""
        return self.config.deterministic_actor

    def __init__(self, obs_dim: int, act_dim: int, action_low, action_high,
                 config: Optional[IQLConfig] = None, device: str | torch.device = "cpu"):
        config = config_argument(config, type(self).config_class, f"{type(self).__name__}'s config")
        self.config, self.device = config, torch.device(device)
        self.obs_dim, self.act_dim = obs_dim, act_dim
        _, _, self.action_centre, self.action_scale = action_box(action_low, action_high, self.device)
        # the identity until for_dataset (or a loaded state) sets the dataset's statistics
        self.normalise = ObservationNormaliser(obs_dim, self.device)
        self.reward_scale = 1.0

        h, layers = config.hidden_size, config.hidden_layers
        self.critic = CriticEnsemble(obs_dim, act_dim, 2, h, layers, init="torch").to(self.device)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.value = mlp(obs_dim, 1, h, layers).to(self.device)
        self.actor = mlp(obs_dim, act_dim, h, layers).to(self.device)  # tanh(actor(s)): the mean
        self.log_std = nn.Parameter(torch.zeros(act_dim, device=self.device))
        actor_params = list(self.actor.parameters()) + ([] if config.deterministic_actor else [self.log_std])
        self.actor_optim = torch.optim.Adam(actor_params, lr=config.actor_lr, **adam_kernel())
        self.critic_optim = torch.optim.Adam(self.critic.parameters(), lr=config.critic_lr, **adam_kernel())
        self.value_optim = torch.optim.Adam(self.value.parameters(), lr=config.value_lr, **adam_kernel())

    @classmethod
    def for_dataset(cls, dataset, config: Optional[IQLConfig] = None, device: str | torch.device = "cpu",
                    **parts) -> "IQL":
        """The agent for ``dataset``'s env, with the dataset's state statistics and reward scale."""
        return new_agent_for(cls, dataset, config, device, parts)

    def set_reward_scale(self, scale: float) -> None:
        self.reward_scale = model_free.checked_reward_scale(scale)

    def mean_action(self, normalised_obs: torch.Tensor) -> torch.Tensor:
        """The policy's mean (the deterministic actor's output) in [-1, 1]."""
        return torch.tanh(self.actor(normalised_obs))

    def to_env_units(self, action: torch.Tensor) -> torch.Tensor:
        return self.action_centre + self.action_scale * action.clamp(-1.0, 1.0)

    def to_unit(self, actions: torch.Tensor) -> torch.Tensor:
        """Env-unit actions mapped onto [-1, 1], the policy's scale."""
        return (actions - self.action_centre) / self.action_scale

    @torch.no_grad()
    def act(self, obs: np.ndarray, deterministic: bool = True) -> np.ndarray:
        """Action(s) for one observation ``(obs_dim,)`` or a batch ``(B, obs_dim)``, as numpy: the
        policy's mean, or with ``deterministic=False`` a sample from the Gaussian actor."""
        obs_t = self.act_input(obs)  # checked: shape (obs_dim,) or (B, obs_dim), finite
        return self._actions(obs_t, deterministic).cpu().numpy()

    # ------------------------------------------------------------------ the policy role (with FeedForwardAgent's)
    @torch.no_grad()
    def sample(self, observations: torch.Tensor, state=None, starts=None) -> tuple[torch.Tensor, None]:
        """Actions for generators: sampled from the Gaussian actor (the mean for a deterministic one)."""
        return self._actions(observations, False), None

    def _actions(self, obs: torch.Tensor, deterministic: bool) -> torch.Tensor:
        mean = self.mean_action(self.normalise(obs))
        if deterministic or self.config.deterministic_actor:
            return self.to_env_units(mean)
        std = self.log_std.detach().clamp(LOG_STD_MIN, LOG_STD_MAX).exp()
        return self.to_env_units(mean + std * torch.randn_like(mean))

    def log_prob(self, obs: torch.Tensor, actions: torch.Tensor, state=None, starts=None) -> torch.Tensor:
        """log pi(a|s) of env-unit ``actions`` under the Gaussian actor ``(B,)``, differentiable in
        ``actions`` and in the actor's parameters (states are normalised here)."""
        mean = self.mean_action(self.normalise(obs))
        scaled = self.to_unit(actions)
        dist = torch.distributions.Normal(mean, self.log_std.clamp(LOG_STD_MIN, LOG_STD_MAX).exp())
        return dist.log_prob(scaled).sum(-1)

    # ------------------------------------------------------------------ the value role (`policies.CriticValue`)
    @torch.no_grad()
    def mode(self, observations: torch.Tensor) -> torch.Tensor:
        """The policy's mean, in the env's units (as ``act`` with ``deterministic``)."""
        return self._actions(observations, True)

    def update(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """One step on each of V, the critics and the actor, in CORL's order; returns detached scalar
        tensors."""
        cfg = self.config
        obs, next_obs = self.normalise(batch["observations"]), self.normalise(batch["next_observations"])
        actions, rewards = batch["actions"], batch["rewards"] * self.reward_scale
        weights = row_weights(batch)  # per-row loss weights (B,), or None for plain means

        with torch.no_grad():
            target_q = self.target_critic(obs, actions).min(dim=0).values
            next_v = self.value(next_obs).squeeze(-1)

        # 1. value: expectile regression of V(s) onto min_j Qbar_j(s, a)
        advantage = target_q - self.value(obs).squeeze(-1)
        value_loss = expectile_loss(advantage, cfg.expectile, weights)
        self.value_optim.zero_grad(set_to_none=True)
        value_loss.backward()
        self.value_optim.step()
        advantage = advantage.detach()

        # 2. critics: one-step targets through V(s')
        target = rewards + cfg.gamma * (1.0 - batch["terminals"].float()) * next_v
        q = self.critic(obs, actions)  # (2, B)
        if weights is None:
            critic_loss = ((q - target) ** 2).mean()  # CORL: sum of the two MSEs / 2
        else:
            critic_loss = batch_mean((q - target) ** 2, weights).mean()
        self.critic_optim.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.critic_optim.step()
        soft_update(self.target_critic, self.critic, cfg.tau)

        # 3. actor: advantage-weighted regression
        weight = torch.exp(cfg.beta * advantage).clamp(max=cfg.exp_adv_max)
        if cfg.deterministic_actor:
            bc = ((self.mean_action(obs) - self.to_unit(actions)) ** 2).sum(-1)
        else:
            bc = -self.log_prob(batch["observations"], actions)
        actor_loss = batch_mean(weight * bc, weights)
        self.actor_optim.zero_grad(set_to_none=True)
        actor_loss.backward()
        self.actor_optim.step()

        q = q.detach()
        return {"value_loss": value_loss.detach(), "critic_loss": critic_loss.detach(),
                "actor_loss": actor_loss.detach(), "q_mean": q.mean(), "advantage_mean": advantage.mean(),
                "weight_mean": weight.mean()}

    def on_epoch_end(self, epoch: int, total_epochs: int) -> None:
        """The actor's learning rate: ``actor_lr (1 + cos(pi epoch / total_epochs)) / 2``, from the epoch,
        so a resumed run continues it exactly."""
        anneal_cosine(self.actor_optim, self.config.actor_lr, epoch, total_epochs)

    def state_dict(self) -> dict:
        return {
            "config": asdict(self.config),
            "actor": self.actor.state_dict(),
            "log_std": self.log_std.detach().clone(),
            "critic": self.critic.state_dict(),
            "target_critic": self.target_critic.state_dict(),
            "value": self.value.state_dict(),
            "actor_optim": self.actor_optim.state_dict(),
            "critic_optim": self.critic_optim.state_dict(),
            "value_optim": self.value_optim.state_dict(),
            "normalise": self.normalise.state_dict(),
            "reward_scale": self.reward_scale,
        }

    def load_state_dict(self, state: dict) -> None:
        self.actor.load_state_dict(state["actor"])
        with torch.no_grad():
            self.log_std.copy_(state["log_std"])
        self.critic.load_state_dict(state["critic"])
        self.target_critic.load_state_dict(state["target_critic"])
        self.value.load_state_dict(state["value"])
        self.actor_optim.load_state_dict(state["actor_optim"])
        self.critic_optim.load_state_dict(state["critic_optim"])
        self.value_optim.load_state_dict(state["value_optim"])
        self.normalise.load_state_dict(state["normalise"])
        self.set_reward_scale(state["reward_scale"])


__all__ = ["IQL", "IQLConfig"]
