"""EDAC (`mbrl_offline.algorithms.edac`): one update in each of the SAC core's orders against the
update written out with autograd as the reference code writes it (the official EDAC trainer, CORL's,
OfflineRL-Kit's), the initialisations, the alpha cap, RAVL as EDAC with RAVL's defaults, and, where a
checkout of OfflineRL-Kit is named by ``MBRL_OFFLINE_OFFLINERLKIT``, one update against Kit's own
``EDACPolicy`` from the same weights and batch (``benchmarks/vs_offlinerlkit.py --edac-update``)."""
import copy
import itertools
import math
import os
import sys
from pathlib import Path

import pytest
import torch

from mbrl_offline.algorithms import EDAC, RAVL, EDACConfig, RAVLConfig
from mbrl_offline.algorithms.sac import UPDATE_ORDERS
from mbrl_offline.models.networks import CriticEnsemble, TanhGaussianActor
from mbrl_offline.utils import soft_update

from test_sac_edac import corl_diversity, random_batch

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def small_agent(**settings) -> EDAC:
    config = EDACConfig(**{"num_critics": 4, "hidden_size": 32, "batch_size": 64, "fused_adam": False, **settings})
    return EDAC(4, 2, -torch.ones(2), torch.ones(2), config)


def reference_update(agent: EDAC, batch: dict, order: str) -> None:
    """One update written with autograd, in the order ``order`` names: "official" as the official
    trainer (``lifelong_rl/trainers/q_learning/sac.py``: every loss from the networks before the update,
    then the alpha, policy and critic steps), "corl" as CORL's ``edac.py`` (alpha, then the actor with
    the new alpha, then the critics), "offlinerlkit" as Kit's ``EDACPolicy.learn`` (the actor with the
    old alpha, then alpha, then the critics), "offlinerlkit_sac" as Kit's ``SACPolicy.learn`` (the
    critics towards the target of the actor and alpha before the update, then the actor against the
    stepped critics, then alpha)."""
    cfg = agent.config
    obs, actions = batch["observations"], batch["actions"]

    def target(alpha):
        with torch.no_grad():
            next_actions, next_log_pi = agent.actor(batch["next_observations"])
            next_q = agent.target_critic(batch["next_observations"], next_actions).min(0).values - alpha * next_log_pi
            return batch["rewards"] + cfg.gamma * (1 - batch["terminals"].float()) * next_q

    def critic_step(y):
        q = agent.critic(obs, actions)
        critic_loss = (q - y).pow(2).mean(1).sum() + cfg.eta * corl_diversity(agent.critic, obs, actions)
        agent.critic_optim.zero_grad()
        critic_loss.backward()
        agent.critic_optim.step()

    if order == "offlinerlkit_sac":
        critic_step(target(agent.alpha))
        new_actions, log_pi = agent.actor(obs)
        policy_loss = (agent.alpha * log_pi - agent.critic(obs, new_actions).min(0).values).mean()
        agent.actor_optim.zero_grad()
        policy_loss.backward()
        agent.actor_optim.step()
        alpha_loss = -(agent.log_alpha * (log_pi + agent.target_entropy).detach()).mean()
        agent.alpha_optim.zero_grad()
        alpha_loss.backward()
        agent.alpha_optim.step()
        soft_update(agent.target_critic, agent.critic, cfg.tau)
        return

    new_actions, log_pi = agent.actor(obs)
    alpha_before = agent.alpha
    if order == "official":
        y = target(alpha_before)
    alpha_loss = -(agent.log_alpha * (log_pi + agent.target_entropy).detach()).mean()
    agent.alpha_optim.zero_grad()
    alpha_loss.backward()
    agent.alpha_optim.step()
    alpha = agent.alpha if order == "corl" else alpha_before
    policy_loss = (alpha * log_pi - agent.critic(obs, new_actions).min(0).values).mean()
    agent.actor_optim.zero_grad()
    policy_loss.backward()
    agent.actor_optim.step()
    if order != "official":
        y = target(agent.alpha)
    critic_step(y)
    soft_update(agent.target_critic, agent.critic, cfg.tau)


