"""NEUBAY's recurrent SAC (mbrl_offline.algorithms.neubay) against hand computations: the critic target,
the kappa-weighted Huber loss on a hand-built tape, the row masks, per-group gradient cleaning and
clipping, the cosine schedules, alpha, the order of the steps, Polyak averaging, initialisation, the
episode policy and the policy role."""
import copy
import math

import numpy as np
import pytest
import torch

from mbrl_offline.algorithms.neubay import NEUBAY, NEUBAYConfig, history_inputs, loss_weights, tape_inputs
from mbrl_offline.errors import ConfigError, InputError
from mbrl_offline.utils import clean_and_clip, cosine_decay

S, A = 3, 2


def small_config(**over) -> NEUBAYConfig:
    values = dict(batch_size=7, d_model=16, d_hidden=8, head_hidden=16, num_critics=4, sampled_critics=2,
                  encoder_lr=1e-3, critic_head_lr=1e-3, actor_head_lr=1e-3, alpha_lr=1e-2)
    values.update(over)
    return NEUBAYConfig(**values)


def make_agent(seed: int = 0, low=-1.0, high=1.0, obs_dim: int = S, act_dim: int = A, **over) -> NEUBAY:
    torch.manual_seed(seed)
    return NEUBAY(obs_dim, act_dim, np.full(act_dim, low), np.full(act_dim, high), small_config(**over))


def kappa_weights(starts: torch.Tensor, synthetic: torch.Tensor, kappa: float) -> torch.Tensor:
    """The tape mixing rule's weights (the spine's `Mixing(rule="tape")`), written out for the tests."""
    mask = torch.zeros(len(starts))
    mask[:-1] = (~starts[1:]).float()
    real = (~synthetic).float()
    real_sum, synthetic_sum = (mask * real).sum().clamp_min(1), (mask * (1 - real)).sum().clamp_min(1)
    return mask * (kappa * real / real_sum + (1 - kappa) * (1 - real) / synthetic_sum)


def hand_tape(kappa: float = 0.3, seed: int = 0) -> dict[str, torch.Tensor]:
    """Two episodes: a real one of 3 transitions (the last terminal) and its final-observation row,
    then a synthetic one cut after 3 rows: T = 7."""
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(7, S, generator=g)
    actions = torch.rand(7, A, generator=g) * 2 - 1
    rewards = torch.randn(7, generator=g)
    next_obs = torch.randn(7, S, generator=g)
    obs[3], actions[3], rewards[3] = next_obs[2], actions[2], rewards[2]  # the final row copies its last row
    next_obs[3] = next_obs[2]
    starts = torch.tensor([True, False, False, False, True, False, False])
    synthetic = torch.tensor([False, False, False, False, True, True, True])
    terminals = torch.tensor([False, False, True, True, False, False, False])
    tape = {"observations": obs, "actions": actions, "rewards": rewards, "next_observations": next_obs,
            "terminals": terminals, "timeouts": torch.zeros(7, dtype=torch.bool), "starts": starts,
            "final": torch.tensor([False, False, False, True, False, False, False]), "synthetic": synthetic,
            "observed_rewards": rewards + 0.5}
    tape["weights"] = kappa_weights(starts, synthetic, kappa)
    return tape


def huber(x):
    return torch.where(x.abs() < 1, 0.5 * x * x, x.abs() - 0.5)


def test_tape_inputs_shift_the_previous_action_and_observed_reward():
    tape = hand_tape()
    x = tape_inputs(tape)
    assert x.shape == (7, S + A + 1)
    for k in range(7):
        torch.testing.assert_close(x[k, :S], tape["observations"][k])
        if tape["starts"][k]:
            assert (x[k, S:] == 0).all()
        else:
            torch.testing.assert_close(x[k, S:S + A], tape["actions"][k - 1])
            torch.testing.assert_close(x[k, -1], tape["observed_rewards"][k - 1])  # raw, not the TD reward
    without = {k: v for k, v in tape.items() if k != "observed_rewards"}
    torch.testing.assert_close(tape_inputs(without)[2, -1], tape["rewards"][1])
    torch.testing.assert_close(history_inputs(torch.ones(2, S), torch.ones(2, A), torch.ones(2), torch.tensor([True, False])),
                               torch.tensor([[1.0] * S + [0.0] * (A + 1), [1.0] * (S + A + 1)]))


