"""Throughput of NEUBAY's parts on this machine: the posterior ensemble's training, the posterior
rollouts and the recurrent agent's updates, at the official sizes (hopper rows: obs 11, act 3).

    python benchmarks/neubay.py [--sizes default] [--measures train rollout update] [--threads 2]
                                [--repeats 3] [--system-malloc]
    python benchmarks/neubay.py --sizes quick --threads 1     # tiny sizes: checks that it runs

As `throughput.py` and `diffusion.py` do, each rate is printed with the matmul FLOPs it does per unit,
counted by torch's flop counter (``throughput.count_flops``: matrix products only, forward and
backward as autograd runs them, on one real call of the measured work, not a formula) and the share of
this machine's fp32 matmul peak, timed in this process before and after (`throughput.matmul_peak`:
1024^3 ``torch.matmul`` on the CPU). Elementwise work (LayerNorm, the LRU's scan, the optimisers) is
not counted, so the shares are of matmul work only. The table is markdown. Random inputs and weights:
the costs do not depend on their values (a rollout's length is fixed below).

* ensemble training samples/s (``train``): `GaussianEnsembleDynamics.fit` with ``dynamics_recipe("neubay")``
  (128 members of 4 x [Linear(200) -> LayerNorm -> LeakyReLU], a log-std head, the mean Gaussian NLL,
  AdamW, batch 256 per member, every member its own permutation of the rows, the last partial batch
  trained) on a hopper-shaped dataset of 10,000 transitions (holdout min(20%, 1000): 9,000 training
  rows per member and epoch, 36 batches), ``1 + repeats`` epochs, the first a warm-up. A *sample* is
  one member's row: a batch is members x batch samples, so samples/s = members x (training rows per
  member per epoch) / seconds. Two rows: the batch loop alone (the epoch log's ``samples_per_s`` x
  members: gather, forward, loss, backward, AdamW, for every batch of the epoch; the official figure of
  ``vs_neubay.py`` is the same loop), and the whole `fit` call (its split and statistics, the per-epoch
  holdout error, the elites and the recorded uncertainty of every row, which NEUBAY's rollouts threshold
  on), for the same samples, its FLOPs counted as the batches' only. FLOPs: one training batch's loss
  and backward / (members x batch): 0.76 MFLOP per sample at the default sizes, i.e. 3 x 2 x the
  127,600 weights of a member's linear maps less the first layer's input gradient.
* posterior rollout transitions/s (``rollout``): `PosteriorRollouts.generate` calls, end to end, of
  ``parallel`` (100) rollouts of NEUBAY's recurrent actor (`NEUBAY` at `NEUBAYConfig`'s sizes, sampling)
  in the ``elites`` (100) of the 128-member posterior, one elite per rollout, each step one
  `posterior_step` (every elite on every row for the uncertainty U, the row's own elite's sample) and
  one recurrent actor step. So that every call does the same work, rollouts start at episode starts
  (``start_from_s0``: the warm-up reads a one-row prefix) of a dataset of short episodes and run exactly
  ``rollout_steps`` steps: no termination (halfcheetah's), no uncertainty truncation (``quantile`` < 0);
  a call stores parallel x rollout_steps imagined transitions (checked), plus the rows' assembly. One
  warm-up call (whose FLOPs are counted: 26.8 MFLOP per transition at the default sizes, 100 elites' forward
  of 0.255 MFLOP each and the actor's step), then ``repeats`` timed calls.
* agent updates/s (``update``): the trainer's loop body for NEUBAY, ``agent.update(mixing.sample(...))``:
  a tape of 2048 rows (`SequenceBuffer.tape` by the ``tape`` mixing rule, kappa 0.05) from a synthetic
  sequence buffer holding episodes of 1000 rows (a real prefix of 250, then imagined rows, the
  posterior generator's fields), then one recurrent SAC update at `NEUBAYConfig`'s defaults (LRU
  encoders 256 wide, 128 complex states, 2 layers; heads 2 x 256; 10 critics, 2 sampled; learned alpha;
  cosine schedules over 2M updates). FLOPs: one loop body (47.0 GFLOP at the default sizes; the
  critics' 1-wide output layers run as elementwise products, which the counter leaves out: under 0.1%).

Sizes (``--sizes``, `SIZES`): ``default``: the official ones above (rollouts of 100 steps, 10 updates
per timed call, ``--repeats`` timed calls or epochs); ``quick``: tiny networks and calls, one timed
each, to check that the script runs (the rates mean nothing).

``--profile`` adds, for the update, where its time goes: torch's profiler over ``--repeats`` updates,
each operator's own time put in one part (`PARTS`: the matrix products, the LRU's scan with its
written-out backward, LayerNorm, the activations, the optimisers' steps, the rest), an operator run
inside the scan or an optimiser's step counted in that part. The profiler's own cost makes the
updates slower than the rate above; the shares are what it is for.

No figures are recorded here: measure on an idle machine (docs/performance.md). ``vs_neubay.py``
measures the official JAX code beside ours at equal sizes.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

from mbrl_offline import platform as mbrl_platform  # noqa: E402
mbrl_platform.apply_environment()  # before torch: MBRL_OFFLINE_MKL_AVX512=1 must act before MKL loads
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import throughput  # noqa: E402  (its matmul peak, flop counter, timer and CPU name)

from mbrl_offline.algorithms.neubay import NEUBAY, NEUBAYConfig, tape_inputs  # noqa: E402
from mbrl_offline.buffer import Mixing, MixingConfig, SequenceBuffer  # noqa: E402
from mbrl_offline.data.dataset import OfflineDataset  # noqa: E402
from mbrl_offline.data.termination import never  # noqa: E402
from mbrl_offline.generators.posterior import (POSTERIOR_EXTRA_FIELDS, Histories, PosteriorConfig,  # noqa: E402
                                               PosteriorRollouts)
from mbrl_offline.models import products  # noqa: E402
from mbrl_offline.models.dynamics import GaussianEnsembleDynamics, dynamics_recipe  # noqa: E402

OBS, ACT = throughput.OBS, throughput.ACT
HORIZON = 1000  # hopper's time limit: the rollouts' clock
MEASURES = ("train", "rollout", "update")


@dataclasses.dataclass
class Sizes:
    """Everything that sets a measure's work (the official sizes by default)."""

    members: int = 128  # posterior ensemble (official ensemble.total_size)
    elites: int = 100  # members the rollouts use (official collect.ensemble_size)
    width: int = 200  # hidden units of the ensemble's 4 layers (official ensemble.hidden_size)
    batch: int = 256  # training rows per member per batch
    rows: int = 10_000  # transitions of the ensemble's training data (holdout min(20%, 1000) of them)
    epochs: int = 2  # timed training epochs, after one warm-up epoch
    parallel: int = 100  # rollouts per generate call (official collect.parallel_size)
    rollout_steps: int = 100  # model steps of every rollout
    history_length: int = 10  # rows per episode of the rollouts' history data (prefixes start at t = 0)
    tape: int = 2048  # rows per tape (official train.batch_size)
    episode: int = 1000  # rows per stored episode of the agent's buffer
    prefix: int = 250  # real rows at the start of each stored episode
    episodes: int = 20  # stored episodes
    updates: int = 10  # updates per timed call
    d_model: int = NEUBAYConfig.d_model
    d_hidden: int = NEUBAYConfig.d_hidden
    encoder_layers: int = NEUBAYConfig.encoder_layers
    head_hidden: int = NEUBAYConfig.head_hidden
    head_layers: int = NEUBAYConfig.head_layers
    critics: int = NEUBAYConfig.num_critics
    sampled_critics: int = NEUBAYConfig.sampled_critics


