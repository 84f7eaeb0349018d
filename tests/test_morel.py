"""MOReL: the pessimistic MDP (USAD halting in the rollout generator) and the NPG planner's parts."""
import itertools
import math

import numpy as np
import pytest
import torch

from mbrl_offline.data.termination import never
from mbrl_offline.errors import ConfigError
from mbrl_offline.generators.rollouts import (BranchedRollouts, RolloutConfig, RolloutGeneratorConfig,
                                              episode_starts, usad_threshold)
from mbrl_offline.models.dynamics import DynamicsConfig, GaussianEnsembleDynamics
from mbrl_offline.policies import FunctionPolicy


def deterministic_ensemble(obs_dim=3, act_dim=2, members=4, seed=0):
    torch.manual_seed(seed)
    model = GaussianEnsembleDynamics(obs_dim, act_dim, DynamicsConfig(
        ensemble_size=members, num_elites=members, hidden_size=16, hidden_layers=2, activation="relu",
        weight_decay=(), logvar_bounds="fixed", loss="mse", input_clip=None))
    model.mark_fitted()
    return model


def drifting_ensemble():
    """Every member adds 1 to obs[0]; member m adds 0.1 m relu(obs[0]) to obs[1]; rewards 0. The largest
    disagreement (members 0 and 3) is 0.3 relu(obs[0]) for any action."""
    model = deterministic_ensemble(obs_dim=3, act_dim=1, members=4)
    model.hidden = model.hidden[:1]
    model.norms = model.norms[:1]
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.hidden[0].weight[:, 0, 0] = 1.0  # hidden unit 0 = relu(obs[0])
        model.head.weight.data = torch.zeros(4, 16, 8)
        model.head.bias.data = torch.zeros(4, 1, 8)
        model.head.bias[:, 0, 0] = 1.0
        model.head.weight[:, 0, 1] = 0.1 * torch.arange(4.0)
        model.output_scale.fill_(1.0)
        model.output_shift.fill_(0.0)
    return model


def test_usad_threshold_is_the_largest_same_input_pairwise_distance_over_the_data_divided_by_kappa():
    model = deterministic_ensemble()
    obs, act = torch.randn(300, 3), torch.randn(300, 2)
    brute = 0.0
    with torch.no_grad():
        mean, _ = model.predict(obs, act)  # (members, rows, obs_dim + 1): next-state change, reward
        for row in range(300):
            for i, j in itertools.combinations(range(4), 2):
                brute = max(brute, float(np.linalg.norm((mean[i, row, :-1] - mean[j, row, :-1]).numpy())))
    assert usad_threshold(model, obs, act, 3.0, chunk=64) == pytest.approx(brute / 3.0, rel=1e-6)
    assert usad_threshold(model, obs, act, 0.5) == pytest.approx(brute * 2.0, rel=1e-6)


@pytest.mark.parametrize("min_steps, halt_step", [(1, 2), (4, 3)])
def test_a_rollout_halts_at_the_first_violation_with_the_halt_reward_once_and_no_bootstrap(min_steps, halt_step):
    model = drifting_ensemble()
    data_obs = torch.zeros(6, 3)
    data_obs[:, 0] = torch.arange(6.0)  # obs[0] in 0..5: the largest disagreement is 0.3 * 5 = 1.5
    config = RolloutConfig(horizon=10, rollouts_per_epoch=2, member="every", deterministic_model=True, halt="usad",
                           pessimism_coef=3.0, halt_reward=-7.0, halt_min_steps=min_steps, label_paths=True)
    rollouts = BranchedRollouts(model, never, config)
    rollouts.threshold = usad_threshold(model, data_obs, torch.zeros(6, 1), 3.0)
    assert rollouts.threshold == pytest.approx(0.5)
    # from obs[0] = 0: disagreement 0.3 t at step t, above 0.5 first at t = 2
    batch, stats = rollouts.rollout(FunctionPolicy(lambda o: torch.zeros(len(o), 1)), torch.zeros(2, 3))
    assert stats["halted_fraction"] == 1.0 and stats["terminated_fraction"] == 1.0
    assert len(batch["rewards"]) == 8 * (halt_step + 1)  # 2 starts x 4 members, steps 0..halt_step
    order = torch.argsort(batch["path"] * 100 + batch["step"])
    rewards = batch["rewards"][order].view(8, halt_step + 1)
    terminals = batch["terminals"][order].view(8, halt_step + 1)
    expected = torch.zeros(halt_step + 1)
    expected[-1] = -7.0  # the halt reward once, on the halting transition
    torch.testing.assert_close(rewards, expected.expand(8, -1))
    assert terminals[:, -1].all() and not terminals[:, :-1].any()  # terminal: nothing bootstraps after it
    assert sorted(batch["member"].unique().tolist()) == [0, 1, 2, 3]


