"""Device-resident replay buffers and the rules that mix them into batches.

`TransitionBuffer` keeps transitions as preallocated tensors on the training device and overwrites
the oldest rows once full (a FIFO ring). Sampling draws indices on the device, so a batch never
leaves it. The same class holds real data, model rollouts and an online agent's experience. Its
schema is the transition fields plus any declared extra fields (a row's uncertainty, the member that
produced it, ...): declared fields are kept, undeclared ones are refused, never dropped.

`SequenceBuffer` keeps whole episodes (dataset episodes, generated rollouts) and samples B x T
windows that never cross an episode boundary, with episode-start flags and a mask for the rows past
an episode's end (recurrent agents train on them).

`Mixing` draws a batch from a real and a synthetic buffer by a `MixingConfig` rule.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from mbrl_offline.errors import ConfigError

TRANSITION_FIELDS = ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts")
Schema = dict[str, tuple[tuple[int, ...], torch.dtype]]  # field -> (shape of one row, dtype)


def transition_schema(obs_dim: int, act_dim: int, extra_fields: Optional[Schema] = None) -> Schema:
    """The transition fields' shapes and dtypes, then ``extra_fields`` (e.g. ``{"member": ((), torch.long)}``)."""
    schema: Schema = {"observations": ((obs_dim,), torch.float32), "actions": ((act_dim,), torch.float32),
                      "rewards": ((), torch.float32), "next_observations": ((obs_dim,), torch.float32),
                      "terminals": ((), torch.bool), "timeouts": ((), torch.bool)}
    for name, (shape, dtype) in (extra_fields or {}).items():
        if name in schema:
            raise ValueError(f"extra field '{name}' is already a transition field")
        schema[name] = (tuple(shape), dtype)
    return schema


def _checked_rows(schema: Schema, fields: dict, device: torch.device, what: str) -> dict[str, torch.Tensor]:
    """``fields`` as tensors of the schema's dtypes on ``device``: every field of the schema, no other."""
    missing, unknown = set(schema) - set(fields), set(fields) - set(schema)
    if missing or unknown:
        raise ValueError(f"{what} rows need exactly the fields {', '.join(schema)}"
                         + (f"; missing {', '.join(sorted(missing))}" if missing else "")
                         + (f"; not in the schema: {', '.join(sorted(unknown))} (declare them as extra fields)"
                            if unknown else ""))
    return {k: torch.as_tensor(fields[k], device=device, dtype=schema[k][1]) for k in schema}


def _storage(capacity: int, obs_dim: int, act_dim: int, device, extra_fields: Optional[Schema]):
    """``(capacity, device, schema, zeroed tensors of capacity rows per field)`` for a buffer."""
    if capacity <= 0:
        raise ValueError(f"buffer capacity must be positive, got {capacity}")
    device, schema = torch.device(device), transition_schema(obs_dim, act_dim, extra_fields)
    data = {key: torch.zeros((int(capacity), *shape), device=device, dtype=dtype) for key, (shape, dtype) in schema.items()}
    return int(capacity), device, schema, data


class TransitionBuffer:
    """A FIFO ring of ``capacity`` transitions with fields `TRANSITION_FIELDS` and ``extra_fields``.

    ``add`` takes arrays or tensors with a leading batch dimension (or single transitions when
    ``single=True``); ``sample`` returns a dict of tensors on the buffer's device.
    """

    def __init__(self, capacity: int, obs_dim: int, act_dim: int, device: str | torch.device = "cpu",
                 extra_fields: Optional[Schema] = None):
        self.capacity, self.device, self.schema, self.data = _storage(capacity, obs_dim, act_dim, device, extra_fields)
        self.size = 0  # rows filled
        self.cursor = 0  # next row to write
        self.total_added = 0  # rows ever added (for FIFO bookkeeping)

    def __len__(self) -> int:
        return self.size

    def add(self, single: bool = False, **fields) -> None:
        """Append transitions; every field of the schema must be given, and no other."""
        tensors = _checked_rows(self.schema, fields, self.device, "transition")
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


