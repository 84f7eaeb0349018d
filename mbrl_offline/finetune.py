"""Fine-tuning a trained agent on new data: `build_finetune` (``mbrl-finetune``, `mbrl_offline.tools.finetune`).

A fine-tuning run starts from a training checkpoint's agent (its weights, optimiser states and settings)
and trains it further, in a new run folder, on:

- ``data="append"`` (the default): the checkpoint's own dataset with the new rows after it (an enlarged
  dataset, as when more data has been logged: d3rlpy#215), or
- ``data="replace"``: the new dataset alone.

The new data must be of the checkpoint's env, with its observation and action widths. The checkpoint's
generator keeps its settings; its model is, with ``model="refit"`` (the default), fitted on the
fine-tuning data (or loaded from the cache where that data's model was fitted before), or, with
``model="keep"``, the checkpoint's own model (from the cache or ``dynamics_path``; its fingerprint must
match the checkpoint's) with the generator's state as the checkpoint's run ended (its ``state_dict``: a
model refitted during online fine-tuning, RAMBO's adversarially trained copy, MOReL's halt threshold,
PGD's generation count). The synthetic buffer starts empty and is filled by the first generation, as at
the start of any run. The trainer's settings are the checkpoint's, with ``trainer_settings`` over them and
the run folder the caller's; the epoch count starts again at 0, and schedules over the run's updates
(NEUBAY's cosine learning rates) run over the fine-tuning updates. The agent's own statistics of the data
(TD3+BC's observation normalisation, ...) are the checkpoint's, as its networks were trained with them.

With ``trainer_settings={"online": {"enabled": True}}`` (``online=true`` on the command line) the agent
also acts in the real env during the run, each transition added to the real data after the offline rows
(`mbrl_offline.online`: exploration, the offline ratio, the episodes, the records).

``run.json`` records where the run came from (``finetuned_from``: the checkpoint, its epoch, the data,
its rule, the model rule and whether it ran online), besides every setting. A fine-tuning run is an ordinary run: resume,
TensorBoard, trackers, reports and sweeps work on it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

DATA_RULES = ("append", "replace")
MODEL_RULES = ("refit", "keep")
PENALTY_RULES = ("keep", "off")


def check_finetune_settings(data: str, model: str, penalty: str = "keep") -> None:
    from mbrl_offline.errors import ConfigError

    if data not in DATA_RULES:
        raise ConfigError(f"data={data}: the data rules are append (the checkpoint's data plus the new rows) and "
                          f"replace (the new data alone).")
    if model not in MODEL_RULES:
        raise ConfigError(f"model={model}: the model rules are refit (fit the generator's model on the fine-tuning "
                          f"data) and keep (the checkpoint's model).")
    if penalty not in PENALTY_RULES:
        raise ConfigError(f"penalty={penalty}: the penalty rules are keep (the checkpoint's settings) and off (the "
                          f"agent's and the generator's conservatism turned off).")


def without_penalty(agent_cls, algo_config, generator_config):
    """``penalty=off``: the agent's settings with its ``penalty_off`` values (`mbrl_offline.roles.AgentClass`)
    and the generator's `without_penalty` settings; returns both and the names of the settings changed."""
    from dataclasses import asdict, replace

    agent_off = replace(algo_config, **getattr(agent_cls, "penalty_off", {}))
    generator_off = generator_config.without_penalty()
    changed = [f"algo.{k}" for k in _changed(asdict(algo_config), asdict(agent_off))]
    changed += [f"generator.{k}" for k in _changed(asdict(generator_config), asdict(generator_off))]
    return agent_off, generator_off, changed


def _changed(before: dict, after: dict) -> list[str]:
    """The dotted names of the leaves that differ between two nested dicts of the same keys."""
    names = []
    for key, value in after.items():
        if isinstance(value, dict):
            names += [f"{key}.{name}" for name in _changed(before[key], value)]
        elif before[key] != value:
            names.append(key)
    return names


