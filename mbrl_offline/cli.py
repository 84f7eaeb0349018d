"""Helpers for the command-line tools in `mbrl_offline.tools` and `mbrl_offline.experiments` (Hydra stays at
that edge).

The tools run as console scripts (``mbrl-train``), as ``python -m mbrl_offline train`` and as
``python examples/train.py``; their configs are the package's (`mbrl_offline.config.CONFIG_DIR`).

`compose` builds a run's config from Hydra's groups and the overrides; `cli_main` makes every library
error a single ``error: ...`` line on stderr and exit status 2. The conversion of configs to and from
dicts is the library's (`mbrl_offline.config`; the library never imports this module).

Every tool has the same command line (`tool_config`): ``--help``, ``--cfg job`` and Hydra overrides,
where a value Hydra's grammar cannot read, such as a file path with non-ASCII characters, is taken whole
as a string (`quote_overrides`).
"""
from __future__ import annotations

import dataclasses
import functools
import os
import sys
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

from mbrl_offline import platform
from mbrl_offline.config import check_writable_dir, config_path_shown
from mbrl_offline.config_files import TrainSettings, compose, quote_overrides, top_level_settings, train_sections
from mbrl_offline.errors import ConfigError, MbrlOfflineError

F = TypeVar("F", bound=Callable[..., Any])


def cli_main(fn: F) -> F:
    """A tool's ``main(argv=None)``: ``argv`` defaults to the process's arguments (``sys.argv[1:]``), as a
    console script calls it. Before the tool runs, the platform settings asked for in the environment are
    applied (`mbrl_offline.platform.apply_environment`: the tools import torch only inside ``main``, so this
    comes before torch loads); library errors are printed as one line and exit with status 2 instead of a
    traceback. The tool runs in `mbrl_offline.platform.interrupts_kept`, so that no Ctrl-C is lost."""

    @functools.wraps(fn)
    def wrapper(argv: "list[str] | None" = None):
        try:
            platform.check_environment()
            platform.apply_environment()
            with platform.interrupts_kept():  # a Ctrl-C lost in a weakref callback still stops the tool
                return fn(list(sys.argv[1:] if argv is None else argv))
        except MbrlOfflineError as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            sys.exit(2)

    return wrapper  # type: ignore[return-value]


def resolve_train_config(cfg):
    """The parts of a composed ``train`` config, each checked: ``(agent class, algorithm config,
    generator config, trainer config, env info)``. Raises `ConfigError` on any bad key or value, on
    a generator the agent cannot learn from, on a preset made for another algorithm or env, on a device
    this machine lacks and on a run folder or model cache that cannot be written (`check_run_settings`,
    `mbrl_offline.config.check_writable_dir`)."""
    from mbrl_offline.compose import check_pair
    from mbrl_offline.data.envs import get_env_info

    env = get_env_info(cfg.env.name)
    check_preset(cfg, env.name, cfg.env.get("dataset") or env.default_dataset)
    check_run_settings(cfg)
    agent_cls, algo_config, gen_config, trainer_config = train_sections(cfg)
    check_pair(agent_cls, gen_config, algo_config)
    check_writable_dir(trainer_config.run_dir, "trainer.run_dir")
    fitted = gen_config.fitted_model()  # the cache folder of a model that will be fitted (declared)
    if fitted is not None and not cfg.get("dynamics_path"):
        from mbrl_offline.cache import cache_root

        # (a read-only cache may still hold the model: only a path that can never be a folder is refused)
        check_writable_dir(cfg.get("dynamics_cache") or cache_root() / fitted, "dynamics_cache", permissions=False)
    return agent_cls, algo_config, gen_config, trainer_config, env


def check_preset(cfg, env_name: str, dataset: "str | None" = None) -> None:
    """Refuse a preset (mbrl_offline/configs/preset/) on a run it was not made for: each names the algorithm
    (``preset_for``), the env (``preset_env``) and the dataset (``preset_dataset``) whose published
    settings it holds. ``dataset`` is the run's dataset as named (a bundled name, a D4RL file, a
    Minari id); ``preset_dataset=null`` applies the preset to other data on purpose."""
    preset_for = cfg.get("preset_for")
    if preset_for is not None and preset_for != cfg.algo.name:
        raise ConfigError(f"that preset holds {preset_for} settings, not {cfg.algo.name}'s; "
                          f"use algo={preset_for} or a {cfg.algo.name}-... preset.")
    preset_env = cfg.get("preset_env")
    made_for = cfg.get("preset_dataset")
    if preset_env is not None and preset_env != env_name:
        raise ConfigError(f"that preset holds the settings published for {made_for or preset_env}, not for env "
                          f"{env_name}; use env={preset_env}, or a {cfg.algo.name}-{env_name}-... preset, or no preset.")
    if made_for is not None and dataset is not None and dataset_name(dataset) != made_for:
        raise ConfigError(f"that preset holds the settings published for {made_for}, but the data is {dataset}; "
                          f"use env.dataset={made_for} (or its D4RL file), a {cfg.algo.name}-{dataset_name(dataset)} "
                          f"preset, or preset_dataset=null to apply these settings to this data.")


