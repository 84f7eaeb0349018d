"""Per-row loss weights: the batch's optional ``weights`` field ``(B,)``, which the ``weights`` mixing
rule sets (`mbrl_offline.buffer.Mixing`; NEUBAY's kappa). Every agent takes each loss that is a mean
over the batch's rows as ``sum_b weights_b loss_b`` when the field is there, and computes it exactly
as without weights (the same operations, so the same bits) when it is not."""
from __future__ import annotations

from typing import Optional

import torch


def row_weights(batch: dict[str, torch.Tensor]) -> Optional[torch.Tensor]:
    """The batch's per-row loss weights ``(B,)``, or None for a plain mean over the rows."""
    return batch.get("weights")


def batch_mean(values: torch.Tensor, weights: Optional[torch.Tensor]) -> torch.Tensor:
    """The mean of ``values`` over the batch's rows: for ``(B,)`` values a scalar, ``values.mean()``;
    for ``(N, B)`` values (one row of losses per ensemble member) one mean per member ``(N,)``,
    ``values.mean(dim=1)``. With per-row ``weights`` ``(B,)``: ``(values * weights).sum(-1)``."""
    if weights is not None:
        return (values * weights).sum(-1)
    return values.mean() if values.dim() == 1 else values.mean(dim=1)
