"""Agents, one module each with a dataclass config. Each agent class meets `mbrl_offline.roles.AgentClass`
and registers itself (`mbrl_offline.registry.register_agent`); importing this package imports every
module in it, so ``ALGORITHMS`` (the registry: ``algo=<name>`` -> (agent class, config class)) holds
them all, and the package exports each module's ``__all__``. A new agent is a new module here (or a
user's own module, registered the same way: ``docs/contributing.md``)."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from mbrl_offline import registry
from mbrl_offline.checkpoint import POLICY_SECTIONS, read_checkpoint, saved_settings
from mbrl_offline.config import check_device, did_you_mean
from mbrl_offline.data.envs import get_env_info
from mbrl_offline.errors import ConfigError

ALGORITHMS = registry.AGENTS  # the registry itself: name -> (agent class, config class)

_EXPORTS = []
for _module in registry.import_modules(sys.modules[__name__]):
    for _name in getattr(_module, "__all__", ()):
        globals()[_name] = getattr(_module, _name)
        _EXPORTS.append(_name)


def get_algorithm(name: str):
    """``(agent class, config class)`` for an algorithm name."""
    registry.load_plugins()
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


__all__ = sorted(["ALGORITHMS", "get_algorithm", "load_policy", *_EXPORTS])