class SequenceBuffer:
    """Whole episodes in a FIFO ring of ``capacity`` rows; samples B x T windows on the device.

    Rows are transitions (the schema of `TransitionBuffer`, extras included) stored episode after
    episode. Each row keeps where its episode ends, so a window starting at any stored row takes the
    next T rows of the same episode and never crosses into the next: past the episode's end the window
    is padded (zeros) and ``mask`` is False. ``starts`` is True at the first row of an episode (a
    recurrent agent resets its state there). Episodes are added whole and evicted whole, oldest first,
    so a stored row's episode is stored from that row to its end. Windows start uniformly over the
    stored rows.
    """

    def __init__(self, capacity: int, obs_dim: int, act_dim: int, device: str | torch.device = "cpu",
                 extra_fields: Optional[Schema] = None):
        self.capacity, self.device, self.schema, self.data = _storage(capacity, obs_dim, act_dim, device, extra_fields)
        # for the row at absolute position a (stored at a % capacity): where its episode starts and ends
        self.episode_start = torch.zeros(self.capacity, dtype=torch.long, device=self.device)
        self.episode_end = torch.zeros(self.capacity, dtype=torch.long, device=self.device)
        self.episode_lengths: list[int] = []  # stored episodes, oldest first (for eviction)
        self.first = 0  # absolute position of the oldest stored row
        self.total_added = 0  # absolute position of the next row

    def __len__(self) -> int:
        return self.total_added - self.first

    @property
    def num_episodes(self) -> int:
        return len(self.episode_lengths)

    def add_episode(self, **fields) -> None:
        """Append one episode (every field with the episode's rows along the first dimension); the
        oldest whole episodes make room."""
        rows = _checked_rows(self.schema, fields, self.device, "sequence")
        n = rows["rewards"].shape[0]
        if not 0 < n <= self.capacity:
            raise ValueError(f"an episode of {n} rows does not fit a sequence buffer of {self.capacity} rows")
        while self.total_added + n - self.first > self.capacity:
            self.first += self.episode_lengths.pop(0)
        index = torch.arange(self.total_added, self.total_added + n, device=self.device) % self.capacity
        for key, value in rows.items():
            self.data[key][index] = value
        self.episode_start[index] = self.total_added
        self.episode_end[index] = self.total_added + n
        self.episode_lengths.append(n)
        self.total_added += n

    def add_dataset(self, dataset) -> None:
        """Append every episode of an `OfflineDataset`."""
        for part in dataset.episode_slices():
            self.add_episode(**{k: getattr(dataset, k)[part] for k in TRANSITION_FIELDS})

    def windows(self, starts: torch.Tensor, length: int) -> dict[str, torch.Tensor]:
        """The windows of ``length`` rows from the absolute row positions ``starts`` ``(B,)``: every
        field ``(B, length, ...)``, ``mask`` and ``starts`` ``(B, length)`` (see the class)."""
        position = starts[:, None] + torch.arange(length, device=self.device)  # (B, T) absolute
        end = self.episode_end[starts % self.capacity][:, None]
        mask = position < end
        index = torch.where(mask, position, starts[:, None]) % self.capacity
        out = {}
        for key, value in self.data.items():
            rows = value[index]
            keep = mask.view(*mask.shape, *([1] * (rows.dim() - 2)))
            out[key] = torch.where(keep, rows, torch.zeros((), dtype=rows.dtype, device=self.device))
        out["mask"] = mask
        out["starts"] = mask & (position == self.episode_start[index])
        return out

    def sample(self, batch_size: int, length: int, generator: Optional[torch.Generator] = None) -> dict[str, torch.Tensor]:
        """``batch_size`` windows of ``length`` rows, starting uniformly over the stored rows."""
        if len(self) == 0:
            raise RuntimeError("cannot sample from an empty buffer")
        starts = self.first + torch.randint(0, len(self), (batch_size,), device=self.device, generator=generator)
        return self.windows(starts, length)

    def state_dict(self) -> dict:
        """The stored rows oldest first, the episode lengths and the counters."""
        index = torch.arange(self.first, self.total_added, device=self.device) % self.capacity
        return {"capacity": self.capacity, "first": self.first, "total_added": self.total_added,
                "episode_lengths": list(self.episode_lengths), "rows": {k: v[index].cpu() for k, v in self.data.items()}}

    def load_state_dict(self, state: dict) -> None:
        if state["total_added"] - state["first"] > self.capacity:
            raise ValueError(f"a sequence buffer of capacity {self.capacity} cannot hold the saved one "
                             f"({state['total_added'] - state['first']} rows)")
        self.first = self.total_added = state["first"]
        self.episode_lengths = []
        offset = 0
        for n in state["episode_lengths"]:
            self.add_episode(**{k: v[offset:offset + n] for k, v in state["rows"].items()})
            offset += n


