"""Our MOReL's NPG planner against the official MOReL code's own NPG, GAE and baseline (aravindr93/mjrl,
branch v2), on the same paths from the same weights.

    git clone -b v2 https://github.com/aravindr93/mjrl /path/to/mjrl        # measured at 15bf3c0
    python benchmarks/vs_mjrl.py --mjrl /path/to/mjrl
    python benchmarks/vs_mjrl.py --mjrl /path/to/mjrl --speed [--threads 2]    # NPG updates per second, both sides
    python benchmarks/vs_mjrl.py --mjrl /path/to/mjrl --iteration-speed [--threads 2]    # rollouts + update

The official planner's update (``ModelBasedNPG.train_step`` after its rollouts) is plain numpy and
PyTorch: ``process_samples.compute_returns`` and ``compute_advantages`` (GAE against ``MLPBaseline``),
``NPG.train_from_paths`` (whitened advantages, the vanilla gradient, CG on the mean KL's Hessian-vector
products, the normalised step) and ``MLPBaseline.fit``. Its rollouts need MuJoCo environments (mujoco-py),
which cannot be installed here, so the paths are fed directly: ``--paths`` paths of hopper's sizes
(11 observations, 3 actions) with random lengths up to ``--horizon``, random rewards and a random half
of them terminated. mjrl's ``MLP`` policy (2 x 64 tanh, log-std -0.25, floor -1) and ``MLPBaseline``
(2 x 128) are built with their own seeds; our `MOReL` agent takes copies of their weights; both take the
same paths (ours as rows labelled with ``path`` and ``step``, shuffled) and the baseline's fit the same
permutation (mjrl draws it with ``np.random.permutation``; the same seed gives it to ours).

    python benchmarks/vs_mjrl.py --mjrl /path/to/mjrl --dynamics [--dataset hopper-medium] [--seed 123]

``--iteration-speed`` (`iteration_speed`) times whole planner iterations: mjrl's ``ModelBasedNPG.train_step``
(its rollouts in four ``WorldModel``s with the official hopper reward and termination functions, the
truncation, then the update) against our generator's rollouts and `MOReL.update`, from the same 50
hopper-medium episode starts, with models that predict no change so that every path runs 700 steps on
both sides. The rollouts need no simulator; ``mjrl.envs`` and ``mjrl.utils.gym_env`` (gym, MuJoCo) are
replaced by stand-ins, of which the planner reads an env's ``horizon`` and ``act_repeat`` only.

``--dynamics`` (`dynamics_side_by_side`) fits the official MOReL models and ours on the same arrays (the
parity harnesses' common split of the bundled dataset: `parity.common_data`) and measures both sides the
same way: ``run_morel.py``'s 4 ``WorldModel``s (``configs/d4rl_hopper_medium.txt``: 2 x 512 ReLU,
residual, Adam 1e-3, batches of 256, 25 epochs, seeds seed + i; ``fit_dynamics`` on all the training
rows, the last epoch kept) against our MOReL's published model (the ``"morel"`` recipe: 4 members of
the same size, 1000 rows held out, each member's best holdout snapshot) with the dynamics seed set to
``--seed``. Per side: each member's next-state MSE on the common holdout; the USAD threshold as
``run_morel.py`` computes it (the largest disagreement max_{i<j} |s'_i - s'_j|_2 over the training rows,
divided by the pessimism coefficient 3); and the share of the holdout's states that each side's
detector calls unknown, with their dataset actions and with uniformly random actions. The official
hopper data also scales the velocities by 0.02 (``obs_mask``); both sides here get the raw arrays.

Printed for the NPG update: the largest absolute difference, and that relative to the largest value, of the returns, the
advantages, the step size alpha, the new policy parameters, the policy's step (new - old parameters)
and the fitted baseline's parameters, and (for scale) the difference between our step in float32 and
the same step in float64, over ``--iterations`` successive
updates (each on fresh random paths). Nothing of mjrl's is copied here: its modules are imported from the
checkout, without its ``mjrl/__init__.py`` (which imports the MuJoCo environments) and with a stand-in for
``mjrl.samplers.core`` (the env sampler, unused).
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import os
import sys
import types
from pathlib import Path

import numpy as np
import torch


def import_mjrl(checkout: Path):
    """mjrl's ``npg_cg``, ``process_samples``, ``MLP`` and ``MLPBaseline`` from a checkout of branch v2."""
    package = types.ModuleType("mjrl")
    package.__path__ = [str(Path(checkout) / "mjrl")]
    sys.modules["mjrl"] = package  # its __init__ imports mjrl.envs (MuJoCo); the rest is importable
    for name in ("mjrl.samplers", "mjrl.samplers.core"):
        module = types.ModuleType(name)
        module.__path__ = []
        sys.modules[name] = module
    from mjrl.algos.npg_cg import NPG
    from mjrl.baselines.mlp_baseline import MLPBaseline
    from mjrl.policies.gaussian_mlp import MLP
    import mjrl.utils.process_samples as process_samples
    return NPG, MLPBaseline, MLP, process_samples


def random_paths(rng: np.random.Generator, count: int, horizon: int, obs_dim: int, act_dim: int) -> list[dict]:
    paths = []
    for _ in range(count):
        length = int(rng.integers(5, horizon + 1))
        paths.append({"observations": rng.normal(size=(length, obs_dim)).astype(np.float32) * 3.0,
                      "actions": rng.normal(size=(length, act_dim)).astype(np.float32),
                      "rewards": rng.normal(1.0, 1.0, size=length),
                      "terminated": bool(rng.random() < 0.5)})
    return paths


def as_rows(paths: list[dict], order: np.ndarray) -> dict[str, torch.Tensor]:
    """The paths as our generator stores them: rows labelled with their path and step, in ``order``."""
    rows = {"observations": np.concatenate([p["observations"] for p in paths]),
            "actions": np.concatenate([p["actions"] for p in paths]),
            "rewards": np.concatenate([p["rewards"] for p in paths]).astype(np.float32),
            "path": np.concatenate([np.full(len(p["rewards"]), i) for i, p in enumerate(paths)]),
            "step": np.concatenate([np.arange(len(p["rewards"])) for p in paths]),
            "terminals": np.concatenate([np.arange(len(p["rewards"])) == len(p["rewards"]) - 1 if p["terminated"]
                                         else np.zeros(len(p["rewards"]), bool) for p in paths])}
    return {k: torch.as_tensor(v[order]) for k, v in rows.items()}


