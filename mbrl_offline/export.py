"""Exported policies: a training checkpoint's deterministic policy as a file that needs only torch
(TorchScript) or only onnxruntime (ONNX) to act (``mbrl-export``, `export_policy`).

What is exported is the policy role's ``deterministic`` (`mbrl_offline.roles.Policy`): the action that
``act(obs, deterministic=True)`` and evaluation take, in the env's units, the agent's own observation
normalisation included; the weights are the checkpoint's, on the CPU, in float32.

* A feed-forward policy: ``actions = policy(observations)``, ``observations (B, obs_dim)`` float32 ->
  ``actions (B, act_dim)``.
* A recurrent policy (NEUBAY's): one step, ``(actions, *state) = policy(inputs, starts, *state)``, with
  ``inputs (B, obs_dim + act_dim + 1)`` the history row [s, previous a, previous r] (zeros for the
  previous action and reward at an episode's first step), ``starts (B,)`` bool (True at an episode's first
  step: the state is reset there), and one state tensor per encoder layer, zeros to begin with.

Each file carries a description of its inputs and outputs (``mbrl_offline.json``: the algorithm, the env,
the widths, the state's shapes and types, the checkpoint's epoch): TorchScript's extra file, ONNX's
metadata. ONNX has no complex numbers: for ONNX, NEUBAY's LRU policy takes and returns each layer's
complex state as its (real, imaginary) pairs, a float32 ``(batch, d_hidden, 2)`` tensor (the layout of
``torch.view_as_real``), and each LRU runs its one step in real arithmetic (`_RealLRUStep`: the same
products as the complex one-step path of `mbrl_offline.models.recurrent.lru_scan`). TorchScript keeps
the complex state.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from mbrl_offline.errors import ConfigError

FORMATS = {"torchscript": ".pt", "onnx": ".onnx"}
METADATA = "mbrl_offline.json"  # the description's name: TorchScript's extra file, ONNX's metadata key


class _AgentPolicy(nn.Module):
    """An agent's ``deterministic`` as a module, the agent's own modules registered as its parts."""

    def __init__(self, agent):
        super().__init__()
        self.parts = nn.ModuleDict({k: v for k, v in vars(agent).items() if isinstance(v, nn.Module)})
        self.agent = agent


class FeedForwardPolicy(_AgentPolicy):
    """``observations (B, obs_dim) -> actions (B, act_dim)``."""

    def forward(self, observations: torch.Tensor) -> torch.Tensor:
        return self.agent.deterministic(observations)[0]


class RecurrentPolicy(_AgentPolicy):
    """One step: ``(inputs (B, D), starts (B,), *state) -> (actions (B, act_dim), *state)``."""

    def forward(self, inputs: torch.Tensor, starts: torch.Tensor, *state: torch.Tensor):
        actions, new_state = self.agent.deterministic(inputs, list(state), starts)
        return (actions, *new_state)


class _RealLRUStep(nn.Module):
    """One step of an `mbrl_offline.models.recurrent.LRU` on a real state: ``h0 (..., d_hidden, 2)`` holds the
    complex state's (real, imaginary) parts, and ``h = lambda keep h0 + B x`` is written out as
    ``(l_re h_re - l_im h_im, l_re h_im + l_im h_re)``. lambda is computed once from the trained weights
    (the export is of a frozen policy), which is what the complex path computes at each call."""

    def __init__(self, lru):
        super().__init__()
        self.lru = lru
        lam = lru.eigenvalues().detach()
        self.register_buffer("lam_re", lam.real.clone())
        self.register_buffer("lam_im", lam.imag.clone())

    def forward(self, x: torch.Tensor, starts: torch.Tensor, h0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        from mbrl_offline.models.products import linear

        lru = self.lru
        b_interleaved, c_interleaved = lru.interleaved_maps()
        bx = linear(x, b_interleaved).unflatten(-1, (lru.d_hidden, 2))  # (..., 1, d_hidden, 2)
        keep = (~starts.bool()).to(x.dtype)  # (..., 1): 0 where an episode starts
        h_re, h_im = h0[..., 0], h0[..., 1]
        carried = torch.stack([(self.lam_re * h_re - self.lam_im * h_im) * keep,
                               (self.lam_re * h_im + self.lam_im * h_re) * keep], dim=-1)
        h = bx + carried.unsqueeze(-3)
        y = linear(h.flatten(-2), c_interleaved) + lru.D * x
        return y, h[..., -1, :, :]


def real_state_lrus(agent) -> None:
    """Replace, in place, every LRU of ``agent`` (a copy loaded for export) by its one-step real form
    (`_RealLRUStep`). The agent then acts one step at a time on real states."""
    from mbrl_offline.models.recurrent import LRU

    for module in [v for v in vars(agent).values() if isinstance(v, nn.Module)]:
        for parent in list(module.modules()):
            for name, child in list(parent.named_children()):
                if isinstance(child, LRU):
                    setattr(parent, name, _RealLRUStep(child))


def policy_module(agent, real_state: bool = False) -> tuple[nn.Module, tuple, dict]:
    """``(module, example inputs, description)`` of ``agent``'s deterministic policy."""
    if agent.recurrent:
        state = agent.initial_state(2)
        if real_state and any(s.is_complex() for s in state):  # ONNX: complex states as (re, im) pairs
            real_state_lrus(agent)
            state = [torch.view_as_real(s).clone() if s.is_complex() else s for s in state]
            pairs = " as (real, imaginary) pairs"
        else:
            pairs = ""
        module = RecurrentPolicy(agent)
        example = (torch.zeros(2, agent.input_dim), torch.ones(2, dtype=torch.bool), *state)
        inputs = [{"name": "inputs", "shape": ["batch", agent.input_dim], "dtype": "float32",
                   "meaning": "the history row [observation, previous action, previous reward] (zeros for the "
                              "previous action and reward at an episode's first step)"},
                  {"name": "starts", "shape": ["batch"], "dtype": "bool",
                   "meaning": "True at an episode's first step (the state is reset there)"}]
        inputs += [{"name": f"state_{i}", "shape": ["batch", *s.shape[1:]], "dtype": str(s.dtype).removeprefix("torch."),
                    "meaning": f"encoder layer {i}'s state{pairs}, zeros at the start"} for i, s in enumerate(state)]
        outputs = [{"name": "actions", "shape": ["batch", agent.act_dim], "dtype": "float32"}]
        outputs += [{"name": f"next_state_{i}", "shape": ["batch", *s.shape[1:]],
                     "dtype": str(s.dtype).removeprefix("torch.")} for i, s in enumerate(state)]
    else:
        module = FeedForwardPolicy(agent)
        example = (torch.zeros(2, agent.obs_dim),)
        inputs = [{"name": "observations", "shape": ["batch", agent.obs_dim], "dtype": "float32"}]
        outputs = [{"name": "actions", "shape": ["batch", agent.act_dim], "dtype": "float32",
                    "meaning": "in the env's units"}]
    return module.eval().requires_grad_(False), example, {"inputs": inputs, "outputs": outputs}