def test_critic_target_with_fixed_heads_matches_the_formula():
    agent = make_agent()
    tape = hand_tape()
    x = tape_inputs(tape)
    next_actions = torch.rand(6, A) * 2 - 1
    next_log_prob = torch.randn(6)
    heads = torch.tensor([3, 1])
    alpha = torch.tensor(0.3)
    target = agent.critic_target(x, tape, next_actions, next_log_prob, heads, alpha)
    with torch.no_grad():  # every target head on every row, by the heads' own layers
        features, _ = agent.target_critic.encoder(x, tape["starts"])
        q_all = agent.target_critic.heads(torch.cat([features[1:], next_actions], -1)).squeeze(-1)  # (N, 6)
    soft = torch.minimum(q_all[3], q_all[1]) - 0.3 * next_log_prob
    expected = tape["rewards"][:-1] + 0.99 * (1 - tape["terminals"][:-1].float()) * soft
    torch.testing.assert_close(target, expected)
    assert target[2] == tape["rewards"][2]  # terminal: no bootstrap and no entropy term
    no_entropy = make_agent(backup_entropy=False)
    no_entropy.target_critic.load_state_dict(agent.target_critic.state_dict())
    torch.testing.assert_close(no_entropy.critic_target(x, tape, next_actions, next_log_prob, heads, alpha),
                               tape["rewards"][:-1] + 0.99 * (1 - tape["terminals"][:-1].float())
                               * torch.minimum(q_all[3], q_all[1]))


def test_target_heads_are_two_distinct_heads_drawn_afresh():
    agent = make_agent(num_critics=10)
    draws = [tuple(agent.draw_heads().tolist()) for _ in range(200)]
    assert all(len(d) == 2 and d[0] != d[1] and all(0 <= i < 10 for i in d) for d in draws)
    assert len(set(frozenset(d) for d in draws)) > 20


@pytest.mark.parametrize("kappa", [0.3, 1.0])
def test_huber_kappa_loss_on_a_hand_built_tape(kappa):
    agent = make_agent()
    tape = hand_tape(kappa)
    x = tape_inputs(tape)
    target = torch.randn(6) * 3  # some rows beyond the Huber's quadratic zone
    weights = loss_weights(tape)
    loss, per_row, q = agent.critic_loss(x, tape, target, weights)
    with torch.no_grad():
        features, _ = agent.critic.encoder(x, tape["starts"])
        q_hand = agent.critic.heads(torch.cat([features[:-1], tape["actions"][:-1]], -1)).squeeze(-1)
    row_loss = huber(q_hand - target).mean(0)  # (6,)
    # official: mask 1 - start[1:], real and imagined masked means, mixed kappa : 1 - kappa
    mask = torch.tensor([1.0, 1, 1, 0, 1, 1])
    real = torch.tensor([1.0, 1, 1, 1, 0, 0])
    real_loss = (row_loss * mask * real).sum() / (mask * real).sum()
    imagined_loss = (row_loss * mask * (1 - real)).sum() / (mask * (1 - real)).sum()
    torch.testing.assert_close(loss, kappa * real_loss + (1 - kappa) * imagined_loss)
    torch.testing.assert_close(per_row, row_loss)
    # without weights: the plain masked mean
    plain = {k: v for k, v in tape.items() if k != "weights"}
    loss_plain, _, _ = agent.critic_loss(x, plain, target, loss_weights(plain))
    torch.testing.assert_close(loss_plain, (row_loss * mask).sum() / mask.sum())


