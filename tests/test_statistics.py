"""Aggregate statistics over runs and tasks (mbrl_offline/statistics.py) and their place in reports."""
import json

import numpy as np
import pytest

from mbrl_offline import statistics
from mbrl_offline.errors import InputError
from mbrl_offline.report import write_report

from test_report import PNG, fake_run


def test_trim_mean_cuts_a_quarter_from_each_end_as_scipy_does():
    assert statistics.trim_mean([4.0, 1.0, 3.0, 2.0]) == 2.5  # int(1.0) cut each end: mean of 2 and 3
    assert statistics.trim_mean([10.0, 1.0, 2.0, 3.0, -50.0]) == 2.0  # int(1.25) = 1 cut: mean of 1, 2, 3
    assert statistics.trim_mean([0.0, 3.0, 30.0]) == 11.0  # int(0.75) = 0: nothing cut
    np.testing.assert_allclose(statistics.trim_mean(np.array([[1.0, 2, 3, 100], [0, 0, 4, 4]]), axis=1), [2.5, 2.0])


def test_iqm_pools_runs_and_mean_weighs_tasks_equally():
    tasks = [np.array([0.0, 10.0]), np.array([100.0])]
    assert statistics.mean(tasks) == 52.5  # (5 + 100) / 2, not the pooled 36.7
    # pooled 0, 10, 100, and one more task's 20: cut int(1.0) from each end, mean of 10 and 20
    assert statistics.iqm(tasks + [np.array([20.0])]) == 15.0


def test_stratified_bootstrap_redraws_within_each_task():
    """Two tasks whose runs agree within the task: every stratified redraw keeps five runs of each, so
    the intervals collapse to the point. An unstratified redraw of the ten pooled runs would not."""
    tasks = [np.zeros(5), np.full(5, 100.0)]
    for estimate in (statistics.mean_estimate(tasks, reps=2000), statistics.iqm_estimate(tasks, reps=2000)):
        assert (estimate.value, estimate.low, estimate.high) == (50.0, 50.0, 50.0)
    pooled = statistics.mean_estimate([np.concatenate(tasks)], reps=2000)
    assert pooled.low < 40 and pooled.high > 60


def test_bootstrap_interval_of_a_mean_has_the_normal_width():
    values = np.random.default_rng(1).normal(3.0, 2.0, size=400)
    estimate = statistics.bootstrap_mean(values, reps=20_000, seed=0)
    half = 1.96 * values.std() / np.sqrt(values.size)  # 0.196 for sigma 2
    assert estimate.value == pytest.approx(values.mean())
    assert estimate.low == pytest.approx(values.mean() - half, abs=0.03)
    assert estimate.high == pytest.approx(values.mean() + half, abs=0.03)
    assert statistics.bootstrap_mean(values, reps=1000, seed=5) == statistics.bootstrap_mean(values, reps=1000, seed=5)


def test_performance_profile_is_the_share_of_runs_above_each_threshold():
    tasks = [np.array([0.0, 50.0, 100.0]), np.array([60.0])]
    point, low, high = statistics.performance_profile(tasks, [-1.0, 25.0, 75.0, 100.0], reps=500)
    # task means of the shares: (1 + 1) / 2, (2/3 + 1) / 2, (1/3 + 0) / 2, 0
    np.testing.assert_allclose(point, [1.0, 5 / 6, 1 / 6, 0.0])
    assert np.all(low <= point + 1e-12) and np.all(high >= point - 1e-12)
    assert low[0] == high[0] == 1.0 and low[3] == high[3] == 0.0


def test_probability_of_improvement_counts_pairs_and_ties():
    assert statistics.probability_of_improvement([[1.0, 2.0]], [[1.5]]).value == 0.5
    assert statistics.probability_of_improvement([[1.0, 2.0]], [[2.0]]).value == 0.25  # (0 + 1/2) / 2
    always = statistics.probability_of_improvement([[5.0, 6.0, 7.0], [1.0]], [[1.0, 2.0], [0.0, 0.5]])
    assert (always.value, always.low, always.high) == (1.0, 1.0, 1.0)
    # the average over tasks: 1 on the first, 0 on the second
    assert statistics.probability_of_improvement([[9.0], [0.0]], [[1.0], [9.0]]).value == 0.5
    with pytest.raises(InputError, match="same tasks"):
        statistics.probability_of_improvement([[1.0]], [[1.0], [2.0]])


@pytest.mark.parametrize("bad", [[], [np.array([])], [np.array([1.0, np.nan])], [np.array([np.inf])]])
def test_bad_scores_are_refused_in_one_line(bad):
    with pytest.raises(InputError, match="scores"):
        statistics.iqm_estimate(bad)


def test_report_gives_aggregates_profiles_and_probability_of_improvement(tmp_path):
    runs = tmp_path / "runs"
    for seed in range(3):
        for dataset in ("bundled:pendulum-medium", "bundled:pendulum-random"):
            name = dataset.split(":")[1]
            fake_run(runs / f"a-{name}-{seed}", "alpha", seed, [10.0, 60.0 + seed], dataset=dataset)
            fake_run(runs / f"b-{name}-{seed}", "beta", seed, [10.0, 20.0 + seed], dataset=dataset)
    fake_run(runs / "c-0", "gamma", 0, [5.0], dataset="bundled:hopper-medium")
    text = write_report([runs], tmp_path / "out").read_text()
    assert "## Aggregate over datasets" in text and "(profiles.png)" in text
    assert (tmp_path / "out" / "profiles.png").read_bytes()[:8] == PNG
    # alpha's six finals are 60, 61, 62 on each dataset: IQM of the middle half and its interval
    assert "| alpha | pendulum-medium, pendulum-random | 6 | 61.0 [" in text
    assert "| gamma | hopper-medium | 1 | 5.0 [5.0, 5.0] | 5.0 [5.0, 5.0] |" in text
    # every alpha run beats every beta run on both common datasets; gamma shares none with them
    assert "| alpha | beta | pendulum-medium, pendulum-random | 1.00 [1.00, 1.00] |" in text
    assert "| beta | alpha | pendulum-medium, pendulum-random | 0.00 [0.00, 0.00] |" in text
    assert "| gamma |" not in text.split("## Probability of improvement")[1].split("## Learning curves")[0]
