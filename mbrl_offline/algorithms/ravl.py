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
ratio) are settings here.

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

from dataclasses import dataclass, field
from typing import Optional

from mbrl_offline.algorithms.model_based import ModelBasedConfig, ModelBasedSAC
from mbrl_offline.generators.rollouts import RolloutConfig
from mbrl_offline.models.dynamics import DynamicsConfig, dynamics_recipe


@dataclass
class RAVLConfig(ModelBasedConfig):
    # Critic ensemble and EDAC (the paper tunes num_critics and eta per dataset).
    num_critics: int = 10  # N: critics in the ensemble; targets and the actor use the min over all N
    eta: float = 1.0  # weight of EDAC's gradient-diversity term; 0 gives SAC-N
    # Networks: 3 hidden layers of 256 ReLU units for actor and critics, EDAC's initialisation.
    hidden_size: int = 256
    hidden_layers: int = 3
    init: str = "edac"
    # SAC: Adam learning rates, discount, target-network rate, automatic entropy tuning towards -|A|.
    actor_lr: float = 3e-4
    critic_lr: float = 3e-4
    alpha_lr: float = 3e-4
    gamma: float = 0.99
    tau: float = 5e-3
    init_alpha: float = 1.0
    auto_alpha: bool = True
    target_entropy: Optional[float] = None  # None: -|A|
    batch_size: int = 256
    fused_adam: bool = True  # one fused kernel per optimiser step (rounds differently; same maths)
    # Data: the fraction of real transitions in each batch (tuned per dataset), the rest from rollouts.
    real_ratio: float = 0.05
    # Model rollouts: k = horizon (tuned per dataset), 50k start states per epoch, buffer of 5 epochs,
    # actions sampled from the policy, no reward penalty.
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    # The dynamics ensemble: the official RAVL recipe (7 members / 5 elites, per-member log-variance
    # bounds, its 350-epoch minimum training schedule; DYNAMICS_RECIPES["ravl"]).
    dynamics: DynamicsConfig = field(default_factory=lambda: dynamics_recipe("ravl"))


class RAVL(ModelBasedSAC):
    """A RAVL agent: the SAC-N/EDAC learner plus its rollout generator.

    Build it from a dataset with `RAVL.for_dataset` (trains or loads the dynamics model), or from
    parts with a trained `GaussianEnsembleDynamics` and a termination function; train it with
    `mbrl_offline.trainer.Trainer`. Without ``dynamics`` it is the policy alone (for evaluation).
    """

    name = "ravl"
    config_class = RAVLConfig
