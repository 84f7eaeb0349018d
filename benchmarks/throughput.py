"""Throughput of the RAVL pipeline and the agents that learn from the data alone on this machine, at the papers' sizes
(hopper: obs 11, act 3).

    python benchmarks/throughput.py [--threads 2] [--device cpu] [--repeats 5] [--system-malloc]

Prints, each with the matmul FLOPs it does (counted by torch's flop counter on one real call) and the
fraction of this machine's fp32 matmul peak (timed in this process before and after: 1024^3 matmuls on
the CPU, 8192^3 on a GPU, which 1024^3 does not fill; full fp32, as training runs, not TF32). The peak
is what torch's own matmul reaches. On AMD CPUs with AVX-512
that is MKL's AVX2 code, about half of what the CPU can do: the script also prints the same product
through oneDNN, which uses AVX-512 there, and whether ``MBRL_OFFLINE_MKL_AVX512=1`` (`mbrl_offline.
platform`) let MKL run its AVX-512 code in this process, in which case the peak is that code's.

* RAVL agent updates/s: the full loop body (a mixed batch of 256 from a 1M real and a full 1.25M
  synthetic buffer, then one update of 10 critics and the actor, 3x256, EDAC eta = 1); on a GPU
  also without CUDA graphs (``cuda_graph=False``), as for the dynamics batches;
* TD3+BC and IQL updates/s at CORL's sizes (2x256 networks, batch 256) on batches from a 1M-row real
  buffer, as they train without a generator (TD3+BC's FLOPs: the mean of a critic-only and a full step);
* CQL and EDAC updates/s at their defaults (3x256 critics and actor, batch 256; EDAC's 10 critics)
  on the same batches;
* dynamics-training samples/s: `GaussianEnsembleDynamics.fit` epochs on 100k rows (7 members, 4x200,
  batch 256), end to end (holdout evaluation and set-up included), and its training batches alone
  (the epoch log's ``samples_per_s``), the loop that `vs_official.py` times on both sides;
* rollout transitions/s: `BranchedRollouts.rollout` with 50,000 starts x 5 steps (no early
  termination: the worst case), buffer insert included;
* UP-MPC rollout transitions/s (COPlanner's defaults: K = 5 candidates, H_p = 5 planning steps,
  every member evaluated per planning step, MOPO's penalty) from 5,000 starts x 5 steps, and the
  model rows it evaluates per second (26 per stored transition).

No peer's figures are kept here: a comparison with another code is made side by side, on the machine
at hand and in the same minutes, by `vs_official.py` (the official RAVL code) and the other
``vs_*.py`` scripts.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import time
from pathlib import Path

from mbrl_offline import platform as mbrl_platform  # noqa: E402
from mbrl_offline.platform import cpu_name  # noqa: E402,F401 (the other benchmarks' throughput.cpu_name)
mbrl_platform.apply_environment()  # before torch: MBRL_OFFLINE_MKL_AVX512=1 must act before MKL loads
import torch
from torch.utils.flop_counter import FlopCounterMode

from mbrl_offline.algorithms.coplanner import COPlanner
from mbrl_offline.algorithms.cql import CQL
from mbrl_offline.algorithms.edac import EDAC
from mbrl_offline.algorithms.iql import IQL
from mbrl_offline.algorithms.ravl import RAVL, RAVLConfig
from mbrl_offline.algorithms.td3bc import TD3BC
from mbrl_offline.buffer import Mixing, TransitionBuffer
from mbrl_offline.data.dataset import OfflineDataset
from mbrl_offline.generators import BranchedRollouts, RolloutConfig
from mbrl_offline.models import products
from mbrl_offline.models.dynamics import DynamicsConfig, GaussianEnsembleDynamics
from mbrl_offline.data.termination import never
from mbrl_offline.platform import keep_freed_memory

OBS, ACT = 11, 3


def matmul_peak(device: torch.device, readings: int = 5, product=torch.matmul) -> list[float]:
    """GFLOP/s readings of 40 size^3 fp32 ``product(a, b)`` calls each, after 5 warm-up calls."""
    size = 8192 if device.type == "cuda" else 1024
    a, b = torch.randn(size, size, device=device), torch.randn(size, size, device=device)
    for _ in range(5):
        product(a, b)
    values = []
    for _ in range(readings):
        sync(device)
        start = time.perf_counter()
        for _ in range(40):
            product(a, b)
        sync(device)
        values.append(40 * 2 * size ** 3 / (time.perf_counter() - start) / 1e9)
    return values


def onednn_matmul_rate() -> float | None:
    """The best `matmul_peak` reading through the oneDNN library in torch's wheel, which picks its code
    by instruction set on any vendor's CPU; None where torch has no oneDNN. On AMD CPUs with AVX-512
    this is about twice torch's matmul, for which MKL runs its AVX2 code (see mbrl_offline.platform)."""
    if not products.available():
        return None
    # linear(a, b) = a @ b^T: the same work as a @ b
    return max(matmul_peak(torch.device("cpu"), product=lambda a, b: torch.ops.mkldnn._linear_pointwise(
        a, b, None, "none", [], "")))


