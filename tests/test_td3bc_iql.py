"""TD3+BC and IQL: each loss against its formula written out independently (CORL's), the update
schedule, the dataset's normalisation and state round trips (exact resume and load_policy: the
agent contract, tests/test_agent_contract.py)."""
import copy

import numpy as np
import pytest
import torch

from mbrl_offline import build_run, load_dataset
from mbrl_offline.algorithms import IQL, TD3BC, IQLConfig, TD3BCConfig
from mbrl_offline.algorithms.iql import expectile_loss
from mbrl_offline.errors import ConfigError


@pytest.fixture(scope="module")
def data():
    return load_dataset("pendulum-medium").subset(range(2000))


def batch_of(data, rows=32, seed=0):
    idx = np.random.default_rng(seed).choice(len(data), rows, replace=False)
    return {"observations": torch.as_tensor(data.observations[idx]), "actions": torch.as_tensor(data.actions[idx]),
            "rewards": torch.as_tensor(data.rewards[idx]), "next_observations": torch.as_tensor(data.next_observations[idx]),
            "terminals": torch.as_tensor(data.terminals[idx])}


def grads_of(module_params, loss):
    return torch.autograd.grad(loss, list(module_params))


# ------------------------------------------------------------------------------------------ TD3+BC
def test_td3bc_normalises_states_with_the_dataset_statistics(data):
    agent = TD3BC.for_dataset(data, TD3BCConfig(hidden_size=16))
    assert torch.allclose(agent.normalise.mean, torch.as_tensor(data.observations.mean(0)))
    assert torch.allclose(agent.normalise.std, torch.as_tensor(data.observations.std(0) + 1e-3))
    off = TD3BC.for_dataset(data, TD3BCConfig(hidden_size=16, normalize_states=False))
    assert torch.equal(off.normalise.mean, torch.zeros(3)) and torch.equal(off.normalise.std, torch.ones(3))


def test_td3bc_losses_follow_corl(data):
    torch.manual_seed(0)
    agent = TD3BC.for_dataset(data, TD3BCConfig(hidden_size=16))
    batch = batch_of(data)
    before = copy.deepcopy(agent)
    torch.manual_seed(1)
    metrics = agent.update(batch)  # update 1: critics only (policy_freq 2)

    # the same critic loss, written out as CORL's (raw max_action = 2 for pendulum)
    torch.manual_seed(1)
    s, s2 = before.normalise(batch["observations"]), before.normalise(batch["next_observations"])
    noise = (torch.randn_like(batch["actions"]) * 0.2 * 2.0).clamp(-0.5 * 2.0, 0.5 * 2.0)
    next_a = (2.0 * torch.tanh(before.target_actor(s2)) + noise).clamp(-2.0, 2.0)
    q_next = before.target_critic(s2, next_a)
    y = batch["rewards"] + 0.99 * (1 - batch["terminals"].float()) * torch.min(q_next[0], q_next[1])
    q = before.critic(s, batch["actions"])
    corl = torch.nn.functional.mse_loss(q[0], y) + torch.nn.functional.mse_loss(q[1], y)
    assert torch.allclose(metrics["critic_loss"], corl.detach(), rtol=1e-5)
    # the actor and the targets did not move on update 1
    for a, b in zip(agent.actor.parameters(), before.actor.parameters()):
        assert torch.equal(a, b)
    for a, b in zip(agent.target_critic.parameters(), before.target_critic.parameters()):
        assert torch.equal(a, b)

    # update 2: the actor's gradient is CORL's -lambda Q1 + MSE, lambda detached
    critic_now = copy.deepcopy(agent.critic)
    pi = 2.0 * torch.tanh(agent.actor(s))
    q1 = critic_now(s, pi)[0]
    lmbda = 2.5 / q1.abs().mean().detach()
    corl_actor = -lmbda * q1.mean() + torch.nn.functional.mse_loss(pi, batch["actions"])
    expected = grads_of(agent.actor.parameters(), corl_actor)
    actor_before = copy.deepcopy(agent.actor)
    lr = agent.actor_optim.param_groups[0]["lr"]
    agent.update(batch)
    for p_old, p_new, g in zip(actor_before.parameters(), agent.actor.parameters(), expected):
        # Adam's first step moves every weight by lr * sign(g) (where g is not tiny)
        big = g.abs() > 1e-6
        assert torch.allclose((p_old - p_new)[big], lr * g.sign()[big], rtol=1e-3, atol=1e-7)
    # targets moved by Polyak tau = 5e-3 towards the critic
    for target, old_target, online in zip(agent.target_critic.parameters(), before.target_critic.parameters(),
                                          agent.critic.parameters()):
        assert torch.allclose(target, old_target + 5e-3 * (online - old_target), atol=1e-6)


def test_td3bc_actions_stay_in_bounds_and_are_deterministic(data):
    agent = TD3BC.for_dataset(data, TD3BCConfig(hidden_size=16))
    obs = data.observations[:50] * 100  # far outside the data: tanh saturates
    a = agent.act(obs)
    assert a.shape == (50, 1) and np.all(np.abs(a) <= 2.0) and np.array_equal(a, agent.act(obs))


