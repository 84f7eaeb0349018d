"""``benchmarks/neubay.py`` and ``benchmarks/vs_neubay.py`` at tiny sizes, without the official checkout:
our side's measures report the work both sides must agree on, the side-by-side script's sizes are the
benchmark's, its file imports without torch (the official side runs it under a Python that has none)
and it refuses a directory that is not the official checkout. No rates are checked."""
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import torch

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import neubay  # noqa: E402
import vs_neubay  # noqa: E402

CPU = torch.device("cpu")


def test_the_side_by_side_sizes_are_the_benchmarks():
    for column, sizes in ((0, neubay.Sizes()), (1, neubay.SIZES["quick"])):
        assert {name: values[column] for name, values in vs_neubay.SIZE_FLAGS.items() if name != "calls"} == \
            dataclasses.asdict(sizes)
    # the default sizes are the official ones (base.yaml) and NEUBAYConfig's
    default = neubay.Sizes()
    assert (default.members, default.elites, default.width, default.batch, default.parallel, default.tape) == \
        (128, 100, 200, 256, 100, 2048)
    config = neubay.agent_config(default)
    assert config == neubay.NEUBAYConfig()


def test_our_measures_report_the_work_the_two_sides_compare():
    quick = neubay.SIZES["quick"]
    training = neubay.measure_training(quick, CPU)
    rollouts = neubay.measure_rollouts(quick, CPU, calls=1)
    updates = neubay.measure_updates(quick, CPU, calls=1)
    for measure, result in (("train", training), ("rollout", rollouts), ("update", updates)):
        assert set(vs_neubay.SAME_WORK[measure]) <= set(result["work"]), measure
        assert result["flops"] > 0
    assert training["work"] == {"members": 6, "width": 16, "layers": 4, "batch": 32, "train_rows": 480,
                                "batches": 15, "ensemble_parameters": training["work"]["ensemble_parameters"]}
    assert len(training["batch_loops"]) == quick.epochs and training["batch_loop"] > 0 and training["fit"] > 0
    assert rollouts["work"]["transitions"] == quick.parallel * quick.rollout_steps == 12
    assert rollouts["work"]["elites"] == quick.elites and rollouts["work"]["policy_input"] == 15
    assert updates["work"]["tape"] == [quick.tape, 15] and updates["work"]["critics"] == quick.critics


def test_the_file_imports_without_torch_and_refuses_a_directory_that_is_not_the_official_checkout(tmp_path):
    code = (f"import sys; sys.path.insert(0, {str(BENCHMARKS)!r}); import vs_neubay; "
            "assert 'torch' not in sys.modules, 'vs_neubay imports torch at the top'")
    subprocess.run([sys.executable, "-c", code], check=True)
    done = subprocess.run([sys.executable, str(BENCHMARKS / "vs_neubay.py"), "--neubay", str(tmp_path), "--python",
                           sys.executable], capture_output=True, text=True)
    assert done.returncode != 0
    assert "is not a checkout of twni2016/neubay" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_our_child_prints_its_result_line(tmp_path):
    # the files main() looks for; our side reads nothing of the checkout
    for name in (vs_neubay.OFFICIAL_FILE, vs_neubay.OFFICIAL_CONFIG):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    done = subprocess.run([sys.executable, str(BENCHMARKS / "vs_neubay.py"), "--neubay", str(tmp_path), "--python",
                           sys.executable, "--sizes", "quick", "--threads", "1", "--side", "ours", "--measure",
                           "rollout"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    [line] = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    result = json.loads(line[len("RESULT "):])
    assert {"rate", "rates", "peak", "work", "flops", "versions"} <= set(result)
    assert result["work"]["transitions"] == 12 and len(result["rates"]) == 1


def test_the_update_profile_puts_every_operator_in_one_part():
    shares = dict(neubay.profile_updates(neubay.SIZES["quick"], CPU, updates=1))
    assert abs(sum(shares.values()) - 1) < 1e-6
    labels = [label for label, _ in neubay.PARTS]
    # the scan's products and sums count as the scan, the products outside it as products
    assert shares[labels[0]] > 0 and shares["matrix products"] > 0 and shares[labels[1]] > 0
