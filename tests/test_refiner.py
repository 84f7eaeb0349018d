"""The PDE-Refiner for a dynamics model (`mbrl_offline.models.refiner`): its loss and refinement loop
against the paper's pseudocode written out, that a fitted refiner pulls noisy predictions of a known
deterministic system back towards the truth, its spread, save/load and cache, its use in branched
rollouts (penalty and halt on its spread) and in NEUBAY's posterior rollouts, and its settings refused
in one line."""
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from mbrl_offline.data.dataset import OfflineDataset
from mbrl_offline.errors import ConfigError, NotFittedError
from mbrl_offline.generators.rollouts import BranchedRollouts, RolloutConfig, refiner_threshold
from mbrl_offline.models.dynamics import DynamicsConfig, GaussianEnsembleDynamics
from mbrl_offline.models.refiner import DynamicsRefiner, RefinerConfig, load_or_fit_refiner

ROOT = Path(__file__).resolve().parents[1]


def known_system(rows: int = 4000, seed: int = 0) -> OfflineDataset:
    """A deterministic system: s' = s + 0.1 tanh(W [s, a]), r = sin(s_0) a_0, in episodes of 50 steps."""
    rng = np.random.default_rng(seed)
    weights = rng.normal(size=(3, 4)).astype(np.float32)
    obs = rng.normal(size=(rows, 3)).astype(np.float32)
    act = rng.uniform(-1, 1, size=(rows, 1)).astype(np.float32)
    next_obs = obs + 0.1 * np.tanh(np.concatenate([obs, act], 1) @ weights.T)
    rewards = (np.sin(obs[:, 0]) * act[:, 0]).astype(np.float32)
    timeouts = np.zeros(rows, bool)
    timeouts[49::50] = True
    return OfflineDataset(obs, act, rewards, next_obs.astype(np.float32), np.zeros(rows, bool), timeouts,
                          source="known system")


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """The known system and a refiner fitted on it (8,000 updates), fitted once for pytest-xdist's workers:
    through the cache in a folder they share, whose file lock lets one fit while the other waits."""
    from conftest import shared_folder

    data = known_system()
    torch.manual_seed(0)
    refiner, _ = load_or_fit_refiner(data, RefinerConfig(enabled=True, samples=4, updates=8000, hidden_size=128),
                                     shared_folder(tmp_path_factory, "refiner-fixture"), progress=False)
    return data, refiner


def test_the_loss_is_the_papers_written_out():
    torch.manual_seed(0)
    refiner = DynamicsRefiner(3, 1, RefinerConfig(steps=3, sigma_min=1e-3, start="own", hidden_size=8))
    condition, target, noise = torch.randn(6, 4), torch.randn(6, 4), torch.randn(6, 4)
    k = torch.tensor([0, 1, 2, 3, 0, 2])
    sigma = torch.tensor([0.0, 1e-1, 1e-2, 1e-3])
    assert torch.allclose(refiner.sigma, sigma)
    expected = []
    for b in range(6):
        if k[b] == 0:  # zeros in, the target out
            out = refiner(torch.zeros(1, 4), condition[b:b + 1], k[b:b + 1])
            expected.append((out - target[b]).pow(2))
        else:  # target + sigma_k eps in, eps out
            out = refiner(target[b:b + 1] + sigma[k[b]] * noise[b], condition[b:b + 1], k[b:b + 1])
            expected.append((out - noise[b]).pow(2))
    assert torch.allclose(refiner.loss(condition, target, k, noise), torch.cat(expected).mean(), atol=1e-6)


def test_refine_is_the_papers_loop_from_the_models_prediction(fitted):
    data, refiner = fitted
    obs, act = torch.as_tensor(data.observations[:50]), torch.as_tensor(data.actions[:50])
    next_obs = torch.as_tensor(data.next_observations[:50]) + 0.05
    rewards = torch.as_tensor(data.rewards[:50])
    out = refiner.refine(obs, act, next_obs, rewards, torch.Generator().manual_seed(3), samples=1)
    # the loop written out: u_hat from the given prediction, then u~ = u_hat + sigma_k eps, u_hat = u~ - sigma_k NO
    generator = torch.Generator().manual_seed(3)
    condition = (torch.cat([obs, act], 1) - refiner.input_mean) / refiner.input_std
    u = (torch.cat([next_obs - obs, rewards[:, None]], 1) - refiner.target_mean) / refiner.target_std
    with torch.no_grad():
        for k, sigma in enumerate(refiner.config.sigmas(), start=1):
            noisy = u + sigma * torch.randn(u.shape, generator=generator)
            u = noisy - sigma * refiner(noisy, condition, torch.full((50,), k))
    raw = u * refiner.target_std + refiner.target_mean
    assert torch.allclose(out["next_observations"], obs + raw[:, :-1], atol=1e-6)
    assert torch.allclose(out["rewards"], raw[:, -1], atol=1e-6)
    assert "refiner" not in out  # one sample gives no spread


