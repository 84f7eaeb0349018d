"""Model steps, branched rollouts and the real/synthetic batch mix."""
import pytest
import torch

from mbrl_offline.buffer import Mixing, MixingConfig, TransitionBuffer
from mbrl_offline.generators import BranchedRollouts, RolloutConfig
from mbrl_offline.models.dynamics import DynamicsConfig, GaussianEnsembleDynamics
from mbrl_offline.data.termination import hopper, never
from mbrl_offline.errors import ConfigError
from mbrl_offline.policies import FunctionPolicy


def constant_model(obs_dim=3, act_dim=1, members=4, elites=(0, 2)):
    """Member m predicts delta = m + 1 in every dimension and reward m + 1, with tiny variance."""
    model = GaussianEnsembleDynamics(obs_dim, act_dim, DynamicsConfig(ensemble_size=members, num_elites=len(elites),
                                                                      hidden_size=8, hidden_layers=1,
                                                                      weight_decay=(0.0, 0.0), logvar_bounds="member"))
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.max_logvar.fill_(-20.0)
        model.min_logvar.fill_(-30.0)
        model.head.bias[:, 0, :obs_dim + 1] = torch.arange(1, members + 1, dtype=torch.float32)[:, None]
        model.head.bias[:, 0, obs_dim + 1:] = -25.0
        model.elites.copy_(torch.tensor(elites))
    model.mark_fitted()  # weights set by hand: it predicts as a fitted model would
    return model


def test_step_uses_a_uniformly_random_elite_per_row_and_matches_the_all_member_path(device):
    model = constant_model().to(device)
    obs, act = torch.zeros(20_000, 3, device=device), torch.zeros(20_000, 1, device=device)
    grouped = model.step(obs, act, torch.Generator(device).manual_seed(0))
    full = model.step(obs, act, torch.Generator(device).manual_seed(0), uncertainty=True)
    grouped, full = ({k: v.cpu() for k, v in out.items()} for out in (grouped, full))
    torch.testing.assert_close(grouped["next_observations"], full["next_observations"])
    torch.testing.assert_close(grouped["rewards"], full["rewards"])
    members = grouped["rewards"].round()
    assert set(members.unique().tolist()) == {1.0, 3.0}  # elites 0 and 2 only
    assert abs((members == 1.0).float().mean().item() - 0.5) < 0.02
    torch.testing.assert_close(grouped["next_observations"], members[:, None].expand(-1, 3), atol=1e-4, rtol=0)
    # Uncertainty is measured over all 4 members, {1, 2, 3, 4}: population std sqrt(1.25) per dim.
    assert torch.allclose(full["epistemic"], torch.full((20_000,), (3 * 1.25) ** 0.5))
    assert torch.allclose(full["disagreement"], torch.full((20_000,), 1.25 ** 0.5), atol=1e-3)
    assert torch.allclose(full["aleatoric"], torch.full((20_000,), (4 * torch.tensor(-25.0).exp()) ** 0.5))


def test_rollouts_run_horizon_steps_and_stop_at_terminals(device):
    model = constant_model(obs_dim=11, act_dim=3, elites=(0,)).to(device)  # every step adds 1 to each dim
    policy = lambda obs: torch.zeros(len(obs), 3, device=device)  # noqa: E731
    starts = torch.zeros(100, 11, device=device)
    starts[:50, 0] = 1.25  # hopper height healthy ...
    starts[:50, 1] = -1.0  # ... angle becomes 0 after one step, 1 after two: terminal at step 2
    starts[50:, 0] = -5.0  # height -4 after one step: terminal at step 1
    rollouts = BranchedRollouts(model, hopper, RolloutConfig(horizon=5, rollouts_per_epoch=100))
    batch, stats = rollouts.rollout(FunctionPolicy(policy), starts)
    assert len(batch["rewards"]) == 50 * 2 + 50 * 1 and stats["terminated_fraction"] == 1.0
    assert batch["terminals"].sum() == 100 and not batch["timeouts"].any()

    free = BranchedRollouts(model, never, RolloutConfig(horizon=5, rollouts_per_epoch=100))
    batch, stats = free.rollout(FunctionPolicy(policy), starts)
    assert len(batch["rewards"]) == 500 and stats["mean_length"] == 5.0 and not batch["terminals"].any()
    torch.testing.assert_close(batch["next_observations"][400:], starts[:100] + 5, atol=1e-4, rtol=0)


def test_non_finite_model_predictions_are_dropped():
    model = constant_model()
    with torch.no_grad():
        model.head.bias[0, 0, 0] = float("nan")
    rollouts = BranchedRollouts(model, never, RolloutConfig(horizon=3, rollouts_per_epoch=1000))
    batch, _ = rollouts.rollout(FunctionPolicy(lambda obs: torch.zeros(len(obs), 1)), torch.zeros(1000, 3),
                                torch.Generator().manual_seed(0))
    assert torch.isfinite(batch["next_observations"]).all() and 0 < len(batch["rewards"]) < 1500


def test_start_states_are_drawn_without_replacement():
    rollouts = BranchedRollouts(constant_model(), never, RolloutConfig(rollouts_per_epoch=500))
    data = torch.arange(1000, dtype=torch.float32)[:, None].expand(-1, 3)
    starts = rollouts.sample_starts(data, torch.Generator().manual_seed(0))
    assert len(starts) == 500 and len(starts[:, 0].unique()) == 500


