"""Synthetic-experience producers (the generator role, `mbrl_offline.roles.Generator`) built on
`mbrl_offline.models`, and the registry the configs name them by (``generator=rollouts``,
``generator=synther``).

A generator's ``generate(policy, real, rng)`` returns rows in the buffer's format
(`mbrl_offline.buffer.TRANSITION_FIELDS`) and a dict of statistics to log; its ``config`` holds the
trainer's schedule (``every``) and the batch mixing rule (``mixing``). ``generator=none``
(`NoGeneratorConfig`) trains on the dataset alone.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from mbrl_offline.config import check_field_types, config_to_dataclass, did_you_mean
from mbrl_offline.errors import ConfigError
from mbrl_offline.generators.pgd import PGDGenerator, PGDGeneratorConfig, PGDGuidanceConfig, UNetConfig
from mbrl_offline.generators.posterior import PosteriorConfig, PosteriorGenerator, PosteriorGeneratorConfig
from mbrl_offline.generators.rollouts import (BranchedRollouts, RolloutConfig, RolloutGenerator,
                                              RolloutGeneratorConfig)
from mbrl_offline.generators.synther import SyntherGenerator, SyntherGeneratorConfig
from mbrl_offline.generators.upmpc import UPMPCConfig, upmpc_actions


@dataclass
class NoGeneratorConfig:
    """``generator=none``: no synthetic data; every batch is real."""

    kind: str = "none"

    def __post_init__(self):
        check_field_types(self, "generator")  # types first; nested mappings become configs
        if self.kind != "none":
            raise ConfigError(f"a NoGeneratorConfig has kind 'none', not '{self.kind}'.")


# kind -> (config class, generator class or None); the kind is the config's ``kind`` field
GENERATORS = {"none": (NoGeneratorConfig, None), "rollouts": (RolloutGeneratorConfig, RolloutGenerator),
              "synther": (SyntherGeneratorConfig, SyntherGenerator), "pgd": (PGDGeneratorConfig, PGDGenerator),
              "posterior": (PosteriorGeneratorConfig, PosteriorGenerator)}


def generator_config(settings: dict):
    """The config dataclass that a dict of generator settings (with its ``kind``) describes; unknown
    kinds and settings are refused in one line."""
    kind = settings.get("kind", "none")
    if kind not in GENERATORS:
        raise ConfigError(f"unknown generator kind '{kind}'.{did_you_mean(kind, GENERATORS)} "
                          f"Known: {', '.join(GENERATORS)}.")
    return config_to_dataclass(GENERATORS[kind][0], settings, "generator")


def build_generator(config, dataset, device: str | torch.device = "cpu", cache_dir: Optional[str | Path] = None,
                    model_path: Optional[str | Path] = None, progress: bool = True):
    """The generator ``config`` describes, fitted on ``dataset`` or loaded (from ``model_path`` or the
    cache); None for ``kind='none'``."""
    generator_cls = GENERATORS[config.kind][1]
    if generator_cls is None:
        if model_path is not None:
            raise ConfigError("generator=none uses no dynamics model; leave dynamics_path unset.")
        return None
    return generator_cls.for_dataset(config, dataset, device, cache_dir, model_path, progress)


__all__ = ["BranchedRollouts", "GENERATORS", "NoGeneratorConfig", "PGDGenerator", "PGDGeneratorConfig", "PosteriorConfig", "PosteriorGenerator",
           "PosteriorGeneratorConfig",
           "PGDGuidanceConfig", "RolloutConfig", "RolloutGenerator", "RolloutGeneratorConfig", "SyntherGenerator",
           "SyntherGeneratorConfig", "UNetConfig", "UPMPCConfig", "build_generator", "generator_config", "upmpc_actions"]
