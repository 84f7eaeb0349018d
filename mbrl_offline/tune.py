"""Hyperparameter sweeps with Optuna, driven directly (no Hydra sweeper plugin; it does not support Optuna 5).

A sweep is one Optuna study. Each trial draws a value for every parameter of the search space (dotted
paths of the training config, e.g. ``algo.eta``), trains one run per seed through a caller-given
``run_trial`` function, reports every evaluation to Optuna so that a poor trial is pruned early, and
returns the mean over its seeds of the run's score (by default the mean of its last ten evaluations,
as OfflineRL-Kit reports; ``objective: final`` takes the last one).

Storage: by default an SQLite file ``study.db`` in the sweep folder, so the same command resumes an
interrupted study; any SQLAlchemy URL (``postgresql://user:pw@host/db``) lets workers on many machines
share one study, and a path ending in ``.journal`` uses Optuna's journal file. Each worker records a
heartbeat (RDB storages): a trial whose worker died is marked failed when its heartbeat is older than
twice ``heartbeat_seconds``, and a trial stopped by Ctrl-C or SIGTERM is failed at once; both are queued
again with the same parameters and continue from the checkpoints their runs left. A trial that fails
for any other reason (a diverged run, say) is recorded as failed with its error and the study goes on.
The study counts COMPLETE, PRUNED and FAILED trials towards ``n_trials`` (not the interrupted ones, which
are retried), so a study whose trials keep failing still ends.

Every evaluation episode a trial runs in the real env is counted (trial attribute ``eval_episodes``):
tuning offline RL on online returns is online access, and the report states how much of it was used.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import math
import os
import signal
import random
import socket
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from mbrl_offline.config import check_field_types, require_nonnegative, require_positive
from mbrl_offline.errors import ConfigError

SAMPLERS = ("tpe", "random", "grid")
PRUNERS = ("median", "hyperband", "none")
OBJECTIVES = ("last10", "final")
JOBS = ("train", "finetune")
PARAM_TYPES = ("float", "int", "categorical")


@dataclass
class SamplerConfig:
    name: str = "tpe"  # tpe | random | grid (grid: every parameter categorical, each combination once)
    seed: Optional[int] = 0  # each trial draws with (seed, trial number): reproducible, and no repeats on resume or across workers
    n_startup_trials: int = 5  # TPE: random trials before the model-guided ones

    def __post_init__(self):
        check_field_types(self, "sweep.sampler")  # types first; nested mappings become configs
        require_nonnegative(self, "seed", "n_startup_trials", section="sweep.sampler")


@dataclass
class PrunerConfig:
    name: str = "median"  # median | hyperband | none
    n_startup_trials: int = 3  # median: trials that are never pruned, to have something to compare with
    n_warmup_epochs: int = 2  # median: no pruning before this epoch of a trial's first run

    def __post_init__(self):
        check_field_types(self, "sweep.pruner")  # types first; nested mappings become configs
        require_nonnegative(self, "n_startup_trials", "n_warmup_epochs", section="sweep.pruner")


@dataclass
class SweepConfig:
    n_trials: int = 20  # trials counted over all workers (complete, pruned or failed)
    seeds: tuple[int, ...] = (0,)  # one run per seed in every trial; the trial's value is their mean
    objective: str = "last10"  # last10: mean of a run's last ten evaluations; final: its last evaluation
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    pruner: PrunerConfig = field(default_factory=PrunerConfig)
    storage: Optional[str] = None  # null: sqlite in `dir`; else an SQLAlchemy URL or a *.journal file
    study_name: str = "sweep"
    dir: str = "sweeps/sweep"  # trial runs (trial-NNNN/seed-S), sweep.json and the default storage
    heartbeat_seconds: int = 60  # RDB storages: a worker silent for twice this long is taken for dead
    for_algo: Optional[str] = None  # the algorithm the search space was written for (checked)
    job: str = "train"  # what a trial runs: train (training runs) or finetune (fine-tuning runs of checkpoint=...)
    # parameter path -> {type: float|int, low, high, log, step} or {type: categorical, choices: [...]},
    # nested as in the training config: {algo: {eta: {type: float, low: 0.1, high: 10, log: true}}}
    space: dict = field(default_factory=dict)

    def __post_init__(self):
        check_field_types(self, "sweep")  # types first; nested mappings become configs
        require_positive(self, "n_trials", section="sweep")
        if not self.seeds:
            raise ConfigError("sweep.seeds is empty; give at least one seed, e.g. sweep.seeds=[0].")
        if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in self.seeds):
            raise ConfigError(f"sweep.seeds must be whole numbers >= 0, got {list(self.seeds)}.")
        if not str(self.dir).strip():
            raise ConfigError("sweep.dir is empty; name the sweep's folder, e.g. sweep.dir=sweeps/my-sweep.")
        if self.job not in JOBS:
            raise ConfigError(f"unknown sweep.job '{self.job}'; choose one of {', '.join(JOBS)}.")
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"unknown sweep.objective '{self.objective}'; choose one of {', '.join(OBJECTIVES)}.")
        if self.sampler.name not in SAMPLERS:
            raise ConfigError(f"unknown sweep.sampler.name '{self.sampler.name}'; choose one of {', '.join(SAMPLERS)}.")
        if self.pruner.name not in PRUNERS:
            raise ConfigError(f"unknown sweep.pruner.name '{self.pruner.name}'; choose one of {', '.join(PRUNERS)}.")
        require_positive(self, "heartbeat_seconds", section="sweep")
        self.parameters = flatten_space(self.space)
        if self.sampler.name == "grid" and any(spec["type"] != "categorical" for spec in self.parameters.values()):
            raise ConfigError("sweep.sampler.name=grid needs every parameter to be categorical (a list of choices).")


# ------------------------------------------------------------------------------------------ space
def flatten_space(space: dict, prefix: str = "") -> dict[str, dict]:
    """``{algo: {eta: {type: float, ...}}}`` -> ``{"algo.eta": {type: float, ...}}``, each spec checked."""
    if not isinstance(space, dict):
        raise ConfigError(f"sweep.space{'.' + prefix if prefix else ''} must be a mapping, got {space!r}.")
    flat: dict[str, dict] = {}
    for key, value in space.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and "type" in value:
            flat[path] = _checked_spec(path, value)
        elif isinstance(value, dict):
            flat.update(flatten_space(value, path))
        else:
            raise ConfigError(f"sweep.space.{path} must be a parameter spec with a 'type' "
                              f"({', '.join(PARAM_TYPES)}), got {value!r}.")
    return flat


def _checked_spec(path: str, spec: dict) -> dict:
    kind = spec["type"]
    allowed = {"float": {"type", "low", "high", "log", "step"}, "int": {"type", "low", "high", "log", "step"},
               "categorical": {"type", "choices"}}.get(kind)
    if allowed is None:
        raise ConfigError(f"sweep.space.{path}: unknown type '{kind}'; choose one of {', '.join(PARAM_TYPES)}.")
    unknown = set(spec) - allowed
    if unknown:
        raise ConfigError(f"sweep.space.{path}: unknown key(s) {', '.join(sorted(unknown))} for a {kind} parameter; "
                          f"valid: {', '.join(sorted(allowed))}.")
    if kind == "categorical":
        if not isinstance(spec.get("choices"), (list, tuple)) or not spec["choices"]:
            raise ConfigError(f"sweep.space.{path}: a categorical parameter needs a non-empty list 'choices'.")
        return {"type": kind, "choices": list(spec["choices"])}
    number = float if kind == "float" else int
    try:
        low, high = number(spec["low"]), number(spec["high"])
    except (KeyError, TypeError, ValueError):
        raise ConfigError(f"sweep.space.{path}: a {kind} parameter needs numbers 'low' and 'high'.") from None
    log = bool(spec.get("log", False))
    if not low < high or (log and low <= 0):
        raise ConfigError(f"sweep.space.{path}: need low < high{' and low > 0 (log scale)' if log else ''}, "
                          f"got low={low}, high={high}.")
    return {"type": kind, "low": low, "high": high, "log": log, "step": spec.get("step")}


def suggest(trial, parameters: dict[str, dict]) -> dict[str, Any]:
    """One value per parameter from ``trial`` (an ``optuna.Trial``)."""
    values = {}
    for path, spec in parameters.items():
        if spec["type"] == "categorical":
            values[path] = trial.suggest_categorical(path, spec["choices"])
        elif spec["type"] == "float":
            values[path] = trial.suggest_float(path, spec["low"], spec["high"], log=spec["log"], step=spec["step"])
        else:
            values[path] = trial.suggest_int(path, spec["low"], spec["high"], log=spec["log"], step=spec["step"] or 1)
    return values


def extreme_values(parameters: dict[str, dict]) -> list[dict[str, Any]]:
    """Two assignments that together use every bound and every choice at least once per parameter
    (padded with the first), so that checking them checks the whole space's keys and types."""
    rows = max([2] + [len(spec["choices"]) for spec in parameters.values() if spec["type"] == "categorical"])
    assignments = []
    for i in range(rows):
        values = {}
        for path, spec in parameters.items():
            if spec["type"] == "categorical":
                values[path] = spec["choices"][i % len(spec["choices"])]
            else:
                values[path] = spec["low"] if i % 2 == 0 else spec["high"]
        assignments.append(values)
    return assignments


