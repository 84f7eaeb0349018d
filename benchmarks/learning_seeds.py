"""The learning tests (`tests/test_learning.py`) for any seeds: the seed tables of docs/learning-seeds.md
and docs/reproducibility.md.

    python benchmarks/learning_seeds.py --agents td3bc iql --seeds 0 1 2 [--threads 1] [--jobs 2]
    python benchmarks/learning_seeds.py --agents neubay --seeds 0 1 2 --refiner [--refiner-sigma-min 0.001]
    python benchmarks/learning_seeds.py --agents td3bc --seeds 0 1 2 --jobs 2 --out docs/learning-seeds.md

Each (agent, seed) trains with exactly the test's settings (`CASES` there; the seed goes to
`TrainerConfig.seed`, which also seeds torch) in its own process with ``--threads`` torch threads,
``--jobs`` at a time; the cases' dynamics models are trained first, with torch seeded 0 (as CI's seed-0
run fits them), and shared by every seed. Prints one markdown row per agent: whether the case runs the
agent's published settings (`runs_published_settings` in the test file) or adjusted ones, each seed's
final score (the mean of its last three evaluations, as the test takes it), the data's score, whether
every seed clears the test's bar (20 points above the data) and the training minutes, with the
machine's CPU. ``--out`` also writes the rows into that page (docs/learning-seeds.md), each with its
commit, CPU and command, replacing the rows of the same case, settings, dataset and schedule and keeping
the others.
``--defaults`` runs the agents' published settings instead of their cases'; ``--dataset``, ``--epochs``
and ``--updates`` (with or without it) replace the case's dataset and schedule: the trial of a case before
the test takes it. ``--refiner``
refines each model step of the cases' generators (rollouts or NEUBAY's posterior) with the PDE-Refiner at
its defaults (`mbrl_offline.models.refiner.RefinerConfig`; ``--refiner-sigma-min`` sets its last noise
level).
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from mbrl_offline.platform import code_version, cpu_name

TEST_FILE = Path(__file__).resolve().parents[1] / "tests" / "test_learning.py"


def learning_cases(source: str | None = None):
    """`tests/test_learning.py` as a module (the tests are not a package): its `CASES` and their runs.
    ``source``: the file's text as an invocation read it when it started, which every one of its runs
    takes, so that an edit of the file while runs go on changes none of them (each run builds its cases
    afresh in its own process); None reads the file now."""
    if source is None:
        source = TEST_FILE.read_text(encoding="utf-8")
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader("learning_cases", loader=None))
    module.__file__ = str(TEST_FILE)
    exec(compile(source, str(TEST_FILE), "exec"), module.__dict__)
    return module


def with_trial(cases, names, defaults=False, dataset=None, epochs=None, updates=None):
    """``cases`` (the test module) with each of ``names``' cases on ``dataset`` for ``epochs`` of ``updates``
    (None: the case's own), running its agent's published settings (`published` in the test file, as
    budget=cpu composes them; with the case's generator where the case pairs the agent with another,
    `pairing`) where ``defaults``, else the case's own settings: the trial of a case before the test takes
    it (``--defaults``, ``--dataset``, ``--epochs``, ``--updates``)."""
    for name in names:
        agent_cls, configs, case_dataset, case_epochs, *case_updates = cases.CASES[name]
        dataset_now = dataset or case_dataset
        if defaults:
            configs = cases.published(agent_cls.name, dataset_now, cases.pairing(name))
        cases.CASES[name] = (agent_cls, configs, dataset_now, epochs or case_epochs,
                             *([updates] if updates else case_updates))
    return cases


def _run(name: str, seed: int, threads: int, cache_dir: str, refiner_sigma_min=None, trial=None, source=None
         ) -> tuple[str, int, float, float, float]:
    import torch

    from mbrl_offline.models.refiner import RefinerConfig

    torch.set_num_threads(threads)
    cases = learning_cases(source)
    if trial is not None:
        with_trial(cases, [name], *trial)
    refiner = None if refiner_sigma_min is None else RefinerConfig(enabled=True, sigma_min=refiner_sigma_min)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as run_dir:
        data_score, scores = cases.learning_run(name, Path(run_dir) / "run", cache_dir, seed=seed, refiner=refiner)
    print(f"{name} seed {seed}: evaluations {', '.join(f'{s:.1f}' for s in scores)}", flush=True)
    return name, seed, data_score, sum(scores[-3:]) / 3, (time.perf_counter() - start) / 60


def prefit(cases, name: str, cache_dir: str) -> None:
    """Case ``name``'s generator model (a dynamics ensemble, a posterior, a diffusion model), if it has one,
    fitted into ``cache_dir`` as `build_run` fits it for CI's seed 0 (torch seeded 0, then the generator
    built), so that every seed's run loads that model, as every seed of CI's shared-model cases would."""
    import torch

    from mbrl_offline import load_dataset
    from mbrl_offline.generators import build_generator

    agent_cls, configs, dataset, *_ = cases.CASES[name]
    generator = configs()[1]
    if generator.kind == "none":
        return
    torch.manual_seed(0)
    build_generator(generator, load_dataset(dataset), "cpu", cache_dir, None, False)


def main() -> None:
    source = TEST_FILE.read_text(encoding="utf-8")  # every run takes the cases as they are now (`learning_cases`)
    cases = learning_cases(source)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", nargs="+", default=list(cases.CASES), choices=list(cases.CASES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time")
    parser.add_argument("--defaults", action="store_true",
                        help="run the agents' published settings (budget=cpu) in place of their cases' settings")
    parser.add_argument("--dataset", default=None, help="this bundled dataset in place of the case's")
    parser.add_argument("--epochs", type=int, default=None, help="this many epochs in place of the case's")
    parser.add_argument("--updates", type=int, default=None,
                        help="this many updates per epoch in place of the case's")
    parser.add_argument("--out", type=Path, default=None,
                        help="also write the rows into this page (docs/learning-seeds.md), keeping other cases' rows")
    parser.add_argument("--refiner", action="store_true", help="refine each model step with the PDE-Refiner")
    parser.add_argument("--refiner-sigma-min", type=float, default=None,
                        help="the refiner's last noise std (default: RefinerConfig's); implies --refiner")
    args = parser.parse_args()
    if any(s < 0 for s in args.seeds) or args.threads < 1 or args.jobs < 1:
        parser.error("seeds must be >= 0, --threads and --jobs at least 1")
    if args.out is not None and (args.refiner or args.refiner_sigma_min is not None):
        parser.error("--out records the tests' own runs: leave out --refiner")
    if (args.epochs is not None and args.epochs < 1) or (args.updates is not None and args.updates < 1):
        parser.error("--epochs and --updates must be at least 1")
    if args.dataset is not None:
        from mbrl_offline.data.sources import bundled_datasets

        if args.dataset not in bundled_datasets():
            parser.error(f"--dataset {args.dataset} is not a bundled dataset: {', '.join(bundled_datasets())}")
    trial = (args.defaults, args.dataset, args.epochs, args.updates)
    trial = None if trial == (False, None, None, None) else trial
    if trial is not None:
        with_trial(cases, args.agents, *trial)
    if args.out is not None and args.out.suffix != ".md":
        parser.error(f"--out {args.out} must name a .md page (e.g. docs/learning-seeds.md)")
    sigma_min = None
    if args.refiner or args.refiner_sigma_min is not None:
        from mbrl_offline.models.refiner import RefinerConfig

        sigma_min = args.refiner_sigma_min if args.refiner_sigma_min is not None else RefinerConfig().sigma_min
        if not 0 < sigma_min < 1:
            parser.error("--refiner-sigma-min must be in (0, 1)")
        for name in args.agents:
            try:
                cases.with_refiner(cases.CASES[name][1]()[1], RefinerConfig(enabled=True, sigma_min=sigma_min))
            except ValueError as error:
                parser.error(f"--refiner refines model steps, and {name}'s {error}")

    code = code_version()  # the code the runs start from (edits while they run are not theirs)
    commit = (code["commit"] or "-")[:7] + ("+" if code["modified"] else "")
    with tempfile.TemporaryDirectory() as cache_dir:
        import torch

        torch.set_num_threads(args.threads * args.jobs)
        for name in args.agents:  # each model fitted once, before the runs, as CI's seed 0 fits it
            prefit(cases, name, cache_dir)
        with ProcessPoolExecutor(args.jobs) as pool:
            results = list(pool.map(_run, *zip(*[(n, s, args.threads, cache_dir, sigma_min, trial, source)
                                                 for n in args.agents for s in args.seeds])))

    refined = "" if sigma_min is None else f"; model steps refined (PDE-Refiner, sigma_min {sigma_min:g})"
    machine = f"{cpu_name()}, {args.threads} thread(s) per run, {args.jobs} run(s) at a time{refined}"
    print(machine)
    rows = {name: table_row(cases, name, [r for r in results if r[0] == name]) for name in args.agents}
    print(HEADER)
    for row in rows.values():
        print(row)
    sys.stdout.flush()
    if args.out:
        command = "python benchmarks/learning_seeds.py " + " ".join(sys.argv[1:])
        write_page(Path(args.out), cases, {name: f"{row} {commit} | {machine} | `{command}` |"
                                           for name, row in rows.items()})
        print(f"wrote {args.out}")


HEADER = ("| case | settings | dataset (score) | schedule | seeds: final score | every seed >= data + 20 "
          "| minutes per run |")
PAGE_HEADER = HEADER + " commit | machine | command |"


def table_row(cases, name: str, rows) -> str:
    """Case ``name``'s markdown row from its runs' results (name, seed, data score, final score, minutes)."""
    agent_cls, _, dataset, epochs, *updates = cases.CASES[name]
    data_score = rows[0][2]
    finals = ", ".join(f"{seed}: {final:.1f}" for _, seed, _, final, _ in rows)
    passed = all(final >= data_score + 20 for *_, final, _ in rows)
    minutes = f"{min(r[4] for r in rows):.1f}-{max(r[4] for r in rows):.1f}"
    settings = "published (budget=cpu)" if cases.runs_published_settings(name) else "adjusted"
    schedule = f"{epochs} x {(updates or [250])[0]} updates"
    return (f"| {name} | {settings} | {dataset} ({data_score:.1f}) | {schedule} | {finals} | "
            f"{'yes' if passed else 'no'} | {minutes} |")


def write_page(path: Path, cases, rows: dict[str, str]) -> None:
    """``path`` with ``rows`` (case name -> its row) in place of earlier rows of the same case, settings
    (published or adjusted), dataset and schedule, the other rows kept, in the order of the test file's
    cases; written whole or not at all."""
    from mbrl_offline.utils import atomic_write_bytes

    kept = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            cells = [c.strip() for c in line.split("|")]
            if len(cells) > 5 and cells[1] in cases.CASES:
                kept[tuple(cells[1:5])] = line
    for row in rows.values():
        kept[tuple(cell.strip() for cell in row.split("|")[1:5])] = row
    ordered = [kept[key] for name in cases.CASES for key in sorted(kept) if key[0] == name]
    rule = "|---" * (PAGE_HEADER.count("|") - 1) + "|"
    text = "\n".join([PAGE_TEXT, PAGE_HEADER, rule, *ordered]) + "\n"
    atomic_write_bytes(path, text.encode("utf-8"))


PAGE_TEXT = """# The learning tests' seeds

Written by `python benchmarks/learning_seeds.py ... --out docs/learning-seeds.md` (each row's command is in
its last column). A row is one case of `tests/test_learning.py` (its `CASES`) on one dataset and schedule,
with settings published or adjusted, and is replaced when the same is measured again. The rows cover the
tests' own cases and the trials (of agents' published settings, `--defaults`, or of a case's settings on
another dataset or schedule) that no test took because a seed missed the bar. CI runs seed 0 of every case; these rows show the other seeds.

- **settings**: `published (budget=cpu)` where the run took the agent's published settings and
  generator exactly as `python examples/train.py algo=<agent> env=<env> env.dataset=<dataset>
  budget=cpu` composes them (env: the dataset's), with the case's own schedule; `adjusted` where the
  test changes them (the test file says which settings and why; docs/reproducibility.md has the earlier
  measurements).
- **schedule**: epochs x updates per epoch (MOReL's NPG: iterations).
- **final score**: the mean of the run's last three evaluations (10 episodes each), as the test takes it;
  the bar is the data's normalised score + 20.
- **minutes per run**: with the machine's other runs at the same time (the machine column), so a rough
  guide.
"""


if __name__ == "__main__":
    main()