def concatenate(first, second, source: str):
    """The rows of dataset ``first`` then ``second`` as one `OfflineDataset` (``first``'s env, reference
    scores and metadata); every episode of ``first`` ends where it did (its last row is a terminal or a
    cut), so no episode runs across the join."""
    import numpy as np

    from mbrl_offline.data.dataset import OfflineDataset

    fields = ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts")
    joined = {name: np.concatenate([getattr(first, name), getattr(second, name)]) for name in fields}
    return OfflineDataset(**joined, env_name=first.env_name, env_id=first.env_id, ref_min_score=first.ref_min_score,
                          ref_max_score=first.ref_max_score, source=source,
                          metadata={"parts": [first.source, second.source]})


def finetune_data(state: dict, checkpoint: Path, dataset: Optional[str], data: str, model: str):
    """The fine-tuning data, and the checkpoint's own dataset where it is needed (appended to, or the data
    the kept model was fitted on; loaded from its recorded source and checked against its fingerprint);
    each refusal is one line naming the fix."""
    from mbrl_offline import load_dataset
    from mbrl_offline.data.envs import get_env_info
    from mbrl_offline.errors import CheckpointError, ConfigError, MbrlOfflineError

    env = state["env"]
    source = state["dataset"]["source"]
    original = None
    if data == "append" or dataset is None or model == "keep":
        try:
            original = load_dataset(source, env=env)
        except MbrlOfflineError as exc:
            raise CheckpointError(f"{checkpoint} was trained on {source}, which cannot be loaded here ({exc}); "
                                  f"give the new data with data=replace model=refit.") from None
        if original.fingerprint() != state["dataset"]["fingerprint"]:
            raise CheckpointError(f"{checkpoint} was trained on {source}, but that dataset has changed since; give "
                                  f"the new data with data=replace model=refit.")
    if dataset is None:
        if data == "replace":
            raise ConfigError("data=replace needs the new data: dataset=<a bundled name, a D4RL .hdf5 file or a "
                              "Minari id>.")
        return original, original
    new = load_dataset(dataset)
    if new.env_name is None:
        new = load_dataset(dataset, env=env)  # data without an env of its own: it is the checkpoint's
    info = get_env_info(env)
    if new.env_name not in (None, env) or new.obs_dim != info.obs_dim or new.act_dim != info.act_dim:
        raise ConfigError(f"dataset={dataset} is {new.env_name or 'an unknown env'}'s data ({new.obs_dim} observation "
                          f"and {new.act_dim} action columns), but {checkpoint} is a {env} agent ({info.obs_dim} and "
                          f"{info.act_dim}); fine-tune on {env} data.")
    if data == "replace":
        return new, original
    return concatenate(original, new, f"{source} + {new.source}"), original


def finetune_settings(checkpoint: str | Path, data: str = "append", model: str = "refit",
                      trainer_settings: Optional[dict] = None, penalty: str = "keep"):
    """The settings a fine-tuning run of ``checkpoint`` would have, checked before any data is loaded or
    model fitted: ``(state, agent class, algo config, generator config, trainer config, settings that
    penalty=off changed)``. `build_finetune` starts with it; a fine-tuning sweep (``mbrl-sweep
    checkpoint=...``) checks its search space's extremes with it before the first trial."""
    from dataclasses import asdict

    from mbrl_offline.algorithms import get_algorithm
    from mbrl_offline.checkpoint import read_checkpoint, saved_settings
    from mbrl_offline.compose import check_pair
    from mbrl_offline.config import config_to_dataclass
    from mbrl_offline.generators import GENERATORS
    from mbrl_offline.online import check_online
    from mbrl_offline.trainer import TrainerConfig

    check_finetune_settings(data, model, penalty)
    checkpoint = Path(checkpoint)
    state = read_checkpoint(checkpoint)
    agent_cls, config_cls = get_algorithm(state["algorithm"])
    algo_config = saved_settings(config_cls, state["agent"]["config"], checkpoint, "algo")
    saved_generator = state.get("generator_config") or {"kind": "none"}
    generator_config = saved_settings(GENERATORS[saved_generator["kind"]][0], saved_generator, checkpoint, "generator")
    saved_trainer = asdict(saved_settings(TrainerConfig, state["trainer_config"], checkpoint, "trainer"))
    given = dict(trainer_settings or {})
    if isinstance(given.get("online"), dict):  # a section: the given settings over the checkpoint's
        given["online"] = {**saved_trainer["online"], **given["online"]}
    trainer_config = config_to_dataclass(TrainerConfig, {**saved_trainer, **given}, "trainer")
    changed = []
    if penalty == "off":
        algo_config, generator_config, changed = without_penalty(agent_cls, algo_config, generator_config)
    check_pair(agent_cls, generator_config, algo_config)
    check_online(trainer_config.online, agent_cls, generator_config)  # before a model is fitted
    return state, agent_cls, algo_config, generator_config, trainer_config, changed


