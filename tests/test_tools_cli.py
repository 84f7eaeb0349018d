"""One command-line style for every tool (mbrl_offline/tools/, run here as examples/<tool>.py): ``--help``,
``--cfg job``, one-line errors and override values that may be any file path (mbrl_offline/cli.py: tool_config,
quote_overrides)."""
import importlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import h5py
import pytest
import torch
import yaml

from mbrl_offline.algorithms import ALGORITHMS
from mbrl_offline.cli import group_options, setting_docs
from mbrl_offline.config_files import compose, quote_overrides
from mbrl_offline.config import CONFIG_DIR
from mbrl_offline.errors import ConfigError

from test_train_cli import RUN_TINY

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = CONFIG_DIR
TOOLS = sorted(p.stem for p in (ROOT / "examples").glob("*.py"))
GROUPS = ["algo", "generator", "env", "budget", "preset"]
# The config groups each tool's --help must list (the tools without a config take options instead).
TOOL_GROUPS = {"train": GROUPS, "sweep": GROUPS + ["sweep"], "edge_of_reach": GROUPS, "collect": ["env"],
               "inspect_dataset": ["env"], "evaluate": [], "report": None, "dynamics_in_pytorch": None,
               "dynamics_error": ["env"], "bandit": ["bandit"], "reproduce": ["budget"], "export": [],
               "finetune": ["logger"]}
# File paths that Hydra's override grammar does not read as written: non-ASCII, spaces, '=', ',', brackets,
# quotes, trailing backslashes, shell-ish characters.
PATHS = ["/tmp/données/run", "/tmp/runs/été 1", "/tmp/my runs/x", "runs/a=b,c", "runs/a,b", "runs/x[1]{2}(3)",
         "runs/l'été 2", 'runs/"quoted"', "C:\\temp\\été\\", "~/d4rl/hopper_medium-v2.hdf5", "runs/日本語/ü",
         "runs/#1; & ~x!", "runs/ünï cödé=1,2/ckpt.pt", "backup(old)/run"]