FLOP_UNITS = {"GFLOP": (1e9, ".4f"), "MFLOP": (1e6, ",.3f")}  # print_rates' FLOPs per unit: scale, format


def print_rates(rows, peak: list[float], device: torch.device, columns: tuple[str, str], flop_unit: str = "GFLOP",
                note: str = "", onednn_peak: float | None = None) -> None:
    """The peak's line, MKL's code (CPU), then a markdown table of ``rows`` (label, what, rate, FLOPs per
    unit) under the two first ``columns``' names: the rate, its FLOPs per unit in ``flop_unit`` (a key of
    `FLOP_UNITS`), GFLOP/s and the share of the median peak; with ``onednn_peak`` (`onednn_matmul_rate`,
    for work whose products run on oneDNN) also the share of that; ``note`` follows the table."""

    scale, digits = FLOP_UNITS[flop_unit]
    peak_gflops = statistics.median(peak)
    print(f"fp32 matmul peak: {peak_gflops:.0f} GFLOP/s (median of {len(peak)} readings, "
          f"{min(peak):.0f}-{max(peak):.0f}); torch.matmul, which the shares below divide by")
    if device.type == "cpu":
        print(f"MKL's AVX-512 code on AMD CPUs ({mbrl_platform.ENV_VAR}): {mbrl_platform.status()}")
    if onednn_peak:
        print(f"oneDNN's fp32 product (torch.ops.mkldnn._linear_pointwise, 1024^3): {onednn_peak:.0f} GFLOP/s "
              "(best of 5 readings), the last column's peak")
    print()
    extra = (" of oneDNN's peak |", "---:|") if onednn_peak else ("", "")
    print(f"| {columns[0]} | {columns[1]} | rate | {flop_unit} per unit | GFLOP/s | of peak |{extra[0]}")
    print(f"|---|---|---:|---:|---:|---:|{extra[1]}")
    for label, what, rate, flops in rows:
        achieved = rate * flops / 1e9
        share = f" {achieved / onednn_peak:.0%} |" if onednn_peak else ""
        print(f"| {label} | {what} | {rate:,.1f} | {flops / scale:{digits}} | {achieved:.1f} | "
              f"{achieved / peak_gflops:.0%} |{share}")
    if note:
        print("\n" + note)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _inplace_baddbmm_flops(input_shape, batch1_shape, batch2_shape, *args, out_shape=None, **kwargs) -> int:
    batches, rows, inner = batch1_shape
    return 2 * batches * rows * inner * batch2_shape[-1]