def parameters(agent) -> list[torch.Tensor]:
    return [*agent.actor.parameters(), *agent.critic.parameters(), *agent.target_critic.parameters(), agent.log_alpha]


@pytest.mark.parametrize("order", UPDATE_ORDERS)
def test_one_update_in_each_order_is_the_reference_codes(order):
    torch.manual_seed(0)
    agent = small_agent(update_order=order, alpha_max=0.999)  # alpha starts at 1: the cap binds
    batch = random_batch(64, "cpu")
    ours, reference = copy.deepcopy(agent), copy.deepcopy(agent)
    for step in range(3):
        torch.manual_seed(10 + step)
        ours.update(batch)
        torch.manual_seed(10 + step)
        reference_update(reference, batch, order)
    for a, b in zip(parameters(ours), parameters(reference)):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-5, atol=1e-6)
    assert float(ours.alpha) == pytest.approx(0.999)  # capped: exp(log alpha) is above 0.999 after 3 steps


def test_the_orders_differ():
    torch.manual_seed(0)  # a fast alpha, so that reading it before or after its step shows
    agent, batch = small_agent(alpha_lr=0.1), random_batch(64, "cpu")
    after = {}
    for order in UPDATE_ORDERS:
        copied = copy.deepcopy(agent)
        copied.config.update_order = order
        torch.manual_seed(1)
        for _ in range(3):
            copied.update(batch)
        after[order] = parameters(copied)
    for one, other in itertools.combinations(UPDATE_ORDERS, 2):
        difference = max((a - b).abs().max().item() for a, b in zip(after[one], after[other]))
        assert difference > 1e-6, (one, other, difference)


def test_alpha_max_caps_the_alpha_the_losses_use():
    agent = small_agent(init_alpha=3.0, alpha_max=1.0)
    assert float(agent.alpha) == 1.0 and math.isclose(float(agent.log_alpha.detach().exp()), 3.0, rel_tol=1e-6)
    assert float(small_agent(init_alpha=3.0).alpha) == pytest.approx(3.0)


def test_the_inits_are_the_reference_codes():
    torch.manual_seed(0)
    obs_dim, act_dim, width = 11, 3, 64
    for init in ("edac", "edac-official", "offlinerlkit"):
        critic = CriticEnsemble(obs_dim, act_dim, 5, width, 3, init=init)
        *hidden, output = critic.net.linears
        assert all(torch.all(layer.bias == 0.1) for layer in hidden)
        assert output.weight.abs().max() <= 3e-3 and output.bias.abs().max() <= 3e-3
        first = hidden[0].weight  # (N, in, out): the layer where in (14) and out (64) differ
        if init == "edac":  # CORL: U(±1/sqrt(out))
            assert 0.9 / math.sqrt(width) < first.abs().max() <= 1 / math.sqrt(width)
        elif init == "edac-official":  # rlkit's fanin_init on (in, out): U(±1/sqrt(in))
            assert 0.9 / math.sqrt(obs_dim + act_dim) < first.abs().max() <= 1 / math.sqrt(obs_dim + act_dim)
        else:  # Kit's EnsembleLinear: truncated normal, std 1/(2 sqrt(in))
            assert first.std().item() == pytest.approx(1 / (2 * math.sqrt(obs_dim + act_dim)), rel=0.05)
    for init in ("edac", "edac-official", "offlinerlkit"):
        actor = TanhGaussianActor(obs_dim, act_dim, -torch.ones(act_dim), torch.ones(act_dim), width, 3, init=init)
        *hidden, head = actor.linears
        if init == "offlinerlkit":  # torch's nn.Linear init throughout
            assert hidden[0].bias.abs().max() <= 1 / math.sqrt(obs_dim) and head.weight.abs().max() > 1e-3
            continue
        assert all(torch.all(layer.bias == 0.1) for layer in hidden) and head.weight.abs().max() <= 1e-3
        bound = 1 / math.sqrt(width if init == "edac-official" else obs_dim)  # rlkit: U(±1/sqrt(out)); CORL: torch's
        assert 0.9 * bound < hidden[0].weight.abs().max() <= bound


