"""What the learning harnesses beside this file share (`vs_offlinerlkit.py` for MOPO and MOBILE,
``vs_official.py --learn`` for RAVL): the common data split, the measurements, our side of a run, the
processes, and the report that docs/parity.md is written by.

Each (algorithm, dataset, seed, side) runs in its own process on one CPU thread and writes one JSON
file under ``--results``; a file already there is kept and not run again, so an interrupted command
continues where it stopped. ``--report FILE`` reads every JSON in ``--results`` (of either harness),
prints the comparison, and writes it as markdown with one PNG of learning curves per (algorithm,
dataset) beside it.

Both sides get the same arrays: the bundled dataset (``mbrl_offline.load_dataset``) less one common
holdout of 1000 rows drawn with a fixed seed (``SPLIT_SEED``), which neither side trains on. Our side
is ``mbrl_offline.build_run`` with the algorithm's config and published generator, the preset
``mbrl_offline/configs/preset/<algo>-<dataset>.yaml`` where there is one, as ``mbrl-train`` runs them, with
the dynamics seed set to the run seed (so that seeds differ on both sides). The generator's schedule
(`scaled`) is the published one in a peer's epochs of 1000 updates, scaled to ``--updates-per-epoch``:
one generation per epoch for MOPO, MOBILE, COMBO and RAVL; for RAMBO four, and an adversarial phase of
as many steps as the epoch has updates at its end (1000 and 1000 at the default budget, as
``run_rambo.py``).

A model fitted on standardised observations (RAMBO's, as ``run_rambo.py`` fits it) is measured on
the holdout standardised by each side's own statistics of the training rows (`standardised_rows`).

What each side reports, measured the same way on both:

* the dynamics model's error on the common holdout: the mean over the elites of each member's MSE of
  its mean [s' - s, r] (and the same over all members), and the holdout loss as each side logs it;
* on the holdout's 1000 states, with their dataset actions and with uniformly random actions: the
  mean and std of MOPO's uncertainty u = max_i |sigma_i|_2 (over all members) and of the penalised
  reward r - lambda u, with r the side's own model step (a random elite's sample) and lambda the MOPO
  preset's for every algorithm (for MOBILE and RAVL, which do not penalise rewards, this describes
  the model only);
* after every epoch: the normalised score (`mbrl_offline.evaluation.evaluate_policy`, the same
  episode seeds on both sides, the deterministic policy), the mean (penalised) reward of that epoch's
  rollouts, the mean of min_j Q_j(s, a) on 10,000 fixed dataset rows, and for MOBILE the mean and std
  of its penalty (the Bellman-target spread, each side's own function) on the holdout's pairs.

A model-free algorithm (published on the dataset alone: CQL, EDAC) has no model and no rollouts: its
runs report the curve of scores, mean min Q and alpha, on the same training rows. ``--ours-algo
KEY=VALUE`` changes our agent's settings for a run (e.g. ``lse_mode=per_repeat``, the peer's
behaviour), whose results ``--label`` names apart from the defaults'.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import mbrl_offline  # noqa: E402
from mbrl_offline import platform as mbrl_platform  # noqa: E402
mbrl_platform.apply_environment()  # before torch: MBRL_OFFLINE_MKL_AVX512=1 acts on both sides' MKL
import numpy as np
import torch

import throughput
from mbrl_offline.utils import atomic_path

ROOT = Path(__file__).resolve().parent.parent
SPLIT_SEED = 20_240_520  # the common holdout and the probe rows, the same for every run
HOLDOUT_ROWS, Q_ROWS = 1000, 10_000
NAMES = {"offlinerlkit": "OfflineRL-Kit", "official": "official RAVL code", "ours": "ours"}
BUDGET = ("dynamics_max_epochs", "epochs", "updates_per_epoch", "rollouts", "eval_episodes")


@dataclass
class Peer:
    """A peer's code as one harness runs it."""
    side: str  # its name in the results ("offlinerlkit", "official")
    option: str  # the command-line option that names its checkout
    repository: str  # where to clone it from
    algos: tuple[str, ...]  # the algorithms its harness compares
    is_checkout: Callable[[Path], bool]
    run: Callable  # (args, checkout) -> the side's results
    script: str  # the harness file, which the worker processes run
    script_args: tuple[str, ...] = ()  # what the worker processes put after the file (vs_official.py: --learn)


