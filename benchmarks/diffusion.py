"""Throughput of the diffusion generators (SynthER's residual-MLP denoiser, PGD's temporal U-Net) on this
machine, at the library's CPU sizes (``budget=quick``'s) and the papers' (hopper rows: obs 11, act 3).

    python benchmarks/diffusion.py [--sizes default paper] [--generators synther pgd] [--threads 2]
                                   [--device cpu] [--repeats 5] [--sample-batch N] [--smoke]

As `throughput.py` does, each rate is printed with the matmul and convolution FLOPs it does (counted by
torch's flop counter on one real call) and the share of this machine's fp32 matmul peak, timed in
this process before and after (`throughput.matmul_peak`: 1024^3 matmuls on the CPU, 8192^3 on a GPU).
The table is markdown.

* SynthER training samples/s: `fit_diffusion` calls of S steps on the (normalised) rows of a
  1M-transition hopper-shaped dataset (random values: the cost does not depend on them), end to end:
  per step a batch drawn from the rows, EDM's loss, backward, gradient clipping, AdamW and its cosine
  schedule, the EMA every 10 steps; each call's set-up (the EMA's copy of the weights, the optimiser)
  is included. Rows are transitions [s, a, r, s', d]: 2*11 + 3 + 2 = 27 numbers. Batch 1024 (SynthER's
  rule for 800k rows and more, as hopper-medium's 1M).
* SynthER generated transitions/s: `DiffusionModel.sample` (EDM's stochastic Heun sampler at 128 steps,
  255 network evaluations, then un-normalising) in calls of the library's ``sample_batch`` (10,000)
  transitions; the network's weights are random (the cost does not depend on them).
* PGD training windows/s: the same `fit_diffusion` calls with PGD's recipe (batch 32 windows of 32
  rows [s, a, r, d]: 11 + 3 + 2 = 16 channels; Adam with warmup-cosine, no clipping) on 10,000 random
  windows (the gather's cost does not depend on their number).
* PGD generated transitions/s: `DiffusionModel.sample` of unguided trajectories of 129 rows (128
  transitions each) in calls of the library's ``sample_batch`` (256 trajectories); the sampler runs
  32 steps at the default size (``budget=quick``'s) and 256 (the official) at the paper's.

Sizes (``--sizes``): ``default``: ``budget=quick``'s (SynthER width 256, 6 blocks; U-Net base 32, 3 levels);
``paper``: the papers' (width 2048, 6 blocks, 25.5M parameters; U-Net base 1024, 3 levels, about 178M
parameters for 16 channels). The paper's U-Net is a GPU model (one 129-row trajectory is about 19 GFLOP
per network evaluation, 511 evaluations at 256 steps), so the paper sizes' measurements are kept to a
few calls: at most 2 timed, after a warm-up sampler call at 2 steps; on a CPU, PGD's sampler calls hold
2 trajectories and SynthER's 256 transitions (``--sample-batch`` sets every call's size). Training
calls are 100 steps (the paper sizes on a CPU: 10), after a 2-step warm-up call.

No figures are recorded here: measure on an idle machine (docs/performance.md).
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

from mbrl_offline import platform as mbrl_platform  # noqa: E402
mbrl_platform.apply_environment()  # before torch: MBRL_OFFLINE_MKL_AVX512=1 must act before MKL loads
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import throughput  # noqa: E402  (its matmul peak, flop counter, timer and CPU name)

from mbrl_offline.compose import run_configs  # noqa: E402
from mbrl_offline.models.diffusion import DiffusionModel, EDMConfig, fit_diffusion  # noqa: E402

OBS, ACT = throughput.OBS, throughput.ACT
SYNTHER_DIM = 2 * OBS + ACT + 2  # [s, a, r, s', d]
PGD_CHANNELS = OBS + ACT + 2  # [s, a, r, d]
SYNTHER_ROWS = 1_000_000  # hopper-medium's size: SynthER's batch rule gives 1024
PGD_WINDOWS = 10_000


@dataclasses.dataclass
class Setting:
    """One measured model: its kind and size, its training recipe and sampler settings."""

    generator: str  # "synther" or "pgd"
    size: str  # "default", "paper" or "smoke"
    denoiser: str
    kwargs: dict
    event: tuple  # training event shape
    sample_event: tuple  # generated event shape
    transitions_per_sample: int
    train: object  # DiffusionTrainConfig (steps: per timed call)
    edm: EDMConfig
    sample_batch: int
    timed_calls: int  # at most; min with --repeats
    big: bool = False  # warm up at 2 sampler steps, not at full length


def settings(generator: str, size: str, device: torch.device, sample_batch: int | None = None) -> Setting:
    on_cpu = device.type == "cpu"
    if generator == "synther":
        config = run_configs("iql", "quick", "synther")[1]  # the CPU sizes: budget=quick's
        width, blocks = {"default": (config.denoiser.width, config.denoiser.blocks), "paper": (2048, 6),
                         "smoke": (32, 2)}[size]
        kwargs = {**dataclasses.asdict(config.denoiser), "width": width, "blocks": blocks}
        steps = {"default": 100, "paper": 10 if on_cpu else 100, "smoke": 10}[size]
        batch = {"smoke": 64}.get(size, config.train.batch_for(SYNTHER_ROWS))
        train = dataclasses.replace(config.train, steps=steps, batch_size=batch)
        edm = dataclasses.replace(config.edm, steps=4) if size == "smoke" else config.edm
        n = {"default": config.sample_batch, "paper": 256 if on_cpu else config.sample_batch, "smoke": 64}[size]
        return Setting("synther", size, "resmlp", kwargs, (SYNTHER_DIM,), (SYNTHER_DIM,), 1, train, edm,
                       sample_batch or n, 5 if size != "paper" else 2, big=size == "paper")
    config = run_configs("iql", "quick", "pgd")[1]  # the CPU sizes: budget=quick's
    base = {"default": config.unet.base, "paper": 1024, "smoke": 16}[size]
    kwargs = {"base": base, "levels": config.unet.levels, "groups": config.unet.groups}
    steps = {"default": 100, "paper": 10 if on_cpu else 100, "smoke": 10}[size]
    train = dataclasses.replace(config.train, steps=steps)  # batch 32 windows
    sampler_steps = {"default": config.edm.steps, "paper": 256, "smoke": 4}[size]
    edm = dataclasses.replace(config.edm, steps=sampler_steps)
    n = {"default": config.sample_batch, "paper": 2 if on_cpu else config.sample_batch, "smoke": 4}[size]
    return Setting("pgd", size, "unet", kwargs, (config.window, PGD_CHANNELS), (config.length, PGD_CHANNELS),
                   config.length - 1, train, edm, sample_batch or n, 5 if size != "paper" else 2,
                   big=size == "paper")


def build(setting: Setting, device: torch.device) -> DiffusionModel:
    torch.manual_seed(0)
    # random weights: sampling is timed, not judged (mark_fitted lets an unfitted model sample)
    return DiffusionModel(setting.event, setting.denoiser, setting.kwargs, setting.edm).to(device).mark_fitted()


def bench_training(setting: Setting, device: torch.device, repeats: int) -> tuple[float, float, int]:
    """(training rows/s, FLOPs per row, parameters): rows are transitions (SynthER) or windows (PGD)."""
    model = build(setting, device)
    rows = SYNTHER_ROWS if setting.generator == "synther" else PGD_WINDOWS
    rows = min(rows, 10_000) if setting.size == "smoke" else rows
    data = torch.randn((rows, *setting.event), device=device)
    rng = torch.Generator(device=device).manual_seed(0)
    batch = setting.train.batch_for(rows)

    def fit(steps: int) -> None:
        fit_diffusion(model.diffusion, data, dataclasses.replace(setting.train, steps=steps), rng)

    flops = throughput.count_flops(lambda: fit(1))
    fit(2)  # warm-up
    times = throughput.timed(lambda: fit(setting.train.steps), min(repeats, setting.timed_calls), device)
    parameters = sum(p.numel() for p in model.diffusion.net.parameters())
    return setting.train.steps * batch / statistics.median(times), flops / batch, parameters


def bench_sampling(setting: Setting, device: torch.device, repeats: int) -> tuple[float, float]:
    """(generated transitions/s, FLOPs per transition)."""
    model = build(setting, device).eval()
    rng = torch.Generator(device=device).manual_seed(0)
    n, steps = setting.sample_batch, setting.edm.steps

    def sample(count: int, sampler_steps: int):
        return model.sample(count, rng, steps=sampler_steps, event_shape=setting.sample_event)

    # one network evaluation's FLOPs from a 2-step call (3 evaluations) of 2 samples, scaled to the
    # 2N - 1 evaluations of N steps (no Heun correction on the last)
    per_sample = throughput.count_flops(lambda: sample(2, 2)) / 3 / 2 * (2 * steps - 1)
    if setting.big:
        sample(n, 2)  # warm-up without the full call's cost
    else:
        sample(n, steps)
    times = throughput.timed(lambda: sample(n, steps), min(repeats, setting.timed_calls), device)
    transitions = n * setting.transitions_per_sample
    return transitions / statistics.median(times), per_sample / setting.transitions_per_sample


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["default", "paper"], choices=["default", "paper"])
    parser.add_argument("--generators", nargs="+", default=["synther", "pgd"], choices=["synther", "pgd"])
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per measure (paper sizes: at most 2)")
    parser.add_argument("--sample-batch", type=int, default=None,
                        help="samples per sampler call (transitions for SynthER, trajectories for PGD) for every "
                             "measure; default: see the docstring")
    parser.add_argument("--system-malloc", action="store_true",
                        help="leave glibc's malloc settings alone (training runs call keep_freed_memory on CPU)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny models and calls, to check that the script runs (no meaningful rates)")
    args = parser.parse_args()
    device = throughput.set_up(args)
    sizes = ["smoke"] if args.smoke else args.sizes
    peak = throughput.matmul_peak(device, readings=1 if args.smoke else 5)
    rows = []
    for generator in args.generators:
        for size in sizes:
            setting = settings(generator, size, device, args.sample_batch)
            trained, train_flops, parameters = bench_training(setting, device, args.repeats)
            generated, sample_flops = bench_sampling(setting, device, args.repeats)
            if generator == "synther":
                model = f"resmlp w{setting.kwargs['width']} x{setting.kwargs['blocks']}"
                train_what = f"samples/s (batch {setting.train.batch_for(SYNTHER_ROWS if size != 'smoke' else 10_000)})"
                sample_what = f"transitions/s ({setting.edm.steps} steps, {setting.sample_batch} per call)"
            else:
                model = f"unet base {setting.kwargs['base']}"
                train_what = f"windows/s ({setting.train.batch_size} x {setting.event[0]} rows)"
                sample_what = (f"transitions/s ({setting.edm.steps} steps, {setting.sample_batch} x "
                               f"{setting.sample_event[0]} rows per call)")
            label = f"{generator} {size}, {model} ({parameters / 1e6:.2f}M)"
            rows.append((label, "training " + train_what, trained, train_flops))
            rows.append((label, "generated " + sample_what, generated, sample_flops))
    peak += throughput.matmul_peak(device, readings=1 if args.smoke else 5)
    throughput.print_rates(rows, peak, device, ("model", "measure"), "GFLOP",
                           "(--smoke: tiny models; the rates mean nothing)" if args.smoke else "")


if __name__ == "__main__":
    main()