def test_rewards_at_final_and_last_rows_change_nothing():
    agent = make_agent()
    tape = hand_tape()
    changed = dict(tape)
    for field in ("rewards", "observed_rewards"):
        changed[field] = tape[field].clone()
        changed[field][3] += 100.0  # the final-observation row
        changed[field][6] -= 100.0  # the tape's last row
    runs = []
    for t in (tape, changed):
        a = copy.deepcopy(agent)
        torch.manual_seed(5)
        metrics = a.update(t)
        grads = [p.grad.clone() for p in list(a.critic.parameters()) + list(a.actor.parameters())]
        runs.append((metrics, grads, a.log_alpha.grad.clone()))
    (m1, g1, la1), (m2, g2, la2) = runs
    for key in ("critic_loss", "actor_loss", "q_mean", "entropy_real", "entropy_synthetic"):
        torch.testing.assert_close(m1[key], m2[key])
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(la1, la2)
    # and a reward inside an episode does change them (the test can fail)
    inside = dict(tape)
    inside["rewards"] = tape["rewards"].clone()
    inside["rewards"][1] += 100.0
    a = copy.deepcopy(agent)
    torch.manual_seed(5)
    assert not torch.allclose(a.update(inside)["critic_loss"], m1["critic_loss"])


def test_clean_and_clip_per_group():
    encoder = [torch.full((4,), 1000.0), torch.tensor([float("nan"), float("inf"), 0.0])]
    clean_and_clip([encoder[1]], 10.0)
    assert encoder[1][0] == 0 and torch.isnan(encoder[1][1])  # NaN -> 0; inf kept, the clip factor inf/inf
    grads = [torch.full((4,), 1000.0), torch.tensor([float("nan"), 0.0])]  # norm 2000
    norm = clean_and_clip(grads, 1000.0)
    torch.testing.assert_close(norm, torch.tensor(2000.0))
    torch.testing.assert_close(torch.linalg.vector_norm(torch.cat(grads)), torch.tensor(1000.0))
    assert grads[1][0] == 0
    small = [torch.tensor([3.0, 4.0])]
    clean_and_clip(small, 1000.0)
    torch.testing.assert_close(small[0], torch.tensor([3.0, 4.0]))


def test_agent_clips_each_parameter_group_on_its_own():
    agent = make_agent()
    encoder_params = list(agent.critic.encoder.parameters())
    head_params = list(agent.critic.heads.parameters())
    count = sum(p.numel() for p in encoder_params)
    # loss whose encoder gradient has norm 2000 (and one NaN entry), head gradient norm 5
    scale = 2000.0 / math.sqrt(count)
    nan_param = encoder_params[0]
    loss = sum((p * scale).sum() for p in encoder_params) + (head_params[0].flatten()[:2] * torch.tensor([3.0, 4.0])).sum()
    loss = loss + nan_param.flatten()[0] * float("nan")
    agent._step(agent.critic_optim, agent.critic_schedule, loss)
    encoder_grad = torch.cat([p.grad.flatten() for p in encoder_params])
    head_grad = torch.cat([p.grad.flatten() for p in head_params])
    assert encoder_grad[0] == 0  # the NaN entry
    torch.testing.assert_close(torch.linalg.vector_norm(encoder_grad), torch.tensor(1000.0), rtol=1e-5, atol=0)
    torch.testing.assert_close(encoder_grad[1:], torch.full((count - 1,), 1000.0 / math.sqrt(count - 1)), rtol=1e-4, atol=0)
    torch.testing.assert_close(head_grad[:2], torch.tensor([3.0, 4.0]))  # untouched by the encoder's clip
    assert (head_grad[2:] == 0).all()