# ------------------------------------------------------------------------------------ shared parts
def common_data(dataset_name: str):
    """The dataset, its training rows (all but the common holdout), the holdout rows and the rows
    on which Q is measured."""
    data = mbrl_offline.load_dataset(dataset_name)
    rng = np.random.default_rng(SPLIT_SEED)
    order = rng.permutation(len(data))
    holdout = np.sort(order[:HOLDOUT_ROWS])
    train = np.sort(order[HOLDOUT_ROWS:])
    q_rows = np.sort(rng.choice(len(train), min(Q_ROWS, len(train)), replace=False))
    return data, data.subset(train), data.subset(holdout), q_rows


def preset(algo: str, dataset_name: str, part: str = "algo") -> dict:
    """The ``part`` (``algo`` or ``generator``) settings of ``mbrl_offline/configs/preset/<algo>-<dataset>.yaml`` ({}
    where there is none)."""
    from omegaconf import OmegaConf

    from mbrl_offline.config import CONFIG_DIR

    path = CONFIG_DIR / "preset" / f"{algo}-{dataset_name}.yaml"
    return OmegaConf.to_container(OmegaConf.load(path)).get(part, {}) if path.is_file() else {}


def model_free(algo: str) -> bool:
    """Whether ``algo`` is published on the dataset alone (CQL, EDAC): no dynamics model to measure."""
    from mbrl_offline.algorithms import get_algorithm
    return get_algorithm(algo)[0].published_generator().kind == "none"


def settings(algo: str, dataset_name: str) -> dict:
    """The per-dataset values both sides use: horizon, the algorithm's penalty coefficient, alpha,
    and MOPO's lambda for the model-level penalty measure; the config's defaults where the preset is
    silent. For a model-free algorithm: alpha, and its preset's settings (``agent``)."""
    from mbrl_offline.algorithms import get_algorithm
    agent_cls, config_cls = get_algorithm(algo)
    default, generator = config_cls(), agent_cls.published_generator()
    if model_free(algo):
        p = preset(algo, dataset_name)
        agent = {key: p.get(key, getattr(default, key)) for key in ("num_critics", "eta", "cql_weight")
                 if hasattr(default, key)}
        return {"model_free": True, "auto_alpha": p.get("auto_alpha", default.auto_alpha),
                "init_alpha": p.get("init_alpha", default.init_alpha), "agent": agent}
    p, rollout = preset(algo, dataset_name), preset(algo, dataset_name, "generator").get("rollout", {})
    out = {"horizon": rollout.get("horizon", generator.rollout.horizon),
           "mopo_lambda": preset("mopo", dataset_name, "generator").get("rollout", {}).get("penalty_coef", 0.5),
           "auto_alpha": p.get("auto_alpha", default.auto_alpha), "init_alpha": p.get("init_alpha", default.init_alpha),
           "penalty_coef": (rollout.get("penalty_coef", generator.rollout.penalty_coef) if algo == "mopo"
                            else p.get("penalty_coef", getattr(default, "penalty_coef", None)))}
    d, adversarial = generator.dynamics, generator.adversarial
    out.update(real_ratio=generator.mixing.real_ratio, every=generator.every, retain=generator.rollout.retain_epochs,
               dynamics={"learning_rate": d.learning_rate, "holdout_ratio": d.holdout_ratio,
                         "logvar_bound_coef": d.logvar_bound_coef, "patience": d.patience},
               standardise_observations=generator.standardise_observations,
               observation_std_eps=generator.observation_std_eps,
               adversarial={"every": adversarial.every, "steps": adversarial.steps,
                            "coef": preset(algo, dataset_name, "generator").get("adversarial", {}).get(
                                "coef", adversarial.coef)})
    if algo == "ravl":
        out.update(num_critics=default.num_critics, eta=default.eta)
    if algo == "combo":
        out["cql_weight"] = p.get("cql_weight", default.cql_weight)
    if algo == "rambo":
        out["bc_epochs"] = p.get("bc_epochs", default.bc_epochs)
    return out


def scaled(updates: int, args) -> int:
    """A schedule's count of updates (a generation every ``updates``, an adversarial phase's length),
    published for epochs of 1000 updates, for the run's ``--updates-per-epoch``: at least 1."""
    return max(1, round(updates * args.updates_per_epoch / 1000))


def standardised_rows(rows, mean, std):
    """``rows`` with observations and next observations standardised by a side's own statistics (Kit's
    ``ReplayBuffer.normalize_obs``, our ``StandardisedDynamics``: the training rows' mean and std + eps)."""
    mean, std = np.asarray(mean, dtype=np.float32), np.asarray(std, dtype=np.float32)
    return dataclasses.replace(rows, observations=(rows.observations - mean) / std,
                               next_observations=(rows.next_observations - mean) / std)


