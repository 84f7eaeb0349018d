"""MBRL_OFFLINE_MKL_AVX512: the in-memory library, and MKL choosing its code by instruction set with it.

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

from mbrl_offline import mkl_avx512

ROOT = Path(__file__).resolve().parents[1]
MODULE = ROOT / "mbrl_offline" / "mkl_avx512.py"
X86_LINUX = sys.platform.startswith("linux") and platform.machine() == "x86_64"
needs_x86_linux = pytest.mark.skipif(not X86_LINUX, reason="an x86-64 ELF library: x86-64 Linux only")

# Loads the module file alone (no package, so no torch), optionally the unlock's library, then torch,
# and prints the branch MKL chose.
MKL_BRANCH = f"""
import ctypes, importlib.util, os, sys
spec = importlib.util.spec_from_file_location("mkl_avx512", {str(MODULE)!r})
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
    environment = {key: value for key, value in os.environ.items() if key != mkl_avx512.ENV_VAR} | env
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
    library = mkl_avx512._load(mkl_avx512.elf_shared_library("mbrl_offline_test_returns_one"))
    assert library.mbrl_offline_test_returns_one() == 1
    with pytest.raises(AttributeError):
        library.mkl_serv_intel_cpu_true  # noqa: B018  (exports only the named function)


@needs_x86_linux
def test_mkl_picks_an_instruction_set_branch_with_the_library_loaded_first():
    default, unlocked = mkl_branch("default"), mkl_branch("unlocked")
    # With the library MKL takes an instruction-set branch on any x86-64 CPU, as on Intel ones; on an AMD
    # CPU with AVX-512 its default was the generic one.
    assert unlocked > 0 and unlocked >= default
    if mkl_avx512.would_help():
        assert default == 0 and unlocked > default


@needs_x86_linux
def test_environment_variable_unlocks_when_the_package_is_imported_before_torch():
    status = "import mbrl_offline, torch; print(mbrl_offline.mkl_avx512.status())"
    first = run_python(status, MBRL_OFFLINE_MKL_AVX512="1")
    late = run_python(status.replace("mbrl_offline, torch", "torch, mbrl_offline"), MBRL_OFFLINE_MKL_AVX512="1")
    unset = run_python(status)
    assert first.returncode == late.returncode == unset.returncode == 0, first.stderr + late.stderr + unset.stderr
    assert unset.stdout.strip() == f"off ({mkl_avx512.ENV_VAR} is not 1)"
    if mkl_avx512.would_help():
        assert first.stdout.startswith("on (")
        assert late.stdout.startswith("off (torch was imported before mbrl_offline")
    else:  # another vendor or no AVX-512: off, with the reason
        assert first.stdout.strip() == late.stdout.strip() == f"off ({mkl_avx512._cpu_reason()})"


def test_unknown_value_stops_the_command_line_with_one_error_line(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "evaluate.py"), f"checkpoint={tmp_path}/x.pt"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, mkl_avx512.ENV_VAR: "yes"})
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: {mkl_avx512.ENV_VAR}='yes' is not understood: set it to 1 (let MKL run its AVX-512 code on "
        "AMD CPUs), or to 0 or nothing (torch's default)"]
    assert not list(tmp_path.iterdir())


def test_unknown_value_leaves_a_library_import_working_and_says_why():
    done = run_python("import mbrl_offline; print(mbrl_offline.mkl_avx512.status())", MBRL_OFFLINE_MKL_AVX512="on")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"off ({mkl_avx512.ENV_VAR}='on' is not understood")


@needs_x86_linux
def test_training_log_line_says_what_the_setting_did():
    advice = "import {} as m; print(m.mkl_avx512.advice())"
    lines = {name: run_python(advice.format(imports), **env).stdout.strip() for name, imports, env in [
        ("unset", "mbrl_offline", {}), ("off", "mbrl_offline", {mkl_avx512.ENV_VAR: "0"}),
        ("on", "mbrl_offline", {mkl_avx512.ENV_VAR: "1"}), ("late", "torch, mbrl_offline", {mkl_avx512.ENV_VAR: "1"})]}
    assert lines["off"] == "None"
    if mkl_avx512.would_help():
        assert lines["unset"].startswith(f"hint: torch's MKL runs AVX2 code on this AMD CPU, which has AVX-512; "
                                         f"{mkl_avx512.ENV_VAR}=1 lets it run its AVX-512 code")
        assert lines["on"] == f"matmuls: {mkl_avx512.ON} ({mkl_avx512.ENV_VAR}=1)"
        assert lines["late"].startswith(f"matmuls: {mkl_avx512.ENV_VAR}=1 did nothing: torch was imported before")
    else:
        assert lines["unset"] == "None"
        assert lines["on"] == lines["late"] == f"matmuls: {mkl_avx512.ENV_VAR}=1 did nothing: {mkl_avx512._cpu_reason()}"


@needs_x86_linux
def test_only_amd_cpus_with_avx512_qualify():
    def cpuinfo(vendor, flags):
        return f"processor\t: 0\nvendor_id\t: {vendor}\nflags\t\t: fpu sse avx2 {flags}\n\nprocessor\t: 1\n"

    avx512 = "avx512f avx512cd avx512bw avx512dq avx512vl"
    assert mkl_avx512._cpu_reason(cpuinfo("AuthenticAMD", avx512)) is None
    assert mkl_avx512._cpu_reason(cpuinfo("GenuineIntel", avx512)) == (
        "not needed on a GenuineIntel CPU: MKL picks its code by instruction set there")
    assert mkl_avx512._cpu_reason(cpuinfo("AuthenticAMD", "avx512f")) == (
        "this AMD CPU lacks avx512cd, avx512bw, avx512dq, avx512vl, so MKL's AVX2 code is the right one")
