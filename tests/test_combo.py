"""COMBO (`mbrl_offline.algorithms.combo`): the push-up term over the real rows only, the log-sum-exp's
states by ``rho_s``, one update against the formulas and against CQL's where every row is real, the
actor's cosine schedule, the published generator and presets, refusals, pairings with other
generators and agents, and, where a checkout of OfflineRL-Kit is given (``MBRL_OFFLINE_OFFLINERLKIT``,
the path ``benchmarks/vs_offlinerlkit.py --offlinerlkit`` takes), Kit's own ``COMBOPolicy.learn``."""
import copy
import dataclasses
import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from mbrl_offline.algorithms import ALGORITHMS
from mbrl_offline.algorithms.combo import COMBO, COMBOConfig
from mbrl_offline.algorithms.cql import CQL, CQLConfig
from mbrl_offline.config import config_to_dataclass
from mbrl_offline.errors import ConfigError

KIT = os.environ.get("MBRL_OFFLINE_OFFLINERLKIT")  # a checkout of yihaosun1124/OfflineRL-Kit, or unset
needs_kit = pytest.mark.skipif(
    not (KIT and (Path(KIT) / "offlinerlkit" / "policy" / "model_based" / "combo.py").is_file()),
    reason="set MBRL_OFFLINE_OFFLINERLKIT to a checkout of OfflineRL-Kit")

TINY = dict(hidden_size=16, hidden_layers=2, num_repeats=3)


def agent(**settings) -> COMBO:
    torch.manual_seed(0)
    return COMBO(3, 2, [-1.0, -1.0], [1.0, 1.0], COMBOConfig(**{**TINY, **settings}))


def mixed_batch(real=6, model=10, seed=0, weights=False):
    """``real`` real rows then ``model`` model rows, marked as `mbrl_offline.buffer.Mixing` marks them."""
    g = torch.Generator().manual_seed(seed)
    rows = real + model
    batch = {"observations": torch.randn(rows, 3, generator=g), "actions": torch.rand(rows, 2, generator=g) * 2 - 1,
             "rewards": torch.randn(rows, generator=g), "next_observations": torch.randn(rows, 3, generator=g),
             "terminals": (torch.rand(rows, generator=g) < 0.2).float(),
             "synthetic": torch.arange(rows) >= real}
    if weights:  # the weights rule: kappa = 0.3 on the real rows' mean, 0.7 on the model rows'
        batch["weights"] = torch.where(batch["synthetic"], 0.7 / model, 0.3 / real)
    return batch


def gap(a: COMBO, batch, seed=3):
    """``(gap, ood)`` of `COMBO.conservative_gap` on ``batch`` from torch seed ``seed``."""
    q = a.critic(batch["observations"], batch["actions"])
    torch.manual_seed(seed)
    return a.conservative_gap(batch, batch["observations"], batch["next_observations"], q, batch.get("weights"))


def ood_of(a: COMBO, obs, next_obs, seed=3):
    torch.manual_seed(seed)
    return a.regulariser.ood_values(a.critic, a.actor.repeated_draws, obs, next_obs)


# ------------------------------------------------------------------ the conservative term
@pytest.mark.parametrize("rho_s", ["mix", "model"])
def test_the_data_term_uses_only_the_real_rows(rho_s):
    """gap = T E_rho[lse] - E_D[Q(s, a)] with D the real rows: the formula, and the model rows' actions
    (which only the data term could read) change nothing, where a real row's action does."""
    a, batch = agent(rho_s=rho_s), mixed_batch()
    real = ~batch["synthetic"]
    with torch.no_grad():
        got, ood = gap(a, batch)
        expected = ood.mean(dim=1) - a.critic(batch["observations"][real], batch["actions"][real]).mean(dim=1)
        torch.testing.assert_close(got, expected)
        moved = dict(batch, actions=batch["actions"].clone())
        moved["actions"][real.logical_not()] = -moved["actions"][real.logical_not()]
        torch.testing.assert_close(gap(a, moved)[0], got, rtol=0, atol=0)
        moved["actions"][0] = -moved["actions"][0]  # a real row
        assert (gap(a, moved)[0] - got).abs().min() > 1e-6