def mean_min_q(agent, observations: torch.Tensor, actions: torch.Tensor) -> float:
    """Our agent's mean of min_j Q_j(s, a) over the probe rows, the states normalised as the agent
    normalises them (CQL's and COMBO's CORL normalisation, RAMBO's standardisation; none elsewhere)."""
    normalise = getattr(agent, "normalise", lambda obs: obs)
    return agent.critic(normalise(observations), actions).min(dim=0).values.mean().item()


def model_measures(predict, step, elites, holdout, lam: float, act_low, act_high) -> dict:
    """Holdout error and MOPO's uncertainty and penalised reward on the holdout's states.

    ``predict(obs, act)`` gives each member's mean and log-variance of [s' - s, r] ``(N, B, D)``;
    ``step(obs, act)`` gives the side's own sampled model reward ``(B,)``."""
    obs, act = holdout.observations, holdout.actions
    target = np.concatenate([holdout.next_observations - obs, holdout.rewards[:, None]], axis=1)
    mean, logvar = (np.asarray(t, np.float64) for t in predict(obs, act))
    member_mse = ((mean - target) ** 2).mean(axis=(1, 2))
    out = {"holdout_mse_elites": float(member_mse[elites].mean()), "holdout_mse_all": float(member_mse.mean()),
           "holdout_mse_members": member_mse.tolist()}
    rng = np.random.default_rng(SPLIT_SEED + 1)
    random_act = rng.uniform(act_low, act_high, size=act.shape).astype(np.float32)
    for name, actions in (("data_actions", act), ("random_actions", random_act)):
        _, logvar = (np.asarray(t, np.float64) for t in predict(obs, actions))
        u = np.linalg.norm(np.exp(0.5 * logvar), axis=2).max(axis=0)
        reward = np.asarray(step(obs, actions), np.float64)
        penalised = reward - lam * u
        out[name] = {"u_mean": float(u.mean()), "u_std": float(u.std()), "reward_mean": float(reward.mean()),
                     "penalised_reward_mean": float(penalised.mean()), "penalised_reward_std": float(penalised.std())}
    return out


def weight_differences(group: str, ours, theirs, before, grads=None) -> dict:
    """One module's tensors after a side-by-side update (``ours``, ``theirs`` and ``theirs`` ``before`` it,
    tensors of the same shapes): ``{"<group>: weights": (largest |ours - theirs|, largest step theirs
    took)}``; with ``grads`` (theirs, of this update), also how many elements differ by more than 1e-6
    (of all) and the largest |gradient| at them (of all): Adam's first steps are about lr sign(g), so
    where |g| is at rounding level a rounding difference gives a step of another size."""
    out = {f"{group}: weights": (max((a - b).abs().max().item() for a, b in zip(ours, theirs)),
                                 max((b - c).abs().max().item() for b, c in zip(theirs, before)))}
    if grads is not None:
        off = [(a - b).abs() > 1e-6 for a, b in zip(ours, theirs)]
        out[f"{group}: weights off by > 1e-6 (elements)"] = (sum(int(o.sum()) for o in off), sum(o.numel() for o in off))
        out[f"{group}: largest |gradient| at those"] = (
            max([g[o].abs().max().item() for g, o in zip(grads, off) if o.any()], default=0.0),
            max(g.abs().max().item() for g in grads))
    return out


def eval_seed(seed: int, epoch: int) -> int:
    """`Trainer.evaluate`'s episode seed for ``epoch`` (the epoch just finished)."""
    return int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0] % 2**31)


def yaml_value(text: str):
    """A command-line value as YAML reads it (``member``, ``10.0``, ``null``), and a number written
    without a dot (``1e-4``, which YAML 1.1 reads as a string) as the float the command line's own
    parser reads."""
    import yaml
    value = yaml.safe_load(text)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    return value


