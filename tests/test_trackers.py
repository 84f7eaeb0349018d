"""Experiment trackers (`mbrl_offline.trackers`): W&B in offline mode gets the same scalars as
``metrics.jsonl``, the run's settings and its learning-curve figure, and a resumed run continues the same
W&B run; a tracker is one class behind one interface, with its config file; bad input is one line with
exit status 2, before anything is written."""
import dataclasses
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from mbrl_offline import build_run, load_dataset
from mbrl_offline.config import CONFIG_DIR
from mbrl_offline.errors import CheckpointError, ConfigError
from mbrl_offline.logging import read_metrics
from mbrl_offline.registry import register_tracker, trackers
from mbrl_offline.trackers import Tracker, tracker_config
from mbrl_offline.trainer import TrainerConfig, check_run_dir

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
from wandb_records import run_contents  # noqa: E402

pytest.importorskip("wandb")
TINY = ["algo=td3bc", "env=pendulum", "trainer.epochs=2", "trainer.updates_per_epoch=5", "trainer.eval_episodes=1",
        "trainer.progress=false", "torch_threads=1"]


def train(*settings, cwd, env=None):
    return subprocess.run([sys.executable, str(ROOT / "examples" / "train.py"), *settings], capture_output=True,
                          text=True, timeout=300, cwd=cwd, env={**os.environ, **(env or {})})


def flat(record: dict) -> dict:
    return {f"{group}/{name}": value for group, values in record.items() if isinstance(values, dict)
            for name, value in values.items() if isinstance(value, (int, float)) and not isinstance(value, bool)}


def test_wandb_offline_gets_the_scalars_settings_and_figure_and_a_resume_continues_its_run(tmp_path):
    run_dir = tmp_path / "run"
    first = train(*TINY, "trainer.epochs=1", "logger=wandb", "trainer.logger.group=grid", f"trainer.run_dir={run_dir}",
                  cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "wandb:" not in first.stdout + first.stderr  # W&B's own messages are silenced
    resumed = train(*TINY, "logger=wandb", "trainer.logger.group=grid", f"trainer.run_dir={run_dir}", "resume=true",
                    cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr

    sessions = run_contents(run_dir)
    assert len(sessions) == 2 and sessions[0]["id"] == sessions[1]["id"] == (run_dir / "wandb" / "run-id").read_text()
    info = json.loads((run_dir / "run.json").read_text())
    assert sessions[1]["config"] == info  # the run's settings, as run.json holds them
    assert info["trainer"]["logger"] == {"name": "wandb", "project": "mbrl_offline", "entity": None, "group": "grid",
                                         "tags": [], "run_name": None, "mode": "offline"}
    # every epoch's scalars, at its update count, as metrics.jsonl has them (epoch 1 in the first session)
    history = {**sessions[0]["history"], **sessions[1]["history"]}
    for record in read_metrics(run_dir):
        logged = history[record["step"]]
        assert {k: logged[k] for k in flat(record)} == pytest.approx(flat(record))
    assert sorted(history) == [5, 10]
    # the report's learning curve of the run, at the end of each session
    assert "figures/curves-pendulum-medium/_type" in history[10]
    assert any(name.startswith("curves-pendulum-medium") and name.endswith(".png") for name in sessions[1]["files"])
    # TensorBoard is still there, beside it
    assert list((run_dir / "tensorboard").glob("events.*"))


def test_from_python_with_tensorboard_off(tmp_path):
    config = TrainerConfig(epochs=1, updates_per_epoch=3, eval_episodes=1, run_dir=str(tmp_path / "run"),
                           progress=False, tensorboard=False, logger={"name": "wandb", "run_name": "mine"})
    build_run("td3bc", load_dataset("pendulum-medium"), trainer_config=config).train()
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["checkpoint.pt", "metrics.jsonl", "run.json",
                                                                    "wandb"]
    (session,) = run_contents(tmp_path / "run")
    assert session["history"][3]["eval/normalized_score"] == read_metrics(tmp_path / "run")[0]["eval"]["normalized_score"]
    # a folder holding only a tracker's files is an earlier run's, and overwrite removes it
    with pytest.raises(CheckpointError, match=r"already holds a run \(run.json, metrics.jsonl, checkpoint.pt, "
                                                     r"wandb\)"):
        check_run_dir(tmp_path / "run")
    build_run("td3bc", load_dataset("pendulum-medium"), trainer_config=dataclasses.replace(
        config, logger={"name": "none"})).train(overwrite=True)
    assert not (tmp_path / "run" / "wandb").exists()


@pytest.mark.parametrize("settings, message", [
    (["logger=wandbb"], "unknown logger 'wandbb'. Did you mean 'wandb'? Known: none, tensorboard, wandb."),
    (["logger=wandb", "trainer.logger.mode=live"], "trainer.logger.mode must be one of offline, online, disabled, got 'live'."),
    (["logger=wandb", "trainer.logger.projet=x"], "unknown setting 'trainer.logger.projet'. Did you mean 'trainer.logger.project'?"),
    (["trainer.logger.name=mlflow"], "logger=mlflow is not a tracker; choose one of none, tensorboard, wandb."),
])
def test_bad_tracker_settings_are_one_line_before_anything_is_written(settings, message, tmp_path):
    done = train(*TINY, f"trainer.run_dir={tmp_path / 'run'}", *settings, cwd=tmp_path)
    assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "run").exists()


def test_a_missing_package_is_one_line_naming_the_install(tmp_path):
    blocker = tmp_path / "blocked" / "wandb"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('blocked for the test')\n")
    done = train(*TINY, f"trainer.run_dir={tmp_path / 'run'}", "logger=wandb", cwd=tmp_path,
                 env={"PYTHONPATH": os.pathsep.join([str(tmp_path / "blocked"), os.environ.get("PYTHONPATH", "")])})
    assert done.returncode == 2 and done.stderr.strip() == (
        "error: logger=wandb needs the wandb package, which is not installed; install it with pip install "
        "'mbrl_offline[wandb]' (or pip install wandb), or drop logger=wandb."), done.stderr
    assert not (tmp_path / "run").exists()


def test_every_tracker_has_its_config_file_with_its_settings():
    for name, cls in trackers().items():
        path = Path(CONFIG_DIR) / "logger" / f"{name}.yaml"
        text = path.read_text()
        assert text.startswith("# @package trainer.logger"), path
        settings = yaml.safe_load(text)
        assert set(settings) == {f.name for f in dataclasses.fields(cls.config_class)} and settings["name"] == name
        assert tracker_config(settings) == cls.config_class()  # the file holds the dataclass's defaults


def test_a_tracker_class_is_checked_when_it_registers(tmp_path):
    @dataclass
    class Settings:
        name: str = "mine"

    class Mine(Tracker):
        name, config_class, summary = "mine", Settings, "a test tracker"

        def log_scalars(self, step, scalars):
            pass

    with pytest.raises(ConfigError, match="needs a class attribute folder"):
        register_tracker(Mine)
    Mine.folder = "tensorboard/mine"
    with pytest.raises(ConfigError, match="must be one name of its own"):
        register_tracker(Mine)
    Mine.folder, Mine.name = "mine", "wandb"
    with pytest.raises(ConfigError, match="needs a field name with default 'wandb'"):
        register_tracker(Mine)
    assert "mine" not in trackers()