def test_without_a_violation_nothing_halts_and_short_paths_are_dropped():
    model = drifting_ensemble()
    config = RolloutConfig(horizon=6, rollouts_per_epoch=3, member="every", deterministic_model=True, halt="usad",
                           halt_reward=-7.0, min_length=5, label_paths=True)
    rollouts = BranchedRollouts(model, lambda s: s[..., 0] > 2.5, config)  # terminal when obs[0] passes 2.5
    rollouts.threshold = 100.0
    starts = torch.zeros(3, 3)
    starts[0, 0] = 0.0  # terminal at step 2 (obs[0] = 3): 3 rows, dropped
    starts[1:, 0] = -10.0  # never terminal within 6 steps
    batch, stats = rollouts.rollout(FunctionPolicy(lambda o: torch.zeros(len(o), 1)), starts)
    assert stats["halted_fraction"] == 0.0 and (batch["rewards"] == 0).all()
    assert len(batch["rewards"]) == 2 * 4 * 6 and not batch["terminals"].any()
    assert stats["dropped_fraction"] == pytest.approx(1 / 3)


def test_episode_starts_follow_terminals_and_timeouts():
    terminals = torch.tensor([0, 0, 1, 0, 0, 0, 0], dtype=torch.bool)
    timeouts = torch.tensor([0, 0, 0, 0, 1, 0, 0], dtype=torch.bool)
    assert episode_starts(terminals, timeouts).tolist() == [0, 3, 5]


@pytest.mark.parametrize("settings, model", [(dict(true_dynamics=True), "the simulator"),
                                             (dict(dynamics=DynamicsConfig(ensemble_size=1, num_elites=1)),
                                              "a model of one member")])
def test_usad_on_a_model_without_an_ensemble_is_refused_in_one_line(settings, model):
    with pytest.raises(ConfigError) as error:
        RolloutGeneratorConfig(rollout=RolloutConfig(halt="usad"), **settings)
    message = str(error.value)
    assert "\n" not in message and "halt=usad" in message and model in message and "halt=none" in message


def test_the_latest_rule_gives_every_row_of_the_newest_generation_and_no_real_row():
    from mbrl_offline.buffer import Mixing, MixingConfig, TransitionBuffer

    def rows(n, reward):
        return dict(observations=torch.zeros(n, 3), actions=torch.zeros(n, 1), rewards=torch.full((n,), reward),
                    next_observations=torch.zeros(n, 3), terminals=torch.zeros(n, dtype=torch.bool),
                    timeouts=torch.zeros(n, dtype=torch.bool))

    real, synthetic = TransitionBuffer(10, 3, 1), TransitionBuffer(8, 3, 1)
    real.add(**rows(10, -1.0))
    mixing = Mixing(MixingConfig(rule="latest"))
    with pytest.raises(ConfigError, match="latest"):
        mixing.sample(real, synthetic, 256)
    synthetic.add(**rows(5, 1.0))
    synthetic.add(**{**rows(6, 2.0), "rewards": torch.arange(6.0)})  # wraps around the ring of 8
    batch = mixing.sample(real, synthetic, 256)
    assert batch["rewards"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0] and batch["synthetic"].all()
    restored = TransitionBuffer(8, 3, 1)
    restored.load_state_dict(synthetic.state_dict())
    assert restored.latest()["rewards"].tolist() == batch["rewards"].tolist()


