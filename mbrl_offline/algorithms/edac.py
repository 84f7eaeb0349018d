"""EDAC: Ensemble-Diversified Actor Critic (An, Moon, Kim, Song; "Uncertainty-Based Offline
Reinforcement Learning with Diversified Q-Ensemble", NeurIPS 2021; code: github.com/snu-mllab/EDAC).

SAC with N critics whose minimum is the target and the actor's objective (SAC-N), plus a term that
pushes the critics' action gradients apart, so that a few critics give the spread that SAC-N needs
many for. On the dataset alone, as published:

    y       = r + gamma (1 - d) (min_i Qbar_i(s', a') - alpha log pi(a'|s')),   a' ~ pi(.|s')
    L_Q     = sum_i E[(Q_i(s, a) - y)^2] + eta E[1/(N-1) sum_{i != j} <g_i, g_j>],  g_i = grad_a Q_i(s, a) / |grad_a Q_i(s, a)|
    L_pi    = E[alpha log pi(a~|s) - min_i Q_i(s, a~)],   a~ ~ pi(.|s)
    L_alpha = E[-log alpha (log pi(a~|s) - |A|)]

with g_i taken at the dataset's actions. This is the agent RAVL trains on model rollouts
(`mbrl_offline.algorithms.ravl.RAVL` is this class with the official RAVL code's defaults and its
generator): one implementation, the SAC-N/EDAC core of `mbrl_offline.algorithms.sac`, whose
hand-written critic and actor gradients are tested against autograd and CORL's double backward
(``tests/test_sac_edac.py``) and, for one whole update, against OfflineRL-Kit's ``EDACPolicy``
(``tests/test_edac.py``, ``benchmarks/vs_offlinerlkit.py --edac-update``).

Defaults (`EDACConfig`) are the official code's (``scripts/sac.py`` and
``lifelong_rl/trainers/q_learning/sac.py``): 3 hidden layers of 256 ReLU units for actor and critics
with its initialisation (``init="edac-official"``), Adam at 3e-4 for actor, critics and alpha (the
alpha optimiser takes the policy's rate), gamma 0.99, tau 5e-3 every update, alpha from 1 tuned
towards -|A|, batch 256, 3000 epochs of 1000 updates, the entropy term in the target, every loss
computed from the networks before the update (``update_order="official"``), evaluation with the
policy's mode. N and eta are set per dataset; OfflineRL-Kit's ``run_edac.py`` and CORL's configs
agree on the values for the D4RL v2 locomotion datasets: N = 10, eta = 1 (the defaults here) for
halfcheetah and walker2d, N = 50 for hopper, eta = 5 for halfcheetah- and walker2d-medium-expert
(``mbrl_offline/configs/preset/edac-<env>-<dataset>.yaml``; neither has random datasets). The official
script's own default is eta = -1 (SAC-N); its README runs EDAC by passing ``--num_qs`` and ``--eta``.

OfflineRL-Kit's ``EDACPolicy`` differs from the official code in settings only, each of which is one
here: ``EDACConfig.offlinerlkit()`` (actor and alpha learning rates 1e-4, alpha capped at 1
(``alpha_max``), the alpha step between the actor's and the critics' (``update_order="offlinerlkit"``),
Kit's initialisation (``init="offlinerlkit"``), torch's unfused Adam); with it, one update from the
same weights and batch gives Kit's weights (docs/parity.md).

Differences from the official code, none of which changes a loss:

* the update runs in the shared SAC-N/EDAC core (`mbrl_offline.algorithms.sac`): the diversity term's
  action gradients come from the TD loss's own forward pass through an explicit backward of the ReLU
  critic, the actor's gradient through a hand-written backward, where the official code runs a second
  critic forward and autograd's double backward: the same values (tested), with fewer operations;
* log(1 - tanh(u)^2) in log pi is computed exactly, where the official code adds 1e-6 inside the log
  (`mbrl_offline.models.networks.TanhGaussianActor`); the two differ where |u| is large;
* the dataset's transitions include those at time limits, with their true next states (the official
  code reads ``d4rl.qlearning_dataset``, which drops them because old D4RL files stored none);
* Adam's fused kernel by default (``fused_adam``: the same maths, rounded differently);
* the target critics start as a copy of the critics (CORL's and Kit's), where the official
  ``sac_config.py`` builds them as a second, independently initialised ensemble (rlkit's way); with
  tau = 5e-3 the two converge within a few thousand updates. From the same weights, targets included,
  an update equals the official ``SACTrainer``'s (``benchmarks/vs_edac_official.py``, docs/parity.md);
* not carried over: the official options the D4RL Gym runs leave off (``max_q_backup``, a
  behaviour-cloning start ``policy_eval_start``, reward scaling and normalisation), and its rule that
  alpha stays fixed when ``deterministic_backup`` is set (here alpha is tuned whenever ``auto_alpha``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from mbrl_offline.algorithms import model_free
from mbrl_offline.algorithms.sac import SAC, SACConfig
from mbrl_offline.registry import register_agent


@dataclass
class EDACConfig(SACConfig):
    # Critic ensemble and the diversity term (the paper sets both per dataset: presets edac-*.yaml).
    num_critics: int = 10  # N: critics; the target and the actor use the min over all N
    eta: float = 1.0  # weight of the gradient-diversity term; 0 gives SAC-N
    # Networks: 3 hidden layers of 256 ReLU units for actor and critics, the official code's init
    # (rlkit's: biases 0.1, output layers U(±3e-3) for the critics and U(±1e-3) for the actor's heads).
    hidden_size: int = 256
    hidden_layers: int = 3
    init: str = "edac-official"
    # SAC: Adam learning rates (alpha's is the policy's in the official code), discount, target rate,
    # automatic entropy tuning from alpha = 1 towards -|A|, the entropy term kept in the target.
    actor_lr: float = 3e-4
    critic_lr: float = 3e-4
    alpha_lr: float = 3e-4
    gamma: float = 0.99
    tau: float = 5e-3
    init_alpha: float = 1.0
    auto_alpha: bool = True
    target_entropy: Optional[float] = None  # None: -|A|
    deterministic_backup: bool = False
    batch_size: int = 256
    # The official code computes every loss from the networks before the update (SACConfig.update_order);
    # it does not cap alpha (OfflineRL-Kit caps it at 1).
    update_order: str = "official"
    alpha_max: Optional[float] = None
    fused_adam: bool = True  # one fused kernel per optimiser step (rounds differently; same maths)

    @classmethod
    def offlinerlkit(cls, **changes) -> "EDACConfig":
        """OfflineRL-Kit's ``run_edac.py`` and ``EDACPolicy``, where they differ from the official code:
        actor and alpha learning rates 1e-4, alpha capped at 1, the alpha step after the actor's (the
        critics' target from the updated actor and alpha), Kit's initialisation and torch's unfused
        Adam; ``changes`` on top (Kit's script defaults to N = 50, hopper's setting)."""
        kit = dict(actor_lr=1e-4, alpha_lr=1e-4, alpha_max=1.0, update_order="offlinerlkit", init="offlinerlkit",
                   fused_adam=False)
        return dataclasses.replace(cls(), **{**kit, **changes})


@register_agent
class EDAC(SAC):
    """An EDAC agent: the SAC-N/EDAC learner (`mbrl_offline.algorithms.sac.SAC`) with the official EDAC
    code's defaults, published on the dataset alone (``generator=none``); any transition generator's
    data by configuration (``generator=rollouts``, or ``generator=ravl``: RAVL's)."""

    name = "edac"
    # what it is, for the docs' tables
    summary = "SAC with N critics (min target) and a penalty on the similarity of their action gradients"
    defaults_from = "the official EDAC code (snu-mllab/EDAC)"  # the code its defaults come from
    config_class = EDACConfig
    # fine-tuning with penalty=off (mbrl_offline/finetune.py): no diversity term, SAC-N
    penalty_off = {"eta": 0.0}
    published_generator = staticmethod(model_free.published_generator)


__all__ = ["EDAC", "EDACConfig"]
