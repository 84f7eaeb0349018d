"""NEUBAY's parts against the official JAX + Equinox code of NEUBAY on this machine's CPU, in the same minutes.

    # outside this repository: the official code and a Python environment for it
    git clone https://github.com/twni2016/neubay /tmp/neubay_checkout     # commit 5604bad
    python -m venv /work/neubay_venv
    /work/neubay_venv/bin/pip install jax==0.5.3 jaxlib==0.5.3 equinox==0.12.2 optax==0.2.5 distrax==0.1.5 \\
        chex==0.1.89 numpy==2.2.6 jaxtyping==0.3.2 hydra-core==1.3.2 omegaconf==2.3.0 \\
        tensorflow-probability==0.25.0 scipy==1.15.3 scikit-learn==1.7.0 tqdm==4.67.1 gym==0.23.1
    python benchmarks/vs_neubay.py --neubay /tmp/neubay_checkout --python /work/neubay_venv/bin/python
        [--pairs 3] [--threads 2] [--measures train rollout update] [--sizes default|quick]
        [--members 128] [--elites 100] [--width 200] [--batch 256] [--rows 10000] [--epochs 2]
        [--parallel 100] [--rollout-steps 100] [--history-length 10] [--calls 3]
        [--tape 2048] [--episode 1000] [--prefix 250] [--episodes 20] [--updates 10]
        [--d-model 256] [--d-hidden 128] [--encoder-layers 2] [--head-hidden 256] [--head-layers 2]
        [--critics 10] [--sampled-critics 2]

The packages are the official ``requirements.yml``'s pins for what these parts import, CPU only (no
CUDA plugin, no d4rl, mujoco or wandb), on this machine's Python 3.11 (the official 3.10): jax and
jaxlib 0.5.3, equinox 0.12.2, optax 0.2.5, distrax 0.1.5, chex 0.1.89, numpy 2.2.6, jaxtyping 0.3.2,
hydra-core 1.3.2, omegaconf 2.3.0, tensorflow-probability 0.25.0, scipy 1.15.3, scikit-learn 1.7.0,
tqdm 4.67.1 and gym 0.23.1 (it warns that it does not support numpy 2; the parts used here do not
touch it). The official side's process prints the versions it ran with; the summary repeats them.

Both sides run the same sizes (the flags; ``--sizes quick`` sets tiny ones for a check that it runs)
on hopper-shaped rows (obs 11, act 3, the agent's input [s, a_prev, r_prev] 15 wide), random values
and random weights (the costs do not depend on them). Both processes report, read off their own
objects, the parameter counts and shapes below; the script stops if the two sides' differ.

For each measure the official code and ours run in separate processes, one after the other,
``--pairs`` times, so that each pair shares the machine's state; each pair's ratio (ours / official)
is printed. Each process also times fp32 matmuls before and after (ours: `throughput.matmul_peak`,
torch's 1024^3 product; official: the same product by a jitted ``jnp.matmul``). ``--threads`` pins
both processes to that many cores (``sched_setaffinity``, which sizes XLA's thread pool too) and sets
torch's thread count. Each side times only its own work, after its warm-up (JAX: the compilations).
The processes run through `side_by_side.run_child` (each prints one ``RESULT`` line of JSON). On AMD
CPUs torch's matmul runs MKL's AVX2 code unless ``MBRL_OFFLINE_MKL_AVX512=1`` is set (`mbrl_offline.
platform`; the header says which), while XLA's runs AVX-512: the two peaks show it.

* train (samples/s, a sample being one member's row: members x batch per step): the posterior
  ensemble's training batches over ``--epochs`` epochs of ``rows - min(20% rows, 1000)`` rows per
  member, after one warm-up epoch (which compiles the official step for the full and the last partial
  batch). Official: ``offline_world.modules.EnsembleContModel`` (``has_ln`` and the optimiser's
  settings from ``configs/d4rl_loco/base.yaml``'s ``ensemble``) trained by the step that
  ``LearnedContEnv.train_model`` (``offline_world/cont_ensemble.py``) defines inside itself: an
  ``eqx.filter_jit`` of ``offline_world.losses.get_train_loss`` (forward_diff_data, the NLL, its
  gradient), ``optax.adamw`` and ``eqx.apply_updates``, on ``X_train[perm[:, i*B:(i+1)*B]]`` (numpy rows
  gathered by the per-member permutations, ``jax.vmap(jax.random.permutation)``, drawn before the
  timed loop), the last partial batch trained. Ours: `GaussianEnsembleDynamics.fit` with
  ``dynamics_recipe("neubay")``, the epoch log's batch-loop rate (``samples_per_s``, the same loop:
  its permutations drawn before, the gathers, forward, loss, backward and AdamW timed) x members.
  Neither side's per-epoch holdout evaluation is timed.
* rollout (imagined transitions/s): ``--parallel`` rollouts of the recurrent actor, one per elite
  (``--elites`` of ``--members``), from episode starts of a history dataset of ``--history-length``-row
  episodes, run exactly ``--rollout-steps`` steps (no termination: halfcheetah's function; no
  uncertainty truncation: threshold infinity; the clock's horizon 1000), one warm-up call then
  ``--calls`` timed calls. Official: ``experience.collector.ContCollector.__call__`` (history sampling,
  the actor's warm-up pass, the loop of ``online_rl.ac_modules.RecurrentActor`` steps and
  ``LearnedContEnv.step``, which calls ``cont_ensemble._step``: ``forward_same_data`` for U and
  ``forward_diff_data`` for each row's own member; then the rollouts' assembly) with
  ``start_from_s0=True``. Ours: `PosteriorRollouts.generate` (``start_from_s0``, ``quantile`` -1,
  ``max_rollout_len`` = steps) with `NEUBAY`'s policy. Both store parallel x steps imagined
  transitions per call (checked on both sides).
* update (updates/s): the training loop body: a tape of ``--tape`` rows drawn from a buffer of
  ``--episodes`` episodes of ``--episode`` rows (the first ``--prefix`` real) and one recurrent SAC
  update, ``--updates`` per call after 2 warm-up updates, ``--calls`` timed calls. Official:
  ``experience.agent_buffer.TapeBuffer.sample``, ``jnp.asarray`` of its fields, then
  ``online_rl.ac_losses.sac_update`` (``eqx.filter_jit``: the critic loss ``sac_q_loss`` and its
  gradient, the optimiser, the target's Polyak update, ``sac_pi_loss`` and the actor's optimiser, the
  alpha loss and Adam), with the networks and optimisers built as ``offline_cont.py``'s ``main`` does
  from ``base.yaml`` (``StackedLRU`` encoders, ``RecurrentCritic``, ``RecurrentActor``, ``Alpha``, an
  ``optax.partition`` of ``online_rl.common.get_optimizer`` chains into encoder and head); ours: the
  trainer's ``Mixing(tape rule).sample`` then `NEUBAY.update`. The official update runs five encoder
  passes over the tape (critic, actor and target critic in the critic loss; actor and critic in the
  actor loss), ours four (one actor pass serves both losses: see `mbrl_offline.algorithms.neubay`).

Adapters, none of them timed: the official side runs this file under ``--python`` (no torch there)
with the checkout on its path. ``offline_world/cont_ensemble.py``, ``experience/wrapper.py``,
``experience/evaluator.py`` and ``offline_world/static_fns.py`` import ``wandb`` and ``d4rl``, which
are not installed and whose parts are not run here: empty stand-ins replace them. Written here, as
the official code does it but not importable from it: the ensemble's training step and epoch loop
(local to ``LearnedContEnv.train_model``); the agent's set-up (local to ``offline_cont.main``: the
networks, the optimisers' partition labels for the fields ``pre``, ``memory`` and the heads); the
``LearnedContEnv``'s attributes that ``load_model_and_data`` would set from a trained checkpoint and
the D4RL data (``ensemble``: a random ``EnsembleContModel`` cut to its first ``--elites`` members by
``subselect_members``; ``scaler``: ``Scaler`` of the random data; ``history_sampler``:
``HistorySampler`` of an object whose ``get_dataset()`` returns the random data in D4RL's keys;
``termination_fn``: ``termination_fn_halfcheetah``; ``unc_thres``: infinity; ``penalty_coef``: 0, the
official default); the tape buffer's episodes (random, in ``offline_cont.make_buffer``'s fields).

Sizes that could not be equal: the official actor's warm-up reads the histories left-padded to the
dataset's longest history (``--history-length`` + 1 rows), ours the longest sampled prefix (1 row);
at the defaults that is 1,100 actor rows per call against the 10,000 actor rows and 1M elite rows of
the 100 steps.

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

# No torch at the top: the official side's process runs this file under a Python without it.
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from side_by_side import child_or_driver, compare  # noqa: E402  (the standard library only)
from vs_pgd import jax_matmul_peak  # noqa: E402  (no torch either)

OBS, ACT = 11, 3  # hopper
INPUT = OBS + ACT + 1  # the agent's input [s, a_prev, r_prev]
HORIZON = 1000
UNITS = {"train": "samples/s", "rollout": "transitions/s", "update": "updates/s"}
OFFICIAL_FILE = Path("offline_world") / "cont_ensemble.py"
OFFICIAL_CONFIG = Path("configs") / "d4rl_loco" / "base.yaml"
# what both sides must agree on, per measure (each process reads them off its own objects)
SAME_WORK = {"train": ("members", "width", "layers", "batch", "train_rows", "batches", "ensemble_parameters"),
             "rollout": ("parallel", "elites", "steps", "transitions", "elite_parameters", "actor_parameters",
                         "policy_input"),
             "update": ("tape", "critic_parameters", "actor_parameters", "critics", "sampled_critics")}
# the sizes (flag: default, quick); the defaults are `neubay.Sizes()` (the official sizes)
SIZE_FLAGS = {"members": (128, 6), "elites": (100, 4), "width": (200, 16), "batch": (256, 32), "rows": (10_000, 600),
              "epochs": (2, 1), "parallel": (100, 4), "rollout_steps": (100, 3), "history_length": (10, 3),
              "calls": (3, 1), "tape": (2048, 64), "episode": (1000, 20), "prefix": (250, 5), "episodes": (20, 6),
              "updates": (10, 2), "d_model": (256, 16), "d_hidden": (128, 8), "encoder_layers": (2, 2),
              "head_hidden": (256, 16), "head_layers": (2, 2), "critics": (10, 3), "sampled_critics": (2, 2)}
SIZE_HELP = {"members": "posterior ensemble members", "elites": "members the rollouts use",
             "width": "ensemble hidden units (4 layers on both sides: the official model's)",
             "batch": "training rows per member per step", "rows": "ensemble training data rows",
             "epochs": "timed training epochs (after one warm-up epoch)", "parallel": "rollouts per call",
             "rollout_steps": "model steps per rollout", "history_length": "rows per history episode",
             "calls": "timed calls per process (rollout, update)", "tape": "rows per tape",
             "episode": "rows per stored episode (agent buffer)", "prefix": "real rows per stored episode",
             "episodes": "stored episodes", "updates": "updates per timed call", "d_model": "encoder width",
             "d_hidden": "LRU complex states", "encoder_layers": "LRU layers", "head_hidden": "head width",
             "head_layers": "head hidden layers", "critics": "critic heads", "sampled_critics": "target heads drawn"}


# ------------------------------------------------------------------------------------------- official
def import_official(checkout: Path):
    """The official modules, with empty stand-ins for ``wandb`` and ``d4rl`` (see the docstring)."""
    for name in ("wandb", "d4rl"):
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__path__ = []
            sys.modules[name] = module
    sys.path[:] = [str(checkout)] + [p for p in sys.path if Path(p or ".").resolve() != HERE]
    from experience import agent_buffer, collector, world_buffer
    from memory import lru
    from offline_world import cont_ensemble, losses, modules, static_fns
    from online_rl import ac_losses, ac_modules, common
    return types.SimpleNamespace(agent_buffer=agent_buffer, collector=collector, world_buffer=world_buffer, lru=lru,
                                 cont_ensemble=cont_ensemble, losses=losses, modules=modules, static_fns=static_fns,
                                 ac_losses=ac_losses, ac_modules=ac_modules, common=common)


def official_config(args) -> dict:
    """``configs/d4rl_loco/base.yaml`` with this benchmark's agent sizes."""
    from omegaconf import OmegaConf
    config = OmegaConf.to_container(OmegaConf.load(args.neubay / OFFICIAL_CONFIG))
    model = config["model"]
    model["memory"].update(d_model=args.d_model, d_hidden=args.d_hidden, n_layers=args.encoder_layers)
    model.update(head_d_hidden=args.head_hidden, head_n_layers=args.head_layers, num_critics=args.critics,
                 sampled_critics=args.sampled_critics)
    return config