# ------------------------------------------------------------------------------------------ the NPG planner
from mbrl_offline.algorithms.morel import (GaussianFisher, MOReL, MOReLConfig, conjugate_gradient,  # noqa: E402
                                           discounted_sum, gae_advantages, gaussian_kl, npg_step_size, path_grid)


def tiny_agent(hidden_layers=1, **settings):
    torch.manual_seed(0)
    config = MOReLConfig(hidden_size=4, hidden_layers=hidden_layers, **settings)
    agent = MOReL(3, 2, -np.ones(2), np.ones(2), config)
    agent.pi.double()
    with torch.no_grad():  # a policy away from its small init, so that the Fisher matrix is well spread
        for p in agent.pi.layers.parameters():
            p.normal_(0, 0.7)
        agent.pi.log_std.copy_(torch.tensor([-0.3, 0.2]))
    return agent


def fisher_matrix(agent, obs):
    """The Hessian of the mean KL(old || new) at new = old, built column by column from its definition."""
    pi = agent.pi
    theta = pi.flat()
    old_mean, old_log_std = pi(obs).detach(), pi.log_std.detach().clone()

    def kl_of(flat):
        sizes = [p.numel() for p in pi.parameters()]
        parts = torch.split(flat, sizes)
        log_std = parts[0]
        x = obs
        for i, layer in enumerate(pi.layers):
            w, b = parts[1 + 2 * i].view_as(layer.weight), parts[2 + 2 * i]
            x = x @ w.T + b
            if i < len(pi.layers) - 1:
                x = torch.tanh(x)
        return gaussian_kl(old_mean, old_log_std, x, log_std)

    return torch.autograd.functional.hessian(kl_of, theta)


