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

    for mode in ("joint", "per_repeat"):
        regulariser = CQLRegulariser(10, 1.0, mode, [-1.0] * act_dim, [1.0] * act_dim, torch.device("cpu"))
        torch.manual_seed(seed + 1)
        with torch.no_grad():
            actor(next_obs)  # CORL's target draws a' ~ pi(.|s') first
            out[mode] = regulariser.ood_values(critic, actor, obs, next_obs).mean(dim=1)
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corl", required=True, help="a checkout of github.com/tinkoff-ai/CORL")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
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


if __name__ == "__main__":
    main()
