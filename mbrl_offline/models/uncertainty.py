"""Uncertainty estimators on a dynamics ensemble's predictions, usable by any generator or agent.

Every estimator takes the per-member predictions of ``[next_obs - obs, reward]`` that
`GaussianEnsembleDynamics.predict` returns (means and log-variances, ``(members, B, obs_dim + 1)``)
or samples derived from them, and returns one number per row, ``(B,)``:

* `max_aleatoric_std` (MOPO): ``max_i |sigma_i(s, a)|_2``, the largest norm of a member's predicted
  standard deviation over all outputs (next state and reward). The official MOPO code
  (``penalty_learned_var=True``) and OfflineRL-Kit take the max over *all* members, not the elites.
* `sampled_disagreement` (COPlanner): ``mean_d std_i y_{i,d}`` with one sample
  ``y_i ~ N(mu_i, sigma_i^2)`` per member, all members, population std (``np.std``), raw units: it
  mixes disagreement with each member's own noise, as COPlanner's ``predict_env.step`` does.
* `mean_disagreement`: ``|std_i mu_i^{s'}|_2``, the spread of the members' mean next states
  (epistemic only; OfflineRL-Kit's ``ensemble_std`` without the square root's mean).
* `epistemic_rms` (NEUBAY): ``sqrt(mean_d Var_i mu_{i,d})``, the root mean over outputs of the
  population variance of the members' means; NEUBAY takes it over the elites in the normalised output
  space (`GaussianEnsembleDynamics.posterior_step`).
* `max_pairwise_distance` (MOReL's USAD): ``max_{i<j} |mu_i^{s'} - mu_j^{s'}|_2``, the largest distance
  between two members' mean next states for the same input (every member; MOReL's ``run_morel.py``
  and ``model_based_npg.py`` take it over all model pairs, on the next state only).
* `bellman_target_spread` (MOBILE): ``std_i mean_m V(s'_{i,m})`` over next states sampled from each
  member, where V is the caller's value of a next state (MOBILE: the target critics' min at a
  policy action); the std is torch's default (unbiased), as ``torch.std`` in MOBILE's code.

With a single deterministic "member" (`mbrl_offline.models.true_dynamics.TrueDynamics`) every one
of them is exactly 0: dynamics-uncertainty penalties vanish under the true dynamics.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch


def max_aleatoric_std(logvar: torch.Tensor) -> torch.Tensor:
    """MOPO's penalty: ``(members, B, D)`` log-variances -> ``max_i |exp(logvar_i / 2)|_2`` ``(B,)``."""
    return (0.5 * logvar).exp().norm(dim=-1).amax(dim=0)


def sample_members(mean: torch.Tensor, logvar: torch.Tensor, generator: Optional[torch.Generator] = None,
                   samples: Optional[int] = None) -> torch.Tensor:
    """``y = mu + sigma * eps`` for every member: ``(members, B, D)``, or ``(members, samples, B, D)``."""
    shape = mean.shape if samples is None else (mean.shape[0], samples, *mean.shape[1:])
    noise = torch.randn(shape, device=mean.device, generator=generator)
    if samples is not None:
        mean, logvar = mean.unsqueeze(1), logvar.unsqueeze(1)
    return mean + noise * (0.5 * logvar).exp()


def sampled_disagreement(member_samples: torch.Tensor) -> torch.Tensor:
    """COPlanner's uncertainty: ``(members, B, D)`` samples -> mean over D of the std over members."""
    return member_samples.std(dim=0, correction=0).mean(dim=-1)


def mean_disagreement(mean: torch.Tensor) -> torch.Tensor:
    """``(members, B, obs_dim + 1)`` means -> norm of the members' std of the next-state change ``(B,)``."""
    return mean[..., :-1].std(dim=0, correction=0).norm(dim=-1)


def epistemic_rms(mean: torch.Tensor) -> torch.Tensor:
    """NEUBAY's U ("epi_mean"): ``(members, B, D)`` means -> ``sqrt(mean_d Var_i mu_{i,d})`` ``(B,)``, the
    population variance over members, every output (reward included)."""
    return mean.var(dim=0, correction=0).mean(dim=-1).sqrt()


def max_pairwise_distance(mean: torch.Tensor) -> torch.Tensor:
    """MOReL's USAD disagreement: ``(members, B, obs_dim + 1)`` means -> ``max_{i<j} |mu_i - mu_j|_2`` over
    the next-state part ``(B,)``, every pair of members at once (0 for a single member)."""
    states = mean[..., :-1].transpose(0, 1)  # (B, members, obs_dim)
    return torch.cdist(states, states, compute_mode="donot_use_mm_for_euclid_dist").amax(dim=(1, 2))


def bellman_target_spread(next_observations: torch.Tensor, value: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """MOBILE's penalty: ``(members, samples, B, obs_dim)`` sampled next states -> ``std_i mean_m
    value(s'_{i,m})`` ``(B,)``; ``value`` maps ``(rows, obs_dim)`` to ``(rows,)`` and gets every sample
    in one call."""
    members, samples, rows, obs_dim = next_observations.shape
    if members == 1:  # no spread, and no need to evaluate the value function
        return torch.zeros(rows, device=next_observations.device)
    values = value(next_observations.reshape(-1, obs_dim)).reshape(members, samples, rows)
    return values.mean(dim=1).std(dim=0)