def test_the_pre_pr9_data_term_takes_every_row_and_weights_weigh_each_subset():
    a, batch = agent(data_rows="mix"), mixed_batch()
    with torch.no_grad():
        got, ood = gap(a, batch)
        torch.testing.assert_close(got, ood.mean(1) - a.critic(batch["observations"], batch["actions"]).mean(1))
        # the weights rule: E_rho over the batch is the weighted sum, E_D over the real rows their own weights' mean
        a = agent()
        weighted = mixed_batch(weights=True)
        got, ood = gap(a, weighted)
        real = ~weighted["synthetic"]
        q_real = a.critic(weighted["observations"][real], weighted["actions"][real])
        torch.testing.assert_close(got, (ood * weighted["weights"]).sum(1) - q_real.mean(1))


def test_the_logsumexp_states_follow_rho_s():
    """``mix``: the log-sum-exp over every row of the batch (s and s' of each); ``model``: over the model
    rows only; a batch without model rows takes every row whatever rho_s."""
    batch = mixed_batch()
    model = batch["synthetic"]
    with torch.no_grad():
        a = agent(rho_s="mix")
        _, ood = gap(a, batch)
        torch.testing.assert_close(ood, ood_of(a, batch["observations"], batch["next_observations"]), rtol=0, atol=0)
        a = agent(rho_s="model")
        _, ood = gap(a, batch)
        assert ood.shape == (2, int(model.sum()))
        torch.testing.assert_close(ood, ood_of(a, batch["observations"][model], batch["next_observations"][model]),
                                   rtol=0, atol=0)
        changed = {k: v.clone() for k, v in batch.items()}  # the real rows' states: not in rho = model
        changed["observations"][~model] += 1.0
        changed["next_observations"][~model] += 1.0
        torch.testing.assert_close(gap(a, changed)[1], ood, rtol=0, atol=0)
        real_only = {k: v[~model] for k, v in batch.items()}
        _, ood = gap(a, real_only)
        torch.testing.assert_close(ood, ood_of(a, real_only["observations"], real_only["next_observations"]))


def test_only_real_or_only_model_rows_make_it_cql():
    """No ``synthetic`` field, or a batch of one kind (``generator=synther`` replaces the data): the
    push-down and push-up terms over every row, CQL's conservative term."""
    cql = CQL(3, 2, [-1.0, -1.0], [1.0, 1.0], CQLConfig(**TINY))
    for rho_s in ("mix", "model"):
        a = agent(rho_s=rho_s)
        cql.critic.load_state_dict(a.critic.state_dict())
        cql.actor.load_state_dict(a.actor.state_dict())
        for synthetic in (None, False, True):
            batch = mixed_batch()
            if synthetic is None:
                del batch["synthetic"]
            else:
                batch["synthetic"][:] = synthetic
            q = cql.critic(batch["observations"], batch["actions"])
            torch.manual_seed(3)
            expected = cql.conservative_gap(batch, batch["observations"], batch["next_observations"], q, None)[0]
            torch.testing.assert_close(gap(a, batch)[0], expected, rtol=0, atol=0)


# ------------------------------------------------------------------ one update
@pytest.fixture
def float64():
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(torch.float32)


