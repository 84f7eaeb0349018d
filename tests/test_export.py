"""Exported policies (`mbrl_offline.export`, ``mbrl-export``): every registered agent's deterministic policy,
written as TorchScript and as ONNX, acts in a process where this library cannot be imported exactly as the
agent's ``act(obs, deterministic=True)`` does (a recurrent policy over an episode's steps, its state carried
by the caller); bad settings are one line with exit status 2, and nothing is overwritten."""
import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from mbrl_offline import load_dataset
from mbrl_offline.algorithms import ALGORITHMS, load_policy
from mbrl_offline.checkpoint import CHECKPOINT_FORMAT
from mbrl_offline.export import export_policy
from mbrl_offline.policies import history_inputs
from mbrl_offline.torch_files import save_plain

# The subprocess: this library is blocked from importing, so the file must act alone.
ACT = """
import json, sys
sys.modules["mbrl_offline"] = None
import numpy as np
fmt, path, recurrent = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
data = np.load(sys.argv[4])
steps = []
if fmt == "torchscript":
    import torch
    policy = torch.jit.load(path)
    if recurrent:
        state = [torch.from_numpy(data[k]) for k in sorted(k for k in data.files if k.startswith("state"))]
        for x, starts in zip(data["inputs"], data["starts"]):
            actions, *state = policy(torch.from_numpy(x), torch.from_numpy(starts), *state)
            steps.append(actions.numpy().tolist())
    else:
        steps.append(policy(torch.from_numpy(data["observations"])).numpy().tolist())
else:
    import onnxruntime
    session = onnxruntime.InferenceSession(path)
    if recurrent:
        state = {k: data[k] for k in data.files if k.startswith("state")}
        for x, starts in zip(data["inputs"], data["starts"]):
            actions, *new_state = session.run(None, {"inputs": x, "starts": starts, **state})
            state = {f"state_{i}": s for i, s in enumerate(new_state)}
            steps.append(actions.tolist())
    else:
        steps.append(session.run(None, {"observations": data["observations"]})[0].tolist())
print(json.dumps(steps))
"""


def policy_checkpoint(name: str, folder, **settings):
    """A checkpoint of agent ``name`` for pendulum with every weight moved off its initial value (a
    training checkpoint's policy sections, as `mbrl_offline.algorithms.load_policy` reads them)."""
    agent_cls, config_cls = ALGORITHMS[name]
    torch.manual_seed(0)
    agent = agent_cls.for_dataset(load_dataset("pendulum-medium"), dataclasses.replace(config_cls(), **settings))
    with torch.no_grad():
        for module in [v for v in vars(agent).values() if isinstance(v, torch.nn.Module)]:
            for parameter in module.parameters():
                parameter.add_(0.3 * torch.randn_like(parameter))
    path = folder / "checkpoint.pt"
    save_plain({"format": CHECKPOINT_FORMAT, "epoch": 7, "algorithm": name, "env": "pendulum",
                "agent": agent.state_dict()}, path)
    return path