def override(path: str, value: Any) -> str:
    """``path=value`` in Hydra's override syntax."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif value is None:
        text = "null"
    elif isinstance(value, (int, float)):
        text = repr(value)
    else:
        text = json.dumps(str(value))  # quoted, so that a string never reads as a number or a list
    return f"{path}={text}"


# ------------------------------------------------------------------------------------------ storage
def storage_location(storage: Optional[str], sweep_dir: Path) -> str:
    """Where the study lives: the SQLAlchemy URL or journal file of ``sweep.storage`` (sqlite in
    ``sweep_dir`` when unset), made absolute so that ``sweep.json`` works from any folder."""
    if storage is None:
        return f"sqlite:///{(sweep_dir / 'study.db').resolve()}"
    if _is_journal(storage):
        return str(Path(storage).expanduser().resolve())
    return storage


def _is_journal(location: str) -> bool:
    return location.endswith(".journal") and "://" not in location


def _journal_storage(path: str):
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return _interrupts_deferred(JournalStorage)(JournalFileBackend(path))


@functools.lru_cache(maxsize=None)
def _interrupts_deferred(storage_class: type) -> type:
    """A subclass of an Optuna storage class whose every method runs in `platform.interrupts_deferred`: a
    Ctrl-C that lands inside a call into the storage stops the sweep when the call returns. Raised at an
    arbitrary line of SQLAlchemy's commit or close, it left the study's database locked or the storage
    broken (`interrupts_deferred` says how), and the stopped worker then waited up to a minute, or for
    ever, before it could fail and queue its trial again. The storage is still the class Optuna expects
    (it wraps an `RDBStorage` in its cache, and finds the heartbeat), as a subclass."""
    from mbrl_offline.platform import interrupts_deferred

    def deferring(method):
        @functools.wraps(method)
        def call(*args, **kwargs):
            with interrupts_deferred():
                return method(*args, **kwargs)
        return call

    methods = {}
    for cls in reversed(storage_class.__mro__):
        for name, value in vars(cls).items():
            if inspect.isfunction(value) and not name.startswith("__"):
                methods[name] = deferring(getattr(storage_class, name))
    return type(storage_class.__name__, (storage_class,), {**methods, "__module__": __name__,
                                                              "__qualname__": storage_class.__qualname__})


def check_storage(storage: Optional[str]) -> None:
    """Refuse, in one `ConfigError` line, a ``sweep.storage`` file that could not be made: a journal file
    or sqlite database below a regular file, in a folder that cannot be written, or that is itself a
    folder (`mbrl_offline.config.check_writable_dir`). The sweep tool (mbrl_offline/tools/sweep.py) calls it
    before any trial starts; `open_storage` again. URLs of database servers are not checked here."""
    from mbrl_offline.config import check_writable_dir

    if storage is None:
        return
    if _is_journal(storage):
        path = Path(storage).expanduser()
    elif storage.startswith("sqlite:///") and storage != "sqlite:///:memory:":
        path = Path(storage[len("sqlite:///"):]).expanduser()
    else:
        return
    if path.is_dir():
        raise ConfigError(f"sweep.storage={storage} is a folder; name a file in it, e.g. {path / 'study.journal'}.")
    check_writable_dir(path.parent, "the folder of sweep.storage")


# sqlite: how long a write waits for the other workers' writes before it fails with "database is locked"
SQLITE_LOCK_WAIT_S = 60


def open_storage(location: str, heartbeat_seconds: int, on_interrupted: Callable):
    """The study's storage at ``location`` (from `storage_location`): a journal file or any SQLAlchemy URL."""
    import optuna
    from optuna.storages import RDBStorage

    if _is_journal(location):
        check_storage(location)
        try:
            Path(location).parent.mkdir(parents=True, exist_ok=True)
            return _journal_storage(location)
        except OSError as exc:
            raise ConfigError(f"cannot open the journal sweep.storage={location}: {exc.strerror or exc}; choose a "
                              f"file in a folder you can write to.") from None
    url = location
    engine_kwargs = ({"connect_args": {"timeout": SQLITE_LOCK_WAIT_S}} if url.startswith("sqlite")
                     else {"pool_pre_ping": True})
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for attempt in range(3):  # workers starting together race to create the tables: the loser retries
        try:
            with warnings.catch_warnings():  # the heartbeat is marked experimental, and has been since Optuna 2.9
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return _interrupts_deferred(RDBStorage)(
                    url, engine_kwargs=engine_kwargs, heartbeat_interval=heartbeat_seconds,
                    grace_period=2 * heartbeat_seconds, heartbeat_stale_trial_callback=on_interrupted)
        except ImportError as exc:
            raise ConfigError(f"sweep.storage {redact(url)} needs a database driver that is not installed ({exc}); "
                              f"for PostgreSQL: pip install 'psycopg[binary]' (or the package's [postgres] extra).") from None
        except Exception as exc:  # sqlalchemy's errors for a bad URL, an unreachable or refusing server
            if attempt == 2:
                reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise ConfigError(f"cannot open sweep.storage {redact(url)}: {reason}") from None
            time.sleep(1.0 + random.random())


