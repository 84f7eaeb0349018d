"""RAMBO (`mbrl_offline.algorithms.rambo`) and the rollout generator's adversarial model training
(`mbrl_offline.generators.rollouts.AdversarialConfig`): the mixture log-likelihood against a brute-force
density and against OfflineRL-Kit's float64 form, the normalised advantage, where the gradients go, what
lambda = 0 does, the refusals, RAMBO's generator under IQL, and, where a checkout of OfflineRL-Kit is
given (``MBRL_OFFLINE_OFFLINERLKIT``, the path ``benchmarks/vs_offlinerlkit.py --offlinerlkit`` takes),
one adversarial step against Kit's ``RAMBOPolicy.dynamics_step_and_forward``."""
import copy
import dataclasses
import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from mbrl_offline import build_run, load_dataset
from mbrl_offline.algorithms import IQL, NEUBAY, RAMBO, SAC
from mbrl_offline.algorithms.iql import IQLConfig
from mbrl_offline.algorithms.rambo import RAMBOConfig
from mbrl_offline.algorithms.sac import SACConfig
from mbrl_offline.compose import check_pair, run_configs
from mbrl_offline.errors import ConfigError
from mbrl_offline.generators.rollouts import (AdversarialConfig, RolloutConfig, RolloutGenerator, RolloutGeneratorConfig,
                                              StandardisedDynamics, adversarial_step, mixture_log_prob,
                                              normalised_advantage)
from mbrl_offline.models.dynamics import DynamicsConfig, GaussianEnsembleDynamics
from mbrl_offline.trainer import TrainerConfig

KIT = os.environ.get("MBRL_OFFLINE_OFFLINERLKIT")  # a checkout of yihaosun1124/OfflineRL-Kit, or unset
needs_kit = pytest.mark.skipif(
    not (KIT and (Path(KIT) / "offlinerlkit" / "policy" / "model_based" / "rambo.py").is_file()),
    reason="set MBRL_OFFLINE_OFFLINERLKIT to a checkout of OfflineRL-Kit")

OBS, ACT = 3, 1


def small_model(seed: int = 0, members: int = 4, elites: int = 3) -> GaussianEnsembleDynamics:
    torch.manual_seed(seed)
    model = GaussianEnsembleDynamics(OBS, ACT, DynamicsConfig(ensemble_size=members, num_elites=elites,
                                                              hidden_size=16, hidden_layers=2,
                                                              weight_decay=(1e-4, 2e-4, 3e-4)))
    with torch.no_grad():
        model.input_mean.normal_()
        model.input_std.uniform_(0.5, 2.0)
        model.elites.copy_(torch.tensor([2, 0, 3])[:elites])
    model.mark_fitted()
    return model


def small_sac(seed: int = 0) -> SAC:
    torch.manual_seed(seed)
    return SAC(OBS, ACT, [-2.0], [2.0], SACConfig(hidden_size=16, hidden_layers=2))


