"""Our EDAC's update against the official EDAC code's ``SACTrainer`` (snu-mllab/EDAC), from the same weights.

    git clone https://github.com/snu-mllab/EDAC /path/to/EDAC        # measured at 198d570
    python benchmarks/vs_edac_official.py --edac /path/to/EDAC [--updates 3] [--exact-log-det]

The official side is built as its ``experiment_configs/configs/q_learning/sac_config.py`` builds it
(``ParallelizedEnsembleFlattenMLP`` critics and targets, a ``TanhGaussianPolicy``, 3 x 256 each) with
the trainer settings of ``scripts/sac.py`` and the README's EDAC command (N critics and eta given
here; hopper's sizes, hopper-medium rows). Ours is `EDAC` with its defaults (the official code's) and
torch's unfused Adam, as the official code steps. The official networks' weights, targets included,
are copied into ours; both sides update on the same batches of 256 dataset rows with the same torch
seed before each update (both draw the policy's noise at s, then at s'). Per update it prints the
largest difference of each module's weights, the size of that module's step, and the losses.

``--exact-log-det`` replaces the official ``TanhNormal.log_prob``, log N(u) - log(1 - tanh(u)^2 + 1e-6),
with the exact log-determinant ours computes, in this process only, to attribute what is left.

Nothing of the official code is copied here: its modules are imported from the checkout, with
stand-ins for two packages it imports but this comparison does not use (``tensorboardX``, for its
logger, and ``gtimer``, for its training loop's timers).
"""
from __future__ import annotations

import argparse
import math
import sys
import types
import warnings
from pathlib import Path

import numpy as np
import torch

from parity import weight_differences  # beside this file

TRAINER = Path("lifelong_rl") / "trainers" / "q_learning" / "sac.py"


def import_official(checkout: Path):
    """The official code's trainer, networks and policy, with stand-ins for its unused imports."""
    for name in ("tensorboardX", "gtimer"):
        if name not in sys.modules:
            stub = types.ModuleType(name)
            stub.SummaryWriter = object
            sys.modules[name] = stub
    sys.path.insert(0, str(checkout))
    from lifelong_rl.models.networks import ParallelizedEnsembleFlattenMLP
    from lifelong_rl.policies.models.tanh_gaussian_policy import TanhGaussianPolicy
    from lifelong_rl.trainers.q_learning.sac import SACTrainer
    return types.SimpleNamespace(critics=ParallelizedEnsembleFlattenMLP, policy=TanhGaussianPolicy, trainer=SACTrainer)


def exact_official_log_det() -> None:
    """The official ``TanhNormal.log_prob`` with the exact log(1 - tanh(u)^2), in this process only."""
    from lifelong_rl.torch import distributions

    def log_prob(self, value, pre_tanh_value=None):
        u = distributions.atanh(value) if pre_tanh_value is None else pre_tanh_value
        return self.normal.log_prob(u) - 2 * (math.log(2) - u - torch.nn.functional.softplus(-2 * u))

    distributions.TanhNormal.log_prob = log_prob


def official_groups(trainer, grad: bool = False) -> dict[str, list[torch.Tensor]]:
    """The official parameters (or, with ``grad``, the actor's and critics' gradients of the last update)
    arranged as ours: the policy's trunk, then its mean and log-std heads as one (out, in) layer; the
    critics' and targets' (N, in, out) weights and (N, 1, out) biases."""
    policy = trainer.policy
    if grad:
        groups = official_groups(types.SimpleNamespace(
            policy=types.SimpleNamespace(**{name: types.SimpleNamespace(weight=layer.weight.grad, bias=layer.bias.grad)
                                            for name, layer in (("last_fc", policy.last_fc),
                                                                ("last_fc_log_std", policy.last_fc_log_std))},
                                         fcs=[types.SimpleNamespace(weight=fc.weight.grad, bias=fc.bias.grad)
                                              for fc in policy.fcs]),
            qfs=types.SimpleNamespace(fcs=[types.SimpleNamespace(W=fc.W.grad, b=fc.b.grad) for fc in trainer.qfs.fcs],
                                      last_fc=types.SimpleNamespace(W=trainer.qfs.last_fc.W.grad,
                                                                    b=trainer.qfs.last_fc.b.grad)),
            target_qfs=trainer.target_qfs, log_alpha=trainer.log_alpha))
        return {group: groups[group] for group in ("actor", "critics")}
    head = [torch.cat([policy.last_fc.weight, policy.last_fc_log_std.weight]),
            torch.cat([policy.last_fc.bias, policy.last_fc_log_std.bias])]
    actor = [p for fc in policy.fcs for p in (fc.weight, fc.bias)] + head

    def ensemble(net):
        return [p for fc in [*net.fcs, net.last_fc] for p in (fc.W, fc.b)]
    return {"actor": [t.detach().clone() for t in actor], "critics": [t.detach().clone() for t in ensemble(trainer.qfs)],
            "target critics": [t.detach().clone() for t in ensemble(trainer.target_qfs)],
            "log alpha": [trainer.log_alpha.detach().clone().reshape(())]}


