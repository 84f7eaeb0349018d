"""Our SynthER diffusion model against the official SynthER code on this machine, in the same minutes.

    git clone https://github.com/conglu1997/SynthER /path/to/SynthER   # outside this repository
    pip install gin-config einops ema-pytorch                           # the official modules' imports
    python benchmarks/vs_synther.py --synther /path/to/SynthER [--pairs 3] [--threads 2] [--device cpu]
        [--width 256] [--blocks 6] [--batch 1024] [--train-steps 100] [--sampler-steps 128]
        [--sample-batch 10000] [--measures train sample]

The paper's size is ``--width 2048`` (6 blocks, batch 1024): on a CPU, lower ``--train-steps`` (10) and
``--sample-batch`` (256) there. Both sides run the same sizes: a residual-MLP denoiser of ``--width``
and ``--blocks`` over hopper transitions (2*11 + 3 + 2 = 27 numbers, random values on 1M rows, the
terminal left un-normalised as SynthER's config does).

For each measure the official code and ours run in separate processes, one after the other,
``--pairs`` times, so that each pair shares the machine's state; each pair's ratio (ours / official)
is printed. Each process also times fp32 matmuls before and after (`throughput.matmul_peak`).

* train (samples/s): calls of ``--train-steps`` training steps after a 20-step warm-up, 3 timed calls.
  Official: the body of ``Trainer.train`` (``synther/diffusion/elucidated_diffusion.py``) around the
  official classes as ``config/resmlp_denoiser.gin`` sets them (``ResidualMLPDenoiser`` with random
  Fourier features, no LayerNorm; ``ElucidatedDiffusion`` with the ``standard`` normaliser): the next
  batch of its shuffled ``DataLoader`` over a ``TensorDataset`` (``num_workers=cpu_count()`` as the
  official; ``--official-workers`` changes it), the loss, ``loss.item()``, backward, gradient
  clipping at 1.0, AdamW (its two parameter groups, lr 3e-4, betas 0.9/0.99), ``EMA.update``
  (ema_pytorch, 0.995 every 10 steps), the cosine schedule's step. Ours: `fit_diffusion` calls
  (as `diffusion.py`: per call also the EMA copy and the optimiser's set-up).
* sample (transitions/s): calls of ``--sample-batch`` transitions at ``--sampler-steps`` steps after
  one warm-up call, 3 timed calls. Official: ``ElucidatedDiffusion.sample`` with ``clamp=False`` (as
  ``SimpleDiffusionGenerator`` calls it for the standard normaliser; tqdm disabled); ours:
  `DiffusionModel.sample`. Random weights on both sides (the cost does not depend on them).

Adapters, none of them timed: the official module imports wandb, accelerate, torchdiffeq, redq and
``synther.online.utils`` (gym, D4RL) for parts not run here; they are replaced by empty stand-ins.
``accelerate``'s ``Accelerator`` on one process wraps nothing that changes the step's work
(``accelerator.backward`` is ``loss.backward``, its ``clip_grad_norm_`` torch's); the ``wandb.log``
call of the loop body is left out. ema_pytorch is whatever version pip installs (SynthER does not pin it).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
import types
from pathlib import Path

from mbrl_offline import platform as mbrl_platform  # noqa: E402
mbrl_platform.apply_environment()  # before torch: MBRL_OFFLINE_MKL_AVX512=1 acts on both sides' MKL
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import diffusion  # noqa: E402
import throughput  # noqa: E402
from side_by_side import compare  # noqa: E402


UNITS = {"train": "samples/s", "sample": "transitions/s"}
ROWS = diffusion.SYNTHER_ROWS
DIM = diffusion.SYNTHER_DIM
OFFICIAL_FILE = Path("synther") / "diffusion" / "elucidated_diffusion.py"


def import_official(checkout: Path):
    """The official modules, with empty stand-ins for the imports of the parts not run here."""
    stubs = {"wandb": {"log": lambda *a, **k: None}, "accelerate": {"Accelerator": object},
             "torchdiffeq": {"odeint": None}, "redq": {}, "redq.algos": {}, "redq.algos.core": {"ReplayBuffer": object},
             "synther.online": {}, "synther.online.utils": {"make_inputs_from_replay_buffer": None}}
    for name, attributes in stubs.items():
        if name.split(".")[0] == "synther" or name not in sys.modules:
            module = types.ModuleType(name)
            module.__dict__.update(attributes)
            module.__path__ = []  # a package, so that its submodules import
            sys.modules[name] = module
    sys.path.insert(0, str(checkout))
    from synther.diffusion import denoiser_network, elucidated_diffusion, norm
    return denoiser_network, elucidated_diffusion, norm


def official_rates(args, measure: str) -> list[float]:
    from multiprocessing import cpu_count

    from ema_pytorch import EMA
    from torch.utils.data import DataLoader, TensorDataset

    denoiser_network, elucidated_diffusion, norm = import_official(args.synther)
    device = torch.device(args.device)
    torch.manual_seed(0)
    data = torch.randn(ROWS, DIM)
    # construct_diffusion_model with config/resmlp_denoiser.gin's settings
    net = denoiser_network.ResidualMLPDenoiser(d_in=DIM, dim_t=128, mlp_width=args.width, num_layers=args.blocks,
                                               learned_sinusoidal_cond=False, random_fourier_features=True,
                                               learned_sinusoidal_dim=16, activation="relu", layer_norm=False)
    normalizer = norm.Normalizer(data, skip_dims=[DIM - 1])
    model = elucidated_diffusion.ElucidatedDiffusion(net=net, normalizer=normalizer, event_shape=[DIM],
                                                     num_sample_steps=args.sampler_steps, sigma_data=1.0,
                                                     S_churn=80, S_tmin=0.05, S_tmax=50, S_noise=1.003).to(device)
    if measure == "train":
        workers = cpu_count() if args.official_workers is None else args.official_workers
        loader = DataLoader(TensorDataset(data), batch_size=args.batch, shuffle=True,
                            pin_memory=device.type == "cuda", num_workers=workers)
        batches = elucidated_diffusion.cycle(loader)
        no_decay = ["bias", "LayerNorm.weight", "norm.weight", ".g"]  # Trainer.__init__
        groups = [{"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
                   "weight_decay": 0.0},
                  {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)],
                   "weight_decay": 0.0}]
        opt = torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.99))
        ema = EMA(model, beta=0.995, update_every=10)
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(opt, 100_000)

        def steps(n: int) -> float:
            throughput.sync(device)
            start = time.perf_counter()
            for _ in range(n):  # Trainer.train's body (gradient_accumulate_every 1)
                batch = next(batches)[0].to(device)
                loss = model(batch)
                loss.item()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                opt.zero_grad()
                ema.to(device)
                ema.update()
                scheduler.step()
            throughput.sync(device)
            return n * args.batch / (time.perf_counter() - start)

        steps(20)
        return [steps(args.train_steps) for _ in range(3)]
    if measure == "sample":
        model.eval()

        def call() -> float:
            throughput.sync(device)
            start = time.perf_counter()
            model.sample(batch_size=args.sample_batch, num_sample_steps=args.sampler_steps, clamp=False,
                         disable_tqdm=True)
            throughput.sync(device)
            return args.sample_batch / (time.perf_counter() - start)

        call()
        return [call() for _ in range(3)]
    raise ValueError(measure)


def our_setting(args, device: torch.device) -> diffusion.Setting:
    setting = diffusion.settings("synther", "default", device)
    return dataclasses.replace(
        setting, kwargs={**setting.kwargs, "width": args.width, "blocks": args.blocks},
        train=dataclasses.replace(setting.train, steps=args.train_steps, batch_size=args.batch),
        edm=dataclasses.replace(setting.edm, steps=args.sampler_steps), sample_batch=args.sample_batch,
        timed_calls=3, big=False)


def our_rates(args, measure: str) -> list[float]:
    from mbrl_offline.models.diffusion import fit_diffusion
    from mbrl_offline.platform import keep_freed_memory
    device = torch.device(args.device)
    if device.type == "cpu":
        keep_freed_memory()  # as training on a CPU does
    setting = our_setting(args, device)
    model = diffusion.build(setting, device)
    rng = torch.Generator(device=device).manual_seed(0)
    if measure == "train":
        data = torch.randn(ROWS, DIM, device=device)

        def fit(steps: int) -> float:
            throughput.sync(device)
            start = time.perf_counter()
            fit_diffusion(model.diffusion, data, dataclasses.replace(setting.train, steps=steps), rng)
            throughput.sync(device)
            return steps * args.batch / (time.perf_counter() - start)

        fit(20)
        return [fit(args.train_steps) for _ in range(3)]
    if measure == "sample":
        model.eval()

        def call() -> float:
            throughput.sync(device)
            start = time.perf_counter()
            model.sample(args.sample_batch, rng, steps=args.sampler_steps)
            throughput.sync(device)
            return args.sample_batch / (time.perf_counter() - start)

        call()
        return [call() for _ in range(3)]
    raise ValueError(measure)


def child(args) -> None:
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    peak = throughput.matmul_peak(device, readings=args.peak_readings)
    rates = official_rates(args, args.measure) if args.side == "official" else our_rates(args, args.measure)
    peak += throughput.matmul_peak(device, readings=args.peak_readings)
    print("RESULT " + json.dumps({"rate": statistics.median(rates), "rates": rates, "peak": statistics.median(peak)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--synther", type=Path, required=True, help="a checkout of conglu1997/SynthER")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--width", type=int, default=256, help="denoiser width (library default 256; paper 2048)")
    parser.add_argument("--blocks", type=int, default=6, help="residual blocks (both: 6)")
    parser.add_argument("--batch", type=int, default=1024, help="training batch (SynthER: 1024 from 800k rows)")
    parser.add_argument("--train-steps", type=int, default=100, help="training steps per timed call")
    parser.add_argument("--sampler-steps", type=int, default=128, help="Heun steps of the sampler (SynthER 128)")
    parser.add_argument("--sample-batch", type=int, default=10_000, help="transitions per sampler call")
    parser.add_argument("--official-workers", type=int, default=None,
                        help="the official DataLoader's workers (default: cpu_count(), as the official Trainer)")
    parser.add_argument("--measures", nargs="+", default=["train", "sample"], choices=["train", "sample"])
    parser.add_argument("--peak-readings", type=int, default=5, help=argparse.SUPPRESS)
    parser.add_argument("--side", choices=["official", "ours"], help=argparse.SUPPRESS)
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not (args.synther / OFFICIAL_FILE).is_file():
        sys.exit(f"error: {args.synther} is not a checkout of conglu1997/SynthER (no {OFFICIAL_FILE}). "
                 "Clone it outside this repository and pass its path with --synther.")
    if args.side:
        child(args)
        return
    argv = list(sys.argv[1:])
    name = (f"{throughput.cpu_name()}; {args.threads} threads" if args.device == "cpu" else args.device)
    print(f"device: {name}; torch {torch.__version__}; MKL's AVX-512 code on AMD CPUs: {mbrl_platform.status()}")
    print(f"sizes: width {args.width}, {args.blocks} blocks, {DIM} inputs; training batch {args.batch}, "
          f"{args.train_steps} steps per call; sampler {args.sampler_steps} steps, {args.sample_batch} per call")
    print()
    compare(__file__, sys.executable, args.measures, args.pairs, argv, {m: () for m in UNITS}, UNITS,
            cpu_only=args.device == "cpu")


if __name__ == "__main__":
    main()
