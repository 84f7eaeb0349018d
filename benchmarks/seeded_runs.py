"""Seeded runs of every agent with its published generator (and IQL with SynthER, TD3+BC with PGD), at
tiny sizes, through the command line of a checkout, for showing that a restructuring changed no number.

    python benchmarks/seeded_runs.py /path/to/checkout-before out/before
    python benchmarks/seeded_runs.py /path/to/checkout-after out/after
    python benchmarks/seeded_runs.py --compare out/before out/after

Each case runs ``python <checkout>/examples/train.py`` with that checkout first on the path, one torch
thread, seed 0, on bundled pendulum data, with its own model cache under the output folder, and writes
its ``metrics.jsonl`` records without the timings (``speed``) to ``<out>/<case>.json``. ``--compare``
says which cases' files differ. Two checkouts of the same code give identical files on one machine.
Extra arguments after the output folder name the cases to run (default: all).
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

COMMON = ["env=pendulum", "seed=0", "trainer.epochs=2", "trainer.updates_per_epoch=40", "trainer.eval_episodes=2",
          "trainer.tensorboard=false", "trainer.progress=false", "torch_threads=1", "overwrite=true"]
ROLLOUTS = ["generator.dynamics.max_epochs=3", "generator.dynamics.min_epochs=0", "generator.dynamics.ensemble_size=4",
            "generator.dynamics.num_elites=3", "generator.rollout.rollouts_per_epoch=200", "generator.every=20"]
CASES = {
    "ravl": ["algo=ravl", *ROLLOUTS], "mopo": ["algo=mopo", *ROLLOUTS], "mobile": ["algo=mobile", *ROLLOUTS],
    "coplanner": ["algo=coplanner", *ROLLOUTS], "td3bc": ["algo=td3bc"], "iql": ["algo=iql"],
    "neubay": ["algo=neubay", "budget=quick", "generator.dynamics.max_epochs=2", "generator.dynamics.ensemble_size=4",
               "generator.dynamics.num_elites=2", "generator.posterior.parallel=2", "algo.batch_size=64"],
    "iql-synther": ["algo=iql", "generator=synther", "generator.train.steps=50", "generator.samples=500",
                    "generator.denoiser.width=32", "generator.edm.steps=4", "generator.sample_batch=500"],
    "td3bc-pgd": ["algo=td3bc", "generator=pgd", "generator.train.steps=30", "generator.train_epochs=null",
                  "generator.trajectories=8", "generator.unet.base=16", "generator.edm.steps=4", "generator.length=17",
                  "generator.window=16", "generator.every=30"],
}


def run(checkout: Path, out: Path, names: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(checkout), "MBRL_OFFLINE_CACHE": str(out / "cache")}
    for name in names or list(CASES):
        run_dir = out / "runs" / name
        start = time.time()
        result = subprocess.run([sys.executable, str(checkout / "examples" / "train.py"), *CASES[name], *COMMON,
                                 f"trainer.run_dir={run_dir}", f"dynamics_cache={out / 'cache' / 'models'}"],
                                env=env, capture_output=True, text=True)
        if result.returncode:
            print(f"{name}: failed: {result.stderr.strip().splitlines()[-1]}", flush=True)
            continue
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        for record in records:
            record.pop("speed", None)
        (out / f"{name}.json").write_text(json.dumps(records, indent=1, sort_keys=True))
        print(f"{name}: {time.time() - start:.0f} s, final score {records[-1]['eval']['normalized_score']:.2f}",
              flush=True)


def compare(a: Path, b: Path) -> int:
    differ = 0
    for name in CASES:
        files = a / f"{name}.json", b / f"{name}.json"
        if not all(f.is_file() for f in files):
            print(f"{name}: missing")
            differ += 1
        elif files[0].read_text() != files[1].read_text():
            print(f"{name}: DIFFERENT")
            differ += 1
        else:
            print(f"{name}: identical")
    return 1 if differ else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--compare"]:
        sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
    run(Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve(), sys.argv[3:])