def fill(buffer: TransitionBuffer, reward: float, n: int) -> None:
    buffer.add(observations=torch.zeros(n, 2), actions=torch.zeros(n, 1), rewards=torch.full((n,), reward),
               next_observations=torch.zeros(n, 2), terminals=torch.zeros(n, dtype=torch.bool),
               timeouts=torch.zeros(n, dtype=torch.bool))  # from the CPU, as the trainer adds a dataset


def test_mixed_batches_take_the_real_ratio_from_real_data(device):
    real, synthetic = TransitionBuffer(100, 2, 1, device), TransitionBuffer(100, 2, 1, device)
    fill(real, 1.0, 100)
    mixing = Mixing(MixingConfig(rule="fraction", real_ratio=0.05))
    assert (mixing.sample(real, synthetic, 256)["rewards"] == 1).all()  # nothing synthetic yet: all real
    fill(synthetic, -1.0, 100)
    batch = mixing.sample(real, synthetic, 256, torch.Generator(device).manual_seed(0))
    assert batch["rewards"].device.type == device
    assert (batch["rewards"] == 1).sum() == 12 and (batch["rewards"] == -1).sum() == 244  # int(0.05 * 256) as RAVL
    assert torch.equal(batch["synthetic"], batch["rewards"] == -1)  # MOBILE penalises these rows only
    only_synthetic = Mixing(MixingConfig(real_ratio=0.0)).sample(real, synthetic, 64)
    assert (only_synthetic["rewards"] == -1).all() and only_synthetic["synthetic"].all()
    assert (Mixing(MixingConfig(real_ratio=1.0)).sample(real, synthetic, 64)["rewards"] == 1).all()


def test_fixed_counts_mixing_takes_the_same_rows_every_batch(device):
    """Policy-guided diffusion's rule: 16 real and 240 synthetic rows, whatever the buffers' sizes."""
    real, synthetic = TransitionBuffer(10, 2, 1, device), TransitionBuffer(1000, 2, 1, device)
    fill(real, 1.0, 10)
    fill(synthetic, -1.0, 1000)
    batch = Mixing(MixingConfig(rule="counts", real_rows=16)).sample(real, synthetic, 256)
    assert (batch["rewards"][:16] == 1).all() and (batch["rewards"][16:] == -1).all() and len(batch["rewards"]) == 256
    assert int(batch["synthetic"].sum()) == 240
    with pytest.raises(ConfigError, match="mixing.real_rows = 300 is more than the batch of 256"):
        Mixing(MixingConfig(rule="counts", real_rows=300)).sample(real, synthetic, 256)


def test_step_takes_each_rows_member_from_the_caller(device):
    model = constant_model(members=4, elites=(0, 2)).to(device)
    obs, act = torch.zeros(6, 3, device=device), torch.zeros(6, 1, device=device)
    members = torch.tensor([3, 1, 3, 0, 1, 3], device=device)  # not only elites: any member
    for uncertainty in (False, True):
        out = model.step(obs, act, torch.Generator(device).manual_seed(0), uncertainty=uncertainty, members=members)
        assert out["member"].tolist() == members.tolist()
        torch.testing.assert_close(out["rewards"].cpu(), (members + 1).float().cpu(), atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="one index per row"):
        model.step(obs, act, members=members[:3])


@pytest.mark.parametrize("member", ["step", "rollout"])
def test_rollouts_keep_the_member_of_each_row_and_can_fix_it_per_rollout(member, device):
    model = constant_model(members=4, elites=(0, 1, 2, 3)).to(device)
    policy = FunctionPolicy(lambda obs: torch.zeros(len(obs), 1, device=device))
    rollouts = BranchedRollouts(model, never, RolloutConfig(horizon=6, rollouts_per_epoch=500, member=member))
    batch, _ = rollouts.rollout(policy, torch.zeros(500, 3, device=device), torch.Generator(device).manual_seed(0))
    assert set(rollouts.config.extra_fields) == {"member"}
    by_step = batch["member"].view(6, 500).cpu()  # no terminals: step t holds rows t * 500 ... of every rollout
    torch.testing.assert_close(batch["rewards"].cpu(), (batch["member"] + 1).float().cpu(), atol=1e-4, rtol=0)
    same_member = (by_step == by_step[0]).all(0).float().mean().item()
    assert same_member == 1.0 if member == "rollout" else same_member < 0.01  # (1/4)^5 of rollouts by chance
    with pytest.raises(ConfigError, match="rollout.member"):
        RolloutConfig(member="episode")


def test_rollouts_keep_their_uncertainties_as_extra_fields(device):
    model = constant_model(members=4, elites=(0, 2)).to(device)
    policy = FunctionPolicy(lambda obs: torch.zeros(len(obs), 1, device=device))
    config = RolloutConfig(horizon=2, rollouts_per_epoch=50, penalty="disagreement", penalty_coef=0.5)
    batch, stats = BranchedRollouts(model, never, config).rollout(policy, torch.zeros(50, 3, device=device))
    assert set(config.extra_fields) == {"member", "aleatoric", "disagreement", "epistemic", "model_rewards"}
    assert set(batch) == {"observations", "actions", "rewards", "next_observations", "terminals", "timeouts",
                          *config.extra_fields}
    torch.testing.assert_close(batch["rewards"], batch["model_rewards"] - 0.5 * batch["disagreement"])
    assert stats["disagreement_mean"] == pytest.approx(batch["disagreement"].mean().item())
    buffer = TransitionBuffer(100, 3, 1, device, extra_fields=config.extra_fields)
    buffer.add(**batch)  # the synthetic buffer keeps them
    assert buffer.sample(10)["member"].dtype == torch.long
