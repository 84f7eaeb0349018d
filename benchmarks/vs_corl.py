"""Our CQL's conservative estimator against CORL's own ``algorithms/offline/cql.py``, on CORL's networks.

    git clone https://github.com/tinkoff-ai/CORL /path/to/CORL        # measured at 6afec90
    python benchmarks/vs_corl.py --corl /path/to/CORL

CORL's ``ContinuousCQL`` is built with its own ``TanhGaussianPolicy`` and ``FullyConnectedQFunction``s
(3 x 256, orthogonal init, CORL's locomotion settings: ``cql_alpha`` 10, T = 1, R = 10, importance
sampling) and its ``_q_loss`` runs on a batch of 256 hopper-medium rows; its log says
``cql_qf_diff = mean(logsumexp - Q(s, a))`` and ``average_qf = mean Q(s, a)`` per critic, so their
sum is its mean log-sum-exp. Our `CQLRegulariser` scores the same states with CORL's critics and
actor, from the same torch seed (after the one draw CORL's target takes first, both draw the uniform
actions, then pi at s, then pi at s', each state repeated R times in a row), in both ``lse_mode``\\ s:
the joint one is CORL's number. Nothing of CORL's is copied here: its module is imported from the
checkout, with stand-ins for the packages it imports but this check does not use (``d4rl``,
``pyrallis``, ``wandb``; ``gym`` is gymnasium's where ``gym`` is missing).
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import types
from pathlib import Path

import numpy as np
import torch

CQL_FILE = Path("algorithms") / "offline" / "cql.py"


def import_corl_cql(checkout: Path):
    """CORL's ``algorithms/offline/cql.py`` as a module, with stand-ins for what it imports unused."""
    for name in ("d4rl", "wandb"):
        sys.modules.setdefault(name, types.ModuleType(name))
    if "pyrallis" not in sys.modules:
        pyrallis = types.ModuleType("pyrallis")
        pyrallis.wrap = lambda *args, **kwargs: (lambda fn: fn)
        sys.modules["pyrallis"] = pyrallis
    try:
        import gym  # noqa: F401
    except ImportError:
        import gymnasium
        sys.modules["gym"] = gymnasium
    spec = importlib.util.spec_from_file_location("corl_cql", Path(checkout) / CQL_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def corl_estimator(checkout, seed: int = 0, rows: int = 256) -> dict[str, torch.Tensor]:
    """Per critic ``(2,)``: CORL's mean log-sum-exp from its ``_q_loss`` and ours (`CQLRegulariser`,
    ``joint`` and ``per_repeat``) on CORL's networks, the same batch and the same draws."""
    from mbrl_offline import load_dataset
    from mbrl_offline.algorithms.cql import CQLRegulariser

    corl = import_corl_cql(Path(checkout))
    data = load_dataset("hopper-medium")
    idx = np.random.default_rng(seed).integers(0, len(data), rows)
    obs, actions, next_obs = (torch.as_tensor(getattr(data, k)[idx]).float()
                              for k in ("observations", "actions", "next_observations"))
    rewards = torch.as_tensor(data.rewards[idx]).float()[:, None]
    dones = torch.as_tensor(data.terminals[idx]).float()[:, None]
    torch.manual_seed(seed)
    obs_dim, act_dim = data.obs_dim, data.act_dim
    actor = corl.TanhGaussianPolicy(obs_dim, act_dim, max_action=1.0, orthogonal_init=True)
    critics = [corl.FullyConnectedQFunction(obs_dim, act_dim, orthogonal_init=True, n_hidden_layers=3) for _ in range(2)]
    cql = corl.ContinuousCQL(critics[0], torch.optim.Adam(critics[0].parameters(), 3e-4), critics[1],
                             torch.optim.Adam(critics[1].parameters(), 3e-4), actor,
                             torch.optim.Adam(actor.parameters(), 3e-5), target_entropy=-float(act_dim),
                             policy_lr=3e-5, qf_lr=3e-4, bc_steps=0, cql_n_actions=10, cql_importance_sample=True,
                             cql_lagrange=False, cql_temp=1.0, cql_alpha=10.0)
    log: dict = {}
    torch.manual_seed(seed + 1)
    cql._q_loss(obs, actions, next_obs, rewards, dones, torch.tensor(1.0), log)
    out = {"corl": torch.tensor([log["cql_qf1_diff"] + log["average_qf1"], log["cql_qf2_diff"] + log["average_qf2"]])}

    def critic(states, acts):
        return torch.stack([c(states, acts) for c in critics])

    def draws(states, repeats):  # CORL's actor on the repeated rows, as its _q_loss runs it
        return actor(states.repeat_interleave(repeats, 0))

    for mode in ("joint", "per_repeat"):
        regulariser = CQLRegulariser(10, 1.0, mode, [-1.0] * act_dim, [1.0] * act_dim, torch.device("cpu"))
        torch.manual_seed(seed + 1)
        with torch.no_grad():
            actor(next_obs)  # CORL's target draws a' ~ pi(.|s') first
            out[mode] = regulariser.ood_values(critic, draws, obs, next_obs).mean(dim=1)
    return out


def corl_networks(corl, obs_dim: int, act_dim: int):
    """CORL's actor and two critics as its ``train`` builds them for the locomotion configs."""
    actor = corl.TanhGaussianPolicy(obs_dim, act_dim, max_action=1.0, orthogonal_init=True)
    critics = [corl.FullyConnectedQFunction(obs_dim, act_dim, orthogonal_init=True, n_hidden_layers=3) for _ in range(2)]
    return actor, critics


def copy_corl_weights(agent, actor, critics) -> None:
    """CORL's actor and critics into our `CQL` (``init="corl-cql"``), the targets too."""
    with torch.no_grad():
        theirs = [m for m in actor.base_network if isinstance(m, torch.nn.Linear)]
        for ours, layer in zip(agent.actor.linears, theirs):
            ours.weight.copy_(layer.weight)
            ours.bias.copy_(layer.bias)
        agent.actor.log_std_multiplier.copy_(actor.log_std_multiplier.constant)
        agent.actor.log_std_offset.copy_(actor.log_std_offset.constant)
        layers = [[m for m in c.network if isinstance(m, torch.nn.Linear)] for c in critics]
        for ours, pair in zip(agent.critic.net.linears, zip(*layers)):
            ours.weight.copy_(torch.stack([layer.weight.t() for layer in pair]))
            ours.bias.copy_(torch.stack([layer.bias for layer in pair])[:, None])
        agent.target_critic.load_state_dict(agent.critic.state_dict())


def corl_parameters(cql) -> dict[str, torch.Tensor]:
    """CORL's actor (our order: trunk, then the log-std multiplier and offset), critics and targets, flat."""
    def critics(c1, c2):
        layers = [[m for m in c.network if isinstance(m, torch.nn.Linear)] for c in (c1, c2)]
        return [t for a, b in zip(*layers) for t in (torch.stack([a.weight.t(), b.weight.t()]),
                                                     torch.stack([a.bias, b.bias])[:, None])]
    actor = [cql.actor.log_std_multiplier.constant, cql.actor.log_std_offset.constant]
    actor += [t for m in cql.actor.base_network if isinstance(m, torch.nn.Linear) for t in (m.weight, m.bias)]
    flat = lambda tensors: torch.cat([t.detach().flatten() for t in tensors])  # noqa: E731
    return {"actor": flat(actor), "critic": flat(critics(cql.critic_1, cql.critic_2)),
            "target_critic": flat(critics(cql.target_critic_1, cql.target_critic_2)),
            "log_alpha": flat([cql.log_alpha.constant]), "log_alpha_prime": flat([cql.log_alpha_prime.constant])}


def our_parameters(agent) -> dict[str, torch.Tensor]:
    flat = lambda module: torch.cat([p.detach().flatten() for p in module.parameters()])  # noqa: E731
    return {"actor": flat(agent.actor), "critic": flat(agent.critic), "target_critic": flat(agent.target_critic),
            "log_alpha": agent.log_alpha.detach().flatten().clone(),
            "log_alpha_prime": agent.log_alpha_prime.detach().flatten().clone()}


def corl_update_differences(checkout, updates: int = 5, seed: int = 0, lagrange: bool = False,
                            rows: int = 256) -> list[dict]:
    """CORL's ``ContinuousCQL.train`` and our `CQL` with ``CQLConfig.corl()`` from the same weights (CORL's,
    copied into ours), updated on the same batches of hopper-medium rows (states normalised as CORL
    normalises them) with the same torch seed before each update: per update, each side's critic loss
    (TD + conservative, both critics) and actor loss, the largest parameter difference per module, and
    the relative difference of the update itself, |delta_ours - delta_corl| / |delta_corl|."""
    from mbrl_offline import load_dataset
    from mbrl_offline.algorithms.cql import CQL, CQLConfig

    corl = import_corl_cql(Path(checkout))
    data = load_dataset("hopper-medium")
    mean, std = data.observations.mean(0), data.observations.std(0) + 1e-3  # CORL's compute_mean_std
    obs_dim, act_dim = data.obs_dim, data.act_dim
    torch.manual_seed(seed)
    actor, critics = corl_networks(corl, obs_dim, act_dim)
    cql = corl.ContinuousCQL(critics[0], torch.optim.Adam(critics[0].parameters(), 3e-4), critics[1],
                             torch.optim.Adam(critics[1].parameters(), 3e-4), actor,
                             torch.optim.Adam(actor.parameters(), 3e-5), target_entropy=-float(act_dim),
                             policy_lr=3e-5, qf_lr=3e-4, bc_steps=0, cql_n_actions=10, cql_importance_sample=True,
                             cql_lagrange=lagrange, cql_target_action_gap=-1.0, cql_temp=1.0, cql_alpha=10.0)
    agent = CQL(obs_dim, act_dim, [-1.0] * act_dim, [1.0] * act_dim, CQLConfig.corl(with_lagrange=lagrange))
    copy_corl_weights(agent, actor, critics)
    rng = np.random.default_rng(seed)
    out = []
    for t in range(updates):
        idx = rng.integers(0, len(data), rows)
        batch = {"observations": torch.as_tensor((data.observations[idx] - mean) / std).float(),
                 "actions": torch.as_tensor(data.actions[idx]).float(),
                 "next_observations": torch.as_tensor((data.next_observations[idx] - mean) / std).float(),
                 "rewards": torch.as_tensor(data.rewards[idx]).float(),
                 "terminals": torch.as_tensor(data.terminals[idx]).float()}
        before_corl, before_ours = corl_parameters(cql), our_parameters(agent)
        torch.manual_seed(1000 + t)
        log = cql.train([batch["observations"], batch["actions"], batch["rewards"][:, None],
                         batch["next_observations"], batch["terminals"][:, None]])
        torch.manual_seed(1000 + t)
        ours = agent.update(batch)
        after_corl, after_ours = corl_parameters(cql), our_parameters(agent)
        row = {"update": t + 1,
               "corl_critic_loss": log["qf1_loss"] + log["qf2_loss"] + log["cql_min_qf1_loss"] + log["cql_min_qf2_loss"],
               "our_critic_loss": float(ours["critic_loss"] + ours["cql_loss"]),
               "corl_actor_loss": log["policy_loss"], "our_actor_loss": float(ours["actor_loss"])}
        for name in after_ours:
            step_corl, step_ours = after_corl[name] - before_corl[name], after_ours[name] - before_ours[name]
            row[f"{name}_max_diff"] = float((after_ours[name] - after_corl[name]).abs().max())
            if step_corl.norm() > 0:
                row[f"{name}_step_rel_diff"] = float((step_ours - step_corl).norm() / step_corl.norm())
        out.append(row)
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corl", required=True, help="a checkout of github.com/tinkoff-ai/CORL")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--updates", type=int, default=0,
                        help="also run this many updates of CORL's ContinuousCQL.train and ours side by side "
                             "(CQLConfig.corl(), CORL's weights copied), without and with the Lagrange variant")
    args = parser.parse_args(argv)
    if not (Path(args.corl) / CQL_FILE).is_file():
        parser.exit(2, f"error: --corl must name a checkout of github.com/tinkoff-ai/CORL (with {CQL_FILE}); "
                       "clone it and pass its path.\n")
    torch.set_num_threads(1)
    print("seed | CORL's mean log-sum-exp (critic 1, 2) | ours, joint | ours, per_repeat")
    for seed in args.seeds:
        got = corl_estimator(args.corl, seed)
        print(f"{seed} | " + " | ".join(", ".join(f"{v:.6f}" for v in got[k].tolist())
                                        for k in ("corl", "joint", "per_repeat")))
    for lagrange in (False, True) if args.updates else ():
        print(f"\nupdates side by side, CQLConfig.corl(with_lagrange={lagrange}):")
        for row in corl_update_differences(args.corl, args.updates, lagrange=lagrange):
            print("  " + "  ".join(f"{k} {v:.6g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()))


if __name__ == "__main__":
    main()
