"""CQL (`mbrl_offline.algorithms.cql`): the conservative log-sum-exp estimator in both modes against the
formulas written out and, where a checkout of OfflineRL-Kit is given (``MBRL_OFFLINE_OFFLINERLKIT``, the
path ``benchmarks/vs_offlinerlkit.py --offlinerlkit`` takes), against Kit's own ``CQLPolicy.learn``;
the losses of one update against the formulas, the two update orders, the Lagrange variant and the
behaviour-cloning warm-up."""
import copy
import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from mbrl_offline.algorithms.cql import CQL, CQLConfig, CQLRegulariser, conservative_logsumexp
from mbrl_offline.config import config_to_dataclass
from mbrl_offline.errors import ConfigError

KIT = os.environ.get("MBRL_OFFLINE_OFFLINERLKIT")  # a checkout of yihaosun1124/OfflineRL-Kit, or unset
needs_kit = pytest.mark.skipif(not (KIT and (Path(KIT) / "offlinerlkit" / "policy" / "model_free" / "cql.py").is_file()),
                               reason="set MBRL_OFFLINE_OFFLINERLKIT to a checkout of OfflineRL-Kit")


def scores(n=2, b=5, r=4, seed=0):
    """Fixed importance-weighted scores (N, 3, B, R)."""
    return torch.randn(n, 3, b, r, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 3


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_the_joint_estimator_is_the_logsumexp_over_all_3R_scores_of_a_state(temperature):
    v = scores()
    n, _, b, r = v.shape
    expected = torch.empty(n, b, dtype=v.dtype)
    for i in range(n):
        for s in range(b):
            columns = [v[i, j, s, k] for j in range(3) for k in range(r)]  # the 3R columns of state s
            expected[i, s] = temperature * math.log(sum(math.exp(c / temperature) for c in columns))
    torch.testing.assert_close(conservative_logsumexp(v, temperature, "joint"), expected)


def kit_formula(v: torch.Tensor, temperature: float) -> torch.Tensor:
    """OfflineRL-Kit's number, as its ``learn`` computes it (``cql.py`` L142-168 at e3ce697), for critic
    i's scores: six ``(B R, 1)`` tensors whose reshape is dropped, concatenated on dim 1 into (B R, 3)."""
    n, _, b, r = v.shape
    out = []
    for i in range(n):
        obs_pi, next_obs_pi, random = (v[i, j].reshape(b * r, 1) for j in range(3))  # row b R + k
        for value in (obs_pi, next_obs_pi, random):
            value.reshape(b, r, 1)  # Kit's loop: the result is dropped
        cat_q = torch.cat([obs_pi, next_obs_pi, random], 1)
        out.append(torch.logsumexp(cat_q / temperature, dim=1).mean() * temperature)
    return torch.stack(out)


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_the_per_repeat_estimator_is_offlinerlkits_number_and_at_least_T_log_R_below_the_joint_one(temperature):
    v = scores()
    r = v.shape[-1]
    per_repeat = conservative_logsumexp(v, temperature, "per_repeat").mean(dim=1)  # Kit's mean over B R rows
    torch.testing.assert_close(per_repeat, kit_formula(v, temperature))
    joint = conservative_logsumexp(v, temperature, "joint").mean(dim=1)
    assert (per_repeat <= joint - temperature * math.log(r) + 1e-12).all()  # Jensen: mean log <= log mean
    assert (per_repeat < joint - temperature * math.log(r) - 0.1).all()  # and not equal for these scores


def test_the_regulariser_scores_every_sample_at_s_with_its_importance_weight():
    """`CQLRegulariser.ood_values` against the scores built one kind at a time, in Kit's draw order."""
    torch.manual_seed(0)
    agent = CQL(3, 2, [-2.0, -1.0], [2.0, 1.0], CQLConfig(hidden_size=8, hidden_layers=2, num_repeats=4))
    obs, next_obs = torch.randn(5, 3), torch.randn(5, 3)
    reg = agent.regulariser
    torch.manual_seed(1)
    got = reg.ood_values(agent.critic, agent.actor.repeated_draws, obs, next_obs)
    torch.manual_seed(1)
    with torch.no_grad():
        uniform = torch.rand(20, 2) * torch.tensor([4.0, 2.0]) + torch.tensor([-2.0, -1.0])
        obs_rep, next_rep = obs.repeat_interleave(4, 0), next_obs.repeat_interleave(4, 0)
        pi, log_pi = agent.actor(obs_rep)
        pi_next, log_pi_next = agent.actor(next_rep)
        log_uniform = -math.log(4.0) - math.log(2.0)
        v = torch.stack([agent.critic(obs_rep, pi) - log_pi, agent.critic(obs_rep, pi_next) - log_pi_next,
                         agent.critic(obs_rep, uniform) - log_uniform], dim=1)  # (2, 3, B R)
        expected = torch.logsumexp(v.view(2, 3, 5, 4), dim=(1, 3))
    torch.testing.assert_close(got, expected)
    assert reg.log_uniform == pytest.approx(log_uniform)


def one_update_by_the_formulas(agent: CQL, batch, order: str):
    """The update written out for two critics without the helpers (Kit's order or CORL's), from the same
    RNG state: the expected actor, critics and log alpha after it."""
    a = copy.deepcopy(agent)
    cfg = a.config
    obs, act, r, s2, d = (batch[k] for k in ("observations", "actions", "rewards", "next_observations", "terminals"))
    alpha = a.log_alpha.detach().exp()
    new_a, log_pi = a.actor(obs)
    q_new = torch.min(a.critic(obs, new_a)[0], a.critic(obs, new_a)[1])
    actor_loss = (alpha * log_pi - q_new).mean()
    alpha_loss = -(a.log_alpha * (log_pi.detach() + a.target_entropy)).mean()

    def step_actor():
        a.actor_optim.zero_grad()
        actor_loss.backward()
        a.actor_optim.step()
        a.alpha_optim.zero_grad()
        alpha_loss.backward()
        a.alpha_optim.step()

    if order == "kit":
        step_actor()
    with torch.no_grad():
        a2, _ = a.actor(s2)
        y = r + cfg.gamma * (1 - d) * a.target_critic(s2, a2).min(0).values
    q = a.critic(obs, act)
    rows, reps = len(obs), cfg.num_repeats
    with torch.no_grad():
        u = torch.rand(rows * reps, act.shape[1]) * 2 - 1
        o_rep, n_rep = obs.repeat_interleave(reps, 0), s2.repeat_interleave(reps, 0)
        p1, l1 = a.actor(o_rep)
        p2, l2 = a.actor(n_rep)
    cat = torch.cat([(a.critic(o_rep, p1) - l1).view(2, rows, reps), (a.critic(o_rep, p2) - l2).view(2, rows, reps),
                     (a.critic(o_rep, u) - math.log(0.5 ** act.shape[1])).view(2, rows, reps)], dim=2)  # (2, B, 3R)
    lse = torch.logsumexp(cat, dim=2)
    loss = sum(((q[i] - y) ** 2).mean() + cfg.cql_weight * (lse[i].mean() - q[i].mean()) for i in range(2))
    if order == "corl":
        step_actor()
    a.critic_optim.zero_grad()
    loss.backward()
    a.critic_optim.step()
    with torch.no_grad():
        for target, source in zip(a.target_critic.parameters(), a.critic.parameters()):
            target.copy_((1 - cfg.tau) * target + cfg.tau * source)
    return a


def a_batch(rows=16, obs_dim=3, act_dim=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"observations": torch.randn(rows, obs_dim, generator=g), "actions": torch.rand(rows, act_dim, generator=g) * 2 - 1,
            "rewards": torch.randn(rows, generator=g), "next_observations": torch.randn(rows, obs_dim, generator=g),
            "terminals": (torch.rand(rows, generator=g) < 0.2).float()}


@pytest.fixture
def float64():
    """Float64 throughout: Adam's first step, lr g / (|g| + 1e-8), magnifies float32's rounding where
    a gradient is near 0, and the formulas batch the critic's forward passes differently."""
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(torch.float32)


@pytest.mark.parametrize("order, init", [("kit", "torch"), ("corl", "torch"), ("corl", "corl-cql")])
def test_one_update_is_the_formulas(order, init, float64):
    """Kit's order, CORL's, and CORL's with its networks (learnt log-std multiplier and offset)."""
    torch.manual_seed(0)
    agent = CQL(3, 2, [-1.0, -1.0], [1.0, 1.0], CQLConfig(hidden_size=16, hidden_layers=2, num_repeats=3,
                                                          update_order=order, init=init))
    batch = a_batch()
    torch.manual_seed(5)
    expected = one_update_by_the_formulas(agent, batch, order)
    torch.manual_seed(5)
    metrics = agent.update(batch)
    assert all(torch.isfinite(v) for v in metrics.values())
    for name in ("actor", "critic", "target_critic"):
        for x, y in zip(getattr(agent, name).parameters(), getattr(expected, name).parameters()):
            torch.testing.assert_close(x, y, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(agent.log_alpha, expected.log_alpha)


def test_the_orders_differ_and_the_modes_differ():
    batch = a_batch()
    results = {}
    for name, changes in (("kit", {}), ("corl", {"update_order": "corl"}), ("per_repeat", {"lse_mode": "per_repeat"})):
        torch.manual_seed(0)
        agent = CQL(3, 2, [-1.0, -1.0], [1.0, 1.0], CQLConfig(hidden_size=16, hidden_layers=2, num_repeats=3, **changes))
        torch.manual_seed(5)
        for _ in range(3):
            agent.update(batch)
        results[name] = torch.cat([p.detach().flatten() for p in agent.critic.parameters()])
    assert not torch.allclose(results["kit"], results["corl"], rtol=0, atol=1e-6)
    assert not torch.allclose(results["kit"], results["per_repeat"], rtol=0, atol=1e-6)


@pytest.mark.parametrize("max_q_backup, deterministic_backup", [(False, True), (False, False), (True, True)])
def test_the_target_is_the_formula(max_q_backup, deterministic_backup):
    """y = r + gamma (1 - d) min_i Qbar_i(s', a') (- alpha log pi without the deterministic backup), or with
    the max backup min_i max_k Qbar_i(s', a'_k) over R samples per state (Kit's and the original code's)."""
    torch.manual_seed(0)
    config = CQLConfig(hidden_size=16, hidden_layers=2, num_repeats=4, max_q_backup=max_q_backup,
                       deterministic_backup=deterministic_backup, init_alpha=0.5)
    agent = CQL(3, 2, [-1.0, -1.0], [1.0, 1.0], config)
    b = a_batch()
    torch.manual_seed(3)
    got = agent.critic_target(b["next_observations"], b["rewards"], b["terminals"])
    torch.manual_seed(3)
    with torch.no_grad():
        if max_q_backup:
            rows = []
            repeated = b["next_observations"].repeat_interleave(4, 0)
            actions, _ = agent.actor(repeated)
            q = agent.target_critic(repeated, actions)  # (2, B R)
            for s in range(len(b["rewards"])):
                rows.append(min(q[i, 4 * s:4 * s + 4].max() for i in range(2)))
            next_q = torch.stack(rows)
        else:
            actions, log_pi = agent.actor(b["next_observations"])
            next_q = agent.target_critic(b["next_observations"], actions).min(0).values
            if not deterministic_backup:
                next_q = next_q - 0.5 * log_pi
    torch.testing.assert_close(got, b["rewards"] + 0.99 * (1 - b["terminals"]) * next_q)


@pytest.mark.parametrize("form", ["official", "corl"])
def test_the_lagrange_multiplier_rises_while_the_gap_exceeds_the_threshold_and_falls_below_it(form):
    for threshold, direction in ((-100.0, 1), (100.0, -1)):
        torch.manual_seed(0)
        agent = CQL(3, 2, [-1.0, -1.0], [1.0, 1.0], CQLConfig(hidden_size=16, hidden_layers=2, num_repeats=3,
                                                              with_lagrange=True, lagrange_threshold=threshold,
                                                              lagrange_form=form))
        start = agent.log_alpha_prime.item()
        assert start == (1.0 if form == "corl" else 0.0)
        metrics = agent.update(a_batch())
        assert metrics["alpha_prime"] == pytest.approx(math.exp(start))  # the loss used alpha' before its step
        assert (agent.log_alpha_prime.item() - start) * direction > 0


def test_the_behaviour_cloning_warm_up_fits_the_data():
    batch = a_batch()
    likelihood = {}
    for warmup in (0, 30):
        torch.manual_seed(0)
        agent = CQL(3, 2, [-1.0, -1.0], [1.0, 1.0], CQLConfig(hidden_size=16, hidden_layers=2, num_repeats=3,
                                                              bc_warmup_steps=warmup, actor_lr=3e-3))
        before = agent.actor.log_prob_of(batch["observations"], batch["actions"]).mean().item()
        for _ in range(30):
            agent.update(batch)
        likelihood[warmup] = agent.actor.log_prob_of(batch["observations"], batch["actions"]).mean().item()
    assert likelihood[30] > before + 0.1 and likelihood[30] > likelihood[0] + 0.1  # the data's actions, not Q's


@pytest.mark.parametrize("settings, message", [
    ({"cql_weight": -1.0}, "algo.cql_weight must be at least 0 (0 turns the conservative term off: SAC), got -1.0."),
    ({"temperature": 0.0}, "algo.temperature must be above 0, got 0.0."),
    ({"num_repeats": 0}, "algo.num_repeats must be at least 1, got 0."),
    ({"lse_mode": "kit"}, "algo.lse_mode = 'kit' is unknown; choose one of joint, per_repeat."),
    ({"update_order": "x"}, "algo.update_order = 'x' is unknown; choose one of kit, corl."),
    ({"init": "corl"}, "algo.init = 'corl' is unknown; choose one of torch, edac, edac-official, offlinerlkit, corl-cql."),
])
def test_bad_settings_are_refused_in_one_line(settings, message):
    with pytest.raises(ConfigError) as error:
        config_to_dataclass(CQLConfig, settings, "algo")
    assert str(error.value) == message


# ------------------------------------------------------------------ OfflineRL-Kit's own code
def benchmarks():
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import vs_offlinerlkit

    return vs_offlinerlkit


@needs_kit
def test_offlinerlkits_conservative_term_is_the_per_repeat_estimator():
    """Kit's ``learn`` on fixed weights and a batch of hopper-medium: its critic loss (both critics, TD +
    conservative) equals ours with ``lse_mode=per_repeat`` from the same draws; ours with the joint
    estimator is at least 2 w T log R higher (the TD parts are the same)."""
    got = benchmarks().kit_conservative_terms(KIT)
    torch.testing.assert_close(got["kit"], got["per_repeat"], rtol=1e-5, atol=1e-4)
    assert got["joint"] >= got["kit"] + 2 * 5.0 * math.log(10) - 1e-3


@needs_kit
@pytest.mark.parametrize("with_lagrange", [False, True])
def test_updates_match_offlinerlkits_cqlpolicy_in_the_kit_setting(with_lagrange):
    """Three updates of ours (``lse_mode=per_repeat``, Kit's defaults) and of Kit's ``CQLPolicy.learn``
    from the same weights, batches and draws: the same losses and the same steps, up to float32 rounding
    and Kit's 1e-6 inside its tanh log-determinant."""
    for row in benchmarks().cql_side_by_side(KIT, "per_repeat", with_lagrange, updates=3):
        assert row["our_critic_loss"] == pytest.approx(row["kit_critic_loss"], rel=1e-5)
        assert row["our_actor_loss"] == pytest.approx(row["kit_actor_loss"], rel=1e-4, abs=1e-4)
        assert row["critic_step_rel_diff"] < 1e-3 and row["actor_step_rel_diff"] < 1e-2
        assert max(row[f"{name}_max_diff"] for name in ("actor", "critic", "target_critic", "log_alpha")) < 1e-4
        if with_lagrange:
            assert row["log_alpha_prime_max_diff"] < 1e-7


# ------------------------------------------------------------------ CORL's own code
CORL = os.environ.get("MBRL_OFFLINE_CORL")  # a checkout of tinkoff-ai/CORL, or unset


@pytest.mark.skipif(not (CORL and (Path(CORL) / "algorithms" / "offline" / "cql.py").is_file()),
                    reason="set MBRL_OFFLINE_CORL to a checkout of CORL")
def test_corls_conservative_term_is_the_joint_estimator():
    """CORL's ``_q_loss`` on its own networks and a hopper-medium batch: its mean log-sum-exp per critic
    is ours with ``lse_mode=joint`` from the same draws (``benchmarks/vs_corl.py``), not the per-repeat one."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from vs_corl import corl_estimator

    got = corl_estimator(CORL)
    torch.testing.assert_close(got["joint"], got["corl"], rtol=1e-5, atol=1e-5)
    assert (got["per_repeat"] < got["corl"] - math.log(10) + 1e-4).all()


@pytest.mark.skipif(not (CORL and (Path(CORL) / "algorithms" / "offline" / "cql.py").is_file()),
                    reason="set MBRL_OFFLINE_CORL to a checkout of CORL")
@pytest.mark.parametrize("lagrange", [False, True])
def test_corls_whole_update_equals_ours_with_its_settings(lagrange):
    """CORL's ``ContinuousCQL.train`` and ours with ``CQLConfig.corl()`` (its networks, order, rates and
    Lagrange form), from CORL's weights, the same batches and draws: three updates with the same losses
    and weights equal to float rounding (``benchmarks/vs_corl.py --updates``)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from vs_corl import corl_update_differences

    for row in corl_update_differences(CORL, updates=3, lagrange=lagrange):
        assert math.isclose(row["our_critic_loss"], row["corl_critic_loss"], rel_tol=1e-5)
        assert math.isclose(row["our_actor_loss"], row["corl_actor_loss"], rel_tol=1e-5, abs_tol=1e-6)
        assert row["actor_max_diff"] < 1e-6 and row["critic_max_diff"] < 1e-5 and row["target_critic_max_diff"] < 1e-6
        assert row["actor_step_rel_diff"] < 1e-4 and row["critic_step_rel_diff"] < 1e-3
        assert row["log_alpha_max_diff"] < 1e-9 and row["log_alpha_prime_max_diff"] < 1e-9


@pytest.mark.parametrize("script, args, message", [
    ("vs_offlinerlkit.py", ["--cql-update", "--offlinerlkit", "/nonexistent"], "error: --offlinerlkit must name a checkout of"),
    ("vs_corl.py", ["--corl", "/nonexistent"], "error: --corl must name a checkout of"),
    ("vs_offlinerlkit_speed.py", ["--offlinerlkit", "/nonexistent"], "error: --offlinerlkit must name a checkout of"),
])
def test_the_side_by_side_scripts_refuse_a_folder_that_is_not_the_peers_checkout(script, args, message):
    import subprocess

    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, str(root / "benchmarks" / script), *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(root)}, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith(message) and done.stderr.count("\n") == 1, done.stderr