SIZES = {
    "default": Sizes(),
    "quick": Sizes(members=6, elites=4, width=16, batch=32, rows=600, epochs=1, parallel=4, rollout_steps=3,
                   history_length=3, tape=64, episode=20, prefix=5, episodes=6, updates=2, d_model=16, d_hidden=8,
                   head_hidden=16, critics=3, sampled_critics=2),
}


def agent_config(sizes: Sizes) -> NEUBAYConfig:
    return dataclasses.replace(NEUBAYConfig(), batch_size=sizes.tape, d_model=sizes.d_model, d_hidden=sizes.d_hidden,
                               encoder_layers=sizes.encoder_layers, head_hidden=sizes.head_hidden,
                               head_layers=sizes.head_layers, num_critics=sizes.critics,
                               sampled_critics=sizes.sampled_critics)


def make_agent(sizes: Sizes, device: torch.device) -> NEUBAY:
    torch.manual_seed(0)
    agent = NEUBAY(OBS, ACT, -np.ones(ACT), np.ones(ACT), agent_config(sizes), device)
    agent.set_total_updates(2_000_000)  # the official grad_steps: the cosine schedules run as in a real run
    return agent


def dynamics_config(sizes: Sizes, epochs: int = 1):
    return dynamics_recipe("neubay", ensemble_size=sizes.members, num_elites=sizes.elites, hidden_size=sizes.width,
                           batch_size=sizes.batch, max_epochs=epochs, patience=10 ** 9)