def test_ravl_is_edac_with_ravls_defaults():
    assert issubclass(RAVL, EDAC) and issubclass(RAVLConfig, EDACConfig) and RAVL.update is EDAC.update
    assert (RAVLConfig().init, RAVLConfig().update_order) == ("edac", "corl")
    assert (EDACConfig().init, EDACConfig().update_order) == ("edac-official", "official")
    assert EDAC.published_generator().kind == "none" and RAVL.published_generator().kind == "rollouts"


OFFLINERLKIT = os.environ.get("MBRL_OFFLINE_OFFLINERLKIT")


@pytest.mark.skipif(not OFFLINERLKIT, reason="MBRL_OFFLINE_OFFLINERLKIT names no OfflineRL-Kit checkout")
@pytest.mark.parametrize("exact_log_det", [True, False])
def test_one_update_equals_offlinerlkits_edac_policy(exact_log_det):
    """From Kit's weights and the same batch and seed, our EDAC with ``EDACConfig.offlinerlkit()`` makes
    Kit's update. With Kit's log(1 - tanh^2 + 1e-6) made exact (ours), gradients and losses agree to
    float rounding; as Kit wrote it, to that 1e-6's effect. Either way every weight is Kit's but a
    few whose gradient is so small that Adam's first step, lr * g / (|g| + 1e-8), turns those
    differences into a visible part of the step."""
    sys.path.insert(0, str(BENCHMARKS))
    import vs_offlinerlkit

    tolerance = 1e-6 if exact_log_det else 1e-4  # relative, for gradients and losses
    for result in vs_offlinerlkit.edac_update_differences(Path(OFFLINERLKIT), "hopper-medium", num_critics=10, eta=1.0,
                                                          exact_log_det=exact_log_det):
        for name, (value, scale) in result.items():
            if name.endswith("(elements)"):
                assert value <= (1e-5 if exact_log_det else 1e-3) * scale, (name, value, scale)
            elif name.endswith("at those"):
                assert value <= (1e-7 if exact_log_det else 1e-6), (name, value)
            elif name.endswith(": weights") and not name.startswith("log alpha"):
                assert value <= 2 * scale, (name, value, scale)  # at most a step the other way (those few weights)
            else:
                assert value <= tolerance * scale + 1e-7, (name, value, scale)


OFFICIAL_EDAC = os.environ.get("MBRL_OFFLINE_EDAC")  # a checkout of snu-mllab/EDAC, or unset


@pytest.mark.skipif(not (OFFICIAL_EDAC and (Path(OFFICIAL_EDAC) / "lifelong_rl" / "trainers").is_dir()),
                    reason="MBRL_OFFLINE_EDAC names no checkout of the official EDAC code")
def test_one_update_equals_the_official_sac_trainer():
    """From the official networks' weights (targets included), the same batch and seed, our EDAC with its
    defaults and unfused Adam makes the official ``SACTrainer.train_from_torch`` update
    (``benchmarks/vs_edac_official.py``): with the official log(1 - tanh^2 + 1e-6) made exact, the actor
    and the losses agree to float rounding, and the critics but for a few weights whose gradient is at
    rounding level, where Adam's first step is about lr * sign(g)."""
    sys.path.insert(0, str(BENCHMARKS))
    import vs_edac_official

    result, = vs_edac_official.update_differences(Path(OFFICIAL_EDAC), num_critics=10, eta=1.0, updates=1,
                                                  exact_log_det=True)
    assert result["actor: weights"][0] < 1e-6 and result["log alpha: weights"][0] < 1e-9
    assert result["critics: weights off by > 1e-6 (elements)"][0] <= 20
    assert result["critics: largest |gradient| at those"][0] < 1e-7
    for name in ("critic loss (TD + eta x diversity) / N", "diversity"):
        value, scale = result[name]
        assert value <= 1e-6 * scale + 1e-7, (name, value, scale)


def test_the_official_side_by_side_refuses_a_folder_that_is_not_the_official_checkout():
    import subprocess

    done = subprocess.run([sys.executable, str(BENCHMARKS / "vs_edac_official.py"), "--edac", "/nonexistent"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(BENCHMARKS.parent)})
    assert done.returncode == 2 and done.stderr.startswith("error: --edac must name a checkout of")
    assert done.stderr.count("\n") == 1, done.stderr