def dataset_name(spec: str) -> str:
    """The D4RL-style name (``hopper-medium-replay``) of a dataset as a run names it: a bundled name,
    a D4RL file (``hopper_medium_replay-v2.hdf5``) or a Minari id (``mujoco/hopper/medium-v0``)."""
    import re

    for prefix in ("bundled:", "d4rl:", "minari:"):
        if spec.startswith(prefix):
            spec = spec[len(prefix):]
    if spec.lower().endswith((".hdf5", ".h5")):
        spec = Path(spec).stem
    elif "/" in spec:  # a Minari id: namespace/env/level-vN
        spec = "-".join(spec.split("/")[-2:])
    return re.sub(r"-v\d+$", "", spec.lower().replace("_", "-"))


def check_run_settings(cfg) -> None:
    """The run-wide settings of a ``train`` config (outside the dataclasses): their types (`TrainSettings`,
    as `compose` checks them), the seed, torch's thread count and the device
    (`mbrl_offline.config.check_device`), each refused in one line."""
    from mbrl_offline.config import check_device, require_nonnegative

    top = top_level_settings(cfg, TrainSettings)
    require_nonnegative(top, "seed", section="")
    require_nonnegative(top, "torch_threads", section="", hint=" (0 or null: torch's default)")
    check_device(top.device)


def build_trainer(cfg, callbacks=None):
    """The `Trainer` that a composed ``train`` config describes (the train tool, `mbrl_offline.tools.train`): the
    dataset, the agent, its generator with its model (trained or from the cache) and the trainer settings
    (`mbrl_offline.build_run`)."""
    import torch

    from mbrl_offline import load_dataset
    from mbrl_offline.compose import build_run
    from mbrl_offline.trainer import check_run_dir

    agent_cls, algo_config, gen_config, trainer_config, env = resolve_train_config(cfg)
    # before the data is loaded and a model fitted: a folder holding an earlier run is refused now
    check_run_dir(trainer_config.run_dir, resume=cfg.get("resume", False), overwrite=cfg.get("overwrite", False))
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    if cfg.keep_freed_memory and torch.device(cfg.device).type == "cpu":
        platform.keep_freed_memory()
    dataset = load_dataset(cfg.env.dataset or env.default_dataset, env=env.name)
    print(f"{agent_cls.__name__} on {dataset.source} ({len(dataset)} transitions, data score "
          f"{dataset.summary()['normalized_score_mean']:.1f}), generator {gen_config.kind}; run folder "
          f"{trainer_config.run_dir}", flush=True)
    if torch.device(cfg.device).type == "cpu" and (advice := platform.advice()):
        print(advice, flush=True)
    return build_run(agent_cls.name, dataset, algo_config, gen_config, trainer_config, cfg.device,
                     cache_dir=cfg.dynamics_cache, dynamics_path=cfg.dynamics_path, callbacks=callbacks)


# ------------------------------------------------------------------------------------ the tools' command line
# Every tool (mbrl_offline/tools/, mbrl_offline/experiments/) takes the same command line: ``--help``/``-h``, ``--cfg job`` and Hydra overrides
# (``group=option``, ``key=value``), parsed here once. `tool_config` is the whole of it for a tool with one
# config; `parse_command_line`, `print_config` and `tool_help` are its parts, for tools that compose several
# configs (edge_of_reach.py); `ToolArgumentParser` gives the tools that take options (report.py) the same habits.

@dataclasses.dataclass(frozen=True)
class Tool:
    """One command-line tool: its module, whose ``main(argv=None)`` runs it and whose docstring is its
    ``--help`` text; its script in a checkout's ``examples/``; and one line on what it does."""

    module: str
    example: str
    summary: str


