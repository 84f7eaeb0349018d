"""Device-resident replay buffers.

`TransitionBuffer` keeps transitions as preallocated tensors on the training device and overwrites
the oldest rows once full (a FIFO ring). Sampling draws indices on the device, so a batch never
leaves it. The same class holds real data, model rollouts and an online agent's experience.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

TRANSITION_FIELDS = ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts")


class TransitionBuffer:
    """A FIFO ring of ``capacity`` transitions with fields `TRANSITION_FIELDS`.

    ``add`` takes arrays or tensors with a leading batch dimension (or single transitions when
    ``single=True``); ``sample`` returns a dict of tensors on the buffer's device.
    """

    def __init__(self, capacity: int, obs_dim: int, act_dim: int, device: str | torch.device = "cpu"):
        if capacity <= 0:
            raise ValueError(f"buffer capacity must be positive, got {capacity}")
        self.capacity, self.device = int(capacity), torch.device(device)
        shapes = {"observations": (obs_dim,), "actions": (act_dim,), "rewards": (), "next_observations": (obs_dim,),
                  "terminals": (), "timeouts": ()}
        self.data = {
            key: torch.zeros((self.capacity, *shape), device=self.device,
                             dtype=torch.bool if key in ("terminals", "timeouts") else torch.float32)
            for key, shape in shapes.items()
        }
        self.size = 0  # rows filled
        self.cursor = 0  # next row to write
        self.total_added = 0  # rows ever added (for FIFO bookkeeping)

    def __len__(self) -> int:
        return self.size

    def add(self, single: bool = False, **fields) -> None:
        """Append transitions; every field in `TRANSITION_FIELDS` must be given."""
        tensors = {k: torch.as_tensor(fields[k], device=self.device, dtype=self.data[k].dtype)
                   for k in TRANSITION_FIELDS}
        if single:
            tensors = {k: v.unsqueeze(0) for k, v in tensors.items()}
        n = tensors["rewards"].shape[0]
        if n > self.capacity:  # only the newest rows survive
            tensors = {k: v[-self.capacity:] for k, v in tensors.items()}
            self.cursor = (self.cursor + n - self.capacity) % self.capacity
            self.total_added += n - self.capacity
            n = self.capacity
        first = min(n, self.capacity - self.cursor)
        for key, value in tensors.items():
            self.data[key][self.cursor:self.cursor + first] = value[:first]
            if first < n:
                self.data[key][:n - first] = value[first:]
        self.cursor = (self.cursor + n) % self.capacity
        self.size = min(self.size + n, self.capacity)
        self.total_added += n

    def add_dataset(self, dataset) -> None:
        """Append every transition of an `OfflineDataset`."""
        self.add(**{k: getattr(dataset, k) for k in TRANSITION_FIELDS})

    def sample(self, batch_size: int, generator: Optional[torch.Generator] = None) -> dict[str, torch.Tensor]:
        if self.size == 0:
            raise RuntimeError("cannot sample from an empty buffer")
        index = torch.randint(0, self.size, (batch_size,), device=self.device, generator=generator)
        return {key: value[index] for key, value in self.data.items()}

    def ordered(self) -> dict[str, np.ndarray]:
        """All stored rows, oldest first, as numpy arrays."""
        if self.size < self.capacity:
            return {k: v[:self.size].cpu().numpy() for k, v in self.data.items()}
        return {k: torch.cat([v[self.cursor:], v[:self.cursor]]).cpu().numpy() for k, v in self.data.items()}

    def state_dict(self) -> dict:
        """Rows in ring order and the counters: reloading gives the same samples for the same seed."""
        return {"capacity": self.capacity, "size": self.size, "cursor": self.cursor,
                "total_added": self.total_added, "rows": {k: v[:self.size].cpu() for k, v in self.data.items()}}

    def load_state_dict(self, state: dict) -> None:
        wrapped = state["size"] == state["capacity"] and state["cursor"] != 0
        if state["size"] > self.capacity or (wrapped and state["capacity"] != self.capacity):
            raise ValueError(f"a buffer of capacity {self.capacity} cannot hold the saved one "
                             f"(capacity {state['capacity']}, {state['size']} rows)")
        for key, rows in state["rows"].items():
            self.data[key][:len(rows)] = rows.to(self.device)
        self.size, self.total_added = state["size"], state["total_added"]
        self.cursor = state["cursor"] if wrapped else self.size % self.capacity


def sample_mixed(real: TransitionBuffer, synthetic: Optional[TransitionBuffer], batch_size: int, real_ratio: float,
                 generator: Optional[torch.Generator] = None) -> dict[str, torch.Tensor]:
    """A batch of ``int(real_ratio * batch_size)`` real rows followed by synthetic ones (RAVL/MBPO's
    mixing, as RAVL's code rounds); all real when there is no synthetic data yet. The bool field
    ``synthetic`` marks the rows from the synthetic buffer (MOBILE penalises only those)."""
    if synthetic is None or len(synthetic) == 0 or real_ratio >= 1.0:
        batch = real.sample(batch_size, generator)
        batch["synthetic"] = torch.zeros(batch_size, dtype=torch.bool, device=real.device)
        return batch
    n_real = int(real_ratio * batch_size)
    fake = synthetic.sample(batch_size - n_real, generator)
    fake["synthetic"] = torch.ones(batch_size - n_real, dtype=torch.bool, device=synthetic.device)
    if n_real == 0:
        return fake
    true = real.sample(n_real, generator)
    true["synthetic"] = torch.zeros(n_real, dtype=torch.bool, device=real.device)
    return {key: torch.cat([true[key], fake[key]]) for key in fake}
