"""Every command line the README and docs/ show for a tool composes (``--cfg job``): ``python
examples/<tool>.py``, ``mbrl-<tool>`` and ``python -m mbrl_offline <tool>`` alike; and
every setting they name in passing (``algo.eta=0.5`` in a sentence) exists: a setting renamed or
removed makes this fail until the docs follow."""
import functools
import importlib
import importlib.util
import re
import shlex
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from mbrl_offline.algorithms import ALGORITHMS
from mbrl_offline.cli import TOOLS, console_script
from mbrl_offline.config_files import compose
from mbrl_offline.config import CONFIG_DIR
from mbrl_offline.generators import GENERATORS
from mbrl_offline.trackers import TRACKERS

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = CONFIG_DIR
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# a tool's command: python examples/<script>.py, mbrl-<tool> or python -m mbrl_offline <tool>
COMMAND = re.compile(r"(?<![\w/.-])(python examples/\w+\.py|mbrl-[a-z][\w-]*|python -m mbrl_offline [a-z][\w-]*)"
                     r"(?![\w.-])")
SETTING = re.compile(r"^(algo|generator|trainer|env)\.[A-Za-z_][\w.]*=\S+$")
PLACEHOLDER = re.compile(r"<[^>]*>|\.\.\.|…|(?:^|\s)\[[^\]]*\]")  # <name>, ..., " [optional parts]" (not key=[a,b])
TOOLS_WITHOUT_CFG_JOB = {"report"}  # it takes options, not settings (--help documents them)


def code_spans(text: str) -> list[str]:
    """The contents of fenced blocks (backslash continuations joined) and of inline code spans."""
    spans = []
    for block in re.findall(r"```[^\n]*\n(.*?)```", text, flags=re.S):
        spans += block.replace("\\\n", " ").splitlines()
    outside = re.sub(r"```.*?```", "", text, flags=re.S)
    spans += re.findall(r"`([^`\n]+)`", outside)
    return spans


def documented(pattern_kind: str) -> list[tuple[str, str]]:
    """``(document name, text)`` for each command (``pattern_kind='command'``) or setting named in the docs."""
    found = []
    for path in DOCUMENTS:
        for span in code_spans(path.read_text(encoding="utf-8")):
            span = span.strip()
            if pattern_kind == "command":
                match = COMMAND.search(span.split("#")[0])  # a command, not a word in a comment
                if match and tool_name(match.group(1)) not in TOOLS_WITHOUT_CFG_JOB:
                    found.append((path.name, span[match.start():]))
            elif SETTING.match(span):
                found.append((path.name, span))
    return sorted(set(found))


def tool_name(command: str) -> str:
    """The tool a command runs (``train`` for ``mbrl-train``, ``python -m mbrl_offline train`` and ``python
    examples/train.py``), or the script's path for an example that is not a tool
    (``examples/dynamics_in_pytorch.py``); a name that is no tool is returned as written, and fails."""
    words = command.split()
    if words[0].startswith("mbrl-"):
        return words[0].removeprefix("mbrl-")
    if words[:3] == ["python", "-m", "mbrl_offline"]:
        return words[3]
    return next((name for name, t in TOOLS.items() if f"examples/{t.example}" == words[1]), words[1])


def command_words(command: str) -> tuple[str, list[str]]:
    """``(tool, its arguments)`` of a documented command (a comment, pipe, redirection or ``&&`` ends it)."""
    words = shlex.split(command.split("#")[0].split("|")[0].split(">")[0].split("&&")[0])
    skip = 4 if words[:3] == ["python", "-m", "mbrl_offline"] else 1 if words[0].startswith("mbrl-") else 2
    return tool_name(command), words[skip:]


COMMANDS = documented("command")
SETTINGS = documented("setting")


@functools.lru_cache(maxsize=None)
def tool(name: str):
    """The module that runs tool ``name``, or the example script ``name`` (examples/dynamics_in_pytorch.py)."""
    if name in TOOLS:
        return importlib.import_module(TOOLS[name].module)
    assert name.startswith("examples/") and (ROOT / name).exists(), f"the docs show a command of no tool: {name}"
    spec = importlib.util.spec_from_file_location(Path(name).stem + "_tool", ROOT / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_docs_show_commands_and_settings():
    assert len(COMMANDS) > 50 and any("examples/train.py" in c for _, c in COMMANDS)
    assert any(c.startswith(console_script("train")) for _, c in COMMANDS)
    assert any(c.startswith("python -m mbrl_offline train") for _, c in COMMANDS)
    assert len(SETTINGS) > 20


def test_commands_of_every_form_are_found():
    """The three ways to run a tool are read as the same tool and arguments; a path that merely holds
    ``mbrl-`` is no command."""
    assert command_words("mbrl-train algo=ravl env=hopper  # note") == ("train", ["algo=ravl", "env=hopper"])
    assert command_words("python -m mbrl_offline dynamics-error starts=8") == ("dynamics-error", ["starts=8"])
    assert command_words("python examples/inspect_dataset.py dataset=x") == ("inspect", ["dataset=x"])
    assert command_words("python examples/dynamics_in_pytorch.py --model m") == ("examples/dynamics_in_pytorch.py",
                                                                               ["--model", "m"])
    assert not COMMAND.search("runs/mbrl-x/checkpoint.pt") and not COMMAND.search("pip install mbrl-offline.whl")


@pytest.mark.parametrize("document, command", [c for c in COMMANDS if not PLACEHOLDER.search(c[1])],
                         ids=lambda value: value[:90])
def test_a_documented_command_composes(document, command, capsys):
    name, words = command_words(command)
    arguments = [w for w in words if w not in ("--cfg", "job")]
    with pytest.raises(SystemExit) as done:
        tool(name).main(arguments + ["--cfg", "job"])
    assert done.value.code == 0, f"{document}: {command}\n{capsys.readouterr().err.strip()}"


@functools.lru_cache(maxsize=None)
def setting_paths() -> frozenset:
    """Every setting path of the train config: every algorithm with its own generator, every generator with
    the first algorithm that takes it (an algorithm's settings are its config's whatever the generator, and a
    generator's are its config's whatever the algorithm: the full cross, 78 compositions, gave the same paths
    at four times the time), and every tracker."""
    paths = set()

    def walk(node, prefix):
        for key, value in node.items():
            paths.add(prefix + key)
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")

    for algo in ALGORITHMS:
        walk(OmegaConf.to_container(compose(CONFIGS, "train", [f"algo={algo}"])), "")
    for generator in GENERATORS:
        for algo in ALGORITHMS:
            try:
                cfg = compose(CONFIGS, "train", [f"algo={algo}", f"generator={generator}"])
            except Exception:  # a generator this algorithm's config cannot take: another one has it
                continue
            walk(OmegaConf.to_container(cfg), "")
            break
        else:
            raise AssertionError(f"no algorithm takes generator={generator}")
    for tracker in TRACKERS:
        walk(OmegaConf.to_container(compose(CONFIGS, "train", [f"logger={tracker}"])), "")
    return frozenset(paths)


@pytest.mark.parametrize("document, setting", SETTINGS, ids=lambda value: value[:90])
def test_a_setting_named_in_the_docs_exists(document, setting):
    key = setting.partition("=")[0]
    assert key in setting_paths(), f"{document} names `{setting}`, but no train config has {key}"