def array_size(tree) -> int:
    import equinox as eqx
    import jax
    return sum(int(x.size) for x in jax.tree_util.tree_leaves(eqx.filter(tree, eqx.is_inexact_array)))


def random_data(rows: int, length: int, seed: int) -> dict:
    """Random hopper-shaped transitions in D4RL's keys, episodes of ``length`` rows ending terminal."""
    import numpy as np
    rng = np.random.default_rng(seed)
    terminals = np.zeros(rows, bool)
    terminals[length - 1::length] = True
    terminals[-1] = True
    return {"observations": rng.standard_normal((rows, OBS)).astype(np.float32),
            "actions": rng.uniform(-1, 1, (rows, ACT)).astype(np.float32),
            "next_observations": rng.standard_normal((rows, OBS)).astype(np.float32),
            "rewards": rng.standard_normal(rows).astype(np.float32), "terminals": terminals,
            "timeouts": np.zeros(rows, bool)}


def official_agent(off, config: dict, key):
    """The networks as ``offline_cont.main`` builds them (``obs_shape``: the wrapped env's [s, a, r])."""
    import equinox as eqx
    import jax
    key, m1_key, m2_key, q_key, pi_key = jax.random.split(key, 5)
    model = config["model"]
    q_network = off.ac_modules.RecurrentCritic((INPUT,), (ACT,), off.lru.StackedLRU(**model["memory"], key=m1_key),
                                               model, q_key)
    q_target = eqx.nn.inference_mode(off.ac_modules.RecurrentCritic(
        (INPUT,), (ACT,), off.lru.StackedLRU(**model["memory"], key=m1_key), model, q_key))
    pi_network = off.ac_modules.RecurrentActor((INPUT,), (ACT,), off.lru.StackedLRU(**model["memory"], key=m2_key),
                                               model, pi_key)
    return q_network, q_target, pi_network


