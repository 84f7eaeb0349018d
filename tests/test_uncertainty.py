"""Uncertainty estimators, penalised and UP-MPC-planned rollouts, and the true-dynamics model."""
import numpy as np
import pytest
import torch

from mbrl_offline.data.envs import get_env_info
from mbrl_offline.errors import ConfigError
from mbrl_offline.generators import BranchedRollouts, RolloutConfig, UPMPCConfig, upmpc_actions
from mbrl_offline.data.termination import never
from mbrl_offline.models.true_dynamics import TrueDynamics
from mbrl_offline.policies import FunctionPolicy
from mbrl_offline.models.uncertainty import (bellman_target_spread, max_aleatoric_std, mean_disagreement,
                                             sample_members, sampled_disagreement)
from tests.test_rollouts import constant_model


def test_estimators_on_a_hand_built_ensemble():
    # 3 members, 2 rows, outputs [delta_0, delta_1, reward].
    mean = torch.tensor([[[0.0, 0.0, 1.0], [1.0, 1.0, 1.0]],
                         [[2.0, 0.0, 1.0], [1.0, 1.0, 1.0]],
                         [[4.0, 0.0, 1.0], [1.0, 1.0, 1.0]]])
    std = torch.tensor([[[1.0, 0.0, 0.0], [0.1, 0.1, 0.1]],
                        [[3.0, 4.0, 0.0], [0.1, 0.1, 0.1]],
                        [[0.0, 2.0, 0.0], [0.1, 0.1, 0.1]]])
    logvar = 2 * std.log()
    # Row 1: member 1's std (3, 4, 0) has the largest norm, 5; row 2: every member's is sqrt(3 * 0.01).
    torch.testing.assert_close(max_aleatoric_std(logvar), torch.tensor([5.0, 0.03 ** 0.5]))
    # Means {0, 2, 4} in delta_0: population std sqrt(8/3); delta_1 agrees; row 2 agrees everywhere.
    torch.testing.assert_close(mean_disagreement(mean), torch.tensor([(8 / 3) ** 0.5, 0.0]))
    # Samples equal to the means: COPlanner's u averages the std over all 3 outputs.
    torch.testing.assert_close(sampled_disagreement(mean), torch.tensor([(8 / 3) ** 0.5 / 3, 0.0]))
    # Sampling: the per-member std is the predicted one.
    many = sample_members(mean, logvar, torch.Generator().manual_seed(0), samples=20_000)
    assert many.shape == (3, 20_000, 2, 3)
    torch.testing.assert_close(many.std(dim=1), std, atol=0.03, rtol=0.03)


def test_bellman_target_spread_is_the_std_over_members_of_mean_values():
    # 2 members x 2 samples x 1 row, 1-D states; value(s) = s.
    next_obs = torch.tensor([[[[1.0]], [[3.0]]], [[[5.0]], [[7.0]]]])
    spread = bellman_target_spread(next_obs, lambda s: s[:, 0])
    torch.testing.assert_close(spread, torch.tensor([8.0 ** 0.5]))  # means 2 and 6, unbiased std
    assert bellman_target_spread(next_obs[:1], lambda s: s[:, 0]).item() == 0.0  # one member: no spread


def test_reward_penalty_is_subtracted_from_stored_rewards():
    model = constant_model()  # members predict reward 1..4 with std exp(-12.5)
    with torch.no_grad():
        model.max_logvar[1] = 10.0  # member 1 (not an elite) may predict a large variance: std 0.5 everywhere
        model.head.bias[1, 0, 4:] = 2 * torch.tensor(0.5).log()
    config = RolloutConfig(horizon=1, rollouts_per_epoch=1000, penalty="aleatoric", penalty_coef=2.0)
    batch, stats = BranchedRollouts(model, never, config).rollout(FunctionPolicy(lambda o: torch.zeros(len(o), 1)),
                                                            torch.zeros(1000, 3))
    # MOPO's max over all members: member 1's norm over 4 outputs, 0.5 * 2 = 1; stored r = model r - 2.
    assert set(batch["rewards"].round().tolist()) == {-1.0, 1.0}  # elites 0 and 2 predict 1 and 3
    assert abs(stats["model_rewards_mean"] - stats["reward_mean"] - 2.0) < 1e-3


def test_bad_rollout_settings_are_rejected():
    with pytest.raises(ConfigError, match="rollout.penalty"):
        RolloutConfig(penalty="mopo")
    with pytest.raises(ConfigError, match="rollout.planner"):
        RolloutConfig(planner="cem")
    with pytest.raises(ConfigError, match="upmpc"):
        UPMPCConfig(candidates=0)