def test_cosine_learning_rates():
    for n, factor in [(0, 1.0), (5, 0.5), (10, 0.0), (15, 0.0), (2, 0.5 * (1 + math.cos(math.pi * 0.2)))]:
        assert cosine_decay(n, 10) == pytest.approx(factor)  # the library's one schedule (mbrl_offline.utils)
        assert cosine_decay(n, 10, 0.25) == pytest.approx(0.75 * factor + 0.25)
        assert cosine_decay(n, 10, 1.0) == pytest.approx(1.0)
    unscheduled = make_agent(encoder_lr=1e-3, actor_encoder_lr=4e-3, actor_head_lr=2e-3)  # no total: constant
    unscheduled.updates = 7
    params = [p for g in unscheduled.actor_optim.param_groups for p in g["params"]]
    unscheduled._step(unscheduled.actor_optim, unscheduled.actor_schedule, sum(p.sum() for p in params))
    assert [g["lr"] for g in unscheduled.actor_optim.param_groups] == [4e-3, 2e-3]
    agent = make_agent(encoder_lr=1e-3, actor_encoder_lr=4e-3, actor_head_lr=2e-3, critic_head_lr=3e-3)
    agent.set_total_updates(10)
    for n, factor in [(0, 1.0), (5, 0.5), (10, 0.0), (15, 0.0)]:
        agent.updates = n
        params = [p for g in agent.actor_optim.param_groups for p in g["params"]]
        agent._step(agent.actor_optim, agent.actor_schedule, sum(p.sum() for p in params))
        assert [g["lr"] for g in agent.actor_optim.param_groups] == pytest.approx([4e-3 * factor, 2e-3 * factor])
        params = [p for g in agent.critic_optim.param_groups for p in g["params"]]
        agent._step(agent.critic_optim, agent.critic_schedule, sum(p.sum() for p in params))
        assert [g["lr"] for g in agent.critic_optim.param_groups] == pytest.approx([1e-3, 3e-3])  # ratio 1: constant
    fixed = make_agent(schedule_updates=4)
    fixed.set_total_updates(1000)
    assert fixed.total_updates == 4


def test_fixed_alpha_stays_and_auto_alpha_gradient():
    fixed = make_agent(target_alpha_ratio=None, init_alpha=0.2)
    metrics = fixed.update(hand_tape())
    assert fixed.alpha_optim is None and fixed.log_alpha.grad is None
    torch.testing.assert_close(fixed.alpha, torch.tensor(0.2))
    torch.testing.assert_close(metrics["alpha"], torch.tensor(0.2))

    agent = make_agent(target_alpha_ratio=0.5, init_alpha=0.2, alpha_lr=0.01)
    assert agent.target_entropy == -A * 0.5
    weights = loss_weights(hand_tape())
    entropy = torch.randn(6)
    before = agent.log_alpha.item()
    agent._alpha_step(entropy, weights)
    expected = (weights * 0.2 * (entropy - agent.target_entropy)).sum()  # d/dlog_alpha of alpha (H - H_target)
    torch.testing.assert_close(agent.log_alpha.grad, expected)
    assert agent.log_alpha.item() == pytest.approx(before - 0.01 * float(np.sign(expected)), abs=1e-6)  # Adam's first step


def test_actor_step_sees_the_updated_critic():
    """Mock the critic's optimiser step to raise head 0's output by 40: the actor loss then drops by
    40 / 4 (the mean over the 4 heads; the weights sum to 1), so the actor step reads the critic after
    its update, and the mean of all heads (a min would hardly move)."""
    agent = make_agent()
    tape = hand_tape()
    results = []
    for shift in (0.0, 40.0):
        a = copy.deepcopy(agent)

        def shifted_step(a=a, shift=shift):
            with torch.no_grad():
                a.critic.heads.out.bias[0] += shift

        a.critic_optim.step = shifted_step
        torch.manual_seed(3)
        results.append(a.update(tape)["actor_loss"])
    torch.testing.assert_close(results[1], results[0] - 10.0)


def test_polyak_and_initialisation():
    agent = make_agent()
    for p, t in zip(agent.critic.parameters(), agent.target_critic.parameters()):
        torch.testing.assert_close(p, t)  # the target starts equal, encoder included
        assert not t.requires_grad
    out = agent.critic.heads.out
    assert out.weight.abs().max() <= math.sqrt(0.01 / 16) and (out.bias == 0).all()
    assert agent.critic.heads.linears[0].weight.abs().max() <= 1 / math.sqrt(16 + A)
    last = agent.actor.head[-1]
    assert last.weight.abs().max() <= 1 / math.sqrt(16) and last.bias.abs().max() <= 1 / math.sqrt(16)
    assert agent.actor.head[-1].out_features == 2 * A
    old_target = [t.detach().clone() for t in agent.target_critic.parameters()]
    agent.update(hand_tape())
    changed = False
    for old, p, t in zip(old_target, agent.critic.parameters(), agent.target_critic.parameters()):
        torch.testing.assert_close(t, old + 0.005 * (p.detach() - old))
        changed |= not torch.equal(t, old)
    assert changed