# The command-line tools, the one list of them: ``python -m mbrl_offline <name>`` dispatches from it
# (mbrl_offline/__main__.py), and setup.cfg's console scripts are ``mbrl-<name>`` for each (a test checks
# that the two agree).
TOOLS = {
    "train": Tool("mbrl_offline.tools.train", "train.py", "train an agent (with its generator) on a dataset"),
    "sweep": Tool("mbrl_offline.tools.sweep", "sweep.py", "tune an agent's settings with Optuna"),
    "evaluate": Tool("mbrl_offline.tools.evaluate", "evaluate.py", "evaluate a trained policy in the real env"),
    "collect": Tool("mbrl_offline.tools.collect", "collect.py", "make D4RL-style datasets for an env"),
    "report": Tool("mbrl_offline.tools.report", "report.py", "score tables and learning curves of runs and sweeps"),
    "export": Tool("mbrl_offline.tools.export", "export.py", "a trained policy as a TorchScript or ONNX file"),
    "finetune": Tool("mbrl_offline.tools.finetune", "finetune.py", "fine-tune a trained agent on new data"),
    "reproduce": Tool("mbrl_offline.tools.reproduce", "reproduce.py",
                      "train algorithms x datasets x seeds at a budget and write the results page"),
    "inspect": Tool("mbrl_offline.tools.inspect_dataset", "inspect_dataset.py",
                    "check and summarise a dataset, export it to D4RL HDF5"),
    "bandit": Tool("mbrl_offline.experiments.bandit", "bandit.py", "NEUBAY's bandit illustration (an experiment)"),
    "dynamics-error": Tool("mbrl_offline.experiments.dynamics_error", "dynamics_error.py",
                           "PGD's dynamics error against a world model's (an experiment)"),
    "edge-of-reach": Tool("mbrl_offline.experiments.edge_of_reach", "edge_of_reach.py",
                          "MOPO and RAVL with learned and true dynamics (an experiment)"),
}
MODULE_PROG = "python -m mbrl_offline"  # how `python -m mbrl_offline <tool>` names itself in sys.argv[0]


def console_script(tool: str) -> str:
    """The console script of tool ``tool``: ``mbrl-train``."""
    return f"mbrl-{tool}"


def invoked_as(tool: str | None = None) -> str:
    """How the running tool was started, as its usage line and messages show it: ``mbrl-train`` (a
    console script), ``python -m mbrl_offline train`` or ``python examples/train.py``. With ``tool``, how
    to start that tool the same way (``invoked_as("report")`` in ``mbrl-sweep`` is ``mbrl-report``)."""
    argv0 = sys.argv[0] if sys.argv else ""
    name = Path(argv0).name
    if argv0.startswith(MODULE_PROG + " "):  # set by mbrl_offline/__main__.py
        return f"{MODULE_PROG} {tool}" if tool else argv0
    if name.startswith("mbrl-") and not name.endswith(".py"):
        return console_script(tool) if tool else name
    return f"python examples/{TOOLS[tool].example if tool else (name or 'train.py')}"


HELP_FLAGS = ("-h", "--help")
CFG_FLAGS = ("-c", "--cfg")

# Where each config section's settings are documented: the dataclass they fill, or the config files.
# The algo and generator sections are written from the registries (`setting_docs`).
SETTING_DOCS = {
    "trainer": "the fields of TrainerConfig (mbrl_offline/trainer.py)",
    "env": "env.name and env.dataset (a bundled name, D4RL .hdf5 file or Minari id; null: the env's default), "
           f"{config_path_shown('env', '<name>.yaml')}; the env registry is mbrl_offline/data/envs.py",
    "budget": f"a training schedule, {config_path_shown('budget', '<name>.yaml')} (trainer.* settings, and under "
              "budget.when settings for some runs only)",
    "preset": f"published per-dataset settings, {config_path_shown('preset', '<algo>-<env>-<dataset>.yaml')}",
    "sweep": "the fields of SweepConfig (mbrl_offline/tune.py); the search space is sweep.space",
    "collect": "the fields of CollectConfig (mbrl_offline/collect.py)",
    "bandit": "the fields of BanditConfig (mbrl_offline/experiments/bandit_parts.py); bandit=cpu (CPU sizes) or bandit=paper (the "
              f"official sizes), {config_path_shown('bandit', '<name>.yaml')}",
}


