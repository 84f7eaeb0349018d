"""Our RAVL pipeline against the official RAVL code on this machine, in the same minutes.

    git clone https://github.com/anyasims/edge-of-reach /path/to/edge-of-reach
    python benchmarks/vs_official.py --edge-of-reach /path/to/edge-of-reach [--pairs 3] [--threads 2]
                                     [--measures dynamics agent rollouts]

`throughput.py` divides by the official figures recorded in ../shared/research/peer_speed.md, which
were measured on one CPU (a 2-core AMD EPYC, Zen 5, fp32 matmul peak 177-186 GFLOP/s); on another CPU,
or when the machine's speed drifts, that ratio means little. This script measures both codes here:
for each measure it runs the official code and ours in separate processes, one after the other,
``--pairs`` times, so that each pair shares the machine's state, and prints each pair's ratio. Each
process also times 1024^3 fp32 matmuls before and after, as `throughput.py` does.

The official side builds the official classes and runs the official training loops' bodies around
them, on the CPU (the official scripts themselves need CUDA, D4RL and wandb), with the method of
peer_speed.md:

* agent: the update loop body (5% of a 256 batch from a 1M-row dataset buffer, the rest from a full
  1.25M-row model buffer, ``torch.cat``, ``Agent.update``) at the official defaults (10 critics,
  3x256, eta 1), 30 warm-up updates, then 5 x 200 timed; ours: `throughput.bench_updates`;
* dynamics: the batch loop of ``train_dynamics_model.train`` (its ``DataLoader`` over an
  ``EnsembleTransitionDataset``, the member permutation, the 7 member modules one after another, Adam
  with the per-layer weight decay groups) on 100k random hopper-shaped rows, 20 warm-up batches, then
  3 x 300 timed; ours: the training batches of `GaussianEnsembleDynamics.fit` (the epoch log's
  ``samples_per_s``) over one epoch of the same number of rows, 3 fits;
* rollouts: ``RolloutGenerator.generate_rollouts`` on 50,000 start states sampled from a 1M-row
  ``DataBuffer`` (horizon 5, buffer insert included), 1 warm-up call and 3 timed; ours:
  `throughput.bench_rollouts`. No rollout ends early on either side (the official model predicts
  no change from an upright hopper; ours uses a never-terminating function), so both generate all
  250,000 transitions per call.

With ``MBRL_OFFLINE_MKL_AVX512=1`` in the environment both sides' processes let MKL run its AVX-512
code on an AMD CPU (`mbrl_offline.mkl_avx512`), so the comparison stays like for like; the peak column
shows which code ran (about twice the GFLOP/s with it).

Two adapters, needed on a CPU, change nothing that is timed: ``gym`` is aliased to gymnasium if it
is not installed, and the official rollout's ``done.to(reward.get_device())``, which is ``.to(-1)``
on a CPU and raises, gets a tensor wrapper that keeps ``done`` on the CPU. The official dynamics model
for rollouts is built with its ``Ensemble`` class directly instead of loaded from a saved run.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import mbrl_offline  # noqa: F401  (before torch: MBRL_OFFLINE_MKL_AVX512=1 acts on both sides' MKL)
import numpy as np
import torch

import throughput
from mbrl_offline import mkl_avx512

OBS, ACT = throughput.OBS, throughput.ACT
UNITS = {"agent": "updates/s", "dynamics": "samples/s", "rollouts": "transitions/s"}


def random_dataset(rows: int, upright: bool = False) -> dict[str, np.ndarray]:
    """`throughput.random_transitions` as the numpy arrays the official loaders take."""
    data = {key: value.numpy() for key, value in throughput.random_transitions(rows, torch.device("cpu")).items()}
    if upright:  # hopper standing: height 1.25, angle 0, so the termination function never fires
        data["observations"][:] = 0.0
        data["observations"][:, 0] = 1.25
    return data


class _DoneOnCPU:
    """The official rollout moves ``done`` with ``.to(reward.get_device())``, which is -1 on a CPU."""

    def __init__(self, done: torch.Tensor):
        self.done = done

    def to(self, device_index):
        return self.done if device_index == -1 else self.done.to(device_index)


def official_rates(checkout: Path, measure: str) -> list[float]:
    try:
        import gym  # noqa: F401
    except ImportError:
        import gymnasium
        sys.modules["gym"] = gymnasium
    sys.path.insert(0, str(checkout))
    from agent_training.agent import Actor, Agent, VectorizedCritic
    from shared.data_buffer import DataBuffer

    if measure == "agent":
        actor, critic = Actor(OBS, ACT, 256, 1.0), VectorizedCritic(OBS, ACT, 256, 10)
        agent = Agent(actor=actor, actor_optimizer=torch.optim.Adam(actor.parameters(), lr=3e-4), critic=critic,
                      critic_optimizer=torch.optim.Adam(critic.parameters(), lr=3e-4), gamma=0.99, tau=5e-3,
                      eta=1.0, auto_alpha=True, alpha_learning_rate=3e-4, device="cpu")
        dataset_buffer, model_buffer = DataBuffer(OBS, ACT, 1_000_000), DataBuffer(OBS, ACT, 1_250_000)
        dataset_buffer.load_d4rl_dataset(random_dataset(1_000_000))
        model_buffer.load_d4rl_dataset(random_dataset(1_250_000))
        from_dataset = int(0.05 * 256)

        def updates(n: int) -> float:
            start = time.perf_counter()
            for _ in range(n):
                real, synthetic = dataset_buffer.sample(from_dataset), model_buffer.sample(256 - from_dataset)
                agent.update([torch.cat([real[i], synthetic[i]]) for i in range(len(real))])
            return n / (time.perf_counter() - start)

        updates(30)
        return [updates(200) for _ in range(5)]

    from dynamics_training.ensemble import Ensemble, EnsembleTransitionDataset, Transition
    params = dict(env_name="hopper-medium-v2", seed=0, num_models=7, num_elites=5, train_memory=2_000_000,
                  val_memory=500_000, train_val_ratio=0.2, l2_reg_multiplier=1.0, hidden_dim=200,
                  ob_dim=OBS, ac_dim=ACT)
    if measure == "dynamics":
        from torch.utils.data import DataLoader
        ensemble = Ensemble(params)
        ensemble.load_memory(random_dataset(100_000))
        optimizer = torch.optim.Adam(ensemble.weights, lr=1e-3)
        train = Transition(*ensemble.memory.sample_all())
        loader = DataLoader(EnsembleTransitionDataset(train, ensemble.state_filter, ensemble.action_filter,
                                                      n_models=7), shuffle=True, batch_size=256)
        batches = iter(loader)

        def train_batches(n: int) -> float:
            nonlocal batches
            start = time.perf_counter()
            for _ in range(n):
                try:
                    x, delta, reward = next(batches)
                except StopIteration:
                    batches = iter(loader)
                    x, delta, reward = next(batches)
                perm = np.random.choice(7, size=7, replace=False)
                x, delta, reward = x[:, perm], delta[:, perm], reward[:, perm]
                loss = 0
                for member in range(7):
                    loss += ensemble.networks[member].train_model_forward(x[:, member], delta[:, member],
                                                                          reward[:, member])
                loss.item()  # the official loop logs it every batch
                loss += 0.01 * ensemble.max_logvar.sum() - 0.01 * ensemble.min_logvar.sum()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            return n * 256 / (time.perf_counter() - start)

        train_batches(20)
        return [train_batches(300) for _ in range(3)]

    if measure == "rollouts":
        from agent_training.rollout_generation import DynamicsModel, RolloutGenerator, hopper_is_done_func
        model = DynamicsModel.__new__(DynamicsModel)  # its __init__ loads a saved run; build the ensemble here
        model.env_name, model.state_dim, model.action_dim = "hopper-medium-v2", OBS, ACT
        model.done_func = lambda next_obs: _DoneOnCPU(hopper_is_done_func(next_obs))
        model.ensemble = Ensemble(params)
        statistics_from = random_dataset(10_000)  # the input normalisers, as loading a trained model sets them
        model.ensemble.state_filter.update(statistics_from["observations"])
        model.ensemble.action_filter.update(statistics_from["actions"])
        with torch.no_grad():  # predict no change with a small std, as in peer_speed.md
            for network in model.ensemble.networks.values():
                for head in (network.net.delta, network.net.logvar):
                    head.weight.zero_()
                network.net.delta.bias.zero_()
                network.net.logvar.bias.fill_(-10.0)
        dataset_buffer = DataBuffer(OBS, ACT, 1_000_000)
        dataset_buffer.load_d4rl_dataset(random_dataset(1_000_000, upright=True))
        generator = RolloutGenerator(model=model, actor=Actor(OBS, ACT, 256, 1.0), steps_k=5, num_rollouts=50_000,
                                     buffer=DataBuffer(OBS, ACT, 1_250_000))

        def call() -> float:
            start = time.perf_counter()
            added = generator.generate_rollouts(dataset_buffer.sample(50_000)[0])["rollouts/transitions_added"]
            if added != 250_000:
                raise RuntimeError(f"the official rollouts ended early ({added} transitions): not comparable")
            return added / (time.perf_counter() - start)

        call()
        return [call() for _ in range(3)]
    raise ValueError(measure)


def our_rates(measure: str) -> list[float]:
    from mbrl_offline.utils import keep_freed_memory
    keep_freed_memory()  # as training on a CPU does
    device = torch.device("cpu")
    if measure == "agent":
        return [throughput.bench_updates(device, 5)[0]]
    if measure == "dynamics":
        return [throughput.bench_dynamics(device, 1, epochs=1)[1] for _ in range(3)]
    if measure == "rollouts":
        return [throughput.bench_rollouts(device, 3)[0]]
    raise ValueError(measure)


def child(args) -> None:
    torch.set_num_threads(args.threads)
    peak = throughput.matmul_peak(torch.device("cpu"))
    rates = official_rates(args.edge_of_reach, args.measure) if args.side == "official" else our_rates(args.measure)
    peak += throughput.matmul_peak(torch.device("cpu"))
    print("RESULT " + json.dumps({"rate": statistics.median(rates), "rates": rates, "peak": statistics.median(peak)}))


def run_child(side: str, measure: str, args) -> dict:
    command = [sys.executable, __file__, "--side", side, "--measure", measure, "--threads", str(args.threads),
               "--edge-of-reach", str(args.edge_of_reach)]
    # a CPU comparison: the official modules would pick a GPU by themselves where there is one
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    results = [line[len("RESULT "):] for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not results:
        sys.exit(f"error: the {side} {measure} measurement failed:\n{done.stderr[-3000:]}")
    return json.loads(results[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edge-of-reach", type=Path, required=True, help="a checkout of anyasims/edge-of-reach")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--measures", nargs="+", default=["dynamics", "agent", "rollouts"],
                        choices=["dynamics", "agent", "rollouts"])
    parser.add_argument("--side", choices=["official", "ours"], help=argparse.SUPPRESS)
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not (args.edge_of_reach / "agent_training" / "agent.py").is_file():
        sys.exit(f"error: {args.edge_of_reach} is not a checkout of anyasims/edge-of-reach "
                 "(no agent_training/agent.py). Clone it and pass its path with --edge-of-reach.")
    if args.side:
        child(args)
        return
    print(f"cpu: {throughput.cpu_name()}; {args.threads} threads; torch {torch.__version__}; "
          f"MKL's AVX-512 code on AMD CPUs: {mkl_avx512.status()}")
    print(f"{'measure':<11}{'pair':>5}{'official':>14}{'ours':>14}{'ratio':>8}{'peak GFLOP/s (off./ours)':>27}")
    for measure in args.measures:
        ratios = []
        for pair in range(1, args.pairs + 1):
            official, ours = run_child("official", measure, args), run_child("ours", measure, args)
            ratios.append(ours["rate"] / official["rate"])
            print(f"{measure:<11}{pair:>5}{official['rate']:>14,.1f}{ours['rate']:>14,.1f}{ratios[-1]:>7.2f}x"
                  f"{official['peak']:>15.0f} / {ours['peak']:.0f}", flush=True)
        print(f"{measure}: ours / official = {min(ratios):.2f}-{max(ratios):.2f}x ({UNITS[measure]})", flush=True)


if __name__ == "__main__":
    main()
