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
from typing import Optional, Sequence

import torch

from mbrl_offline.algorithms import ALGORITHMS, get_algorithm
from mbrl_offline.config import CONFIG_DIR, check_device, config_argument
from mbrl_offline.data.dataset import dataset_env
from mbrl_offline.errors import InputTypeError, type_name
from mbrl_offline.generators import GENERATORS, build_generator
from mbrl_offline.online import check_online
from mbrl_offline.pairing import check_pair  # the one judge of a pair, exported here
from mbrl_offline.trainer import Trainer, TrainerConfig


def run_configs(algo: str, budget: str = "paper", generator: Optional[str] = None, env: Optional[str] = None,
                overrides: Sequence[str] = ()):
    """``(algo config, generator config, trainer config)`` exactly as the command line composes them for
    ``algo=<algo> [generator=<generator>] [env=<env>] budget=<budget> <overrides>``: the same config files,
    budgets (``budget.when`` included) and checks of each setting. ``generator``: a ``generator=`` choice
    (a kind such as ``synther``, or an algorithm's name for its published generator; None: ``algo``'s own).
    ``overrides``: more ``key=value`` settings, as on the command line (``trainer.epochs=5``)."""
    from mbrl_offline.config_files import compose, train_sections

    choices = [f"algo={algo}", f"budget={budget}"]
    choices += [f"generator={generator}"] if generator is not None else []
    choices += [f"env={env}"] if env is not None else []
    _, algo_config, generator_config, trainer_config = train_sections(compose(CONFIG_DIR, "train",
                                                                               [*choices, *overrides]))
    return algo_config, generator_config, trainer_config


def env_choice(dataset) -> Optional[str]:
    """The ``env=`` choice of ``dataset``'s env, where the config files have one (None: the default)."""
    name = getattr(dataset, "env_name", None)
    return name if name and (Path(CONFIG_DIR) / "env" / f"{name}.yaml").is_file() else None


def build_run(algo: str, dataset, algo_config=None, generator_config=None,
              trainer_config: Optional[TrainerConfig] = None, device: str | torch.device = "cpu",
              cache_dir: Optional[str | Path] = None, dynamics_path: Optional[str | Path] = None,
              callbacks: Optional[list] = None, budget: str = "paper") -> Trainer:
    """The `Trainer` for algorithm ``algo`` on ``dataset`` (an `OfflineDataset` with an env).

    A section left None gets what the command line gives it under ``budget`` (`run_configs`: the
    config files in ``budget/<budget>.yaml``; ``paper``, the published schedule, as the command line's
    default; ``quick``, the CPU demo), so that ``build_run("iql", data, generator_config="synther",
    budget="quick")`` is the run of ``algo=iql generator=synther budget=quick env=<the data's env>``. A
    section given as a config object is used as it is. ``algo_config``: the agent's settings.
    ``generator_config``: a generator config (`mbrl_offline.generators.GENERATORS`), or the name of a
    ``generator=`` choice (a kind, or an algorithm's name for its published generator); None: the one
    the algorithm was published with. ``trainer_config``: a `TrainerConfig`. Config arguments are
    config objects, never dicts: a dict of settings is refused in one line that says how to build the
    config from it (`mbrl_offline.config.config_argument`). The generator's model is fitted on
    ``dataset`` or loaded from ``dynamics_path`` or the cache in ``cache_dir``. Agents whose losses use
    the dynamics model (MOBILE) get the generator's. The torch seed is set to ``trainer_config.seed``
    before anything is built.
    """
    if not isinstance(algo, str):
        raise InputTypeError(f"build_run's algo must be an algorithm's name (one of {', '.join(ALGORITHMS)}), "
                             f"got {type_name(algo)}.")
    dataset_env(dataset, "build_run")  # a dataset, with an env of the registry and that env's widths
    agent_cls, config_cls = get_algorithm(algo)
    if algo_config is not None:
        config_argument(algo_config, config_cls, f"build_run's algo_config for {algo}", "algo",
                        f"{config_cls.__name__}(batch_size=256)")
    if generator_config is not None and not isinstance(generator_config, (str, *(c for c, _ in GENERATORS.values()))):
        hint = (" (a dict of settings: mbrl_offline.generators.generator_config(settings))"
                if isinstance(generator_config, dict) else "")
        raise InputTypeError(f"build_run's generator_config must be a generator config (e.g. "
                             f"mbrl_offline.generators.RolloutGeneratorConfig()), a generator= choice's name or None, "
                             f"got {type_name(generator_config)}{hint}.")
    if trainer_config is not None:
        config_argument(trainer_config, TrainerConfig, "build_run's trainer_config", "trainer",
                        "TrainerConfig(epochs=100)")
    if algo_config is None or trainer_config is None or generator_config is None or isinstance(generator_config, str):
        if not isinstance(budget, str):
            raise InputTypeError(f"build_run's budget must be a budget's name (e.g. paper or quick), got "
                                 f"{type_name(budget)}.")
        choice = generator_config if isinstance(generator_config, str) else None
        composed = run_configs(algo, budget, choice, env_choice(dataset))
        algo_config = algo_config if algo_config is not None else composed[0]
        generator_config = composed[1] if generator_config is None or choice is not None else generator_config
        trainer_config = trainer_config if trainer_config is not None else composed[2]
    check_pair(agent_cls, generator_config, algo_config)
    check_online(trainer_config.online, agent_cls, generator_config)  # before a model is fitted
    device = check_device(device, "build_run's device")
    generator_config.check_dataset(dataset, dynamics_path)  # e.g. enough rows for a model's fit, before anything
    if hasattr(agent_cls, "check_dataset"):  # the agent's settings against the data's sizes, before a fit too
        agent_cls.check_dataset(algo_config, dataset)
    torch.manual_seed(trainer_config.seed)
    generator = build_generator(generator_config, dataset, device, cache_dir, dynamics_path, trainer_config.progress)
    return assemble_run(agent_cls, algo_config, dataset, generator, trainer_config, device, callbacks)


def assemble_run(agent_cls, algo_config, dataset, generator, trainer_config: TrainerConfig, device: torch.device,
                 callbacks: Optional[list] = None, agent_state: Optional[dict] = None) -> Trainer:
    """The last step of `build_run` and `mbrl_offline.finetune.build_finetune`: the agent for ``dataset``
    (given the generator's dynamics model where its class declares it needs one: `check_pair`), its
    weights and optimiser states from ``agent_state`` where given (a checkpoint's), and the `Trainer`."""
    parts = {"dynamics": generator.dynamics} if agent_cls.needs_dynamics else {}
    agent = agent_cls.for_dataset(dataset, algo_config, device, **parts)
    if agent_state is not None:
        agent.load_state_dict(agent_state)
    return Trainer(agent, dataset, trainer_config, generator, callbacks)
