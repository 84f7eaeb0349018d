"""Our policy-guided diffusion (PGD) model against the official JAX code of PGD on this machine, in the same minutes.

    # outside this repository: the official code and a Python environment for it
    git clone https://github.com/EmptyJackson/policy-guided-diffusion /tmp/pgd_checkout
    python -m venv /work/pgd_venv
    /work/pgd_venv/bin/pip install jax==0.4.18 jaxlib==0.4.18 "numpy<2" scipy==1.12.0 flax==0.6.11 \\
        optax==0.1.5 "distrax>=0.1.4,<0.1.6" "tensorflow-probability<0.23"
    python benchmarks/vs_pgd.py --pgd /tmp/pgd_checkout --python /work/pgd_venv/bin/python [--pairs 3]
        [--threads 2] [--base 32] [--levels 3] [--batch 32] [--window 32] [--train-steps 100]
        [--sampler-steps 32] [--length 129] [--sample-batch 64] [--guidance-scale 1.0] [--calls 3]
        [--measures train sample guided]

The official code (commit 9da606c) pins jax 0.4.16, flax 0.6.11, optax 0.1.5, distrax 0.1.3, numpy
1.22.4 and scipy 1.12.0 for Python 3.9 (``docker/requirements.txt``). On Python 3.11 jaxlib 0.4.16 and
numpy 1.22.4 have no wheels and distrax 0.1.3 requires numpy < 1.23, so the nearest versions that
install were used: jax and jaxlib 0.4.18, flax 0.6.11, optax 0.1.5, distrax 0.1.5 (with
tensorflow-probability 0.22.1), chex 0.1.86, numpy 1.26.4, scipy 1.12.0 (newer scipy breaks jax
0.4.18's import). The official side's process prints the versions it ran with; the table's header
repeats them.

Both sides run the same sizes: the temporal U-Net of ``--base`` channels and ``--levels`` levels
(the official ``--num_features`` and ``--num_blocks``; the library's CPU default is base 32, the
paper's base 1024: on a CPU run that with tiny calls, e.g. ``--base 1024 --train-steps 2
--sampler-steps 2 --sample-batch 1 --calls 1``) over hopper-shaped rows [s, a, r, d] (11 + 3 + 2 =
16 channels, random values: the cost does not depend on them), random weights: 177,968 U-Net
parameters at base 32 and 177,619,984 at base 1024 on both sides (the policy: 69,638). Both processes
report their U-Net's parameter count (and the policy's), the training batch's shape, the sampler's
steps and the generated trajectories' shape; the script stops if the two sides' differ.

For each measure the official code and ours run in separate processes, one after the other,
``--pairs`` times, so that each pair shares the machine's state; each pair's ratio (ours / official)
is printed. Each process also times fp32 matmuls before and after (ours: `throughput.matmul_peak`,
torch's 1024^3 product; official: the same product by a jitted ``jnp.matmul``), each side's share of
peak being against its own library's matmul. ``--threads`` pins both processes to that many cores
(``sched_setaffinity``, which sizes XLA's thread pool too) and sets torch's thread count.

* train (windows/s): calls of ``--train-steps`` steps of ``--batch`` windows of ``--window`` rows
  after one warm-up call, ``--calls`` timed calls. Official: one epoch of ``make_train``'s loop body
  (``train_diffusion.py``), jitted, over a dataset of ``train-steps x batch`` windows: the epoch's
  ``shuffle_and_batch_dataset`` (``util/data.py``), then a ``lax.scan`` of ``edm.train_step`` (via
  ``diffusion.diffusion.make_train_step``: EDM's loss over ``vmap``-ed windows, its gradient, Adam
  with the warmup-cosine schedule of ``create_denoiser_train_state``) and ``ema_update``
  (``util/jax.py``: 0.995 every 10 steps); its validation pass, run every ``eval_rate`` epochs, is
  left out; its state and EMA copy are made once, as the official does. Ours: `fit_diffusion` calls
  with PGD's recipe (`PGDGeneratorConfig().train`: Adam, warmup-cosine, no clipping, EMA) on the
  same number of windows; per call also the EMA copy and the optimiser's set-up, as ``diffusion.py``.
  On a CPU the official training step slows far more than ours as the base grows (XLA's CPU
  convolutions): a check at base 1024 on one thread of a shared 2-core CPU did not finish one pair of
  1-step calls (warm-up included) in 9 minutes; at the paper size run the sampler measures first
  and the train measure with ``--train-steps 1 --calls 1``, and expect it to take long.
* sample (transitions/s, ``length - 1`` per trajectory): ``--sample-batch`` trajectories of
  ``--length`` rows per call at ``--sampler-steps`` steps, after one warm-up call, ``--calls`` timed
  calls, unguided. Official: ``diffusion.diffusion.make_sample_fn`` (``edm.sample_trajectory``, EDM's
  stochastic Heun sampler in a ``lax.scan``, then ``construct_rollout``) as
  ``SyntheticRolloutGenerator`` (``diffusion/rollout_generator.py``) calls it: ``jit(vmap(...))``
  over one key per trajectory with no agent parameters (its first, unguided generation). Ours:
  `PGDGenerator.sample_trajectories` with no guidance (`ElucidatedDiffusion.sample`, then
  un-normalising). The official sampler evaluates the U-Net 2N times for N steps (the last step's
  Heun correction is computed and discarded by a ``jnp.where``), ours 2N - 1; each side's own work
  is timed.
* guided (transitions/s): the same calls guided by a policy's log-likelihood gradient on the action
  channels before each step, scale ``--guidance-scale`` (its value does not change the cost), the
  official's defaults otherwise (cosine coefficient 0.3, no normalisation, gradient at x). The policy
  is IQL's actor on both sides, 2 x 256 ReLU with a tanh mean and a state-independent std: official
  ``models/iql.py``'s ``TanhGaussianActor`` (``activation="relu"``, as ``train_agent.py`` passes its
  jitted ``apply`` to the generator, no observation statistics) with the generator's ``agent_params``;
  ours `IQL`'s ``log_prob`` through `policy_guidance` (`PGDGenerator.guidance_for`).

Adapters, none of them timed: the official side runs this file under ``--python`` (no torch there)
with the checkout on its path, importing ``util``, ``diffusion.diffusion`` (and through it
``diffusion.edm`` and ``models.diffusion``) and ``models.iql``. ``util/__init__.py`` imports two
modules that are not installed and whose parts are not run here, replaced by empty stand-ins:
``wandb`` (``util/logging.py``'s ``log``, not called) and ``gym`` (``util/data.py`` reads
``gym.spaces.Dict`` in an annotation of ``dict_obs_shape``, not called; the stand-in's ``Dict`` is
``object``). The hyperparameters are the official parser's (``util/args.py``'s
``parse_diffusion_args``, defaults but the sizes above). ``SyntheticRolloutGenerator`` itself is
not built (it downloads a checkpoint from W&B): its two lines that make the sampler
(``_generate_single_rollout`` and the ``jit(vmap(...))`` of ``update_synthetic_dataset``) are
written out here, and its norm statistics are zeros and ones of the shapes it restores.

No figures are recorded here: measure on an idle machine (docs/performance.md).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import types
from pathlib import Path

from side_by_side import child_or_driver, compare  # the benchmarks' folder: the standard library only

# No torch at the top: the official side's process runs this file under a Python without it.
OBS, ACT = 11, 3  # hopper
CHANNELS = OBS + ACT + 2  # [s, a, r, d]
UNITS = {"train": "windows/s", "sample": "transitions/s", "guided": "transitions/s"}
OFFICIAL_FILE = Path("diffusion") / "edm.py"
# what both sides must agree on, per measure (each process reads them off its own objects)
SAME_WORK = {"train": ("unet_parameters", "steps", "batch", "window", "channels"),
             "sample": ("unet_parameters", "sampler_steps", "trajectories", "rows", "channels"),
             "guided": ("unet_parameters", "policy_parameters", "sampler_steps", "trajectories", "rows", "channels")}


# ------------------------------------------------------------------------------------------- official
def official_hyperparameters(args):
    """The official parser's arguments (``util/args.py``) at this benchmark's sizes."""
    from util.args import parse_diffusion_args
    return parse_diffusion_args(["--num_features", str(args.base), "--num_blocks", str(args.levels),
                                 "--batch_size", str(args.batch), "--trajectory_length", str(args.window),
                                 "--diffusion_timesteps", str(args.sampler_steps)])


def import_official(checkout: Path):
    """The official modules, with empty stand-ins for ``wandb`` and ``gym`` (see the docstring)."""
    spaces = types.ModuleType("gym.spaces")
    spaces.Dict = object
    stubs = {"wandb": {"log": lambda *a, **k: None}, "gym": {"spaces": spaces}, "gym.spaces": vars(spaces)}
    for name, attributes in stubs.items():
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__dict__.update(attributes)
            module.__path__ = []
            sys.modules[name] = module
    here = Path(__file__).resolve().parent  # benchmarks/diffusion.py would shadow the official diffusion package
    sys.path[:] = [str(checkout)] + [p for p in sys.path if Path(p or ".").resolve() != here]
    import util
    from diffusion import diffusion as pgd_diffusion
    from models import iql
    return util, pgd_diffusion, iql


def jax_matmul_peak(readings: int) -> list[float]:
    """GFLOP/s readings of 40 jitted 1024^3 fp32 ``jnp.matmul`` calls each, after 5 warm-up calls."""
    import jax
    import jax.numpy as jnp
    size = 1024
    a, b = (jax.random.normal(jax.random.PRNGKey(i), (size, size), jnp.float32) for i in (0, 1))
    product = jax.jit(jnp.matmul)
    for _ in range(5):
        product(a, b).block_until_ready()
    values = []
    for _ in range(readings):
        start = time.perf_counter()
        jax.block_until_ready([product(a, b) for _ in range(40)])
        values.append(40 * 2 * size ** 3 / (time.perf_counter() - start) / 1e9)
    return values


def official_rates(args, measure: str) -> tuple[list[float], dict]:
    import jax
    import jax.numpy as jnp
    from functools import partial

    util, pgd_diffusion, iql = import_official(args.pgd)
    hp = official_hyperparameters(args)
    rng = jax.random.PRNGKey(0)
    rng, init_rng, data_rng = jax.random.split(rng, 3)
    windows = args.train_steps * args.batch
    state = pgd_diffusion.create_denoiser_train_state(init_rng, OBS, ACT, hp, windows)
    work = {"unet_parameters": sum(int(x.size) for x in jax.tree_util.tree_leaves(state.params)), "channels": CHANNELS}
    if measure == "train":
        dataset = jax.random.normal(data_rng, (windows, args.window, CHANNELS))
        train_step = pgd_diffusion.make_train_step(hp)

        def _batch_train_step(runner_state, batch):  # train_diffusion.make_train's, as written there
            denoiser_state, ema_denoiser_state, rng = runner_state
            rng, _rng = jax.random.split(rng)
            denoiser_state, loss = train_step(_rng, batch, denoiser_state)
            new_params = util.ema_update(hp, denoiser_state, ema_denoiser_state)
            ema_denoiser_state = ema_denoiser_state.replace(params=new_params)
            return (denoiser_state, ema_denoiser_state, rng), jnp.mean(loss)

        def epoch(rng, denoiser_state, ema_denoiser_state):  # make_train's _epoch_train_step
            rng, _rng = jax.random.split(rng)
            batched_dataset = util.shuffle_and_batch_dataset(_rng, dataset, hp.batch_size)
            (denoiser_state, ema_denoiser_state, rng), losses = jax.lax.scan(
                _batch_train_step, (denoiser_state, ema_denoiser_state, rng), batched_dataset)
            return denoiser_state, ema_denoiser_state, jnp.mean(losses)

        shape = jax.eval_shape(lambda key: util.shuffle_and_batch_dataset(key, dataset, hp.batch_size), rng).shape
        work.update(steps=shape[0], batch=shape[1], window=shape[2], channels=shape[3])
        train = jax.jit(epoch)
        ema_state = jax.tree_util.tree_map(jnp.copy, state)  # train_offline_diffusion's EMA copy

        def call() -> float:
            nonlocal state, ema_state, rng
            rng, _rng = jax.random.split(rng)
            start = time.perf_counter()
            state, ema_state, loss = train(_rng, state, ema_state)
            jax.block_until_ready((state, ema_state, loss))
            return work["steps"] * work["batch"] / (time.perf_counter() - start)

        call()
        return [call() for _ in range(args.calls)], work
    if measure in ("sample", "guided"):
        actor = iql.TanhGaussianActor(ACT, activation="relu")  # get_agent's "train" actor, no obs_stats
        agent_params = actor.init(jax.random.PRNGKey(1), jnp.zeros((OBS,)))
        agent_apply_fn = jax.jit(actor.apply)  # train_agent.py: rollout_gen.set_apply_fn(jax.jit(apply_fn))
        stats = {name: {"mean": jnp.zeros((dim,)), "std": jnp.ones((dim,))}
                 for name, dim in (("obs", OBS), ("action", ACT), ("reward", 1), ("done", 1))}
        sample_fn = partial(pgd_diffusion.make_sample_fn(hp, False, False, False),  # normalize, denoised, det
                            denoiser_state=state, seq_len=args.length, obs_dim=OBS, action_dim=ACT,
                            denoiser_norm_stats=stats, policy_guidance_coeff=args.guidance_scale,
                            policy_guidance_cosine_coeff=0.3)

        def _generate_single_rollout(rng, agent_params):  # SyntheticRolloutGenerator's
            return sample_fn(rng=rng, agent_params=agent_params, agent_apply_fn=agent_apply_fn)

        batch_rollout_fn = jax.jit(jax.vmap(_generate_single_rollout, in_axes=(0, None)))
        params = agent_params if measure == "guided" else None
        if measure == "guided":
            work["policy_parameters"] = sum(int(x.size) for x in jax.tree_util.tree_leaves(agent_params))
        work["sampler_steps"] = int(hp.diffusion_timesteps)

        def call() -> float:
            nonlocal rng
            rng, _rng = jax.random.split(rng)
            start = time.perf_counter()
            rollout = batch_rollout_fn(jax.random.split(_rng, args.sample_batch), params)
            jax.block_until_ready(rollout.obs)
            seconds = time.perf_counter() - start
            work.update(trajectories=rollout.obs.shape[0], rows=rollout.obs.shape[1] + 1)
            return rollout.obs.shape[0] * rollout.obs.shape[1] / seconds

        call()
        return [call() for _ in range(args.calls)], work
    raise ValueError(measure)


def official_child(args) -> None:
    import importlib.metadata

    peak = jax_matmul_peak(args.peak_readings)
    rates, work = official_rates(args, args.measure)
    peak += jax_matmul_peak(args.peak_readings)
    versions = {name: importlib.metadata.version(name)
                for name in ("jax", "jaxlib", "flax", "optax", "distrax", "chex", "numpy", "scipy")}
    print("RESULT " + json.dumps({"rate": statistics.median(rates), "rates": rates, "peak": statistics.median(peak),
                                  "work": work, "versions": versions}))


# ------------------------------------------------------------------------------------------- ours
def import_ours():
    from mbrl_offline import platform as mbrl_platform
    mbrl_platform.apply_environment()  # before torch: MBRL_OFFLINE_MKL_AVX512=1 must act before MKL loads
    import torch
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import throughput
    return torch, throughput


def our_rates(args, measure: str) -> tuple[list[float], dict]:
    import dataclasses

    import numpy as np
    torch, throughput = import_ours()
    from mbrl_offline.algorithms.iql import IQL
    from mbrl_offline.generators.pgd import (PGDGenerator, PGDGeneratorConfig, PGDGuidanceConfig, TrajectoryRows,
                                             UNetConfig, _unet_kwargs)
    from mbrl_offline.models.diffusion import DiffusionModel, fit_diffusion
    from mbrl_offline.platform import keep_freed_memory

    device = torch.device("cpu")
    keep_freed_memory()  # as training on a CPU does
    defaults = PGDGeneratorConfig()
    config = PGDGeneratorConfig(window=args.window, length=args.length, sample_batch=args.sample_batch,
                                unet=UNetConfig(base=args.base, levels=args.levels),
                                edm=dataclasses.replace(defaults.edm, steps=args.sampler_steps),
                                train=dataclasses.replace(defaults.train, steps=args.train_steps,
                                                          batch_size=args.batch),
                                guidance=PGDGuidanceConfig(scale=args.guidance_scale))
    torch.manual_seed(0)
    model = DiffusionModel((config.window, CHANNELS), "unet", _unet_kwargs(config.unet), config.edm).to(device)
    rng = torch.Generator(device=device).manual_seed(0)
    work = {"unet_parameters": sum(p.numel() for p in model.diffusion.net.parameters()), "channels": CHANNELS}
    if measure == "train":
        data = torch.randn(args.train_steps * args.batch, config.window, CHANNELS, device=device)
        work.update(steps=config.train.steps, batch=config.train.batch_for(len(data)), window=data.shape[1],
                    channels=data.shape[2])

        def call() -> float:
            start = time.perf_counter()
            fit_diffusion(model.diffusion, data, config.train, rng)
            return config.train.steps * work["batch"] / (time.perf_counter() - start)

        call()
        return [call() for _ in range(args.calls)], work
    if measure in ("sample", "guided"):
        model.eval()
        rows = TrajectoryRows(OBS, ACT, -np.ones(ACT), np.ones(ACT), device)
        generator = PGDGenerator(model, rows, config)
        guidance = None
        if measure == "guided":
            policy = IQL(OBS, ACT, -np.ones(ACT), np.ones(ACT), device=device)
            guidance = generator.guidance_for(policy)
            work["policy_parameters"] = sum(p.numel() for p in policy.actor.parameters()) + policy.log_std.numel()
        work["sampler_steps"] = config.edm.steps

        def call() -> float:
            start = time.perf_counter()
            trajectories = generator.sample_trajectories(args.sample_batch, guidance, rng)
            seconds = time.perf_counter() - start
            work.update(trajectories=trajectories.shape[0], rows=trajectories.shape[1])
            return trajectories.shape[0] * (trajectories.shape[1] - 1) / seconds

        call()
        return [call() for _ in range(args.calls)], work
    raise ValueError(measure)


def our_child(args) -> None:
    torch, throughput = import_ours()
    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    peak = throughput.matmul_peak(device, readings=args.peak_readings)
    rates, work = our_rates(args, args.measure)
    peak += throughput.matmul_peak(device, readings=args.peak_readings)
    print("RESULT " + json.dumps({"rate": statistics.median(rates), "rates": rates, "peak": statistics.median(peak),
                                  "work": work, "versions": {"torch": torch.__version__}}))


# ------------------------------------------------------------------------------------------- driver
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pgd", type=Path, required=True, help="a checkout of EmptyJackson/policy-guided-diffusion")
    parser.add_argument("--python", type=Path, required=True,
                        help="the Python with the official code's packages (jax, flax, optax, distrax)")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="cores for each process (both sides)")
    parser.add_argument("--base", type=int, default=32, help="U-Net base channels (budget=quick: 32; paper and default 1024)")
    parser.add_argument("--levels", type=int, default=3, help="U-Net levels (both: 3)")
    parser.add_argument("--batch", type=int, default=32, help="training windows per step (both: 32)")
    parser.add_argument("--window", type=int, default=32, help="rows per training window (both: 32)")
    parser.add_argument("--train-steps", type=int, default=100, help="training steps per timed call")
    parser.add_argument("--sampler-steps", type=int, default=32,
                        help="Heun steps of the sampler (library CPU default 32; official 256)")
    parser.add_argument("--length", type=int, default=129, help="rows per generated trajectory (both: 129)")
    parser.add_argument("--sample-batch", type=int, default=64,
                        help="trajectories per sampler call (library 256; official 32 workers)")
    parser.add_argument("--guidance-scale", type=float, default=1.0, help="guided: lambda (does not change the cost)")
    parser.add_argument("--calls", type=int, default=3, help="timed calls per process, after one warm-up call")
    parser.add_argument("--measures", nargs="+", default=["train", "sample", "guided"],
                        choices=["train", "sample", "guided"])
    parser.add_argument("--peak-readings", type=int, default=5, help=argparse.SUPPRESS)
    parser.add_argument("--side", choices=["official", "ours"], help=argparse.SUPPRESS)
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not (args.pgd / OFFICIAL_FILE).is_file():
        sys.exit(f"error: {args.pgd} is not a checkout of EmptyJackson/policy-guided-diffusion (no {OFFICIAL_FILE}). "
                 "Clone it outside this repository and pass its path with --pgd.")
    if args.guidance_scale == 0.0 and "guided" in args.measures:
        sys.exit("error: --guidance-scale 0 is unguided on both sides; give a nonzero scale for the guided measure.")
    if child_or_driver(args, official_child, our_child):
        return
    torch, throughput = import_ours()
    from mbrl_offline import platform as mbrl_platform
    argv = list(sys.argv[1:])
    print(f"device: {throughput.cpu_name()}; {args.threads} threads per process; torch {torch.__version__}; "
          f"MKL's AVX-512 code on AMD CPUs: {mbrl_platform.status()}")
    print(f"sizes: U-Net base {args.base}, {args.levels} levels, {CHANNELS} channels; training {args.batch} windows "
          f"of {args.window} rows, {args.train_steps} steps per call; sampler {args.sampler_steps} steps "
          f"(U-Net evaluations: official {2 * args.sampler_steps}, ours {2 * args.sampler_steps - 1}), "
          f"{args.sample_batch} trajectories of {args.length} rows per call; {args.calls} timed calls per process")
    print()
    compare(__file__, str(args.python), args.measures, args.pairs, argv, SAME_WORK, UNITS,
            official_env={"JAX_PLATFORMS": "cpu"})


if __name__ == "__main__":
    main()