def official_training(args, off) -> tuple[list[float], dict]:
    import equinox as eqx
    import jax
    import numpy as np
    import optax

    settings = official_config(args)["ensemble"]
    model = off.modules.EnsembleContModel(ensemble_size=args.members, obs_dim=OBS, act_dim=ACT,
                                          hidden_size=args.width, has_ln=settings["has_ln"],
                                          key=jax.random.PRNGKey(0))
    opt = optax.adamw(learning_rate=settings["lr"], weight_decay=settings["weight_decay"])
    opt_state = opt.init(eqx.filter(model, eqx.is_inexact_array))

    @eqx.filter_jit
    def train_step(model, opt_state, x, y):  # the step local to LearnedContEnv.train_model
        loss, grads = off.losses.get_train_loss(model, x, y)
        updates, opt_state = opt.update(grads, opt_state, params=eqx.filter(model, eqx.is_inexact_array))
        return eqx.apply_updates(model, updates), opt_state, loss

    holdout = min(int(args.rows * 0.2), 1000)
    rng = np.random.default_rng(0)
    x_train = rng.standard_normal((args.rows - holdout, OBS + ACT)).astype(np.float32)
    y_train = rng.standard_normal((args.rows - holdout, OBS + 1)).astype(np.float32)
    rows, members, batch = len(x_train), args.members, args.batch
    batches = (rows + batch - 1) // batch
    key = jax.random.PRNGKey(1)

    def epoch() -> float:
        nonlocal model, opt_state, key
        key, perm_key = jax.random.split(key)
        perm = jax.vmap(lambda k: jax.random.permutation(k, rows))(jax.random.split(perm_key, members))
        perm.block_until_ready()
        start = time.perf_counter()
        for i in range(batches):
            index = perm[:, i * batch:(i + 1) * batch]
            model, opt_state, loss = train_step(model, opt_state, x_train[index], y_train[index])
        jax.block_until_ready((eqx.filter(model, eqx.is_array), loss))
        return rows * members / (time.perf_counter() - start)

    epoch()  # warm-up: compiles the step for the full and the last partial batch
    layers = sum(1 for name in vars(model.members) if name.startswith("block"))
    work = {"members": model.ensemble_size, "width": args.width, "layers": layers, "batch": batch,
            "train_rows": rows, "batches": batches, "ensemble_parameters": array_size(model)}
    return [epoch() for _ in range(args.epochs)], work