def test_td3bc_settings_are_checked():
    with pytest.raises(ConfigError, match="policy_freq"):
        TD3BCConfig(policy_freq=0)
    with pytest.raises(ConfigError, match="alpha"):
        TD3BCConfig(alpha=-1.0)


# --------------------------------------------------------------------------------------------- IQL
def test_expectile_loss_is_minimised_at_the_expectile():
    x = torch.randn(2000, generator=torch.Generator().manual_seed(0)) ** 3
    for tau in (0.5, 0.7, 0.9):
        c = torch.zeros((), requires_grad=True)
        opt = torch.optim.LBFGS([c], max_iter=100, line_search_fn="strong_wolfe")

        def closure():
            opt.zero_grad()
            loss = expectile_loss(x - c, tau)
            loss.backward()
            return loss

        opt.step(closure)
        # the tau-expectile e solves tau E[(x - e)+] = (1 - tau) E[(e - x)+]
        e = c.detach()
        assert torch.isclose(tau * (x - e).clamp(min=0).mean(), (1 - tau) * (e - x).clamp(min=0).mean(), rtol=1e-4)
    assert torch.isclose(expectile_loss(torch.tensor([1.0, -2.0]), 0.7), torch.tensor((0.7 * 1 + 0.3 * 4) / 2))


@pytest.mark.parametrize("deterministic", [False, True])
def test_iql_losses_follow_corl(data, deterministic):
    torch.manual_seed(0)
    config = IQLConfig(hidden_size=16, deterministic_actor=deterministic, normalize_reward=True)
    agent = IQL.for_dataset(data, config)
    batch = batch_of(data)
    before = copy.deepcopy(agent)
    metrics = agent.update(batch)

    s, s2, a = before.normalise(batch["observations"]), before.normalise(batch["next_observations"]), batch["actions"]
    target_q = before.target_critic(s, a).min(dim=0).values
    v = before.value(s).squeeze(-1)
    adv = target_q - v
    corl_v = torch.mean(torch.abs(0.7 - (adv < 0).float()) * adv ** 2)
    assert torch.allclose(metrics["value_loss"], corl_v.detach(), rtol=1e-5)
    returns = data.episode_returns()
    r = batch["rewards"] / (returns.max() - returns.min()) * 1000.0
    y = r + 0.99 * (1 - batch["terminals"].float()) * before.value(s2).squeeze(-1)  # V before its update
    qs = before.critic(s, a)
    corl_q = sum(torch.nn.functional.mse_loss(q, y) for q in qs) / len(qs)
    assert torch.allclose(metrics["critic_loss"], corl_q.detach(), rtol=1e-5)
    weight = torch.exp(3.0 * adv.detach()).clamp(max=100.0)
    mean = torch.tanh(before.actor(s))
    scaled = a / 2.0  # pendulum's bounds are +-2
    if deterministic:
        bc = torch.sum((mean - scaled) ** 2, dim=1)
    else:
        bc = -torch.distributions.Normal(mean, before.log_std.clamp(-20, 2).exp()).log_prob(scaled).sum(-1)
    assert torch.allclose(metrics["actor_loss"], torch.mean(weight * bc).detach(), rtol=1e-5)
    for target, old_target, online in zip(agent.target_critic.parameters(), before.target_critic.parameters(),
                                          agent.critic.parameters()):
        assert torch.allclose(target, old_target + 5e-3 * (online - old_target), atol=1e-6)


def test_iql_log_prob_is_differentiable_in_the_action(data):
    agent = IQL.for_dataset(data, IQLConfig(hidden_size=16))
    obs = torch.as_tensor(data.observations[:8])
    actions = torch.as_tensor(data.actions[:8]).requires_grad_(True)
    (grad,) = torch.autograd.grad(agent.log_prob(obs, actions).sum(), actions)
    assert grad.shape == actions.shape and torch.isfinite(grad).all() and grad.abs().sum() > 0


def test_iql_actor_learning_rate_is_cosine_annealed_to_zero(data):
    agent = IQL.for_dataset(data, IQLConfig(hidden_size=16))
    agent.on_epoch_end(5, 10)
    assert agent.actor_optim.param_groups[0]["lr"] == pytest.approx(1.5e-4)
    agent.on_epoch_end(10, 10)
    assert agent.actor_optim.param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-12)
    assert agent.critic_optim.param_groups[0]["lr"] == 3e-4 and agent.value_optim.param_groups[0]["lr"] == 3e-4


def test_iql_settings_are_checked(data):
    with pytest.raises(ConfigError, match="expectile"):
        IQLConfig(expectile=1.0)
    one_episode = data.subset(range(200))  # pendulum's episodes are 200 steps: no spread of returns
    assert len(one_episode.episode_returns()) == 1
    with pytest.raises(ConfigError, match="normalize_reward"):
        IQL.for_dataset(one_episode, IQLConfig(normalize_reward=True))


# ------------------------------------------------------------------------------------------- both
@pytest.mark.parametrize("agent_cls", [TD3BC, IQL])
def test_without_a_generator_a_dynamics_model_is_refused(agent_cls, data):
    with pytest.raises(ConfigError, match="generator=none uses no dynamics model; leave dynamics_path unset"):
        build_run(agent_cls.name, data, dynamics_path="model.pt")
