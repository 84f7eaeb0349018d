"""The dynamics-error experiment (mbrl_offline/experiments/dynamics_error.py, PGD's claim, measured): its parts
compute what they say, the tool runs end to end at tiny sizes, and bad settings are refused in one line before
any work."""
import sys

import numpy as np
import pytest
import torch

from test_tools_cli import run_in_process

TINY = ["starts=6", "length=8", "unet_base=16", "diffusion_steps=40", "sampler_steps=4", "dynamics_hidden=16",
        "dynamics_max_epochs=2", "policy_updates=20", "torch_threads=1", "scale=1.0", "refiner_updates=50"]


@pytest.fixture(scope="module")
def tool():
    import mbrl_offline.experiments.dynamics_error

    return mbrl_offline.experiments.dynamics_error


@pytest.fixture(scope="module")
def pendulum():
    from mbrl_offline import load_dataset

    return load_dataset("pendulum-medium")


class ConstantPolicy:
    """a = 0.7 everywhere, with the density N(0.7, 1) per action."""

    recurrent = False

    def sample(self, observations, state=None):
        return torch.full((len(observations), 1), 0.7), None

    def log_prob(self, observations, actions):
        return -0.5 * ((actions - 0.7) ** 2 + np.log(2 * np.pi)).sum(-1)


def test_true_simulator_trajectories_have_no_dynamics_error(tool, pendulum):
    from mbrl_offline.models.true_dynamics import TrueDynamics

    true = TrueDynamics("pendulum")
    starts = tool.start_states(pendulum, 5, seed=0)
    assert torch.equal(starts, tool.start_states(pendulum, 5, seed=0))  # seeded
    obs, act = tool.policy_rollouts(true, ConstantPolicy(), starts, 6)
    assert obs.shape == (5, 7, 3) and act.shape == (5, 6, 1) and torch.equal(obs[:, 0], starts)
    errors = tool.one_step_errors(true, obs, act)
    assert errors.shape == (5, 6) and errors.abs().max() < 1e-6
    # the dataset's own consecutive rows (one episode, 200 steps): the simulator's, up to float32 rounding
    data_obs = torch.as_tensor(np.concatenate([pendulum.observations[:9], pendulum.next_observations[8:9]]))[None]
    data_act = torch.as_tensor(pendulum.actions[:9])[None]
    assert tool.one_step_errors(true, data_obs, data_act).max() < 1e-4
    # a wrong next state is measured at its position, by its Euclidean distance
    moved = obs.clone()
    moved[2, 4] += torch.tensor([0.3, 0.0, 0.4])
    errors = tool.one_step_errors(true, moved, act)
    assert errors[2, 3] == pytest.approx(0.5, abs=1e-5)
    # the long-horizon error: the simulator's own trajectories replay to themselves; a state moved at
    # step 4 is off at that step by its RMS in units of the scale, and the replay itself is not moved
    scale = torch.tensor([0.5, 1.0, 2.0])
    assert tool.replay_errors(true, obs, act, scale).abs().max() < 1e-5
    drift = tool.replay_errors(true, moved, act, scale)
    assert drift[2, 3] == pytest.approx(((0.6 ** 2 + 0.0 + 0.2 ** 2) / 3) ** 0.5, abs=1e-5)
    assert drift[2, 4:].abs().max() < 1e-5 and drift[:2].abs().max() < 1e-5


def test_within_tolerance_counts_trajectories_that_never_left_it(tool):
    errors = torch.tensor([[0.1, 0.3, 0.1, 0.1],   # leaves at step 2 and does not count again
                           [0.1, 0.1, 0.2, 0.25],  # at the tolerance counts as within
                           [0.5, 0.1, 0.1, 0.1]])
    assert torch.allclose(tool.within_tolerance(errors, 0.25), torch.tensor([2 / 3, 1 / 3, 1 / 3, 1 / 3]))
    assert tool.tolerance_positions(200) == [50, 100, 200] and tool.tolerance_positions(2) == [1, 2]


