"""``benchmarks/vs_pgd.py``'s parts (and `side_by_side`'s, which every ``vs_*.py`` uses) that run without the official checkout: the same-work check, the
refusal of a wrong checkout, and that the file imports without torch (the official side runs it under
a Python that has none)."""
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import side_by_side  # noqa: E402
import vs_pgd  # noqa: E402


def test_work_differences_name_only_the_measures_quantities_that_differ():
    official = {"unet_parameters": 100, "sampler_steps": 32, "trajectories": 4, "rows": 129, "channels": 16,
                "policy_parameters": 7}
    ours = dict(official, sampler_steps=31, policy_parameters=8)
    assert side_by_side.work_differences(official, dict(official), vs_pgd.SAME_WORK["guided"]) == []
    assert side_by_side.work_differences(official, ours, vs_pgd.SAME_WORK["guided"]) == ["policy_parameters: official 7, ours 8",
                                                                 "sampler_steps: official 32, ours 31"]
    # the unguided measure has no policy: its parameter count is not compared there
    assert side_by_side.work_differences(official, ours, vs_pgd.SAME_WORK["sample"]) == ["sampler_steps: official 32, ours 31"]
    # a quantity one side did not report counts as a difference
    assert side_by_side.work_differences({"steps": 1}, {"steps": 1, "batch": 32}, vs_pgd.SAME_WORK["train"]) == ["batch: official None, ours 32"]


def test_the_file_imports_without_torch_and_refuses_a_directory_that_is_not_the_official_checkout(tmp_path):
    code = (f"import sys; sys.path.insert(0, {str(BENCHMARKS)!r}); import vs_pgd; "
            "assert 'torch' not in sys.modules, 'vs_pgd imports torch at the top'")
    subprocess.run([sys.executable, "-c", code], check=True)
    done = subprocess.run([sys.executable, str(BENCHMARKS / "vs_pgd.py"), "--pgd", str(tmp_path), "--python",
                           sys.executable], capture_output=True, text=True)
    assert done.returncode != 0
    assert "is not a checkout of EmptyJackson/policy-guided-diffusion" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_run_child_returns_the_last_result_line_and_exits_with_the_childs_error(tmp_path):
    script = tmp_path / "child.py"
    script.write_text("import json, os, sys\n"
                      "if '--fail' in sys.argv: sys.exit('broken ' + sys.argv[sys.argv.index('--side') + 1])\n"
                      "print('RESULT ' + json.dumps({'n': 1}))\n"
                      "print('RESULT ' + json.dumps({'gpu': os.environ['CUDA_VISIBLE_DEVICES'], 'x': os.environ['X'],\n"
                      "                             'measure': sys.argv[-1]}))\n")
    result = side_by_side.run_child(str(script), sys.executable, "ours", "train", [], env={"X": "y"})
    assert result == {"gpu": "", "x": "y", "measure": "train"}
    code = (f"import sys; sys.path.insert(0, {str(BENCHMARKS)!r}); import side_by_side; "
            f"side_by_side.run_child({str(script)!r}, sys.executable, 'official', 'sample', ['--fail'])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 1
    assert done.stderr.startswith("error: the official sample measurement failed:") and "broken official" in done.stderr


def test_compare_prints_each_pairs_ratio_and_stops_when_the_sides_did_different_work(tmp_path, capsys):
    script = tmp_path / "child.py"
    script.write_text("import json, sys\n"
                      "side = sys.argv[sys.argv.index('--side') + 1]\n"
                      "steps = 3 if side == 'ours' and '--differ' in sys.argv else 2\n"
                      "rate = {'official': 2.0, 'ours': 5.0}[side]\n"
                      "print('RESULT ' + json.dumps({'rate': rate, 'peak': 100.0, 'work': {'steps': steps, 'rows': 1000},\n"
                      "                             'versions': {'jax': '0.0'} if side == 'official' else {}}))\n")
    side_by_side.compare(str(script), sys.executable, ["train"], 2, [], {"train": ("steps", "rows")},
                         {"train": "samples/s"}, summary_extra=lambda ours: f"peak {ours['peak']:.0f}")
    lines = capsys.readouterr().out.splitlines()
    assert lines[2:4] == ["| train (samples/s) | 1 | 2.0 | 5.0 | 2.50x | 100 / 100 |",
                          "| train (samples/s) | 2 | 2.0 | 5.0 | 2.50x | 100 / 100 |"]
    assert lines[-3:] == ["official side: jax 0.0", "the same on both sides (each read off its own objects): "
                          "train: steps 2, rows 1,000", "train: ours / official = 2.50-2.50x (samples/s); peak 100"]
    code = (f"import sys; sys.path.insert(0, {str(BENCHMARKS)!r}); import side_by_side; "
            f"side_by_side.compare({str(script)!r}, sys.executable, ['train'], 1, ['--differ'], "
            "{'train': ('steps',)}, {'train': 'samples/s'})")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 1 and done.stderr.strip() == "error: the two sides did different train work: steps: official 2, ours 3"


def test_a_python_that_is_not_a_file_is_refused_in_one_line(tmp_path):
    (tmp_path / "diffusion").mkdir()
    (tmp_path / vs_pgd.OFFICIAL_FILE).write_text("")  # the file main() looks for; nothing of it is read
    missing = tmp_path / "no-venv" / "python"
    done = subprocess.run([sys.executable, str(BENCHMARKS / "vs_pgd.py"), "--pgd", str(tmp_path), "--python",
                           str(missing)], capture_output=True, text=True)
    assert done.returncode == 1
    assert done.stderr.strip() == (f"error: --python {missing} is not a file; give the Python of the environment "
                                   "with the official code's packages (see the docstring).")