def test_a_fitted_refiner_pulls_noisy_predictions_towards_the_truth(fitted):
    """On a deterministic system the denoiser knows the target from (s, a): predictions off by 0.1 of
    each target's std come back closer to the true transition. (With sigma_min = 1e-3, after 3000
    updates of a 3x64 network, not 8000 of 3x128, they ended further off: 0.097 rms.)"""
    data, refiner = fitted
    rows = slice(0, 1000)
    obs, act = torch.as_tensor(data.observations[rows]), torch.as_tensor(data.actions[rows])
    true_next, true_rew = torch.as_tensor(data.next_observations[rows]), torch.as_tensor(data.rewards[rows])
    generator = torch.Generator().manual_seed(0)
    scale = refiner.target_std * 0.1
    off = torch.randn((1000, 4), generator=generator) * scale
    refined = refiner.refine(obs, act, true_next + off[:, :3], true_rew + off[:, 3], generator, samples=1)
    before = (off / refiner.target_std).pow(2).mean().sqrt()
    after = ((torch.cat([refined["next_observations"] - true_next, (refined["rewards"] - true_rew)[:, None]], 1))
             / refiner.target_std).pow(2).mean().sqrt()
    assert after < 0.5 * before, (after.item(), before.item())
    assert refiner.train_log[-1]["holdout_loss"] < refiner.train_log[0]["holdout_loss"]


def test_the_spread_is_the_rms_over_outputs_of_the_samples_std(fitted):
    data, refiner = fitted
    obs, act = torch.as_tensor(data.observations[:20]), torch.as_tensor(data.actions[:20])
    next_obs, rewards = torch.as_tensor(data.next_observations[:20]), torch.as_tensor(data.rewards[:20])
    out = refiner.refine(obs, act, next_obs, rewards, torch.Generator().manual_seed(5), samples=4)
    generator = torch.Generator().manual_seed(5)
    condition = refiner.condition(obs, act)
    start = (torch.cat([next_obs - obs, rewards[:, None]], 1) - refiner.target_mean) / refiner.target_std
    refined = refiner._refine_standardised(start.repeat(4, 1), condition.repeat(4, 1), generator).view(4, 20, 4)
    expected = refined.std(dim=0, correction=0).pow(2).mean(dim=-1).sqrt()
    assert torch.allclose(out["refiner"], expected, atol=1e-6)
    first = refined[0] * refiner.target_std + refiner.target_mean
    assert torch.allclose(out["next_observations"], obs + first[:, :3], atol=1e-6)
    assert bool((out["refiner"] > 0).all())


def test_own_start_predicts_from_zeros_and_ensemble_start_cannot():
    data = known_system(1000)
    own = DynamicsRefiner(3, 1, RefinerConfig(start="own", updates=1500, hidden_size=64))
    own.fit(data, progress=False)
    obs, act = torch.as_tensor(data.observations[:500]), torch.as_tensor(data.actions[:500])
    predicted = own.predict(obs, act, torch.Generator().manual_seed(0))
    error = (predicted["next_observations"] - torch.as_tensor(data.next_observations[:500])).pow(2).mean()
    still = (obs - torch.as_tensor(data.next_observations[:500])).pow(2).mean()  # predicting no change
    assert error < 0.2 * still
    ensemble = DynamicsRefiner(3, 1, RefinerConfig(updates=10, hidden_size=8))
    ensemble.fit(data, progress=False)
    with pytest.raises(ConfigError, match="refiner.start=own"):
        ensemble.predict(obs, act)
    with pytest.raises(ValueError, match="pass next_obs and rewards"):
        ensemble.refine(obs, act)