def differences(ours: torch.Tensor, theirs) -> tuple[float, float]:
    theirs = torch.as_tensor(np.asarray(theirs), dtype=torch.float64).reshape(-1)
    ours = ours.detach().double().reshape(-1)
    gap = (ours - theirs).abs().max().item()
    return gap, gap / max(theirs.abs().max().item(), 1e-30)


def official_policy_and_baseline(checkout: Path, config, seed: int = 123):
    """mjrl's policy (``MLP``, 2 x 64 tanh, seeded ``seed``) and ``MLPBaseline`` (2 x 128) at MOReL's
    settings (``config``: a `MOReLConfig`), as ``run_morel.py`` builds them for hopper's sizes."""
    _, MLPBaseline, MLP, _ = import_mjrl(checkout)
    policy = MLP(observation_dim=11, action_dim=3, hidden_sizes=(64, 64), seed=seed,
                 init_log_std=config.init_log_std, min_log_std=config.min_log_std)
    return policy, MLPBaseline(None, inp_dim=11, reg_coef=1e-3, batch_size=256, epochs=1, learn_rate=1e-3)


def official_models(checkout: Path, seed: int, members: int = 4, obs_dim: int = 11, act_dim: int = 3) -> list:
    """``run_morel.py``'s ``WorldModel``s (hopper's sizes unless given): 2 x 512 ReLU, residual, Adam 1e-3,
    seeds ``seed + i``."""
    import_mjrl(checkout)
    from mjrl.algos.mbrl.nn_dynamics import WorldModel
    return [WorldModel(state_dim=obs_dim, act_dim=act_dim, hidden_size=(512, 512), seed=seed + i, fit_lr=1e-3,
                       fit_wd=0.0, activation="relu", residual=True) for i in range(members)]


def official_planner(checkout: Path, models: list, policy, baseline, config, seed=None):
    """mjrl's ``ModelBasedNPG`` over ``models`` at MOReL's settings with the official hopper reward and
    termination functions, and its paths' record, read on their way from ``train_step``'s rollouts to the
    update: each iteration appends its paths' lengths to ``record["lengths"]`` and to ``record["halted"]``
    whether each was cut by USAD (shorter than the horizon, with its last state inside the termination
    function's limits, so not cut by it)."""
    ModelBasedNPG, reward_function, termination_function, _, _ = import_model_based_npg(checkout)
    planner = ModelBasedNPG(learned_model=models, env=None, policy=policy, baseline=baseline, seed=seed,
                            normalized_step_size=config.step_size, save_logs=False,
                            reward_function=reward_function, termination_function=termination_function,
                            FIM_invert_args={"iters": config.cg_iters, "damping": config.cg_damping})
    record: dict[str, list[list]] = {"lengths": [], "halted": []}
    train_from_paths = planner.train_from_paths

    def recording(paths):
        record["lengths"].append([len(p["rewards"]) for p in paths])
        inside = inside_mjrl_limits(torch.as_tensor(np.stack([p["observations"][-1] for p in paths]))).tolist()
        record["halted"].append([n < 700 and ok for n, ok in zip(record["lengths"][-1], inside)])
        return train_from_paths(paths)

    planner.train_from_paths = recording
    return planner, record


def both_sides(checkout: Path):
    """mjrl's policy (``MLP``, 2 x 64 tanh), ``MLPBaseline`` (2 x 128) and ``NPG`` at MOReL's settings,
    ``process_samples``, our `MOReL` agent (fresh weights) and its config."""
    from mbrl_offline.algorithms.morel import MOReL, MOReLConfig

    NPG, _, _, process_samples = import_mjrl(checkout)
    obs_dim, act_dim, config = 11, 3, MOReLConfig()
    policy, baseline = official_policy_and_baseline(checkout, config)
    npg = NPG(None, policy, baseline, normalized_step_size=config.step_size,
              FIM_invert_args={"iters": config.cg_iters, "damping": config.cg_damping}, save_logs=False)
    agent = MOReL(obs_dim, act_dim, -np.ones(act_dim), np.ones(act_dim), config)
    return policy, baseline, npg, process_samples, agent, config


def compare(checkout: Path, iterations: int = 3, paths_per_update: int = 40, horizon: int = 300, seed: int = 0) -> list[dict]:
    """Per update: ``{quantity: (max abs difference, relative to the largest value)}``."""
    from mbrl_offline.algorithms.morel import path_grid

    policy, baseline, npg, process_samples, agent, config = both_sides(checkout)
    obs_dim, act_dim = 11, 3
    agent.pi.set_flat(policy.get_param_values(), config.min_log_std, config.max_log_std)  # mjrl's order: log-std first
    layer = {"fc_0": "0", "fc_1": "2", "fc_2": "4"}  # mjrl's Sequential names its layers; ours counts them
    agent.baseline.load_state_dict({layer[k.split(".")[0]] + "." + k.split(".")[1]: v
                                    for k, v in baseline.model.state_dict().items()})
    rng = np.random.default_rng(seed)
    results = []
    for _ in range(iterations):
        paths = random_paths(rng, paths_per_update, horizon, obs_dim, act_dim)
        rows = as_rows(paths, rng.permutation(sum(len(p["rewards"]) for p in paths)))
        # ours (GAE against the baseline before its fit, the NPG step, then the fit)
        before = policy.get_param_values().numpy().copy()
        grid = path_grid(rows)
        mask = grid["mask"]
        advantages, returns, features = agent.advantages(grid)
        exact = copy.deepcopy(agent.pi).double()  # the same step in float64: the size of float32's rounding
        exact_agent = copy.copy(agent)
        exact_agent.pi = exact
        exact_agent.npg_step(grid["observations"][mask].double(), grid["actions"][mask].double(), advantages[mask])
        step = agent.npg_step(grid["observations"][mask], grid["actions"][mask], advantages[mask])
        np.random.seed(seed)
        order = torch.as_tensor(np.random.permutation(int(mask.sum())))
        agent.fit_baseline(features[mask], returns[mask], order=order)
        # mjrl's (ModelBasedNPG.train_step after the rollouts)
        process_samples.compute_returns(paths, config.gamma)
        process_samples.compute_advantages(paths, baseline, config.gamma, config.gae_lambda)
        theirs_alpha = []
        original_sqrt = torch.sqrt

        def recording_sqrt(x, *args, **kwargs):  # alpha = sqrt(|delta / (g^T x + 1e-10)|) in train_from_paths
            out = original_sqrt(x, *args, **kwargs)
            theirs_alpha.append(out.item())
            return out

        torch.sqrt = recording_sqrt
        try:
            npg.train_from_paths(paths)
        finally:
            torch.sqrt = original_sqrt
        np.random.seed(seed)
        baseline.fit(paths)
        ours_baseline = torch.cat([p.detach().reshape(-1) for p in agent.baseline.parameters()])
        theirs_baseline = torch.cat([p.detach().reshape(-1) for p in baseline.model.parameters()])
        results.append({
            "returns": differences(returns[mask], np.concatenate([p["returns"] for p in paths])),
            "advantages": differences(advantages[mask], np.concatenate([p["advantages"] for p in paths])),
            "alpha": differences(step["alpha"], theirs_alpha[0]),
            "policy parameters": differences(agent.pi.flat(), policy.get_param_values().numpy()),
            "policy step": differences(agent.pi.flat() - torch.as_tensor(before), policy.get_param_values().numpy() - before),
            "baseline parameters": differences(ours_baseline, theirs_baseline.numpy()),
            "policy step, ours in float32 vs float64": differences(agent.pi.flat() - torch.as_tensor(before),
                                                                 (exact.flat() - torch.as_tensor(before).double()).numpy()),
        })
    return results


