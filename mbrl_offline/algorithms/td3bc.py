"""TD3+BC: TD3 with a behaviour-cloning term in the actor loss (Fujimoto & Gu, NeurIPS 2021), as in
CORL's ``algorithms/offline/td3_bc.py``, the reference both diffusion papers report with.

Per update, with states normalised by the dataset's mean and std (+ 1e-3):

1. critics:  y = r + gamma (1 - terminal) min_j Qbar_j(s', clip(pibar(s') + eps, low, high)),
             eps = clip(N(0, sigma^2), -c, c),   L(Q) = sum_j mean (Q_j(s, a) - y)^2;
2. every ``policy_freq``-th update only: the actor
             lambda = alpha / mean|Q_1(s, pi(s))|  (no gradient through lambda),
             L(pi)  = -lambda mean Q_1(s, pi(s)) + mean (pi(s) - a)^2,
   then Polyak averaging of the target critics and the target actor with rate tau.

Every mean over the batch's rows (in both losses and in lambda's mean|Q|) becomes ``sum_b w_b (.)``
for a batch with per-row loss weights ``weights`` (the ``weights`` mixing rule).

Defaults are CORL's (the same in all 15 locomotion configs): alpha 2.5, sigma = 0.2 and c = 0.5 times
the largest action, policy_freq 2, gamma 0.99, tau 5e-3, Adam at 3e-4 for both, batch 256, an actor of
2 x 256 ReLU with a tanh output scaled to the action bounds and two critics of 2 x 256 ReLU. The
paper's schedule is 1M updates.

Written with autograd, top to bottom: the reference style for new agents. Differences from CORL, none
of which changes the losses:

* the two critics are one `CriticEnsemble` of 2 members (one batched matmul per layer, the same
  initialisation as CORL's two ``nn.Linear`` stacks), and their loss is the sum of the two MSEs, as
  CORL's ``F.mse_loss(q1, y) + F.mse_loss(q2, y)``;
* CORL wraps the evaluation env so that it sees normalised states; here the agent keeps the dataset's
  mean and std (`TD3BC.for_dataset`, saved in its state) and normalises inside ``act`` and ``update``,
  so data from any generator and the raw env both work unchanged;
* the actor maps tanh onto ``[low, high]`` (centre + half-width * tanh), which is CORL's
  ``max_action * tanh`` for the symmetric bounds of every MuJoCo task; the noise scales with the
  half-width, as CORL's with ``max_action``.
"""
from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

from mbrl_offline.algorithms import model_free
from mbrl_offline.algorithms.model_free import ObservationNormaliser, action_box, new_agent_for
from mbrl_offline.algorithms.weights import batch_mean, row_weights
from mbrl_offline.config import (check_field_types, config_argument, require_above_zero, require_in_range,
                                 require_nonnegative, require_positive)
from mbrl_offline.models.networks import CriticEnsemble, mlp
from mbrl_offline.policies import CriticValue, FeedForwardAgent
from mbrl_offline.utils import adam_kernel, soft_update
from mbrl_offline.registry import register_agent


@dataclass
class TD3BCConfig:
    # The behaviour-cloning trade-off: lambda = alpha / mean|Q| on each actor update.
    alpha: float = 2.5
    # Target policy smoothing: noise of std policy_noise, clipped at +-noise_clip, both in units of
    # the largest action (CORL: 0.2 and 0.5 times max_action).
    policy_noise: float = 0.2
    noise_clip: float = 0.5
    # The actor and the targets are updated on every policy_freq-th critic update.
    policy_freq: int = 2
    actor_lr: float = 3e-4  # Adam, constant
    critic_lr: float = 3e-4
    gamma: float = 0.99  # discount
    tau: float = 5e-3  # Polyak rate of the target actor and critics
    hidden_size: int = 256  # width of the actor's and critics' hidden layers
    hidden_layers: int = 2
    batch_size: int = 256  # transitions per update
    # States are normalised with the dataset's mean and std + state_std_eps (CORL: on, 1e-3).
    normalize_states: bool = True
    state_std_eps: float = 1e-3

    def __post_init__(self):
        check_field_types(self, "algo")  # types first; nested mappings become configs
        require_positive(self, "batch_size", "hidden_size", "hidden_layers", "policy_freq")
        require_nonnegative(self, "alpha", "policy_noise", "noise_clip", "state_std_eps")
        require_above_zero(self, "actor_lr", "critic_lr")
        require_in_range(self, "gamma", 0.0, 1.0, low_open=True, hint=" (the discount; usually 0.99)")
        require_in_range(self, "tau", 0.0, 1.0, low_open=True, hint=" (the target networks' Polyak rate; usually 5e-3)")


