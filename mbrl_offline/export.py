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
metadata. ONNX has no complex numbers, so NEUBAY's LRU policy (whose state is complex) exports to
TorchScript only; with ``memory=gru`` its state is real and both formats work.
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


def policy_module(agent) -> tuple[nn.Module, tuple, dict]:
    """``(module, example inputs, description)`` of ``agent``'s deterministic policy."""
    if agent.recurrent:
        module = RecurrentPolicy(agent)
        state = agent.initial_state(2)
        example = (torch.zeros(2, agent.input_dim), torch.ones(2, dtype=torch.bool), *state)
        inputs = [{"name": "inputs", "shape": ["batch", agent.input_dim], "dtype": "float32",
                   "meaning": "the history row [observation, previous action, previous reward] (zeros for the "
                              "previous action and reward at an episode's first step)"},
                  {"name": "starts", "shape": ["batch"], "dtype": "bool",
                   "meaning": "True at an episode's first step (the state is reset there)"}]
        inputs += [{"name": f"state_{i}", "shape": ["batch", *s.shape[1:]], "dtype": str(s.dtype).removeprefix("torch."),
                    "meaning": f"encoder layer {i}'s state, zeros at the start"} for i, s in enumerate(state)]
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
    module, example, description = policy_module(agent)
    if format == "onnx" and any(t.is_complex() for t in example):
        raise ConfigError(f"{checkpoint}: {state['algorithm']}'s policy carries a complex state (its LRU encoder), "
                          f"which ONNX cannot hold; export format=torchscript (or train with algo.encoder=gru).")
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