def real_rows(n: int = 64, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(n, OBS, generator=g)
    return {"observations": obs, "actions": torch.rand(n, ACT, generator=g) * 4 - 2,
            "next_observations": obs + 0.1 * torch.randn(n, OBS, generator=g), "rewards": torch.randn(n, generator=g)}


def never_terminal(obs: torch.Tensor) -> torch.Tensor:
    return torch.zeros(len(obs), dtype=torch.bool)


# ------------------------------------------------------------------ the mixture log-likelihood
def test_log_p_is_the_brute_force_mixture_density_and_kits_float64_form():
    """logsumexp_k log N_k - log E equals log((1/E) sum_k prod_d pdf), the pdfs written out in float64,
    and OfflineRL-Kit's ``log(sum_k exp(log N_k) / E)`` in float64, wherever that form is finite."""
    g = torch.Generator().manual_seed(0)
    mean, std = torch.randn(5, 7, 4, generator=g), torch.rand(5, 7, 4, generator=g) + 0.2
    sample = torch.randn(7, 4, generator=g)
    got = mixture_log_prob(mean, std, sample)
    m, s, x = mean.double(), std.double(), sample.double()
    pdf = torch.exp(-0.5 * ((x - m) / s) ** 2) / (s * math.sqrt(2 * math.pi))  # (E, B, D)
    brute = torch.log(pdf.prod(-1).mean(0))
    torch.testing.assert_close(got.double(), brute, rtol=1e-5, atol=1e-5)
    log_n = torch.distributions.Normal(mean, std).log_prob(sample).sum(-1)
    kit = (log_n.double().exp() * (1 / 5)).sum(0).log().float()  # rambo.py's three lines
    torch.testing.assert_close(got, kit, rtol=1e-5, atol=1e-5)


def test_log_p_stays_finite_where_the_float64_form_underflows():
    mean, std = torch.zeros(3, 2, 40), torch.full((3, 2, 40), 0.01)
    sample = torch.full((2, 40), 1.0)  # 100 std away in each of 40 dimensions: log N ~ -2e5
    log_n = torch.distributions.Normal(mean, std).log_prob(sample).sum(-1)
    assert torch.isinf((log_n.double().exp() / 3).sum(0).log()).all()
    got = mixture_log_prob(mean, std, sample)
    torch.testing.assert_close(got, log_n[0], rtol=1e-6, atol=1e-3)  # equal members: log p = log N


def test_the_normalised_advantage_has_zero_mean_and_unit_std():
    a = torch.randn(256, generator=torch.Generator().manual_seed(0)) * 7 + 3
    for eps in (0.0, 1e-6):
        hat = normalised_advantage(a, eps)
        assert abs(hat.mean().item()) < 1e-6
        assert hat.std().item() == pytest.approx(1.0, abs=1e-5)


# ------------------------------------------------------------------ one step, by hand
def reference_step(model, obs, actions, agent, real, lam, noise, choice, termination=never_terminal):
    """The adversarial loss written out (float64 mixture, as OfflineRL-Kit) on a copy of ``model``;
    returns the copy's gradients."""
    import copy
    ref = copy.deepcopy(model)
    mean, logvar = ref(ref.normalise(obs, actions))
    mean = torch.cat([mean[..., :-1] + obs, mean[..., -1:]], -1)
    std = torch.sqrt(torch.exp(logvar))
    sample = (mean + std * noise).detach()[ref.elites[choice], torch.arange(len(obs))]
    log_n = torch.distributions.Normal(mean, std).log_prob(sample).sum(-1)[ref.elites]
    log_p = (log_n.double().exp() / len(ref.elites)).sum(0).log().float()
    with torch.no_grad():
        nxt = sample[:, :-1]
        value = sample[:, -1] + agent.config.gamma * (1 - termination(nxt).float()) * \
            agent.critic(nxt, agent.mode(nxt)).min(0).values
        adv = value - agent.critic(obs, actions).min(0).values
        adv = (adv - adv.mean()) / (adv.std() + 1e-6)
    target = torch.cat([real["next_observations"] - real["observations"], real["rewards"][:, None]], -1)
    m, lv = ref(ref.normalise(real["observations"], real["actions"]))
    mle = ((m - target) ** 2 * torch.exp(-lv)).mean(dim=(1, 2)).sum() + lv.mean(dim=(1, 2)).sum()
    mle = mle + sum(wd * 0.5 * (layer.weight ** 2).sum() for wd, layer in zip((1e-4, 2e-4, 3e-4), [*ref.hidden, ref.head]))
    mle = mle + 0.01 * ref.max_logvar.sum() - 0.01 * ref.min_logvar.sum()
    (lam * (log_p * adv).mean() + mle).backward()
    return {name: p.grad for name, p in ref.named_parameters()}


def test_one_step_has_the_written_out_gradient_and_touches_only_the_model():
    model, agent, real = small_model(), small_sac(), real_rows(32)
    obs = torch.randn(32, OBS, generator=torch.Generator().manual_seed(2))
    actions = agent.sample(obs)[0]
    g = torch.Generator().manual_seed(5)
    noise = torch.randn(4, 32, OBS + 1, generator=g)
    choice = torch.randint(0, 3, (32,), generator=g)
    expected = reference_step(model, obs, actions, agent, real, 0.5, noise, choice)
    before_agent = [p.detach().clone() for p in [*agent.actor.parameters(), *agent.critic.parameters()]]
    captured = {}

    class Capture(torch.optim.SGD):  # the gradients as the step sees them
        def step(self, closure=None):
            captured.update({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})

    from mbrl_offline.policies import FunctionPolicy
    passes, forward = [], model.forward
    model.forward = lambda x, members=None: passes.append(members) or forward(x, members)  # the step's passes
    adversarial_step(model, Capture(model.parameters(), lr=0.1), obs, FunctionPolicy(lambda o: actions), agent, real,
                     never_terminal, AdversarialConfig(every=1, coef=0.5), generator=torch.Generator().manual_seed(5))
    # the rollout rows' pass evaluates the elites only (the others' outputs are never read), the MLE pass all
    assert len(passes) == 2 and torch.equal(passes[0], model.elites) and passes[1] is None
    for name, grad in expected.items():
        if grad is not None:
            torch.testing.assert_close(captured[name], grad, rtol=2e-4, atol=1e-6)
    for p, old in zip([*agent.actor.parameters(), *agent.critic.parameters()], before_agent):
        assert p.grad is None and torch.equal(p, old)  # the agent runs under no_grad: untouched


def test_per_member_mle_batches_of_the_same_rows_are_the_shared_batch():
    """``mle_batch="per_member"`` gives member i its own rows ``(N, B, ...)``; with every member given the
    shared rows, the step (and its gradients) are the shared batch's, and with other rows they differ."""
    agent, real, obs = small_sac(), real_rows(32), torch.randn(32, OBS, generator=torch.Generator().manual_seed(2))
    actions = agent.sample(obs)[0]
    from mbrl_offline.policies import FunctionPolicy

    def step(rows):
        model = small_model()
        grads = {}

        class Capture(torch.optim.SGD):
            def step(self, closure=None):
                grads.update({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})

        _, metrics = adversarial_step(model, Capture(model.parameters(), lr=0.1), obs, FunctionPolicy(lambda o: actions),
                                      agent, rows, never_terminal, AdversarialConfig(every=1, coef=0.5),
                                      generator=torch.Generator().manual_seed(5))
        return metrics["mle_loss"], grads

    shared = step(real)
    same = step({k: v.expand(4, *v.shape) for k, v in real.items()})
    others = [real_rows(32, seed=10 + i) for i in range(4)]  # (a permutation of the rows would not do: a mean)
    other = step({k: torch.stack([rows[k] for rows in others]) for k in real})
    torch.testing.assert_close(same[0], shared[0])
    for name, grad in shared[1].items():
        torch.testing.assert_close(same[1][name], grad)
    assert not torch.allclose(other[0], shared[0])


def test_with_lambda_zero_the_model_is_unchanged_when_skipped_and_fine_tuned_otherwise():
    for when_zero, changed in (("skip", False), ("mle_finetune", True)):
        model = small_model()
        config = RolloutGeneratorConfig(rollout=RolloutConfig(horizon=2, rollouts_per_epoch=8),
                                        adversarial=AdversarialConfig(every=1, steps=3, coef=0.0, batch_size=16,
                                                                      when_zero=when_zero))
        generator = RolloutGenerator(model, never_terminal, config)
        before = {k: v.clone() for k, v in generator.dynamics.state_dict().items()}
        stats = generator.adapt(small_sac(), small_sac(), real_rows(), torch.Generator().manual_seed(0))
        after = generator.dynamics.state_dict()
        same = all(torch.equal(before[k], after[k]) for k in before)
        assert same != changed, when_zero
        assert (generator.adapt_every == 1) == changed and bool(stats) == changed
        # the fitted model, which the checkpoint fingerprints, never changes
        assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_the_adapted_model_and_its_optimiser_round_trip_through_the_generators_state():
    config = RolloutGeneratorConfig(rollout=RolloutConfig(horizon=2, rollouts_per_epoch=8),
                                    adversarial=AdversarialConfig(every=1, steps=2, batch_size=16))
    first = RolloutGenerator(small_model(), never_terminal, config)
    first.adapt(small_sac(), small_sac(), real_rows(), torch.Generator().manual_seed(0))
    second = RolloutGenerator(small_model(), never_terminal, config)
    second.load_state_dict(copy.deepcopy(first.state_dict()))  # as a checkpoint gives it back
    for gen in (first, second):
        gen.adapt(small_sac(), small_sac(), real_rows(), torch.Generator().manual_seed(1))
    for k, v in first.dynamics.state_dict().items():
        assert torch.equal(v, second.dynamics.state_dict()[k]), k


def test_standardised_dynamics_steps_in_raw_units():
    model = small_model()
    mean, std = torch.tensor([1.0, -2.0, 0.5]), torch.tensor([2.0, 0.5, 3.0])
    wrapped = StandardisedDynamics(model, mean, std)
    obs, act = torch.randn(6, OBS), torch.randn(6, ACT)
    got = wrapped.step(obs, act, torch.Generator().manual_seed(0), deterministic=True)
    inner = model.step((obs - mean) / std, act, torch.Generator().manual_seed(0), deterministic=True)
    torch.testing.assert_close(got["next_observations"], inner["next_observations"] * std + mean)
    torch.testing.assert_close(got["rewards"], inner["rewards"])


# ------------------------------------------------------------------ settings and refusals
@pytest.mark.parametrize("coef, message", [
    ("x", "generator.adversarial.coef = 'x' has the wrong type; expected float."),
    (-1e-3, "generator.adversarial.coef must be at least 0 (lambda: 3e-4 in OfflineRL-Kit's presets, 0 for none), "
            "got -0.001."),
    (float("nan"), "generator.adversarial.coef must be at least 0 (lambda: 3e-4 in OfflineRL-Kit's presets, 0 for "
                   "none), got nan."),
])
def test_a_bad_adversarial_coefficient_is_refused_in_one_line(coef, message):
    with pytest.raises(ConfigError) as error:
        AdversarialConfig(coef=coef)
    assert str(error.value) == message and "\n" not in message


def test_a_bad_coefficient_on_the_command_line_is_refused_before_any_work():
    with pytest.raises(ConfigError, match="generator.adversarial.coef"):
        run_configs("rambo", "quick", overrides=["generator.adversarial.coef=-1"])


def test_an_agent_without_a_value_role_is_refused_for_adversarial_training():
    """`check_pair` (which build_run and the command line call before any data is loaded or model fitted)
    refuses, in one line, adversarial training for an agent class that declares no value role."""
    from mbrl_offline.algorithms import TD3BC

    class NoValue(TD3BC):
        name, provides_value = "novalue", False

    generator = RAMBO.published_generator()
    with pytest.raises(ConfigError) as error:
        check_pair(NoValue, generator)
    assert str(error.value) == ("generator.adversarial trains the model against the agent's value estimates, and "
                                "novalue provides none (its class declares provides_value False); set "
                                "generator.adversarial.every=0, or use an agent with critics (e.g. sac, iql, td3bc).")
    check_pair(NoValue, dataclasses.replace(generator, adversarial=AdversarialConfig()))  # off: no value needed
    check_pair(NoValue, dataclasses.replace(generator, adversarial=AdversarialConfig(every=1000, coef=0.0,
                                                                                     when_zero="skip")))
    assert not getattr(NEUBAY, "provides_value", False)
    with pytest.raises(ConfigError):  # NEUBAY: recurrent and of sequences, refused before that
        check_pair(NEUBAY, generator)


def test_every_transition_agent_is_its_own_value_function():
    """Every agent of transitions with critics provides the value role; an on-policy one (MOReL's NPG,
    which learns no Q) declares none, and adversarial training refuses it."""
    from mbrl_offline.algorithms import ALGORITHMS
    data = load_dataset("pendulum-medium")
    obs = torch.as_tensor(data.observations[:5])
    for name, (cls, config_cls) in ALGORITHMS.items():
        if cls.consumes != "transitions":
            continue
        if getattr(cls, "on_policy", False):
            assert not cls.provides_value, name
            with pytest.raises(ConfigError, match="provides none"):
                RAMBO.published_generator().check_agent(cls, None)
            continue
        assert cls.provides_value, name
        fields = {f.name for f in dataclasses.fields(config_cls)}
        config = dataclasses.replace(config_cls(), hidden_size=16, **({"bc_epochs": 0} if "bc_epochs" in fields else {}))
        agent = cls.for_dataset(data, config)
        actions = agent.mode(obs)
        np.testing.assert_allclose(actions.numpy(), agent.act(obs.numpy(), deterministic=True), rtol=1e-5, atol=1e-6)
        q = agent.q_value(obs, actions)
        assert q.shape == (5,) and not q.requires_grad and agent.discount == config.gamma, name
        with torch.no_grad():  # raw states go through the agent's own normalisation once (RAMBO's is fitted)
            states = agent.normalise(obs) if hasattr(agent, "normalise") else obs
            expected = agent.critic(states, actions).min(dim=0).values / getattr(agent, "reward_scale", 1.0)
        torch.testing.assert_close(q, expected)


def test_rambos_generator_under_iql_builds_by_configuration_and_trains_the_model(tmp_path):
    """``algo=iql generator=rambo``: the composed generator is RAMBO's (adversarial, standardised); a
    short run with a saved model adapts a copy of it after every ``every`` updates, leaving the fitted
    one as it was."""
    _, generator, _ = run_configs("iql", "quick", "rambo")
    assert generator.adversarial.active and generator.standardise_observations
    check_pair(IQL, generator)
    data = load_dataset("pendulum-medium")
    model = GaussianEnsembleDynamics(data.obs_dim, data.act_dim, DynamicsConfig(ensemble_size=3, num_elites=2,
                                                                               hidden_size=16, hidden_layers=2,
                                                                               weight_decay=()))
    model.mark_fitted()
    path = model.save(tmp_path / "model.pt")
    generator = dataclasses.replace(generator, every=4, rollout=dataclasses.replace(generator.rollout, rollouts_per_epoch=16),
                                    adversarial=dataclasses.replace(generator.adversarial, every=5, steps=3,
                                                                    batch_size=32))
    trainer = build_run("iql", data, IQLConfig(hidden_size=16, batch_size=32), generator,
                        TrainerConfig(epochs=1, updates_per_epoch=10, eval_episodes=1, run_dir=str(tmp_path / "run"),
                                      progress=False, tensorboard=False), dynamics_path=path)
    assert isinstance(trainer.generator.dynamics, StandardisedDynamics) and trainer.adapt_every == 5
    trainer.train()
    fitted, adapted = trainer.generator.model.inner.state_dict(), trainer.generator.dynamics.inner.state_dict()
    assert all(torch.equal(fitted[k], v) for k, v in model.state_dict().items())
    assert not torch.equal(fitted["head.weight"], adapted["head.weight"])


def test_rambos_defaults_are_offlinerlkits():
    config, generator = RAMBOConfig(), RAMBO.published_generator()
    assert (config.hidden_size, config.hidden_layers, config.num_critics) == (256, 2, 2)
    assert (config.actor_lr, config.critic_lr, config.alpha_lr, config.alpha_max) == (1e-4, 3e-4, 1e-4, 1.0)
    assert (config.bc_epochs, config.bc_lr, config.bc_loss) == (50, 1e-4, "mse_sample") and not config.actor_lr_cosine
    assert generator.every == 250 and generator.rollout.horizon == 5 and generator.mixing.real_ratio == 0.5
    assert generator.rollout.buffer_capacity == 1000 // 250 * 5 * 50_000 * 5  # run_rambo.py's fake buffer
    adv = generator.adversarial
    assert (adv.every, adv.steps, adv.coef, adv.batch_size, adv.learning_rate) == (1000, 1000, 3e-4, 256, 3e-4)
    d = generator.dynamics
    assert (d.holdout_ratio, d.max_holdout, d.logvar_bound_coef, d.patience, d.learning_rate) == (0.1, 1000, 1e-3, 10, 3e-4)


@pytest.mark.parametrize("loss", ["mse_sample", "nll"])
def test_behaviour_cloning_lowers_its_loss(loss):
    data = load_dataset("pendulum-medium")
    torch.manual_seed(0)
    agent = RAMBO.for_dataset(data, RAMBOConfig(hidden_size=32, bc_epochs=0, bc_loss=loss))
    losses = agent.pretrain(data.observations[:2048], data.actions[:2048] * 0.5)  # inside the bounds for nll
    assert len(losses) == 0
    agent = RAMBO.for_dataset(data, RAMBOConfig(hidden_size=32, bc_epochs=3, bc_lr=1e-3, bc_loss=loss))
    losses = agent.pretrain(data.observations[:2048], np.clip(data.actions[:2048], -1.9, 1.9))
    assert losses[-1] < losses[0]


def test_the_nll_loss_skips_batches_with_actions_at_the_bounds():
    data = load_dataset("pendulum-medium")
    agent = RAMBO.for_dataset(data, RAMBOConfig(hidden_size=16, bc_epochs=0, bc_loss="nll", bc_batch_size=4))
    actions = np.zeros((8, 1), dtype=np.float32)
    actions[5] = 2.0  # pendulum's bound: the second batch is skipped
    before = [p.clone() for p in agent.actor.parameters()]
    agent.config = dataclasses.replace(agent.config, bc_epochs=1)
    losses = agent.pretrain(data.observations[:8], actions)
    assert len(losses) == 1 and any(not torch.equal(a, b) for a, b in zip(before, agent.actor.parameters()))
    after = [p.clone() for p in agent.actor.parameters()]
    agent.pretrain(data.observations[4:8], actions[4:8])  # only the skipped batch: nothing moves
    assert all(torch.equal(a, b) for a, b in zip(after, agent.actor.parameters()))


# ------------------------------------------------------------------ OfflineRL-Kit's own code
def benchmarks():
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import vs_offlinerlkit

    return vs_offlinerlkit


@needs_kit
@pytest.mark.parametrize("coef", [3e-4, 1.0])
def test_adversarial_steps_match_offlinerlkits(coef):
    """Five chained steps (one rollout of h = 5) of ours and of Kit's ``RAMBOPolicy.dynamics_step_and_forward``
    from the same weights, states, actions, real batches and draws: the same losses, advantages,
    gradients and model steps, up to float32 rounding (Kit's log p in float64; the standardisation round
    trip on our side)."""
    for row in benchmarks().rambo_side_by_side(KIT, coef=coef, steps=5):
        assert row["terminal_mismatches"] == 0
        for key in ("adversarial_loss", "mle_loss", "advantage_mean", "advantage_std", "log_prob"):
            assert row[f"ours_{key}"] == pytest.approx(row[f"kit_{key}"], rel=1e-4, abs=1e-5), (row["step"], key)
        assert row["next_obs_max_diff"] < 1e-4
        assert row["grad_max_diff"] < 1e-4 * row["grad_max"]
        assert row["param_max_diff"] < 1e-2 * row["param_max_step"]


@needs_kit
def test_the_agents_update_is_offlinerlkits_sac_update():
    """Three updates of our RAMBO agent (its default order, Kit's ``SACPolicy.learn``'s) and of Kit's
    ``SACPolicy.learn`` (which ``RAMBOPolicy.learn`` runs on the real and model rows together) from the
    same weights after behaviour cloning, batches and draws: the same weights to float32 rounding,
    where the earlier default order ("official") ends as far from Kit's as Kit's own steps are long."""
    assert RAMBOConfig().update_order == "offlinerlkit_sac"
    for row in benchmarks().sac_side_by_side(KIT, "offlinerlkit_sac", updates=3):
        for key, (ours, theirs) in row.items():
            if key.endswith("Kit's step"):
                assert ours < 1e-6 and theirs > 1e-6, (key, ours, theirs)
            else:
                assert ours == pytest.approx(theirs, rel=1e-5, abs=1e-6), key
    last = benchmarks().sac_side_by_side(KIT, "official", updates=3)[-1]
    assert last["actor: max |ours - Kit| / Kit's step"][0] > last["actor: max |ours - Kit| / Kit's step"][1]


@pytest.mark.parametrize("flag", ["--rambo-update", "--sac-update"])
def test_the_side_by_side_script_refuses_a_folder_that_is_not_offlinerlkits_checkout(flag):
    import subprocess

    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "vs_offlinerlkit.py"), flag,
                           "--offlinerlkit", "/nonexistent"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(root)}, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith("error: --offlinerlkit must name a checkout of"), done.stderr
    assert done.stderr.count("\n") == 1