class _HistoryEnv:
    """What ``HistorySampler`` reads of a D4RL env: ``get_dataset()``, the time limit, the action space."""

    def __init__(self, data: dict):
        self.data, self._max_episode_steps = data, HORIZON
        self.action_space = types.SimpleNamespace(shape=(ACT,))

    def get_dataset(self, **kwargs) -> dict:
        return dict(self.data)


def official_rollouts(args, off) -> tuple[list[float], dict]:
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    key = jax.random.PRNGKey(0)
    key, model_key, agent_key = jax.random.split(key, 3)
    env = off.cont_ensemble.LearnedContEnv()
    full = off.modules.EnsembleContModel(ensemble_size=args.members, obs_dim=OBS, act_dim=ACT, hidden_size=args.width,
                                         has_ln=official_config(args)["ensemble"]["has_ln"], key=model_key)
    env.ensemble = off.modules.subselect_members(full, jnp.arange(args.elites))
    data = random_data(100 * args.history_length, args.history_length, seed=1)
    env.scaler = off.modules.Scaler(observations=data["observations"], actions=data["actions"], rewards=data["rewards"])
    env.history_sampler = off.world_buffer.HistorySampler("d4rl_loco", _HistoryEnv(data))
    env.termination_fn = off.static_fns.termination_fn_halfcheetah  # never terminates
    env.state_dim, env.act_dim, env.max_horizon = OBS, ACT, HORIZON
    env.unc_type, env.penalty_coef, env.unc_thres = "epi_mean", 0.0, jnp.inf
    env.max_rollout_len = args.rollout_steps
    collector = off.collector.ContCollector(env)
    _, _, pi_network = official_agent(off, official_config(args), agent_key)
    agent = eqx.nn.inference_mode(pi_network)
    expected = args.parallel * args.rollout_steps
    made = []

    def call() -> float:
        nonlocal key
        key, collect_key = jax.random.split(key)
        start = time.perf_counter()
        rollout_data, metrics = collector(agent, deterministic=False, start_from_s0=True,
                                          parallel_size=args.parallel, key=collect_key)
        seconds = time.perf_counter() - start
        # each trajectory: its history (one observation row at t = 0), the rollout, the dummy last row
        made.append(sum(int((~traj["real"][:-1]).sum()) for traj in rollout_data))
        return made[-1] / seconds

    call()
    rates = [call() for _ in range(args.calls)]
    if any(n != expected for n in made):
        raise RuntimeError(f"the official rollouts made {made} transitions per call, not {expected}")
    work = {"parallel": args.parallel, "elites": env.ensemble.ensemble_size, "steps": args.rollout_steps,
            "transitions": made[-1], "elite_parameters": array_size(env.ensemble),
            "actor_parameters": array_size(pi_network), "policy_input": pi_network.input_size}
    return rates, work


