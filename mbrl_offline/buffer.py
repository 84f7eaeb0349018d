"""Device-resident replay buffers and the rules that mix them into batches.

`TransitionBuffer` keeps transitions as preallocated tensors on the training device and overwrites
the oldest rows once full (a FIFO ring). Sampling draws indices on the device, so a batch never
leaves it. The same class holds real data, model rollouts and an online agent's experience. Its
schema is the transition fields plus any declared extra fields (a row's uncertainty, the member that
produced it, ...): declared fields are kept, undeclared ones are refused, never dropped.

`SequenceBuffer` keeps whole episodes (dataset episodes, generated rollouts) and samples B x T
windows that never cross an episode boundary, with episode-start flags and a mask for the rows past
an episode's end, or NEUBAY's tapes: whole episodes drawn uniformly, each closed by its final
observation, concatenated and cut (recurrent agents train on them).

`Mixing` draws a batch from a real and a synthetic buffer by a `MixingConfig` rule. Two rules fix how
many rows of each kind a batch holds: ``fraction`` (``int(real_ratio * B)`` real rows, MBPO's) and
``counts`` (``real_rows`` real rows). The third, ``weights`` (NEUBAY, Ni et al. 2025), draws rows
uniformly from the real and synthetic data pooled and mixes them in the loss instead: each row gets a
weight (the batch's ``weights`` field) such that ``sum_b weights_b loss_b = kappa mean_real(loss) +
(1 - kappa) mean_synthetic(loss)``; every agent honours that field (`mbrl_offline.algorithms.weights`).
The fourth, ``tape``, is NEUBAY's own: a `SequenceBuffer.tape` with the same weights over its rows
that are a transition's start (`tape_weights`). The fifth, ``latest``, is for on-policy learners: the
batch is every row of the synthetic buffer's newest generation (`TransitionBuffer.latest`) and no real
row, whatever the batch size; with a generation before every update (``generator.every=1``) each
update learns from fresh rollouts of the current policy only (MOReL's NPG planner).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from mbrl_offline.config import check_field_types
from mbrl_offline.errors import ConfigError, InputError, InputTypeError, type_name

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


def _checked_rows(schema: Schema, fields: dict, device: torch.device, what: str,
                  single: bool = False) -> dict[str, torch.Tensor]:
    """``fields`` as tensors of the schema's dtypes on ``device``: every field of the schema, no other,
    each of shape ``(n, *row shape)`` with one ``n`` for all (``single``: one row, the row shape alone).
    What every buffer's ``add`` checks first: a field missing or unknown, not numbers, of another width
    or with another number of rows is refused in one line naming it (`InputError`, `InputTypeError`),
    never written half or broadcast."""
    missing, unknown = set(schema) - set(fields), set(fields) - set(schema)
    if missing or unknown:
        raise InputError(f"{what} rows need exactly the fields {', '.join(schema)}"
                         + (f"; missing {', '.join(sorted(missing))}" if missing else "")
                         + (f"; not in the schema: {', '.join(sorted(unknown))} (declare them as extra fields)"
                            if unknown else "") + ".")
    tensors, rows = {}, None
    for key, (shape, dtype) in schema.items():
        try:
            value = torch.as_tensor(fields[key], device=device, dtype=dtype)
        except (TypeError, ValueError, RuntimeError):
            raise InputTypeError(f"{what} rows: field '{key}' must be numbers (an array or tensor), got "
                                 f"{type_name(fields[key])}.") from None
        expected = shape if single else ("n", *shape)
        if value.dim() != len(expected) or tuple(value.shape[value.dim() - len(shape):]) != shape:
            expected_text = "(" + ", ".join(map(str, expected)) + ("," if len(expected) == 1 else "") + ")"
            raise InputError(f"{what} rows: field '{key}' must have shape {expected_text}, got {tuple(value.shape)}; "
                             f"give every field one entry per row, of the buffer's widths.")
        if not single:
            if rows is None:
                rows, first = value.shape[0], key
            elif value.shape[0] != rows:
                raise InputError(f"{what} rows: field '{key}' has {value.shape[0]} rows but '{first}' has {rows}; "
                                 f"give every field the same number of rows.")
        tensors[key] = value
    return tensors


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
        self.last_added: Optional[int] = None  # rows of the newest ``add`` still held (`latest`); None: no add yet

    def __len__(self) -> int:
        return self.size

    def add(self, single: bool = False, **fields) -> None:
        """Append transitions; every field of the schema must be given, and no other."""
        tensors = _checked_rows(self.schema, fields, self.device, "transition", single)
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
        self.last_added = n

    def latest(self) -> dict[str, torch.Tensor]:
        """The rows of the newest ``add`` (those still held; none if it added none), in the order they were added."""
        if self.last_added is None:
            raise RuntimeError("latest() of a buffer nothing was added to")
        index = (torch.arange(self.last_added, device=self.device) + self.cursor - self.last_added) % self.capacity
        return self.rows(index)

    def add_dataset(self, dataset) -> None:
        """Append every transition of an `OfflineDataset`."""
        self.add(**{k: getattr(dataset, k) for k in TRANSITION_FIELDS})

    def sample(self, batch_size: int, generator: Optional[torch.Generator] = None) -> dict[str, torch.Tensor]:
        if self.size == 0:
            raise RuntimeError("cannot sample from an empty buffer")
        index = torch.randint(0, self.size, (batch_size,), device=self.device, generator=generator)
        return self.rows(index)

    def rows(self, index: torch.Tensor) -> dict[str, torch.Tensor]:
        """The stored rows at positions ``index`` (a tensor of indices below ``len(self)``), every field."""
        return {key: value[index] for key, value in self.data.items()}

    def ordered(self) -> dict[str, np.ndarray]:
        """All stored rows, oldest first, as numpy arrays."""
        if self.size < self.capacity:
            return {k: v[:self.size].cpu().numpy() for k, v in self.data.items()}
        return {k: torch.cat([v[self.cursor:], v[:self.cursor]]).cpu().numpy() for k, v in self.data.items()}

    def state_dict(self) -> dict:
        """Rows in ring order and the counters: reloading gives the same samples for the same seed."""
        return {"capacity": self.capacity, "size": self.size, "cursor": self.cursor,
                "total_added": self.total_added, "last_added": self.last_added, "rows": {k: v[:self.size].cpu() for k, v in self.data.items()}}

    def load_state_dict(self, state: dict) -> None:
        wrapped = state["size"] == state["capacity"] and state["cursor"] != 0
        if state["size"] > self.capacity or (wrapped and state["capacity"] != self.capacity):
            raise ValueError(f"a buffer of capacity {self.capacity} cannot hold the saved one "
                             f"(capacity {state['capacity']}, {state['size']} rows)")
        for key, rows in state["rows"].items():
            self.data[key][:len(rows)] = rows.to(self.device)
        self.size, self.total_added = state["size"], state["total_added"]
        self.cursor = state["cursor"] if wrapped else self.size % self.capacity
        last = state.get("last_added")  # saved before `latest` existed: none
        self.last_added = None if last is None else min(last, self.size)


class SequenceBuffer:
    """Whole episodes in a FIFO ring of ``capacity`` rows; samples B x T windows, or tapes, on the device.

    Rows are transitions (the schema of `TransitionBuffer`, extras included) stored episode after
    episode. Episodes are added whole (`add_episode`, or `add_episodes` for many concatenated) and
    evicted whole, oldest first, so a stored row's episode is stored from that row to its end.

    ``windows``/``sample``: each row keeps where its episode ends, so a window starting at any stored
    row takes the next T rows of the same episode and never crosses into the next: past the episode's
    end the window is padded (zeros) and ``mask`` is False. ``starts`` is True at the first row of an
    episode (a recurrent agent resets its state there). Windows start uniformly over the stored rows.

    ``tape``: NEUBAY's training sequence (``TapeBuffer.sample`` of its code): whole episodes drawn
    uniformly (with replacement), each followed by its final observation, concatenated and cut.
    """

    def __init__(self, capacity: int, obs_dim: int, act_dim: int, device: str | torch.device = "cpu",
                 extra_fields: Optional[Schema] = None):
        self.capacity, self.device, self.schema, self.data = _storage(capacity, obs_dim, act_dim, device, extra_fields)
        # for the row at absolute position a (stored at a % capacity): where its episode starts and ends
        self.episode_start = torch.zeros(self.capacity, dtype=torch.long, device=self.device)
        self.episode_end = torch.zeros(self.capacity, dtype=torch.long, device=self.device)
        self.episode_lengths: deque[int] = deque()  # stored episodes, oldest first (for eviction)
        self.first = 0  # absolute position of the oldest stored row
        self.total_added = 0  # absolute position of the next row
        self._episodes = None  # (absolute starts (E,), lengths (E,) on the device, shortest length), for tapes

    def __len__(self) -> int:
        return self.total_added - self.first

    @property
    def num_episodes(self) -> int:
        return len(self.episode_lengths)

    def add_episode(self, **fields) -> None:
        """Append one episode (every field with the episode's rows along the first dimension); the
        oldest whole episodes make room."""
        rows = _checked_rows(self.schema, fields, self.device, "sequence")
        self._append(rows, [rows["rewards"].shape[0]])

    def add_episodes(self, starts, **fields) -> None:
        """Append episodes given concatenated (a generator's sequences): every field with all their rows
        along the first dimension, and ``starts`` ``(R,)`` (bool, not stored) True at the first row of each
        episode, exactly once per episode, so the first row must be one. The oldest whole episodes make
        room, as if the episodes were added one by one (`add_episode`)."""
        rows = _checked_rows(self.schema, fields, self.device, "sequence")
        starts = torch.as_tensor(starts, device=self.device).to(torch.bool).reshape(-1)
        n = rows["rewards"].shape[0]
        if starts.shape[0] != n:
            raise InputError(f"add_episodes: starts has {starts.shape[0]} rows but the sequences have {n}; give one "
                             f"flag per row.")
        if n == 0:
            return
        first_rows = torch.nonzero(starts).flatten().tolist()  # one sync per call: episode boundaries
        if not first_rows or first_rows[0] != 0:
            raise InputError("add_episodes: the first row of the sequences must start an episode (starts[0] must be "
                             "True).")
        lengths = np.diff(first_rows + [n]).tolist()
        self._append(rows, lengths)

    def _append(self, rows: dict[str, torch.Tensor], lengths: list[int]) -> None:
        """Write episodes of ``lengths`` rows (concatenated in ``rows``), evicting the oldest whole ones."""
        if any(not 0 < n <= self.capacity for n in lengths):
            n = next(n for n in lengths if not 0 < n <= self.capacity)
            raise ValueError(f"an episode of {n} rows does not fit a sequence buffer of {self.capacity} rows")
        total = sum(lengths)
        skip = 0  # leading new episodes that newer ones would evict anyway
        while total > self.capacity:
            total -= lengths[skip]
            skip += 1
        if skip:
            offset = sum(lengths[:skip])
            self.first = self.total_added = self.total_added + offset  # as if added, then evicted
            self.episode_lengths.clear()
            rows = {k: v[offset:] for k, v in rows.items()}
            lengths = lengths[skip:]
        while self.total_added + total - self.first > self.capacity:
            self.first += self.episode_lengths.popleft()
        index = torch.arange(self.total_added, self.total_added + total, device=self.device) % self.capacity
        for key, value in rows.items():
            self.data[key][index] = value
        size = torch.as_tensor(lengths, device=self.device)
        begin = self.total_added + torch.cumsum(size, 0) - size  # absolute first row of each new episode
        self.episode_start[index] = torch.repeat_interleave(begin, size)
        self.episode_end[index] = torch.repeat_interleave(begin + size, size)
        self.episode_lengths.extend(lengths)
        self.total_added += total
        self._episodes = None

    def add_dataset(self, dataset) -> None:
        """Append every episode of an `OfflineDataset`."""
        parts = list(dataset.episode_slices())
        if parts:
            first, last = parts[0].start, parts[-1].stop
            rows = {k: getattr(dataset, k)[first:last] for k in TRANSITION_FIELDS}
            self._append(_checked_rows(self.schema, rows, self.device, "sequence"), [p.stop - p.start for p in parts])

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

    def episodes(self) -> tuple[torch.Tensor, torch.Tensor, int]:
        """The stored episodes: absolute first rows ``(E,)`` and lengths ``(E,)`` on the device, oldest
        first, and the shortest length (rebuilt after each addition)."""
        if self._episodes is None:
            lengths = torch.as_tensor(list(self.episode_lengths), dtype=torch.long)
            begin = self.first + torch.cumsum(lengths, 0) - lengths
            self._episodes = (begin.to(self.device), lengths.to(self.device), min(self.episode_lengths))
        return self._episodes

    def tape(self, length: int, generator: Optional[torch.Generator] = None,
             episode_ids: Optional[torch.Tensor] = None) -> dict[str, torch.Tensor]:
        """A tape of ``length`` rows: episodes drawn uniformly from the stored ones (with replacement),
        each as its rows then a *final* row, concatenated, and cut after ``length`` rows (so a tape
        starts at an episode's start and only its last episode is cut).

        Every stored field ``(T, ...)``, ``starts`` (True at each episode's first row), ``final`` (True
        at the appended rows: ``observations`` is the episode's last ``next_observations``, every other
        field is its last row's) and ``synthetic`` (the stored field where there is one, else False).
        ``ceil(T / shortest) + 1`` episodes are drawn, enough for any lengths, so nothing waits for the
        device; ``episode_ids`` (indices into `episodes`, oldest first) replaces the draw (tests)."""
        if len(self) == 0:
            raise RuntimeError("cannot sample from an empty buffer")
        begin, lengths, shortest = self.episodes()
        if episode_ids is None:
            count = -(-length // shortest) + 1
            episode_ids = torch.randint(0, lengths.shape[0], (count,), device=self.device, generator=generator)
        size = lengths[episode_ids] + 1  # the episode and its final row
        ends = torch.cumsum(size, 0)
        position = torch.arange(length, device=self.device)
        slot = torch.searchsorted(ends, position, right=True)  # which drawn episode each tape row is in
        slot = slot.clamp(max=episode_ids.shape[0] - 1)  # given ids too few for the tape: the last one repeats
        within = position - (ends[slot] - size[slot])
        episode = episode_ids[slot]
        final = within >= lengths[episode]
        index = (begin[episode] + torch.minimum(within, lengths[episode] - 1)) % self.capacity
        out = {key: value[index] for key, value in self.data.items()}
        out["observations"] = torch.where(final[:, None], out["next_observations"], out["observations"])
        out["starts"] = within == 0
        out["final"] = final
        if "synthetic" not in out:
            out["synthetic"] = torch.zeros(length, dtype=torch.bool, device=self.device)
        return out

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
        self.episode_lengths = deque()
        self._episodes = None
        if state["episode_lengths"]:
            rows = _checked_rows(self.schema, state["rows"], self.device, "sequence")
            self._append(rows, list(state["episode_lengths"]))


MIXING_RULES = ("fraction", "counts", "weights", "tape", "latest")


@dataclass
class MixingConfig:
    """How each batch is split between real and synthetic rows."""

    # fraction: int(real_ratio * batch) real rows, the rest synthetic (MBPO, RAVL, MOPO, MOBILE);
    # counts: real_rows real rows, the rest synthetic (policy-guided diffusion: 16 real + 240 synthetic);
    # weights: rows drawn uniformly from real and synthetic data pooled, mixed in the loss by per-row
    # weights: kappa on the real rows' mean loss, 1 - kappa on the synthetic rows';
    # tape: a tape of whole episodes from the synthetic sequences (real ones while there are none), with
    # per-row weights: kappa on the real rows' masked mean loss, 1 - kappa on the synthetic rows' (NEUBAY);
    # latest: every row of the newest generation and no real row, whatever the batch size (on-policy: MOReL's NPG).
    rule: str = "fraction"
    real_ratio: float = 0.05
    real_rows: int = 16
    kappa: float = 0.05  # the weights and tape rules' share of the loss on real rows (NEUBAY's real_weight)

    def __post_init__(self):
        check_field_types(self, "mixing")  # types first; nested mappings become configs
        if self.rule not in MIXING_RULES:
            raise ConfigError(f"unknown mixing rule '{self.rule}'; choose one of {', '.join(MIXING_RULES)}.")
        if not 0.0 <= self.real_ratio <= 1.0:
            raise ConfigError(f"mixing.real_ratio must be between 0 and 1, got {self.real_ratio}.")
        if self.real_rows < 0:
            raise ConfigError(f"mixing.real_rows must be >= 0, got {self.real_rows}.")
        if not 0.0 <= self.kappa <= 1.0:
            raise ConfigError(f"mixing.kappa must be between 0 and 1, got {self.kappa}; set mixing.kappa "
                              f"to the real rows' share of the loss (NEUBAY: 0.05).")

    # The rules that read each setting; under another rule the setting has no effect.
    READ_BY = {"real_ratio": ("fraction",), "real_rows": ("counts",), "kappa": ("weights", "tape")}

    def check_effective(self, default: "MixingConfig", section: str = "generator.mixing") -> None:
        """Refuse, in one line, a setting that this rule does not read but that was set: one that differs
        both from ``default`` (the generator's own mixing, which the command line starts from) and from
        `MixingConfig`'s own default (where a new ``MixingConfig(rule=...)`` in Python starts), e.g.
        ``real_ratio=0.5`` under the ``tape`` rule: it would be ignored without a word."""
        fresh = MixingConfig(rule=self.rule)
        for name, rules in self.READ_BY.items():
            value = getattr(self, name)
            if self.rule not in rules and value != getattr(default, name) and value != getattr(fresh, name):
                raise ConfigError(f"{section}.{name} = {value} has no effect with {section}.rule={self.rule} (only "
                                  f"the {' and '.join(rules)} rule{'s read' if len(rules) > 1 else ' reads'} it); "
                                  f"remove the setting, or choose {section}.rule={rules[0]}.")


def _fill_value(dtype: torch.dtype):
    """What a row lacking a field holds in it: NaN (floating), -1 (integer), False (bool)."""
    if dtype == torch.bool:
        return False
    return float("nan") if dtype.is_floating_point or dtype.is_complex else -1


def _with_fields(rows: dict[str, torch.Tensor], schema: Schema, count: int, device) -> dict[str, torch.Tensor]:
    """``rows`` (``count`` of them) with every field of ``schema`` they lack, filled by `_fill_value`."""
    missing = {key: torch.full((count, *shape), _fill_value(dtype), dtype=dtype, device=device)
               for key, (shape, dtype) in schema.items() if key not in rows}
    return {**rows, **missing} if missing else rows


class Mixing:
    """Draws batches from a real and a synthetic `TransitionBuffer` by a `MixingConfig` rule (the
    `mbrl_offline.roles.Mixing` role)."""

    def __init__(self, config: MixingConfig = MixingConfig()):
        self.config = config

    def real_rows(self, batch_size: int) -> Optional[int]:
        """Real rows in a batch of ``batch_size`` once there is synthetic data; None under the
        ``weights`` and ``tape`` rules, where the count varies from batch to batch."""
        cfg = self.config
        if cfg.rule in ("weights", "tape", "latest"):
            return None
        if cfg.rule == "counts":
            if cfg.real_rows > batch_size:
                raise ConfigError(f"mixing.real_rows = {cfg.real_rows} is more than the batch of {batch_size}; "
                                  f"lower it or raise algo.batch_size.")
            return cfg.real_rows
        return batch_size if cfg.real_ratio >= 1.0 else int(cfg.real_ratio * batch_size)  # as RAVL's code rounds

    def sample(self, real: TransitionBuffer, synthetic: Optional[TransitionBuffer], batch_size: int,
               rng: Optional[torch.Generator] = None) -> dict[str, torch.Tensor]:
        """A batch of ``batch_size`` rows; all real while there is no synthetic data. The bool field
        ``synthetic`` marks the rows from the synthetic buffer (MOBILE penalises only those).

        ``fraction`` and ``counts``: real rows followed by synthetic ones. ``weights``: rows drawn
        uniformly from both buffers pooled, in any order, and a float field ``weights`` ``(B,)``:
        ``kappa / max(1, n_real)`` on each real row and ``(1 - kappa) / max(1, n_synthetic)`` on each
        synthetic one (the batch's counts, so a group drawn empty takes no weight), which agents
        use as ``sum_b weights_b loss_b``; with no synthetic data every row weighs 1 / B (a plain mean).

        Extra fields that one buffer's schema declares and the other's lacks (a synthetic row's
        uncertainty, ...) are in every batch from a synthetic buffer; the rows from the buffer without
        them hold NaN (floating fields), -1 (integer fields) or False (bool fields).

        ``latest``: every row of ``synthetic``'s newest generation (`TransitionBuffer.latest`), all
        marked synthetic; ``batch_size`` is not read.

        ``tape`` (`SequenceBuffer` s, ``batch_size`` = T rows): a `SequenceBuffer.tape` from ``synthetic``,
        or from ``real`` while ``synthetic`` is None or empty (its rows come from one buffer, so it holds
        that buffer's fields only), and a float field ``weights`` ``(T,)`` (`tape_weights`)."""
        cfg = self.config
        if cfg.rule == "tape":
            return self._tape(real, synthetic, batch_size, rng)
        if cfg.rule == "latest":
            if not isinstance(synthetic, TransitionBuffer) or synthetic.last_added is None:
                raise ConfigError("mixing.rule=latest learns from the newest generation only, and there is none; "
                                  "use it with a generator of transitions that generates before each update "
                                  "(generator.every=1).")
            batch = synthetic.latest()
            batch["synthetic"] = torch.ones(len(batch["rewards"]), dtype=torch.bool, device=synthetic.device)
            return batch
        empty = synthetic is None or len(synthetic) == 0
        fields = {} if synthetic is None else {**real.schema, **synthetic.schema}
        if cfg.rule == "weights":
            return self._weighted(real, None if empty else synthetic, fields, batch_size, rng)
        n_real = batch_size if empty else self.real_rows(batch_size)
        if n_real == batch_size:
            batch = _with_fields(real.sample(batch_size, rng), fields, batch_size, real.device)
            batch["synthetic"] = torch.zeros(batch_size, dtype=torch.bool, device=real.device)
            return batch
        fake = _with_fields(synthetic.sample(batch_size - n_real, rng), fields, batch_size - n_real, synthetic.device)
        fake["synthetic"] = torch.ones(batch_size - n_real, dtype=torch.bool, device=synthetic.device)
        if n_real == 0:
            return fake
        true = _with_fields(real.sample(n_real, rng), fields, n_real, real.device)
        true["synthetic"] = torch.zeros(n_real, dtype=torch.bool, device=real.device)
        return {key: torch.cat([true[key], fake[key]]) for key in fake}

    def _weighted(self, real: TransitionBuffer, synthetic: Optional[TransitionBuffer], fields: Schema,
                  batch_size: int, rng: Optional[torch.Generator]) -> dict[str, torch.Tensor]:
        """The ``weights`` rule (see `sample`), without waiting for the device: indices drawn over the
        pooled rows, each row gathered from both buffers at clamped indices and chosen by ``torch.where``."""
        device = real.device
        if synthetic is None:
            batch = _with_fields(real.sample(batch_size, rng), fields, batch_size, device)
            batch["synthetic"] = torch.zeros(batch_size, dtype=torch.bool, device=device)
            batch["weights"] = torch.full((batch_size,), 1.0 / batch_size, device=device)
            return batch
        if len(real) == 0:
            raise RuntimeError("cannot sample from an empty buffer")
        index = torch.randint(0, len(real) + len(synthetic), (batch_size,), device=device, generator=rng)
        is_real = index < len(real)
        true = _with_fields(real.rows(index.clamp(max=len(real) - 1)), fields, batch_size, device)
        fake = _with_fields(synthetic.rows((index - len(real)).clamp(min=0)), fields, batch_size, device)
        batch = {}
        for key, value in fake.items():
            mask = is_real.view(batch_size, *([1] * (value.dim() - 1)))
            batch[key] = torch.where(mask, true[key], value)
        n_real = is_real.sum()
        kappa = self.config.kappa
        batch["synthetic"] = ~is_real
        batch["weights"] = torch.where(is_real, kappa / n_real.clamp(min=1),
                                       (1.0 - kappa) / (batch_size - n_real).clamp(min=1))
        return batch

    def _tape(self, real: SequenceBuffer, synthetic: Optional[SequenceBuffer], length: int,
              rng: Optional[torch.Generator]) -> dict[str, torch.Tensor]:
        """The ``tape`` rule (see `sample`)."""
        source = real if synthetic is None or len(synthetic) == 0 else synthetic
        if not isinstance(source, SequenceBuffer):
            raise ConfigError(f"mixing.rule=tape draws tapes of episodes from sequence buffers, got a "
                              f"{type(source).__name__}; use it with an agent that learns from sequences.")
        tape = source.tape(length, rng)
        tape["weights"] = tape_weights(tape["starts"], tape["synthetic"], self.config.kappa)
        return tape


def tape_weights(starts: torch.Tensor, synthetic: torch.Tensor, kappa: float) -> torch.Tensor:
    """Per-row loss weights ``(T,)`` of a tape (NEUBAY's ``sac_q_loss`` masking and ``real_weight``):
    row k is a transition to learn from when the next row does not start an episode
    (``m_k = not starts[k+1]``; the last row has no next row, ``m_{T-1} = 0``), so an episode's final
    row, whose successor starts the next episode, never is. With ``real = not synthetic``,
    ``w_k = m_k (kappa real_k / max(1, sum m real) + (1 - kappa) (1 - real_k) / max(1, sum m (1 - real)))``:
    ``sum_k w_k loss_k`` is kappa times the real rows' masked mean loss plus 1 - kappa times the
    synthetic rows' (a group with no row takes weight 0, its denominator clipped to 1)."""
    mask = torch.cat([~starts[1:], torch.zeros(1, dtype=torch.bool, device=starts.device)]).float()
    real = (~synthetic.to(torch.bool)).float()
    real_mask, fake_mask = mask * real, mask * (1.0 - real)
    return (kappa * real_mask / real_mask.sum().clamp(min=1.0)
            + (1.0 - kappa) * fake_mask / fake_mask.sum().clamp(min=1.0))


def run_mixing(consumes: str, generator_config=None) -> MixingConfig:
    """The mixing rule of a run: the generator's (``generator_config.mixing``); without a generator (None
    or ``kind='none'``) every row is real: tapes of the dataset (``kappa`` 1) for an agent of sequences,
    else rows (``real_ratio`` 1)."""
    if generator_config is not None and getattr(generator_config, "mixing", None) is not None:  # none has none
        return generator_config.mixing
    if consumes == "sequences":  # tapes of the dataset alone: every row real, a plain masked mean
        return MixingConfig(rule="tape", kappa=1.0)
    return MixingConfig(rule="fraction", real_ratio=1.0)