def test_update_metrics_and_state_round_trip():
    for encoder in ("lru", "gru"):
        agent = make_agent(encoder=encoder)
        metrics = agent.update(hand_tape())
        assert set(metrics) >= {"critic_loss", "critic_loss_real", "critic_loss_synthetic", "q_mean", "actor_loss",
                                "alpha", "entropy_real", "entropy_synthetic", "critic_encoder_grad_norm",
                                "critic_head_grad_norm", "actor_encoder_grad_norm", "actor_head_grad_norm"}
        assert all(v.dim() == 0 and torch.isfinite(v) for v in metrics.values())
        assert agent.updates == 1
        agent.set_total_updates(50)
        clone = make_agent(seed=9, encoder=encoder)
        clone.load_state_dict(copy.deepcopy(agent.state_dict()))  # as a checkpoint: optimiser state not shared
        assert clone.updates == 1 and clone.total_updates == 50
        torch.manual_seed(1)
        m1 = agent.update(hand_tape(seed=1))
        torch.manual_seed(1)
        m2 = clone.update(hand_tape(seed=1))
        for key in m1:
            torch.testing.assert_close(m1[key], m2[key])
    with pytest.raises(InputError):
        agent.update({k: v[:1] for k, v in hand_tape().items()})


def test_episode_policy_carries_state_per_slot_and_resets_at_starts():
    agent = make_agent()
    policy = agent.episode_policy(deterministic=True)
    policy.reset(3)
    rng = np.random.default_rng(0)
    obs_seq = rng.normal(size=(5, S)).astype(np.float32)
    reward_seq = rng.normal(size=5).astype(np.float32)
    actions = []
    for k in range(5):
        rows = np.array([1, 0]) if k % 2 else np.array([1])  # slot 0 steps sometimes, slot 2 never
        obs = np.stack([obs_seq[k], rng.normal(size=S).astype(np.float32)])[:len(rows)]
        rewards = np.array([reward_seq[k - 1] if k else 123.0, 0.5], dtype=np.float32)[:len(rows)]
        starts = np.array([k == 0, k == 1])[:len(rows)]
        if k == 1:
            state_before = [s[2].clone() for s in policy.state]
        actions.append(policy(obs, rewards, starts, rows)[0])
    for s, before in zip(policy.state, state_before):
        torch.testing.assert_close(s[2], before)  # an inactive slot is untouched
        assert (s[2] == 0).all()
    # the same episode as one tape forward: inputs [s_k, a_{k-1}, r_{k-1}]
    obs_t = torch.as_tensor(obs_seq)
    previous_actions = torch.cat([torch.zeros(1, A), torch.as_tensor(np.stack(actions[:-1]))])
    previous_rewards = torch.cat([torch.zeros(1), torch.as_tensor(reward_seq[:-1])])
    starts = torch.tensor([True, False, False, False, False])
    x = history_inputs(obs_t, previous_actions, previous_rewards, starts)
    with torch.no_grad():
        mu, _, _ = agent.actor(x, starts)
    torch.testing.assert_close(torch.as_tensor(np.stack(actions)), agent.actor.mode(mu), rtol=1e-5, atol=1e-5)
    # a new episode in slot 1 acts as a fresh slot does
    new_obs = rng.normal(size=(1, S)).astype(np.float32)
    again = policy(new_obs, np.array([7.0], dtype=np.float32), np.array([True]), np.array([1]))
    fresh = agent.episode_policy(deterministic=True)
    fresh.reset(1)
    np.testing.assert_allclose(again, fresh(new_obs, np.zeros(1, np.float32), np.array([True]), np.array([0])), rtol=1e-6)
    np.testing.assert_allclose(again, agent.act(new_obs[0], deterministic=True)[None], rtol=1e-6)
    with pytest.raises(InputError):
        policy(new_obs, np.zeros(2, np.float32), np.array([True]), np.array([1]))


