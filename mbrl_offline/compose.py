"""A run from names and settings: the agent, its generator (the algorithm's published one unless another
is given) and the trainer, composed by configuration with no special case for any pair.

    from mbrl_offline import build_run, load_dataset
    from mbrl_offline.generators import RolloutGeneratorConfig

    dataset = load_dataset("hopper-medium")
    build_run("ravl", dataset).train()                                               # RAVL as published
    build_run("iql", dataset, generator_config=RolloutGeneratorConfig()).train()     # IQL on model rollouts

``examples/train.py`` does the same from Hydra's config groups (``algo=iql generator=rollouts``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from mbrl_offline.algorithms import ALGORITHMS, get_algorithm
from mbrl_offline.config import check_device, config_argument
from mbrl_offline.data.dataset import dataset_env
from mbrl_offline.errors import ConfigError, InputTypeError, type_name
from mbrl_offline.generators import GENERATORS, build_generator
from mbrl_offline.models.fitting import check_fit_rows
from mbrl_offline.trainer import Trainer, TrainerConfig, check_settings


def check_pair(agent_cls, generator_config, algo_config=None) -> None:
    """Refuse, in one line, a generator whose data the agent cannot learn from (sequences for a
    transition agent), an agent whose losses need a dynamics model that the generator lacks, and
    every other mistake the settings alone show (`mbrl_offline.trainer.check_settings`: a mixing rule
    for the other kind of data, more real rows than the batch, the generator's own checks of the agent)
    with ``algo_config`` (None: the algorithm's defaults). Called before any data is loaded, model
    fitted or file written."""
    generator_cls = GENERATORS[generator_config.kind][1]
    if generator_cls is not None and generator_cls.produces != agent_cls.consumes:
        raise ConfigError(f"generator '{generator_config.kind}' produces {generator_cls.produces}, but "
                          f"{agent_cls.name} learns from {agent_cls.consumes}; choose a generator that produces "
                          f"{agent_cls.consumes}.")
    if agent_cls.needs_dynamics and (generator_cls is None or not hasattr(generator_cls, "dynamics")):
        raise ConfigError(f"{agent_cls.name}'s penalty needs the generator's dynamics model, and generator "
                          f"'{generator_config.kind}' has none; use generator=rollouts, or leave generator unset "
                          f"for {agent_cls.name}'s own.")
    if algo_config is None:
        algo_config = get_algorithm(agent_cls.name)[1]()
    check_settings(agent_cls, algo_config, generator_config)


def build_run(algo: str, dataset, algo_config=None, generator_config=None,
              trainer_config: Optional[TrainerConfig] = None, device: str | torch.device = "cpu",
              cache_dir: Optional[str | Path] = None, dynamics_path: Optional[str | Path] = None,
              callbacks: Optional[list] = None) -> Trainer:
    """The `Trainer` for algorithm ``algo`` on ``dataset`` (an `OfflineDataset` with an env).

    The three configs are config objects or None (their defaults), never dicts: a dict of settings is
    refused in one line that says how to build the config from it (`mbrl_offline.config.config_argument`,
    the rule for every config argument of the library). ``algo_config``: the agent's settings (default:
    the algorithm's). ``trainer_config``: a `TrainerConfig` (default ``TrainerConfig()``).
    ``generator_config``: a generator config (`mbrl_offline.generators.GENERATORS`); None: the one the
    algorithm was published with (``published_generator``). The generator's model is fitted on ``dataset`` or loaded from
    ``dynamics_path`` or the cache in ``cache_dir``. Agents whose losses use the dynamics model (MOBILE)
    get the generator's. The torch seed is set to ``trainer_config.seed`` before anything is built.
    """
    if not isinstance(algo, str):
        raise InputTypeError(f"build_run's algo must be an algorithm's name (one of {', '.join(ALGORITHMS)}), "
                             f"got {type_name(algo)}.")
    dataset_env(dataset, "build_run")  # a dataset, with an env of the registry and that env's widths
    agent_cls, config_cls = get_algorithm(algo)
    algo_config = config_argument(algo_config, config_cls, f"build_run's algo_config for {algo}", "algo",
                                  f"{config_cls.__name__}(batch_size=256)")
    if generator_config is not None and not isinstance(generator_config, tuple(c for c, _ in GENERATORS.values())):
        hint = (" (a dict of settings: mbrl_offline.generators.generator_config(settings))"
                if isinstance(generator_config, dict) else "")
        raise InputTypeError(f"build_run's generator_config must be a generator config (e.g. "
                             f"mbrl_offline.generators.RolloutGeneratorConfig()) or None, got "
                             f"{type_name(generator_config)}{hint}.")
    trainer_config = config_argument(trainer_config, TrainerConfig, "build_run's trainer_config", "trainer",
                                     "TrainerConfig(epochs=100)")
    generator_config = generator_config if generator_config is not None else agent_cls.published_generator()
    check_pair(agent_cls, generator_config, algo_config)
    device = check_device(device, "build_run's device")
    dynamics = getattr(generator_config, "dynamics", None)  # a model to fit: enough data for it, before anything
    if dynamics is not None and dynamics_path is None and not getattr(generator_config, "true_dynamics", False):
        check_fit_rows(len(dataset), dynamics.holdout_ratio, dynamics.max_holdout, dynamics.batch_size,
                       f"the dataset ({dataset.source})")
    torch.manual_seed(trainer_config.seed)
    generator = build_generator(generator_config, dataset, device, cache_dir, dynamics_path, trainer_config.progress)
    parts = {"dynamics": generator.dynamics} if agent_cls.needs_dynamics else {}
    agent = agent_cls.for_dataset(dataset, algo_config, device, **parts)
    return Trainer(agent, dataset, trainer_config, generator, callbacks)