def build_finetune(checkpoint: str | Path, dataset: Optional[str] = None, data: str = "append", model: str = "refit",
                   trainer_settings: Optional[dict] = None, device: str | torch.device = "cpu",
                   cache_dir: Optional[str | Path] = None, dynamics_path: Optional[str | Path] = None,
                   callbacks: Optional[list] = None, penalty: str = "keep"):
    """The `Trainer` that fine-tunes ``checkpoint``'s agent on ``dataset`` (a bundled name, a D4RL .hdf5
    file or a Minari id; None: the checkpoint's own data) by rule ``data`` (``append``, ``replace``), with its
    generator's model by rule ``model`` (``refit``, ``keep``), and the trainer settings ``trainer_settings``
    (``{"run_dir": ..., "epochs": ..., "online": {"enabled": True}}``; a section's settings over the
    checkpoint's section) over the checkpoint's, and the agent's and the generator's conservatism kept
    (``penalty="keep"``) or turned off (``"off"``, `without_penalty`). Call ``train()`` on it."""
    from mbrl_offline.checkpoint import model_fingerprint
    from mbrl_offline.compose import assemble_run
    from mbrl_offline.config import check_device
    from mbrl_offline.errors import CheckpointError
    from mbrl_offline.generators import build_generator

    checkpoint = Path(checkpoint)
    state, agent_cls, algo_config, generator_config, trainer_config, changed = finetune_settings(
        checkpoint, data, model, trainer_settings, penalty)
    device = check_device(device, "build_finetune's device")
    data_set, original = finetune_data(state, checkpoint, dataset, data, model)
    torch.manual_seed(trainer_config.seed)
    if model == "keep" and generator_config.kind != "none":
        generator = build_generator(generator_config, original, device, cache_dir, dynamics_path,
                                    trainer_config.progress)
        if model_fingerprint(generator.model.state_dict()) != state["generator"]["model"]:
            raise CheckpointError(f"model=keep: the {generator_config.kind} model found (cache or dynamics_path) is not "
                                  f"the one {checkpoint} was trained with; give that model with dynamics_path=, or "
                                  f"use model=refit.")
        generator.load_state_dict(state["generator"]["state"])  # the generator as the checkpoint's run ended
    else:
        generator_config.check_dataset(data_set, dynamics_path)
        generator = build_generator(generator_config, data_set, device, cache_dir, dynamics_path, trainer_config.progress)
    trainer = assemble_run(agent_cls, algo_config, data_set, generator, trainer_config, device, callbacks,
                           agent_state=state["agent"])
    trainer.origin = {"finetuned_from": {"checkpoint": str(checkpoint), "epoch": state["epoch"],
                                         "dataset": dataset or state["dataset"]["source"], "data": data,
                                         "model": model if generator is not None else None,
                                         "online": trainer.online is not None, "penalty": penalty,
                                         "penalty_off": changed}}
    return trainer


__all__ = ["build_finetune", "finetune_settings", "concatenate", "check_finetune_settings", "without_penalty", "DATA_RULES", "MODEL_RULES",
           "PENALTY_RULES"]
