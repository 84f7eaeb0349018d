"""A family added from outside the package is one module: ``tests/plugin_files/outside_family.py`` (an
agent, ``outside-bc``, and a generator, ``outside-jitter``), registered by its decorators, with no file of
``mbrl_offline`` edited. It trains from Python (`build_run`) once imported, and from the command line
through the entry-point group ``mbrl_offline.plugins`` of a distribution on the path (a ``*.dist-info``
folder beside the module, which is what ``pip install`` of the user's package leaves); the contract tests
(``tests/test_agent_contract.py``) run against it there too, and the help and the docs' tables list it.
"""
import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mbrl_offline import build_run, load_dataset, registry
from mbrl_offline.algorithms import ALGORITHMS
from mbrl_offline.errors import ConfigError
from mbrl_offline.trainer import TrainerConfig

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = Path(__file__).resolve().parent / "plugin_files" / "outside_family.py"


def installed_plugin(folder: Path) -> dict:
    """The plugin module in ``folder`` with a distribution's metadata naming it in the entry-point group,
    as ``pip install`` of a user's package leaves them; returns the environment that puts it on the path."""
    shutil.copy(PLUGIN, folder / "outside_family.py")
    info = folder / "outside_family-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: outside-family\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{registry.PLUGIN_GROUP}]\noutside = outside_family\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), str(ROOT), os.environ.get("PYTHONPATH", "")])}


@pytest.fixture()
def outside(monkeypatch):
    """The plugin module imported here (its decorators register it), and the registries restored after."""
    agents, generators = dict(registry.AGENTS), dict(registry.GENERATORS)
    monkeypatch.syspath_prepend(str(PLUGIN.parent))
    import outside_family

    yield outside_family
    registry.AGENTS.clear(), registry.AGENTS.update(agents)
    registry.GENERATORS.clear(), registry.GENERATORS.update(generators)
    sys.modules.pop("outside_family", None)
    # (the next composition takes its options out of Hydra's config store: `register_config_defaults`)


def test_an_outside_agent_and_generator_train_from_python(outside, tmp_path):
    data = load_dataset("pendulum-medium")
    assert registry.agents()["outside-bc"][0] is outside.GaussianBC
    assert registry.generators()["outside-jitter"][1] is outside.Jitter
    trainer = build_run("outside-bc", data, trainer_config=TrainerConfig(
        epochs=2, updates_per_epoch=100, eval_every=1, eval_episodes=2, run_dir=str(tmp_path / "run"), progress=False,
        tensorboard=False))
    assert isinstance(trainer.generator, outside.Jitter)  # its published generator
    summary = trainer.train()
    assert trainer.generator.generations == 4  # before updates 0, 50, 100 and 150
    assert len(trainer.history) == 2 and summary["final_score"] == trainer.history[-1]["normalized_score"]
    # the library's agents take the outside generator, and the outside agent a library generator
    build_run("td3bc", data, generator_config=outside.JitterConfig(),
              trainer_config=TrainerConfig(run_dir=str(tmp_path / "b")))
    from mbrl_offline.generators import NoGeneratorConfig

    build_run("outside-bc", data, generator_config=NoGeneratorConfig(),
              trainer_config=TrainerConfig(run_dir=str(tmp_path / "c")))


def test_a_class_that_breaks_the_contract_is_refused_at_registration(outside):
    class NoConsumes(outside.GaussianBC):
        consumes = "pixels"

    with pytest.raises(ConfigError, match="needs a class attribute consumes: one of transitions, sequences"):
        registry.register_agent(NoConsumes)

    class Taken(outside.GaussianBC):
        name = "ravl"

    with pytest.raises(ConfigError, match="algo name 'ravl' is taken by mbrl_offline.algorithms.ravl.RAVL"):
        registry.register_agent(Taken)

    class NoSummary(outside.Jitter):
        summary = ""

    with pytest.raises(ConfigError, match="needs a class attribute summary"):
        registry.register_generator(NoSummary)

    @dataclasses.dataclass
    class RefitConfig(outside.JitterConfig):
        def check_refit(self) -> None:
            pass

    class NoRefit(outside.Jitter):
        config_class = RefitConfig

    with pytest.raises(ConfigError, match="defines check_refit, and the class has no refit method"):
        registry.register_generator(NoRefit)


def run(env, *args, cwd):
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_an_installed_plugin_trains_from_the_command_line(tmp_path):
    env = installed_plugin(tmp_path)
    run_dir = tmp_path / "run"
    result = run(env, str(ROOT / "examples" / "train.py"), "algo=outside-bc", "env=pendulum", "trainer.epochs=1",
                 "trainer.updates_per_epoch=60", "trainer.eval_episodes=2", "trainer.tensorboard=false",
                 f"trainer.run_dir={run_dir}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    record = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["epoch"] == 1 and "nll" in record["train"]
    # another agent with the plugin's generator, by name; the help lists both
    result = run(env, str(ROOT / "examples" / "train.py"), "algo=td3bc", "generator=outside-jitter", "env=pendulum",
                 "--cfg", "job", cwd=tmp_path)
    assert result.returncode == 0 and "kind: outside-jitter" in result.stdout, result.stderr[-2000:]
    result = run(env, str(ROOT / "examples" / "train.py"), "--help", cwd=tmp_path)
    shown = " ".join(result.stdout.split())  # the help is wrapped to the terminal's width
    names = sorted({*ALGORITHMS, "outside-bc"})  # the package's agents and the plugin's, in the help's order
    assert "algo=outside-bc: outside_family.BCConfig" in shown
    assert f" algo: {', '.join(names[:names.index('outside-bc') + 1])}," in shown
    assert "generator=outside-jitter: outside_family.JitterConfig" in shown
    # a misspelt name is refused in one line that offers the plugin's
    result = run(env, str(ROOT / "examples" / "train.py"), "algo=outside-cb", "env=pendulum", cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "outside-bc" in result.stderr


def test_the_contract_tests_run_against_an_installed_plugin(tmp_path):
    """``tests/test_agent_contract.py`` parametrises over the registry with plugins loaded: run its cases
    for the plugin's agent (with its own generator and with none)."""
    env = installed_plugin(tmp_path)
    result = run(env, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", str(ROOT / "tests" / "test_agent_contract.py"),
                 "-k", "outside-bc", cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "\n5 passed" in result.stdout, result.stdout[-1000:]  # roles x 2 generators, resume, weights, settings
