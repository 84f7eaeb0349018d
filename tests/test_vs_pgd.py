"""``benchmarks/vs_pgd.py``'s parts that run without the official checkout: the same-work check, the
refusal of a wrong checkout, and that the file imports without torch (the official side runs it under
a Python that has none)."""
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import vs_pgd  # noqa: E402


def test_work_differences_name_only_the_measures_quantities_that_differ():
    official = {"unet_parameters": 100, "sampler_steps": 32, "trajectories": 4, "rows": 129, "channels": 16,
                "policy_parameters": 7}
    ours = dict(official, sampler_steps=31, policy_parameters=8)
    assert vs_pgd.work_differences(official, dict(official), "guided") == []
    assert vs_pgd.work_differences(official, ours, "guided") == ["policy_parameters: official 7, ours 8",
                                                                 "sampler_steps: official 32, ours 31"]
    # the unguided measure has no policy: its parameter count is not compared there
    assert vs_pgd.work_differences(official, ours, "sample") == ["sampler_steps: official 32, ours 31"]
    # a quantity one side did not report counts as a difference
    assert vs_pgd.work_differences({"steps": 1}, {"steps": 1, "batch": 32}, "train") == ["batch: official None, ours 32"]


def test_the_file_imports_without_torch_and_refuses_a_directory_that_is_not_the_official_checkout(tmp_path):
    code = (f"import sys; sys.path.insert(0, {str(BENCHMARKS)!r}); import vs_pgd; "
            "assert 'torch' not in sys.modules, 'vs_pgd imports torch at the top'")
    subprocess.run([sys.executable, "-c", code], check=True)
    done = subprocess.run([sys.executable, str(BENCHMARKS / "vs_pgd.py"), "--pgd", str(tmp_path), "--python",
                           sys.executable], capture_output=True, text=True)
    assert done.returncode != 0
    assert "is not a checkout of EmptyJackson/policy-guided-diffusion" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