@register_agent
class TD3BC(CriticValue, FeedForwardAgent):
    """A TD3+BC agent: ``act(obs)``, ``update(batch) -> metrics``, ``state_dict()`` (module docstring).

    Model-free: published without a generator (every batch real), and takes any transition
    generator's data by configuration. Build it with `TD3BC.for_dataset`, which takes the state
    normalisation from the dataset."""

    name = "td3bc"
    summary = "TD3 whose actor loss adds behaviour cloning"  # what it is, for the docs' tables
    defaults_from = "CORL's `td3_bc.py`"  # the code its defaults come from
    config_class = TD3BCConfig
    deterministic_policy = True  # online interaction explores with Gaussian noise on its actions (mbrl_offline.online)
    published_generator = staticmethod(model_free.published_generator)

    def __init__(self, obs_dim: int, act_dim: int, action_low, action_high,
                 config: Optional[TD3BCConfig] = None, device: str | torch.device = "cpu"):
        config = config_argument(config, type(self).config_class, f"{type(self).__name__}'s config")
        self.config, self.device = config, torch.device(device)
        self.obs_dim, self.act_dim = obs_dim, act_dim
        self.action_low, self.action_high, self.action_centre, self.action_scale = action_box(
            action_low, action_high, self.device)
        # the identity until for_dataset (or a loaded state) sets the dataset's statistics
        self.normalise = ObservationNormaliser(obs_dim, self.device)

        self.actor = mlp(obs_dim, act_dim, config.hidden_size, config.hidden_layers).to(self.device)
        self.target_actor = copy.deepcopy(self.actor).requires_grad_(False)
        self.critic = CriticEnsemble(obs_dim, act_dim, 2, config.hidden_size, config.hidden_layers,
                                     init="torch").to(self.device)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.actor_optim = torch.optim.Adam(self.actor.parameters(), lr=config.actor_lr, **adam_kernel())
        self.critic_optim = torch.optim.Adam(self.critic.parameters(), lr=config.critic_lr, **adam_kernel())
        self.updates = 0
        self._actor_loss = torch.zeros((), device=self.device)  # the last actor loss, reported between actor steps
        self._bc_loss = torch.zeros((), device=self.device)

    @classmethod
    def for_dataset(cls, dataset, config: Optional[TD3BCConfig] = None, device: str | torch.device = "cpu",
                    **parts) -> "TD3BC":
        """The agent for ``dataset``'s env, normalising states with the dataset's statistics."""
        return new_agent_for(cls, dataset, config, device, parts)

    def pi(self, normalised_obs: torch.Tensor, target: bool = False) -> torch.Tensor:
        """pi(s) in the env's action units, from normalised states."""
        net = self.target_actor if target else self.actor
        return self.action_centre + self.action_scale * torch.tanh(net(normalised_obs))

    @torch.no_grad()
    def act(self, obs: np.ndarray, deterministic: bool = True) -> np.ndarray:
        """Action(s) for one observation ``(obs_dim,)`` or a batch ``(B, obs_dim)``, as numpy (the
        policy is deterministic)."""
        obs_t = self.act_input(obs)  # checked: shape (obs_dim,) or (B, obs_dim), finite
        return self.pi(self.normalise(obs_t)).cpu().numpy()

    # ------------------------------------------------------------------ the policy role (with FeedForwardAgent's)
    @torch.no_grad()
    def sample(self, observations: torch.Tensor, state=None, starts=None) -> tuple[torch.Tensor, None]:
        """Actions for generators: the deterministic policy pi(s) (TD3+BC has no stochastic one)."""
        return self.pi(self.normalise(observations)), None

    def log_prob(self, observations: torch.Tensor, actions: torch.Tensor, state=None, starts=None) -> torch.Tensor:
        """log N(a; pi(s), I), differentiable in ``actions``: the density policy-guided diffusion's code
        gives a deterministic TD3+BC actor (unit variance, in the env's action units)."""
        diff = actions - self.pi(self.normalise(observations))
        return -0.5 * (diff.pow(2) + math.log(2 * math.pi)).sum(-1)

    # ------------------------------------------------------------------ the value role (`policies.CriticValue`)
    @torch.no_grad()
    def mode(self, observations: torch.Tensor) -> torch.Tensor:
        """pi(s), the deterministic actor, in the env's units."""
        return self.pi(self.normalise(observations))

    def update(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """One critic step, and on every ``policy_freq``-th call an actor step and the target updates;
        returns detached scalar tensors (the actor's losses are those of its last step)."""
        cfg = self.config
        self.updates += 1
        obs, next_obs = self.normalise(batch["observations"]), self.normalise(batch["next_observations"])
        actions, weights = batch["actions"], row_weights(batch)

        # 1. critics
        with torch.no_grad():
            max_action = self.action_scale.max()
            noise = (torch.randn_like(actions) * cfg.policy_noise * max_action).clamp(
                -cfg.noise_clip * max_action, cfg.noise_clip * max_action)
            next_actions = torch.maximum(torch.minimum(self.pi(next_obs, target=True) + noise,
                                                       self.action_high), self.action_low)
            next_q = self.target_critic(next_obs, next_actions).min(dim=0).values
            target = batch["rewards"] + cfg.gamma * (1.0 - batch["terminals"].float()) * next_q
        q = self.critic(obs, actions)  # (2, B)
        critic_loss = batch_mean((q - target) ** 2, weights).sum()  # sum over the critics of their MSE
        self.critic_optim.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.critic_optim.step()

        # 2. actor and targets, every policy_freq-th update
        if self.updates % cfg.policy_freq == 0:
            pi = self.pi(obs)
            q1 = self.critic(obs, pi)[0]
            lmbda = cfg.alpha / batch_mean(q1.abs(), weights).detach()
            if weights is None:
                bc_loss = F.mse_loss(pi, actions)
            else:
                bc_loss = batch_mean(((pi - actions) ** 2).mean(dim=-1), weights)
            actor_loss = -lmbda * batch_mean(q1, weights) + bc_loss
            self.actor_optim.zero_grad(set_to_none=True)
            actor_loss.backward()
            self.actor_optim.step()
            soft_update(self.target_critic, self.critic, cfg.tau)
            soft_update(self.target_actor, self.actor, cfg.tau)
            self._actor_loss, self._bc_loss = actor_loss.detach(), bc_loss.detach()

        q = q.detach()
        return {"critic_loss": critic_loss.detach(), "actor_loss": self._actor_loss, "bc_loss": self._bc_loss,
                "q_mean": q.mean(), "q_std": q.std(dim=0).mean()}

    def on_epoch_end(self, epoch: int, total_epochs: int) -> None:
        """Nothing to do: TD3+BC's learning rates are constant."""

    def state_dict(self) -> dict:
        return {
            "config": asdict(self.config),
            "actor": self.actor.state_dict(),
            "target_actor": self.target_actor.state_dict(),
            "critic": self.critic.state_dict(),
            "target_critic": self.target_critic.state_dict(),
            "actor_optim": self.actor_optim.state_dict(),
            "critic_optim": self.critic_optim.state_dict(),
            "normalise": self.normalise.state_dict(),
            "updates": self.updates,
        }

    def load_state_dict(self, state: dict) -> None:
        self.actor.load_state_dict(state["actor"])
        self.target_actor.load_state_dict(state["target_actor"])
        self.critic.load_state_dict(state["critic"])
        self.target_critic.load_state_dict(state["target_critic"])
        self.actor_optim.load_state_dict(state["actor_optim"])
        self.critic_optim.load_state_dict(state["critic_optim"])
        self.normalise.load_state_dict(state["normalise"])
        self.updates = int(state["updates"])


__all__ = ["TD3BC", "TD3BCConfig"]
