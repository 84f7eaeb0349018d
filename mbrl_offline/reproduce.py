"""A results table made by one command (`mbrl_offline.tools.reproduce`, ``mbrl-reproduce``): algorithms x
datasets x seeds trained at a named budget, then one page of results.

The grid is every registered agent (``algos: all``, in name order; `mbrl_offline.algorithms.ALGORITHMS`, so a new agent
joins it by registering) on each of ``datasets``, plus the pairs under ``also``, each with every seed of
``seeds``. Each run is the train tool's single run (`mbrl_offline.tools.train`) with ``algo=<name>
env=<the dataset's env> env.dataset=<dataset> budget=<budget> seed=<seed>`` and the command line's train
settings (`split_overrides`),
in its own folder ``<runs_dir>/<budget>/<algo>/<dataset>/seed<seed>`` (`plan_runs`). Run again, the
command keeps what is done (`run_state`): a finished run is read, not retrained; a run stopped after a
checkpoint resumes from it (``resume=true``: exactly where it was); a run without one starts afresh.

The page (`write_results`) holds the machine, the budget as the runs' own ``run.json`` files record it,
one row per run (its final score, updates and wall time: the sum of its epochs' ``epoch_seconds`` in
``metrics.jsonl``, which resume keeps; fitting the model before the first epoch is not in it), then the
report's tables and figures (`mbrl_offline.report.runs_sections`: scores with bootstrap intervals, the
aggregate over datasets, performance profiles, the probability of improvement, learning curves), the
figures beside the page with its name as their prefix.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from mbrl_offline.errors import ConfigError

STATES = ("finished", "stopped", "new")  # a run folder's state, `run_state`


@dataclass
class ReproduceConfig:
    """The grid (``mbrl_offline/configs/reproduce.yaml``)."""

    budget: str = "cpu"  # the budget every run takes (mbrl_offline/configs/budget/)
    seeds: list = field(default_factory=lambda: [0, 1, 2])
    algos: object = "all"  # "all": every registered agent; or a list of algo names
    datasets: list = field(default_factory=list)  # the datasets every one of ``algos`` runs on (bundled names)
    also: dict = field(default_factory=dict)  # more runs: algo name -> its datasets
    settings: list = field(default_factory=list)  # train settings for every run: ["device=cuda", ...]
    runs_dir: str = "runs/reproduce"  # the runs' folders: <runs_dir>/<budget>/<algo>/<dataset>/seed<seed>
    out: str = "docs/results.md"  # the results page; its figures beside it


@dataclass
class PlannedRun:
    algo: str
    dataset: str
    seed: int
    run_dir: Path
    overrides: list  # the train tool's overrides for this run

    @property
    def label(self) -> str:
        return f"{self.algo} {self.dataset} seed {self.seed}"


GRID_KEYS = ("budget", "seeds", "algos", "datasets", "also", "runs_dir", "out")  # reproduce.yaml's settings


def split_overrides(overrides: list[str]) -> tuple[list[str], list[str]]:
    """``(grid, settings)``: the command line's overrides of the grid (`GRID_KEYS`) and the train settings
    for every run (the rest)."""
    grid, settings = [], []
    for override in overrides:
        key = override.lstrip("+~").partition("=")[0].split(".")[0]
        (grid if key in GRID_KEYS else settings).append(override)
    return grid, settings


def reproduce_config(cfg, settings: list[str] = ()) -> ReproduceConfig:
    """The composed ``reproduce`` config as a `ReproduceConfig` with train ``settings`` for every run, each
    checked (one `ConfigError` line naming the setting and the fix)."""
    from omegaconf import OmegaConf

    from mbrl_offline.config_files import registered_families

    raw = OmegaConf.to_container(cfg, resolve=True)
    budget = (raw.get("budget") or {}).get("name")  # the budget group's choice (budget=paper)
    seeds = raw.get("seeds")
    if (not isinstance(seeds, list) or not seeds
            or any(not isinstance(s, int) or isinstance(s, bool) or s < 0 for s in seeds) or len(set(seeds)) < len(seeds)):
        raise ConfigError(f"seeds = {seeds!r}: give distinct whole numbers >= 0, e.g. seeds=[0,1,2].")
    agents = registered_families()[0]
    algos = raw.get("algos")
    if algos == "all":
        algos = sorted(agents)
    if not isinstance(algos, list) or any(not isinstance(a, str) for a in algos):
        raise ConfigError(f"algos = {algos!r}: write algos=all or a list of algo names, e.g. algos=[td3bc,iql].")
    datasets = raw.get("datasets") or []
    also = raw.get("also") or {}
    if not isinstance(datasets, list) or not isinstance(also, dict):
        raise ConfigError("datasets must be a list of dataset names and also a mapping of algo name to such a list, "
                          "e.g. datasets=[pendulum-medium] also='{td3bc: [hopper-medium]}'.")
    for name in list(algos) + list(also):
        if name not in agents:
            from mbrl_offline.config import did_you_mean

            raise ConfigError(f"unknown algo '{name}' in the grid.{did_you_mean(name, agents)} Known algos: "
                              f"{', '.join(agents)}.")
    for name, names in [("datasets", datasets)] + [(f"also.{a}", d) for a, d in also.items()]:
        if not isinstance(names, list) or any(not isinstance(d, str) for d in names):
            raise ConfigError(f"{name} = {names!r}: give a list of dataset names, e.g. [pendulum-medium].")
        for dataset in names:
            dataset_env(dataset, name)
    owned = {"algo": "algos", "env": "datasets", "env.dataset": "datasets", "seed": "seeds", "trainer.seed": "seeds",
             "trainer.run_dir": "runs_dir", "resume": None, "overwrite": None}
    for setting in settings:
        key = setting.lstrip("+~").partition("=")[0]
        if key in owned:
            instead = (f"set {owned[key]} instead" if owned[key] else
                       "run the command again to go on: finished runs are kept and stopped ones resumed")
            raise ConfigError(f"{setting}: the grid sets {key} for each run itself; {instead}.")
    for key in ("runs_dir", "out"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise ConfigError(f"{key} = {raw.get(key)!r}: give a path.")
    if not raw["out"].endswith(".md"):
        raise ConfigError(f"out = {raw['out']}: the results page is markdown; give a path ending in .md, "
                          f"e.g. out=docs/results.md.")
    return ReproduceConfig(budget, seeds, algos, datasets, also, list(settings), raw["runs_dir"], raw["out"])


def dataset_env(dataset: str, setting: str = "datasets") -> str:
    """The env of a bundled dataset named ``<env>-<level>`` (the longest env name it starts with:
    ``inverted-pendulum-medium`` is inverted-pendulum's)."""
    from mbrl_offline.data.envs import ENVS
    from mbrl_offline.data.sources import bundled_datasets

    if dataset not in bundled_datasets():
        from mbrl_offline.config import did_you_mean

        raise ConfigError(f"{setting}: '{dataset}' is not a bundled dataset.{did_you_mean(dataset, bundled_datasets())} "
                          f"Bundled: {', '.join(bundled_datasets())}.")
    envs = [name for name in ENVS if dataset.startswith(name + "-")]
    return max(envs, key=len)


def plan_runs(config: ReproduceConfig) -> list[PlannedRun]:
    """Every run of the grid, in order: algorithm, then dataset, then seed."""
    pairs = [(algo, dataset) for algo in config.algos for dataset in config.datasets]
    pairs += [(algo, dataset) for algo, datasets in config.also.items() for dataset in datasets
              if (algo, dataset) not in pairs]
    runs = []
    for algo, dataset in pairs:
        for seed in config.seeds:
            run_dir = Path(config.runs_dir) / config.budget / algo / dataset / f"seed{seed}"
            overrides = [f"algo={algo}", f"env={dataset_env(dataset)}", f"env.dataset={dataset}",
                         f"budget={config.budget}", f"seed={seed}", *config.settings]
            runs.append(PlannedRun(algo, dataset, seed, run_dir, overrides))
    return runs


def run_state(run_dir: Path, epochs: int) -> str:
    """``finished`` (its metrics reach epoch ``epochs`` and its checkpoint is there), ``stopped`` (a
    checkpoint to resume from) or ``new`` (no checkpoint: it starts afresh; the train tool refuses a folder
    that holds another run's files)."""
    from mbrl_offline.logging import LogError, read_jsonl

    if not (run_dir / "checkpoint.pt").is_file():
        return "new"
    try:
        records = read_jsonl(run_dir / "metrics.jsonl")
    except (FileNotFoundError, LogError):
        return "stopped"
    return "finished" if records and records[-1]["epoch"] >= epochs and "eval" in records[-1] else "stopped"


def run_seconds(run_dir: Path) -> Optional[float]:
    """A run's wall time: the sum of its epochs' ``epoch_seconds`` (None for logs without them)."""
    from mbrl_offline.logging import read_jsonl

    seconds = [r.get("speed", {}).get("epoch_seconds") for r in read_jsonl(run_dir / "metrics.jsonl")]
    return None if not seconds or any(s is None for s in seconds) else float(sum(seconds))


def machine() -> str:
    """This machine, for the record: the CPU (`mbrl_offline.platform.cpu_name`), its cores, torch's version, and
    the GPU where there is one."""
    import torch

    from mbrl_offline.platform import cpu_name

    gpu = f"; GPU: {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""
    return f"{cpu_name()}, {os.cpu_count()} cores; torch {torch.__version__}{gpu}"


def _schedule(info: dict) -> str:
    """A run's schedule from its run.json: updates, evaluations, and its generator's amount of data."""
    trainer = info.get("trainer", {})
    text = (f"{trainer.get('epochs')} x {trainer.get('updates_per_epoch')} updates, "
            f"{trainer.get('eval_episodes')}-episode evaluations every {trainer.get('eval_every')} epochs")
    if trainer.get("final_eval_episodes"):
        text += f" (the last of {trainer['final_eval_episodes']})"
    generator = info.get("generator") or {}
    rollout = generator.get("rollout") or {}
    if generator.get("kind") == "rollouts":
        text += (f"; {rollout.get('rollouts_per_epoch')} rollouts of horizon {rollout.get('horizon')} every "
                 f"{generator.get('every')} updates")
    elif generator.get("kind"):
        text += f"; generator {generator['kind']}"
    return text


def _commit(info: dict) -> str:
    """The short commit a run's latest session ran (``run.json``'s ``code``), ``+`` where tracked files differed
    from it; ``-`` where it was not recorded (an installed package, or a run older than the record)."""
    code = info.get("code") or {}
    if not code.get("commit"):
        return "-"
    return code["commit"][:7] + ("+" if code.get("modified") else "")


def write_results(config: ReproduceConfig, planned: list[PlannedRun], command: str, elapsed: float) -> Path:
    """The results page (``config.out``) from the grid's finished runs, with its figures beside it; a run
    that did not finish is listed as missing. Each file is written whole or not at all."""
    from mbrl_offline.report import read_run, runs_sections
    from mbrl_offline.utils import atomic_write_bytes

    out = Path(config.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    finished, missing = [], []
    for run in planned:
        epochs = (json.loads((run.run_dir / "run.json").read_text()).get("trainer", {}).get("epochs")
                  if (run.run_dir / "run.json").is_file() else None)
        if epochs is not None and run_state(run.run_dir, epochs) == "finished":
            finished.append((run, read_run(run.run_dir)))
        else:
            missing.append(run)
    lines = ["# Results", "",
             f"Made by `{command}` on {time.strftime('%Y-%m-%d')}: {len(finished)} of {len(planned)} runs finished "
             f"(this invocation took {elapsed / 60:.0f} min).", "",
             f"Machine: {machine()}.", "",
             f"Budget `{config.budget}` (mbrl_offline/configs/budget/{config.budget}.yaml) with the agents' "
             f"published settings" + (f" and {' '.join(config.settings)}" if config.settings else "")
             + ". These schedules are far shorter than the papers': `budget=paper` runs the published ones (see "
             "docs/sweeps.md, \"A results table\"). Scores are D4RL-normalised (0: random, 100: expert).", ""]
    if missing:
        lines += ["Not finished (run the command again to resume them): "
                  + ", ".join(r.label for r in missing) + ".", ""]
    if finished:
        schedules: dict[str, list[str]] = {}
        for run, result in finished:
            schedules.setdefault(_schedule(result.info), []).append(f"{run.algo} {run.dataset}")
        lines += ["## Schedules", "", "| schedule | runs |", "| --- | --- |"]
        for schedule, names in schedules.items():
            lines.append(f"| {schedule} | {', '.join(sorted(set(names)))} |")
        lines += ["", "## Every run", "",
                  "Wall time: the run's epochs (updates, generation, evaluation), summed over its sessions; the "
                  "model's fit before the first epoch is not in it (a fitted model is cached and shared). Commit: "
                  "the code of the run's latest session (+: with changes not yet committed; -: not recorded).", "",
                  "| algorithm | dataset | seed | final score | updates | wall time (min) | commit |",
                  "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
        for run, result in finished:
            seconds = run_seconds(run.run_dir)
            lines.append(f"| {run.algo} | {run.dataset} | {run.seed} | {result.scores[-1]:.1f} | {result.steps[-1]:,} | "
                         f"{'-' if seconds is None else f'{seconds / 60:.1f}'} | {_commit(result.info)} |")
        lines += [""] + runs_sections([result for _, result in finished], out.parent, f"{out.stem}-")
    atomic_write_bytes(out, "\n".join(lines))
    return out


__all__ = ["ReproduceConfig", "PlannedRun", "reproduce_config", "split_overrides", "plan_runs", "run_state", "write_results", "machine"]
