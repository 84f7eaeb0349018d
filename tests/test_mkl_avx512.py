"""MBRL_OFFLINE_MKL_AVX512 (mbrl_offline/platform.py): the in-memory library, MKL choosing its code by
instruction set with it, and the unlock running only when asked for (the command-line tools ask, before
torch loads; ``import mbrl_offline`` does not).

MKL's ``mkl_serv_cpu_detect()`` (exported by torch's wheel) returns the code branch MKL chose: 0 is its
generic code, which it takes on AMD CPUs; a positive value an instruction-set branch (7 for AVX-512 on
the project's Zen 5 CPU with the unlock). Each check runs in a fresh process, as the unlock only acts
before torch loads.
"""
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from mbrl_offline import platform as mbrl_platform

ROOT = Path(__file__).resolve().parents[1]
MODULE = ROOT / "mbrl_offline" / "platform.py"
X86_LINUX = sys.platform.startswith("linux") and platform.machine() == "x86_64"
needs_x86_linux = pytest.mark.skipif(not X86_LINUX, reason="an x86-64 ELF library: x86-64 Linux only")

# Loads the module file alone (no package, so no torch), optionally the unlock's library, then torch,
# and prints the branch MKL chose.
MKL_BRANCH = f"""
import ctypes, importlib.util, os, sys
spec = importlib.util.spec_from_file_location("mbrl_platform", {str(MODULE)!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
if sys.argv[1] == "unlocked":
    module._load(module.elf_shared_library(module.SYMBOL))
import torch
lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
if not hasattr(lib, "mkl_serv_cpu_detect"):
    sys.exit(print("no MKL"))
torch.manual_seed(0)
a, b = torch.randn(10, 256, 200), torch.randn(10, 200, 256)
exact = torch.bmm(a.double(), b.double())
print(lib.mkl_serv_cpu_detect(), ((torch.bmm(a, b) - exact).abs().max() / exact.abs().max()).item())
"""


def run_python(code: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items() if key != mbrl_platform.ENV_VAR} | env
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=environment,
                          cwd=ROOT, timeout=120)


def mkl_branch(mode: str) -> int:
    """The branch MKL chose in a fresh process; checks that its fp32 products are still right."""
    done = run_python(MKL_BRANCH, mode)
    assert done.returncode == 0, done.stderr
    if done.stdout.strip() == "no MKL":
        pytest.skip("this torch build has no MKL")
    branch, relative_error = done.stdout.split()
    assert float(relative_error) < 1e-5  # fp32 rounding only (measured: 3.5e-7 and 6.0e-7)
    return int(branch)


@needs_x86_linux
def test_elf_library_exports_one_function_returning_one():
    library = mbrl_platform._load(mbrl_platform.elf_shared_library("mbrl_offline_test_returns_one"))
    assert library.mbrl_offline_test_returns_one() == 1
    with pytest.raises(AttributeError):
        library.mkl_serv_intel_cpu_true  # noqa: B018  (exports only the named function)


@needs_x86_linux
def test_mkl_picks_an_instruction_set_branch_with_the_library_loaded_first():
    default, unlocked = mkl_branch("default"), mkl_branch("unlocked")
    # With the library MKL takes an instruction-set branch on any x86-64 CPU, as on Intel ones; on an AMD
    # CPU with AVX-512 its default was the generic one.
    assert unlocked > 0 and unlocked >= default
    if mbrl_platform.would_help():
        assert default == 0 and unlocked > default


# A process that asks for the unlock (before torch loads, or after), or only imports the package.
ASKED_FIRST = "from mbrl_offline import platform as p; p.apply_environment(); import torch; print(p.{})"
ASKED_LATE = "import torch; from mbrl_offline import platform as p; p.apply_environment(); print(p.{})"
NOT_ASKED = "import mbrl_offline, torch; from mbrl_offline import platform as p; print(p.{})"


@needs_x86_linux
def test_environment_variable_unlocks_only_when_asked_for_before_torch():
    first = run_python(ASKED_FIRST.format("status()"), MBRL_OFFLINE_MKL_AVX512="1")
    late = run_python(ASKED_LATE.format("status()"), MBRL_OFFLINE_MKL_AVX512="1")
    unset = run_python(ASKED_FIRST.format("status()"))
    library = run_python(NOT_ASKED.format("status()"), MBRL_OFFLINE_MKL_AVX512="1")
    done = [first, late, unset, library]
    assert all(d.returncode == 0 for d in done), "".join(d.stderr for d in done)
    assert unset.stdout.strip() == f"off ({mbrl_platform.ENV_VAR} is not 1)"
    # a library import changes nothing, and says so
    assert library.stdout.strip() == (f"off ({mbrl_platform.ENV_VAR}=1, but nothing in this process asked for it: "
                                      "call mbrl_offline.platform.apply_environment() before torch loads, as the "
                                      "command-line tools do)")
    if mbrl_platform.would_help():
        assert first.stdout.startswith("on (")
        assert late.stdout.startswith("off (torch was imported before mbrl_offline.platform.apply_environment() ran")
    else:  # another vendor or no AVX-512: off, with the reason
        assert first.stdout.strip() == late.stdout.strip() == f"off ({mbrl_platform._cpu_reason()})"


