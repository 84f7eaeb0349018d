"""Every command line the README and docs/ show for a tool in examples/ composes (``--cfg job``), and
every setting they name in passing (``algo.eta=0.5`` in a sentence) exists: a setting renamed or
removed makes this fail until the docs follow."""
import functools
import importlib.util
import re
import shlex
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from mbrl_offline.algorithms import ALGORITHMS
from mbrl_offline.cli import compose
from mbrl_offline.generators import GENERATORS

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND = re.compile(r"python (examples/\w+\.py)\b")
SETTING = re.compile(r"^(algo|generator|trainer|env)\.[A-Za-z_][\w.]*=\S+$")
PLACEHOLDER = re.compile(r"<[^>]*>|\.\.\.|…|(?:^|\s)\[[^\]]*\]")  # <name>, ..., " [optional parts]" (not key=[a,b])
TOOLS_WITHOUT_CFG_JOB = {"examples/report.py"}  # it takes options, not settings (--help documents them)


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
                match = COMMAND.search(span)
                if match and match.group(1) not in TOOLS_WITHOUT_CFG_JOB:
                    found.append((path.name, span[match.start():]))
            elif SETTING.match(span):
                found.append((path.name, span))
    return sorted(set(found))


COMMANDS = documented("command")
SETTINGS = documented("setting")


@functools.lru_cache(maxsize=None)
def tool(script: str):
    spec = importlib.util.spec_from_file_location(Path(script).stem + "_tool", ROOT / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_docs_show_commands_and_settings():
    assert len(COMMANDS) > 50 and any("examples/train.py" in c for _, c in COMMANDS)
    assert len(SETTINGS) > 20


@pytest.mark.parametrize("document, command", [c for c in COMMANDS if not PLACEHOLDER.search(c[1])],
                         ids=lambda value: value[:90])
def test_a_documented_command_composes(document, command, capsys):
    words = shlex.split(command.split("#")[0].split("|")[0].split(">")[0].split("&&")[0])
    script, arguments = words[1], [w for w in words[2:] if w not in ("--cfg", "job")]
    with pytest.raises(SystemExit) as done:
        tool(script).main(arguments + ["--cfg", "job"])
    assert done.value.code == 0, f"{document}: {command}\n{capsys.readouterr().err.strip()}"


@functools.lru_cache(maxsize=None)
def setting_paths() -> frozenset:
    """Every setting path of the train config, over every algorithm and every generator."""
    paths = set()

    def walk(node, prefix):
        for key, value in node.items():
            paths.add(prefix + key)
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")

    for algo in ALGORITHMS:
        for generator in [None, *GENERATORS]:
            overrides = [f"algo={algo}"] + ([f"generator={generator}"] if generator else [])
            try:
                cfg = compose(CONFIGS, "train", overrides)
            except Exception:  # a generator this algorithm's config cannot take: another pair has it
                continue
            walk(OmegaConf.to_container(cfg), "")
    return frozenset(paths)


@pytest.mark.parametrize("document, setting", SETTINGS, ids=lambda value: value[:90])
def test_a_setting_named_in_the_docs_exists(document, setting):
    key = setting.partition("=")[0]
    assert key in setting_paths(), f"{document} names `{setting}`, but no train config has {key}"
