"""MOReL: the pessimistic MDP (USAD halting in the rollout generator) and the NPG planner's parts."""
import itertools

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