def test_the_tools_load_torch_only_after_applying_the_platform_settings():
    """Importing a tool's module (or ``python -m mbrl_offline``'s) loads no torch, and the tool's
    ``main`` applies the settings first (`mbrl_offline.cli.cli_main`): so the unlock acts on MKL."""
    from mbrl_offline.cli import TOOLS

    modules = ["mbrl_offline", "mbrl_offline.__main__", "mbrl_offline.platform", *[t.module for t in TOOLS.values()]]
    code = (f"import importlib, sys\nfor name in {modules!r}:\n    importlib.import_module(name)\n"
            "print(sorted(m for m in ('torch', 'numpy', 'hydra') if m in sys.modules))")
    done = run_python(code)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr
    tool = ("import sys; import mbrl_offline.tools.evaluate as tool; from mbrl_offline import platform as p\n"
            "try:\n    tool.main(['checkpoint=x.pt', '--cfg', 'job'])\nexcept SystemExit:\n    pass\n"
            "print('torch' in sys.modules, p.status())")
    ran = run_python(tool, MBRL_OFFLINE_MKL_AVX512="1")
    assert ran.returncode == 0, ran.stderr
    asked_first = run_python(ASKED_FIRST.format("status()"), MBRL_OFFLINE_MKL_AVX512="1").stdout.strip()
    assert ran.stdout.splitlines()[-1] == f"True {asked_first}"  # on where it helps, as if asked before torch


def test_unknown_value_stops_the_command_line_with_one_error_line(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "evaluate.py"), f"checkpoint={tmp_path}/x.pt"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, mbrl_platform.ENV_VAR: "yes"})
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: {mbrl_platform.ENV_VAR}='yes' is not understood: set it to 1 (let MKL run its AVX-512 code on "
        "AMD CPUs), or to 0 or nothing (torch's default)"]
    assert not list(tmp_path.iterdir())


def test_unknown_value_leaves_a_library_import_working_and_says_why():
    library = run_python(NOT_ASKED.format("status()"), MBRL_OFFLINE_MKL_AVX512="on")
    asked = run_python(ASKED_FIRST.format("status()"), MBRL_OFFLINE_MKL_AVX512="on")
    for done in (library, asked):
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"off ({mbrl_platform.ENV_VAR}='on' is not understood")


@needs_x86_linux
def test_training_log_line_says_what_the_setting_did():
    lines = {name: run_python(code.format("advice()"), **env).stdout.strip() for name, code, env in [
        ("unset", ASKED_FIRST, {}), ("off", ASKED_FIRST, {mbrl_platform.ENV_VAR: "0"}),
        ("on", ASKED_FIRST, {mbrl_platform.ENV_VAR: "1"}), ("late", ASKED_LATE, {mbrl_platform.ENV_VAR: "1"})]}
    assert lines["off"] == "None"
    if mbrl_platform.would_help():
        assert lines["unset"].startswith(f"hint: torch's MKL runs AVX2 code on this AMD CPU, which has AVX-512; "
                                         f"{mbrl_platform.ENV_VAR}=1 lets it run its AVX-512 code")
        assert lines["on"] == f"matmuls: {mbrl_platform.ON} ({mbrl_platform.ENV_VAR}=1)"
        assert lines["late"].startswith(f"matmuls: {mbrl_platform.ENV_VAR}=1 did nothing: torch was imported before")
    else:
        reason = f"matmuls: {mbrl_platform.ENV_VAR}=1 did nothing: {mbrl_platform._cpu_reason()}"
        assert lines["unset"] == "None" and lines["on"] == lines["late"] == reason


@needs_x86_linux
def test_only_amd_cpus_with_avx512_qualify():
    def cpuinfo(vendor, flags):
        return f"processor\t: 0\nvendor_id\t: {vendor}\nflags\t\t: fpu sse avx2 {flags}\n\nprocessor\t: 1\n"

    avx512 = "avx512f avx512cd avx512bw avx512dq avx512vl"
    assert mbrl_platform._cpu_reason(cpuinfo("AuthenticAMD", avx512)) is None
    assert mbrl_platform._cpu_reason(cpuinfo("GenuineIntel", avx512)) == (
        "not needed on a GenuineIntel CPU: MKL picks its code by instruction set there")
    assert mbrl_platform._cpu_reason(cpuinfo("AuthenticAMD", "avx512f")) == (
        "this AMD CPU lacks avx512cd, avx512bw, avx512dq, avx512vl, so MKL's AVX2 code is the right one")