def official_updates(args, off) -> tuple[list[float], dict]:
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    config = official_config(args)
    model, train = config["model"], config["train"]
    key = jax.random.PRNGKey(0)
    key, agent_key = jax.random.split(key)
    q_network, q_target, pi_network = official_agent(off, config, agent_key)
    alpha = off.ac_modules.Alpha(init_value=model["init_alpha"],
                                 target_entropy=-float(ACT) * model["target_alpha_ratio"])

    def partition(encoder_lr: float, head_lr: float, lr_ratio: float, head: str):
        """offline_cont.main's optimiser: encoder (pre, memory) and head groups, get_optimizer each."""
        def labels(params):
            return eqx.tree_at(lambda m: (m.pre, m.memory, getattr(m, head)), params, ("encoder", "encoder", "head"))
        return optax.partition(transforms={"encoder": off.common.get_optimizer(encoder_lr, lr_ratio, train),
                                           "head": off.common.get_optimizer(head_lr, lr_ratio, train)},
                               param_labels=labels)

    opt_q = partition(train["critic_enc_lr"], train["critic_head_lr"], train["critic_lr_ratio"], "critic_heads")
    opt_pi = partition(train["actor_enc_lr"], train["actor_head_lr"], train["actor_lr_ratio"], "actor_head")
    opt_alpha = optax.adam(learning_rate=train["alpha_lr"])
    opt_state_q = opt_q.init(eqx.filter(q_network, eqx.is_inexact_array))
    opt_state_pi = opt_pi.init(eqx.filter(pi_network, eqx.is_inexact_array))
    opt_state_alpha = opt_alpha.init(eqx.filter(alpha, eqx.is_inexact_array))

    # offline_cont.make_buffer's fields, episodes of `episode` rows and the dummy last row each
    length = args.episode + 1
    rb = off.agent_buffer.TapeBuffer(args.episodes * length, "start", {
        "observation": {"shape": (INPUT,), "dtype": np.float32}, "action": {"shape": (ACT,), "dtype": np.float32},
        "next_reward": {"shape": (), "dtype": np.float32}, "start": {"shape": (), "dtype": bool},
        "next_terminated": {"shape": (), "dtype": bool}, "next_truncated": {"shape": (), "dtype": bool},
        "real": {"shape": (), "dtype": bool}})
    rng = np.random.default_rng(2)
    for _ in range(args.episodes):
        within = np.arange(length)
        rb.add(observation=rng.standard_normal((length, INPUT)).astype(np.float32),
               action=rng.uniform(-1, 1, (length, ACT)).astype(np.float32),
               next_reward=rng.standard_normal(length).astype(np.float32), start=within == 0,
               next_terminated=np.zeros(length, bool), next_truncated=within >= length - 2,
               real=within < args.prefix)
    gamma, tau = jnp.float32(train["gamma"]), jnp.float32(train["target_tau"])
    real_weight = jnp.float32(train["real_weight"])
    backup_entropy = train.get("backup_entropy", True)
    shapes = {}

    def loop(n: int) -> None:
        nonlocal key, q_network, pi_network, alpha, q_target, opt_state_q, opt_state_pi, opt_state_alpha
        metrics = None
        for _ in range(n):  # offline_cont.main's inner loop
            key, sample_key, loss_key = jax.random.split(key, 3)
            data = jax.tree.map(lambda x: jnp.asarray(x), rb.sample(args.tape, sample_key))
            shapes["tape"] = list(data["observation"].shape)
            (q_network, pi_network, alpha, q_target, opt_state_q, opt_state_pi, opt_state_alpha,
             metrics) = off.ac_losses.sac_update(
                q_network=q_network, pi_network=pi_network, alpha=alpha, q_target=q_target, data=data, opt_q=opt_q,
                opt_pi=opt_pi, opt_alpha=opt_alpha, opt_state_q=opt_state_q, opt_state_pi=opt_state_pi,
                opt_state_alpha=opt_state_alpha, gamma=gamma, tau=tau, real_weight=real_weight,
                backup_entropy=backup_entropy, loss_key=loss_key)
        jax.block_until_ready((metrics, eqx.filter(q_network, eqx.is_array), eqx.filter(pi_network, eqx.is_array)))

    loop(2)  # warm-up: compiles sac_update

    def call() -> float:
        start = time.perf_counter()
        loop(args.updates)
        return args.updates / (time.perf_counter() - start)

    rates = [call() for _ in range(args.calls)]
    work = {"tape": shapes["tape"], "critic_parameters": array_size(q_network),
            "actor_parameters": array_size(pi_network), "critics": model["num_critics"],
            "sampled_critics": model["sampled_critics"]}
    return rates, work