def our_groups(agent) -> dict[str, list[torch.Tensor]]:
    def ensemble(net):
        return [p for layer in net.net.linears for p in (layer.weight, layer.bias)]
    return {"actor": [p for layer in agent.actor.linears for p in (layer.weight, layer.bias)],
            "critics": ensemble(agent.critic), "target critics": ensemble(agent.target_critic),
            "log alpha": [agent.log_alpha]}


def update_differences(checkout, num_critics: int = 10, eta: float = 1.0, updates: int = 3, seed: int = 0,
                       dataset: str = "hopper-medium", hidden_size: int = 256, batch_size: int = 256,
                       exact_log_det: bool = False) -> list[dict]:
    """Per update: for each module, (largest |ours - official| after it, largest official step), and
    for each loss, (|ours - official|, |official|)."""
    from mbrl_offline import load_dataset
    from mbrl_offline.algorithms.edac import EDAC, EDACConfig
    from mbrl_offline.data.envs import get_env_info

    official = import_official(Path(checkout))
    if exact_log_det:
        exact_official_log_det()
    data = load_dataset(dataset)
    obs_dim, act_dim = data.obs_dim, data.act_dim
    low, high = get_env_info(data.env_name).action_bounds()
    torch.manual_seed(seed)
    hidden = [hidden_size] * 3
    qfs, target_qfs = (official.critics(ensemble_size=num_critics, hidden_sizes=hidden, input_size=obs_dim + act_dim,
                                        output_size=1, layer_norm=None) for _ in range(2))
    policy = official.policy(obs_dim=obs_dim, action_dim=act_dim, hidden_sizes=hidden, layer_norm=None)
    env = types.SimpleNamespace(action_space=types.SimpleNamespace(shape=(act_dim,)))
    trainer = official.trainer(env=env, policy=policy, qfs=qfs, target_qfs=target_qfs, discount=0.99,
                               soft_target_tau=5e-3, policy_lr=3e-4, qf_lr=3e-4, use_automatic_entropy_tuning=True,
                               policy_eval_start=0, num_qs=num_critics, target_update_period=1, max_q_backup=False,
                               deterministic_backup=False, eta=eta)

    agent = EDAC(obs_dim, act_dim, low, high, EDACConfig(num_critics=num_critics, eta=eta, hidden_size=hidden_size,
                                                         batch_size=batch_size, fused_adam=False))
    # The control: ours again, from the same weights moved by one float32 rounding step (a relative
    # 2^-24, with a random sign per weight): how far two runs of the same code drift apart from a
    # rounding-level difference over these updates, through Adam's first steps, about lr sign(g).
    twin = EDAC(obs_dim, act_dim, low, high, agent.config)
    signs = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for group, theirs in official_groups(trainer).items():
            for mine, other, value in zip(our_groups(agent)[group], our_groups(twin)[group], theirs):
                mine.copy_(value.reshape(mine.shape))
                flip = torch.randint(0, 2, mine.shape, generator=signs).to(mine.dtype) * 2 - 1
                other.copy_(mine * (1 + flip * 2.0 ** -24) if group != "log alpha" else mine)

    rng = np.random.default_rng(seed)
    results = []
    for step in range(updates):
        rows = rng.integers(0, len(data), batch_size)
        arrays = {k: torch.as_tensor(getattr(data, k)[rows]).float() for k in
                  ("observations", "actions", "next_observations", "rewards", "terminals")}
        theirs_batch = {**{k: v.clone() for k, v in arrays.items()},
                        "rewards": arrays["rewards"][:, None].clone(), "terminals": arrays["terminals"][:, None].clone()}
        before = official_groups(trainer)
        torch.manual_seed(seed + 1 + step)
        trainer._need_to_update_eval_statistics = True  # its statistics: the losses of this update
        with warnings.catch_warnings():  # its critic loss broadcasts a (1, B, 1) target against (N, B, 1), as meant
            warnings.filterwarnings("ignore", message="Using a target size")
            trainer.train_from_torch(theirs_batch, None)
        trainer._num_train_steps += 1  # as its train() does
        stats = trainer.get_diagnostics()
        torch.manual_seed(seed + 1 + step)
        mine = agent.update(arrays)
        torch.manual_seed(seed + 1 + step)
        twin.update(arrays)
        after = official_groups(trainer)
        result = {}
        for group, theirs in after.items():
            ours = [a.detach().reshape(b.shape) for a, b in zip(our_groups(agent)[group], theirs)]
            grads = official_groups(trainer, grad=True)[group] if group in ("actor", "critics") else None
            result.update(weight_differences(group, ours, theirs, before[group], grads))
        for group in ("actor", "critics"):
            pairs = [(a.detach(), b.detach()) for a, b in zip(our_groups(agent)[group], our_groups(twin)[group])]
            result[f"control, {group}: ours from weights one rounding step apart, weights"] = (
                max((a - b).abs().max().item() for a, b in pairs), result[f"{group}: weights"][1])
            result[f"control, {group}: weights off by > 1e-6 (elements)"] = (
                sum(int(((a - b).abs() > 1e-6).sum()) for a, b in pairs), sum(a.numel() for a, _ in pairs))
        # The official log's "QFs Loss" is (TD summed over the critics + eta x diversity) / N: its
        # ``qfs_loss_total += eta * grad_loss`` adds in place to the tensor it logs. "Q Grad Loss" is
        # the diversity term alone.
        ours_total = (float(mine["critic_loss"]) + eta * float(mine["diversity_loss"])) / num_critics
        result["critic loss (TD + eta x diversity) / N"] = (abs(ours_total - stats["QFs Loss"]), abs(stats["QFs Loss"]))
        if eta > 0:
            result["diversity"] = (abs(float(mine["diversity_loss"]) - stats["Q Grad Loss"]), abs(stats["Q Grad Loss"]))
        results.append(result)
    return results


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--edac", required=True, help="a checkout of github.com/snu-mllab/EDAC")
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--num-critics", type=int, default=10)
    parser.add_argument("--eta", type=float, default=1.0)
    parser.add_argument("--exact-log-det", action="store_true",
                        help="the official tanh log-determinant without its 1e-6, to attribute the actor's difference")
    args = parser.parse_args(argv)
    if not (Path(args.edac) / TRAINER).is_file():
        parser.exit(2, f"error: --edac must name a checkout of github.com/snu-mllab/EDAC (with {TRAINER}); "
                       "clone it and pass its path.\n")
    torch.set_num_threads(1)
    rows = update_differences(args.edac, args.num_critics, args.eta, args.updates, exact_log_det=args.exact_log_det)
    print(f"official EDAC (N = {args.num_critics}, eta = {args.eta}) and ours, hopper-medium, batch 256"
          + (", the official log-determinant made exact" if args.exact_log_det else ""))
    print("| quantity | " + " | ".join(f"update {i + 1}" for i in range(len(rows))) + " | scale (official, last update) |")
    print("|---|" + "---|" * (len(rows) + 1))
    for key in rows[0]:
        print(f"| {key} | " + " | ".join(f"{row[key][0]:.2g}" for row in rows) + f" | {rows[-1][key][1]:.3g} |")
    print("(elements: how many of all; gradient: the largest |official gradient| at them, and of all)")


if __name__ == "__main__":
    main()
