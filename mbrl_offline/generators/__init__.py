"""Synthetic-experience producers (the generator role, `mbrl_offline.roles.Generator`) built on
`mbrl_offline.models`, and the registry the configs name them by (``generator=rollouts``,
``generator=synther``).

Each generator is one module here: a class meeting `mbrl_offline.roles.GeneratorClass`, registered with
`mbrl_offline.registry.register_generator`, and its config, a `mbrl_offline.roles.GeneratorConfig`
(``kind``, the trainer's schedule ``every``/``utd`` and the batch ``mixing`` rule). Importing this
package imports every module in it, so ``GENERATORS`` (the registry: kind -> (config class, generator
class)) holds them all, and the package exports each module's ``__all__``. A generator's
``generate(policy, real, rng)`` returns rows in the buffer's format (`mbrl_offline.buffer.TRANSITION_FIELDS`)
and a dict of statistics to log. ``generator=none`` (`NoGeneratorConfig`) trains on the dataset alone.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from mbrl_offline import registry
from mbrl_offline.config import check_field_types, config_to_dataclass, did_you_mean
from mbrl_offline.errors import ConfigError


@dataclass
class NoGeneratorConfig:
    """``generator=none``: no synthetic data; every batch is real."""

    kind: str = "none"

    def __post_init__(self):
        check_field_types(self, "generator")  # types first; nested mappings become configs
        if self.kind != "none":
            raise ConfigError(f"a NoGeneratorConfig has kind 'none', not '{self.kind}'.")

    def fitted_model(self) -> None:
        """No model."""
        return None

    def check_dataset(self, dataset, model_path=None) -> None:
        """Any dataset will do."""

    def check_agent(self, agent, algo_config) -> None:
        """Any agent will do."""

    def without_penalty(self) -> "NoGeneratorConfig":
        """No penalty to turn off."""
        return self


GENERATORS = registry.GENERATORS  # the registry itself: kind -> (config class, generator class or None)
GENERATORS.setdefault("none", (NoGeneratorConfig, None))

_EXPORTS = []
for _module in registry.import_modules(sys.modules[__name__]):
    for _name in getattr(_module, "__all__", ()):
        globals()[_name] = getattr(_module, _name)
        _EXPORTS.append(_name)


def generator_config(settings: dict):
    """The config dataclass that a dict of generator settings (with its ``kind``) describes; unknown
    kinds and settings are refused in one line."""
    registry.load_plugins()
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


__all__ = sorted(["GENERATORS", "NoGeneratorConfig", "build_generator", "generator_config", *_EXPORTS])