# ------------------------------------------------------------------------------------------- ours
def run_ours(args) -> dict:
    from mbrl_offline.algorithms import get_algorithm
    from mbrl_offline.config import config_to_dataclass
    from mbrl_offline.data.envs import get_env_info
    from mbrl_offline.logging import read_metrics
    from mbrl_offline.compose import build_run
    from mbrl_offline.generators import RolloutGeneratorConfig
    from mbrl_offline.trainer import TrainerConfig

    data, train, holdout, q_rows = common_data(args.dataset)
    env = get_env_info(data.env_name)
    low, high = env.action_bounds()
    s = settings(args.algo, args.dataset)
    agent_cls, _ = get_algorithm(args.algo)

    def with_preset(values: dict, part: str) -> dict:
        for key, value in preset(args.algo, args.dataset, part).items():
            values[key] = {**values[key], **value} if isinstance(value, dict) else value
        return values

    agent_values = with_preset(dataclasses.asdict(agent_cls.config_class()), "algo")
    for item in args.ours_algo or []:  # e.g. lse_mode=per_repeat: the peer's behaviour, for comparison
        key, _, value = item.partition("=")
        agent_values[key] = yaml_value(value)
    config = config_to_dataclass(agent_cls.config_class, agent_values, "algo")
    if s.get("model_free"):
        return run_ours_model_free(args, agent_cls, config, train, q_rows)
    values = with_preset(dataclasses.asdict(agent_cls.published_generator()), "generator")
    values["rollout"]["rollouts_per_epoch"] = args.rollouts
    values["every"] = scaled(values["every"], args)  # the published schedule in the run's epochs
    if values["adversarial"]["every"] > 0:
        values["adversarial"].update(every=scaled(values["adversarial"]["every"], args),
                                     steps=scaled(values["adversarial"]["steps"], args))
    values["dynamics"].update(max_epochs=args.dynamics_max_epochs, seed=args.seed)
    for item in args.ours_dynamics or []:  # e.g. logvar_bounds=member: another recipe, for comparison
        key, _, value = item.partition("=")
        values["dynamics"][key] = yaml_value(value)
    generator_config = config_to_dataclass(RolloutGeneratorConfig, values, "generator")

    folder = tempfile.mkdtemp(prefix="ours-")
    run_dir = Path(folder) / "run"
    start = time.perf_counter()
    trainer = build_run(args.algo, train, config, generator_config,
                        TrainerConfig(epochs=max(args.epochs, 1), updates_per_epoch=args.updates_per_epoch,
                                      eval_every=1, eval_episodes=args.eval_episodes, seed=args.seed,
                                      run_dir=str(run_dir), progress=False, tensorboard=False,
                                      checkpoint_every=max(args.epochs, 1)),
                        "cpu", cache_dir=folder)  # seeds torch with args.seed first, as before
    dynamics_seconds = time.perf_counter() - start
    agent, model_ = trainer.agent, trainer.generator.dynamics
    if generator_config.standardise_observations:  # measured in its own coordinates (module docstring)
        model_, holdout = model_.inner, standardised_rows(holdout, model_.obs_mean.cpu(), model_.obs_std.cpu())

    def predict(obs, act):
        with torch.no_grad():
            mean, logvar = model_.predict(torch.as_tensor(obs), torch.as_tensor(act))
        return mean.numpy(), logvar.numpy()

    def step(obs, act):
        return model_.step(torch.as_tensor(obs), torch.as_tensor(act))["rewards"].numpy()

    model = model_measures(predict, step, model_.elites.numpy(), holdout, s["mopo_lambda"], low, high)
    dynamics_log = [float(np.mean(sorted(r["holdout_mse"])[:generator_config.dynamics.num_elites]))
                    for r in model_.train_log]
    model["own_holdout_loss"] = dynamics_log[-1]  # the mean of the best 5 members, as OfflineRL-Kit logs it
    model["epochs"] = len(model_.train_log)
    model["seconds"] = dynamics_seconds
    model["logvar_bounds"] = {"max_mean": model_.max_logvar.mean().item(), "min_mean": model_.min_logvar.mean().item()}

    if args.epochs == 0:  # the dynamics model alone
        return {"model": model, "curve": [], "dynamics_holdout_log": dynamics_log,
                "dynamics_config": dataclasses.asdict(generator_config.dynamics)}
    q_obs = torch.as_tensor(train.observations[q_rows])
    q_act = torch.as_tensor(train.actions[q_rows])
    h_obs, h_act = torch.as_tensor(holdout.observations), torch.as_tensor(holdout.actions)
    extras: list[dict] = []

    class Measure:
        def on_eval(self, trainer, epoch, result):
            with torch.no_grad():
                extra = {"q_mean": mean_min_q(agent, q_obs, q_act)}
                if args.algo == "mobile":
                    penalty = agent.bellman_uncertainty(h_obs, h_act)
                    extra.update(penalty_mean=penalty.mean().item(), penalty_std=penalty.std().item())
            extras.append(extra)

    trainer.callbacks.append(Measure())
    start = time.perf_counter()
    trainer.train()
    metrics = read_metrics(run_dir)
    curve = [{"epoch": h["epoch"], "normalized_score": h["normalized_score"], "return_mean": h["return_mean"],
              "rollout_reward_mean": m["rollout"]["reward_mean"], "alpha": m["train"]["alpha"], **e}
             for h, m, e in zip(trainer.history, metrics, extras)]
    return {"model": model, "curve": curve, "agent_seconds": time.perf_counter() - start,
            "dynamics_holdout_log": dynamics_log, "dynamics_config": dataclasses.asdict(generator_config.dynamics)}


