"""Agents, one file each with a dataclass config: ``ALGORITHMS`` maps the names used by the configs
(``algo=ravl``) to (agent class, config class). Each agent class meets `mbrl_offline.roles.Agent` and
`mbrl_offline.roles.Policy`, and names the generator it was published with (``published_generator``)."""
from __future__ import annotations

from pathlib import Path

import torch

from mbrl_offline.algorithms.coplanner import COPlanner, COPlannerConfig
from mbrl_offline.algorithms.iql import IQL, IQLConfig
from mbrl_offline.algorithms.mobile import MOBILE, MOBILEConfig
from mbrl_offline.algorithms.model_based import OfflineRLKitSACConfig
from mbrl_offline.algorithms.mopo import MOPO, MOPOConfig
from mbrl_offline.algorithms.neubay import NEUBAY, NEUBAYConfig
from mbrl_offline.algorithms.ravl import RAVL, RAVLConfig
from mbrl_offline.algorithms.sac import SAC, SACConfig
from mbrl_offline.algorithms.td3bc import TD3BC, TD3BCConfig
from mbrl_offline.checkpoint import POLICY_SECTIONS, read_checkpoint, saved_settings
from mbrl_offline.config import check_device, did_you_mean
from mbrl_offline.data.envs import get_env_info
from mbrl_offline.errors import ConfigError

ALGORITHMS = {agent.name: (agent, agent.config_class) for agent in (RAVL, MOPO, MOBILE, COPlanner, TD3BC, IQL, NEUBAY)}


def get_algorithm(name: str):
    """``(agent class, config class)`` for an algorithm name."""
    if name not in ALGORITHMS:
        hint = did_you_mean(name, ALGORITHMS)
        raise ConfigError(f"unknown algo '{name}'.{hint} Known algos: {', '.join(ALGORITHMS)}.")
    return ALGORITHMS[name]


def load_policy(checkpoint: str | Path, device: str | torch.device = "cpu"):
    """The agent saved in a training checkpoint, without its generator (and without the dynamics model
    MOBILE's penalty uses, which acting does not need): ready for ``act``. A ``device`` this machine
    lacks (``cuda`` without a GPU) is refused in one line before the checkpoint is read."""
    device = check_device(device, "load_policy's device")
    state = read_checkpoint(checkpoint, POLICY_SECTIONS)
    agent_cls, config_cls = get_algorithm(state["algorithm"])
    env = get_env_info(state["env"])
    config = saved_settings(config_cls, state["agent"]["config"], checkpoint, "algo")
    low, high = env.action_bounds()
    agent = agent_cls(env.obs_dim, env.act_dim, low, high, config, device)
    agent.load_state_dict(state["agent"])
    return agent, state


__all__ = ["ALGORITHMS", "COPlanner", "COPlannerConfig", "IQL", "IQLConfig", "MOBILE", "MOBILEConfig", "MOPO", "MOPOConfig", "NEUBAY", "NEUBAYConfig",
           "OfflineRLKitSACConfig", "RAVL", "RAVLConfig", "SAC", "SACConfig", "TD3BC", "TD3BCConfig", "get_algorithm",
           "load_policy"]