def test_log_likelihoods_are_the_policys_per_transition(tool):
    obs, act = torch.zeros(2, 4, 3), torch.full((2, 3, 1), 1.7)
    out = tool.log_likelihoods(ConstantPolicy(), obs, act)
    assert out.shape == (2, 3) and torch.allclose(out, torch.full((2, 3), -0.5 * (1.0 + np.log(2 * np.pi))))


def test_table_and_figure(tool, tmp_path):
    assert tool.report_positions(32) == [1, 2, 4, 8, 16, 32] and tool.report_positions(10) == [1, 2, 4, 8, 10]
    errors = torch.arange(1.0, 11.0).repeat(3, 1)  # position t has error t
    results = {name: {"error": errors * (i + 1), "log_prob": torch.full((3, 10), -float(i)),
                      "drift": errors * 0.1 * (i + 1)} for i, name in enumerate(tool.METHODS)}
    lines = tool.markdown_table(results).splitlines()
    assert lines[0] == ("| method | error t=1 | error t=2 | error t=4 | error t=8 | error t=10 | error mean | "
                        "error mean t≥2 | log π mean |")
    assert len(lines) == 2 + len(tool.METHODS) and all(line.count("|") == 10 for line in lines)
    assert lines[3] == ("| unguided diffusion | 2.0000 | 4.0000 | 8.0000 | 16.0000 | 20.0000 | 11.0000 | 12.0000 | "
                        "-1.000 |")
    long = tool.long_horizon_table(results, 0.25).splitlines()
    assert long[0] == ("| method | error t=1 | error t=2 | error t=4 | error t=8 | error t=10 | within 0.25 to t=2 | "
                       "within 0.25 to t=5 | within 0.25 to t=10 |")
    assert long[2] == "| PGD | 0.1000 | 0.2000 | 0.4000 | 0.8000 | 1.0000 | 100% | 0% | 0% |"
    path = tool.plot_errors(results, tmp_path / "errors.png", 0.25, "title")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_tool_runs_at_tiny_sizes(tmp_path, monkeypatch, capsys, tool):
    """End to end (PGD's model and the ensemble fitted tiny, TD3+BC trained 20 updates): the table's three
    rows, the PNG; the diffusion trajectories start at the start states."""
    monkeypatch.setenv("MBRL_OFFLINE_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["dynamics_error.py"])
    torch.set_num_threads(1)
    tool.main([*TINY, "out=figures/error.png"])  # a folder that does not exist yet is made
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ")]
    default = list(tool.METHODS[:4])  # the default methods: all but UP-MPC's (which needs a stochastic policy)
    tables = [rows[1:5], rows[6:10], rows[11:15]]  # one-step error, long-horizon error, the ensemble's uncertainty
    assert len(rows) == 15 and all([r.split(" | ")[0][2:] for r in t] == default for t in tables), out
    assert all(np.isfinite(float(cell.rstrip("%"))) for t in tables for r in t for cell in r.strip("| ").split(" | ")[1:])
    assert (tmp_path / "figures" / "error.png").read_bytes()[:4] == b"\x89PNG"

    from mbrl_offline import load_dataset
    from mbrl_offline.generators.pgd import PGDGenerator

    generator = PGDGenerator.for_dataset(_tiny_pgd(tool), load_dataset("pendulum-medium"),
                                         cache_dir=tmp_path / "cache" / "diffusion", progress=False)
    starts = tool.start_states(load_dataset("pendulum-medium"), 6, seed=0)
    obs, act = tool.diffusion_trajectories(generator, starts, None, seed=0)
    assert obs.shape == (6, 9, 3) and act.shape == (6, 8, 1) and torch.allclose(obs[:, 0], starts, atol=1e-5)
    assert len(list((tmp_path / "cache").rglob("*.pt"))) == 3  # the run's models were cached and reused here
    # the refiner's rollouts differ from the ensemble's only by the refinement; methods= picks the rows
    tool.main([*TINY, "out=two.png", "methods=[refiner,ensemble]"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert [r.split(" | ")[0][2:] for r in rows if not r.startswith("| method")][:2] == [
        "dynamics ensemble", "ensemble + refiner"]


def _tiny_pgd(tool):
    import dataclasses

    from mbrl_offline.generators.pgd import PGDGeneratorConfig, UNetConfig

    default = PGDGeneratorConfig()
    return dataclasses.replace(default, unet=UNetConfig(base=16), edm=dataclasses.replace(default.edm, steps=4),
                               train=dataclasses.replace(default.train, steps=40), train_epochs=None, length=9,
                               trajectories=6, sample_batch=6)


@pytest.mark.parametrize("argv, message", [
    (["starts=0"], "error: starts must be at least 1, got 0."),
    (["length=2.5"], "error: length = 2.5 must be a whole number."),
    (["scale=strong"], "error: scale = 'strong' must be a number"),
    (["unet_base=12"], "error: unet_base = 12 must be a multiple of 8"),
    (["out=figure.pdf"], "error: out = 'figure.pdf' must name a .png file"),
    (["out=."], "error: out = '.' must name a .png file"),
    (["env=ant"], "error: true dynamics are available for hopper, walker2d, halfcheetah, pendulum, not 'ant'"),
    (["policy_updates=0"], "error: policy_updates = 0 trains no policy"),
    (["starts=4", "setts=1"], "error: unknown setting 'setts'"),
    (["methods=[ensemble,pdg]"], "error: methods = ['ensemble', 'pdg'] must be a list of distinct names from pgd, "
                                 "unguided, ensemble, refiner"),
    (["methods=[]"], "error: methods = [] must be a list"),
    (["tolerance=0"], "error: tolerance = 0 must be a number above 0"),
    (["refiner_sigma_min=1.0"], "error: refiner_sigma_min = 1.0 must be a number in (0, 1)"),
    (["refiner_steps=0"], "error: refiner_steps must be at least 1, got 0."),
])
def test_bad_settings_are_refused_in_one_line_before_any_work(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MBRL_OFFLINE_CACHE", str(tmp_path / "cache"))
    status, out, err = run_in_process("dynamics_error", argv, monkeypatch, capsys)
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1 and err.startswith(message), err
    assert list(tmp_path.iterdir()) == []


def test_an_output_folder_that_cannot_be_made_is_refused(tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("")
    monkeypatch.chdir(tmp_path)
    status, out, err = run_in_process("dynamics_error", [f"out={tmp_path / 'file' / 'x.png'}"], monkeypatch, capsys)
    assert status == 2 and err.startswith(f"error: out={tmp_path / 'file'} is a file"), err
    status, out, err = run_in_process("dynamics_error", [f"out={tmp_path}"], monkeypatch, capsys)
    assert status == 2 and err.startswith("error: out = "), err


def test_a_checkpoints_policy_is_the_target(tmp_path, monkeypatch, capsys, tool):
    """``checkpoint=``: a trained run's policy is the target (no TD3+BC trained here); a policy for another
    env is refused in one line."""
    from test_tools_cli import run_script
    from test_train_cli import RUN_TINY

    run_dir = tmp_path / "run"
    trained = run_script("train", "algo=td3bc", *RUN_TINY, f"trainer.run_dir={run_dir}", tmp_path=tmp_path)
    assert trained.returncode == 0, trained.stderr
    monkeypatch.setenv("MBRL_OFFLINE_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["dynamics_error.py"])
    torch.set_num_threads(1)
    tool.main([*TINY, f"checkpoint={run_dir / 'checkpoint.pt'}", "out=error.png"])
    out = capsys.readouterr().out
    assert f"Target policy: td3bc from {run_dir / 'checkpoint.pt'} (epoch 2)." in out, out
    assert len([line for line in out.splitlines() if line.startswith("| ")]) == 15  # three tables of four methods
    status, out, err = run_in_process("dynamics_error", [f"checkpoint={run_dir / 'checkpoint.pt'}", "env=hopper"],
                                      monkeypatch, capsys)
    assert status == 2 and err.startswith(f"error: checkpoint={run_dir / 'checkpoint.pt'} holds a pendulum policy, "
                                          f"not one for hopper; use env=pendulum."), err


def test_a_recurrent_checkpoint_policy_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    """A NEUBAY checkpoint's policy acts on histories, not states: refused in one line, exit 2, before any model
    is fitted."""
    import mbrl_offline.algorithms as algorithms
    from mbrl_offline.algorithms import NEUBAY, NEUBAYConfig
    from mbrl_offline.data.envs import get_env_info

    low, high = get_env_info("pendulum").action_bounds()
    agent = NEUBAY(3, 1, low, high, NEUBAYConfig(d_model=16, d_hidden=8, head_hidden=16))
    state = {"algorithm": "neubay", "env": "pendulum", "epoch": 1}
    monkeypatch.setattr(algorithms, "load_policy", lambda path, device="cpu": (agent, state))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MBRL_OFFLINE_CACHE", str(tmp_path / "cache"))
    checkpoint = tmp_path / "neubay" / "checkpoint.pt"
    status, out, err = run_in_process("dynamics_error", [*TINY, f"checkpoint={checkpoint}"], monkeypatch, capsys)
    assert status == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: checkpoint={checkpoint} holds a neubay policy, which is recurrent"), err
    assert "give a feed-forward checkpoint" in err
    assert not (tmp_path / "cache").exists()  # nothing fitted


def test_the_tools_refiner_defaults_are_the_libraries():
    """refiner_steps, refiner_sigma_min and refiner_updates default to `RefinerConfig`'s."""
    import yaml

    from mbrl_offline.config import CONFIG_DIR
    from mbrl_offline.models.refiner import RefinerConfig

    settings = yaml.safe_load((CONFIG_DIR / "dynamics_error.yaml").read_text())
    default = RefinerConfig()
    assert (settings["refiner_steps"], settings["refiner_sigma_min"], settings["refiner_updates"]) == (
        default.steps, default.sigma_min, default.updates)


def test_upmpc_rollouts_at_tiny_sizes_and_a_deterministic_policy_refused_before_any_fit(tmp_path, monkeypatch, capsys,
                                                                                         tool):
    """``methods=[ensemble,upmpc]`` with an IQL target (a Gaussian actor): both rows in every table, their
    uncertainty finite and positive, and the measures returned. With TD3+BC (deterministic: UP-MPC's candidates
    would all be one action) the run is refused in one line before any model is fitted."""
    monkeypatch.setenv("MBRL_OFFLINE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(sys, "argv", ["dynamics_error.py"])
    torch.set_num_threads(1)
    status, out, err = run_in_process("dynamics_error", [*TINY, "methods=[ensemble,upmpc]", f"out={tmp_path / 'a.png'}"],
                                      monkeypatch, capsys)
    assert status == 2 and "deterministic" in err and "policy=iql" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "cache").exists() and not (tmp_path / "a.png").exists()

    results = tool.main([*TINY, "policy=iql", "methods=[ensemble,upmpc]", f"out={tmp_path / 'b.png'}"])
    assert list(results) == [tool.METHODS[2], tool.METHODS[4]]
    for measures in results.values():
        assert measures["uncertainty"].shape == (6, 8) and bool((measures["uncertainty"] > 0).all())
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert [r.split(" | ")[0][2:] for r in rows if not r.startswith("| method")] == [tool.METHODS[2], tool.METHODS[4]] * 3
    assert (tmp_path / "b.png").read_bytes()[:4] == b"\x89PNG"
    status, out, err = run_in_process("dynamics_error", [*TINY, "policy=sac", f"out={tmp_path / 'c.png'}"], monkeypatch,
                                      capsys)
    assert status == 2 and "policy = 'sac' must be one of td3bc, iql" in err, err