def run_ours_model_free(args, agent_cls, config, train, q_rows) -> dict:
    """A model-free algorithm's run (on the dataset alone): the curve of scores, mean min Q on the
    probe rows and alpha; no model measures."""
    from mbrl_offline.compose import build_run
    from mbrl_offline.generators import NoGeneratorConfig
    from mbrl_offline.logging import read_metrics
    from mbrl_offline.trainer import TrainerConfig

    folder = tempfile.mkdtemp(prefix="ours-")
    run_dir = Path(folder) / "run"
    trainer = build_run(args.algo, train, config, NoGeneratorConfig(),
                        TrainerConfig(epochs=max(args.epochs, 1), updates_per_epoch=args.updates_per_epoch,
                                      eval_every=1, eval_episodes=args.eval_episodes, seed=args.seed,
                                      run_dir=str(run_dir), progress=False, tensorboard=False,
                                      checkpoint_every=max(args.epochs, 1)),
                        "cpu", cache_dir=folder)  # seeds torch with args.seed first
    agent = trainer.agent
    q_obs = torch.as_tensor(train.observations[q_rows])
    q_act = torch.as_tensor(train.actions[q_rows])
    extras: list[dict] = []

    class Measure:
        def on_eval(self, trainer, epoch, result):
            with torch.no_grad():
                extras.append({"q_mean": mean_min_q(agent, q_obs, q_act)})

    trainer.callbacks.append(Measure())
    start = time.perf_counter()
    trainer.train()
    metrics = read_metrics(run_dir)
    curve = [{"epoch": h["epoch"], "normalized_score": h["normalized_score"], "return_mean": h["return_mean"],
              "rollout_reward_mean": float("nan"), "alpha": m["train"]["alpha"], **e}
             for h, m, e in zip(trainer.history, metrics, extras)]
    return {"model": None, "curve": curve, "agent_seconds": time.perf_counter() - start,
            "agent_config": dataclasses.asdict(config)}


# ---------------------------------------------------------------------------------------- driver
def result_path(results: Path, algo: str, dataset: str, seed: int, side: str, dynamics_only: bool = False) -> Path:
    return results / f"{algo}-{dataset}{'-dynamics' if dynamics_only else ''}-seed{seed}-{side}.json"


def worker(args, peer: Peer) -> None:
    torch.set_num_threads(1)
    out = peer.run(args, Path(args.checkout)) if args.side == peer.side else run_ours(args)
    out.update(side=args.label or args.side, code_side=args.side, ours_dynamics=args.ours_dynamics,
               ours_algo=args.ours_algo, algo=args.algo,
               dataset=args.dataset, seed=args.seed, budget={k: getattr(args, k) for k in BUDGET},
               settings=settings(args.algo, args.dataset), torch_threads=1, cpu=throughput.cpu_name(), torch=torch.__version__)
    with atomic_path(args.out) as tmp:
        tmp.write_text(json.dumps(out, indent=1))


def run_all(args, peer: Peer) -> None:
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    jobs = []
    for algo in args.algo:
        for dataset in args.dataset:
            for seed in args.seeds:
                for side in args.sides:
                    label = args.label if side == "ours" and args.label else side
                    path = result_path(results, algo, dataset, seed, label, args.epochs == 0)
                    if path.exists():
                        print(f"kept {path}")
                        continue
                    command = [sys.executable, peer.script, *peer.script_args, "--worker", side, "--algo", algo, "--dataset", dataset,
                               "--seeds", str(seed), "--out", str(path), peer.option, args.checkout or "",
                               *(["--label", label] if label != side else []),
                               *(["--ours-dynamics", *args.ours_dynamics] if side == "ours" and args.ours_dynamics else []),
                               *(["--ours-algo", *args.ours_algo] if side == "ours" and args.ours_algo else []),
                               *[f"--{k.replace('_', '-')}={getattr(args, k)}" for k in
                                 BUDGET]]
                    jobs.append((path, command))

    def run(job):
        path, command = job
        start = time.perf_counter()
        # one thread each; a CPU comparison (the official RAVL modules pick a GPU by themselves where there is one)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TQDM_DISABLE": "1",
               "CUDA_VISIBLE_DEVICES": ""}
        with open(path.with_suffix(".log"), "w") as log:
            done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        status = "done" if done.returncode == 0 else f"FAILED ({done.returncode}; see {path.with_suffix('.log')})"
        print(f"{status}: {path.name} in {time.perf_counter() - start:.0f} s", flush=True)

    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(run, jobs))


