"""Environment registry: short names -> Gymnasium id, reference scores, termination function.

Reference scores put returns on D4RL's 0-100 scale: 0 is a uniformly random policy, 100 an expert.
For the MuJoCo locomotion tasks they are D4RL's own constants (``d4rl/infos.py``), so normalised
scores are comparable with published tables. For the cheap test envs, which D4RL does not cover,
the minimum is the mean return of uniformly random actions over 100 episodes (seeds 0-99, measured
here) and the maximum is the best return the task allows (InvertedPendulum) or that of our SAC expert
(Pendulum; see the bundled-datasets table in docs/datasets.md).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mbrl_offline.config import did_you_mean
from mbrl_offline.errors import ConfigError
from mbrl_offline.data.termination import TERMINATION_FUNCTIONS, TerminationFn


@dataclass(frozen=True)
class EnvInfo:
    name: str  # short name used everywhere in the library and the configs
    gym_id: str  # Gymnasium id of the evaluation environment
    obs_dim: int
    act_dim: int
    ref_min_score: float  # return of a random policy (normalised score 0)
    ref_max_score: float  # return of an expert policy (normalised score 100)
    default_dataset: str  # dataset used when a run names only the env
    # Defaults for the collect tool, `mbrl-collect` (the D4RL recipe for MuJoCo: 1M-step SAC, 1M-transition datasets).
    expert_steps: int  # online SAC steps for the expert policy
    dataset_size: int  # transitions in each rolled-out dataset (random, medium, expert)
    eval_every: int  # SAC steps between evaluations of the behaviour policy
    start_steps: int  # uniformly random actions before SAC starts acting and learning
    max_episode_steps: int  # the env's time limit (Gymnasium's spec): NEUBAY's rollout horizon

    @property
    def termination_fn(self) -> TerminationFn:
        return TERMINATION_FUNCTIONS[self.name]

    def normalized_score(self, returns):
        """100 * (return - random) / (expert - random), D4RL's scale."""
        return 100.0 * (returns - self.ref_min_score) / (self.ref_max_score - self.ref_min_score)

    def action_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """The action space's ``(low, high)``, read from the env."""
        env = self.make()
        try:
            return env.action_space.low.astype(np.float32), env.action_space.high.astype(np.float32)
        finally:
            env.close()

    def make(self, **kwargs):
        import gymnasium as gym

        return gym.make(self.gym_id, **kwargs)


_MUJOCO = dict(expert_steps=1_000_000, dataset_size=1_000_000, eval_every=5_000, start_steps=10_000,
               max_episode_steps=1000)

ENVS: dict[str, EnvInfo] = {
    info.name: info
    for info in [
        EnvInfo("hopper", "Hopper-v5", 11, 3, -20.272305, 3234.3, "hopper-medium", **_MUJOCO),
        EnvInfo("halfcheetah", "HalfCheetah-v5", 17, 6, -280.178953, 12135.0, "halfcheetah-medium", **_MUJOCO),
        EnvInfo("walker2d", "Walker2d-v5", 17, 6, 1.629008, 4592.3, "walker2d-medium", **_MUJOCO),
        EnvInfo("ant", "Ant-v5", 105, 8, -325.6, 3879.7, "ant-medium", **_MUJOCO),
        EnvInfo("pendulum", "Pendulum-v1", 3, 1, -1207.555, -150.0, "pendulum-medium",
                expert_steps=8_000, dataset_size=10_000, eval_every=200, start_steps=1_000, max_episode_steps=200),
        # InvertedPendulum's returns are all-or-nothing (the pole falls early or stays up for 1000
        # steps), so its "medium" policy already balances: medium-replay is the data to improve on.
        EnvInfo("inverted-pendulum", "InvertedPendulum-v5", 4, 1, 5.23, 1000.0, "inverted-pendulum-medium-replay",
                expert_steps=30_000, dataset_size=10_000, eval_every=250, start_steps=1_000, max_episode_steps=1000),
    ]
}


def get_env_info(name: str) -> EnvInfo:
    """The registry entry for a short name (``hopper``) or a Gymnasium id (``Hopper-v5``)."""
    if name in ENVS:
        return ENVS[name]
    for info in ENVS.values():
        if info.gym_id == name:
            return info
    hint = did_you_mean(name, ENVS)
    raise ConfigError(f"unknown env '{name}'.{hint} Known envs: {', '.join(ENVS)}.")