def test_unfitted_refiner_refuses_and_save_load_and_cache_keep_it(tmp_path, fitted):
    data, refiner = fitted
    fresh = DynamicsRefiner(3, 1, refiner.config)
    obs, act = torch.as_tensor(data.observations[:8]), torch.as_tensor(data.actions[:8])
    nxt, rew = torch.as_tensor(data.next_observations[:8]), torch.as_tensor(data.rewards[:8])
    with pytest.raises(NotFittedError, match="never fitted"):
        fresh.refine(obs, act, nxt, rew)
    loaded = DynamicsRefiner.load(refiner.save(tmp_path / "refiner.pt"))
    for a, b in ((refiner, loaded),):
        assert torch.equal(a.refine(obs, act, nxt, rew, torch.Generator().manual_seed(1))["rewards"],
                           b.refine(obs, act, nxt, rew, torch.Generator().manual_seed(1))["rewards"])
    config = RefinerConfig(enabled=True, updates=20, hidden_size=8)
    first, path = load_or_fit_refiner(data, config, tmp_path / "cache", progress=False)
    # enabled and samples only change its use, not the fit: the same file
    again, path_again = load_or_fit_refiner(data, replace(config, samples=3), tmp_path / "cache", progress=False)
    assert path_again == path and again.config.samples == 3
    assert torch.equal(first.net[0].weight, again.net[0].weight)
    other, other_path = load_or_fit_refiner(data, replace(config, sigma_min=1e-2), tmp_path / "cache", progress=False)
    assert other_path != path


class Policy:
    recurrent = False

    def sample(self, obs):
        return torch.tanh(obs[:, :1]), None


def never(states):
    return torch.zeros(len(states), dtype=torch.bool)


@pytest.fixture(scope="module")
def dynamics(fitted):
    model = GaussianEnsembleDynamics(3, 1, DynamicsConfig(ensemble_size=3, num_elites=2, hidden_size=16, max_epochs=3,
                                                          batch_size=64))
    model.fit(fitted[0], progress=False)
    return model


def real_rows(data) -> dict:
    return {k: torch.as_tensor(getattr(data, k)) for k in ("observations", "actions", "rewards", "next_observations",
                                                           "terminals", "timeouts")}


def test_rollouts_store_the_refiners_steps(fitted, dynamics):
    """Each step's stored transition is what the refiner returns for the model's prediction."""
    data, _ = fitted
    seen = []

    class Marking:
        def refine(self, obs, act, next_obs, rewards, generator=None, samples=None):
            seen.append(next_obs)
            return {"next_observations": next_obs + 1.0, "rewards": rewards - 7.0}

    config = RolloutConfig(horizon=3, rollouts_per_epoch=16, refiner=RefinerConfig(enabled=True))
    batch, _ = BranchedRollouts(dynamics, never, config, Marking()).generate(Policy(), real_rows(data),
                                                                              torch.Generator().manual_seed(0))
    first = batch["next_observations"][:16]
    assert torch.allclose(first, seen[0] + 1.0)
    assert torch.allclose(batch["observations"][16:32], first)  # the rollout continues from the refined state
    plain, _ = BranchedRollouts(dynamics, never, replace(config, refiner=RefinerConfig())).generate(
        Policy(), real_rows(data), torch.Generator().manual_seed(0))
    assert torch.allclose(batch["rewards"][:16], plain["rewards"][:16] - 7.0)  # the same draws, then refined


def test_the_refiners_spread_is_a_penalty_and_a_halt(fitted, dynamics):
    data, refiner = fitted
    config = RolloutConfig(horizon=4, rollouts_per_epoch=64, penalty="refiner", penalty_coef=2.0, halt="refiner",
                           pessimism_coef=5.0, refiner=refiner.config)
    rollouts = BranchedRollouts(dynamics, never, config, refiner)
    real = real_rows(data)
    batch, stats = rollouts.generate(Policy(), real, torch.Generator().manual_seed(0))
    assert {"refiner", "model_rewards"} <= batch.keys() and "usad" not in batch
    assert torch.allclose(batch["rewards"], batch["model_rewards"] - 2.0 * batch["refiner"])
    # the threshold: by USAD's rule, the largest spread over the real rows / pessimism_coef
    assert stats["refiner_threshold"] == pytest.approx(refiner_threshold(
        dynamics, refiner, real["observations"], real["actions"], 5.0, torch.Generator().manual_seed(0)), rel=1e-6)
    over = batch["refiner"] > rollouts.threshold
    assert bool(batch["terminals"][over].all()) and bool(over.any())
    assert not bool(batch["terminals"][~over].any())  # nothing else ends them here (never terminates)