def load_results(results: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(results.glob("*.json"))]


def _ms(values) -> str:
    values = [v for v in values if v == v]
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.3g}"
    return f"{np.mean(values):.3g} ± {np.std(values):.2g}"


def report(args) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = load_results(Path(args.results))
    groups: dict[tuple, dict[str, list]] = {}
    for r in runs:  # every run's model also counts among the models of its (algorithm, dataset)
        if r["budget"]["epochs"] > 0:
            groups.setdefault((r["algo"], r["dataset"], False), {}).setdefault(r["side"], []).append(r)
        if r.get("model") is not None:  # a model-free run has no model
            groups.setdefault((r["algo"], r["dataset"], True), {}).setdefault(r["side"], []).append(r)
    for algo, dataset, models in list(groups):  # a models-only table where it adds runs to a learning table
        if not models:
            continue
        learning = groups.get((algo, dataset, False), {})
        if sum(map(len, learning.values())) == sum(map(len, groups[(algo, dataset, True)].values())):
            del groups[(algo, dataset, True)]
    lines = []
    out = Path(args.report)
    for (algo, dataset, dynamics_only), sides in sorted(groups.items()):
        first = next(iter(sides.values()))[0]
        b = first["budget"]
        seeds = {NAMES.get(side, side): sorted(r["seed"] for r in rs) for side, rs in sides.items()}
        head = f"Seeds {', '.join(f'{k}: {v}' for k, v in seeds.items())}; dynamics capped at {b['dynamics_max_epochs']} epochs"
        cpus = sorted({r["cpu"] for rs in sides.values() for r in rs if r.get("cpu")})  # runs from several VMs: each
        machine = f"one CPU thread per run ({'; '.join(cpus) or 'CPU not recorded'}). Mean ± std over seeds."
        free = first["settings"].get("model_free", False)
        if free:
            agent = ", ".join(f"{k} {v}" for k, v in first["settings"]["agent"].items())
            variants = {NAMES.get(side, side): " ".join(rs[0]["ours_algo"]) for side, rs in sides.items()
                        if rs[0].get("ours_algo")}
            lines += [f"### {algo.upper()} on {dataset}", "",
                      f"Seeds {', '.join(f'{k}: {v}' for k, v in seeds.items())}; {b['epochs']} epochs x "
                      f"{b['updates_per_epoch']} updates on the dataset alone, {agent}"
                      + "".join(f"; {name}: {change}" for name, change in variants.items())
                      + f", {b['eval_episodes']} evaluation episodes; {machine}", ""]
        elif dynamics_only:
            lines += [f"### {algo.upper()}'s dynamics model on {dataset}: every run", "",
                      f"{head} (the models of the learning runs above and of runs that trained the model "
                      f"only); {machine}", ""]
        else:
            st = first["settings"]
            agent = (f"{st['num_critics']} critics, eta {st['eta']}" if algo == "ravl"
                     else f"CQL weight {st['cql_weight']}, {st['real_ratio']:.0%} real rows" if algo == "combo"
                     else (f"adversarial coefficient {st['adversarial']['coef']:g} ({st['adversarial']['steps']} steps "
                           f"every {st['adversarial']['every']} updates at 1000 updates per epoch, scaled), "
                           f"{st['bc_epochs']} epochs of behaviour cloning first, {st['real_ratio']:.0%} real rows")
                     if algo == "rambo" else f"penalty coefficient {st['penalty_coef']}")
            lines += [f"### {algo.upper()} on {dataset}", "",
                      f"{head}, then {b['epochs']} epochs x {b['updates_per_epoch']} updates, {b['rollouts']} rollouts "
                      f"of h = {first['settings']['horizon']} per epoch, {agent}, {b['eval_episodes']} evaluation "
                      f"episodes; {machine}", ""]
        rows = [("dynamics epochs trained", lambda r: r["model"]["epochs"]),
                ("holdout MSE, elites (common split)", lambda r: r["model"]["holdout_mse_elites"]),
                ("holdout MSE, all members (common split)", lambda r: r["model"]["holdout_mse_all"]),
                ("holdout loss as the side logs it", lambda r: r["model"]["own_holdout_loss"]),
                ("mean max log-variance bound", lambda r: r["model"]["logvar_bounds"]["max_mean"]),
                ("MOPO u, dataset actions: mean", lambda r: r["model"]["data_actions"]["u_mean"]),
                ("MOPO u, dataset actions: std", lambda r: r["model"]["data_actions"]["u_std"]),
                ("penalised reward, dataset actions: mean", lambda r: r["model"]["data_actions"]["penalised_reward_mean"]),
                ("penalised reward, dataset actions: std", lambda r: r["model"]["data_actions"]["penalised_reward_std"]),
                ("MOPO u, random actions: mean", lambda r: r["model"]["random_actions"]["u_mean"]),
                ("MOPO u, random actions: std", lambda r: r["model"]["random_actions"]["u_std"]),
                ("penalised reward, random actions: mean", lambda r: r["model"]["random_actions"]["penalised_reward_mean"]),
                ("rollout reward (penalised), epoch 1", lambda r: r["curve"][0]["rollout_reward_mean"]),
                ("rollout reward (penalised), last epoch", lambda r: r["curve"][-1]["rollout_reward_mean"]),
                ("mean min Q on 10k dataset rows, last epoch", lambda r: r["curve"][-1]["q_mean"]),
                ("alpha, mean over the last epoch", lambda r: r["curve"][-1]["alpha"])]
        if algo != "mopo":  # no reward penalty: the model's reward alone
            rows = [(name.replace(" (penalised)", ""), get) for name, get in rows if "penalised reward" not in name]
        if algo == "mobile":
            rows += [("MOBILE penalty on holdout pairs, last epoch: mean", lambda r: r["curve"][-1]["penalty_mean"]),
                     ("MOBILE penalty on holdout pairs, last epoch: std", lambda r: r["curve"][-1]["penalty_std"])]
        epochs = max(len(r["curve"]) for rs in sides.values() for r in rs)
        marks = sorted({e for e in (1, *range(5, epochs + 1, 5), epochs) if e <= epochs})
        for e in marks:
            rows.append((f"normalised score, epoch {e}", lambda r, e=e: r["curve"][e - 1]["normalized_score"]))
        rows.append(("normalised score, mean of the last 5 epochs",
                     lambda r: float(np.mean([c["normalized_score"] for c in r["curve"][-5:]])) if r["curve"] else r[""]))
        if dynamics_only:
            rows = [row for row in rows if not row[0].startswith(("rollout", "mean min Q", "alpha", "normalised", "MOBILE"))]
        if free:  # no model, no rollouts
            rows = [row for row in rows if row[0].startswith(("mean min Q", "alpha", "normalised"))]
        order = [s for s in NAMES if s in sides] + sorted(set(sides) - set(NAMES))
        paired = len(order) >= 2 and order[0] != "ours" and order[1] == "ours"
        lines += ["| measure | " + " | ".join(NAMES.get(s, s) for s in order)
                  + (f" | ours / {NAMES[order[0]]} |" if paired else " |"),
                  "|---|" + "---|" * (len(order) + paired)]
        for name, get in rows:
            cells = []
            means = []
            for s in order:
                values = []
                for r in sides[s]:
                    try:
                        values.append(float(get(r)))
                    except (KeyError, IndexError):
                        pass
                cells.append(_ms(values))
                means.append(np.mean(values) if values else float("nan"))
            ratio = ((f" {means[1] / means[0]:.2f} |" if means[0] and not np.isnan(means[0] + means[1]) else " - |")
                     if paired else "")
            lines.append(f"| {name} | " + " | ".join(cells) + " |" + ratio)
        if dynamics_only:
            lines.append("")
            continue
        png = out.with_name(f"parity-{algo}-{dataset}.png")
        reward = "penalised rollout reward" if algo == "mopo" else "rollout reward"
        panels = [("normalized_score", "normalised score"), ("rollout_reward_mean", reward),
                  ("q_mean", "mean min Q, 10k dataset rows")]
        if free:
            panels = [panels[0], panels[2]]
        fig, axes = plt.subplots(1, len(panels), figsize=(4.7 * len(panels), 3.8))
        for s, colour in zip(order, ("tab:blue", "tab:orange", "tab:green", "tab:red")):
            for i, r in enumerate(sides.get(s, [])):
                x = [c["epoch"] for c in r["curve"]]
                label = NAMES.get(s, s) if i == 0 else None
                for ax, (key, _) in zip(axes, panels):
                    ax.plot(x, [c[key] for c in r["curve"]], color=colour, alpha=0.8, label=label)
        for ax, (_, title) in zip(axes, panels):
            ax.set_title(title)
            ax.set_xlabel(f"epoch ({b['updates_per_epoch']} updates)")
            ax.grid(alpha=0.3)
        axes[0].legend()
        fig.suptitle(f"{algo.upper()} on {dataset}: one line per seed")
        fig.tight_layout()
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(png, dpi=90)
        plt.close(fig)
        lines += ["", f"![{algo} on {dataset}]({png.name})", ""]
    text = "\n".join(lines) + "\n"
    print(text)
    header = args.header.read_text() if args.header else ""
    with atomic_path(out) as tmp:
        tmp.write_text(header + text)
    print(f"wrote {out}")


