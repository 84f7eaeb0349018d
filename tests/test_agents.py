"""MOPO, MOBILE and COPlanner wiring: configs, penalties, schedules, true dynamics, CLI names."""
import dataclasses

import pytest
import torch

from mbrl_offline import load_dataset
from mbrl_offline.algorithms import ALGORITHMS, MOBILE, MOBILEConfig, MOPO, COPlanner, COPlannerConfig, MOPOConfig, RAVL
from mbrl_offline.errors import ConfigError
from mbrl_offline.buffer import MixingConfig
from mbrl_offline.generators import build_generator
from mbrl_offline.models.true_dynamics import TrueDynamics
from tests.test_rollouts import constant_model


def test_the_model_based_agents_are_registered_with_their_published_generators():
    assert all(ALGORITHMS[cls.name][0] is cls for cls in (RAVL, MOPO, MOBILE, COPlanner))
    assert MOPO.published_generator().rollout.penalty == "aleatoric" and MOPOConfig().num_critics == 2
    assert COPlanner.published_generator().rollout.planner == "upmpc"
    assert COPlanner.published_generator().rollout.upmpc.candidates == 5
    assert MOBILEConfig().deterministic_backup and MOBILE.published_generator().rollout.penalty == "none"
    assert MOBILE.published_generator().rollout.horizon == 1 and MOBILE.published_generator().dynamics.max_epochs == 30
    for generator in (RAVL, MOPO, MOBILE, COPlanner):  # one generation per 1000 updates, 5% real rows
        published = generator.published_generator()
        assert (published.every, published.mixing.rule, published.mixing.real_ratio) == (1000, "fraction", 0.05)


class FirstCoordinateCritic(torch.nn.Module):
    """min_j Q(s, a) = s_0 for every critic: a value whose spread over members is known."""

    def forward(self, obs, action):
        return obs[:, 0].expand(2, -1)


def mobile_agent(**settings):
    model = constant_model(obs_dim=3, act_dim=1, members=4, elites=(0, 2))  # deltas +1 and +3 per elite
    config = MOBILEConfig(**{"hidden_size": 16, "target_floor": None, **settings})
    agent = MOBILE(3, 1, [-1.0], [1.0], config, dynamics=model)
    agent.target_critic = FirstCoordinateCritic()
    return agent


def test_mobile_penalises_the_targets_of_model_rows_only():
    agent = mobile_agent(penalty_coef=2.0, num_samples=10)
    batch = {"observations": torch.zeros(6, 3), "actions": torch.zeros(6, 1), "rewards": torch.ones(6),
             "next_observations": torch.zeros(6, 3), "terminals": torch.zeros(6, dtype=torch.bool),
             "synthetic": torch.tensor([False, False, True, True, True, True])}
    target = agent.critic_target(batch, torch.tensor(0.1))
    # Unpenalised: r + gamma * s'_0 = 1 (deterministic backup: no entropy term). The elites' next
    # states have s'_0 = 1 and 3: mean values 1 and 3, unbiased std sqrt(2), times beta = 2.
    torch.testing.assert_close(target[:2], torch.ones(2))
    torch.testing.assert_close(target[2:], torch.full((4,), 1.0 - 2.0 * 2 ** 0.5), atol=1e-4, rtol=0)
    floored = mobile_agent(penalty_coef=2.0, target_floor=0.0).critic_target(batch, torch.tensor(0.1))
    assert (floored[2:] == 0).all() and (floored[:2] == 1).all()


def test_mobile_penalty_vanishes_under_the_true_dynamics():
    agent = MOBILE(3, 1, [-2.0], [2.0], MOBILEConfig(hidden_size=16), dynamics=TrueDynamics("pendulum"))
    obs = torch.tensor([[1.0, 0.0, 0.5], [0.0, 1.0, -1.0]])
    assert (agent.bellman_uncertainty(obs, torch.zeros(2, 1)) == 0).all()


def test_actor_learning_rate_follows_the_cosine_schedule():
    agent = MOPO(3, 1, [-1.0], [1.0], MOPOConfig(hidden_size=16))
    agent.on_epoch_end(50, 100)
    assert agent.actor_optim.param_groups[0]["lr"] == pytest.approx(0.5e-4)
    agent.on_epoch_end(100, 100)
    assert agent.actor_optim.param_groups[0]["lr"] == pytest.approx(0.0)
    ravl = RAVL(3, 1, [-1.0], [1.0])
    ravl.on_epoch_end(50, 100)
    assert ravl.actor_optim.param_groups[0]["lr"] == ravl.config.actor_lr  # RAVL keeps a constant rate


def test_true_dynamics_replace_the_learned_model_by_config(tmp_path):
    data = load_dataset("pendulum-medium").subset(range(500))
    config = dataclasses.replace(COPlanner.published_generator(), true_dynamics=True)
    generator = build_generator(config, data, cache_dir=tmp_path, progress=False)
    assert isinstance(generator.dynamics, TrueDynamics) and not any(tmp_path.iterdir())  # nothing trained
    agent = COPlanner.for_dataset(data, COPlannerConfig(hidden_size=16))
    batch, stats = generator.rollouts.rollout(agent.policy, torch.as_tensor(data.observations[:20]))
    assert len(batch["rewards"]) == 100 and stats["aleatoric_mean"] == 0.0


def test_bad_agent_settings_are_rejected():
    with pytest.raises(ConfigError, match="penalty_coef"):
        MOBILEConfig(penalty_coef=-1.0)
    with pytest.raises(ConfigError, match="real_ratio"):
        MixingConfig(real_ratio=1.5)