def test_one_update_is_the_formulas(float64):
    """Kit's order (actor, alpha, then the critics with the updated actor) on the mixed batch, the
    push-down term over the mixed rows, the push-up over the real ones, written out for two critics."""
    a, batch = agent(), mixed_batch()
    expected = copy.deepcopy(a)
    torch.manual_seed(5)
    a.update(batch)
    torch.manual_seed(5)
    e, cfg = expected, expected.config
    obs, act, r, s2, d = (batch[k] for k in ("observations", "actions", "rewards", "next_observations", "terminals"))
    alpha = e.log_alpha.detach().exp()
    new_a, log_pi = e.actor(obs)
    actor_loss = (alpha * log_pi - e.critic(obs, new_a).min(0).values).mean()
    e.actor_optim.zero_grad()
    actor_loss.backward()
    e.actor_optim.step()
    e.alpha_optim.zero_grad()
    (-(e.log_alpha * (log_pi.detach() + e.target_entropy)).mean()).backward()
    e.alpha_optim.step()
    with torch.no_grad():
        a2, _ = e.actor(s2)
        y = r + cfg.gamma * (1 - d) * e.target_critic(s2, a2).min(0).values
    q = e.critic(obs, act)
    rows, reps = len(obs), cfg.num_repeats
    with torch.no_grad():
        u = torch.rand(rows * reps, 2) * 2 - 1
        o_rep, n_rep = obs.repeat_interleave(reps, 0), s2.repeat_interleave(reps, 0)
        p1, l1 = e.actor(o_rep)
        p2, l2 = e.actor(n_rep)
    cat = torch.cat([(e.critic(o_rep, p1) - l1).view(2, rows, reps), (e.critic(o_rep, p2) - l2).view(2, rows, reps),
                     (e.critic(o_rep, u) - math.log(0.25)).view(2, rows, reps)], dim=2)  # (2, B, 3R)
    real = ~batch["synthetic"]
    loss = sum(((q[i] - y) ** 2).mean() + cfg.cql_weight * (torch.logsumexp(cat[i], 1).mean() - q[i, real].mean())
               for i in range(2))
    e.critic_optim.zero_grad()
    loss.backward()
    e.critic_optim.step()
    with torch.no_grad():
        for target, source in zip(e.target_critic.parameters(), e.critic.parameters()):
            target.copy_((1 - cfg.tau) * target + cfg.tau * source)
    for name in ("actor", "critic", "target_critic"):
        for x, y_ in zip(getattr(a, name).parameters(), getattr(e, name).parameters()):
            torch.testing.assert_close(x, y_, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(a.log_alpha, e.log_alpha)


def test_the_actors_learning_rate_is_cosine_annealed_over_the_runs_epochs():
    a = agent()
    lrs = []
    for epoch in range(1, 11):
        a.on_epoch_end(epoch, 10)
        lrs.append(a.actor_optim.param_groups[0]["lr"])
    expected = [1e-4 * (1 + math.cos(math.pi * e / 10)) / 2 for e in range(1, 11)]  # CosineAnnealingLR(T_max=10)
    assert lrs == pytest.approx(expected, rel=1e-12, abs=1e-20) and lrs[-1] == 0.0
    assert a.critic_optim.param_groups[0]["lr"] == 3e-4
    fixed = agent(actor_lr_cosine=False)
    fixed.on_epoch_end(5, 10)
    assert fixed.actor_optim.param_groups[0]["lr"] == 1e-4


# ------------------------------------------------------------------ settings
def test_the_defaults_and_the_published_generator_are_offlinerlkits():
    from mbrl_offline.models.dynamics import dynamics_recipe

    cfg = COMBOConfig()
    assert (cfg.cql_weight, cfg.temperature, cfg.num_repeats, cfg.hidden_size, cfg.hidden_layers) == (5.0, 1.0, 10, 256, 3)
    assert (cfg.actor_lr, cfg.critic_lr, cfg.alpha_lr, cfg.gamma, cfg.tau, cfg.batch_size) == (1e-4, 3e-4, 1e-4, 0.99, 5e-3, 256)
    assert (cfg.deterministic_backup, cfg.max_q_backup, cfg.with_lagrange, cfg.actor_lr_cosine) == (True, False, False, True)
    assert (cfg.rho_s, cfg.data_rows, cfg.lse_mode) == ("mix", "real", "joint")
    generator = COMBO.published_generator()
    assert (generator.kind, generator.every, generator.mixing.rule, generator.mixing.real_ratio) == (
        "rollouts", 1000, "fraction", 0.5)
    rollout = generator.rollout
    assert (rollout.horizon, rollout.rollouts_per_epoch, rollout.retain_epochs, rollout.penalty, rollout.planner,
            rollout.deterministic_model) == (5, 50_000, 5, "none", "policy", False)
    assert generator.dynamics == dynamics_recipe("offlinerlkit")


# run_combo.py's docstring (OfflineRL-Kit e3ce697): rollout-length h, cql-weight w
KIT_PRESETS = {"halfcheetah-medium": (5, 0.5), "hopper-medium": (5, 5.0), "walker2d-medium": (1, 5.0),
               "halfcheetah-medium-replay": (5, 0.5), "hopper-medium-replay": (5, 0.5),
               "walker2d-medium-replay": (1, 0.5), "halfcheetah-medium-expert": (5, 5.0),
               "hopper-medium-expert": (5, 5.0), "walker2d-medium-expert": (1, 5.0)}


def test_the_presets_are_offlinerlkits_suggested_values():
    from mbrl_offline.cli import resolve_train_config
    from mbrl_offline.config import CONFIG_DIR
    from mbrl_offline.config_files import compose

    assert {p.stem for p in (Path(CONFIG_DIR) / "preset").glob("combo-*.yaml")} == {f"combo-{d}" for d in KIT_PRESETS}
    for dataset, (horizon, weight) in KIT_PRESETS.items():
        env = dataset.split("-")[0]
        _, algo, generator, _, _ = resolve_train_config(compose(
            CONFIG_DIR, "train", ["algo=combo", f"env={env}", f"preset=combo-{dataset}", "preset_dataset=null"]))
        assert (generator.rollout.horizon, algo.cql_weight) == (horizon, weight), dataset


def test_the_sweep_is_the_grid_of_w_and_h():
    from itertools import product

    from mbrl_offline.compose import run_configs
    from mbrl_offline.config import CONFIG_DIR
    from mbrl_offline.config_files import compose
    from mbrl_offline.tune import flatten_space, override

    from omegaconf import OmegaConf

    sweep = compose(CONFIG_DIR, "tune", ["algo=combo"]).sweep
    space = flatten_space(OmegaConf.to_container(sweep.space, resolve=True))
    assert {k: list(v["choices"]) for k, v in space.items()} == {"algo.cql_weight": [0.5, 1.0, 5.0],
                                                                 "generator.rollout.horizon": [1, 5]}
    assert sweep.for_algo == "combo" and sweep.n_trials == 6 and sweep.sampler.name == "grid"
    for w, h in product([0.5, 1.0, 5.0], [1, 5]):  # each point is a valid run
        algo, generator, _ = run_configs("combo", overrides=[override("algo.cql_weight", w),
                                                             override("generator.rollout.horizon", h)])
        assert (algo.cql_weight, generator.rollout.horizon) == (w, h)


@pytest.mark.parametrize("settings, message", [
    ({"cql_weight": -1.0}, "algo.cql_weight must be at least 0 (0 turns the conservative term off: SAC), got -1.0."),
    ({"rho_s": "real"}, "algo.rho_s = 'real' is unknown; choose one of mix, model."),
    ({"data_rows": "model"}, "algo.data_rows = 'model' is unknown; choose one of real, mix."),
    ({"lse_mode": "kit"}, "algo.lse_mode = 'kit' is unknown; choose one of joint, per_repeat."),
    ({"actor_lr_cosine": "sometimes"}, "algo.actor_lr_cosine"),
])
def test_bad_settings_are_refused_in_one_line(settings, message):
    with pytest.raises(ConfigError) as error:
        config_to_dataclass(COMBOConfig, settings, "algo")
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


# ------------------------------------------------------------------ pairings
def test_combos_learner_on_synthers_data_and_combos_generator_under_another_agent():
    """By configuration: COMBO's learner takes SynthER's samples (``generator=synther``, all rows
    synthetic: COMBO's terms over every row), and IQL takes COMBO's published generator (``generator=combo``:
    its rollouts, 50% real rows)."""
    from mbrl_offline.compose import check_pair, run_configs
    from mbrl_offline.generators import RolloutGeneratorConfig, SyntherGeneratorConfig

    algo, generator, _ = run_configs("combo", "quick", "synther")
    assert isinstance(algo, COMBOConfig) and isinstance(generator, SyntherGeneratorConfig)
    check_pair(COMBO, generator)
    algo, generator, _ = run_configs("iql", "quick", "combo")
    assert isinstance(generator, RolloutGeneratorConfig) and algo.__class__ is ALGORITHMS["iql"][1]
    assert (generator.mixing.real_ratio, generator.rollout.horizon) == (0.5, 5)
    assert generator.rollout.rollouts_per_epoch == 5000  # the quick budget's, as for any rollout generator
    check_pair(ALGORITHMS["iql"][0], generator)


def test_combo_trains_on_synther_samples(tmp_path):
    from mbrl_offline import build_run, load_dataset
    from mbrl_offline.generators import SyntherGeneratorConfig
    from mbrl_offline.models.diffusion import DiffusionTrainConfig, EDMConfig, ResidualMLPConfig
    from mbrl_offline.trainer import TrainerConfig

    data = load_dataset("pendulum-medium").subset(range(1000))
    synther = SyntherGeneratorConfig(samples=300, sample_batch=128, denoiser=ResidualMLPConfig(width=32, blocks=2, dim_t=16),
                                     edm=EDMConfig(steps=4), train=DiffusionTrainConfig(steps=30, batch_size=64))
    settings = TrainerConfig(epochs=1, updates_per_epoch=5, eval_every=1, eval_episodes=1, checkpoint_every=1,
                             run_dir=str(tmp_path / "run"), progress=False, tensorboard=False)
    trainer = build_run("combo", data, dataclasses.replace(COMBOConfig(**TINY), batch_size=32), synther, settings,
                        cache_dir=tmp_path / "cache")
    trainer.train()
    assert isinstance(trainer.agent, COMBO) and len(trainer.synthetic) == synther.samples
    assert trainer.mixing.sample(trainer.real, trainer.synthetic, 32)["synthetic"].all()
    assert np.isfinite(trainer.history[-1]["normalized_score"])


# ------------------------------------------------------------------ OfflineRL-Kit's own code
def benchmarks():
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import vs_offlinerlkit

    return vs_offlinerlkit


@needs_kit
@pytest.mark.parametrize("rho_s", ["mix", "model"])
def test_updates_match_offlinerlkits_combopolicy_in_the_kit_setting(rho_s):
    """Three updates of ours (``lse_mode=per_repeat``, Kit's defaults) and of Kit's ``COMBOPolicy.learn``
    from the same weights, real and model halves and draws: the same losses, log-sum-exps, Q-values and
    steps, up to float32 rounding and Kit's 1e-6 inside its tanh log-determinant; with the joint
    log-sum-exp the push-down term is at least T log R higher."""
    for row in benchmarks().combo_side_by_side(KIT, "per_repeat", rho_s, updates=3):
        assert row["our_critic_loss"] == pytest.approx(row["kit_critic_loss"], rel=1e-5)
        assert row["our_logsumexp"] == pytest.approx(row["kit_logsumexp"], rel=1e-5, abs=1e-5)
        assert row["our_q_real"] == pytest.approx(row["kit_q_real"], rel=1e-4, abs=1e-5)
        assert row["our_actor_loss"] == pytest.approx(row["kit_actor_loss"], rel=1e-4, abs=1e-4)
        assert row["critic_step_rel_diff"] < 5e-3 and row["actor_step_rel_diff"] < 1e-2
        assert max(row[f"{name}_max_diff"] for name in ("actor", "target_critic", "log_alpha")) < 1e-4
        # Adam's first steps are about lr sign(g): the few critic weights whose gradient is within float32
        # rounding of 0 (below 1e-6 where the largest is about 2.5) may step differently, by up to ~lr
        assert row["critic_max_diff"] < 3e-4 * 1.5 and row["critic_over_1e-5"] <= 20
    joint = benchmarks().combo_side_by_side(KIT, "joint", rho_s, updates=1)[0]
    assert joint["our_logsumexp"] >= joint["kit_logsumexp"] + math.log(10) - 1e-4


def test_the_side_by_side_refuses_a_folder_that_is_not_kits_checkout():
    import subprocess

    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "vs_offlinerlkit.py"), "--combo-update",
                           "--offlinerlkit", "/nonexistent"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(root)}, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith("error: --offlinerlkit must name a checkout of")
    assert done.stderr.count("\n") == 1, done.stderr
