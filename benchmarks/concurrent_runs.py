"""Several training runs on one device at once: the total throughput of 1, 2, 4, 8 and 16 concurrent runs of
RAVL, MOPO and TD3+BC, each a full run as the train tool makes it (its generator included).

    python benchmarks/concurrent_runs.py --device cuda [--agents ravl mopo td3bc] [--runs 1 2 4 8 16]
        [--epochs 3] [--updates 1000] [--budget paper] [--mps]

Each run is its own process (what ``hydra/launcher=joblib`` starts for a grid): `mbrl_offline.build_run` of
the agent on bundled ``--dataset`` (default hopper-medium) at ``--budget`` (its published generator and settings), ``--epochs``
epochs of ``--updates`` updates, one 1-episode evaluation at the end. The model-based agents' dynamics
model is fitted once first (``--dynamics-epochs``, default 5: the speed of training does not depend on
how well the model fits) and loaded from the cache by every run. The runs build their trainers, wait for
each other, and train together.

Prints, per agent and number of runs N: each run's update rate after its first epoch (generation
included, the evaluation not; the first epoch holds the one-off costs: CUDA graph capture, allocator
growth), the total N x the mean per-run rate, its gain over one run, and the wall time from the common
start to the last run's end. On a GPU the number of runs worth starting is where the total stops
growing; docs/gpu.md has the figures. With ``--mps`` the runs share the GPU through CUDA's Multi-Process
Service: the script starts a private MPS control daemon (``nvidia-cuda-mps-control -d``, with its pipe
and log folders in a temporary folder, so nothing outside changes) and stops it at the end; without it,
the GPU time-slices between processes. On a CPU, ``--threads`` (default: the cores divided by N) threads
per run.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mbrl_offline.platform import MPS_CONTROL

DATASET = "hopper-medium"  # the default --dataset


def _run(algo: str, dataset: str, device: str, budget: str, epochs: int, updates: int, threads: int, cache: str, run_dir: str,
         dynamics_epochs: int, barrier, results) -> None:
    import torch

    from mbrl_offline import build_run, load_dataset
    from mbrl_offline.compose import run_configs

    torch.set_num_threads(threads)
    data = load_dataset(dataset)
    env = data.env_name
    algo_config, generator_config, _ = run_configs(algo, budget, env=env,
                                                   overrides=_model_overrides(algo, budget, env, dynamics_epochs))
    from mbrl_offline.trainer import TrainerConfig

    trainer_config = TrainerConfig(epochs=epochs, updates_per_epoch=updates, eval_every=epochs, eval_episodes=1,
                                   checkpoint_every=epochs, run_dir=run_dir, progress=False, tensorboard=False)
    trainer = build_run(algo, data, algo_config, generator_config, trainer_config, device, cache_dir=cache)
    barrier.wait()
    start = time.time()
    trainer.train()
    end = time.time()
    records = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    steady = [r["speed"]["epoch_seconds"] - r["speed"].get("eval_seconds", 0.0) for r in records[1:]]
    results.put({"start": start, "end": end, "rate": updates * len(steady) / sum(steady)})


def _model_overrides(algo: str, budget: str, env: str, dynamics_epochs: int) -> list[str]:
    """Caps on the dynamics fit (the model's quality does not change the speed), for agents with one."""
    from mbrl_offline.compose import run_configs

    generator = run_configs(algo, budget, env=env)[1]
    if getattr(generator, "kind", None) != "rollouts":
        return []
    return [f"generator.dynamics.max_epochs={dynamics_epochs}", "generator.dynamics.min_epochs=0"]


def fit_models(agents: list[str], dataset: str, budget: str, device: str, cache: str, dynamics_epochs: int) -> None:
    """Each model-based agent's dynamics model, fitted once into ``cache`` before the runs load it."""
    from mbrl_offline import build_run, load_dataset
    from mbrl_offline.compose import run_configs
    from mbrl_offline.trainer import TrainerConfig

    data = load_dataset(dataset)
    env = data.env_name
    for algo in agents:
        overrides = _model_overrides(algo, budget, env, dynamics_epochs)
        if overrides:
            algo_config, generator_config, _ = run_configs(algo, budget, env=env, overrides=overrides)
            with tempfile.TemporaryDirectory() as run_dir:
                build_run(algo, data, algo_config, generator_config,
                          TrainerConfig(epochs=1, run_dir=run_dir, progress=False, tensorboard=False), device,
                          cache_dir=cache)


def measure(algo: str, runs: int, args, cache: str) -> dict:
    """``runs`` concurrent runs of ``algo``: per-run rates, their total, and the wall time."""
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(runs), context.Queue()
    threads = args.threads or max(1, (os.cpu_count() or 1) // runs)
    with tempfile.TemporaryDirectory() as root:
        processes = [context.Process(target=_run, args=(algo, args.dataset, args.device, args.budget, args.epochs, args.updates,
                                                        threads, cache, str(Path(root) / f"run{i}"),
                                                        args.dynamics_epochs, barrier, results))
                     for i in range(runs)]
        for process in processes:
            process.start()
        done = []
        while len(done) < runs:
            try:
                done.append(results.get(timeout=5))
            except queue.Empty:
                if any(p.exitcode not in (None, 0) for p in processes):
                    for process in processes:
                        process.kill()
                    raise SystemExit(f"a run of {algo} failed (see its traceback above)")
        for process in processes:
            process.join()
            if process.exitcode != 0:
                raise SystemExit(f"a run of {algo} failed (exit status {process.exitcode})")
    rates = [d["rate"] for d in done]
    return {"rates": rates, "total": runs * statistics.mean(rates),
            "wall": max(d["end"] for d in done) - min(d["start"] for d in done)}


class MPSDaemon:
    """A private CUDA MPS control daemon for this script's runs (pipe and log folders in a temporary folder)."""

    def __init__(self):
        if shutil.which(MPS_CONTROL) is None:
            raise SystemExit(f"--mps: {MPS_CONTROL} is not on PATH (it comes with the NVIDIA driver)")
        self.folder = tempfile.mkdtemp(prefix="mps-")
        self.env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": f"{self.folder}/pipe",
                    "CUDA_MPS_LOG_DIRECTORY": f"{self.folder}/log"}

    def __enter__(self):
        for name in ("pipe", "log"):
            os.makedirs(f"{self.folder}/{name}")
        subprocess.run([MPS_CONTROL, "-d"], env=self.env, check=True)
        os.environ.update({k: self.env[k] for k in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")})
        return self

    def __exit__(self, *exc):
        subprocess.run([MPS_CONTROL], input="quit\n", text=True, env=self.env)
        for key in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
            os.environ.pop(key, None)
        shutil.rmtree(self.folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--agents", nargs="+", default=["ravl", "mopo", "td3bc"])
    parser.add_argument("--runs", nargs="+", type=int, default=[1, 2, 4, 8, 16])
    parser.add_argument("--epochs", type=int, default=3, help="epochs per run (the first is not timed)")
    parser.add_argument("--updates", type=int, default=1000, help="updates per epoch")
    parser.add_argument("--dataset", default=DATASET, help="a bundled dataset")
    parser.add_argument("--budget", default="paper", help="the budget whose generator settings the runs take")
    parser.add_argument("--dynamics-epochs", type=int, default=5, help="epochs of the one dynamics fit")
    parser.add_argument("--threads", type=int, default=None, help="torch threads per run (CPU)")
    parser.add_argument("--mps", action="store_true", help="share the GPU through a private CUDA MPS daemon")
    args = parser.parse_args()
    if args.epochs < 2 or args.updates < 1 or args.dynamics_epochs < 1 or min(args.runs) < 1:
        parser.error("--epochs must be at least 2 (the first is not timed); --updates, --dynamics-epochs and "
                     "--runs at least 1")
    if args.mps and not args.device.startswith("cuda"):
        parser.error("--mps shares a CUDA GPU; give --device cuda")
    import torch

    from mbrl_offline.algorithms import ALGORITHMS
    from mbrl_offline.data.sources import bundled_datasets

    unknown = [a for a in args.agents if a not in ALGORITHMS]
    if unknown:
        parser.error(f"unknown agents {unknown}; known: {', '.join(ALGORITHMS)}")
    if args.dataset not in bundled_datasets():
        parser.error(f"--dataset {args.dataset} is not a bundled dataset; choose one of {', '.join(bundled_datasets())}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda: this machine has no CUDA GPU")
    name = (torch.cuda.get_device_name(torch.device(args.device)) if args.device.startswith("cuda")
            else f"{os.cpu_count()}-core CPU")
    print(f"{name}; torch {torch.__version__}; budget {args.budget}; {args.epochs} epochs x {args.updates} updates "
          f"per run on {args.dataset}; MPS {'on' if args.mps else 'off'}")
    print("| agent | runs | per-run updates/s (after epoch 1) | total updates/s | gain over 1 run | wall time (s) |")
    print("|---|---:|---:|---:|---:|---:|", flush=True)
    with tempfile.TemporaryDirectory() as cache:
        fit_models(args.agents, args.dataset, args.budget, args.device, cache, args.dynamics_epochs)
        mps = MPSDaemon() if args.mps else None
        if mps is not None:
            mps.__enter__()
        try:
            for algo in args.agents:
                one = None
                for runs in args.runs:  # each row as it is measured, so a stopped benchmark keeps its rows
                    result = measure(algo, runs, args, cache)
                    one = result if runs == 1 else one
                    gain = f"{result['total'] / one['total']:.2f}x" if one else "-"
                    print(f"| {algo} | {runs} | {statistics.mean(result['rates']):.1f} (min {min(result['rates']):.1f}) "
                          f"| {result['total']:.1f} | {gain} | {result['wall']:.0f} |", flush=True)
        finally:
            if mps is not None:
                mps.__exit__(None, None, None)


if __name__ == "__main__":
    main()