MIXING_RULES = ("fraction", "counts")


@dataclass
class MixingConfig:
    """How each batch is split between real and synthetic rows."""

    # fraction: int(real_ratio * batch) real rows, the rest synthetic (MBPO, RAVL, MOPO, MOBILE);
    # counts: real_rows real rows, the rest synthetic (policy-guided diffusion: 16 real + 240 synthetic).
    rule: str = "fraction"
    real_ratio: float = 0.05
    real_rows: int = 16

    def __post_init__(self):
        if self.rule not in MIXING_RULES:
            raise ConfigError(f"unknown mixing rule '{self.rule}'; choose one of {', '.join(MIXING_RULES)}.")
        if not 0.0 <= self.real_ratio <= 1.0:
            raise ConfigError(f"mixing.real_ratio must be between 0 and 1, got {self.real_ratio}.")
        if self.real_rows < 0:
            raise ConfigError(f"mixing.real_rows must be >= 0, got {self.real_rows}.")


class Mixing:
    """Draws batches from a real and a synthetic `TransitionBuffer` by a `MixingConfig` rule (the
    `mbrl_offline.roles.Mixing` role)."""

    def __init__(self, config: MixingConfig = MixingConfig()):
        self.config = config

    def real_rows(self, batch_size: int) -> int:
        """Real rows in a batch of ``batch_size`` once there is synthetic data."""
        cfg = self.config
        if cfg.rule == "counts":
            if cfg.real_rows > batch_size:
                raise ConfigError(f"mixing.real_rows = {cfg.real_rows} is more than the batch of {batch_size}; "
                                  f"lower it or raise algo.batch_size.")
            return cfg.real_rows
        return batch_size if cfg.real_ratio >= 1.0 else int(cfg.real_ratio * batch_size)  # as RAVL's code rounds

    def sample(self, real: TransitionBuffer, synthetic: Optional[TransitionBuffer], batch_size: int,
               rng: Optional[torch.Generator] = None) -> dict[str, torch.Tensor]:
        """Real rows followed by synthetic ones; all real while there is no synthetic data. The bool
        field ``synthetic`` marks the rows from the synthetic buffer (MOBILE penalises only those)."""
        n_real = batch_size if synthetic is None or len(synthetic) == 0 else self.real_rows(batch_size)
        if n_real == batch_size:
            batch = real.sample(batch_size, rng)
            batch["synthetic"] = torch.zeros(batch_size, dtype=torch.bool, device=real.device)
            return batch
        fake = synthetic.sample(batch_size - n_real, rng)
        fake["synthetic"] = torch.ones(batch_size - n_real, dtype=torch.bool, device=synthetic.device)
        if n_real == 0:
            return fake
        true = real.sample(n_real, rng)
        true["synthetic"] = torch.zeros(n_real, dtype=torch.bool, device=real.device)
        return {key: torch.cat([true[key], fake[key]]) for key in fake}