@functools.lru_cache(maxsize=None)
def setting_docs() -> dict[str, str]:
    """`SETTING_DOCS` with the ``algo`` and ``generator`` sections, each naming the config dataclass of
    every registered algorithm and generator kind and the module that holds it (so that a new one
    appears in every tool's ``--help`` without an edit here)."""
    from mbrl_offline.config_files import registered_families

    def where(cls) -> str:  # the class's file, from the package's folder on (a plugin's: its module)
        path = Path(sys.modules[cls.__module__].__file__).resolve()
        root = Path(__file__).resolve().parent.parent
        if not path.is_relative_to(root):
            return f"{cls.__module__}.{cls.__name__}"
        return f"{path.relative_to(root).as_posix()}: {cls.__name__}"

    def fields(cls) -> str:  # generator.<name>, and generator.<name>.* for a nested config
        defaults = cls()
        return ", ".join(f"generator.{f.name}{'.*' if dataclasses.is_dataclass(getattr(defaults, f.name)) else ''}"
                         for f in dataclasses.fields(cls) if f.name != "kind")

    agents, generators = registered_families()
    algos = "; ".join(f"algo={name}: {where(config)}" for name, (_, config) in agents.items())
    kinds = "; ".join(f"generator={kind}: {where(config)} ({fields(config) or 'no settings'})"
                      for kind, (config, _) in generators.items())
    return {**SETTING_DOCS,
            "algo": f"the fields of the algorithm's config dataclass ({algos})",
            "generator": f"the fields of the generator kind's config dataclass ({kinds}); generator=<algo> starts "
                         "from that algorithm's published generator (its published_generator())"}

QUOTING_NOTE = ("Values are read as Hydra overrides (lists key=[a,b], interpolations ${...}, quotes 'a b'); a "
                "value Hydra's grammar cannot read as written, such as a file path with spaces, non-ASCII "
                "characters, '=' or ',' (in the shell: key='/tmp/runs/été 1'), is taken "
                "whole as a string.")


def tool_config(argv: list[str], doc: str, config_dir, config_name: str, extra_settings: dict | None = None):
    """A tool's command line, the same for every tool: ``--help`` prints `tool_help` and
    exits 0; ``--cfg job`` prints the composed config (`compose`: budget settings applied) as YAML and
    exits 0; anything else is Hydra overrides, and the composed config is returned."""
    overrides, show = parse_command_line(argv, doc, config_dir, config_name, extra_settings)
    cfg = compose(config_dir, config_name, overrides)
    if show:
        print_config(cfg)
    return cfg


def parse_command_line(argv: list[str], doc: str, config_dir, config_name: str,
                       extra_settings: dict | None = None, multirun_ok: bool = False, launches: bool = False):
    """``(overrides, cfg_job)``: the Hydra overrides of ``argv`` and whether ``--cfg job`` (also
    ``-c job``, ``--cfg=job``) asked for the composed config; with ``multirun_ok`` (the tools that run
    grids, `tool_runs`), ``(overrides, cfg_job, multirun)`` with whether ``-m``/``--multirun`` was given.
    Hydra's own settings (``hydra/launcher=``) need ``-m``, except in a tool that always launches its runs
    through Hydra (``launches``: `mbrl_offline.tools.reproduce`).
    ``--help``/``-h`` prints `tool_help` and exits 0 before anything else; ``--resolve`` is accepted (the
    config is always resolved); any other ``-option`` is a `ConfigError`."""
    if any(a in HELP_FLAGS for a in argv):
        print(tool_help(doc, config_dir, config_name, extra_settings))
        sys.exit(0)
    overrides, cfg_job, multirun, rest = [], False, False, list(argv)
    while rest:
        arg = rest.pop(0)
        name, eq, value = arg.partition("=")
        if name in CFG_FLAGS:
            if not eq:
                value = rest.pop(0) if rest else ""
            if value != "job":
                raise ConfigError(f"{name} {value or '(nothing)'}: these tools print only the job's config "
                                  f"(they have no Hydra settings of their own); write {name} job.")
            cfg_job = True
        elif arg == "--resolve":
            continue
        elif arg in ("-m", "--multirun"):
            if launches:  # its runs always go through Hydra's launcher
                continue
            if not multirun_ok:
                raise ConfigError(f"{arg}: this tool runs one job; grids of runs are for the train and evaluate "
                                  f"tools, and a search over settings is the sweep tool ({invoked_as('sweep')}).")
            multirun = True
        elif arg.startswith("-"):
            raise ConfigError(f"unknown option '{arg}'; the tools take --help, --cfg job and setting=value "
                              f"overrides (see --help).")
        else:
            overrides.append(arg)
    if not multirun and not launches and any(is_hydra_override(o) for o in overrides):
        raise ConfigError(f"{next(o for o in overrides if is_hydra_override(o))}: Hydra's own settings (hydra/launcher=, "
                          f"hydra.*) apply to grids of runs; add -m, e.g. -m seed=0,1,2 hydra/launcher=joblib.")
    return (overrides, cfg_job, multirun) if multirun_ok else (overrides, cfg_job)