def redact(url: str) -> str:
    """``url`` without its password, for messages."""
    if "://" in url and "@" in url.split("://", 1)[1]:
        scheme, rest = url.split("://", 1)
        credentials, host = rest.rsplit("@", 1)
        return f"{scheme}://{credentials.split(':', 1)[0]}:***@{host}"
    return url


def retry_interrupted(study, trial) -> None:
    """Queue a failed-by-interruption trial again: same parameters, same run folder (its runs resume)."""
    study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number, "trial_dir": trial_dir_name(trial)})


def trial_dir_name(trial) -> str:
    """The folder of a trial's runs in the sweep folder; a retry keeps the folder of the trial it retries."""
    return trial.user_attrs.get("trial_dir", f"trial-{trial.number:04d}")


def counted_trials(study) -> int:
    """Trials that count towards ``n_trials``: finished ones, less those that were queued again."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    finished = sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL) for t in trials)
    return finished - sum("retry_of" in t.user_attrs for t in trials)


# ------------------------------------------------------------------------------------------ pruning
class OptunaReporter:
    """Trainer callback: reports each evaluation's normalised score to the trial (step = seed index x
    epochs + epoch, the same for every trial), counts evaluation episodes, and prunes."""

    def __init__(self, trial, seed_index: int):
        self.trial, self.seed_index = trial, seed_index
        self.reported: set[int] = set()

    def on_eval(self, trainer, epoch: int, result: dict) -> None:
        import optuna

        trial, offset = self.trial, self.seed_index * trainer.config.epochs
        for entry in trainer.history:  # after a resume, also the evaluations from before the interruption
            step = offset + entry["epoch"]
            if step not in self.reported:
                trial.report(entry["normalized_score"], step)
                self.reported.add(step)
        used = trial.user_attrs.get("eval_episodes", 0) + len(result["returns"])
        trial.set_user_attr("eval_episodes", used)
        if trial.should_prune():
            raise optuna.TrialPruned(f"score {result['normalized_score']:.1f} at epoch {epoch} of seed "
                                     f"{trainer.config.seed} is below the pruner's threshold")


# ------------------------------------------------------------------------------------------ study
RunTrial = Callable[[dict, int, Path, list], dict]


def run_sweep(config: SweepConfig, run_trial: RunTrial, log: Callable[[str], None] = print,
              defines: Optional[dict] = None):
    """Run (or join, or resume) the study until ``config.n_trials`` trials are counted; returns it.
    ``defines`` is what else a study keeps besides its space, seeds and objective (a fine-tuning sweep:
    the checkpoint), checked like them when the study is resumed.

    ``run_trial(params, seed, run_dir, callbacks)`` trains one run: ``params`` maps parameter paths to
    values, ``callbacks`` go to the `Trainer` (they report and prune), and when ``run_dir`` holds a
    checkpoint the run must resume from it. It returns the trainer's ``summary()``.
    """
    import optuna

    sweep_dir = Path(config.dir)
    if config.storage is None:  # the default sqlite file goes in the sweep folder
        sweep_dir.mkdir(parents=True, exist_ok=True)
    location = storage_location(config.storage, sweep_dir)
    storage = open_storage(location, config.heartbeat_seconds, retry_interrupted)
    study = optuna.create_study(study_name=config.study_name, storage=storage, direction="maximize",
                                sampler=make_sampler(config), pruner=make_pruner(config), load_if_exists=True)
    _check_same_study(study, config, defines)
    _write_sweep_file(sweep_dir, location, config)
    worker = f"{socket.gethostname()}:{os.getpid()}"

    def objective(trial) -> float:
        trial_dir = trial_dir_name(trial)
        trial.set_user_attr("trial_dir", trial_dir)
        trial.set_user_attr("worker", worker)
        params = suggest(trial, config.parameters)
        retried = f" (retry of trial {trial.user_attrs['retry_of']})" if "retry_of" in trial.user_attrs else ""
        log(f"trial {trial.number}{retried}: " + ", ".join(f"{k}={v}" for k, v in params.items()))
        scores = []
        try:
            for index, seed in enumerate(config.seeds):
                summary = run_trial(params, seed, sweep_dir / trial_dir / f"seed-{seed}",
                                    [OptunaReporter(trial, index)])
                score = summary["last10_score" if config.objective == "last10" else "final_score"]
                if not math.isfinite(score):
                    raise ConfigError(f"the run of seed {seed} made no evaluation")
                scores.append(score)
                trial.set_user_attr("seed_scores", scores)
        except KeyboardInterrupt:
            trial.set_user_attr("interrupted", True)
            retry_interrupted(study, trial)
            raise
        except optuna.TrialPruned as exc:
            log(f"trial {trial.number} pruned: {exc}")
            raise
        except Exception as exc:
            trial.set_user_attr("error", f"{type(exc).__name__}: {exc}")
            log(f"trial {trial.number} failed: {type(exc).__name__}: {exc}")
            raise
        value = sum(scores) / len(scores)
        log(f"trial {trial.number}: {config.objective} score {value:.2f} (seeds {[round(s, 2) for s in scores]})")
        return value

    with _sigterm_as_interrupt():
        while counted_trials(study) < config.n_trials:
            if config.sampler.name == "grid" and _grid_done(study, config):
                break
            study.optimize(objective, n_trials=1, catch=(Exception,), gc_after_trial=True)
    return study


def make_sampler(config: SweepConfig):
    import optuna

    sampler = config.sampler

    def build(seed: Optional[int]):
        if sampler.name == "tpe":
            return optuna.samplers.TPESampler(seed=seed, n_startup_trials=sampler.n_startup_trials)
        if sampler.name == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        return optuna.samplers.GridSampler({path: spec["choices"] for path, spec in config.parameters.items()},
                                           seed=seed)

    if sampler.seed is None or sampler.name == "grid":
        # The grid sampler is made once: its seed shuffles the grid, and a trial's grid point is that
        # order's entry at the trial's number (or an unvisited one, from the storage). Made again per
        # trial with another seed, each trial read another order, and a grid of 5 ran 2 points twice and
        # 2 never. With a fixed seed every process and every resume reads the same order.
        return build(sampler.seed)
    return _trial_seeded(build, sampler.seed)


def _trial_seeded(build, seed: int):
    """An Optuna sampler made by ``build(seed)``, made again for every trial with (seed, trial number).

    A sampler seeded once per process replays its first draws each time a process starts: a resumed study
    would repeat its first trials' parameters and two workers would run the same ones. Trial numbers are
    unique across the processes that share a study, so this keeps a one-worker study reproducible without
    those repeats. TPE and grid samplers read the study's history from the storage; only their random
    generator lives in the process, so making them again loses nothing.
    """
    import numpy as np
    import optuna

    class TrialSeededSampler(optuna.samplers.BaseSampler):
        def __init__(self):
            self.sampler = build(seed)

        def before_trial(self, study, trial):
            self.sampler = build(int(np.random.SeedSequence([seed, trial.number]).generate_state(1)[0]))
            self.sampler.before_trial(study, trial)

        def infer_relative_search_space(self, study, trial):
            return self.sampler.infer_relative_search_space(study, trial)

        def sample_relative(self, study, trial, search_space):
            return self.sampler.sample_relative(study, trial, search_space)

        def sample_independent(self, study, trial, param_name, param_distribution):
            return self.sampler.sample_independent(study, trial, param_name, param_distribution)

        def after_trial(self, study, trial, state, values):
            self.sampler.after_trial(study, trial, state, values)

        def reseed_rng(self):
            self.sampler.reseed_rng()

    return TrialSeededSampler()


def make_pruner(config: SweepConfig):
    import optuna

    pruner = config.pruner
    if pruner.name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=pruner.n_startup_trials,
                                           n_warmup_steps=pruner.n_warmup_epochs)
    if pruner.name == "hyperband":
        return optuna.pruners.HyperbandPruner()
    return optuna.pruners.NopPruner()


def _grid_done(study, config: SweepConfig) -> bool:
    grid_size = math.prod(len(spec["choices"]) for spec in config.parameters.values())
    return counted_trials(study) >= grid_size


def _check_same_study(study, config: SweepConfig, defines: Optional[dict] = None) -> None:
    """A study keeps its search space, seeds and objective (and ``defines``): trials made with others are
    not comparable."""
    # through JSON, as the storage keeps it (tuples become lists)
    defining = json.loads(json.dumps({"space": config.parameters, "seeds": list(config.seeds),
                                      "objective": config.objective, **(defines or {})}))
    stored = study.user_attrs.get("definition")
    if stored is None:
        study.set_user_attr("definition", defining)
    elif stored != defining:
        changed = [k for k in defining if defining[k] != stored.get(k)]
        raise ConfigError(f"study '{config.study_name}' was started with another {' and '.join(changed)}; "
                          f"keep its settings to resume it, or start a new one (sweep.study_name=..., sweep.dir=...).")


def _write_sweep_file(sweep_dir: Path, location: str, config: SweepConfig) -> None:
    """``sweep.json``: where the study lives, for `report`."""
    from mbrl_offline.utils import atomic_write_bytes

    atomic_write_bytes(sweep_dir / "sweep.json", json.dumps({"study_name": config.study_name, "storage": location,
                                                             "config": dataclasses.asdict(config)}, indent=2,
                                                            default=list))


class _sigterm_as_interrupt:
    """SIGTERM (a cluster scheduler's stop) ends the trial like Ctrl-C, so it is failed and queued again; inside a
    call into the study's storage, where that call ends (`platform.interrupt_unless_deferred`)."""

    def __enter__(self):
        from mbrl_offline.platform import interrupt_unless_deferred

        def handler(signum, frame):
            interrupt_unless_deferred()

        try:
            self.previous = signal.signal(signal.SIGTERM, handler)
        except ValueError:  # not the main thread
            self.previous = None
        return self

    def __exit__(self, *exc):
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)
        return False


