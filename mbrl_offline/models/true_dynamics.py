"""The true dynamics as a "model": the simulator reset to each observed state and stepped.

`TrueDynamics` has the interface of `GaussianEnsembleDynamics` that generators and agents use
(``step``, ``predict``, ``sample_next_observations``, ``elites``), so it drops in wherever the learned
ensemble goes: ``generator.true_dynamics=true`` in the configs. It is one deterministic "member", so
every dynamics-uncertainty estimate is exactly 0 (`mbrl_offline.models.uncertainty`): with it, MOPO's
and MOBILE's penalties vanish, which is how the edge-of-reach paper (Sims et al. 2024, Table 1)
separates model error from the edge-of-reach problem.

How a state is recovered from an observation:

* Hopper, Walker2d, HalfCheetah (Gymnasium v5): the observation is ``qpos[1:]`` and ``qvel``; the
  x position it leaves out does not change the dynamics or the reward (which uses the x *change*),
  so it is set to 0. Hopper and Walker2d clip the velocities in the observation to ±10: a state
  whose true velocity was beyond that is recovered with the clipped value, the one inexact case.
* Pendulum-v1: the observation is ``(cos th, sin th, thdot)``; the state is ``(atan2(sin, cos), thdot)``.

Each row is one reset and one ``env.step`` on the CPU (MuJoCo's own integrator and contact solver),
so this is far slower than the learned model on large batches; the results go back to the caller's
device and dtype.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from mbrl_offline.errors import ConfigError

SUPPORTED_ENVS = ("hopper", "walker2d", "halfcheetah", "pendulum")


class TrueDynamics:
    """The real env's transition and reward for a batch of ``(obs, act)``; see the module docstring."""

    ensemble_size = 1

    def __init__(self, env_name: str):
        from mbrl_offline.data.envs import get_env_info

        info = get_env_info(env_name)
        if info.name not in SUPPORTED_ENVS:
            raise ConfigError(f"true dynamics are available for {', '.join(SUPPORTED_ENVS)}, not '{info.name}'; "
                              f"use the learned model (generator.true_dynamics=false).")
        self.env_name, self.obs_dim, self.act_dim = info.name, info.obs_dim, info.act_dim
        self.env = info.make().unwrapped
        self.env.reset(seed=0)
        self.elites = torch.zeros(1, dtype=torch.long)

    def to(self, device: str | torch.device) -> "TrueDynamics":
        self.elites = self.elites.to(device)
        return self

    def state_dict(self) -> dict:
        return {"env": self.env_name}

    def load_state_dict(self, state: dict) -> None:
        if state.get("env") != self.env_name:
            raise ValueError(f"saved true dynamics are for {state.get('env')}, not {self.env_name}")

    def _set_state(self, obs: np.ndarray) -> None:
        if self.env_name == "pendulum":
            self.env.state = np.array([np.arctan2(obs[1], obs[0]), obs[2]])
            return
        nq = self.env.model.nq
        self.env.set_state(np.concatenate([[0.0], obs[:nq - 1]]), obs[nq - 1:])

    @torch.no_grad()
    def transition(self, obs: torch.Tensor, act: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Next observations ``(B, obs_dim)`` and rewards ``(B,)`` from the simulator, row by row."""
        obs_np = obs.detach().cpu().double().numpy()
        act_np = act.detach().cpu().double().numpy()
        next_obs = np.empty_like(obs_np)
        rewards = np.empty(len(obs_np))
        for i, (o, a) in enumerate(zip(obs_np, act_np)):
            self._set_state(o)
            next_obs[i], rewards[i], *_ = self.env.step(a)
        as_input = dict(device=obs.device, dtype=obs.dtype)
        return torch.as_tensor(next_obs, **as_input), torch.as_tensor(rewards, **as_input)

    def predict(self, obs: torch.Tensor, act: torch.Tensor, elites_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """As `GaussianEnsembleDynamics.predict`: one member, zero variance (log-variance -inf)."""
        next_obs, rewards = self.transition(obs, act)
        mean = torch.cat([next_obs - obs, rewards[:, None]], dim=-1).unsqueeze(0)
        return mean, torch.full_like(mean, float("-inf"))

    def sample_next_observations(self, obs: torch.Tensor, act: torch.Tensor, samples: int,
                                 generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """``(1, samples, B, obs_dim)``: every sample is the one true next state."""
        next_obs, _ = self.transition(obs, act)
        return next_obs.expand(1, samples, *next_obs.shape)

    def step(self, obs: torch.Tensor, act: torch.Tensor, generator: Optional[torch.Generator] = None,
             deterministic: bool = False, uncertainty: bool = False,
             members: Optional[torch.Tensor] = None) -> dict[str, torch.Tensor]:
        """As `GaussianEnsembleDynamics.step`, for a model of one member (0, whatever ``members`` says);
        every uncertainty is 0."""
        next_obs, rewards = self.transition(obs, act)
        result = {"next_observations": next_obs, "rewards": rewards,
                  "member": torch.zeros(len(rewards), dtype=torch.long, device=rewards.device)}
        if uncertainty:
            for key in ("aleatoric", "disagreement", "epistemic", "usad"):
                result[key] = torch.zeros_like(rewards)
        return result