def print_config(cfg) -> None:
    """Print a config (a composed DictConfig or a plain dict) as YAML and exit 0: ``--cfg job``."""
    from omegaconf import OmegaConf

    print(OmegaConf.to_yaml(OmegaConf.create(cfg) if isinstance(cfg, dict) else cfg), end="", flush=True)
    sys.exit(0)


# ------------------------------------------------------------------------------------ grids of runs (-m)
# ``mbrl-train -m seed=0,1,2 algo=td3bc,iql`` runs every combination, as Hydra's multirun does, through
# Hydra's launchers (``hydra/launcher=basic|joblib|submitit_local|submitit_slurm|ray``, the plugins
# installed). Every run is composed and checked here first, exactly as a single run is, so that one bad
# value in a grid of 30 is refused before the first run starts; then Hydra launches the runs, each of
# which is the tool's single-run job on its own config (its own run folder, resume, one-line errors).
# A run that fails is reported and the others go on.

def is_hydra_override(override: str) -> bool:
    """Whether ``override`` sets one of Hydra's own settings (``hydra/launcher=joblib``, ``hydra.sweep.dir=``)."""
    key = str(override).lstrip("+~").partition("=")[0]
    return key == "hydra" or key.startswith(("hydra.", "hydra/"))


def sweep_jobs(overrides: list[str]) -> list[list[str]]:
    """The runs of a grid: Hydra's basic sweeper's expansion of ``overrides`` (``seed=0,1,2``,
    ``range(0,3)``, ``glob(...)``; a ``key=a,b`` on each of several keys gives every combination), one
    list of ``key=value`` overrides per run, in the sweeper's order. As in Hydra's multirun, an unquoted
    comma makes a sweep (quote a value that holds one: ``env.dataset='a,b.hdf5'``); any other value is
    read as a single run reads it (`quote_overrides`)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()

    def grid_override(override: str) -> str:  # a sweep as Hydra reads it; any other value as a single run's
        try:
            if parser.parse_override(override).is_sweep_override():
                return override
        except HydraException:
            pass
        return quote_overrides([override])[0]

    try:
        parsed = parser.parse_overrides([grid_override(o) for o in overrides])
        return BasicSweeper.split_arguments(parsed, max_batch_size=None)[0]
    except HydraException as exc:
        raise ConfigError(f"cannot read the grid of runs: {str(exc).splitlines()[0]}") from None


def _hydra_value(hydra_overrides: list[str], key: str):
    values = [o.partition("=")[2] for o in hydra_overrides if o.lstrip("+~").partition("=")[0] == key]
    return values[-1] if values else None


def side_by_side(hydra_overrides: list[str], runs: int) -> int:
    """How many runs Hydra's launcher may run at once: 1 with the basic launcher (the default), else
    ``hydra.launcher.n_jobs`` where set (joblib; -1 or less: every core) or all of them."""
    launcher = _hydra_value(hydra_overrides, "hydra/launcher")
    if launcher in (None, "basic"):
        return 1
    n_jobs = _hydra_value(hydra_overrides, "hydra.launcher.n_jobs")
    try:
        n = int(n_jobs) if n_jobs is not None else runs
    except ValueError:
        raise ConfigError(f"hydra.launcher.n_jobs = {n_jobs!r} must be a whole number (-1: one per core).") from None
    return max(1, min(runs, (os.cpu_count() or 1) if n <= 0 else n))


class MultirunJob:
    """What Hydra's launcher calls for each run (picklable: joblib, submitit and Ray run it in other
    processes): the tool's single-run ``job`` on the run's own composed config. A run's error is printed
    as one line and returned, so that the other runs go on."""

    def __init__(self, job: Callable, configs: list, labels: list[str]):
        self.job, self.configs, self.labels = job, configs, labels

    def __call__(self, hydra_cfg) -> dict:
        index = int(hydra_cfg.run)
        label = f"run {index + 1} of {len(self.configs)} ({self.labels[index]})"
        platform.apply_environment()  # in a launcher's new process, before the job imports torch
        print(f"{label}:", flush=True)
        try:
            self.job(self.configs[index])
            return {"run": index, "error": None}
        except MbrlOfflineError as exc:
            error = str(exc)
        except Exception as exc:  # noqa: BLE001 - any run's failure is reported, and the others go on
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        print(f"error: {label}: {error}", file=sys.stderr, flush=True)
        return {"run": index, "error": error}


def tool_runs(tool: str, argv: list[str], doc: str, config_dir, config_name: str, job: Callable,
              check: Optional[Callable] = None, output: Optional[Callable] = None) -> None:
    """The command line of a tool that runs jobs (train, evaluate): one run, or with ``-m`` a grid of
    them. ``check(cfg)`` makes every check that needs no work (it raises `ConfigError`); ``job(cfg)``
    runs one composed config; ``output(cfg)`` is the folder a run writes, which two runs of a grid may
    not share. One run: compose, ``--cfg job`` prints it, else check and run. A grid: see `run_grid`."""
    overrides, show, multirun = parse_command_line(argv, doc, config_dir, config_name, multirun_ok=True)
    if multirun:
        return run_grid(tool, config_dir, config_name, overrides, show, job, check, output)
    cfg = compose(config_dir, config_name, overrides)
    if show:
        print_config(cfg)
    if check is not None:
        check(cfg)
    job(cfg)


def run_grid(tool: str, config_dir, config_name: str, overrides: list[str], show: bool, job: Callable,
             check: Optional[Callable], output: Optional[Callable]) -> None:
    """A grid of runs (``-m``): Hydra's sweep syntax expanded (`sweep_jobs`), each run labelled by its swept
    settings, composed and checked (`compose_runs`), then launched (`launch_runs`); exit status 1 if any
    failed."""
    hydra_overrides = [o for o in overrides if is_hydra_override(o)]
    jobs = sweep_jobs([o for o in overrides if not is_hydra_override(o)])
    by_key = [{o.partition("=")[0]: o for o in run} for run in jobs]
    varying = {k for k in by_key[0] if len({run.get(k) for run in by_key}) > 1}  # the swept settings
    labels = [" ".join(o for k, o in run.items() if k in varying) or "no setting varies" for run in by_key]
    configs = compose_runs(config_dir, config_name, jobs, labels, hydra_overrides, None if show else check)  # as one run's --cfg job
    folder_hint = f"trainer.run_dir='runs/{'-'.join('${' + k + '}' for k in sorted(varying)) or 'run'}'"
    if launch_runs(tool, job, configs, labels, hydra_overrides, show, output, folder_hint):
        sys.exit(1)


def compose_runs(config_dir, config_name: str, jobs: list[list[str]], labels: list[str], hydra_overrides: list[str],
                 check: Optional[Callable] = None) -> list:
    """The configs of runs ``jobs`` (one list of overrides each, named by ``labels``), each composed and, with
    ``check``, checked before any run starts: a bad one is one `ConfigError` line naming the run. Runs that
    Hydra's launcher will run side by side (`side_by_side`) share the cores: an unset ``torch_threads``
    gets the cores divided by them."""
    threads = max(1, (os.cpu_count() or 1) // side_by_side(hydra_overrides, len(jobs)))
    configs = []
    for index, (run, label) in enumerate(zip(jobs, labels)):
        try:
            cfg = compose(config_dir, config_name, run)
            if threads < (os.cpu_count() or 1) and "torch_threads" in cfg and not cfg.torch_threads:
                cfg.torch_threads = threads
            if check is not None:
                check(cfg)
        except MbrlOfflineError as exc:  # a setting, or a run folder that holds an earlier run
            raise ConfigError(f"run {index + 1} of {len(jobs)} ({label}): {exc} No run was started.") from None
        configs.append(cfg)
    return configs


def launch_runs(tool: str, job: Callable, configs: list, labels: list[str], hydra_overrides: list[str], show: bool,
                output: Optional[Callable] = None, folder_hint: str = "") -> list[dict]:
    """Runs composed ``configs`` (`compose_runs`) through Hydra's launcher (`launch`), each the tool's
    single-run ``job``. Two runs that would write the same folder (``output(cfg)``) are refused first
    (``folder_hint`` says what to set); with ``show`` (``--cfg job``) each config is printed and nothing
    runs. Before the runs, a grid that shares a GPU by time-slicing gets one hint line about CUDA's MPS
    (`platform.mps_advice`). Prints a summary naming each run's result and returns the failed runs'
    results (``{"run": index, "error": line}``). The grids of ``-m`` (`run_grid`) and `mbrl_offline.tools.reproduce` come through here."""
    if output is not None:
        seen: dict[str, int] = {}
        for index, cfg in enumerate(configs):
            folder = str(Path(output(cfg)).resolve())
            if folder in seen:
                raise ConfigError(f"runs {seen[folder] + 1} ({labels[seen[folder]]}) and {index + 1} ({labels[index]}) "
                                  f"would both write {output(cfg)}" + (f"; put the swept settings in the folder's "
                                                                      f"name, e.g. {folder_hint}" if folder_hint else "")
                                  + ". No run was started.")
            seen[folder] = index
    if show:
        from omegaconf import OmegaConf

        for index, (cfg, label) in enumerate(zip(configs, labels)):
            print(f"# run {index + 1} of {len(configs)}: {label}")
            print(OmegaConf.to_yaml(cfg), end="", flush=True)
        sys.exit(0)
    if not configs:
        return []
    advice = platform.mps_advice([cfg.get("device", "cpu") for cfg in configs], side_by_side(hydra_overrides, len(configs)),
                                 _hydra_value(hydra_overrides, "hydra/launcher"))
    if advice:
        print(advice, flush=True)
    results = launch(tool, MultirunJob(job, configs, labels), len(configs), hydra_overrides)
    failed = [r for r in results if r["error"] is not None]
    print(f"{len(results) - len(failed)} of {len(results)} runs finished"
          + "".join(f"\n  run {r['run'] + 1} ({labels[r['run']]}): failed: {r['error']}" for r in failed), flush=True)
    if failed:
        print(f"error: {len(failed)} of {len(results)} runs failed: "
              + ", ".join(f"run {r['run'] + 1} ({labels[r['run']]})" for r in failed), file=sys.stderr, flush=True)
    return failed


def launch(tool: str, task: MultirunJob, runs: int, hydra_overrides: list[str]) -> list[dict]:
    """Run ``task`` for runs 0 .. ``runs`` - 1 through Hydra's multirun with ``hydra_overrides`` (the launcher
    and its settings); each run's result, in run order. Hydra's own config for it is a one-key config
    (``run``, swept over the run numbers): the runs' configs were composed and checked before. Hydra
    writes its usual multirun folder (``hydra.sweep.dir``, by default ``multirun/<tool>/<date>_<time>``),
    and the working directory stays where the tool was started (``hydra.job.chdir=false``), so that
    relative run folders mean what they mean in a single run."""
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path
    from hydra.core.config_store import ConfigStore
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException, MissingConfigException

    ConfigStore.instance().store(name="mbrl_multirun", node={"run": 0})
    defaults = ["hydra.job.chdir=false", f"hydra.sweep.dir=multirun/{tool}/${{now:%Y-%m-%d_%H-%M-%S}}",
                "hydra.sweep.subdir=${hydra.job.num}", f"hydra.job.name=mbrl-{tool}"]
    GlobalHydra.instance().clear()
    try:
        hydra = Hydra.create_main_hydra2(task_name=f"mbrl-{tool}", config_search_path=create_config_search_path(None))
        returns = hydra.multirun("mbrl_multirun", task, defaults + hydra_overrides + [f"run=range(0,{runs})"])
    except MissingConfigException as exc:
        group, _, option = (exc.missing_cfg_file or "").rpartition("/")
        known = ", ".join(o for o in (exc.options or []))
        raise ConfigError(f"unknown {group or 'Hydra option'} '{option}'. Known: {known}. The launchers other than "
                          f"basic are optional extras: pip install 'mbrl_offline[joblib]', '[slurm]' or '[ray]'.") from None
    except HydraException as exc:
        raise ConfigError(f"Hydra could not launch the runs: {str(exc).splitlines()[0]}") from None
    finally:
        GlobalHydra.instance().clear()
    results = [job.return_value for batch in returns for job in batch]
    return sorted(results, key=lambda r: r["run"])


def tool_help(doc: str, config_dir, config_name: str, extra_settings: dict | None = None) -> str:
    """A tool's ``--help``: its purpose (the first paragraph of its module docstring), its config groups
    and their options (read from ``config_dir``), and where each setting is documented."""
    groups, settings = config_layout(config_dir, config_name)
    lines = [purpose(doc), "",
             f"usage: {invoked_as()} [--help] [--cfg job] [group=option ...] [setting=value ...]", ""]
    if groups:
        lines.append(f"Config groups ({config_path_shown('<group>')}/); choose one option with group=option:")
        for group, options, default in groups:
            if default is None:
                shown = "none"
            elif "${" in str(default):
                shown = f"as {str(default).strip('${}')}"  # e.g. the generator follows the algo
            else:
                shown = str(default)
            lines.append(f"  {group}: {', '.join(options)} (default: {shown})")
    else:
        lines.append("Config groups: none.")
    lines += ["", f"Settings ({config_path_shown(config_name + '.yaml')} and the files it includes), where each is "
                  "documented:"]
    section_names = {name for name, _, _ in settings}
    for group, _, _ in groups:
        if group in setting_docs() and group not in section_names:
            lines.append(f"  {group}{'.*' if group in ('algo', 'generator', 'env') else ''}: {setting_docs()[group]}")
    for name, default, comment in settings:
        if name in setting_docs() and default == "":  # a section documented elsewhere (trainer.*)
            lines.append(f"  {name}.*: {setting_docs()[name]}")
        else:
            lines.append(f"  {name}={default}" + (f"  # {comment}" if comment else ""))
    for name, text in (extra_settings or {}).items():
        lines.append(f"  {name}: {text}")
    lines += ["", "--cfg job prints the composed config (what the tool would run with) as YAML and runs nothing.",
              QUOTING_NOTE]
    return "\n".join(_wrap(line) for line in lines)


def _wrap(line: str, width: int = 110) -> str:
    """A help line wrapped at ``width``, continuation lines indented under its text."""
    import textwrap

    indent = " " * (len(line) - len(line.lstrip()) + 4)
    return textwrap.fill(line, width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False) or line


def purpose(doc: str) -> str:
    """The first paragraph of a module docstring."""
    return (doc or "").strip().split("\n\n")[0].strip()


def config_layout(config_dir, config_name: str) -> tuple[list, list]:
    """What ``<config_dir>/<config_name>.yaml`` is made of, read from the files (nothing composed):
    ``(groups, settings)``, groups as ``(group, options, default option)`` for each config group
    (a folder of ``config_dir``) its defaults list names, settings as ``(name, default, comment)`` for
    each top-level key of it and of the configs it includes (a section such as ``trainer`` with the
    default and comment empty)."""
    import re

    import yaml

    root = Path(config_dir)
    groups: dict = {}
    settings: dict = {}

    def visit(name: str) -> None:
        path = root / f"{name}.yaml"
        text = path.read_text(encoding="utf-8")
        for entry in (yaml.safe_load(text) or {}).get("defaults", []):
            if isinstance(entry, str) and entry != "_self_" and (root / f"{entry}.yaml").exists():
                visit(entry)
            elif isinstance(entry, dict):
                for key, default in entry.items():
                    group = key.replace("optional ", "").split("@")[0].strip()
                    if (root / group).is_dir():
                        groups.setdefault(group, default)
                    elif group in setting_docs():  # a group of the config store (trainer: defaults)
                        settings.setdefault(group, ("", ""))
        for line in text.splitlines():
            match = re.match(r"^([A-Za-z_]\w*):\s*(.*?)\s*(?:#\s*(.*))?$", line)
            if match and match[1] not in ("defaults", "hydra"):
                key, value, comment = match[1], match[2], match[3] or ""
                settings.setdefault(key, ("", "") if value == "" else (value, comment))

    visit(config_name)
    group_rows = [(g, group_options(root, g), d) for g, d in groups.items()]
    return group_rows, [(k, v, c) for k, (v, c) in settings.items() if k not in groups or k in setting_docs()]


def group_options(config_dir, group: str) -> list[str]:
    """The options of config group ``group``: its YAML files in ``config_dir``, and for ``algo`` and
    ``generator`` every registered family (`mbrl_offline.config_files.register_config_defaults`)."""
    options = {p.stem for p in (Path(config_dir) / group).glob("*.yaml")}
    if group in ("algo", "generator"):
        from mbrl_offline.config_files import registered_families

        agents, generators = registered_families()
        options |= set(agents) | (set(generators) if group == "generator" else set())
    return sorted(options)


class ToolArgumentParser:
    """``argparse`` for the tools that take options rather than settings (report.py,
    dynamics_in_pytorch.py), with the other tools' habits: ``--help`` shows the module docstring's first
    paragraph, ``--cfg job`` prints the parsed options as YAML and exits 0, and a mistake is one
    `ConfigError` line (exit status 2 under `cli_main`)."""

    def __init__(self, prog: str, doc: str):
        import argparse

        class _Parser(argparse.ArgumentParser):
            def error(self, message):  # argparse prints usage and exits; the tools print one line
                raise ConfigError(f"{message} (see {self.prog} --help).")

        self.parser = _Parser(prog=prog, description=purpose(doc),
                              epilog="--cfg job prints the parsed options as YAML and runs nothing.",
                              formatter_class=argparse.RawDescriptionHelpFormatter)
        self.add_argument = self.parser.add_argument

    def parse_args(self, argv: list[str]):
        rest, cfg_job = [], False
        args = list(argv)
        while args:
            arg = args.pop(0)
            name, eq, value = arg.partition("=")
            if name in CFG_FLAGS:
                value = value if eq else (args.pop(0) if args else "")
                if value != "job":
                    raise ConfigError(f"{name} {value or '(nothing)'}: write {name} job to print the options.")
                cfg_job = True
            else:
                rest.append(arg)
        parsed = self.parser.parse_args(rest)
        if cfg_job:
            print_config({k: (str(v) if isinstance(v, Path) else v) for k, v in vars(parsed).items()})
        return parsed

