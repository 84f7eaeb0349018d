"""RAVL: Reach-Aware Value Learning (Sims, Lu, Foerster, Teh; "The Edge-of-Reach Problem in Offline
Model-Based Reinforcement Learning", NeurIPS 2024; code: github.com/anyasims/edge-of-reach).

Model rollouts of k steps from dataset states create "edge-of-reach" states: reached only at the
last step, so they are used as Bellman targets but never trained as inputs, and their values are
arbitrary. RAVL keeps MBPO's rollouts without any dynamics penalty and trains an EDAC critic
ensemble, whose minimum over N critics acts as a penalty proportional to the critics' spread, which
stays high exactly at those states:

    y      = r + gamma (1 - d) (min_i Qbar_i(s', a') - alpha log pi(a'|s')),   a' ~ pi(.|s')
    L_Q    = sum_i E[(Q_i(s, a) - y)^2] + eta E[1/(N-1) sum_{i != j} <g_i, g_j>],  g_i = grad_a Q_i / |grad_a Q_i|
    L_pi   = E[alpha log pi(a|s) - min_i Q_i(s, a)]
    L_alpha = E[-log alpha (log pi(a|s) - |A|)]

Per epoch: 50,000 rollouts of k = 5 steps with the current stochastic policy, a random elite per row
and step, sampled next states and rewards (`mbrl_offline.generators.BranchedRollouts`); then 1000
updates on batches of 256 with 5% real transitions. Defaults are the official code's
(``TrainConfig`` in ``train_ravl_agent.py``); the per-dataset values the paper tuned (N, eta, k, real
ratio) are settings here (``algo.num_critics``, ``algo.eta``, ``generator.rollout.horizon``,
``generator.mixing.real_ratio``).

The learner is `mbrl_offline.algorithms.edac.EDAC` (``algo=edac``, EDAC on the dataset alone): RAVL
is that class with the official RAVL code's defaults (CORL's EDAC: its initialisation ``init="edac"``
and its update order ``update_order="corl"``, where EDAC's defaults follow the official EDAC code)
and the generator it was published with.

Differences from the official code, none of which changes the losses:

* the update runs in the shared SAC-N/EDAC core (`mbrl_offline.algorithms.sac`), which computes the
  diversity term's action gradients without a second forward pass or autograd's double backward;
* start states are all dataset transitions, including those at time limits (the official code reads
  ``d4rl.qlearning_dataset``, which drops them because old D4RL files stored no true next state there);
* model transitions with non-finite predictions are dropped (see `BranchedRollouts`);
* the dynamics recipe is the official one (``dynamics_recipe("ravl")``) but for the resampling and the
  input statistics (`mbrl_offline.models.dynamics` lists both).

``python benchmarks/vs_official.py --learn`` trains the official code and this class side by side on
the same data (docs/parity.md).
"""
from __future__ import annotations

from dataclasses import dataclass

from mbrl_offline.algorithms.edac import EDAC, EDACConfig
from mbrl_offline.algorithms.model_based import mbpo_rollouts
from mbrl_offline.generators.rollouts import RolloutConfig, RolloutGeneratorConfig
from mbrl_offline.models.dynamics import dynamics_recipe
from mbrl_offline.registry import register_agent


@dataclass
class RAVLConfig(EDACConfig):
    # The official RAVL code's settings are EDAC's defaults (EDACConfig: N = 10 critics, eta = 1, 3 x 256
    # ReLU networks, Adam at 3e-4, gamma 0.99, tau 5e-3, alpha tuned from 1 towards -|A|, the entropy
    # term in the target, alpha uncapped, batches of 256; the paper tunes N and eta per dataset),
    # except for these two, which are CORL's EDAC's:
    init: str = "edac"  # CORL's initialisation (biases 0.1, output layers U(+-3e-3))
    update_order: str = "corl"  # alpha, actor, then the critics from the updated actor and alpha


@register_agent
class RAVL(EDAC):
    """A RAVL agent: the EDAC learner (`mbrl_offline.algorithms.edac.EDAC`) with the official RAVL
    code's defaults. Its generator (`published_generator`) is built and run by the trainer:
    `mbrl_offline.build_run` (``examples/train.py algo=ravl``) composes both."""

    name = "ravl"
    # what it is, for the docs' tables
    summary = "EDAC critic ensemble (N = 10, η = 1) on unpenalised branched rollouts"
    defaults_from = "the official RAVL code"  # the code its defaults come from
    config_class = RAVLConfig

    @classmethod
    def published_generator(cls) -> RolloutGeneratorConfig:
        """The official code's data: per generation (every 1000 updates) 50k rollouts of k = 5 steps
        (k tuned per dataset) with the policy's sampled actions and no reward penalty, a buffer of 5
        generations, 5% real rows per batch (tuned per dataset); the official RAVL dynamics recipe
        (7 members / 5 elites, its 350-epoch minimum schedule; ``DYNAMICS_RECIPES["ravl"]``)."""
        return mbpo_rollouts(RolloutConfig(), dynamics_recipe("ravl"), real_ratio=0.05)


__all__ = ["RAVL", "RAVLConfig"]