def speed(checkout: Path, paths_per_update: int = 200, horizon: int = 700, repeats: int = 3, seed: int = 0) -> dict:
    """NPG updates per second on each side, on the same paths (``paths_per_update`` of hopper's sizes, up to
    ``horizon`` steps: the official 4 models x 50 starts of up to 700 steps): ours, `MOReL.update` on the
    labelled rows (the update a generation feeds); the official, ``ModelBasedNPG.train_step``'s work after
    its rollouts (``compute_returns``, ``compute_advantages``, ``NPG.train_from_paths``,
    ``MLPBaseline.fit``). The sides alternate, ``repeats`` times each; the median rates."""
    import statistics
    import time

    policy, baseline, npg, process_samples, agent, config = both_sides(checkout)
    obs_dim, act_dim = 11, 3
    rng = np.random.default_rng(seed)
    ours, theirs, samples = [], [], []
    for _ in range(repeats):
        paths = random_paths(rng, paths_per_update, horizon, obs_dim, act_dim)
        rows = as_rows(paths, rng.permutation(sum(len(p["rewards"]) for p in paths)))
        samples.append(len(rows["rewards"]))
        start = time.perf_counter()
        agent.update(rows)
        ours.append(1.0 / (time.perf_counter() - start))
        start = time.perf_counter()
        process_samples.compute_returns(paths, config.gamma)
        process_samples.compute_advantages(paths, baseline, config.gamma, config.gae_lambda)
        npg.train_from_paths(paths)
        baseline.fit(paths)
        theirs.append(1.0 / (time.perf_counter() - start))
    return {"ours": statistics.median(ours), "official": statistics.median(theirs), "samples": samples}


@functools.lru_cache(maxsize=None)
def import_model_based_npg(checkout: Path):
    """(Once per checkout: the stand-in ``GymEnv`` must stay the class the planner's modules imported.)
    mjrl's ``ModelBasedNPG``, and the official hopper reward and termination functions
    (``projects/model_based_npg/utils/reward_functions/gym_hopper.py``), with stand-ins for ``mjrl.envs``
    and for ``mjrl.utils.gym_env`` (both import gym and MuJoCo; the planner reads only ``GymEnv``'s
    ``horizon`` and ``act_repeat``). Returns ``(ModelBasedNPG, reward_function,
    termination_function, GymEnv, obs_mask)``: ``obs_mask`` scales hopper's velocities by 0.02, as the
    official data and env do (``run_morel.py`` sets it on its env from the same file)."""
    import importlib.util

    import_mjrl(checkout)
    for name in ("mjrl.envs", "mjrl.utils.gym_env"):
        sys.modules.setdefault(name, types.ModuleType(name))

    class GymEnv:  # the stand-in: what the planner's rollouts read of an env
        def __init__(self, horizon: int):
            self.horizon, self.act_repeat = horizon, 1

    sys.modules["mjrl.utils.gym_env"].GymEnv = GymEnv
    from mjrl.algos.mbrl.model_based_npg import ModelBasedNPG
    path = Path(checkout) / "projects" / "model_based_npg" / "utils" / "reward_functions" / "gym_hopper.py"
    spec = importlib.util.spec_from_file_location("mjrl_gym_hopper", path)
    hopper = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hopper)
    return ModelBasedNPG, hopper.reward_function, hopper.termination_function, GymEnv, hopper.obs_mask