class TwoActionModel:
    """A hand-built 'ensemble' for UP-MPC: reward 1 for every action; action a > 0 leads the members
    to disagree by a (their means are -a, 0, +a), action a <= 0 keeps them in agreement."""

    elites = torch.tensor([1])  # the middle member, so the followed state does not drift

    def predict(self, obs, act, elites_only=False):
        spread = act[:, :1].clamp(min=0)
        delta = torch.stack([-spread, torch.zeros_like(spread), spread]).expand(3, len(obs), obs.shape[1])
        mean = torch.cat([delta, torch.ones(3, len(obs), 1)], dim=-1)
        return mean, torch.full_like(mean, -40.0)


def test_upmpc_prefers_the_candidate_with_lower_uncertainty_when_rewards_are_equal():
    # 50 states, K = 2 candidates (rows candidate-major): the risky action (+1) is candidate 0 for the
    # first 25 states and candidate 1 for the others; later planning actions are 0 (no disagreement).
    risky_first = torch.cat([torch.ones(25, 1), -torch.ones(25, 1)])
    calls = []

    def policy(obs):
        calls.append(len(obs))
        return torch.cat([risky_first, -risky_first]) if len(calls) == 1 else torch.zeros(len(obs), 1)

    config = UPMPCConfig(candidates=2, horizon=3)
    chosen = upmpc_actions(TwoActionModel(), policy, torch.zeros(50, 2), config, torch.Generator().manual_seed(0))
    assert chosen.shape == (50, 1) and (chosen == -1.0).all() and calls == [100, 100, 100]
    # Without the uncertainty weight both score the same and argmax keeps candidate 0.
    calls.clear()
    neutral = upmpc_actions(TwoActionModel(), policy, torch.zeros(50, 2),
                            UPMPCConfig(candidates=2, horizon=3, uncertainty_weight=0.0))
    torch.testing.assert_close(neutral, risky_first)


def test_upmpc_rollouts_store_planned_actions():
    model = constant_model()
    config = RolloutConfig(horizon=2, rollouts_per_epoch=64, planner="upmpc",
                           upmpc=UPMPCConfig(candidates=3, horizon=2))
    calls = []

    def policy(obs):
        calls.append(len(obs))
        return torch.randn(len(obs), 1)

    batch, stats = BranchedRollouts(model, never, config).rollout(FunctionPolicy(policy), torch.zeros(64, 3),
                                                            torch.Generator().manual_seed(0))
    assert len(batch["rewards"]) == 128 and stats["mean_length"] == 2.0
    assert calls == [192, 192] * 2  # per stored step: K*B first actions, then one policy call per later planning step


def collected_transitions(env_name: str, steps: int = 150, seed: int = 0):
    """(obs, act, next_obs, reward) from the real env with random actions, resetting at terminations."""
    env = get_env_info(env_name).make()
    obs, _ = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    rows = []
    for t in range(steps):
        act = rng.uniform(env.action_space.low, env.action_space.high) * 0.3
        next_obs, reward, terminated, truncated, _ = env.step(act)
        rows.append((obs, act, next_obs, reward))
        obs = next_obs if not (terminated or truncated) else env.reset(seed=seed + t + 1)[0]
    return [np.array(column) for column in zip(*rows)]


@pytest.mark.parametrize("env_name", ["hopper", "walker2d", "halfcheetah", "pendulum"])
def test_true_dynamics_match_env_step(env_name):
    obs, act, next_obs, reward = collected_transitions(env_name)
    model = TrueDynamics(env_name)
    out = model.step(torch.as_tensor(obs, dtype=torch.float64), torch.as_tensor(act, dtype=torch.float64), uncertainty=True)
    exact = np.ones(len(obs), bool)
    if env_name in ("hopper", "walker2d"):  # velocities beyond +-10 are clipped in the observation
        exact = (np.abs(obs[:, 5 if env_name == "hopper" else 8:]) < 10).all(1)
    assert exact.mean() > 0.5
    np.testing.assert_allclose(out["next_observations"].numpy()[exact], next_obs[exact], atol=1e-6, rtol=0)
    np.testing.assert_allclose(out["rewards"].numpy()[exact], reward[exact], atol=1e-6, rtol=0)
    assert (out["aleatoric"] == 0).all() and (out["disagreement"] == 0).all() and (out["epistemic"] == 0).all()
    mean, logvar = model.predict(torch.as_tensor(obs[:4]), torch.as_tensor(act[:4]))
    assert mean.shape == (1, 4, obs.shape[1] + 1) and max_aleatoric_std(logvar).eq(0).all()


def test_true_dynamics_reject_envs_without_a_state_from_observations():
    with pytest.raises(ConfigError, match="true dynamics"):
        TrueDynamics("ant")