def official_child(args) -> None:
    import importlib.metadata

    off = import_official(args.neubay)
    peak = jax_matmul_peak(args.peak_readings)
    rates, work = {"train": official_training, "rollout": official_rollouts, "update": official_updates}[
        args.measure](args, off)
    peak += jax_matmul_peak(args.peak_readings)
    versions = {name: importlib.metadata.version(name)
                for name in ("jax", "jaxlib", "equinox", "optax", "distrax", "chex", "numpy", "jaxtyping",
                             "tensorflow-probability", "scipy", "scikit-learn", "gym")}
    print("RESULT " + json.dumps({"rate": statistics.median(rates), "rates": rates, "peak": statistics.median(peak),
                                  "work": work, "versions": versions}))


# ------------------------------------------------------------------------------------------- ours
def our_child(args) -> None:
    from mbrl_offline import platform as mbrl_platform
    mbrl_platform.apply_environment()  # before torch: MBRL_OFFLINE_MKL_AVX512=1 must act before MKL loads
    import torch

    import neubay
    import throughput
    from mbrl_offline.platform import keep_freed_memory

    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as training on a CPU does
    device = torch.device("cpu")
    sizes = neubay.Sizes(**{name: getattr(args, name) for name in SIZE_FLAGS if name != "calls"})
    peak = throughput.matmul_peak(device, readings=args.peak_readings)
    if args.measure == "train":
        result = neubay.measure_training(sizes, device)
        rates = result["batch_loops"]
    elif args.measure == "rollout":
        result = neubay.measure_rollouts(sizes, device, args.calls)
        rates = result["rates"]
    else:
        result = neubay.measure_updates(sizes, device, args.calls)
        rates = result["rates"]
    peak += throughput.matmul_peak(device, readings=args.peak_readings)
    print("RESULT " + json.dumps({"rate": statistics.median(rates), "rates": rates, "peak": statistics.median(peak),
                                  "work": result["work"], "flops": result["flops"],
                                  "versions": {"torch": torch.__version__}}))