def test_policy_role_and_pendulum_action_bounds():
    agent = make_agent(low=-2.0, high=2.0, obs_dim=3, act_dim=1)
    torch.manual_seed(0)
    x = torch.randn(64, 5, 5)
    starts = torch.zeros(64, 5, dtype=torch.bool)
    starts[:, 0] = True
    actions, state = agent.sample(x, agent.initial_state(64), starts)
    assert actions.shape == (64, 1) and len(state) == 2 and state[0].shape == (64, 8)
    assert actions.abs().max() <= 2.0 and actions.abs().max() > 1.0  # env units, not +-1
    # carrying the state step by step gives the same distribution's mode
    with torch.no_grad():
        mu_full, raw_full, _ = agent.actor(x, starts)
        carried = None
        for t in range(5):
            mu_t, _, carried = agent.actor(x[:, t:t + 1], starts[:, t:t + 1], carried)
    torch.testing.assert_close(mu_t[:, 0], mu_full[:, -1], rtol=1e-5, atol=1e-5)
    # log_prob of given actions, differentiable in them, and consistent with a draw's log-probability
    given = (torch.rand(64, 1) * 3.8 - 1.9).requires_grad_(True)
    log_prob = agent.log_prob(x, given, None, starts)
    assert log_prob.shape == (64,)
    (grad,) = torch.autograd.grad(log_prob.sum(), given)
    assert torch.isfinite(grad).all()
    torch.manual_seed(4)
    drawn, drawn_log_prob = agent.actor.draw(mu_full[:, -1], raw_full[:, -1])
    torch.testing.assert_close(agent.log_prob(x, drawn, None, starts), drawn_log_prob, rtol=1e-3, atol=1e-3)
    # deterministic action: 2 tanh(mu) at an episode's first step
    obs = np.random.default_rng(1).normal(size=(4, 3)).astype(np.float32)
    first = history_inputs(torch.as_tensor(obs), torch.zeros(4, 1), torch.zeros(4), torch.ones(4, dtype=torch.bool))
    with torch.no_grad():
        mu, _, _ = agent.actor(first[:, None], torch.ones(4, 1, dtype=torch.bool))
    np.testing.assert_allclose(agent.act(obs, deterministic=True), (2 * torch.tanh(mu[:, 0])).numpy(), rtol=1e-6)
    assert agent.act(obs[0]).shape == (1,)
    with pytest.raises(InputError):
        agent.sample(torch.randn(4, 3))  # observations, not history inputs
    with pytest.raises(InputError):
        agent.act(np.full(3, np.nan))


def test_config_errors():
    with pytest.raises(ConfigError):
        NEUBAYConfig(sampled_critics=11)
    with pytest.raises(ConfigError):
        NEUBAYConfig(encoder="transformer")
    with pytest.raises(ConfigError):
        NEUBAYConfig(r_min=0.9, r_max=0.5)
    with pytest.raises(ConfigError):
        NEUBAYConfig(actor_lr_ratio=1.5)
    assert NEUBAYConfig(target_alpha_ratio=None).target_alpha_ratio is None


def test_the_update_with_compiled_critic_heads_equals_the_eager_update(monkeypatch):
    """Three updates from the same state, tapes and draws with the critic heads' compiled kernels
    (`FusedKernels`, forced on at these sizes) and without them: the metrics and every learned weight
    agree up to float rounding, and the compiled kernels ran."""
    from mbrl_offline.models.recurrent import FusedKernels

    monkeypatch.setattr(FusedKernels, "FUSE_FROM", 0)
    monkeypatch.setattr(FusedKernels, "failed", None)

    def trained(fused: bool):
        agent = make_agent(seed=3, fused_heads=fused, num_critics=10)
        metrics = []
        for step in range(3):
            torch.manual_seed(10 + step)
            metrics.append(agent.update(hand_tape(seed=step)))
        return metrics, [p.detach().clone() for m in (agent.actor, agent.critic, agent.target_critic) for p in m.parameters()]

    fused_metrics, fused_weights = trained(True)
    assert FusedKernels.failed is None and FusedKernels._compiled
    eager_metrics, eager_weights = trained(False)
    for got, want in zip(fused_metrics, eager_metrics):
        for key in want:
            torch.testing.assert_close(got[key], want[key], rtol=1e-4, atol=1e-6, msg=key)
    for got, want in zip(fused_weights, eager_weights):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
