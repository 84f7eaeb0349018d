"""COMBO: Conservative Offline Model-Based Policy Optimization (Yu, Kumar, Rafailov, Rajeswaran,
Levine & Finn, NeurIPS 2021), with the settings of OfflineRL-Kit's ``run_example/run_combo.py`` /
``offlinerlkit/policy/model_based/combo.py``.

CQL (`mbrl_offline.algorithms.cql`, whose update this is, step for step) on batches that mix real rows
D with the rows of short model rollouts M (real_ratio 0.5: 128 + 128 of 256), where the conservative
term pushes Q down on the mixed (or model) states and up on the real transitions only. Per update,
with two critics Q_i (targets Qbar_i), a tanh-Gaussian actor pi, R = ``num_repeats``, w =
``cql_weight``, T = ``temperature``, and every E[.] without a subscript over the mixed batch D u M:

1. actor:   L(pi) = E[alpha log pi(a~|s) - min_i Q_i(s, a~)],  a~ ~ pi(.|s);
2. alpha:   L(log alpha) = -log alpha E[log pi(a~|s) + H_target],  H_target = -|A|, no clamp;
3. critics: y = r + gamma (1 - d) min_i Qbar_i(s', a'), a' ~ pi(.|s') (``deterministic_backup``), and

            L(Q_i) = E[(Q_i(s, a) - y)^2]
                     + w (T E_{s ~ rho}[log sum_j exp(v_ij / T)] - E_{(s,a) ~ D}[Q_i(s, a)])

            with v the 3R importance-weighted scores of a state (R policy samples at s, R at s', R
            uniform actions, all scored at s: `CQLRegulariser`); the states rho are ``rho_s``: "mix",
            the batch's rows D u M (with their s'), Kit's default, or "model", the rows from M only
            (the paper's rho = d^pi_M); the push-up term is over the real rows D only
            (``data_rows="real"``, Kit since its pull request #9) or over D u M (``data_rows="mix"``,
            Kit before it). ``lse_mode`` as in CQL: "joint" (the paper's log-sum-exp over the 3R scores
            of a state) or "per_repeat" (Kit's);
4. Polyak averaging of the target critics with rate tau; the Lagrange variant as in CQL (off).

The actor's learning rate is annealed to 0 over the run's epochs (``actor_lr_cosine``, Kit's
``CosineAnnealingLR(actor_optim, T_max=epochs)``, stepped once per epoch; the trainer's epochs, so a
shorter run anneals over its own length).

The published generator (`COMBO.published_generator`): every 1000 updates, 50,000 start states from
the data rolled out for h = 5 steps with the stochastic actor in OfflineRL-Kit's dynamics ensemble
(``dynamics_recipe("offlinerlkit")``, the same fit as MOPO's), terminated rollouts stopped, no reward
penalty, 5 generations retained, 50% real rows per batch. Per-dataset (h, w), from ``run_combo.py``'s
docstring: ``mbrl_offline/configs/preset/combo-*.yaml`` (``generator.rollout.horizon``,
``algo.cql_weight``). Defaults otherwise Kit's, those of its CQL: w = 5, T = 1, R = 10, actor and
critics 3 x 256 ReLU, Adam at 1e-4 (actor, cosine-annealed), 3e-4 (critics), 1e-4 (alpha, from 1),
gamma 0.99, tau 5e-3, batch 256, deterministic backup, no max backup, no Lagrange.

Which rows are real: the batch's ``synthetic`` field (`mbrl_offline.buffer.Mixing` marks the
generator's rows), so any generator's data works. A batch with no model rows (``generator=none``, or
before the first generation) takes the log-sum-exp over its rows whatever ``rho_s``; a batch with no
real rows (``generator=synther``, whose samples replace the data) takes the push-up term over its
rows: then COMBO is CQL on that data. With per-row ``weights`` (the ``weights`` mixing rule) each
expectation over a subset of rows is the weighted mean over that subset.

Written with autograd, top to bottom. Differences from OfflineRL-Kit, and why:

* ``lse_mode=joint`` by default: Kit's ``learn`` drops the result of its reshape, so its log-sum-exp
  runs over the 3 scores of each (state, repeat) and is averaged over the repeats (the same dead loop
  as its CQL; `mbrl_offline.algorithms.cql`). The default follows the paper, as our CQL's does;
  ``lse_mode=per_repeat`` is Kit's number (``tests/test_combo.py`` checks it against Kit's
  ``COMBOPolicy.learn`` when a checkout is given);
* the push-up term reads the critics' values at the real rows from the forward pass over the whole
  batch (Kit runs the critics once more on the real half: the same values and gradients);
* everything our CQL differs in from Kit's CQL (`mbrl_offline.algorithms.cql`): the regulariser's
  policy samples drawn without gradient (Kit backpropagates the critics' losses into the actor and
  zeroes that gradient before the actor's next step: the same steps) and from one pass of the actor per
  state for its R draws (`TanhGaussianActor.repeated_draws`), uniform samples from the env's
  box with its density (Kit: [low[0], high[0]] and 0.5^|A|, the same for MuJoCo's unit box), the two
  critics as one batched ensemble with one Adam (their losses are independent: the same steps), the
  library's `TanhGaussianActor` (log(1 - tanh^2) exact where Kit adds 1e-6);
* Kit's ``uniform_rollout`` (rollouts with uniform actions, off in ``run_combo.py``) is not offered;
* the rollouts are the library's `BranchedRollouts` (as MOPO's): Kit's dynamics step draws its Gaussian
  noise with numpy in float64, ours with torch in float32 (the same distribution).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from mbrl_offline.algorithms.cql import CQL, CQLConfig
from mbrl_offline.algorithms.model_based import mbpo_rollouts
from mbrl_offline.algorithms.weights import batch_mean
from mbrl_offline.errors import ConfigError
from mbrl_offline.generators.rollouts import RolloutConfig, RolloutGeneratorConfig
from mbrl_offline.models.dynamics import dynamics_recipe
from mbrl_offline.registry import register_agent
from mbrl_offline.utils import anneal_cosine

RHO_S = ("mix", "model")  # the log-sum-exp's states: the mixed batch's rows (Kit's default), or the model rows
DATA_ROWS = ("real", "mix")  # the push-up term's rows: the real ones (Kit after its PR #9), or all (before it)


@dataclass
class COMBOConfig(CQLConfig):
    """OfflineRL-Kit's ``run_combo.py``: CQL's settings (w = 5, T = 1, R = 10, 3 x 256, actor 1e-4,
    critics 3e-4, alpha 1e-4, deterministic backup, no Lagrange; see `CQLConfig`, whose fields all
    apply), and these."""
    # The states of the push-down (log-sum-exp) term: "mix", the batch's real and model rows (Kit's
    # default since 2023-05-22), or "model", the model rows only (the paper's rho = d^pi_M).
    rho_s: str = "mix"
    # The rows of the push-up term E[Q(s, a)]: "real", the data's (Kit since its PR #9, with which its
    # published numbers were made), or "mix", every row of the batch (Kit before that PR).
    data_rows: str = "real"
    # Anneal the actor's learning rate to 0 over the run's epochs (Kit's CosineAnnealingLR, T_max = epochs).
    actor_lr_cosine: bool = True

    def __post_init__(self):
        super().__post_init__()
        for name, choices in (("rho_s", RHO_S), ("data_rows", DATA_ROWS)):
            if getattr(self, name) not in choices:
                raise ConfigError(f"algo.{name} = '{getattr(self, name)}' is unknown; choose one of {', '.join(choices)}.")


def rows_of(batch: dict[str, torch.Tensor], kind: str) -> Optional[torch.Tensor]:
    """The indices of the batch's ``kind`` rows ("real" or "model", by its ``synthetic`` field), or None
    where that is every row or none of them (then an expectation over them is over the whole batch)."""
    synthetic = batch.get("synthetic")
    if synthetic is None:  # a batch without the field is all real
        return None
    chosen = synthetic if kind == "model" else ~synthetic
    rows = chosen.nonzero().squeeze(1)
    return None if len(rows) in (0, len(chosen)) else rows


def subset_mean(values: torch.Tensor, weights: Optional[torch.Tensor]) -> torch.Tensor:
    """The mean over some of the batch's rows of ``values`` ``(N, b)``, one per critic ``(N,)``: plain, or
    weighted by those rows' ``weights`` ``(b,)`` (which the whole batch's sum to 1) normalised to sum to 1."""
    if weights is None:
        return values.mean(dim=1)
    return (values * weights).sum(-1) / weights.sum()


@register_agent
class COMBO(CQL):
    """A COMBO agent: CQL on real and model rows, pushing Q down on the states of ``rho_s`` and up on
    the real transitions (module docstring). Build it with `COMBO.for_dataset`."""

    name = "combo"
    # what it is, for the docs' tables
    summary = ("CQL on real and model-rollout rows: Q pushed down at policy and uniform actions on the mixed "
               "(or model) states, up on the real transitions")
    defaults_from = "OfflineRL-Kit's `run_combo.py` (the paper's 3R-way log-sum-exp)"
    config_class = COMBOConfig

    @classmethod
    def published_generator(cls) -> RolloutGeneratorConfig:
        """OfflineRL-Kit's: per generation (every 1000 updates) 50k rollouts of h = 5 steps with the
        stochastic actor, no reward penalty (h tuned per dataset: mbrl_offline/configs/preset/combo-*.yaml),
        5 generations kept, 50% real rows per batch; OfflineRL-Kit's dynamics recipe."""
        return mbpo_rollouts(RolloutConfig(horizon=5), dynamics_recipe("offlinerlkit"), real_ratio=0.5)

    def conservative_gap(self, batch: dict[str, torch.Tensor], obs: torch.Tensor, next_obs: torch.Tensor,
                         q: torch.Tensor, weights: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(gap, ood)``: each critic's ``T E_{s ~ rho}[log sum exp(v / T)] - E_{(s,a) ~ D}[Q(s, a)]``
        ``(N,)``, with rho the states of ``rho_s`` and D the rows of ``data_rows``, and the log-sum-exp
        per state of rho ``(N, |rho|)`` (``q``: the critics at the batch's actions ``(N, B)``)."""
        cfg = self.config
        states = rows_of(batch, "model") if cfg.rho_s == "model" else None
        if states is None:  # the log-sum-exp over every row of the batch
            ood = self.regulariser.ood_values(self.critic, self._regulariser_sample, obs, next_obs)
            push_down = batch_mean(ood, weights)
        else:  # over the model rows
            ood = self.regulariser.ood_values(self.critic, self._regulariser_sample, obs[states], next_obs[states])
            push_down = subset_mean(ood, None if weights is None else weights[states])
        real = rows_of(batch, "real") if cfg.data_rows == "real" else None
        if real is None:  # the push-up term over every row
            push_up = batch_mean(q, weights)
        else:  # over the real rows
            push_up = subset_mean(q[:, real], None if weights is None else weights[real])
        return push_down - push_up, ood

    def on_epoch_end(self, epoch: int, total_epochs: int) -> None:
        """Called by the trainer after each epoch: with ``actor_lr_cosine`` the actor's learning rate
        follows ``actor_lr (1 + cos(pi epoch / total_epochs)) / 2`` (Kit's ``CosineAnnealingLR`` with
        ``T_max = epochs``, stepped per epoch), computed from the epoch so a resumed run continues it."""
        if self.config.actor_lr_cosine:
            anneal_cosine(self.actor_optim, self.config.actor_lr, epoch, total_epochs)


__all__ = ["COMBO", "COMBOConfig"]
