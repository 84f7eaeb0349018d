"""Synthetic-experience producers built on `mbrl_offline.models`.

A generator's ``generate(policy, start_observations, generator)`` returns transitions in the
buffer's format (`mbrl_offline.buffer.TRANSITION_FIELDS`) and a dict of statistics to log.
"""
from mbrl_offline.generators.rollouts import BranchedRollouts, RolloutConfig
from mbrl_offline.generators.upmpc import UPMPCConfig, upmpc_actions

__all__ = ["BranchedRollouts", "RolloutConfig", "UPMPCConfig", "upmpc_actions"]
