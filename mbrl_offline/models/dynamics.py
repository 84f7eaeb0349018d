"""Gaussian dynamics ensemble: N probabilistic MLPs predicting the next-state change and the reward.

Each member models p(s' - s, r | s, a) = N(mu(x), diag(exp(logvar(x)))) with x = normalise([s, a]).
All members are evaluated together: every layer is one batched matmul over the ensemble (no Python
loop over members), for training, validation and prediction alike.

Defaults follow the official RAVL code (anyasims/edge-of-reach, ``train_dynamics_model.py`` and
``dynamics_training/{ensemble,net}.py``, adapted from philipjball/ReadyPolicyOne, MBPO-style): 7
members, 5 elites, 4 hidden layers of 200 SiLU units, normal init with std 1/(2 sqrt(fan_in)) cut at
±2 std, one pair of learnable log-variance bounds shared by the members with PETS' soft clamp, loss
``sum_members mean(logvar + (y - mu)^2 exp(-logvar)) + 0.01 (sum max_logvar - sum min_logvar)``,
per-layer L2 weight decay, Adam at 1e-3, batch 256, 20% holdout, bootstrap resampling, early
stopping on the holdout MSE (a member improves when its error drops by more than 1%; stop after 5
epochs without any improvement), elites = the members with the lowest holdout MSE.

Each agent trains the recipe of the code on which its coefficients were tuned (`DYNAMICS_RECIPES`,
`dynamics_recipe`): RAVL the official RAVL code's, MOPO, MOBILE and COPlanner OfflineRL-Kit's. Both
codes keep one pair of log-variance bounds for all members (``logvar_bounds="shared"``), so the 0.01
penalty on the bounds meets the NLL pull of all seven members at once, and both leave the bounds out
of the members' best snapshots (they keep their last values). This library used to give each member
its own pair (``"member"``, still an option): the bounds then settled tighter, and MOPO's penalty,
the largest predicted std over the members, came out smaller than the one its lambda was tuned for
(docs/parity.md has the measurements). The recipes differ in:

* ``bootstrap``: OfflineRL-Kit draws one resample per member before training and reshuffles it each
  epoch (``"once"``); RAVL's recipe here draws a fresh resample per member and epoch
  (``"every_epoch"``; the official code draws 7 resamples once and re-permutes which member trains on
  which each epoch, so that a member also sees most of the data over the epochs);
* ``input_clip``: RAVL clips the standardised inputs at ±10, OfflineRL-Kit does not;
* ``init_truncation``: RAVL cuts the init normal at ±2 std; OfflineRL-Kit's cut (torch's default, ±2
  absolute) is about 57 std, i.e. none;
* the holdout: 20% (RAVL), min(20%, 1000 rows) (OfflineRL-Kit); ``min_epochs``: 350 (RAVL, with one
  learning-rate drop if patience runs out earlier), 0 (OfflineRL-Kit's plain early stopping).

Measured side by side with both codes (docs/parity.md, ``benchmarks/vs_offlinerlkit.py`` and
``benchmarks/vs_official.py --learn``, hopper-medium, 25 epochs at most): the holdout error, MOPO's u,
the rollout rewards and the agents' Q agree within 3-4%, but the shared upper log-variance bound ends
lower here (about -3.5 against -2.5 for RAVL's recipe, -2.6 against -1.9 for OfflineRL-Kit's; equal
on halfcheetah-medium), for a reason not found yet.

Options beyond both codes, for other methods' ensembles: ``activation`` (SiLU or LeakyReLU),
``layer_norm``, ``logvar_bounds="fixed"`` with ``logvar_min``/``logvar_max``, and ``step(...,
members=)``, which takes the member of each row from the caller (one member for a whole rollout)
instead of drawing an elite per row and step. SiLU models without LayerNorm and with learned bounds
train with a hand-written step (`_SiLUEnsembleTrainingStep`); the others through autograd. Fitting,
early stopping and elite selection are `mbrl_offline.models.fitting`'s, for any member-batched ensemble.

NEUBAY's posterior (``dynamics_recipe("neubay")``, twni2016/neubay's ``offline_world``) adds, each an
option whose default leaves the recipes above unchanged: ``init="uniform"`` (Equinox's Linear init),
``variance_head="log_std"`` (log-std soft-clamped to [-5, 0.25]), ``normalise_outputs`` (targets
[(s' - s) / std_s, (r - mean_r) / std_r], the official s'_norm - s_norm), ``statistics="all_population"``,
``loss="mean_nll"``, ``optimizer="adamw"``, ``drop_last=False``, ``skip_timeouts`` and
``record_uncertainty``; and `posterior_step` (every elite on every row: the rows' uncertainty U and
each row's own member's sample), `data_uncertainty` with `uncertainty_threshold`/`uncertainty_mean`.
Differences from the official posterior: the holdout is ``round(0.2 n)`` rows (at most 1000) drawn with
the config's seed, not sklearn's ``int(0.2 n)`` with random_state 42; the official data loop also
drops the dataset's last row, which here is left out only when it is a timeout (`OfflineDataset`
marks the end of the data as one); the elites are chosen from the members' best holdout MSE at the
end of fitting, which is what the official code recomputes when it loads the model.

Deliberate differences from both codes:

* Inputs are standardised with the mean and (unbiased) std of the training inputs (the official RAVL
  filter is fed ``observations[0]`` once plus all next observations, a quirk with no purpose;
  OfflineRL-Kit takes the population std: a factor of 1 + 1/(2n) on the std).
* A final partial batch of an epoch is dropped (OfflineRL-Kit trains on it): at most 255 of the
  epoch's rows, which a fresh shuffle puts in the next epoch's batches.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from torch import nn

from mbrl_offline.cache import cache_root, load_or_fit
from mbrl_offline.config import (check_field_types, require_above_zero,
                                 require_in_range, require_nonnegative, require_positive)
from mbrl_offline.data.dataset import true_successors
from mbrl_offline.errors import CheckpointError, ConfigError, NotFittedError
from mbrl_offline.models.ensemble import EnsembleLayerNorm, EnsembleLinear, MemberGroups, member_matmul
from mbrl_offline.models.fitting import fit_ensemble, select_elites, split_holdout
from mbrl_offline.models.uncertainty import (epistemic_rms, max_aleatoric_std, max_pairwise_distance, mean_disagreement,
                                            sample_members, sampled_disagreement)
from mbrl_offline.torch_files import load_plain, save_plain
from mbrl_offline.utils import CUDAGraphed


BOOTSTRAP = ("every_epoch", "once", "none")
LOGVAR_BOUNDS = ("member", "shared", "fixed")
INITS = ("trunc_normal", "uniform")
VARIANCE_HEADS = ("logvar", "log_std")
STATISTICS = ("train_unbiased", "all_population", "mean_absolute_deviation")
LOSSES = ("sum_members", "mean_nll", "mse")
OPTIMIZERS = ("adam_l2", "adamw")
ACTIVATIONS = {"silu": nn.functional.silu, "leaky_relu": nn.functional.leaky_relu,  # leaky_relu: slope 0.01
               "relu": nn.functional.relu}


@dataclass
class DynamicsConfig:
    ensemble_size: int = 7  # members trained together
    num_elites: int = 5  # members used for prediction: the lowest holdout MSE
    hidden_size: int = 200
    hidden_layers: int = 4
    # of the hidden layers: silu (MBPO, RAVL, OfflineRL-Kit), leaky_relu (slope 0.01, NEUBAY) or relu (MOReL)
    activation: str = "silu"
    layer_norm: bool = False  # LayerNorm (affine, per member) after each hidden layer's linear map (NEUBAY)
    learning_rate: float = 1e-3
    # L2 weight decay of each layer's weights (hidden layers, then the output head), as in RAVL; () for none.
    weight_decay: tuple = (2.5e-5, 5e-5, 7.5e-5, 7.5e-5, 1e-4)
    logvar_bound_coef: float = 0.01  # weight of the penalty that keeps the learned log-variance bounds tight
    # The learned log-variance bounds: "shared" (one pair for all members, which every member's NLL
    # pulls on and which keeps its last value: the official RAVL code's Ensemble and OfflineRL-Kit's
    # EnsembleDynamicsModel), "member" (each member its own pair, restored with the member's snapshot)
    # or "fixed" (not learned and not penalised: the log-variance is soft-clamped to [logvar_min,
    # logvar_max]; NEUBAY's log-std in [-5, 0.25] is log-variance in [-10, 0.5]).
    logvar_bounds: str = "shared"
    logvar_min: float = -10.0  # the lower bound's value: learned bounds start there, fixed ones stay
    logvar_max: float = 0.5  # the upper bound's value, likewise
    # Weights start from a normal with std 1/(2 sqrt(fan_in)) cut at ±init_truncation stds (RAVL: 2);
    # None: not cut (OfflineRL-Kit calls trunc_normal_ with its default cut at ±2 absolute, ~57 stds).
    init_truncation: Optional[float] = 2.0
    batch_size: int = 256
    holdout_ratio: float = 0.2  # fraction of the data held out for early stopping and elite selection
    max_holdout: Optional[int] = None  # cap on holdout rows (OfflineRL-Kit uses 1000); None: no cap
    # Each member's training rows: "every_epoch" (a fresh resample with replacement per member and
    # epoch), "once" (one resample per member drawn before training, reshuffled each epoch:
    # OfflineRL-Kit) or "none" (every member its own shuffle of all rows). True/False read as
    # "every_epoch"/"none" (configs saved before "once" existed).
    bootstrap: str = "every_epoch"
    max_epochs: int = 2000
    min_epochs: int = 0  # RAVL: 350 (early stopping before then lowers the learning rate once instead)
    patience: int = 5  # epochs without any member improving before stopping
    improvement_threshold: float = 0.01  # relative holdout-MSE drop that counts as an improvement
    input_clip: Optional[float] = 10.0  # normalised inputs are clipped to ±input_clip; None: no clip (OfflineRL-Kit)
    seed: int = 0
    # --- NEUBAY's posterior (DYNAMICS_RECIPES["neubay"]); the defaults keep the recipes above as they were.
    # "trunc_normal" (the std and cut above) or "uniform": weights and biases U(±1/sqrt(fan_in)) (Equinox's
    # default Linear init, NEUBAY).
    init: str = "trunc_normal"
    # "logvar": the head's second half is a log-variance soft-clamped to the log-variance bounds above;
    # "log_std": a log-std soft-clamped to [log_std_min, log_std_max] (NEUBAY; needs logvar_bounds="fixed").
    # The two clamps differ (softplus(2x) != 2 softplus(x)), so [-5, 0.25] is not [-10, 0.5] in log-variance.
    variance_head: str = "logvar"
    log_std_min: float = -5.0
    log_std_max: float = 0.25
    # The members predict normalised targets [(s' - s) / std_s, (r - mean_r) / std_r] (with the
    # observations' statistics, as NEUBAY's s'_norm - s_norm); predict/step return raw units.
    normalise_outputs: bool = False
    # The normalisers' statistics: "train_unbiased" (training rows, unbiased std, floored at 1e-6),
    # "all_population" (every row before the holdout split, population std, a std < 1e-12 becomes 1: NEUBAY)
    # or "mean_absolute_deviation" (training rows, every scale a mean absolute deviation + 1e-8, and with
    # normalise_outputs the targets shifted by their own mean and scaled by their own deviation: MOReL's
    # mjrl WorldModel).
    statistics: str = "train_unbiased"
    # "sum_members": mean over rows and outputs of logvar + (y - mu)^2 / var, summed over members (plus the
    # bound penalty); "mean_nll": the Gaussian NLL with its constants, 1/2 log 2 pi + log sigma +
    # (y - mu)^2 / (2 sigma^2), averaged over members, rows and outputs (NEUBAY); "mse": the mean's squared
    # error averaged over rows and outputs, summed over members (deterministic members: MOReL; the variance
    # head is not trained and needs logvar_bounds="fixed").
    loss: str = "sum_members"
    # "adam_l2": Adam with weight_decay's L2 gradients per layer; "adamw": AdamW, decoupled decay
    # adamw_weight_decay on every parameter (LayerNorm and biases included: NEUBAY's optax.adamw).
    optimizer: str = "adam_l2"
    adamw_weight_decay: float = 0.0
    drop_last: bool = True  # drop an epoch's final partial batch (False: train on it, NEUBAY)
    skip_timeouts: bool = False  # leave rows with ``timeouts`` out of the model's data (NEUBAY)
    # After fitting, store the posterior uncertainty of every fitting row (`data_uncertainty`, for
    # `uncertainty_threshold` and `uncertainty_mean`; NEUBAY's rollouts truncate on it).
    record_uncertainty: bool = False

    def __post_init__(self):
        if isinstance(self.bootstrap, bool):  # models saved when bootstrap was a bool (before its type check)
            self.bootstrap = "every_epoch" if self.bootstrap else "none"
        check_field_types(self, "dynamics")  # types first; nested mappings become configs
        require_positive(self, "ensemble_size", "hidden_size", "hidden_layers", "batch_size", "max_epochs", "patience",
                         "max_holdout", section="dynamics")
        require_nonnegative(self, "min_epochs", "seed", "logvar_bound_coef", "improvement_threshold",
                            "adamw_weight_decay", section="dynamics")
        require_above_zero(self, "learning_rate", "init_truncation", "input_clip", section="dynamics")
        # a holdout of all rows leaves nothing to train on (too few rows are refused when fitting)
        require_in_range(self, "holdout_ratio", 0.0, 1.0, high_open=True, section="dynamics")
        require_in_range(self, "logvar_min", section="dynamics")
        require_in_range(self, "logvar_max", section="dynamics")
        if not isinstance(self.weight_decay, (tuple, list)) or not all(
                isinstance(w, (int, float)) and not isinstance(w, bool) and 0 <= w < math.inf for w in self.weight_decay):
            raise ConfigError(f"dynamics.weight_decay must be a list of numbers >= 0 (one per hidden layer and "
                              f"one for the head), got {self.weight_decay!r}.")
        if self.bootstrap not in BOOTSTRAP:
            raise ConfigError(f"unknown dynamics bootstrap '{self.bootstrap}'; choose one of {', '.join(BOOTSTRAP)}.")
        if self.activation not in ACTIVATIONS:
            raise ConfigError(f"unknown dynamics activation '{self.activation}'; choose one of {', '.join(ACTIVATIONS)}.")
        if not self.logvar_min < self.logvar_max:
            raise ConfigError(f"dynamics logvar_min ({self.logvar_min}) must be below logvar_max ({self.logvar_max}).")
        if self.logvar_bounds not in LOGVAR_BOUNDS:
            raise ConfigError(f"unknown dynamics logvar_bounds '{self.logvar_bounds}'; choose one of "
                              f"{', '.join(LOGVAR_BOUNDS)}.")
        if not isinstance(self.num_elites, int) or not 0 < self.num_elites <= self.ensemble_size:
            raise ConfigError(f"num_elites must be in 1..ensemble_size ({self.ensemble_size}), got {self.num_elites}.")
        if len(self.weight_decay) not in (0, self.hidden_layers + 1):
            raise ConfigError(f"weight_decay needs {self.hidden_layers + 1} values (hidden layers + head), "
                              f"got {len(self.weight_decay)}.")
        for name, choices in (("init", INITS), ("variance_head", VARIANCE_HEADS), ("statistics", STATISTICS),
                              ("loss", LOSSES), ("optimizer", OPTIMIZERS)):
            if getattr(self, name) not in choices:
                raise ConfigError(f"unknown dynamics {name} '{getattr(self, name)}'; choose one of {', '.join(choices)}.")
        require_in_range(self, "log_std_min", section="dynamics")
        require_in_range(self, "log_std_max", section="dynamics")
        if self.variance_head == "log_std":
            if self.logvar_bounds != "fixed":
                raise ConfigError(f"dynamics variance_head 'log_std' has fixed bounds (log_std_min, log_std_max); "
                                  f"set logvar_bounds='fixed', got '{self.logvar_bounds}'.")
            if not self.log_std_min < self.log_std_max:
                raise ConfigError(f"dynamics log_std_min ({self.log_std_min}) must be below log_std_max "
                                  f"({self.log_std_max}).")
        if self.loss == "mse" and self.logvar_bounds != "fixed":
            raise ConfigError(f"dynamics loss 'mse' trains the means only, so learned log-variance bounds would drift "
                              f"under their penalty alone; set logvar_bounds='fixed', got '{self.logvar_bounds}'.")
        if self.optimizer == "adamw" and any(self.weight_decay):
            raise ConfigError("dynamics optimizer 'adamw' decays through adamw_weight_decay; set weight_decay to "
                              f"() or zeros, got {tuple(self.weight_decay)}.")


# Each agent's dynamics recipe: the settings of the code on which its coefficients were tuned, written
# out in full (tests/test_dynamics.py checks them), as keyword arguments of DynamicsConfig.
DYNAMICS_RECIPES = {
    # The official RAVL code (anyasims/edge-of-reach, train_dynamics_model.py; MBPO's recipe). Both
    # codes keep one pair of log-variance bounds for all members, out of the members' snapshots.
    "ravl": dict(ensemble_size=7, num_elites=5, hidden_size=200, hidden_layers=4, activation="silu", layer_norm=False,
                 learning_rate=1e-3, weight_decay=(2.5e-5, 5e-5, 7.5e-5, 7.5e-5, 1e-4), logvar_bound_coef=0.01,
                 logvar_bounds="shared", logvar_min=-10.0, logvar_max=0.5, init_truncation=2.0, batch_size=256, holdout_ratio=0.2, max_holdout=None,
                 bootstrap="every_epoch", max_epochs=2000, min_epochs=350, patience=5,
                 improvement_threshold=0.01, input_clip=10.0),
    # OfflineRL-Kit's EnsembleDynamicsModel and EnsembleDynamics.train as run_mopo.py and run_mobile.py
    # call them: one bootstrap resample per member reshuffled each epoch, holdout min(20%, 1000) rows,
    # no input clipping, no minimum epochs (run_mobile.py caps training at 30 epochs: MOBILE's config),
    # an init normal that is not cut.
    "offlinerlkit": dict(ensemble_size=7, num_elites=5, hidden_size=200, hidden_layers=4, activation="silu",
                         layer_norm=False, learning_rate=1e-3, weight_decay=(2.5e-5, 5e-5, 7.5e-5, 7.5e-5, 1e-4),
                         logvar_bound_coef=0.01, logvar_bounds="shared", logvar_min=-10.0, logvar_max=0.5,
                         init_truncation=None, batch_size=256,
                         holdout_ratio=0.2,
                         max_holdout=1000, bootstrap="once", max_epochs=2000, min_epochs=0, patience=5,
                         improvement_threshold=0.01, input_clip=None),
    # NEUBAY's posterior (twni2016/neubay, offline_world/{cont_ensemble,modules,losses}.py, base.yaml):
    # 128 members of 4 x [Linear(200) -> LayerNorm (affine) -> LeakyReLU(0.01)], Equinox's uniform init,
    # a log-std head soft-clamped to [-5, 0.25], outputs [s', r] normalised with the population
    # statistics of all rows (no input clip), the mean Gaussian NLL, AdamW (1e-3, decay 5e-5 on every
    # parameter), batch 256 with the last partial batch trained, every member its own permutation of all
    # rows each epoch, holdout min(20%, 1000), a member's snapshot when its holdout MSE drops by more
    # than 1%, patience 5 and no minimum, timeout rows left out, the 100 members of lowest holdout MSE
    # kept. max_epochs is uncapped here: the official presets cap it (random/medium 1200,
    # medium-expert 600).
    "neubay": dict(ensemble_size=128, num_elites=100, hidden_size=200, hidden_layers=4, activation="leaky_relu",
                   layer_norm=True, learning_rate=1e-3, weight_decay=(), logvar_bound_coef=0.0, logvar_bounds="fixed",
                   logvar_min=-10.0, logvar_max=0.5, init_truncation=None, batch_size=256, holdout_ratio=0.2,
                   max_holdout=1000, bootstrap="none", max_epochs=1_000_000, min_epochs=0, patience=5,
                   improvement_threshold=0.01, input_clip=None, init="uniform", variance_head="log_std",
                   log_std_min=-5.0, log_std_max=0.25, normalise_outputs=True, statistics="all_population",
                   loss="mean_nll", optimizer="adamw", adamw_weight_decay=5e-5, drop_last=False, skip_timeouts=True,
                   record_uncertainty=True),
    # MOReL's deterministic models (aravindr93/mjrl v2, mjrl/algos/mbrl/nn_dynamics.py with
    # projects/morel/configs/d4rl_hopper_medium.txt): 4 members of 2 x 512 ReLU units, squared error of
    # the mean next-state change, Adam at 1e-3 without weight decay, batch 256, every member its own
    # shuffle of all rows, 25 epochs, inputs and targets (the state change) shifted by their means and
    # divided by their mean absolute deviations (statistics="mean_absolute_deviation"). Here the reward
    # is one more output (the official code uses a hand-written reward function, for hopper only), 1000
    # rows are held out to log the error and keep each member's best snapshot (the official: none;
    # patience 25 never stops the 25 epochs early), the statistics come from the training rows (the
    # official: every row) and every member is an elite (the official uses all four).
    "morel": dict(ensemble_size=4, num_elites=4, hidden_size=512, hidden_layers=2, activation="relu", layer_norm=False,
                  learning_rate=1e-3, weight_decay=(), logvar_bound_coef=0.0, logvar_bounds="fixed",
                  logvar_min=-10.0, logvar_max=0.5, init_truncation=None, batch_size=256, holdout_ratio=0.2,
                  max_holdout=1000, bootstrap="none", max_epochs=25, min_epochs=0, patience=25,
                  improvement_threshold=0.01, input_clip=None, init="uniform", normalise_outputs=True,
                  statistics="mean_absolute_deviation", loss="mse"),
}

# The settings added for NEUBAY's posterior, with their defaults: a config that leaves them at these
# values caches under the key it had before they existed (`load_or_fit_dynamics`).
_POSTERIOR_DEFAULTS = dict(init="trunc_normal", variance_head="logvar", log_std_min=-5.0, log_std_max=0.25,
                           normalise_outputs=False, statistics="train_unbiased", loss="sum_members",
                           optimizer="adam_l2", adamw_weight_decay=0.0, drop_last=True, skip_timeouts=False,
                           record_uncertainty=False)


def dynamics_recipe(name: str, **overrides) -> DynamicsConfig:
    """The `DynamicsConfig` of a recipe in `DYNAMICS_RECIPES` ("ravl", "offlinerlkit", "neubay"), with ``overrides``."""
    if name not in DYNAMICS_RECIPES:
        raise ConfigError(f"unknown dynamics recipe '{name}'; choose one of {', '.join(DYNAMICS_RECIPES)}.")
    return DynamicsConfig(**{**DYNAMICS_RECIPES[name], **overrides})


class GaussianEnsembleDynamics(nn.Module):
    """A probabilistic ensemble of dynamics models; see the module docstring for the maths.

    ``fit(dataset)`` trains it; ``predict(obs, act)`` returns per-member means and log-variances of
    ``[next_obs - obs, reward]``; ``save(path)``/``load(path)`` keep weights, normaliser, elites and
    config together.

    A model knows whether it was fitted: `predict`, `step` and `sample_next_observations` raise
    `NotFittedError` on one that was neither fitted nor loaded (a freshly built model's predictions
    are noise). The flag is the buffer ``fitted``, saved in its state (a state saved before the flag
    existed counts as fitted), mirrored in the Python bool ``is_fitted`` that those calls read (no
    device sync); `mark_fitted` sets it for a model whose weights were set by hand.
    """

    def __init__(self, obs_dim: int, act_dim: int, config: DynamicsConfig = DynamicsConfig()):
        super().__init__()
        self.obs_dim, self.act_dim, self.config = obs_dim, act_dim, config
        n, width, in_dim, out_dim = config.ensemble_size, config.hidden_size, obs_dim + act_dim, obs_dim + 1
        self.hidden = nn.ModuleList()
        self.norms = nn.ModuleList()
        for i in range(config.hidden_layers):
            self.hidden.append(EnsembleLinear(in_dim if i == 0 else width, width, n))
            self.norms.append(EnsembleLayerNorm(width, n) if config.layer_norm else nn.Identity())
        self.head = EnsembleLinear(width, 2 * out_dim, n)
        # Learnable bounds of the log-variance: one pair for all members (both official codes) or one
        # pair per member, shaped to broadcast over (members, rows, outputs).
        bounds = n if config.logvar_bounds == "member" else 1
        learned = config.logvar_bounds != "fixed"
        self.max_logvar = nn.Parameter(torch.full((bounds, 1, out_dim), config.logvar_max), requires_grad=learned)
        self.min_logvar = nn.Parameter(torch.full((bounds, 1, out_dim), config.logvar_min), requires_grad=learned)
        self.activation = ACTIVATIONS[config.activation]
        self.register_buffer("input_mean", torch.zeros(in_dim))
        self.register_buffer("input_std", torch.ones(in_dim))
        self.register_buffer("elites", torch.arange(config.num_elites))
        # targets in the members' space: (raw - output_shift) / output_scale (identity unless normalise_outputs)
        self.register_buffer("output_shift", torch.zeros(out_dim))
        self.register_buffer("output_scale", torch.ones(out_dim))
        # sorted posterior uncertainty of every fitting row (record_uncertainty; empty otherwise)
        self.register_buffer("data_uncertainty", torch.zeros(0))
        if config.init == "trunc_normal":
            for layer in [*self.hidden, self.head]:
                std = 1.0 / (2.0 * math.sqrt(layer.in_features))
                cut = 2.0 if config.init_truncation is None else config.init_truncation * std  # torch's default: ±2
                nn.init.trunc_normal_(layer.weight, std=std, a=-cut, b=cut)
                nn.init.zeros_(layer.bias)
        # "uniform": EnsembleLinear's own init, U(±1/sqrt(fan_in)) for weights and biases
        self.train_log: list[dict] = []
        self.register_buffer("fitted", torch.tensor(False))  # saved with the weights
        self.is_fitted = False  # the buffer's value as a Python bool, read on every prediction

    def mark_fitted(self) -> None:
        """Count the model as fitted (`fit` does this; call it after setting the weights by hand)."""
        self.fitted.fill_(True)
        self.is_fitted = True

    def _require_fitted(self) -> None:
        if not self.is_fitted:
            raise NotFittedError("this GaussianEnsembleDynamics was never fitted, so its predictions are noise; call "
                                 "fit(dataset) first, load a fitted one (GaussianEnsembleDynamics.load, "
                                 "load_or_fit_dynamics), or call mark_fitted() after setting its weights yourself.")

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # A state saved before the flag existed is a fitted model's (only fitted models were saved).
        state_dict.setdefault(prefix + "fitted", torch.tensor(True))
        # States saved before the posterior options: identity output normaliser, no recorded uncertainty.
        state_dict.setdefault(prefix + "output_shift", torch.zeros_like(self.output_shift))
        state_dict.setdefault(prefix + "output_scale", torch.ones_like(self.output_scale))
        recorded = state_dict.setdefault(prefix + "data_uncertainty", torch.zeros(0))
        self.data_uncertainty = self.data_uncertainty.new_empty(recorded.shape)  # its length is the data's
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self.is_fitted = bool(self.fitted)

    # ------------------------------------------------------------------------------ prediction
    def normalise(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        return self._normalise_inputs(torch.cat([obs, act], dim=-1))

    def _normalise_inputs(self, x: torch.Tensor) -> torch.Tensor:
        """Standardise raw ``[s, a]`` rows with the training statistics, clipped to ±input_clip."""
        x = (x - self.input_mean) / self.input_std
        clip = self.config.input_clip
        return x if clip is None else x.clamp(-clip, clip)

    def forward(self, x: torch.Tensor, members: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalised inputs ``(B, in)`` or ``(M, B, in)`` -> mean and log-variance ``(M, B, obs_dim + 1)``
        for every member (M = N) or for the given ``members`` (indices, M = len(members)), in the members'
        output space (normalised targets with ``normalise_outputs``; `to_raw` converts)."""
        for layer, norm in zip(self.hidden, self.norms):
            x = layer(x, members)
            x = self.activation(x if isinstance(norm, nn.Identity) else norm(x, members))
        mean, logvar = self.head(x, members).chunk(2, dim=-1)
        if self.config.variance_head == "log_std":  # NEUBAY: soft clamp of the log-std, fixed bounds
            cfg = self.config
            log_std = cfg.log_std_max - nn.functional.softplus(cfg.log_std_max - logvar)
            log_std = cfg.log_std_min + nn.functional.softplus(log_std - cfg.log_std_min)
            return mean, 2.0 * log_std
        max_logvar, min_logvar = ((self.max_logvar, self.min_logvar) if members is None or len(self.max_logvar) == 1
                                  else (self.max_logvar[members], self.min_logvar[members]))
        # PETS' soft clamp keeps log-variances inside the learned [min_logvar, max_logvar].
        logvar = max_logvar - nn.functional.softplus(max_logvar - logvar)
        logvar = min_logvar + nn.functional.softplus(logvar - min_logvar)
        return mean, logvar

    def predict(self, obs: torch.Tensor, act: torch.Tensor, elites_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Each member's mean and log-variance of ``[next_obs - obs, reward]``: ``(N, B, obs_dim + 1)``
        (every member, or the elites only)."""
        self._require_fitted()
        return self.to_raw(*self(self.normalise(obs, act), self.elites if elites_only else None))

    def to_raw(self, mean: torch.Tensor, logvar: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Means and log-variances from the members' output space to raw ``[next_obs - obs, reward]``
        units (unchanged without ``normalise_outputs``)."""
        if not self.config.normalise_outputs:
            return mean, logvar
        return mean * self.output_scale + self.output_shift, logvar + 2.0 * self.output_scale.log()

    @torch.no_grad()
    def sample_next_observations(self, obs: torch.Tensor, act: torch.Tensor, samples: int,
                                 generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """``samples`` next states drawn from each elite: ``(num_elites, samples, B, obs_dim)`` (MOBILE)."""
        mean, logvar = self.predict(obs, act, elites_only=True)
        return obs + sample_members(mean, logvar, generator, samples)[..., :-1]

    @torch.no_grad()
    def step(self, obs: torch.Tensor, act: torch.Tensor, generator: Optional[torch.Generator] = None,
             deterministic: bool = False, uncertainty: bool = False,
             members: Optional[torch.Tensor] = None) -> dict[str, torch.Tensor]:
        """One model step for a batch: each row uses the member ``members[b]`` (indices into the whole
        ensemble, e.g. one member fixed for a whole rollout) or, without ``members``, an elite drawn
        uniformly at random (MBPO/RAVL); the next state and reward are sampled from it (its mean if
        ``deterministic``).

        Returns ``next_observations`` ``(B, obs_dim)``, ``rewards`` ``(B,)`` and ``member`` ``(B,)``, the
        member each row used. With ``uncertainty``
        every member is evaluated, and each row also gets (`mbrl_offline.models.uncertainty`):
        ``aleatoric`` (MOPO's max over all members of the predicted std's norm), ``disagreement``
        (COPlanner's mean over outputs of the std over all members of one sample each; the row's own
        transition is its elite's sample), ``epistemic`` (the spread of the members' mean next states) and
        ``usad`` (MOReL's largest distance between two members' mean next states).

        Without ``uncertainty`` only each row's own member is evaluated: rows are grouped by member
        and the groups run as one batched pass, 1/num_elites of evaluating every elite on every row.
        """
        self._require_fitted()
        rows, elites = len(obs), self.elites
        x = self.normalise(obs, act)
        if members is None:
            choice = torch.randint(0, len(elites), (rows,), device=obs.device, generator=generator)
            pick = elites[choice]
        else:
            pick = members.to(device=obs.device, dtype=torch.long)
            if pick.shape != (rows,):
                raise ValueError(f"members needs one index per row, shape ({rows},); got {tuple(pick.shape)}")
        if uncertainty:
            mean, logvar = self.to_raw(*self(x))  # (N, B, out): MOPO and COPlanner measure over every member
            row = torch.arange(rows, device=obs.device)
            chosen_mean, chosen_logvar = mean[pick, row], logvar[pick, row]
        elif members is None:
            chosen_mean, chosen_logvar = self.to_raw(*self._grouped_forward(x, choice, elites))
        else:  # the members in use, each row grouped with its own
            used, choice = torch.unique(pick, return_inverse=True)
            chosen_mean, chosen_logvar = self.to_raw(*self._grouped_forward(x, choice, used))
        out = chosen_mean
        if not deterministic:
            noise = torch.randn(chosen_mean.shape, device=obs.device, generator=generator)
            out = chosen_mean + noise * (0.5 * chosen_logvar).exp()
        result = {"next_observations": obs + out[:, :-1], "rewards": out[:, -1], "member": pick}
        if uncertainty:
            samples = mean.clone() if deterministic else sample_members(mean, logvar, generator)
            samples[pick, row] = out
            result["aleatoric"] = max_aleatoric_std(logvar)
            result["disagreement"] = sampled_disagreement(samples)
            result["epistemic"] = mean_disagreement(mean)
            result["usad"] = max_pairwise_distance(mean)
        return result

    def _grouped_forward(self, x: torch.Tensor, choice: torch.Tensor, members: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row ``x[b]`` through member ``members[choice[b]]`` only, in one batched pass."""
        groups = MemberGroups(choice, len(members))
        mean, logvar = self(groups.group(x), members)
        return groups.ungroup(mean), groups.ungroup(logvar)

    # ------------------------------------------------------------------------------- posterior
    def posterior_forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalised inputs ``(B, in)`` -> the elites' means and log-stds ``(E, B, obs_dim + 1)`` in the
        members' output space (normalised targets with ``normalise_outputs``)."""
        mean, logvar = self(x, self.elites)
        return mean, 0.5 * logvar

    @torch.no_grad()
    def posterior_step(self, obs: torch.Tensor, act: torch.Tensor, members: torch.Tensor,
                       generator: Optional[torch.Generator] = None) -> dict[str, torch.Tensor]:
        """One step of NEUBAY's posterior rollouts: row b follows member ``members[b]`` (an index into the
        whole ensemble; it must be an elite).

        One forward of every elite on every row gives both the row's uncertainty U (`epistemic_rms`
        of the elites' means in the members' output space: sqrt of the mean over outputs, reward
        included, of their population variance) and the row's own member's mean and std, from which
        ``[(s' - s), r]`` is sampled (mu + sigma eps in that space) and then de-normalised.

        Returns ``next_observations`` ``(B, obs_dim)``, ``rewards`` ``(B,)`` (sampled, raw units),
        ``uncertainty`` ``(B,)`` and ``member`` ``(B,)``.
        """
        self._require_fitted()
        rows = len(obs)
        members = members.to(device=obs.device, dtype=torch.long)
        if members.shape != (rows,):
            raise ValueError(f"members needs one index per row, shape ({rows},); got {tuple(members.shape)}")
        elites = self.elites
        position = torch.full((self.config.ensemble_size,), -1, dtype=torch.long, device=obs.device)
        position[elites] = torch.arange(len(elites), device=obs.device)
        index = position[members]
        if bool((index < 0).any()):
            raise ValueError(f"posterior_step takes elites as members (GaussianEnsembleDynamics.elites); got "
                             f"{sorted(set(members[index < 0].tolist()))[:5]} among them")
        mean, log_std = self.posterior_forward(self.normalise(obs, act))  # (E, B, out)
        row = torch.arange(rows, device=obs.device)
        noise = torch.randn((rows, mean.shape[-1]), device=obs.device, generator=generator)
        out = mean[index, row] + noise * log_std[index, row].exp()
        if self.config.normalise_outputs:
            out = out * self.output_scale + self.output_shift
        return {"next_observations": obs + out[:, :-1], "rewards": out[:, -1],
                "uncertainty": epistemic_rms(mean), "member": members}

    @torch.no_grad()
    def posterior_uncertainty(self, x: torch.Tensor, chunk: Optional[int] = None) -> torch.Tensor:
        """U (`posterior_step`) of normalised inputs ``(B, in)``: ``(B,)``, evaluated ``chunk`` rows at a
        time (by default, rows for about 2^22 hidden activations: 209 rows of 100 elites x 200 units;
        on a CPU much larger chunks were slower)."""
        chunk = chunk or max(1, 2 ** 22 // (len(self.elites) * self.config.hidden_size))
        return torch.cat([epistemic_rms(self.posterior_forward(x[start:start + chunk])[0])
                          for start in range(0, len(x), chunk)])

    def _recorded_uncertainty(self) -> torch.Tensor:
        if len(self.data_uncertainty) == 0:
            raise NotFittedError("this GaussianEnsembleDynamics holds no data uncertainty: fit it with "
                                 "record_uncertainty=True (the 'neubay' recipe does).")
        return self.data_uncertainty

    def uncertainty_threshold(self, q: float) -> float:
        """The ``q``-quantile of U over the fitting rows (`data_uncertainty`), linearly interpolated
        between order statistics as ``numpy.quantile``/``jnp.quantile`` do (q = 1: the largest). Read from
        the sorted values: ``torch.quantile`` refuses more than 2^24 elements."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"uncertainty_threshold takes a quantile in [0, 1], got {q}")
        values = self._recorded_uncertainty()
        position = q * (len(values) - 1)
        low = int(math.floor(position))
        high = min(low + 1, len(values) - 1)
        low_value, high_value = values[low].item(), values[high].item()
        return low_value + (high_value - low_value) * (position - low)

    def uncertainty_mean(self) -> float:
        """The mean of U over the fitting rows (`data_uncertainty`)."""
        return self._recorded_uncertainty().double().mean().item()

    # -------------------------------------------------------------------------------- training
    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The training loss on normalised inputs ``x`` and member-space targets ``y``: with
        ``loss="sum_members"`` the Gaussian NLL without constants summed over members, plus the
        log-variance bound penalty; with ``"mean_nll"`` the NLL with its constants averaged over
        members, rows and outputs (plus the penalty if the bounds are learned)."""
        mean, logvar = self(x)
        if self.config.loss == "mse":  # deterministic members (MOReL): the mean's squared error only
            return (mean - y).pow(2).mean(dim=(1, 2)).sum()
        if self.config.loss == "mean_nll":
            nll = 0.5 * (math.log(2 * math.pi) + logvar + (mean - y).pow(2) * torch.exp(-logvar)).mean()
        else:
            nll = ((mean - y).pow(2) * torch.exp(-logvar) + logvar).mean(dim=(1, 2)).sum()
        if self.config.logvar_bounds == "fixed":
            return nll
        return nll + self.config.logvar_bound_coef * (self.max_logvar.sum() - self.min_logvar.sum())

    @torch.no_grad()
    def holdout_mse(self, x: torch.Tensor, y: torch.Tensor, chunk: int = 65536) -> torch.Tensor:
        """Mean squared error of each member's mean on ``(x, y)``: ``(N,)``."""
        total = torch.zeros(self.config.ensemble_size, device=x.device)
        for start in range(0, len(x), chunk):
            mean, _ = self(x[start:start + chunk])
            total += (mean - y[start:start + chunk]).pow(2).mean(dim=2).sum(dim=1)
        return total / len(x)

    def fit(self, dataset, device: str | torch.device = "cpu", progress: bool = True,
            cuda_graph: bool = True, min_epochs: Optional[int] = None) -> list[dict]:
        """Train on an `OfflineDataset` (or anything with its transition arrays); returns the epoch log.

        Rows whose ``next_observations`` are not the true successors (D4RL files without stored
        next observations: terminal rows) are left out, since the model would learn a false transition.
        On a CUDA device, with ``cuda_graph`` (the default), a training batch (the hand-written step and
        Adam's step) is recorded once as a CUDA graph and replayed (`mbrl_offline.utils.CUDAGraphed`):
        at batch 256 its launches, not the GPU's arithmetic, set the pace. Models without the
        hand-written step (`hand_written_step`), which train through autograd, run eagerly. The
        epochs, early stopping and elite selection are `mbrl_offline.models.fitting`'s. A fitted model is
        trained further from its weights, its statistics recomputed on ``dataset``; ``min_epochs``
        replaces the config's (online fine-tuning's refits: 0, `mbrl_offline.generators.rollouts`).
        """
        cfg = self.config if min_epochs is None else replace(self.config, min_epochs=min_epochs)
        device = torch.device(device)
        self.to(device)
        generator = torch.Generator(device=device).manual_seed(cfg.seed)
        inputs, targets = (torch.as_tensor(rows, device=device)
                           for rows in transition_arrays(dataset, skip_timeouts=cfg.skip_timeouts))

        train_idx, holdout_idx = split_holdout(len(inputs), cfg.holdout_ratio, cfg.max_holdout, cfg.batch_size,
                                               generator, device)
        if cfg.statistics == "all_population":  # NEUBAY's Scaler: every row, np.std, std < 1e-12 -> 1
            mean, std = inputs.mean(0), inputs.std(0, correction=0)
            std = torch.where(std < 1e-12, torch.ones_like(std), std)
            reward_mean, reward_std = targets[:, -1].mean(), targets[:, -1].std(correction=0)
            reward_std = torch.where(reward_std < 1e-12, torch.ones_like(reward_std), reward_std)
        elif cfg.statistics == "mean_absolute_deviation":  # mjrl's WorldModel.fit_dynamics: x / (MAD + 1e-8)
            mean = inputs[train_idx].mean(0)
            std = (inputs[train_idx] - mean).abs().mean(0) + 1e-8
        else:
            mean, std = inputs[train_idx].mean(0), inputs[train_idx].std(0).clamp_min(1e-6)
            reward_mean, reward_std = targets[train_idx, -1].mean(), targets[train_idx, -1].std().clamp_min(1e-6)
        self.input_mean.copy_(mean)
        self.input_std.copy_(std)
        if cfg.normalise_outputs and cfg.statistics == "mean_absolute_deviation":  # (y - mean_y) / (MAD_y + 1e-8)
            target_mean = targets[train_idx].mean(0)
            self.output_shift.copy_(target_mean)
            self.output_scale.copy_((targets[train_idx] - target_mean).abs().mean(0) + 1e-8)
            targets = (targets - self.output_shift) / self.output_scale
        elif cfg.normalise_outputs:  # [(s' - s) / std_s, (r - mean_r) / std_r]
            self.output_shift.zero_()[-1] = reward_mean
            self.output_scale.copy_(torch.cat([std[:self.obs_dim], reward_std[None]]))
            targets = (targets - self.output_shift) / self.output_scale
        train_x, train_y = self._normalise_inputs(inputs[train_idx]), targets[train_idx]
        holdout_x, holdout_y = self._normalise_inputs(inputs[holdout_idx]), targets[holdout_idx]

        optimizer = self._optimizer()

        # Only SiLU networks without LayerNorm and with learned bounds have the hand-written step; the
        # others train through autograd.
        hand_written = self.hand_written_step
        training_step = _SiLUEnsembleTrainingStep(self, cfg.batch_size) if hand_written else self._autograd_training_step

        def train_batch(rows: dict[str, torch.Tensor]) -> torch.Tensor:
            loss = training_step(train_x, train_y, rows["batch"])
            optimizer.step()
            return loss

        graphed = CUDAGraphed(train_batch) if cuda_graph and device.type == "cuda" and hand_written else None
        self.train_log, best_mse = fit_ensemble(
            self, (train_x, train_y), (holdout_x, holdout_y), cfg,
            lambda rows: graphed({"batch": rows}) if graphed is not None else train_batch({"batch": rows}),
            optimizer, generator, progress, desc="dynamics",
            on_lower_lr=graphed.reset if graphed is not None else None,  # the recorded Adam step holds the old rate
            keep_last=("max_logvar", "min_logvar") if cfg.logvar_bounds == "shared" else ())
        self.elites.copy_(select_elites(best_mse, cfg.num_elites))
        if cfg.record_uncertainty:  # U of every fitting row (train and holdout) with the elites, sorted
            self.data_uncertainty = self.posterior_uncertainty(self._normalise_inputs(inputs)).sort().values
        self.mark_fitted()
        return self.train_log

    def _optimizer(self) -> torch.optim.Optimizer:
        """`fit`'s optimiser: Adam (weight decay enters the gradients, wd * W per layer, so Adam has one
        parameter group: one group per decay value made its step slower),
        or AdamW with decoupled decay on every trained parameter (NEUBAY: optax.adamw)."""
        cfg, device = self.config, self.head.weight.device
        params = [p for p in self.parameters() if p.requires_grad]
        if cfg.optimizer == "adamw":
            return torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.adamw_weight_decay,
                                     fused=True, capturable=device.type == "cuda")
        return torch.optim.Adam(params, lr=cfg.learning_rate, fused=True, capturable=device.type == "cuda")

    @property
    def layer_weight_decay(self) -> tuple:
        """The L2 weight decay of each layer (hidden layers, then the head); zeros for ``weight_decay=()``."""
        return tuple(self.config.weight_decay) or (0.0,) * (self.config.hidden_layers + 1)

    @property
    def hand_written_step(self) -> bool:
        """Whether `fit` uses the hand-written training step (SiLU, no LayerNorm, learned bounds, the
        "logvar" head and loss "sum_members", Adam, full batches only)."""
        cfg = self.config
        return (cfg.activation == "silu" and not cfg.layer_norm and cfg.logvar_bounds != "fixed"
                and cfg.variance_head == "logvar" and cfg.loss == "sum_members" and cfg.optimizer == "adam_l2"
                and cfg.drop_last)

    def _autograd_training_step(self, inputs: torch.Tensor, targets: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        """`loss` on rows ``batch[i]`` for member i and every parameter's gradient through autograd, with
        the weight decay's gradient (wd * W per layer) added as in `_SiLUEnsembleTrainingStep`."""
        for p in self.parameters():
            p.grad = None
        loss = self.loss(inputs[batch], targets[batch])
        loss.backward()
        with torch.no_grad():
            for layer, decay in zip([*self.hidden, self.head], self.layer_weight_decay):
                if decay:
                    layer.weight.grad.add_(layer.weight, alpha=decay)
        return loss.detach()

    @torch.no_grad()
    def copy_members(self, state: dict, members: torch.Tensor) -> None:
        """Copy the current parameters of the given members (bool mask over the ensemble) into ``state``.

        Every member parameter has the ensemble as its first dimension; buffers (normaliser, elites) and
        shared log-variance bounds belong to no member and are not copied."""
        shared = ("max_logvar", "min_logvar") if self.config.logvar_bounds != "member" else ()
        for name, value in self.named_parameters():
            if name not in shared:
                state[name][members] = value[members]

    # ------------------------------------------------------------------------------ save/load
    def save(self, path: str | Path) -> Path:
        """Weights, normaliser, elites, config and training log in one file of tensors and plain data,
        written atomically."""
        save_plain({"obs_dim": self.obs_dim, "act_dim": self.act_dim, "config": asdict(self.config),
                    "state_dict": self.state_dict(), "train_log": self.train_log}, path)
        return Path(path)

    @classmethod
    def load(cls, path: str | Path, map_location: str | torch.device = "cpu") -> "GaussianEnsembleDynamics":
        """A model written by `save`, read with ``weights_only=True``: a file that holds more than
        tensors and plain data is refused (`CheckpointError`), never unpickled."""
        saved = load_plain(path, map_location, "If it is a cached model, delete it and it is fitted again; "
                                               "otherwise load only files from a source you trust.")
        if not isinstance(saved, dict) or not {"obs_dim", "act_dim", "config", "state_dict"} <= saved.keys():
            raise CheckpointError(f"{path} is not a saved GaussianEnsembleDynamics (GaussianEnsembleDynamics.save "
                                  f"writes one); pass a model file, or delete a damaged cached one to fit it again.")
        config = saved["config"]
        config["weight_decay"] = tuple(config["weight_decay"])
        # models saved before these settings existed had per-member bounds and an uncut init
        config.setdefault("logvar_bounds", "member")
        config.setdefault("init_truncation", None)
        model = cls(saved["obs_dim"], saved["act_dim"], DynamicsConfig(**config))
        model.load_state_dict(saved["state_dict"])  # a state without the ``fitted`` flag counts as fitted
        model.train_log = saved.get("train_log", [])
        return model.to(map_location)


def transition_arrays(dataset, skip_timeouts: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``[s, a]`` inputs and ``[s' - s, r]`` targets (float32) of the dataset's true transitions
    (`mbrl_offline.data.dataset.true_successors`), less the timeout rows with ``skip_timeouts`` (NEUBAY's
    ``world_learning_dataset`` leaves them out): what a model of one step learns from."""
    obs, act, next_obs, rew = (np.asarray(getattr(dataset, k), np.float32) for k in
                               ("observations", "actions", "next_observations", "rewards"))
    keep = true_successors(dataset)
    if skip_timeouts:
        keep &= ~np.asarray(dataset.timeouts, bool)
    return np.concatenate([obs, act], axis=1)[keep], np.concatenate([next_obs - obs, rew[:, None]], axis=1)[keep]


def softplus(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``log(1 + exp(x))`` into ``out`` (torch's default beta 1 and threshold 20)."""
    return torch._C._nn.softplus(x, 1.0, 20.0, out=out)


class _SiLUEnsembleTrainingStep:
    """The loss of one training batch (`GaussianEnsembleDynamics.loss`) and the gradients of every
    parameter, weight decay included (wd * W per layer), computed by hand into buffers kept from
    batch to batch; the result matches autograd (tested). Why: autograd allocates every activation
    and gradient afresh, and on CPU the first touch of freshly mapped memory costs page faults, which
    for these small ops can cost more than their arithmetic. Here a batch is matmuls into kept buffers
    (`member_matmul`), a few elementwise passes per layer and in-place ops on the head; it is faster
    than autograd's (docs/performance.md). The forward keeps
    silu'(h) = s + h s (1 - s) = a + s (1 - a), s = sigmoid(h), a = h s, so that the backward is one
    product: one exp per element and layer instead of two (torch's silu and silu_backward each take
    one), and as one ``lerp`` the derivative takes a single pass instead of two (sigmoid_backward and
    an add).

    `torch.compile` does not help here (docs/performance.md). Compiling this buffered
    step made it slower (every write into a kept buffer became a copy); the same maths written without
    buffers compiled to a faster batch alone, but not inside `fit`, where Adam reads freshly allocated
    gradients: no gain worth a compiler dependency and seconds of compilation per run.

    Backward, with h_l = a_{l-1} W_l + b_l, a_l = silu(h_l) and the head's mean mu and raw
    log-variance r, soft-clamped as v = max - r, l1 = max - softplus(v), u = l1 - min,
    logvar = min + softplus(u); per member, K = 1 / (batch * out) and e = exp(-logvar):
        dL/dmu = 2K (mu - y) e,   dL/dlogvar = K (1 - (mu - y)^2 e) =: g,
        dL/dmin = sum(g (1 - sigmoid(u))) - c,   dL/dl1 = g sigmoid(u) =: g1,
        dL/dr = g1 sigmoid(v),   dL/dmax = sum(g1 (1 - sigmoid(v))) + c,
    then down the layers: dW_l = a_{l-1}^T dh_l, db_l = sum dh_l, dh_l = silu'(h_l) * (dh_{l+1} W_{l+1}^T).
    """

    def __init__(self, model: GaussianEnsembleDynamics, batch_size: int):
        self.model = model
        members, width = model.config.ensemble_size, model.config.hidden_size
        like = model.max_logvar

        def buffer(features: int) -> torch.Tensor:
            return like.new_empty(members, batch_size, features)

        self.inputs = buffer(model.obs_dim + model.act_dim)
        self.targets = buffer(model.obs_dim + 1)
        self.pre_activation = buffer(width)
        self.one = like.new_ones(())
        self.activations = [buffer(width) for _ in model.hidden]
        self.silu_derivatives = [buffer(width) for _ in model.hidden]
        self.head_out = buffer(2 * (model.obs_dim + 1))
        self.head_grad = buffer(2 * (model.obs_dim + 1))
        self.scratch = [buffer(model.obs_dim + 1) for _ in range(6)]
        self.grad_pre = buffer(width)
        self.grad_act = buffer(width)
        for p in model.parameters():
            p.grad = torch.zeros_like(p)

    @torch.no_grad()
    def __call__(self, inputs: torch.Tensor, targets: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        """Rows ``inputs[batch[i]]``, ``targets[batch[i]]`` train member i; fills every ``.grad`` and
        returns the loss."""
        model = self.model
        members, batch_size = batch.shape
        rows = batch.reshape(-1)
        torch.index_select(inputs, 0, rows, out=self.inputs.view(members * batch_size, -1))
        torch.index_select(targets, 0, rows, out=self.targets.view(members * batch_size, -1))

        below, pre = self.inputs, self.pre_activation
        for layer, act, derivative in zip(model.hidden, self.activations, self.silu_derivatives):
            pre.copy_(layer.bias.expand_as(pre))
            member_matmul(below, layer.weight, pre, add=pre)
            sig = torch.sigmoid(pre, out=derivative)
            torch.mul(pre, sig, out=act)
            # silu'(h) = s + h s (1 - s) = a + s (1 - a), kept for the backward: one exp per layer
            # instead of two, and one pass (lerp) instead of two
            torch.lerp(act, self.one, sig, out=derivative)
            below = act
        head = self.head_out
        head.copy_(model.head.bias.expand_as(head))
        member_matmul(below, model.head.weight, head, add=head)

        # The head's loss and its gradients, in place in kept (N, batch, out) buffers: for fresh tensors
        # this small the page faults cost more than the op (reused memory has none).
        out_dim = model.obs_dim + 1
        mean, raw = head[..., :out_dim], head[..., out_dim:]
        max_logvar, min_logvar = model.max_logvar, model.min_logvar
        v, u, logvar, precision, error, weighted_sq = self.scratch
        torch.sub(max_logvar, raw, out=v)
        softplus(v, out=u)
        torch.sub(max_logvar, u, out=u).sub_(min_logvar)
        softplus(u, out=logvar)
        logvar.add_(min_logvar)
        torch.neg(logvar, out=precision).exp_()
        torch.sub(mean, self.targets, out=error)
        torch.mul(error, error, out=weighted_sq).mul_(precision)
        k, c = 1.0 / (batch_size * out_dim), model.config.logvar_bound_coef
        loss = (weighted_sq.sum() + logvar.sum()) * k + c * (max_logvar.sum() - min_logvar.sum())

        grad_logvar = weighted_sq.mul_(-k).add_(k)  # K (1 - (mu - y)^2 e)
        grad_l1 = u.sigmoid_().mul_(grad_logvar)
        bound_dims = 1 if len(max_logvar) == members else (0, 1)  # per-member bounds, or one shared pair
        torch.sum(torch.sub(grad_logvar, grad_l1, out=logvar), dim=bound_dims, keepdim=True, out=min_logvar.grad).sub_(c)
        grad_raw = torch.mul(grad_l1, v.sigmoid_(), out=self.head_grad[..., out_dim:])
        torch.sum(torch.sub(grad_l1, grad_raw, out=v), dim=bound_dims, keepdim=True, out=max_logvar.grad).add_(c)
        torch.mul(error, precision, out=self.head_grad[..., :out_dim]).mul_(2.0 * k)

        grad_out = self.head_grad
        decay = model.layer_weight_decay  # L2 on each layer's weights: its gradient wd * W joins the matmul
        member_matmul(below.transpose(1, 2), grad_out, model.head.weight.grad, add=model.head.weight, beta=decay[-1])
        torch.sum(grad_out, dim=1, keepdim=True, out=model.head.bias.grad)
        member_matmul(grad_out, model.head.weight.transpose(1, 2), self.grad_act)
        for i in range(len(model.hidden) - 1, -1, -1):
            layer = model.hidden[i]
            torch.mul(self.grad_act, self.silu_derivatives[i], out=self.grad_pre)
            below = self.activations[i - 1] if i > 0 else self.inputs
            member_matmul(below.transpose(1, 2), self.grad_pre, layer.weight.grad, add=layer.weight, beta=decay[i])
            torch.sum(self.grad_pre, dim=1, keepdim=True, out=layer.bias.grad)
            if i > 0:
                member_matmul(self.grad_pre, layer.weight.transpose(1, 2), self.grad_act)
        return loss


def default_cache_dir() -> Path:
    """``$MBRL_OFFLINE_CACHE/dynamics``, else ``~/.cache/mbrl_offline/dynamics``."""
    return cache_root() / "dynamics"


def cache_settings(config: DynamicsConfig) -> dict:
    """The settings that key a cached model: the config, less the posterior settings left at their
    defaults (models cached before those settings existed keep their keys)."""
    settings = asdict(config)
    for name, default in _POSTERIOR_DEFAULTS.items():
        if settings[name] == default:
            del settings[name]
    return settings


def load_or_fit_dynamics(dataset, config: DynamicsConfig = DynamicsConfig(), cache_dir: Optional[str | Path] = None,
                         device: str | torch.device = "cpu", progress: bool = True) -> tuple[GaussianEnsembleDynamics, Path]:
    """The model trained on ``dataset`` with ``config``: loaded from the cache if it was trained before
    (`mbrl_offline.cache`: keyed by the dataset's fingerprint and the full config, less the posterior
    settings left at their defaults, so that older cached models keep their keys). The model keeps
    its `data_uncertainty` in its file. Returns the model
    and its file, which `GaussianEnsembleDynamics.load` also reads directly."""

    def fit() -> GaussianEnsembleDynamics:
        model = GaussianEnsembleDynamics(dataset.obs_dim, dataset.act_dim, config)
        model.fit(dataset, device=device, progress=progress)
        return model

    return load_or_fit("dynamics", dataset.env_name or "env", dataset.fingerprint(), cache_settings(config), fit,
                       save=lambda model, path: model.save(path),
                       load=lambda path: GaussianEnsembleDynamics.load(path, map_location=device),
                       cache_dir=cache_dir)