def test_without_a_refiner_the_setting_is_refused():
    with pytest.raises(ConfigError, match="no refiner was given"):
        BranchedRollouts(None, None, RolloutConfig(refiner=RefinerConfig(enabled=True)))


def run(*overrides, tmp_path):
    env = {**os.environ, "MBRL_OFFLINE_CACHE": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, str(ROOT / "examples" / "train.py"), *overrides], capture_output=True,
                          text=True, timeout=300, env=env, cwd=tmp_path)


@pytest.mark.parametrize("overrides, message", [
    (["generator.rollout.refiner.enabled=true", "generator.rollout.refiner.steps=0"],
     "error: refiner.steps must be at least 1, got 0."),
    (["generator.rollout.refiner.sigma_min=1.5"], "error: refiner.sigma_min must be in (0, 1), got 1.5."),
    (["generator.rollout.refiner.sigma_min=0"], "error: refiner.sigma_min must be in (0, 1), got 0.0."),
    (["generator.rollout.refiner.start=paper"], "error: unknown refiner.start 'paper'; choose one of ensemble, own."),
    (["generator.rollout.penalty=refiner", "generator.rollout.penalty_coef=1"],
     "error: rollout.penalty=refiner reads the spread of the refiner's samples, and this refiner gives none; set "
     "rollout.refiner.enabled=true and rollout.refiner.samples to 2 or more."),
    (["generator.rollout.refiner.enabled=true", "generator.true_dynamics=true"],
     "error: generator.rollout.refiner refines a learned model's predictions, and generator.true_dynamics=true rolls "
     "out in the simulator; set one of them to false."),
])
def test_bad_refiner_settings_are_one_line_before_anything_is_fitted(tmp_path, overrides, message):
    result = run("algo=mopo", "env=pendulum", *overrides, f"trainer.run_dir={tmp_path / 'run'}", tmp_path=tmp_path)
    assert result.returncode == 2 and result.stderr.strip() == message, result.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache").exists()


def test_the_command_line_trains_with_a_refiner_in_rollouts_and_in_the_posterior(tmp_path):
    tiny = ["env=pendulum", "trainer.epochs=1", "trainer.updates_per_epoch=5", "trainer.eval_episodes=1",
            "trainer.progress=false", "torch_threads=1"]
    result = run("algo=mopo", *tiny, "algo.num_critics=2", "algo.hidden_size=16",
                 "generator.rollout.rollouts_per_epoch=32", "generator.dynamics.hidden_size=16",
                 "generator.dynamics.max_epochs=2", "generator.dynamics.min_epochs=0", "generator.every=5",
                 "generator.rollout.refiner.enabled=true", "generator.rollout.refiner.samples=2",
                 "generator.rollout.refiner.updates=50", f"trainer.run_dir={tmp_path / 'run'}", tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert list((tmp_path / "cache" / "refiner").glob("pendulum-*.pt"))
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text()
    assert '"refiner_mean"' in metrics
    result = run("algo=neubay", *tiny, "algo.d_model=16", "algo.d_hidden=16", "algo.head_hidden=16",
                 "generator.dynamics.hidden_size=16",
                 "generator.dynamics.max_epochs=2", "generator.dynamics.min_epochs=0",
                 "generator.dynamics.ensemble_size=4", "generator.dynamics.num_elites=2",
                 "generator.posterior.parallel=4", "generator.posterior.refiner.enabled=true",
                 "generator.posterior.refiner.updates=50", f"trainer.run_dir={tmp_path / 'run2'}", tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "final normalised score" in result.stdout


def test_the_learning_cases_take_a_refiner_on_their_generator():
    """`benchmarks/learning_seeds.py --refiner` runs the learning cases with their model steps refined."""
    from test_learning import CASES, with_refiner

    refiner = RefinerConfig(enabled=True, sigma_min=0.01)
    posterior = with_refiner(CASES["neubay"][1]()[1], refiner)
    assert posterior.posterior.refiner == refiner
    rollouts = with_refiner(CASES["mopo"][1]()[1], refiner)
    assert rollouts.rollout.refiner == refiner and rollouts.rollout.horizon == CASES["mopo"][1]()[1].rollout.horizon
    with pytest.raises(ValueError, match="steps no dynamics model"):
        with_refiner(CASES["td3bc"][1]()[1], refiner)
