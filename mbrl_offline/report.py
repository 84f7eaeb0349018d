"""Reports from logged runs: learning curves (PNG) and a markdown table of final normalised scores.

A run is a folder with ``run.json`` and ``metrics.jsonl``, as `Trainer` writes them. Runs are grouped
by dataset and algorithm; a group's seeds give the mean and the spread. The table reports, per group,
the last evaluation and the mean of the last ten evaluations (OfflineRL-Kit's figure), each as mean ±
standard deviation over seeds, and the 95% bootstrap interval of the final score's mean; never the best
evaluation, which overstates what a run delivers.

Over datasets, per algorithm (`mbrl_offline.statistics`, rliable's definitions): the interquartile mean
and the mean of the final scores with 95% stratified bootstrap intervals, performance profiles (a PNG),
and the probability of improvement between each pair of algorithms on their common datasets.

A sweep folder (one with ``sweep.json``, from the sweep tool, ``mbrl-sweep``) is reported as a sweep: its best
trials, the importance of each parameter, how many evaluation episodes the tuning ran in the real env,
and the learning curves of its best trials.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from mbrl_offline import statistics
from mbrl_offline.errors import MbrlOfflineError, read_library_text


class ReportError(MbrlOfflineError, ValueError):
    """Nothing to report, or logs that cannot be read."""


@dataclass
class Run:
    path: Path
    info: dict  # run.json
    steps: list[int]  # gradient updates at each evaluation
    scores: list[float]  # normalised score at each evaluation
    label: str = ""  # the curve and table row it belongs to; the algorithm unless set
    # the last evaluation's value at risk and conditional value at risk of the normalised scores (None in
    # logs written before the library recorded them), at the run's trainer.risk_level
    final_risk: Optional[tuple[float, float]] = None

    def __post_init__(self):
        self.label = self.label or self.info["algorithm"]

    @property
    def dataset(self) -> str:
        return dataset_label(self.info["dataset"])


@dataclass
class SweepSummary:
    path: Path
    study: object
    info: dict
    runs: list[Run] = field(default_factory=list)


def dataset_label(source: str) -> str:
    """A short dataset name: ``bundled:hopper-medium`` -> ``hopper-medium``, a file path -> its stem."""
    for prefix in ("bundled:", "minari:", "d4rl:"):
        if source.startswith(prefix):
            source = source[len(prefix):]
    return Path(source).stem if source.endswith((".hdf5", ".h5")) else source


def read_json_file(path: Path, what: str, fix: str) -> dict:
    """A JSON object from ``path`` (a file the library wrote), or a `ReportError` in one line that names
    the file and what is wrong with it (missing, empty, not JSON, not an object); ``fix`` ends it."""
    text = read_library_text(path, ReportError, fix, what=what)
    if not text.strip():
        raise ReportError(f"{path} is empty; {fix}.")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ReportError(f"{path} is not valid JSON (truncated?) at line {exc.lineno} column {exc.colno}; "
                          f"{fix}.") from None
    if not isinstance(value, dict):
        raise ReportError(f"{path} holds a {type(value).__name__}, not a JSON object; {fix}.")
    return value


RUN_FIX = "the run's files are damaged: remove the run folder from the paths you report (or re-run it)"


def read_run(path: Path, label: str = "") -> Run:
    """The run in folder ``path``; a missing or damaged ``run.json`` or ``metrics.jsonl`` is refused in
    one line that names the file and the problem."""
    from mbrl_offline.logging import LogError, read_jsonl

    info = read_json_file(path / "run.json", "run folder", RUN_FIX)
    for key in ("algorithm", "dataset"):
        if not isinstance(info.get(key), str):
            raise ReportError(f"{path / 'run.json'} has no text '{key}' (got {info.get(key)!r}); {RUN_FIX}.")
    for key in ("dataset_score", "seed"):
        if info.get(key) is not None and (not isinstance(info[key], (int, float)) or isinstance(info[key], bool)):
            raise ReportError(f"{path / 'run.json'} has '{key}' = {info[key]!r}, not a number; {RUN_FIX}.")
    try:
        records = read_jsonl(path / "metrics.jsonl")
    except FileNotFoundError:
        raise ReportError(f"{path / 'metrics.jsonl'} is missing, so {path} is not a complete run folder; "
                          f"{RUN_FIX}.") from None
    except LogError as exc:
        raise ReportError(str(exc)) from None
    evaluated = [r for r in records if "eval" in r]
    last = evaluated[-1]["eval"] if evaluated else {}
    risk = ((float(last["normalized_score_var"]), float(last["normalized_score_cvar"]))
            if "normalized_score_var" in last and "normalized_score_cvar" in last else None)
    return Run(path, info, [r["step"] for r in evaluated], [r["eval"]["normalized_score"] for r in evaluated], label,
               risk)


def find_runs(paths: list[str | Path]) -> tuple[list[Run], list[SweepSummary]]:
    """The runs and sweeps under ``paths`` (run folders, sweep folders, or folders holding them)."""
    runs, sweeps = [], []
    for given in paths:
        root = Path(given)
        if not root.exists():
            raise ReportError(f"{root} does not exist; pass run folders (with metrics.jsonl) or folders holding them.")
        for folder, subfolders, files in os.walk(root):
            folder = Path(folder)
            if "sweep.json" in files:
                sweeps.append(read_sweep(folder))
                subfolders.clear()  # its trials are reported with the sweep, not mixed into the table
            elif "run.json" in files:
                runs.append(read_run(folder))
                subfolders.clear()
            else:
                subfolders.sort()
    if not runs and not sweeps:
        raise ReportError(f"no runs found under {', '.join(map(str, paths))} (a run folder holds run.json and "
                          f"metrics.jsonl, written by the train tool, mbrl-train).")
    return runs, sweeps


def read_sweep(path: Path, top: int = 3) -> SweepSummary:
    """A sweep folder's study, with the runs of its ``top`` best complete trials."""
    from mbrl_offline.tune import load_sweep, trial_dir_name

    fix = ("the sweep folder is damaged: run the sweep again with the same settings (which rewrites sweep.json), "
           "or leave it out")
    info = read_json_file(path / "sweep.json", "sweep folder", fix)
    for key in ("study_name", "storage"):
        if not isinstance(info.get(key), str) or not info[key]:
            raise ReportError(f"{path / 'sweep.json'} has no text '{key}' (got {info.get(key)!r}); {fix}.")
    if not isinstance(info.get("config", {}), dict):
        raise ReportError(f"{path / 'sweep.json'} has 'config' = {info['config']!r}, not an object; {fix}.")
    if info["storage"].startswith("sqlite:///"):  # loading would create an empty database in its place
        database = Path(info["storage"][len("sqlite:///"):])
        if not database.is_file():
            raise ReportError(f"the study database {database} named in {path / 'sweep.json'} is missing; "
                              f"restore it, or leave the sweep out of the report.")
    try:
        study, info = load_sweep(path)
    except Exception as exc:  # a damaged database, a server that is down, a study that was deleted
        raise ReportError(f"cannot open the study of sweep {path}: {type(exc).__name__}: "
                          f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}") from None
    summary = SweepSummary(path, study, info)
    for trial in best_trials(study)[:top]:
        trial_dir = path / trial_dir_name(trial)
        for run_dir in sorted(trial_dir.glob("seed-*")):
            if (run_dir / "run.json").exists():
                summary.runs.append(read_run(run_dir, label=f"trial {trial.number}"))
    return summary


