"""The package installs as one: its tools are console scripts and ``python -m mbrl_offline <tool>``, from
one table (`mbrl_offline.cli.TOOLS`) that setup.cfg's console scripts and examples/ follow, and its configs
are package data. (.ci/wheel_check builds the wheel, installs it in a fresh venv and trains from it.)"""
import configparser
import importlib
import importlib.resources
import os
import subprocess
import sys
from pathlib import Path

import pytest

import mbrl_offline
from mbrl_offline.cli import TOOLS, console_script
from mbrl_offline.config import CONFIG_DIR

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = Path(mbrl_offline.__file__).resolve().parent


def setup_cfg() -> configparser.ConfigParser:
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg", encoding="utf-8")
    return parser


def listed(section: str, key: str) -> list[str]:
    """The lines of a multi-line setup.cfg value."""
    return [line.strip() for line in setup_cfg()[section][key].splitlines() if line.strip()]


def test_console_scripts_are_the_tool_table():
    scripts = dict(line.replace(" ", "").split("=", 1) for line in listed("options.entry_points", "console_scripts"))
    assert scripts == {console_script(name): f"{tool.module}:main" for name, tool in TOOLS.items()}


@pytest.mark.parametrize("name", list(TOOLS))
def test_each_tool_has_a_main_and_a_thin_example(name):
    tool = TOOLS[name]
    module = importlib.import_module(tool.module)
    assert callable(module.main) and module.__doc__.strip()
    example = (ROOT / "examples" / tool.example).read_text(encoding="utf-8")
    assert f"from {tool.module} import main\n" in example and len(example.splitlines()) < 15


def test_the_configs_are_package_data():
    """importlib.resources finds the configs where the tools look, and setup.cfg's package_data patterns
    take every file under the configs folder into the wheel."""
    assert (importlib.resources.files("mbrl_offline") / "configs" / "train.yaml").is_file()
    assert CONFIG_DIR == PACKAGE / "configs"
    patterns = listed("options.package_data", "mbrl_offline")
    shipped = {path for pattern in patterns for path in PACKAGE.glob(pattern)}
    files = {path for path in CONFIG_DIR.rglob("*") if path.is_file() and "__pycache__" not in path.parts}
    assert len(files) > 50 and {p.suffix for p in files} == {".yaml"}
    assert sorted(str(p.relative_to(PACKAGE)) for p in files - shipped) == []
    assert not (ROOT / "configs").exists(), "the configs live in mbrl_offline/configs/ only"


def run_module(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PACKAGE.parent), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "mbrl_offline", *argv], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=120)


def test_python_dash_m_runs_a_tool_from_any_folder(tmp_path):
    done = run_module("train", "algo=ravl", "env=hopper", "budget=quick", "--cfg", "job", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "name: ravl" in done.stdout and list(tmp_path.iterdir()) == []
    helped = run_module("train", "--help", cwd=tmp_path)
    assert helped.returncode == 0 and "usage: python -m mbrl_offline train [--help]" in helped.stdout
    listing = run_module("--help", cwd=tmp_path)
    assert listing.returncode == 0 and all(f"  {name} " in listing.stdout for name in TOOLS)


@pytest.mark.parametrize("argv, line", [
    ([], "error: name a tool to run. Tools: train, sweep,"),
    (["trian"], "error: unknown tool 'trian'. Did you mean 'train'? Tools: train, sweep,"),
    (["train", "algo=rav"], "error: unknown algo 'rav'. Did you mean 'ravl'?"),
])
def test_python_dash_m_mistakes_are_one_line(argv, line, tmp_path):
    done = run_module(*argv, cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith(line), done.stderr