@pytest.mark.parametrize("hidden_layers", [1, 2, 3])
def test_fisher_products_are_the_kl_hessian_that_autograd_builds(hidden_layers):
    """GaussianFisher's closed form (a written-out forward-mode pass, then autograd's backward) against the
    Hessian of the mean KL that autograd differentiates twice, column by column, in float64."""
    agent = tiny_agent(hidden_layers=hidden_layers)
    obs = torch.randn(50, 3, dtype=torch.float64)
    hessian = fisher_matrix(agent, obs)
    fisher = GaussianFisher(agent.pi, obs)
    for _ in range(3):
        v = torch.randn(len(hessian), dtype=torch.float64)
        torch.testing.assert_close(fisher(v), hessian @ v, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(torch.stack([fisher(e) for e in torch.eye(len(hessian), dtype=torch.float64)]), hessian,
                               rtol=1e-10, atol=1e-12)


def test_npg_direction_is_the_direct_solution_of_the_damped_fisher_system_and_the_step_is_normalised():
    agent = tiny_agent(cg_iters=200, cg_damping=1e-3, step_size=0.02, cg_residual_tol=0.0)
    obs = torch.randn(64, 3, dtype=torch.float64)
    actions = torch.randn(64, 2, dtype=torch.float64)
    advantages = torch.randn(64, dtype=torch.float64)
    theta = agent.pi.flat()
    fisher = fisher_matrix(agent, obs)
    adv = (advantages - advantages.mean()) / (advantages.std(correction=0) + 1e-6)
    surrogate = (agent.pi.log_likelihood(obs, actions) * adv).mean()
    g = torch.cat([d.reshape(-1) for d in torch.autograd.grad(surrogate, list(agent.pi.parameters()))])
    direct = torch.linalg.solve(fisher + 1e-3 * torch.eye(len(theta), dtype=torch.float64), g)
    alpha = math.sqrt(0.02 / g.dot(direct).item())
    metrics = agent.npg_step(obs, actions, advantages)
    step = agent.pi.flat() - theta
    torch.testing.assert_close(step, alpha * direct, rtol=1e-6, atol=1e-9)
    assert metrics["alpha"].item() == pytest.approx(alpha, rel=1e-6)
    # the normalised step: the quadratic KL model of the (undamped) step is delta / 2 up to the damping
    assert 0.5 * step @ (fisher + 1e-3 * torch.eye(len(theta), dtype=torch.float64)) @ step == pytest.approx(0.01, rel=1e-6)


def test_conjugate_gradient_starts_from_x0_and_stops_after_its_iterations():
    a = torch.tensor([[4.0, 1.0], [1.0, 3.0]], dtype=torch.float64)
    b = torch.tensor([1.0, 2.0], dtype=torch.float64)
    exact = torch.linalg.solve(a, b)
    torch.testing.assert_close(conjugate_gradient(lambda v: a @ v, b, b, 2), exact)  # 2 steps solve a 2x2 system
    one = conjugate_gradient(lambda v: a @ v, b, b, 1)
    r = b - a @ b  # one steepest-descent step from x0 = b
    torch.testing.assert_close(one, b + r.dot(r) / r.dot(a @ r) * r)
    assert npg_step_size(0.02, b, exact).item() == pytest.approx(math.sqrt(0.02 / b.dot(exact).item()))


def brute_force_gae(rewards, values, terminated, gamma, lam):
    """mjrl's process_samples.compute_advantages for one path, literally."""
    b1 = np.append(values, 0.0 if terminated else values[-1])
    deltas = rewards + gamma * b1[1:] - b1[:-1]
    out, run = [], 0.0
    for t in range(len(deltas) - 1, -1, -1):
        run = deltas[t] + gamma * lam * run
        out.append(run)
    return np.array(out[::-1])


def test_gae_and_returns_match_a_loop_over_each_path():
    rng = np.random.default_rng(0)
    lengths, terminated = [7, 3, 12, 1], [True, False, False, True]
    rows = {"path": [], "step": [], "rewards": [], "terminals": []}
    for p, (n, done) in enumerate(zip(lengths, terminated)):
        rows["path"] += [p] * n
        rows["step"] += list(range(n))
        rows["rewards"] += list(rng.normal(size=n))
        rows["terminals"] += [False] * (n - 1) + [done]
    batch = {"path": torch.tensor(rows["path"]), "step": torch.tensor(rows["step"]),
             "rewards": torch.tensor(rows["rewards"], dtype=torch.float64),
             "terminals": torch.tensor(rows["terminals"]), "observations": torch.zeros(sum(lengths), 2),
             "actions": torch.zeros(sum(lengths), 1)}
    shuffle = torch.randperm(sum(lengths))  # the grid does not depend on the rows' order
    paths = path_grid({k: v[shuffle] for k, v in batch.items()})
    assert paths["lengths"].tolist() == lengths and paths["terminated"].tolist() == terminated
    values = torch.tensor(rng.normal(size=paths["mask"].shape)) * paths["mask"]
    gamma, lam = 0.99, 0.9
    advantages = gae_advantages(paths["rewards"], values, paths["mask"], paths["terminated"], gamma, lam)
    returns = discounted_sum(paths["rewards"], gamma)
    for p, n in enumerate(lengths):
        r, v = paths["rewards"][p, :n].numpy(), values[p, :n].numpy()
        np.testing.assert_allclose(advantages[p, :n].numpy(), brute_force_gae(r, v, terminated[p], gamma, lam),
                                   rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(returns[p, :n].numpy(), brute_force_gae(r, np.zeros(n), True, gamma, 1.0),
                                   rtol=1e-10, atol=1e-12)
    assert (advantages[~paths["mask"]] == 0).all()


@pytest.mark.parametrize("bootstrap_every_path", [False, True])
def test_the_agents_gae_ends_paths_as_its_setting_says(bootstrap_every_path):
    """`MOReL.advantages`: a path that ended by termination or USAD is terminal by default (nothing after
    it), and with ``bootstrap_every_path`` every path ends on its last state's own baseline value, as mjrl's
    ``train_step`` leaves its paths (``terminated`` always False)."""
    torch.manual_seed(0)
    agent = MOReL(3, 2, -np.ones(2), np.ones(2), MOReLConfig(bootstrap_every_path=bootstrap_every_path))
    lengths, terminated = [6, 4], [True, False]
    batch = {"path": torch.tensor([0] * 6 + [1] * 4), "step": torch.tensor([*range(6), *range(4)]),
             "rewards": torch.randn(10), "terminals": torch.tensor([False] * 5 + [True] + [False] * 4),
             "observations": torch.randn(10, 3), "actions": torch.zeros(10, 2)}
    paths = path_grid(batch)
    advantages, _, features = agent.advantages(paths)
    values = agent.baseline(features).squeeze(-1).double()
    for p, n in enumerate(lengths):
        expected = brute_force_gae(paths["rewards"][p, :n].double().numpy(), values[p, :n].detach().numpy(),
                                   terminated[p] and not bootstrap_every_path, agent.config.gamma,
                                   agent.config.gae_lambda)
        np.testing.assert_allclose(advantages[p, :n].numpy(), expected, rtol=1e-6, atol=1e-9)


def test_the_policy_and_the_baseline_see_observations_scaled_as_the_setting_says(tmp_path):
    """``observation_scale``: the policy's mean, its layers' inputs (the Fisher products' ``J``) and the
    baseline's features are those of the unscaled agent's same weights on the scaled observations; the
    factors come from the config, so a checkpoint holds the same tensors with and without them, and
    restores the agent exactly."""
    torch.manual_seed(0)
    scale = [1.0, 1.0, 0.02]
    plain, scaled = MOReL(3, 2, -np.ones(2), np.ones(2)), MOReL(3, 2, -np.ones(2), np.ones(2),
                                                                 MOReLConfig(observation_scale=scale))
    scaled.load_state_dict(plain.state_dict())
    obs = torch.randn(7, 3) * torch.tensor([1.0, 1.0, 50.0])
    factors = torch.tensor(scale)
    assert torch.equal(scaled.pi(obs), plain.pi(obs * factors))
    assert torch.equal(scaled.pi.layer_inputs(obs)[1][0], obs * factors)
    batch = {"path": torch.tensor([0] * 4 + [1] * 3), "step": torch.tensor([*range(4), *range(3)]),
             "rewards": torch.randn(7), "terminals": torch.zeros(7, dtype=torch.bool), "observations": obs,
             "actions": torch.zeros(7, 2)}
    paths = path_grid(batch)
    _, _, features = scaled.advantages(paths)
    _, _, expected = plain.advantages({**paths, "observations": paths["observations"] * factors})
    assert torch.equal(features, expected)
    assert scaled.state_dict()["pi"].keys() == plain.state_dict()["pi"].keys()
    restored = MOReL(3, 2, -np.ones(2), np.ones(2), MOReLConfig(observation_scale=scale))
    restored.load_state_dict(scaled.state_dict())
    assert torch.equal(restored.pi(obs), scaled.pi(obs))


@pytest.mark.parametrize("scale, message", [
    ([1.0, 0.0, 1.0], "algo.observation_scale must be null or a list of numbers > 0"),
    ([1.0, float("inf"), 1.0], "algo.observation_scale must be null or a list of numbers > 0"),
    ([], "algo.observation_scale must be null or a list of numbers > 0"),
    ([1.0, 0.02], "algo.observation_scale has 2 factors, but the observations have 3 dimensions"),
])
def test_a_bad_observation_scale_is_refused_in_one_line(scale, message):
    with pytest.raises(ConfigError) as error:
        MOReL(3, 2, -np.ones(2), np.ones(2), MOReLConfig(observation_scale=scale))
    assert "\n" not in str(error.value) and str(error.value).startswith(message)


def test_build_run_refuses_an_observation_scale_of_another_length_before_any_model_is_fitted(monkeypatch, tmp_path):
    """The agent's own dataset check (`MOReL.check_dataset`, the contract's optional ``check_dataset``) runs
    in `build_run` before the generator's model is fitted, and so before anything is written."""
    from mbrl_offline import compose
    from mbrl_offline.data import load_dataset

    def no_fit(*args, **kwargs):
        raise AssertionError("a model was fitted before the settings were checked")

    monkeypatch.setattr(compose, "build_generator", no_fit)
    algo, generator, trainer = compose.run_configs("morel", "quick", overrides=[
        "algo.observation_scale=[1,1,0.02]", f"trainer.run_dir={tmp_path / 'run'}"])
    with pytest.raises(ConfigError, match="algo.observation_scale has 3 factors, but the observations have 11"):
        compose.build_run("morel", load_dataset("hopper-medium"), algo, generator, trainer, cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_morel_refuses_a_generator_that_is_not_on_policy_in_one_line():
    from mbrl_offline.pairing import check_pair
    from mbrl_offline.algorithms.morel import morel_generator

    check_pair(MOReL, morel_generator())
    stale = morel_generator()
    stale.every = 1000
    for config, word in ((stale, "every=1"), (RolloutGeneratorConfig(), "every=1")):
        with pytest.raises(ConfigError) as error:
            check_pair(MOReL, config)
        assert "\n" not in str(error.value) and word in str(error.value)
    unlabelled = morel_generator()
    unlabelled.rollout.label_paths = False
    with pytest.raises(ConfigError, match="label_paths=true"):
        check_pair(MOReL, unlabelled)


@pytest.mark.skipif(not __import__("os").environ.get("MBRL_OFFLINE_MJRL"),
                    reason="set MBRL_OFFLINE_MJRL to a checkout of aravindr93/mjrl, branch v2")
def test_npg_update_gae_and_baseline_match_the_official_mjrl_code():
    """benchmarks/vs_mjrl.py: the same paths and weights through mjrl's NPG and ours (docs/parity.md)."""
    import os
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    from vs_mjrl import compare

    for result in compare(Path(os.environ["MBRL_OFFLINE_MJRL"]), iterations=2):
        assert result["returns"][1] < 1e-7 and result["advantages"][1] < 1e-6
        assert result["alpha"][1] < 1e-4 and result["baseline parameters"][1] < 1e-5
        assert result["policy step"][1] < 5e-3  # float32 CG: a few times the float32-vs-float64 gap


@pytest.mark.skipif(not __import__("os").environ.get("MBRL_OFFLINE_MJRL"),
                    reason="set MBRL_OFFLINE_MJRL to a checkout of aravindr93/mjrl, branch v2")
def test_whole_runs_side_by_side_plan_and_score_on_both_sides(tmp_path):
    """benchmarks/vs_mjrl.py --learn at a tiny budget (models fitted for 1 epoch, 2 iterations): both sides
    fit, threshold, plan 200 paths an iteration from the same kind of start states, and are scored."""
    import os
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    from vs_mjrl import learning_side_by_side, learning_table

    runs = learning_side_by_side(Path(os.environ["MBRL_OFFLINE_MJRL"]), tmp_path, [0], ["official", "ours"],
                                 iterations=2, eval_every=1, eval_episodes=2, fit_epochs=1)
    assert sorted(r["side"] for r in runs) == ["official", "ours"]
    for run in runs:
        assert run["threshold"] > 0 and [p["iteration"] for p in run["curve"]] == [1, 2]
        for point in run["curve"]:
            assert 150 <= point["paths_mean"] <= 200 and point["path_length_mean"] >= 4
            assert 0 <= point["halted_fraction"] <= 1
            assert np.isfinite(point["normalized_score"])
    assert any("normalised score, iteration 2" in line for line in learning_table(runs))
    assert any("paths cut by USAD, iteration 2" in line for line in learning_table(runs))
    assert learning_side_by_side(Path(os.environ["MBRL_OFFLINE_MJRL"]), tmp_path, [0], ["official", "ours"],
                                 iterations=2, eval_every=1, eval_episodes=2, fit_epochs=1) == runs  # kept, not rerun


@pytest.mark.skipif(not __import__("os").environ.get("MBRL_OFFLINE_MJRL"),
                    reason="set MBRL_OFFLINE_MJRL to a checkout of aravindr93/mjrl, branch v2")
def test_the_whole_runs_variants_take_mjrls_own_rules(monkeypatch):
    """vs_mjrl.py --learn --ours-variant: its termination ends a path exactly where mjrl's hopper
    ``termination_function`` does (on observations near each of its limits); its disagreement is mjrl's
    largest pairwise distance of next states in mjrl's coordinates; the bootstrap variant sets
    ``algo.bootstrap_every_path``; its reward is mjrl's hopper ``reward_function`` on the state the action is
    taken in, in place of the ensemble's; its observations variant sets ``algo.observation_scale`` to mjrl's
    ``obs_mask``; and the library's functions are back in place after the patches."""
    import os
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    from vs_mjrl import (import_model_based_npg, mjrl_disagreement, mjrl_hopper_termination, our_learning_run,
                         with_mjrl_reward)

    from mbrl_offline import compose
    from mbrl_offline.models import dynamics
    from mbrl_offline.models.uncertainty import max_pairwise_distance

    _, reward_function, termination_function, _, obs_mask = import_model_based_npg(Path(os.environ["MBRL_OFFLINE_MJRL"]))
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(4000, 11)) * np.array([0.3, 0.12, 1, 1, 1, 200, 200, 200, 200, 200, 200])
    obs[:, 0] += 1.0  # heights around 0.7-1.3
    paths = termination_function([{"observations": o[None] * obs_mask, "actions": np.zeros((1, 3)),
                                   "rewards": np.zeros(1)} for o in obs])
    theirs = np.array([p["terminated"] for p in paths])
    ours = mjrl_hopper_termination(torch.as_tensor(obs)).numpy()
    assert 0.2 < theirs.mean() < 0.8 and (ours == theirs).all()

    actions = rng.normal(size=(4000, 3)) * 1.5  # some outside [-1, 1], which mjrl clips
    theirs = reward_function({"observations": (obs * obs_mask)[None], "actions": actions[None]})["rewards"]
    ensemble_next = torch.as_tensor(rng.normal(size=(4000, 11)))

    def ensemble_step(o, a, generator=None):
        return {"next_observations": ensemble_next, "rewards": torch.full((len(o),), 7.0, dtype=torch.float64)}
    model = with_mjrl_reward(ensemble_step)(torch.as_tensor(obs), torch.as_tensor(actions))
    assert np.allclose(model["rewards"].numpy(), theirs) and model["next_observations"] is ensemble_next
    assert 0.05 < (np.abs(obs[:, 1]) <= 0.2).mean() < 0.95  # both sides of the alive bonus's angle limit

    means = torch.randn(4, 50, 12, dtype=torch.float64)
    masked = means[..., :-1] * torch.as_tensor(obs_mask)
    expected = torch.stack([(masked[i] - masked[j]).norm(dim=-1) for i in range(4) for j in range(i + 1, 4)]).amax(0)
    assert torch.allclose(mjrl_disagreement(means), expected)

    def failing_build_run(name, data, algo, *args, **kwargs):
        assert dynamics.max_pairwise_distance is mjrl_disagreement and algo.bootstrap_every_path
        assert np.allclose(algo.observation_scale, obs_mask)  # the policy and the baseline in mjrl's coordinates
        raise RuntimeError("stopped while the variants are in place")

    monkeypatch.setattr(compose, "build_run", failing_build_run)
    with pytest.raises(RuntimeError, match="stopped while"):  # a run that fails leaves the library's functions
        our_learning_run(0, iterations=1, eval_every=1, eval_episodes=1, fit_epochs=1,
                         variants=("mjrl-detector", "mjrl-bootstrap", "mjrl-observations"))
    assert dynamics.max_pairwise_distance is max_pairwise_distance


@pytest.mark.skipif(not __import__("os").environ.get("MBRL_OFFLINE_MJRL"),
                    reason="set MBRL_OFFLINE_MJRL to a checkout of aravindr93/mjrl, branch v2")
def test_the_dynamics_side_by_side_measures_both_sides_alike():
    """benchmarks/vs_mjrl.py --dynamics at 1 epoch: run_morel.py's 4 WorldModels and our MOReL model on
    the same rows; both predict hopper-medium's next states far better than the state itself does, their
    thresholds are positive, and no more than a few holdout states with their own actions are unknown."""
    import os
    import sys
    from pathlib import Path

    import numpy as np

    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    import parity
    from vs_mjrl import dynamics_side_by_side

    result = dynamics_side_by_side(Path(os.environ["MBRL_OFFLINE_MJRL"]), epochs=1)
    _, _, holdout, _ = parity.common_data("hopper-medium")
    unchanged = float(((holdout.next_observations - holdout.observations) ** 2).mean())
    for side in ("official", "ours"):
        r = result[side]
        assert len(r["holdout_mse"]) == 4 and max(r["holdout_mse"]) < 0.2 * unchanged
        assert r["threshold"] > 0 and r["unknown_data_actions"] < 0.1
        assert np.isfinite(r["unknown_random_actions"])


def test_the_rows_the_mjrl_harness_gives_the_official_side_are_the_rows_our_fit_trains_on(monkeypatch):
    """vs_mjrl.py's "our-rows" variant: `our_training_rows` reproduces the holdout split of our fit."""
    import sys
    from pathlib import Path

    import mbrl_offline.models.dynamics as dynamics_module
    from mbrl_offline.data import OfflineDataset

    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    from vs_mjrl import our_training_rows

    rng = np.random.default_rng(0)
    n = 1500
    obs = rng.normal(size=(n, 3)).astype(np.float32)
    data = OfflineDataset(observations=obs, actions=rng.uniform(-1, 1, (n, 1)).astype(np.float32),
                          rewards=rng.normal(size=n).astype(np.float32),
                          next_observations=obs + 0.1 * rng.normal(size=(n, 3)).astype(np.float32),
                          terminals=np.zeros(n, bool), timeouts=np.zeros(n, bool), env_name="pendulum")
    config = DynamicsConfig(ensemble_size=2, num_elites=2, hidden_size=8, hidden_layers=1, weight_decay=(), max_epochs=1,
                            holdout_ratio=0.2, max_holdout=100, seed=7)
    seen = []
    real = dynamics_module.split_holdout
    monkeypatch.setattr(dynamics_module, "split_holdout", lambda *a, **k: seen.append(real(*a, **k)) or seen[-1])
    GaussianEnsembleDynamics(3, 1, config).fit(data, progress=False)
    rows = our_training_rows(config, data)
    assert len(rows) == n - 100 and np.array_equal(rows, np.sort(seen[0][0].numpy()))


@pytest.mark.skipif(not __import__("os").environ.get("MBRL_OFFLINE_MJRL"),
                    reason="set MBRL_OFFLINE_MJRL to a checkout of aravindr93/mjrl, branch v2")
@pytest.mark.parametrize("variant", ["our-statistics", "our-rows"])
def test_the_official_side_variants_still_predict_next_states(variant):
    """vs_mjrl.py --dynamics --official-variant at 1 epoch, the official side alone: mjrl's WorldModels
    with our statistics, or on our members' rows, predict hopper-medium's next states far better than
    the state itself does."""
    import os
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    import parity
    from vs_mjrl import dynamics_side_by_side

    result = dynamics_side_by_side(Path(os.environ["MBRL_OFFLINE_MJRL"]), epochs=1, official_variant=variant,
                                   sides=("official",))
    _, _, holdout, _ = parity.common_data("hopper-medium")
    unchanged = float(((holdout.next_observations - holdout.observations) ** 2).mean())
    assert list(result) == ["official"] and max(result["official"]["holdout_mse"]) < 0.2 * unchanged


@pytest.mark.parametrize("extra", [[], ["--speed"], ["--dynamics"]])
def test_the_mjrl_side_by_side_refuses_a_folder_that_is_not_its_checkout(extra, tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "vs_mjrl.py"), "--mjrl", str(tmp_path), *extra],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 2 and done.stderr.startswith("error: --mjrl must name a checkout of"), done.stderr
    assert done.stderr.count("\n") == 1