def load_tool(name: str):
    spec = importlib.util.spec_from_file_location(f"examples_{name}", ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tool_doc(name: str) -> str:
    """The docstring of the module whose ``main`` examples/<name>.py runs: the tool's --help text."""
    module = load_tool(name)
    home = module.main.__module__
    return importlib.import_module(home).__doc__ if home.startswith("mbrl_offline.") else module.__doc__


def run_in_process(name: str, argv: list[str], monkeypatch, capsys) -> tuple[int, str, str]:
    """The tool's ``main(argv)`` in this process (as ``python examples/<name>.py argv``), for the commands that
    end in `SystemExit` (--help, --cfg job, errors): ``(exit status, stdout, stderr)``."""
    monkeypatch.setattr(sys, "argv", [str(ROOT / "examples" / f"{name}.py"), *argv])
    threads = torch.get_num_threads()
    try:
        with pytest.raises(SystemExit) as stopped:
            load_tool(name).main(argv)
    finally:
        torch.set_num_threads(threads)  # a tool may get as far as applying its torch_threads
    out = capsys.readouterr()
    return stopped.value.code or 0, out.out, out.err


def run_script(name: str, *argv: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """``python examples/<name>.py argv`` in the empty folder ``tmp_path/work`` (caches outside it)."""
    (tmp_path / "work").mkdir(exist_ok=True)
    env = {**os.environ, "MBRL_OFFLINE_CACHE": str(tmp_path.parent / f"{tmp_path.name}-cache"),
           "MINARI_DATASETS_PATH": str(tmp_path.parent / f"{tmp_path.name}-minari")}
    return subprocess.run([sys.executable, str(ROOT / "examples" / f"{name}.py"), *argv], capture_output=True,
                          text=True, timeout=300, env=env, cwd=tmp_path / "work")


def test_every_tool_is_covered():
    assert sorted(TOOL_GROUPS) == TOOLS, "a new tool in examples/ needs its --help and --cfg job checked here"


@pytest.mark.parametrize("tool", TOOLS)
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_gives_purpose_groups_and_where_settings_are_documented(tool, flag, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    status, out, err = run_in_process(tool, ["algo=ravl", flag], monkeypatch, capsys)
    assert status == 0 and err == "", err
    doc = tool_doc(tool).strip().split("\n\n")[0]
    assert doc.splitlines()[0].split(":")[0] in out  # the purpose: the docstring's first paragraph
    assert "--cfg job" in out
    out = " ".join(out.split())  # the help is wrapped to the terminal's width
    groups = TOOL_GROUPS[tool]
    if groups is not None:
        for group in groups:  # each group with its options, read from mbrl_offline/configs/<group>/
            options = ", ".join(group_options(CONFIGS, group))  # the YAML files, and the registries' names
            assert f" {group}: {options} (default: " in out, out
        if "algo" in groups:
            first = sorted(ALGORITHMS)[0]  # the help lists every algorithm's config, in name order
            assert f"algo.*: the fields of the algorithm's config dataclass (algo={first}: mbrl_offline/algorithms/" in out
            assert "algo=ravl: mbrl_offline/algorithms/ravl.py: RAVLConfig" in out
            assert "trainer.*: the fields of TrainerConfig (mbrl_offline/trainer.py)" in out
            assert " seed=0 " in out and " device=cpu # cpu, cuda" in out  # top-level settings with their comments
        if tool == "collect":
            assert "collect.*: the fields of CollectConfig (mbrl_offline/collect.py)" in out
        if tool == "evaluate":
            assert "Config groups: none." in out and " checkpoint=null # a run's checkpoint.pt" in out
    assert list(tmp_path.iterdir()) == []


def test_setting_docs_name_every_registered_algorithm_and_generator():
    """The help's algo and generator sections come from the registries: nothing to keep by hand."""
    from mbrl_offline.algorithms import ALGORITHMS
    from mbrl_offline.generators import GENERATORS

    docs = setting_docs()
    for name, (_, config) in ALGORITHMS.items():
        assert f"algo={name}: " in docs["algo"] and config.__name__ in docs["algo"]
    for kind, (config, _) in GENERATORS.items():
        assert f"generator={kind}: " in docs["generator"] and config.__name__ in docs["generator"]
    assert "NEUBAYConfig" in docs["algo"] and "generator.posterior.*" in docs["generator"]


def test_setting_docs_name_files_and_classes_that_exist():
    """--help says where settings are documented: every file and config class it names exists."""
    sources = {p: p.read_text() for p in (ROOT / "mbrl_offline").rglob("*.py")}
    for text in setting_docs().values():
        for path in re.findall(r"(?:mbrl_offline|configs)/[\w/<>.-]+", text):
            if "<" not in path:
                assert (ROOT / path.rstrip(".,")).exists(), path
        for name in re.findall(r"\b\w+Config\b", text):
            assert any(f"class {name}" in source for source in sources.values()), name


def cfg_job_cases(tmp_path: Path) -> dict:
    """Per tool: the arguments (with a path setting that Hydra's grammar alone rejects) and a check of the
    printed config."""
    path = str(tmp_path / "données" / "été 1=a,b")
    return {
        "train": (["algo=td3bc", "budget=quick", f"trainer.run_dir={path}", "--cfg", "job"],
                  lambda c: c["trainer"]["run_dir"] == path and c["algo"]["name"] == "td3bc"
                  and c["trainer"]["epochs"] == 40),  # the quick budget's setting for td3bc only
        "sweep": (["algo=td3bc", "--cfg=job", "sweep.n_trials=3", f"sweep.dir={path}"],
                  lambda c: c["sweep"]["n_trials"] == 3 and c["sweep"]["dir"] == path
                  and c["sweep"]["for_algo"] == "td3bc"),
        "edge_of_reach": ([f"out={path}", "trainer.epochs=3", "-c", "job"],
                          lambda c: sorted(c) == ["mopo-learned", "mopo-true", "ravl-learned", "ravl-true"]
                          and c["ravl-true"]["trainer"]["run_dir"] == f"{path}/ravl-true"
                          and c["mopo-true"]["generator"]["true_dynamics"] is True
                          and all(run["trainer"]["epochs"] == 3 for run in c.values())),
        "evaluate": ([f"checkpoint={path}/checkpoint.pt", "episodes=3", "--cfg", "job"],
                     lambda c: {k: v for k, v in c.items() if k != "cdsa"} == {
                         "checkpoint": f"{path}/checkpoint.pt", "episodes": 3, "seed": 0, "risk_level": 0.1,
                         "adjust": "none", "device": "cpu"} and c["cdsa"]["score_on"] == "states"),
        "collect": (["env=pendulum", f"collect.run_dir={path}", "--cfg", "job"],
                    lambda c: c["collect"]["run_dir"] == path and c["env"]["name"] == "pendulum"),
        "inspect_dataset": (["env=pendulum", f"dataset={path}.hdf5", f"out={path}/x.hdf5", "--cfg", "job"],
                            lambda c: c["dataset"] == f"{path}.hdf5" and c["out"] == f"{path}/x.hdf5"
                            and c["env"]["name"] == "pendulum"),
        "report": ([path, "--out", f"{path}/report", "--cfg", "job"],
                   lambda c: c == {"paths": [path], "out": f"{path}/report"}),
        "dynamics_error": (["env=hopper", f"out={path}.png", "starts=8", f"checkpoint={path}/checkpoint.pt", "--cfg",
                            "job"],
                           lambda c: c["out"] == f"{path}.png" and c["starts"] == 8 and c["env"]["name"] == "hopper"
                           and c["checkpoint"] == f"{path}/checkpoint.pt" and c["length"] == 32),
        "bandit": (["bandit=paper", f"out={path}.png", "penalties=[0,2.5]", "bandit.updates=300", "--cfg", "job"],
                   lambda c: c["out"] == f"{path}.png" and c["penalties"] == [0, 2.5] and c["bandit"]["updates"] == 300
                   and c["bandit"]["d_model"] == 256 and c["seed"] == 0),
        "export": ([f"checkpoint={path}/checkpoint.pt", "format=onnx", f"out={path}/p.onnx", "--cfg", "job"],
                   lambda c: c == {"checkpoint": f"{path}/checkpoint.pt", "format": "onnx", "out": f"{path}/p.onnx",
                                   "overwrite": False}),
        "finetune": ([f"checkpoint={path}/checkpoint.pt", f"dataset={path}.hdf5", "data=replace", "logger=wandb",
                      f"trainer.run_dir={path}/ft", "trainer.epochs=3", "--cfg", "job"],
                     lambda c: c["checkpoint"] == f"{path}/checkpoint.pt" and c["dataset"] == f"{path}.hdf5"
                     and c["data"] == "replace" and c["model"] == "refit" and c["trainer"]["run_dir"] == f"{path}/ft"
                     and c["trainer"]["epochs"] == 3 and c["trainer"]["seed"] is None
                     and c["trainer"]["logger"]["name"] == "wandb"),
        "reproduce": (["seeds=[0,4]", f"runs_dir={path}", f"out={path}/results.md", "device=cpu", "-c", "job"],
                      lambda c: c["seeds"] == [0, 4] and c["runs_dir"] == path and c["out"] == f"{path}/results.md"
                      and c["budget"]["name"] == "cpu" and c["algos"] == "all" and "device" not in c),
        "dynamics_in_pytorch": (["--model", f"{path}.pt", "--cfg", "job"],
                                lambda c: c == {"model": f"{path}.pt", "dataset": "pendulum-medium"}),
    }


@pytest.mark.parametrize("tool", TOOLS)
def test_cfg_job_prints_the_composed_config_and_writes_nothing(tool, tmp_path, monkeypatch, capsys):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    argv, check = cfg_job_cases(tmp_path)[tool]
    status, out, err = run_in_process(tool, argv, monkeypatch, capsys)
    assert status == 0 and err == "", err
    assert check(yaml.safe_load(out)), out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"] and list(work.iterdir()) == []


OTHER_OPTIONS = [
    (["--multirun", "seed=1"], "error: --multirun: this tool runs one job; grids of runs are for the train and"),
    (["--cfg", "hydra"], "error: --cfg hydra: these tools print only the job's config"),
    (["--config-dir", "x"], "error: unknown option '--config-dir'; the tools take --help, --cfg job and setting=value"),
]


# (the train tool runs grids with --multirun: tests/test_multirun.py)
@pytest.mark.parametrize("tool, argv, message", [
    (tool, argv, message) for tool in ["train", "collect", "inspect_dataset", "edge_of_reach", "bandit"]
    for argv, message in OTHER_OPTIONS if not (tool == "train" and argv[0] == "--multirun")])
def test_other_options_give_one_line(tool, argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    status, out, err = run_in_process(tool, argv, monkeypatch, capsys)
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1 and err.startswith(message), err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("path", PATHS)
def test_any_file_path_arrives_unchanged(path):
    assert compose(CONFIGS, "evaluate", [f"checkpoint={path}"]).checkpoint == path
    train = compose(CONFIGS, "train", [f"trainer.run_dir={path}", f"dynamics_path={path}"])
    assert train.trainer.run_dir == path and train.dynamics_path == path


def test_hydra_syntax_still_works():
    unchanged = ["seed=3", "collect.levels=[random,medium]", "trainer.run_dir=runs/${algo.name}", "x='a b'",
                 "+a.b={c: 1}", "~preset", "algo=td3bc", "seed=choice(1,2)", "seed=int(3)"]
    assert quote_overrides(unchanged) == unchanged
    collect = compose(CONFIGS, "collect", ["collect.levels=[random, medium]", "collect.seed=3"])
    assert list(collect.collect.levels) == ["random", "medium"] and collect.collect.seed == 3
    train = compose(CONFIGS, "train", ["trainer.run_dir=runs/${algo.name}-été 1", "algo=td3bc"])
    assert train.trainer.run_dir == "runs/td3bc-été 1"  # an interpolation inside a value that needed quoting
    with pytest.raises(ConfigError, match="cannot parse the override: no viable alternative at input '\\[1'"):
        compose(CONFIGS, "train", ["generator.rollout.horizon=[1"])


# Paths that start as Hydra syntax (a list, a dict, a quoted string): Hydra must be told they are strings.
HYDRA_LOOKING_PATHS = ["[draft] run", "{x}/run", "[it's]/run", "'quoted'/run", '"x"/y', "[a,b]/ü"]


@pytest.mark.parametrize("path", HYDRA_LOOKING_PATHS)
def test_a_path_that_looks_like_hydra_syntax_arrives_when_quoted_as_the_error_says(path):
    quoted = quote_overrides([f"checkpoint={path}"])[0]
    try:
        value = compose(CONFIGS, "evaluate", [quoted]).checkpoint
    except ConfigError as error:  # the message says how to quote it, and that way works
        message = str(error)
        assert message.startswith("cannot parse the override") and f"in checkpoint={path} " in message, message
        assert "needs quotes" in message, message
        quoted = message.split('needs quotes: "', 1)[1].rsplit('")', 1)[0]
        value = compose(CONFIGS, "evaluate", [quoted]).checkpoint
    assert value == path or value == path.strip("'\"")  # a path written in quotes is Hydra's quoted string
    from hydra.core.override_parser.types import Quote, QuotedString

    escaped = QuotedString(text=path, quote=Quote.single).with_quotes()  # any path, quoted Hydra's way
    assert compose(CONFIGS, "evaluate", [f"checkpoint={escaped}"]).checkpoint == path


def raw_d4rl_file(path: Path, data) -> Path:
    """A D4RL file without our metadata: its name must say the env, or ``env=`` must."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        for key in ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts"):
            f.create_dataset(key, data=getattr(data, key))
    return path


def test_inspect_dataset_env_is_the_env_group_so_the_advice_works(tmp_path, hopper_data, monkeypatch, capsys):
    source = raw_d4rl_file(tmp_path / "données" / "my data.hdf5", hopper_data)
    monkeypatch.chdir(tmp_path)
    status, out, err = run_in_process("inspect_dataset", [f"dataset={source}"], monkeypatch, capsys)
    assert status == 2 and "cannot tell which environment this D4RL file is for; pass env=<name>" in err
    export = tmp_path / "données" / "été 1=x,y.hdf5"
    monkeypatch.setattr(sys, "argv", ["inspect_dataset.py"])
    load_tool("inspect_dataset").main([f"dataset={source}", "env=hopper", f"out={export}"])  # the advice, any path
    assert '"transitions": 300' in capsys.readouterr().out and export.exists()
    status, out, err = run_in_process("inspect_dataset", ["env=hoper"], monkeypatch, capsys)
    assert status == 2 and err.startswith("error: unknown env 'hoper'. Did you mean 'hopper'?")
    status, out, err = run_in_process("inspect_dataset", [], monkeypatch, capsys)
    assert status == 2 and err.startswith("error: give the dataset to inspect: dataset=")


def test_collect_and_inspect_errors_are_one_line_and_write_no_log(tmp_path):
    """Run as scripts, in an empty folder: one line, status 2, no log file, no outputs/ or .hydra folder."""
    for tool, argv, message in [
        ("inspect_dataset", ["dataset=hopper-medium", "overwrit=true"],
         "error: unknown setting 'overwrit'. Did you mean 'overwrite'?"),
        ("inspect_dataset", [f"dataset={tmp_path / 'nowhere' / 'données.hdf5'}"], f"error: {tmp_path / 'nowhere'}"),
        ("collect", ["env=pendulum", "collect.seeed=1", f"collect.run_dir={tmp_path / 'run'}"],
         "error: unknown setting 'collect.seeed'. Did you mean 'collect.seed'?"),
    ]:
        done = run_script(tool, *argv, tmp_path=tmp_path)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith(message), done.stderr
        assert sorted(p.name for p in tmp_path.iterdir()) == ["work"] and list((tmp_path / "work").iterdir()) == []


def test_a_tiny_run_trains_and_evaluates_in_a_folder_with_any_characters(tmp_path):
    run_dir = tmp_path / "données" / "été 1=a,b"
    trained = run_script("train", "algo=td3bc", *RUN_TINY, f"trainer.run_dir={run_dir}", tmp_path=tmp_path)
    assert trained.returncode == 0, trained.stderr
    assert (run_dir / "checkpoint.pt").exists() and (run_dir / "metrics.jsonl").exists()
    evaluated = run_script("evaluate", f"checkpoint={run_dir / 'checkpoint.pt'}", "episodes=1", tmp_path=tmp_path)
    assert evaluated.returncode == 0 and "td3bc on Pendulum-v1, epoch 2, 1 episodes: return" in evaluated.stdout, \
        evaluated.stderr
    assert list((tmp_path / "work").iterdir()) == []


def test_a_list_written_with_commas_alone_gets_the_list_syntax(tmp_path, monkeypatch, capsys):
    """``a,b`` is a string to these tools (a path may hold commas); a list setting says how to write a list."""
    monkeypatch.chdir(tmp_path)
    status, out, err = run_in_process("collect", ["env=pendulum", "collect.levels=random,medium",
                                                  f"collect.run_dir={tmp_path / 'run'}"], monkeypatch, capsys)
    assert status == 2 and err == "error: collect.levels = 'random,medium' must be a list or tuple, e.g. collect.levels=[a,b].\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("tool, argv, message", [
    ("inspect_dataset", ["env.name=pendulum"],
     "error: unknown setting 'env.name'. The env is a config group: choose it with env=pendulum (ant, halfcheetah,"),
    ("collect", ["collect.env=pendulum"],
     "error: unknown setting 'collect.env'. The env is a config group: choose it with env=pendulum (ant, "),
    ("inspect_dataset", ["env.dataset=x.hdf5"],
     "error: unknown setting 'env.dataset'. env.* settings need the env group chosen: env=<option> (ant, "),
    ("train", ["+env=pendulum"],
     "error: +env=pendulum: env is already chosen by this config; choose another with env=pendulum (without '+')."),
])
def test_a_group_written_as_a_setting_gets_the_group_syntax(tool, argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    status, out, err = run_in_process(tool, [*argv, "--cfg", "job"], monkeypatch, capsys)
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1 and err.startswith(message), err


def test_edge_of_reach_runs_the_chosen_runs_and_refuses_an_unknown_one(tmp_path, monkeypatch, capsys):
    """``runs=`` picks some of the four runs (the others are not trained), the table gives each run's final mean Q
    and its bound r_max / (1 - gamma), and the PNG is written; a name outside the four is refused in one line
    before anything is composed or trained."""
    status, out, err = run_in_process("edge_of_reach", ["runs=[mopo-true,sac]", f"out={tmp_path / 'x'}"], monkeypatch,
                                      capsys)
    assert status == 2 and err.strip() == ("error: runs=[mopo-true,sac] must list distinct runs from mopo-learned, "
                                           "mopo-true, ravl-learned, ravl-true, e.g. runs=[mopo-true,ravl-true]."), err
    assert not (tmp_path / "x").exists()
    monkeypatch.setenv("MBRL_OFFLINE_CACHE", str(tmp_path / "cache"))
    rows = load_tool("edge_of_reach").main([
        "env=pendulum", "runs=[mopo-true]", "algo.gamma=0.9", "algo.hidden_size=32", "trainer.epochs=1",
        "trainer.updates_per_epoch=20", "trainer.eval_every=1", "trainer.eval_episodes=1", "trainer.progress=false",
        "generator.rollout.rollouts_per_epoch=50", "generator.every=20", f"out={tmp_path / 'eor'}"])
    assert [r["name"] for r in rows] == ["mopo-true"] and sorted(p.name for p in (tmp_path / "eor").iterdir()) == [
        "edge_of_reach.png", "mopo-true"]
    from mbrl_offline import load_dataset

    assert rows[0]["q_bound"] == pytest.approx(float(load_dataset("pendulum-medium").rewards.max()) / 0.1, rel=1e-6)
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("mopo  true"))
    assert f"{rows[0]['q'][-1][1]:.1f}" in line and f"{rows[0]['q_bound']:.1f}" in line