def iteration_speed(checkout: Path, repeats: int = 3, seed: int = 0) -> dict:
    """Whole planner iterations per second on each side: the rollouts of one iteration, then its NPG update
    (GAE, the natural step, the baseline's fit). The official: ``ModelBasedNPG.train_step`` as
    ``run_morel.py`` calls it (50 start states, each rolled out in every one of 4 ``WorldModel``s of 2 x 512
    for up to 700 steps, hopper's reward and termination functions, USAD's truncation with the threshold
    given). Ours: `RolloutGenerator.generate` with MOReL's published generator from the same 50 start
    states, then `MOReL.update` on its paths. Both sides' models predict no change (output layers zeroed,
    so the members agree and no path halts or terminates), and the start states are hopper-medium's
    episode starts: every path runs its 700 steps on both sides (200 paths, 140,000 transitions). The
    sides alternate, ``repeats`` times each; the median rates and each side's transitions."""
    import statistics
    import time

    from mbrl_offline import load_dataset
    from mbrl_offline.data.envs import get_env_info
    from mbrl_offline.generators.rollouts import RolloutGenerator, episode_starts

    GymEnv = import_model_based_npg(checkout)[3]
    policy, baseline, _, _, agent, config = both_sides(checkout)
    published = agent.published_generator()
    data = load_dataset("hopper-medium")
    real = {k: torch.as_tensor(getattr(data, k)) for k in ("observations", "actions", "next_observations", "rewards",
                                                             "terminals", "timeouts")}
    firsts = real["observations"][episode_starts(real["terminals"], real["timeouts"])]
    rng = torch.Generator().manual_seed(seed)
    starts = firsts[torch.randint(0, len(firsts), (published.rollout.rollouts_per_epoch,), generator=rng)]

    # ours: the published generator's rollouts, its model of the "morel" recipe predicting no change
    from mbrl_offline.models.dynamics import GaussianEnsembleDynamics
    model = GaussianEnsembleDynamics(11, 3, published.dynamics)
    model.mark_fitted()
    with torch.no_grad():
        model.head.weight.zero_()
        model.head.bias.zero_()
    generator = RolloutGenerator(model, get_env_info("hopper").termination_fn, published)
    generator.rollouts.threshold = 0.0  # the members agree: no disagreement exceeds it
    generator.rollouts.sample_starts = lambda observations, rng=None: starts  # the official side's starts

    # the official: run_morel.py's models and planner, the same settings
    models = official_models(checkout, 123, published.dynamics.ensemble_size)
    with torch.no_grad():
        for m in models:
            m.dynamics_net.fc_layers[-1].weight.zero_()
            m.dynamics_net.fc_layers[-1].bias.zero_()
    planner, official_paths = official_planner(checkout, models, policy, baseline, config)
    init_states = [row.numpy() for row in starts]
    horizon = published.rollout.horizon

    ours, theirs, transitions = [], [], {"ours": [], "official": []}
    for _ in range(repeats):
        start = time.perf_counter()
        batch, _ = generator.generate(agent.policy, real, rng)
        agent.update(batch)
        ours.append(1.0 / (time.perf_counter() - start))
        transitions["ours"].append(len(batch["rewards"]))
        start = time.perf_counter()
        planner.train_step(N=len(init_states), env=GymEnv(horizon), init_states=init_states, horizon=horizon,
                           gamma=config.gamma, gae_lambda=config.gae_lambda, truncate_lim=0.0, truncate_reward=0.0)
        theirs.append(1.0 / (time.perf_counter() - start))
        transitions["official"].append(sum(official_paths["lengths"][-1]))
    return {"ours": statistics.median(ours), "official": statistics.median(theirs), "transitions": transitions}