def main(peer: Peer, description: str, argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(peer.option, dest="checkout", help=f"a checkout of {peer.repository}")
    parser.add_argument("--algo", nargs="+", default=list(peer.algos), choices=peer.algos)
    parser.add_argument("--dataset", nargs="+", default=["hopper-medium"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--dynamics-max-epochs", type=int, default=25)
    parser.add_argument("--epochs", type=int, default=25, help="agent epochs (0: train and measure the dynamics only)")
    parser.add_argument("--updates-per-epoch", type=int, default=1000)
    parser.add_argument("--rollouts", type=int, default=50_000, help="rollouts started per epoch")
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=2, help="runs at once, one CPU thread each")
    parser.add_argument("--results", default="runs/parity", help="folder of the per-run JSON files")
    parser.add_argument("--report", help="write the comparison of everything in --results to this markdown file")
    parser.add_argument("--header", type=Path, help="text put above the report's tables")
    parser.add_argument("--sides", nargs="+", default=[peer.side, "ours"], choices=(peer.side, "ours"))
    parser.add_argument("--ours-dynamics", nargs="+", metavar="KEY=VALUE",
                        help="our dynamics settings changed from the algorithm's recipe (e.g. logvar_bounds=member)")
    parser.add_argument("--ours-algo", nargs="+", metavar="KEY=VALUE",
                        help="our agent's settings changed from its config and preset (e.g. lse_mode=per_repeat)")
    parser.add_argument("--label", help="our side's name in the results (with --ours-dynamics or --ours-algo: "
                                        "e.g. ours-before)")
    parser.add_argument("--worker", choices=(peer.side, "ours"), dest="side", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.side:
        args.algo, args.dataset, args.seed = args.algo[0], args.dataset[0], args.seeds[0]
        worker(args, peer)
        return
    if args.report:
        if not list(Path(args.results).glob("*.json")):
            parser.exit(2, f"error: no results in {args.results}; run the comparison first, or pass its --results.\n")
        report(args)
        return
    if peer.side in args.sides and (not args.checkout or not peer.is_checkout(Path(args.checkout))):
        parser.exit(2, f"error: {peer.option} must name a checkout of {peer.repository}; clone it and pass its path.\n")
    from mbrl_offline.data.sources import bundled_datasets
    for dataset in args.dataset:
        if dataset not in bundled_datasets():
            parser.exit(2, f"error: {dataset} is not a bundled dataset; choose one of {', '.join(bundled_datasets())}.\n")
    from mbrl_offline.models.dynamics import DynamicsConfig
    known = {f.name for f in dataclasses.fields(DynamicsConfig)}
    for item in args.ours_dynamics or []:
        key = item.partition("=")[0]
        if "=" not in item or key not in known:
            parser.exit(2, f"error: --ours-dynamics takes KEY=VALUE with KEY a DynamicsConfig setting "
                           f"({', '.join(sorted(known))}); got '{item}'.\n")
    from mbrl_offline.algorithms import get_algorithm
    for algo in args.algo:
        fields = {f.name for f in dataclasses.fields(get_algorithm(algo)[0].config_class)}
        for item in args.ours_algo or []:
            key = item.partition("=")[0]
            if "=" not in item or key not in fields:
                parser.exit(2, f"error: --ours-algo takes KEY=VALUE with KEY a setting of {algo} "
                               f"({', '.join(sorted(fields))}); got '{item}'.\n")
    if (args.ours_dynamics or args.ours_algo) and not args.label:
        parser.exit(2, "error: --ours-dynamics and --ours-algo change our side; name its results with --label "
                       "(e.g. --label ours-per-repeat), so that they are not taken for the defaults' runs.\n")
    args.checkout = str(Path(args.checkout).resolve()) if args.checkout else ""
    run_all(args, peer)