def _grouped_mm_flops(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    # (rows, K) times one (K, P) matrix per group of rows: each row is multiplied once
    rows, inner = a_shape
    return 2 * rows * inner * b_shape[-1]


def _onednn_linear_flops(x_shape, weight_shape, *args, out_shape=None, **kwargs) -> int:
    # (rows, in) times (out, in)^T (`mbrl_offline.models.products`)
    return 2 * math.prod(x_shape[:-1]) * x_shape[-1] * weight_shape[0]


def count_flops(fn) -> float:
    # torch's counter knows baddbmm but not its in-place form, which the critic backward uses, nor
    # the grouped product of the actor step's lowest-critic gradient, nor oneDNN's product (NEUBAY's
    # encoders, `mbrl_offline.models.products`)
    mapping = {torch.ops.aten.baddbmm_: _inplace_baddbmm_flops, torch.ops.aten._grouped_mm: _grouped_mm_flops}
    if products.available():
        mapping[torch.ops.mkldnn._linear_pointwise] = _onednn_linear_flops
    with FlopCounterMode(display=False, custom_mapping=mapping) as counter:
        fn()
    return counter.get_total_flops()


def timed(fn, repeats: int, device: torch.device) -> list[float]:
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return times


def random_transitions(n: int, device: torch.device, extra_fields: dict = None) -> dict[str, torch.Tensor]:
    """Random rows of the transition fields and of ``extra_fields`` (the generator's, e.g. ``member``)."""
    extra = {name: torch.zeros((n, *shape), dtype=dtype, device=device)
             for name, (shape, dtype) in (extra_fields or {}).items()}
    return {**extra, "observations": torch.randn(n, OBS, device=device), "actions": torch.rand(n, ACT, device=device) * 2 - 1,
            "rewards": torch.randn(n, device=device), "next_observations": torch.randn(n, OBS, device=device),
            "terminals": torch.zeros(n, dtype=torch.bool, device=device),
            "timeouts": torch.zeros(n, dtype=torch.bool, device=device)}


def bench_updates(device, repeats: int, updates: int = 200, config: RAVLConfig = RAVLConfig()):
    agent = RAVL(OBS, ACT, -torch.ones(ACT), torch.ones(ACT), config, device)
    generator = RAVL.published_generator()
    real = TransitionBuffer(1_000_000, OBS, ACT, device)
    real.add(**random_transitions(1_000_000, device))
    synthetic = TransitionBuffer(generator.rollout.buffer_capacity, OBS, ACT, device,
                                 extra_fields=generator.rollout.extra_fields)  # as the trainer keeps it
    synthetic.add(**random_transitions(generator.rollout.buffer_capacity, device, generator.rollout.extra_fields))
    mixing = Mixing(generator.mixing)
    rng = torch.Generator(device=device).manual_seed(0)

    def loop(n):
        for _ in range(n):
            agent.update(mixing.sample(real, synthetic, config.batch_size, rng))

    flops = count_flops(lambda: loop(1))  # first, while it runs eagerly: a CUDA graph's replay hides its ops
    loop(30)
    times = timed(lambda: loop(updates), repeats, device)
    return updates / statistics.median(times), flops


def bench_model_free_updates(agent_cls, device, repeats: int, updates: int = 500):
    """An agent that learns from the data alone, at its defaults (TD3+BC and IQL: CORL's 2x256
    networks; CQL and EDAC: their papers' 3x256 critics), on batches from a 1M-row real buffer, as
    ``algo=td3bc``, ``algo=iql``, ``algo=cql`` and ``algo=edac`` train without a generator."""
    agent = agent_cls(OBS, ACT, -torch.ones(ACT), torch.ones(ACT), agent_cls.config_class(), device)
    real = TransitionBuffer(1_000_000, OBS, ACT, device)
    real.add(**random_transitions(1_000_000, device))
    mixing, batch_size = Mixing(), agent.config.batch_size
    rng = torch.Generator(device=device).manual_seed(0)

    def loop(n):
        for _ in range(n):
            agent.update(mixing.sample(real, None, batch_size, rng))

    flops = count_flops(lambda: loop(2)) / 2  # TD3+BC's actor steps every 2nd update: the mean of a pair
    loop(30)
    times = timed(lambda: loop(updates), repeats, device)
    return updates / statistics.median(times), flops


def bench_dynamics(device, repeats: int, rows: int = 100_000, epochs: int = 2, cuda_graph: bool = True):
    data = {k: v.cpu().numpy() for k, v in random_transitions(rows, device).items()}
    dataset = OfflineDataset(**data)
    config = DynamicsConfig(max_epochs=epochs, patience=10**6)
    model = GaussianEnsembleDynamics(OBS, ACT, config).to(device)
    x, y = torch.randn(config.batch_size, OBS + ACT, device=device), torch.randn(config.batch_size, OBS + 1, device=device)
    flops_per_batch = count_flops(lambda: model.loss(x.expand(config.ensemble_size, -1, -1), y).backward())
    n_train = rows - int(round(rows * config.holdout_ratio))
    trained = epochs * (n_train // config.batch_size) * config.batch_size
    batch_loop = []  # samples/s of the training batches alone (the epoch log's samples_per_s)

    def fit():
        log = GaussianEnsembleDynamics(OBS, ACT, config).fit(dataset, device, progress=False, cuda_graph=cuda_graph)
        batch_loop.extend(epoch["samples_per_s"] for epoch in log)

    times = timed(fit, repeats, device)
    return trained / statistics.median(times), statistics.median(batch_loop), flops_per_batch / config.batch_size


def bench_rollouts(device, repeats: int):
    agent = RAVL(OBS, ACT, -torch.ones(ACT), torch.ones(ACT), RAVLConfig(), device)
    model = GaussianEnsembleDynamics(OBS, ACT, RAVL.published_generator().dynamics).to(device)
    model.mark_fitted()  # random weights: rollouts are timed, not used
    rollouts = BranchedRollouts(model, never, RolloutConfig())
    buffer = TransitionBuffer(rollouts.buffer_capacity, OBS, ACT, device, extra_fields=rollouts.config.extra_fields)
    starts_from = torch.randn(1_000_000, OBS, device=device)
    rng = torch.Generator(device=device).manual_seed(0)

    def call():
        batch, _ = rollouts.rollout(agent.policy, rollouts.sample_starts(starts_from, rng), rng)
        buffer.add(**batch)
        return len(batch["rewards"])

    transitions = call()
    small = BranchedRollouts(model, never, RolloutConfig(rollouts_per_epoch=1000))
    flops = count_flops(lambda: small.rollout(agent.policy, small.sample_starts(starts_from, rng), rng))
    times = timed(call, repeats, device)
    return transitions / statistics.median(times), flops / (1000 * 5)


def bench_upmpc_rollouts(device, repeats: int, starts: int = 5_000):
    """COPlanner's rollouts at its default planner settings; a fifth of the rollouts per call of the
    branched benchmark above, because each stored step costs K * H_p + 1 ensemble evaluations."""
    agent = RAVL(OBS, ACT, -torch.ones(ACT), torch.ones(ACT), RAVLConfig(), device)
    published = COPlanner.published_generator()
    rollout = dataclasses.replace(published.rollout, rollouts_per_epoch=starts)
    model = GaussianEnsembleDynamics(OBS, ACT, published.dynamics).to(device)
    model.mark_fitted()  # random weights: rollouts are timed, not used
    rollouts = BranchedRollouts(model, never, rollout)
    starts_from = torch.randn(100_000, OBS, device=device)
    rng = torch.Generator(device=device).manual_seed(0)

    def call():
        batch, _ = rollouts.rollout(agent.policy, rollouts.sample_starts(starts_from, rng), rng)
        return len(batch["rewards"])

    transitions = call()
    small = BranchedRollouts(model, never, dataclasses.replace(rollout, rollouts_per_epoch=200))
    flops = count_flops(lambda: small.rollout(agent.policy, small.sample_starts(starts_from, rng), rng))
    times = timed(call, repeats, device)
    model_rows = rollout.upmpc.candidates * rollout.upmpc.horizon + 1
    return transitions / statistics.median(times), flops / (200 * rollout.horizon), model_rows


def set_up(args) -> torch.device:
    """The benchmark's device from ``args`` (``threads``, ``device``, ``system_malloc``), with torch's
    thread count and glibc's malloc set as training sets them; prints what it measures on."""
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    kept = device.type == "cpu" and not args.system_malloc and keep_freed_memory()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{cpu_name()}, {torch.get_num_threads()} threads"
    print(f"device: {name}; torch {torch.__version__}; malloc "
          f"{'keeps freed memory (keep_freed_memory)' if kept else 'as the system sets it'}")
    return device


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--system-malloc", action="store_true",
                        help="leave glibc's malloc settings alone (training runs call keep_freed_memory on CPU)")
    args = parser.parse_args()
    device = set_up(args)
    peak = matmul_peak(device)
    updates, update_flops = bench_updates(device, args.repeats)
    if device.type == "cuda":  # by default updates and dynamics batches replay CUDA graphs; eager for comparison
        eager_updates, _ = bench_updates(device, args.repeats, config=RAVLConfig(cuda_graph=False))
        _, eager_batch_samples, _ = bench_dynamics(device, 1, cuda_graph=False)
    td3bc, td3bc_flops = bench_model_free_updates(TD3BC, device, args.repeats)
    iql, iql_flops = bench_model_free_updates(IQL, device, args.repeats)
    cql, cql_flops = bench_model_free_updates(CQL, device, args.repeats)
    edac, edac_flops = bench_model_free_updates(EDAC, device, args.repeats)
    samples, batch_samples, sample_flops = bench_dynamics(device, max(1, args.repeats // 2))
    transitions, transition_flops = bench_rollouts(device, max(1, args.repeats // 2))
    planned, planned_flops, model_rows = bench_upmpc_rollouts(device, max(1, args.repeats // 2))
    peak += matmul_peak(device)
    peak_gflops = statistics.median(peak)
    print(f"fp32 matmul peak: {peak_gflops:.0f} GFLOP/s (median of {len(peak)} readings, "
          f"{min(peak):.0f}-{max(peak):.0f}); torch.matmul, which the fractions below divide by")
    if device.type == "cpu":
        onednn = onednn_matmul_rate()
        if onednn:
            print(f"  the same product through oneDNN: {onednn:.0f} GFLOP/s (best of 5 readings)")
        print(f"  MKL's AVX-512 code on AMD CPUs ({mbrl_platform.ENV_VAR}): {mbrl_platform.status()}")
    rows = [
        ("RAVL updates/s", updates, update_flops, "GFLOP/update", 1e9),
        *([("  without CUDA graph", eager_updates, update_flops, "GFLOP/update", 1e9)]
          if device.type == "cuda" else []),
        ("TD3+BC updates/s", td3bc, td3bc_flops, "GFLOP/update", 1e9),
        ("IQL updates/s", iql, iql_flops, "GFLOP/update", 1e9),
        ("CQL updates/s", cql, cql_flops, "GFLOP/update", 1e9),
        ("EDAC updates/s", edac, edac_flops, "GFLOP/update", 1e9),
        ("dynamics samples/s", samples, sample_flops, "MFLOP/sample", 1e6),
        ("  batch loop alone", batch_samples, sample_flops, "MFLOP/sample", 1e6),
        *([("  without CUDA graph", eager_batch_samples, sample_flops, "MFLOP/sample", 1e6)]
          if device.type == "cuda" else []),
        ("rollout transitions/s", transitions, transition_flops, "MFLOP/transition", 1e6),
        ("UP-MPC transitions/s", planned, planned_flops, "MFLOP/transition", 1e6),
    ]
    print(f"{'measure':<24}{'rate':>12}{'matmul work':>24}{'GFLOP/s':>10}{'of peak':>9}")
    for label, rate, flops, unit, scale in rows:
        achieved = rate * flops / 1e9
        print(f"{label:<24}{rate:>12,.1f}{flops / scale:>11.3f} {unit:<12}{achieved:>10.1f}"
              f"{achieved / peak_gflops:>9.0%}")
    print(f"UP-MPC evaluates {model_rows} ensemble rows per stored transition: {planned * model_rows:,.0f} rows/s")
    print("To compare with the official RAVL code, run benchmarks/vs_official.py: both codes, side by side.")


if __name__ == "__main__":
    main()