def official_learning_run(checkout: Path, seed: int, iterations: int, eval_every: int, eval_episodes: int,
                          fit_epochs: int = 25) -> dict:
    """The official MOReL on bundled hopper-medium, as ``run_morel.py`` runs it with
    ``configs/d4rl_hopper_medium.txt`` (on the CPU; its seed ``seed``): the data as ``prep_d4rl_dataset.py``
    makes it (episodes split after terminals and timeouts, velocities scaled by ``obs_mask``), 4
    ``WorldModel``s of 2 x 512 fitted for ``fit_epochs`` epochs (25), the USAD threshold max_D delta / 3, 5 epochs of MSE
    behaviour cloning, then ``iterations`` of ``ModelBasedNPG.train_step`` from 50 episode starts drawn with
    replacement, up to 700 steps. Every ``eval_every`` iterations its mean action is scored in our hopper env
    (observations scaled by ``obs_mask`` before the policy, actions clipped to the env's bounds), on the
    episode seeds our trainer uses at that evaluation (`parity.eval_seed`)."""
    import time

    import parity
    from mbrl_offline import load_dataset
    from mbrl_offline.data.envs import get_env_info
    from mbrl_offline.evaluation import evaluate_policy

    GymEnv, obs_mask = import_model_based_npg(checkout)[3:]
    from mjrl.algos.behavior_cloning import BC
    from mbrl_offline.algorithms.morel import MOReLConfig

    config = MOReLConfig()
    np.random.seed(seed)
    torch.manual_seed(seed)
    data = load_dataset("hopper-medium")
    ends = [0, *(np.flatnonzero(data.terminals.astype(bool) | data.timeouts.astype(bool)) + 1)]
    if ends[-1] != len(data.observations):
        ends.append(len(data.observations))
    paths = [{"observations": (data.observations[a:b] * obs_mask).astype(np.float32), "actions": data.actions[a:b],
              "rewards": data.rewards[a:b]} for a, b in zip(ends[:-1], ends[1:]) if b > a]
    init_states_buffer = [p["observations"][0] for p in paths]
    s = np.concatenate([p["observations"][:-1] for p in paths])
    a = np.concatenate([p["actions"][:-1] for p in paths])
    sp = np.concatenate([p["observations"][1:] for p in paths])

    start = time.perf_counter()
    models = official_models(checkout, seed)
    for model in models:
        model.fit_dynamics(s, a, sp, fit_mb_size=256, fit_epochs=fit_epochs, max_steps=1e8)
    delta = np.zeros(len(s))
    for i, model_1 in enumerate(models):  # run_morel.py's largest pairwise disagreement over the data
        pred_1 = model_1.predict(s, a)
        for model_2 in models[i + 1:]:
            delta = np.maximum(delta, np.linalg.norm(pred_1 - model_2.predict(s, a), axis=-1))
    truncate_lim = delta.max() / 3.0
    fit_seconds = time.perf_counter() - start

    policy, baseline = official_policy_and_baseline(checkout, config, seed)
    planner, made = official_planner(checkout, models, policy, baseline, config, seed)
    BC(paths, policy, epochs=5, batch_size=256, loss_type="MSE").train()
    env = get_env_info("hopper")
    low, high = env.action_bounds()

    def act(observations: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            mean = policy.forward(torch.as_tensor(observations * obs_mask, dtype=torch.float32)).numpy()
        return np.clip(mean, low, high)

    curve, start = [], time.perf_counter()
    for iteration in range(1, iterations + 1):
        index = np.random.choice(len(init_states_buffer), size=50, replace=True).tolist()
        planner.train_step(N=50, env=GymEnv(700), init_states=[init_states_buffer[i] for i in index], horizon=700,
                           gamma=config.gamma, gae_lambda=config.gae_lambda, truncate_lim=truncate_lim,
                           truncate_reward=0.0)
        if iteration % eval_every == 0:
            result = evaluate_policy(act, env, eval_episodes, parity.eval_seed(seed, iteration // eval_every))
            recent = [n for lengths in made["lengths"][-eval_every:] for n in lengths]
            halted = [h for flags in made["halted"][-eval_every:] for h in flags]
            curve.append({"iteration": iteration, "normalized_score": result["normalized_score"],
                          "path_length_mean": float(np.mean(recent)), "paths_mean": len(recent) / eval_every,
                          "halted_fraction": float(np.mean(halted))})
    return {"threshold": float(truncate_lim), "fit_seconds": fit_seconds, "curve": curve,
            "planner_seconds": time.perf_counter() - start}


OBS_MASK = [1.0] * 5 + [0.02] * 6  # mjrl's hopper ``obs_mask``: positions x 1, velocities x 0.02


def to_mjrl(observations: torch.Tensor) -> torch.Tensor:
    """Raw hopper observations in mjrl's coordinates (each dimension times ``obs_mask``'s factor)."""
    return observations * torch.tensor(OBS_MASK, dtype=observations.dtype, device=observations.device)


def inside_mjrl_limits(masked: torch.Tensor) -> torch.Tensor:
    """The test of mjrl's hopper ``termination_function``
    (``projects/model_based_npg/utils/reward_functions/gym_hopper.py``) on observations in mjrl's coordinates
    (scaled by ``obs_mask``): every coordinate below 10 in magnitude, the height above 0.7 and |angle| below 0.15."""
    return (masked.abs() < 10).all(-1) & (masked[..., 0] > 0.7) & (masked[..., 1].abs() < 0.15)


def mjrl_hopper_termination(next_obs: torch.Tensor) -> torch.Tensor:
    """mjrl's hopper termination on raw observations (`inside_mjrl_limits` after scaling by ``obs_mask``; ours,
    Hopper-v5's: |angle| < 0.2, and |s[1:]| < 100 unscaled)."""
    return ~inside_mjrl_limits(to_mjrl(next_obs))


def mjrl_hopper_reward(obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """mjrl's hand-written hopper ``reward_function`` (``gym_hopper.py``, the official MOReL's reward:
    ``learn_reward`` False in ``projects/morel/configs/d4rl_hopper_medium.txt``) on raw observations: of the
    state the action is taken in (not the next one), in mjrl's coordinates clipped to [-10, 10], the x velocity
    plus 1 while the height is above 0.7 and |angle| at most 0.2, less 1e-3 |a|^2 of the action clipped to
    [-1, 1]. Ours is the ensemble's learned reward."""
    masked = to_mjrl(obs).clamp(-10.0, 10.0)
    alive = ((masked[..., 0] > 0.7) & (masked[..., 1].abs() <= 0.2)).to(obs.dtype)
    return masked[..., 5] / 0.02 + alive - 1e-3 * actions.clamp(-1.0, 1.0).square().sum(-1)


def with_mjrl_reward(step):
    """The dynamics ensemble's ``step`` with its rewards replaced by `mjrl_hopper_reward` (every other output,
    the next states and the disagreement among them, the ensemble's)."""
    def replaced(obs, actions, *args, **kwargs):
        model = step(obs, actions, *args, **kwargs)
        model["rewards"] = mjrl_hopper_reward(obs, actions).to(model["rewards"].dtype)
        return model
    return replaced


def mjrl_disagreement(mean: torch.Tensor) -> torch.Tensor:
    """USAD's disagreement as the official code measures it: `max_pairwise_distance` of the members' next
    states in mjrl's coordinates (velocities scaled by ``obs_mask``'s 0.02), ``(members, B, obs_dim + 1)`` ->
    ``(B,)``."""
    from mbrl_offline.models.uncertainty import max_pairwise_distance

    scale = torch.tensor(OBS_MASK + [1.0], dtype=mean.dtype, device=mean.device)
    return max_pairwise_distance(mean * scale)


# --ours-variant: changes on our side toward the official code, to measure each difference from it alone
OURS_VARIANTS = ("mjrl-termination", "mjrl-detector", "mjrl-bootstrap", "mjrl-reward", "mjrl-observations")


def variant_patches(variants) -> list[tuple[object, str, object]]:
    """(module, attribute, replacement) for each change of ``variants`` (`OURS_VARIANTS`) made by replacing a
    function of the library (the others are settings or set on the run: `our_learning_run`)."""
    from mbrl_offline.generators import rollouts
    from mbrl_offline.models import dynamics

    patches = []
    if "mjrl-detector" in variants:  # the rollouts' disagreement and the threshold's, both in mjrl's coordinates
        patches += [(dynamics, "max_pairwise_distance", mjrl_disagreement),
                    (rollouts, "max_pairwise_distance", mjrl_disagreement)]
    return patches


def our_learning_run(seed: int, iterations: int, eval_every: int, eval_episodes: int, fit_epochs: int = 25,
                     variants: tuple[str, ...] = ()) -> dict:
    """Our MOReL as ``python examples/train.py algo=morel env=hopper seed=<seed>`` runs it (the published
    settings and generator, the dynamics seed set to ``seed`` so that seeds differ on both sides, at most
    ``fit_epochs`` epochs of its model's fit: the published 25), on
    bundled hopper-medium, evaluated every ``eval_every`` iterations (one NPG iteration is one update). Each of
    ``variants`` (`OURS_VARIANTS`) takes one thing from the official code: ``mjrl-termination``, model rollouts
    end by mjrl's hopper termination (`mjrl_hopper_termination`; evaluation stays in the env);
    ``mjrl-detector``, USAD's disagreement and threshold in mjrl's coordinates (`mjrl_disagreement`);
    ``mjrl-bootstrap``, every path bootstraps in the update's GAE (``algo.bootstrap_every_path=true``);
    ``mjrl-reward``, model rollouts take mjrl's hand-written hopper reward (`mjrl_hopper_reward`) in place of
    the ensemble's learned one; ``mjrl-observations``, the policy and the baseline's features see observations
    in mjrl's coordinates (``algo.observation_scale`` set to ``obs_mask``)."""
    import tempfile
    import time

    from mbrl_offline import load_dataset
    from mbrl_offline.compose import build_run, run_configs
    from mbrl_offline.logging import read_metrics

    folder = tempfile.mkdtemp(prefix="ours-morel-")
    algo, generator, trainer = run_configs("morel", "paper", overrides=[
        f"seed={seed}", f"generator.dynamics.seed={seed}", f"generator.dynamics.max_epochs={fit_epochs}",
        f"trainer.epochs={iterations // eval_every}", f"trainer.updates_per_epoch={eval_every}",
        "trainer.eval_every=1", f"trainer.eval_episodes={eval_episodes}", f"trainer.run_dir={folder}/run",
        "trainer.progress=false", "trainer.tensorboard=false",
        *(["algo.bootstrap_every_path=true"] if "mjrl-bootstrap" in variants else []),
        *([f"algo.observation_scale=[{','.join(map(str, OBS_MASK))}]"] if "mjrl-observations" in variants else [])])
    patches = variant_patches(variants)
    originals = [getattr(module, name) for module, name, _ in patches]
    try:
        for module, name, replacement in patches:
            setattr(module, name, replacement)
        start = time.perf_counter()
        run = build_run("morel", load_dataset("hopper-medium"), algo, generator, trainer, "cpu", cache_dir=folder)
        if "mjrl-termination" in variants:
            run.generator.rollouts.termination_fn = mjrl_hopper_termination
        if "mjrl-reward" in variants:
            dynamics = run.generator.rollouts.dynamics
            dynamics.step = with_mjrl_reward(dynamics.step)
        fit_seconds = time.perf_counter() - start
        start = time.perf_counter()
        run.train()
    finally:
        for (module, name, _), original in zip(patches, originals):
            setattr(module, name, original)
    metrics = read_metrics(Path(folder) / "run")
    curve = [{"iteration": h["epoch"] * eval_every, "normalized_score": h["normalized_score"],
              "path_length_mean": m["rollout"]["mean_length"], "paths_mean": m["train"].get("paths", float("nan")),
              "halted_fraction": m["rollout"]["halted_fraction"]}
             for h, m in zip(run.history, metrics)]
    return {"threshold": float(run.generator.rollouts.threshold), "fit_seconds": fit_seconds, "curve": curve,
            "planner_seconds": time.perf_counter() - start}


def learning_side_by_side(checkout: Path, results: Path, seeds: list[int], sides: list[str], iterations: int,
                          eval_every: int, eval_episodes: int, fit_epochs: int = 25,
                          ours_variants: tuple[str, ...] = ()) -> list[dict]:
    """Each (seed, side) run (`official_learning_run`, `our_learning_run` with ``ours_variants``) written to
    ``results`` as JSON, a run already there kept and not run again; returns every run in ``results`` of these
    settings (of every variant of ours)."""
    import json

    from mbrl_offline.utils import atomic_path
    results.mkdir(parents=True, exist_ok=True)
    budget = {"iterations": iterations, "eval_every": eval_every, "eval_episodes": eval_episodes, "fit_epochs": fit_epochs}
    for seed in seeds:
        for side in sides:
            variants = tuple(v for v in OURS_VARIANTS if v in ours_variants) if side == "ours" else ()
            variant = "+".join(variants)
            name = "-".join([side, *variants])
            path = results / f"morel-hopper-medium-seed{seed}-{name}-{iterations}x{eval_every}-fit{fit_epochs}.json"
            if path.exists():
                continue
            run = (official_learning_run(checkout, seed, iterations, eval_every, eval_episodes, fit_epochs)
                   if side == "official" else
                   our_learning_run(seed, iterations, eval_every, eval_episodes, fit_epochs, variants))
            run.update(side=side, seed=seed, budget=budget, threads=torch.get_num_threads())
            if variants:
                run["variant"] = variant
            with atomic_path(path) as tmp:
                tmp.write_text(json.dumps(run, indent=1))
    runs = [json.loads(p.read_text()) for p in sorted(results.glob("morel-hopper-medium-seed*.json"))]
    return [r for r in runs if r["budget"] == budget]


def learning_table(runs: list[dict]) -> list[str]:
    """Markdown lines: per side (and variant of ours) the USAD threshold, the seconds, and the mean ± std over
    seeds of the normalised score, the mean path length, the paths per iteration and the share of paths cut
    by USAD (where the runs recorded it) at every evaluation."""
    def ms(values) -> str:
        return f"{np.mean(values):.3g} ± {np.std(values):.2g}" if len(values) > 1 else f"{values[0]:.3g}"

    def name(side: str) -> str:
        return {"official": "official MOReL (mjrl)", "ours": "ours"}.get(side, side)

    def column(run: dict) -> str:  # a column per side, and one per variant of ours
        return run["side"] if "variant" not in run else f"ours, {run['variant']}"

    sides = sorted({column(r) for r in runs}, key=lambda side: (side != "official", side))
    by_side = {side: [r for r in runs if column(r) == side] for side in sides}
    lines = ["| measure | " + " | ".join(f"{name(side)} (seeds {', '.join(str(r['seed']) for r in by_side[side])})"
                                        for side in sides) + " |", "|---" * (len(sides) + 1) + "|"]
    for label, key in (("USAD threshold", "threshold"), ("dynamics fit and set-up, s", "fit_seconds"),
                       ("planner iterations and evaluations, s", "planner_seconds")):
        lines.append(f"| {label} | " + " | ".join(ms([r[key] for r in by_side[side]]) for side in sides) + " |")
    points = sorted({p["iteration"] for r in runs for p in r["curve"]})
    for label, key in (("normalised score", "normalized_score"), ("mean path length", "path_length_mean"),
                       ("paths per iteration", "paths_mean"), ("paths cut by USAD", "halted_fraction")):
        if not any(key in p for r in runs for p in r["curve"]):  # a measure that runs written before it lack
            continue
        for point in points:
            cells = []
            for side in sides:
                values = [p[key] for r in by_side[side] for p in r["curve"] if p["iteration"] == point and key in p]
                cells.append(ms(values) if values else "-")
            lines.append(f"| {label}, iteration {point} | " + " | ".join(cells) + " |")
    return lines


OFFICIAL_VARIANTS = ("official", "our-statistics", "our-rows")


def our_training_rows(config, dataset) -> np.ndarray:
    """The rows of ``dataset`` our members train on: the fit's first draw from its seeded generator is
    the holdout split (`GaussianEnsembleDynamics.fit`, `mbrl_offline.models.fitting.split_holdout`)."""
    from mbrl_offline.models.fitting import split_holdout

    if dataset.metadata.get("inferred_next_observations") or config.skip_timeouts:
        raise ValueError("our_training_rows follows a fit that keeps every row")
    generator = torch.Generator().manual_seed(config.seed)
    train_idx, _ = split_holdout(len(dataset), config.holdout_ratio, config.max_holdout, config.batch_size,
                                 generator, torch.device("cpu"))
    return np.sort(train_idx.numpy())


def fit_with_our_statistics(model, s: np.ndarray, a: np.ndarray, sp: np.ndarray, epochs: int) -> None:
    """mjrl's ``WorldModel.fit_dynamics`` with the statistics our MOReL model had before it took mjrl's
    (``statistics="train_unbiased"``) in place of its own: inputs standardised by their mean and unbiased
    std (mjrl: mean absolute deviation), targets (s' - s) divided by the observations' std with no shift
    (mjrl: the change's mean and mean absolute deviation). The network, the loss, the optimiser and
    mjrl's ``fit_model`` loop are mjrl's."""
    from mjrl.algos.mbrl.nn_dynamics import fit_model

    s, a, sp = (torch.as_tensor(x, dtype=torch.float32) for x in (s, a, sp))
    s_std = s.std(0).clamp_min(1e-6)
    net = model.dynamics_net
    net.set_transformations(s.mean(0), s_std, a.mean(0), a.std(0).clamp_min(1e-6), torch.zeros(s.shape[1]), s_std)
    net._apply_out_transforms = False  # learn in the transformed space, as fit_dynamics does
    fit_model(net, (s, a), (sp - s) / (s_std + 1e-8), model.dynamics_opt, model.dynamics_loss, 256, epochs,
              max_steps=1e8)
    net._apply_out_transforms = True


def dynamics_side_by_side(checkout: Path, dataset: str = "hopper-medium", seed: int = 123, members: int = 4,
                          epochs: int = 25, pessimism_coef: float = 3.0, official_variant: str = "official",
                          sides: tuple[str, ...] = ("official", "ours")) -> dict[str, dict]:
    """The official MOReL models and ours fitted on the same training rows and measured alike (module
    docstring): per side, the members' holdout MSE of the next state, the fit's seconds, the USAD
    threshold and the shares of holdout states called unknown. ``official_variant`` changes one thing
    on the official side, to attribute a gap: "our-statistics" (`fit_with_our_statistics`) or
    "our-rows" (only the rows our members train on, without the 1000 they hold out)."""
    import time

    import parity
    from mbrl_offline.algorithms import get_algorithm
    from mbrl_offline.errors import ConfigError
    from mbrl_offline.models.dynamics import GaussianEnsembleDynamics
    from mbrl_offline.models.uncertainty import max_pairwise_distance

    if official_variant not in OFFICIAL_VARIANTS:
        raise ConfigError(f"unknown official variant '{official_variant}'; choose one of {', '.join(OFFICIAL_VARIANTS)}.")
    import_mjrl(checkout)

    data, train, holdout, _ = parity.common_data(dataset)
    s, a, sp = train.observations, train.actions, train.next_observations
    config = dataclasses.replace(get_algorithm("morel")[0].published_generator().dynamics, seed=seed,
                                 max_epochs=epochs, ensemble_size=members, num_elites=members)
    rng = np.random.default_rng(seed)
    random_actions = rng.uniform(-1.0, 1.0, size=holdout.actions.shape).astype(np.float32)

    def measures(next_states, seconds: float) -> dict:
        """``next_states(obs, act)``: every member's predicted next states ``(members, B, obs_dim)``."""
        def disagreement(obs, act):
            out = []
            for start in range(0, len(obs), 65536):
                states = torch.as_tensor(next_states(obs[start:start + 65536], act[start:start + 65536]))
                out.append(max_pairwise_distance(torch.cat([states, torch.zeros_like(states[..., :1])], -1)))
            return torch.cat(out)

        threshold = disagreement(s, a).max().item() / pessimism_coef
        held = torch.as_tensor(next_states(holdout.observations, holdout.actions))
        mse = ((held - torch.as_tensor(holdout.next_observations)) ** 2).mean(dim=(1, 2))
        return {"holdout_mse": mse.tolist(), "seconds": seconds, "threshold": threshold,
                "unknown_data_actions": (disagreement(holdout.observations, holdout.actions) > threshold).float().mean().item(),
                "unknown_random_actions": (disagreement(holdout.observations, random_actions) > threshold).float().mean().item()}

    out = {}
    if "official" in sides:  # the official models, as run_morel.py builds and fits them
        start = time.perf_counter()
        models = official_models(checkout, seed, members, data.obs_dim, data.act_dim)
        rows = our_training_rows(config, train) if official_variant == "our-rows" else slice(None)
        for model in models:
            if official_variant == "our-statistics":
                fit_with_our_statistics(model, s, a, sp, epochs)
            else:
                model.fit_dynamics(s[rows], a[rows], sp[rows], fit_mb_size=256, fit_epochs=epochs, max_steps=1e8)
        out["official"] = measures(lambda obs, act: np.stack([m.predict(obs, act) for m in models]),
                                   time.perf_counter() - start)
    if "ours" not in sides:
        return out

    # ours: MOReL's published model
    torch.manual_seed(seed)
    start = time.perf_counter()
    ours_model = GaussianEnsembleDynamics(data.obs_dim, data.act_dim, config)
    ours_model.fit(train, progress=False)

    def our_next_states(obs, act):
        with torch.no_grad():
            obs = torch.as_tensor(obs)
            mean, _ = ours_model.predict(obs, torch.as_tensor(act))
        return (obs + mean[..., :-1]).numpy()

    out["ours"] = measures(our_next_states, time.perf_counter() - start)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mjrl", required=True, type=Path, help="a checkout of aravindr93/mjrl, branch v2")
    parser.add_argument("--iterations", type=int, default=3, help="successive NPG updates compared")
    parser.add_argument("--paths", type=int, default=40, help="paths per update")
    parser.add_argument("--horizon", type=int, default=300, help="the longest path")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--speed", action="store_true",
                        help="instead: NPG updates per second on both sides, on 200 paths of up to 700 steps")
    parser.add_argument("--iteration-speed", action="store_true",
                        help="instead: whole planner iterations per second on both sides (rollouts of 50 starts "
                             "in 4 models for 700 steps, then the NPG update)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (with --speed, --iteration-speed, --learn)")
    parser.add_argument("--learn", action="store_true",
                        help="instead: whole MOReL runs on hopper-medium on both sides, scored in the same env")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="with --learn: the runs' seeds")
    parser.add_argument("--learn-iterations", type=int, default=50, help="with --learn: NPG iterations per run")
    parser.add_argument("--eval-every", type=int, default=5, help="with --learn: iterations between evaluations")
    parser.add_argument("--eval-episodes", type=int, default=10, help="with --learn: episodes per evaluation")
    parser.add_argument("--fit-epochs", type=int, default=25, help="with --learn: the models' epochs (published: 25)")
    parser.add_argument("--ours-variant", nargs="+", default=[], choices=OURS_VARIANTS,
                        help="with --learn: changes on our side toward the official code (mjrl-termination: model "
                             "rollouts end by mjrl's hopper termination, |angle| < 0.15; mjrl-detector: USAD's "
                             "disagreement with the velocities scaled by 0.02; mjrl-bootstrap: no path terminal in "
                             "GAE, as mjrl's train_step leaves them; mjrl-reward: mjrl's hand-written hopper reward "
                             "in model rollouts; mjrl-observations: the policy and the baseline see velocities "
                             "scaled by 0.02)")
    parser.add_argument("--results", type=Path, default=Path("docs/parity-runs/morel"),
                        help="with --learn: the folder of the runs' JSON files (kept; a run there is not repeated)")
    parser.add_argument("--dynamics", action="store_true",
                        help="instead: the official MOReL models and ours fitted on the same data, measured alike")
    parser.add_argument("--dataset", default="hopper-medium", help="with --dynamics: the bundled dataset")
    parser.add_argument("--epochs", type=int, default=25, help="with --dynamics: the models' training epochs")
    parser.add_argument("--official-variant", default="official", choices=OFFICIAL_VARIANTS,
                        help="with --dynamics: one change on the official side (our-statistics: the inputs' and "
                             "targets' scales our model had before it took mjrl's; our-rows: without the 1000 rows "
                             "our members hold out)")
    parser.add_argument("--sides", nargs="+", default=["official", "ours"], choices=["official", "ours"],
                        help="with --dynamics: the sides fitted; with --learn: the sides run")
    args = parser.parse_args(argv)
    if not (args.mjrl / "mjrl" / "algos" / "npg_cg.py").is_file():
        parser.exit(2, "error: --mjrl must name a checkout of github.com/aravindr93/mjrl (branch v2, with "
                       "mjrl/algos/npg_cg.py); clone it and pass its path.\n")
    if args.speed:
        import throughput
        torch.set_num_threads(args.threads)
        rates = speed(args.mjrl)
        print(f"cpu: {throughput.cpu_name()}; {args.threads} threads; torch {torch.__version__}; "
              f"{rates['samples']} samples per update")
        print(f"NPG updates/s: official {rates['official']:.3f}, ours {rates['ours']:.3f}, "
              f"ours / official {rates['ours'] / rates['official']:.2f}x")
        return 0
    if args.learn:
        os.environ.setdefault("TQDM_DISABLE", "1")  # mjrl's fits and behaviour cloning draw progress bars
        from mbrl_offline.errors import ConfigError
        if args.learn_iterations < args.eval_every or args.learn_iterations % args.eval_every:
            parser.exit(2, f"error: --learn-iterations ({args.learn_iterations}) must be a multiple of --eval-every "
                           f"({args.eval_every}).\n")
        import throughput
        torch.set_num_threads(args.threads)
        try:
            runs = learning_side_by_side(args.mjrl, args.results, args.seeds, args.sides, args.learn_iterations,
                                         args.eval_every, args.eval_episodes, args.fit_epochs, tuple(args.ours_variant))
        except ConfigError as error:
            parser.exit(2, f"error: {error}\n")
        print(f"MOReL on hopper-medium, models fitted for {args.fit_epochs} epochs, {args.learn_iterations} iterations, "
              f"{args.eval_episodes} evaluation episodes every {args.eval_every}; cpu: {throughput.cpu_name()}; {args.threads} thread(s); torch {torch.__version__}")
        print("\n".join(learning_table(runs)))
        return 0
    if args.iteration_speed:
        import throughput
        torch.set_num_threads(args.threads)
        rates = iteration_speed(args.mjrl)
        print(f"cpu: {throughput.cpu_name()}; {args.threads} threads; torch {torch.__version__}; transitions per "
              f"iteration: official {rates['transitions']['official']}, ours {rates['transitions']['ours']}")
        print(f"MOReL iterations/s (rollouts and NPG update): official {rates['official']:.3f}, ours "
              f"{rates['ours']:.3f}, ours / official {rates['ours'] / rates['official']:.2f}x")
        return 0
    if args.dynamics:
        torch.set_num_threads(1)
        seed = 123 if args.seed == 0 else args.seed  # run_morel.py's seed unless another is given
        result = dynamics_side_by_side(args.mjrl, args.dataset, seed, epochs=args.epochs,
                                       official_variant=args.official_variant, sides=tuple(args.sides))
        import throughput
        print(f"{args.dataset}, seed {seed}, {args.epochs} epochs, official side: {args.official_variant}; "
              f"cpu: {throughput.cpu_name()}; 1 thread; torch {torch.__version__}")
        names = {"official": "official MOReL (mjrl)", "ours": "ours"}
        print("| measure | " + " | ".join(names[side] for side in result) + " |")
        print("|---" * (len(result) + 1) + "|")
        rows = [("next-state MSE on the common holdout, per member",
                 lambda r: ", ".join(f"{v:.4g}" for v in r["holdout_mse"])),
                ("next-state MSE, mean over members", lambda r: f"{np.mean(r['holdout_mse']):.4g}"),
                ("USAD threshold (largest disagreement on the training rows / 3)", lambda r: f"{r['threshold']:.4g}"),
                ("holdout states called unknown, dataset actions", lambda r: f"{r['unknown_data_actions']:.2%}"),
                ("holdout states called unknown, uniform random actions", lambda r: f"{r['unknown_random_actions']:.2%}"),
                ("fit, seconds", lambda r: f"{r['seconds']:.0f}")]
        for name, get in rows:
            print(f"| {name} | " + " | ".join(get(r) for r in result.values()) + " |")
        return 0
    torch.set_num_threads(1)
    results = compare(args.mjrl, args.iterations, args.paths, args.horizon, args.seed)
    print("| update | quantity | max abs difference | relative |")
    print("|---|---|---|---|")
    for i, result in enumerate(results, 1):
        for name, (gap, relative) in result.items():
            print(f"| {i} | {name} | {gap:.3g} | {relative:.3g} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