def best_trials(study) -> list:
    from optuna.trial import TrialState

    complete = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    return sorted(complete, key=lambda t: t.value, reverse=True)


# ------------------------------------------------------------------------------------------ tables
def _mean_std(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{np.mean(values):.1f} ± {np.std(values):.1f}"


def _interval_text(values: list[float]) -> str:
    """The 95% bootstrap interval of the mean of ``values`` (one per seed), or "-" below two seeds."""
    if len(values) < 2:
        return "-"
    estimate = statistics.bootstrap_mean(values)
    return f"[{estimate.low:.1f}, {estimate.high:.1f}]"


def group_runs(runs: list[Run]) -> dict[tuple[str, str], list[Run]]:
    groups: dict[tuple[str, str], list[Run]] = {}
    for run in sorted(runs, key=lambda r: (r.dataset, r.label, r.info.get("seed", 0))):
        groups.setdefault((run.dataset, run.label), []).append(run)
    return groups


def score_table(runs: list[Run]) -> str:
    """Markdown: per dataset and algorithm, the final and last-ten scores (mean ± std over seeds)."""
    lines = ["| dataset | algorithm | data | seeds | final | final: 95% CI of the mean | last 10 | updates |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for (dataset, label), group in group_runs(runs).items():
        evaluated = [r for r in group if r.scores]
        finals = [r.scores[-1] for r in evaluated]
        last10 = [float(np.mean(r.scores[-10:])) for r in evaluated]
        updates = sorted({r.steps[-1] for r in evaluated})
        updates_text = "-" if not updates else (f"{updates[0]:,}" if len(updates) == 1
                                                else f"{updates[0]:,}-{updates[-1]:,}")
        seeds = f"{len(evaluated)}" if len(evaluated) == len(group) else f"{len(evaluated)} of {len(group)}"
        lines.append(f"| {dataset} | {label} | {group[0].info.get('dataset_score', math.nan):.1f} | {seeds} | "
                     f"{_mean_std(finals)} | {_interval_text(finals)} | {_mean_std(last10)} | {updates_text} |")
    return "\n".join(lines)


def risk_table(runs: list[Run]) -> str:
    """Markdown: per dataset and algorithm, the last evaluation's value at risk and conditional value at
    risk of the normalised scores (mean ± std over seeds; `mbrl_offline.evaluation.risk_measures`) at
    the runs' risk level alpha, beside the mean; empty when no run recorded them."""
    lines = ["| dataset | algorithm | seeds | alpha | final mean | final VaR | final CVaR |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for (dataset, label), group in group_runs(runs).items():
        measured = [r for r in group if r.scores and r.final_risk is not None]
        if not measured:
            continue
        levels = sorted({r.info.get("trainer", {}).get("risk_level") for r in measured}, key=str)
        alpha = ", ".join("-" if level is None else f"{level:g}" for level in levels)  # run.json records it
        lines.append(f"| {dataset} | {label} | {len(measured)} | {alpha} | "
                     f"{_mean_std([r.scores[-1] for r in measured])} | {_mean_std([r.final_risk[0] for r in measured])} | "
                     f"{_mean_std([r.final_risk[1] for r in measured])} |")
    return "\n".join(lines) if len(lines) > 2 else ""


# ------------------------------------------------------------------------------------------ aggregates
def final_scores(runs: list[Run]) -> dict[str, dict[str, np.ndarray]]:
    """Per algorithm (table label), per dataset: the final normalised scores of its evaluated runs."""
    scores: dict[str, dict[str, list[float]]] = {}
    for (dataset, label), group in group_runs(runs).items():
        finals = [r.scores[-1] for r in group if r.scores]
        if finals:
            scores.setdefault(label, {})[dataset] = finals
    return {label: {d: np.asarray(v) for d, v in tasks.items()} for label, tasks in scores.items()}


def aggregate_table(scores: dict[str, dict[str, np.ndarray]]) -> str:
    """Markdown: per algorithm, the IQM and the mean over its datasets of the final normalised scores,
    each with its 95% stratified bootstrap interval (`mbrl_offline.statistics`)."""
    lines = ["| algorithm | datasets | runs | IQM [95% CI] | mean [95% CI] |", "| --- | --- | ---: | ---: | ---: |"]
    for label, tasks in scores.items():
        values = list(tasks.values())
        lines.append(f"| {label} | {', '.join(tasks)} | {sum(v.size for v in values)} | "
                     f"{statistics.iqm_estimate(values).text()} | {statistics.mean_estimate(values).text()} |")
    return "\n".join(lines)


def improvement_table(scores: dict[str, dict[str, np.ndarray]]) -> str:
    """Markdown: for each ordered pair of algorithms run on a common dataset, the probability that a run
    of the first scores above a run of the second, averaged over their common datasets, with its 95%
    interval; empty with fewer than two such algorithms."""
    lines = ["| X | Y | common datasets | P(X > Y) [95% CI] |", "| --- | --- | --- | ---: |"]
    for x, x_tasks in scores.items():
        for y, y_tasks in scores.items():
            common = [d for d in x_tasks if d in y_tasks]
            if x == y or not common:
                continue
            estimate = statistics.probability_of_improvement([x_tasks[d] for d in common], [y_tasks[d] for d in common])
            lines.append(f"| {x} | {y} | {', '.join(common)} | {estimate.text(2)} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def plot_profiles(scores: dict[str, dict[str, np.ndarray]], out_dir: Path, name: str = "profiles.png") -> Path:
    """A PNG (``out_dir / name``) of each algorithm's performance profile (the share of runs above each
    normalised score, averaged over its datasets) with its 95% stratified bootstrap band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mbrl_offline.utils import save_figure

    every = np.concatenate([v for tasks in scores.values() for v in tasks.values()])
    low, high = min(0.0, float(every.min())), max(100.0, float(every.max()))
    thresholds = np.linspace(low, high, 201)
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=110)
    for label, tasks in scores.items():
        point, band_low, band_high = statistics.performance_profile(list(tasks.values()), thresholds)
        line, = ax.plot(thresholds, point, label=f"{label} ({len(tasks)} dataset{'s' if len(tasks) > 1 else ''})")
        ax.fill_between(thresholds, band_low, band_high, color=line.get_color(), alpha=0.2)
    ax.set_xlabel("normalised score tau")
    ax.set_ylabel("fraction of runs with score > tau")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out_dir / name
    try:
        save_figure(fig, path)  # never a half-written figure
    finally:
        plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------ curves
def plot_curves(runs: list[Run], out_dir: Path, prefix: str = "curves") -> list[Path]:
    """One PNG per dataset: each group's mean normalised score over seeds, shaded ±1 std."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mbrl_offline.utils import save_figure

    by_dataset: dict[str, dict[str, list[Run]]] = {}
    for (dataset, label), group in group_runs([r for r in runs if r.scores]).items():
        by_dataset.setdefault(dataset, {})[label] = group
    written = []
    for dataset, groups in by_dataset.items():
        fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=110)
        for label, group in groups.items():
            steps = sorted(set.intersection(*(set(r.steps) for r in group)))  # steps every seed evaluated
            if not steps:
                continue
            curves = np.array([[dict(zip(r.steps, r.scores))[s] for s in steps] for r in group])
            mean, std = curves.mean(axis=0), curves.std(axis=0)
            line, = ax.plot(steps, mean, marker="o" if len(steps) < 30 else None, markersize=3,
                            label=f"{label} ({len(group)} seed{'s' if len(group) > 1 else ''})")
            if len(group) > 1:
                ax.fill_between(steps, mean - std, mean + std, color=line.get_color(), alpha=0.2)
        data_score = next(iter(groups.values()))[0].info.get("dataset_score")
        if data_score is not None:
            ax.axhline(data_score, color="grey", linestyle="--", linewidth=1, label=f"data ({data_score:.1f})")
        ax.set_title(dataset)
        ax.set_xlabel("gradient updates")
        ax.set_ylabel("normalised score (mean ± std over seeds)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out_dir / f"{prefix}-{dataset}.png"
        try:
            save_figure(fig, path)  # never a half-written figure
        finally:
            plt.close(fig)
        written.append(path)
    return written


# ------------------------------------------------------------------------------------------ sweeps
def sweep_section(sweep: SweepSummary, out_dir: Path, index: int) -> str:
    import optuna

    from mbrl_offline.tune import eval_episodes_used, trial_counts

    study, config = sweep.study, sweep.info.get("config", {})
    counts = trial_counts(study)
    objective = config.get("objective", "last10")
    seeds = config.get("seeds", [])
    lines = [f"## Sweep `{study.study_name}` ({sweep.path})", "",
             "Trials: " + ", ".join(f"{n} {state.lower()}" for state, n in sorted(counts.items())) + ". "
             f"Each trial's value is the {'mean of the last ten evaluations' if objective == 'last10' else 'last evaluation'}"
             f" of its runs, averaged over {len(seeds)} seed(s) {seeds}.", "",
             f"**Online evaluation used by the tuning: {eval_episodes_used(study)} episodes in the real env** "
             f"(every evaluation of every trial, pruned and failed ones included). Scores chosen this way are not "
             f"purely offline; report this figure beside them.", ""]
    ranked = best_trials(study)
    if not ranked:
        return "\n".join(lines + ["No trial completed.", ""])
    names = list(ranked[0].params)
    lines += ["### Best trials", "", "| trial | value | " + " | ".join(f"`{n}`" for n in names) + " |",
              "| ---: | ---: | " + " | ".join("---" for _ in names) + " |"]
    for trial in ranked[:10]:
        lines.append(f"| {trial.number} | {trial.value:.2f} | "
                     + " | ".join(_format_value(trial.params.get(n)) for n in names) + " |")
    lines.append("")
    try:
        evaluator = optuna.importance.PedAnovaImportanceEvaluator()
        importances = optuna.importance.get_param_importances(study, evaluator=evaluator)
        lines += ["### Parameter importances", "",
                  "PED-ANOVA (Optuna): how far each parameter's values in the best 10% of complete trials are from "
                  "their spread over all of them; with few trials, a rough guide.", "",
                  "| parameter | importance |", "| --- | ---: |"]
        lines += [f"| `{name}` | {value:.3f} |" for name, value in importances.items()]
    except Exception as exc:  # too few complete trials, or a parameter that never varied
        lines += [f"Parameter importances: not available ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})."]
    lines.append("")
    if sweep.runs:
        plots = plot_curves(sweep.runs, out_dir, prefix=f"sweep{index}")
        lines += ["### Learning curves of the best trials", ""]
        lines += [f"![{p.stem}]({p.name})" for p in plots] + [""]
    return "\n".join(lines)


def _format_value(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


# ------------------------------------------------------------------------------------------ report
def runs_sections(runs: list[Run], out_dir: Path, prefix: str = "") -> list[str]:
    """The markdown lines of a report's runs (their tables, profiles and learning curves), the figures
    written to ``out_dir`` with names starting ``prefix`` (`write_report`, `mbrl_offline.reproduce`)."""
    lines = ["## Final normalised scores", "",
             "Per dataset and algorithm: the last evaluation (final) and the mean of the last ten evaluations "
             "(last 10) of each run, as mean ± std over seeds; `data` is the dataset's own mean score.", "",
             score_table(runs), ""]
    risks = risk_table(runs)
    if risks:
        lines += ["## The lower tail of the final evaluation", "",
                  "Per dataset and algorithm, each run's last evaluation: the value at risk (the alpha-quantile of "
                  "its episodes' normalised scores) and the conditional value at risk (the mean of the worst alpha "
                  "share of them) beside their mean, as mean ± std over seeds; alpha is the runs' "
                  "`trainer.risk_level`.", "", risks, ""]
    scores = final_scores(runs)
    if scores:
        profiles = plot_profiles(scores, out_dir, f"{prefix}profiles.png")
        lines += ["## Aggregate over datasets", "",
                  "Per algorithm, the final normalised scores of all its runs: the interquartile mean (the mean "
                  "of the middle 50% of runs pooled over datasets) and the mean over datasets, each with its 95% "
                  "stratified bootstrap confidence interval (50,000 replicates, each redrawing every dataset's "
                  "runs; Agarwal et al., 2021, as the rliable library computes them). Compare algorithms only on "
                  "the same datasets.", "", aggregate_table(scores), "",
                  f"![profiles]({profiles.name})", "",
                  "Performance profiles: the share of runs whose final score is above each threshold, averaged "
                  "over the algorithm's datasets, with 95% bootstrap bands.", ""]
        improvements = improvement_table(scores)
        if improvements:
            lines += ["## Probability of improvement", "",
                      "P(X > Y): the chance that a run of X ends above a run of Y on the same dataset (a tie counts "
                      "half), averaged over their common datasets, with its 95% stratified bootstrap interval.", "",
                      improvements, ""]
    lines += ["## Learning curves", ""]
    lines += [f"![{p.stem}]({p.name})" for p in plot_curves(runs, out_dir, f"{prefix}curves")] + [""]
    return lines


def write_report(paths: list[str | Path], out_dir: str | Path, command: Optional[str] = None) -> Path:
    """Write ``report.md`` and its PNG figures to ``out_dir``; returns the markdown file's path. The
    output folder is checked before any log is read; each file is written whole or not at all, and a
    failed write (a full disk) is one `ReportError` line."""
    from mbrl_offline.config import check_writable_dir
    from mbrl_offline.errors import ConfigError, FileWriteError
    from mbrl_offline.utils import write_failure_reason

    try:
        check_writable_dir(out_dir, "--out")
    except ConfigError as exc:
        raise ReportError(str(exc)) from None
    runs, sweeps = find_runs(paths)
    out_dir = Path(out_dir)
    try:
        return _write_report(runs, sweeps, out_dir, command)
    except (OSError, FileWriteError) as exc:
        reason = exc.reason if isinstance(exc, FileWriteError) else write_failure_reason(exc, out_dir)
        filename = exc.path if isinstance(exc, FileWriteError) else exc.filename
        where = f" ({filename})" if filename else ""
        raise ReportError(f"cannot write the report in {out_dir}: {reason}{where}; nothing was left "
                          f"half-written. Free some space or choose another --out.") from None


def _write_report(runs: list[Run], sweeps: list[SweepSummary], out_dir: Path, command: Optional[str]) -> Path:
    from mbrl_offline.utils import atomic_write_bytes

    out_dir.mkdir(parents=True, exist_ok=True)
    lines = ["# Report", ""]
    if command:
        lines += [f"Made by `{command}`.", ""]
    if runs:
        lines += runs_sections(runs, out_dir)
    for index, sweep in enumerate(sweeps):
        lines.append(sweep_section(sweep, out_dir, index))
    report = out_dir / "report.md"
    atomic_write_bytes(report, "\n".join(lines))
    return report