# ------------------------------------------------------------------------------------------- driver
def child_argv(args) -> list[str]:
    """The resolved sizes and settings, as flags for the child processes."""
    argv = ["--neubay", str(args.neubay), "--python", str(args.python), "--threads", str(args.threads),
            "--peak-readings", str(args.peak_readings)]
    for name in SIZE_FLAGS:
        argv += ["--" + name.replace("_", "-"), str(getattr(args, name))]
    return argv


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--neubay", type=Path, required=True, help="a checkout of twni2016/neubay (commit 5604bad)")
    parser.add_argument("--python", type=Path, required=True,
                        help="the Python with the official code's packages (jax, equinox, optax, distrax, ...)")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="cores for each process (both sides)")
    parser.add_argument("--measures", nargs="+", default=list(UNITS), choices=list(UNITS))
    parser.add_argument("--sizes", default="default", choices=["default", "quick"],
                        help="every size flag's default: the official sizes, or tiny ones (a check that it runs)")
    for name, (default, quick) in SIZE_FLAGS.items():
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=None,
                            help=f"{SIZE_HELP[name]} (default {default}; quick {quick})")
    parser.add_argument("--peak-readings", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--side", choices=["official", "ours"], help=argparse.SUPPRESS)
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    column = 1 if args.sizes == "quick" else 0
    for name, values in SIZE_FLAGS.items():
        if getattr(args, name) is None:
            setattr(args, name, values[column])
    if args.peak_readings is None:
        args.peak_readings = 1 if args.sizes == "quick" else 5
    return args


def main() -> None:
    args = parse_args()
    if not (args.neubay / OFFICIAL_FILE).is_file() or not (args.neubay / OFFICIAL_CONFIG).is_file():
        sys.exit(f"error: {args.neubay} is not a checkout of twni2016/neubay (no {OFFICIAL_FILE}). "
                 "Clone it outside this repository and pass its path with --neubay.")
    if args.parallel % args.elites or args.elites > args.members or args.sampled_critics > args.critics:
        sys.exit("error: --parallel must be a multiple of --elites, --elites at most --members and "
                 "--sampled-critics at most --critics (both codes require it).")
    if child_or_driver(args, official_child, our_child):
        return
    sys.path.insert(0, str(HERE))
    from mbrl_offline import platform as mbrl_platform
    mbrl_platform.apply_environment()  # before torch: MBRL_OFFLINE_MKL_AVX512=1 must act before MKL loads
    import torch

    import throughput
    print(f"device: {throughput.cpu_name()}; {args.threads} threads per process; torch {torch.__version__}; "
          f"MKL's AVX-512 code on AMD CPUs: {mbrl_platform.status()}")
    print(f"sizes: ensemble {args.members} members x 4 x {args.width}, batch {args.batch}, {args.rows:,} rows, "
          f"{args.epochs} timed epochs; rollouts {args.parallel} in {args.elites} elites x {args.rollout_steps} steps; "
          f"agent tape {args.tape}, LRU {args.d_model}/{args.d_hidden} x {args.encoder_layers}, heads "
          f"{args.head_layers} x {args.head_hidden}, {args.critics} critics ({args.sampled_critics} sampled), "
          f"{args.updates} updates per call; {args.calls} timed calls per process")
    print()

    def flops_and_share(ours: dict) -> str:
        share = ours["rate"] * ours["flops"] / 1e9 / ours["peak"]
        return (f"ours {ours['flops'] / 1e6:,.3f} MFLOP per unit (matmuls, torch's counter), {share:.0%} of its "
                "peak in the last pair")

    compare(__file__, str(args.python), args.measures, args.pairs, child_argv(args), SAME_WORK, UNITS,
            official_env={"JAX_PLATFORMS": "cpu"}, summary_extra=flops_and_share)


if __name__ == "__main__":
    main()