def trial_counts(study) -> dict[str, int]:
    """Trials per state name (COMPLETE, PRUNED, FAIL, RUNNING, WAITING)."""
    counts: dict[str, int] = {}
    for trial in study.get_trials(deepcopy=False):
        counts[trial.state.name] = counts.get(trial.state.name, 0) + 1
    return counts


def eval_episodes_used(study) -> int:
    """Evaluation episodes run in the real env by every trial of the study, finished or not."""
    return sum(int(t.user_attrs.get("eval_episodes", 0)) for t in study.get_trials(deepcopy=False))


def summarize_study(study, objective: str = "last10") -> str:
    """A few lines: the best trial's value and parameters, trial counts and the online episodes used."""
    counts = ", ".join(f"{n} {state.lower()}" for state, n in sorted(trial_counts(study).items()))
    lines = [f"study '{study.study_name}': {counts}; {eval_episodes_used(study)} evaluation episodes in the real env"]
    try:
        best = study.best_trial
    except ValueError:
        return "\n".join(lines + ["no trial completed, so there are no best parameters"])
    lines.append(f"best trial {best.number}: {objective} score {best.value:.2f}")
    lines.append("best parameters: " + " ".join(override(k, v) for k, v in best.params.items()))
    return "\n".join(lines)


def load_sweep(sweep_dir: str | Path):
    """The study of a sweep folder (from its ``sweep.json``) and that file's contents."""
    import optuna

    path = Path(sweep_dir) / "sweep.json"
    info = json.loads(path.read_text())
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    location = info["storage"]
    storage = _journal_storage(location) if _is_journal(location) else location
    return optuna.load_study(study_name=info["study_name"], storage=storage), info