def parameters(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def episodes_dataset(rows: int, length: int, seed: int = 0) -> OfflineDataset:
    """Random hopper-shaped transitions in episodes of ``length`` rows, each ending terminal (so no
    row is a timeout, which NEUBAY's model data leaves out)."""
    rng = np.random.default_rng(seed)
    terminals = np.zeros(rows, bool)
    terminals[length - 1::length] = True
    terminals[-1] = True
    return OfflineDataset(observations=rng.standard_normal((rows, OBS)), actions=rng.uniform(-1, 1, (rows, ACT)),
                          rewards=rng.standard_normal(rows), next_observations=rng.standard_normal((rows, OBS)),
                          terminals=terminals, timeouts=np.zeros(rows, bool), env_name="hopper")


# ------------------------------------------------------------------------------------ measures
def measure_training(sizes: Sizes, device: torch.device) -> dict:
    """Ensemble training (see the module docstring): rates in samples (member-rows) per second."""
    dataset = episodes_dataset(sizes.rows, 1000)
    torch.manual_seed(0)
    model = GaussianEnsembleDynamics(OBS, ACT, dynamics_config(sizes, 1 + sizes.epochs)).to(device)
    x = torch.randn(sizes.members, sizes.batch, OBS + ACT, device=device)
    y = torch.randn(sizes.members, sizes.batch, OBS + 1, device=device)
    flops = throughput.count_flops(lambda: model.loss(x, y).backward()) / (sizes.members * sizes.batch)
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    log = model.fit(dataset, device, progress=False)
    seconds = time.perf_counter() - start
    holdout = min(int(round(0.2 * sizes.rows)), 1000)
    train_rows = sizes.rows - holdout
    batch_loop = [epoch["samples_per_s"] * sizes.members for epoch in log[1:]]
    return {"batch_loop": statistics.median(batch_loop), "batch_loops": batch_loop,
            "fit": len(log) * train_rows * sizes.members / seconds, "flops": flops,
            "work": {"members": sizes.members, "width": sizes.width, "layers": model.config.hidden_layers,
                     "batch": sizes.batch, "train_rows": train_rows, "batches": -(-train_rows // sizes.batch),
                     "ensemble_parameters": parameters(model)}}


def make_rollouts(sizes: Sizes, device: torch.device) -> PosteriorRollouts:
    torch.manual_seed(1)
    model = GaussianEnsembleDynamics(OBS, ACT, dynamics_config(sizes)).to(device)
    model.mark_fitted()  # random weights: the rollouts are timed, not used (elites: members 0..E-1)
    histories = Histories(episodes_dataset(100 * sizes.history_length, sizes.history_length, seed=1), HORIZON, device)
    config = PosteriorConfig(parallel=sizes.parallel, quantile=-1.0, max_rollout_len=sizes.rollout_steps,
                             start_from_s0=True)
    return PosteriorRollouts(model, never, histories, config)


def measure_rollouts(sizes: Sizes, device: torch.device, calls: int) -> dict:
    """Posterior rollouts (see the module docstring): imagined transitions per second."""
    agent = make_agent(sizes, device)
    rollouts = make_rollouts(sizes, device)
    rng = torch.Generator(device=device).manual_seed(0)
    expected = sizes.parallel * sizes.rollout_steps
    made = []

    def call():
        _, stats = rollouts.generate(agent.policy, None, rng)
        made.append(int(stats["rollout_transitions"]))

    flops = throughput.count_flops(call) / expected  # the warm-up call
    times = throughput.timed(call, calls, device)
    if any(n != expected for n in made):
        raise RuntimeError(f"posterior rollouts made {made} transitions per call, not {expected}")
    model = rollouts.dynamics
    member = parameters(model) // model.config.ensemble_size
    return {"rate": expected / statistics.median(times), "rates": [expected / t for t in times], "flops": flops,
            "work": {"parallel": sizes.parallel, "elites": len(model.elites), "steps": sizes.rollout_steps,
                     "transitions": expected, "elite_parameters": member * len(model.elites),
                     "actor_parameters": parameters(agent.actor), "policy_input": agent.input_dim}}


def filled_sequences(sizes: Sizes, device: torch.device) -> SequenceBuffer:
    """A synthetic sequence buffer as the trainer keeps NEUBAY's (the posterior generator's fields),
    holding ``episodes`` random episodes of ``episode`` rows, the first ``prefix`` of each real."""
    buffer = SequenceBuffer(sizes.episodes * sizes.episode, OBS, ACT, device, extra_fields=POSTERIOR_EXTRA_FIELDS)
    rows = sizes.episodes * sizes.episode
    gen = torch.Generator().manual_seed(2)
    fields = {key: torch.zeros((rows, *shape), dtype=dtype) for key, (shape, dtype) in buffer.schema.items()}
    fields["observations"] = torch.randn(rows, OBS, generator=gen)
    fields["next_observations"] = torch.randn(rows, OBS, generator=gen)
    fields["actions"] = torch.rand(rows, ACT, generator=gen) * 2 - 1
    fields["rewards"] = torch.randn(rows, generator=gen)
    fields["observed_rewards"] = fields["rewards"].clone()
    within = torch.arange(rows) % sizes.episode
    fields["synthetic"] = within >= sizes.prefix
    fields["timeouts"] = within == sizes.episode - 1
    buffer.add_episodes(within == 0, **fields)
    return buffer


def measure_updates(sizes: Sizes, device: torch.device, calls: int) -> dict:
    """Agent updates (see the module docstring): updates per second."""
    agent = make_agent(sizes, device)
    buffer = filled_sequences(sizes, device)
    mixing = Mixing(MixingConfig(rule="tape", kappa=0.05))
    rng = torch.Generator(device=device).manual_seed(0)
    shapes = {}

    def loop(n: int) -> None:
        for _ in range(n):
            tape = mixing.sample(buffer, buffer, sizes.tape, rng)
            shapes["tape"] = list(tape_inputs(tape).shape)
            agent.update(tape)

    flops = throughput.count_flops(lambda: loop(1))
    loop(2)  # warm-up
    times = throughput.timed(lambda: loop(sizes.updates), calls, device)
    return {"rate": sizes.updates / statistics.median(times), "rates": [sizes.updates / t for t in times],
            "flops": flops,
            "work": {"tape": shapes["tape"], "critic_parameters": parameters(agent.critic),
                     "actor_parameters": parameters(agent.actor), "critics": agent.config.num_critics,
                     "sampled_critics": agent.config.sampled_critics}}


# Where an update's time goes (``--profile``): the first part whose test an operator's name passes; an
# operator inside a scan or an optimiser step (its profiler parent chain) is counted in that part.
PARTS = (
    ("LRU scan (forward and written-out backward)", lambda name: name.startswith("_LRUScan")),
    ("optimisers (AdamW, Adam, clipping excluded)", lambda name: name.startswith("Optimizer.step")),
    ("matrix products", lambda name: name in ("aten::mm", "aten::bmm", "aten::baddbmm", "aten::addmm",
                                               "aten::addbmm", "aten::matmul", "aten::linear",
                                               "mkldnn::_linear_pointwise")),
    ("LayerNorm", lambda name: "layer_norm" in name),
    ("activations (GELU, sigmoid, leaky ReLU, tanh)",
     lambda name: any(f"aten::{op}" in name for op in ("gelu", "sigmoid", "leaky_relu", "tanh"))),
)


def profile_updates(sizes: Sizes, device: torch.device, updates: int) -> list[tuple[str, float]]:
    """``(part, share of the profiled time)`` for ``updates`` updates, largest first (see `PARTS`)."""
    from torch.profiler import ProfilerActivity, profile

    agent = make_agent(sizes, device)
    buffer = filled_sequences(sizes, device)
    mixing = Mixing(MixingConfig(rule="tape", kappa=0.05))
    rng = torch.Generator(device=device).manual_seed(0)
    for _ in range(2):  # warm-up
        agent.update(mixing.sample(buffer, buffer, sizes.tape, rng))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(updates):
            agent.update(mixing.sample(buffer, buffer, sizes.tape, rng))
    times: dict[str, float] = {}
    for event in prof.events():
        part, node = None, event
        while node is not None and part is None:  # the operator itself, then its nearest ancestor with a part
            part = next((label for label, test in PARTS if test(node.name)), None)
            node = node.cpu_parent
        label = part or "other operators (elementwise, copies, reductions, indexing)"
        times[label] = times.get(label, 0.0) + event.self_cpu_time_total
    total = sum(times.values())
    return sorted(((label, t / total) for label, t in times.items()), key=lambda row: -row[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="default", choices=list(SIZES))
    parser.add_argument("--measures", nargs="+", default=list(MEASURES), choices=MEASURES)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed calls per measure (training: timed epochs); quick sizes: 1")
    parser.add_argument("--profile", action="store_true",
                        help="also print where the update's time goes (torch's profiler, by part)")
    parser.add_argument("--system-malloc", action="store_true",
                        help="leave glibc's malloc settings alone (training runs call keep_freed_memory on CPU)")
    args = parser.parse_args()
    device = throughput.set_up(args)
    quick = args.sizes == "quick"
    repeats = 1 if quick else args.repeats
    sizes = dataclasses.replace(SIZES[args.sizes], epochs=repeats)
    peak = throughput.matmul_peak(device, readings=1 if quick else 5)
    rows = []
    if "train" in args.measures:
        result = measure_training(sizes, device)
        work = result["work"]
        label = (f"posterior ensemble {work['members']} x {work['layers']} x {work['width']} "
                 f"({work['ensemble_parameters'] / 1e6:.2f}M), batch {work['batch']} per member")
        unit = f"samples/s (member-rows; {work['train_rows']:,} rows per member per epoch)"
        rows.append((label, f"training, batch loop: {unit}", result["batch_loop"], result["flops"]))
        rows.append((label, f"training, whole fit ({1 + sizes.epochs} epochs): {unit}", result["fit"], result["flops"]))
    if "rollout" in args.measures:
        result = measure_rollouts(sizes, device, repeats)
        work = result["work"]
        label = (f"posterior rollouts: {work['parallel']} in {work['elites']} elites, {work['steps']} steps, "
                 f"recurrent actor ({work['actor_parameters'] / 1e6:.2f}M)")
        rows.append((label, f"imagined transitions/s ({work['transitions']:,} per call)", result["rate"],
                     result["flops"]))
    if "update" in args.measures:
        result = measure_updates(sizes, device, repeats)
        work = result["work"]
        label = (f"NEUBAY agent: tape {work['tape'][0]} x {work['tape'][1]}, critic "
                 f"{work['critic_parameters'] / 1e6:.2f}M ({work['critics']} heads), actor "
                 f"{work['actor_parameters'] / 1e6:.2f}M")
        rows.append((label, f"updates/s (tape sampling included; {sizes.updates} per call)", result["rate"],
                     result["flops"]))
    peak += throughput.matmul_peak(device, readings=1 if quick else 5)
    # where NEUBAY's encoders and the heads' first layer run their products on oneDNN (models.products)
    onednn_peak = throughput.onednn_matmul_rate() if device.type == "cpu" and products.routes() else None
    throughput.print_rates(rows, peak, device, ("measure", "unit"), "MFLOP",
                           "(--sizes quick: tiny models; the rates mean nothing)" if quick else "",
                           onednn_peak=onednn_peak)
    if args.profile:
        print(f"\nWhere an update's time goes (torch's profiler over {repeats} updates, each operator's own time):\n")
        print("| part | share |\n|---|---:|")
        for label, share in profile_updates(sizes, device, repeats):
            print(f"| {label} | {share:.0%} |")


if __name__ == "__main__":
    main()