def exported_actions(fmt: str, path, recurrent: bool, data: dict, tmp_path) -> list:
    np.savez(tmp_path / "inputs.npz", **data)
    done = subprocess.run([sys.executable, "-c", ACT, fmt, str(path), "1" if recurrent else "0",
                           str(tmp_path / "inputs.npz")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


CASES = [(name, {}) for name in sorted(ALGORITHMS)] + [("neubay", {"encoder": "gru"})]


@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
@pytest.mark.parametrize("name, settings", CASES, ids=[n + ("-gru" if s else "") for n, s in CASES])
def test_an_exported_policy_acts_as_the_agent_without_the_library(name, settings, fmt, tmp_path):
    if fmt == "onnx":
        pytest.importorskip("onnxruntime")
        pytest.importorskip("onnxscript")
    checkpoint = policy_checkpoint(name, tmp_path, **settings)
    agent, _ = load_policy(checkpoint)
    out = tmp_path / f"policy.{fmt}"
    rng = np.random.default_rng(1)
    if not agent.recurrent:
        observations = rng.normal(size=(6, agent.obs_dim)).astype(np.float32) * 2
        export_policy(checkpoint, out, fmt)
        got = np.asarray(exported_actions(fmt, out, False, {"observations": observations}, tmp_path)[0])
        expected = agent.act(observations, deterministic=True)
    else:
        state = agent.initial_state(3)
        if fmt == "onnx":  # ONNX has no complex numbers: the LRU's state as (real, imaginary) pairs
            state = [torch.view_as_real(s) if s.is_complex() else s for s in state]
        export_policy(checkpoint, out, fmt)
        # an episode of 5 steps for 3 rows, the second row starting again at step 3; the reference carries the
        # agent's own state, the exported policy the state it returns
        inputs, starts, expected = [], [], []
        previous_action, previous_reward, carried = torch.zeros(3, agent.act_dim), torch.zeros(3), None
        for step in range(5):
            begins = torch.tensor([step == 0, step in (0, 3), step == 0])
            observation = torch.as_tensor(rng.normal(size=(3, agent.obs_dim)), dtype=torch.float32)
            x = history_inputs(observation, previous_action, previous_reward, begins)
            actions, carried = agent.deterministic(x, carried, begins)
            inputs.append(x.numpy())
            starts.append(begins.numpy())
            expected.append(actions.numpy())
            previous_action, previous_reward = actions, torch.as_tensor(rng.normal(size=3), dtype=torch.float32)
        data = {"inputs": np.stack(inputs), "starts": np.stack(starts),
                **{f"state_{i}": s.numpy() for i, s in enumerate(state)}}
        got, expected = np.asarray(exported_actions(fmt, out, True, data, tmp_path)), np.stack(expected)
    assert got.shape == expected.shape
    # The same functions in another order of float rounding. NEUBAY's LRU policy in ONNX runs its complex step in
    # real arithmetic on ONNX Runtime's kernels: on a Zen 5 CPU (torch's products on MKL's AVX2 code) its actions
    # differed from the agent's by up to 2.5e-5 at |action| 1.99 (1e-5 of that failed; Intel CPUs stayed within it),
    # the weights moved by 0.3 standard normals amplifying the rounding.
    tolerance = 5e-5 if fmt == "onnx" and agent.recurrent else 1e-5
    assert np.abs(got - expected).max() <= tolerance * max(1.0, np.abs(expected).max())
    assert np.abs(expected).max() > 1e-3  # actions that are not all zero (the weights were moved)


def test_the_file_describes_its_inputs_and_outputs(tmp_path):
    checkpoint = policy_checkpoint("neubay", tmp_path)
    export_policy(checkpoint, tmp_path / "policy.pt")
    extra = {"mbrl_offline.json": ""}
    torch.jit.load(str(tmp_path / "policy.pt"), _extra_files=extra)
    description = json.loads(extra["mbrl_offline.json"])
    assert description["algorithm"] == "neubay" and description["recurrent"] and description["epoch"] == 7
    assert [i["name"] for i in description["inputs"]] == ["inputs", "starts", "state_0", "state_1"]
    assert description["inputs"][2]["dtype"] == "complex64"
    pytest.importorskip("onnxscript")
    import onnx

    export_policy(checkpoint, tmp_path / "policy.onnx", "onnx")  # ONNX: the complex state as (re, im) pairs
    model = onnx.load(str(tmp_path / "policy.onnx"))
    description = json.loads({p.key: p.value for p in model.metadata_props}["mbrl_offline.json"])
    hidden = load_policy(checkpoint)[0].initial_state(1)[0].shape[-1]
    assert description["inputs"][2]["dtype"] == "float32" and description["inputs"][2]["shape"] == ["batch", hidden, 2]
    assert "as (real, imaginary) pairs" in description["inputs"][2]["meaning"]


def tool(cwd, *args):
    return subprocess.run([sys.executable, "-m", "mbrl_offline", "export", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def test_the_tool_writes_beside_the_checkpoint_and_never_overwrites(tmp_path):
    checkpoint = policy_checkpoint("td3bc", tmp_path)
    done = tool(tmp_path, f"checkpoint={checkpoint}")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "policy.pt").is_file() and "torch.jit.load(" in done.stdout
    again = tool(tmp_path, f"checkpoint={checkpoint}")
    assert again.returncode == 2 and again.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'policy.pt'} already exists; pass overwrite=true to replace it, or choose another out=."]
    assert tool(tmp_path, f"checkpoint={checkpoint}", "overwrite=true").returncode == 0


def test_a_checkpoint_too_old_to_read_safely_is_one_line(tmp_path):
    """A checkpoint of the first versions, which pickled numpy's random states, is not unpickled (it could run
    code): the tool refuses it in one line that says what it is and what to do."""
    torch.save({"format": 1, "rng": {"numpy": np.random.RandomState(0).get_state()}}, tmp_path / "old.pt")
    done = tool(tmp_path, f"checkpoint={tmp_path / 'old.pt'}")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "written by an older version of mbrl_offline" in done.stderr
    assert "cannot be resumed, evaluated, exported or fine-tuned: start a new run_dir" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.pt"]


@pytest.mark.parametrize("args, message", [
    ([], "error: give the checkpoint to export: checkpoint=runs/<run>/checkpoint.pt"),
    (["checkpoint=nothing.pt"], "error: checkpoint=nothing.pt: no such file; give a run's checkpoint.pt."),
    (["checkpoint=c.pt", "format=tflite"], "error: format=tflite: the export formats are torchscript, onnx."),
    (["checkpoint=c.pt", "overwrite=yes"], "error: overwrite"),
])
def test_bad_settings_are_one_line(args, message, tmp_path):
    (tmp_path / "c.pt").write_bytes(b"")
    done = tool(tmp_path, *args)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith(message), done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt"]