def export_policy(checkpoint: str | Path, out: str | Path, format: str = "torchscript") -> Path:
    """Write the deterministic policy of training checkpoint ``checkpoint`` to ``out`` in ``format``
    (``torchscript`` or ``onnx``); returns ``out``. The file is written whole or not at all; ``out`` is
    never an existing file's path unless the caller removed it (the export tool refuses one)."""
    from mbrl_offline.algorithms import load_policy
    from mbrl_offline.utils import atomic_path

    check_format(format)
    agent, state = load_policy(checkpoint, "cpu")
    module, example, description = policy_module(agent, real_state=format == "onnx")
    description = {"algorithm": state["algorithm"], "env": state["env"], "epoch": state["epoch"],
                   "obs_dim": agent.obs_dim, "act_dim": agent.act_dim, "recurrent": bool(agent.recurrent),
                   "checkpoint": str(checkpoint), **description}
    text = json.dumps(description, indent=2)
    out = Path(out)
    with atomic_path(out) as tmp:
        if format == "torchscript":
            with torch.no_grad():
                traced = torch.jit.trace(module, example, check_trace=False)
            torch.jit.save(traced, str(tmp), _extra_files={METADATA: text})
        else:
            _export_onnx(module, example, description, tmp)
            import onnx

            model = onnx.load(str(tmp))
            entry = model.metadata_props.add()
            entry.key, entry.value = METADATA, text
            onnx.save(model, str(tmp))
    return out


def check_format(format: str) -> None:
    """Refuse, in one line, a format that is not one of `FORMATS`, or ONNX without the exporter's packages."""
    import importlib.util

    if format not in FORMATS:
        raise ConfigError(f"format={format}: the export formats are {', '.join(FORMATS)}.")
    missing = [name for name in ("onnx", "onnxscript") if format == "onnx" and importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(f"format=onnx needs {' and '.join(missing)}: pip install 'mbrl_offline[export]'.")


def _export_onnx(module: nn.Module, example: tuple, description: dict, path: Path) -> None:
    names = [i["name"] for i in description["inputs"]]
    batch = torch.export.Dim("batch", min=1)
    if isinstance(module, RecurrentPolicy):  # forward(inputs, starts, *state): the state's shapes as one tuple
        shapes = ({0: batch}, {0: batch}, tuple({0: batch} for _ in example[2:]))
    else:
        shapes = ({0: batch},)
    with torch.no_grad():
        torch.onnx.export(module, example, str(path), input_names=names,
                          output_names=[o["name"] for o in description["outputs"]], dynamic_shapes=shapes,
                          dynamo=True, verbose=False)


__all__ = ["export_policy", "policy_module", "check_format", "FORMATS"]
