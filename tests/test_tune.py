"""Sweeps (mbrl_offline/tune.py, examples/sweep.py): complete, resume after Ctrl-C or a killed worker,
prune, record failures, share one study between workers on SQLite and on a real PostgreSQL server."""
import glob
import importlib.util
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
from optuna.trial import TrialState

from mbrl_offline.errors import ConfigError
from mbrl_offline.tune import PrunerConfig, SamplerConfig, SweepConfig, load_sweep, run_sweep

ROOT = Path(__file__).resolve().parents[1]
TINY = ["algo=ravl", "env=pendulum", "algo.hidden_size=16", "generator.rollout.rollouts_per_epoch=32",
        "generator.dynamics.hidden_size=16", "generator.dynamics.max_epochs=2", "generator.dynamics.min_epochs=0", "generator.every=5",
        "trainer.updates_per_epoch=5", "trainer.eval_episodes=1", "trainer.progress=false",
        "trainer.tensorboard=false", "torch_threads=1", "sweep.space.algo.num_critics.choices=[2,3]",
        "sweep.pruner.name=none"]


def interruptible():
    """Ctrl-C's default in the child even when pytest itself runs with SIGINT ignored (as a background
    job of a script does, and then Python never turns SIGINT into KeyboardInterrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def sweep_cli(tmp_path, *overrides, wait=True, base=TINY):
    command = [sys.executable, str(ROOT / "examples" / "sweep.py"), *base, f"sweep.dir={tmp_path / 'sweep'}", *overrides]
    env = {**os.environ, "MBRL_OFFLINE_CACHE": str(tmp_path / "cache")}
    if not wait:
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                cwd=tmp_path, preexec_fn=interruptible)
    return subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)


def states(sweep_dir):
    study, _ = load_sweep(sweep_dir)
    return [t.state for t in study.get_trials()], study


def wait_for(path: Path, process, timeout=120):
    start = time.time()
    while not path.exists():
        assert process.poll() is None, process.communicate()
        assert time.time() - start < timeout, f"{path} did not appear"
        time.sleep(0.2)


# ------------------------------------------------------------------------------- the command line
def test_sweep_completes_then_extends(tmp_path):
    first = sweep_cli(tmp_path, "sweep.n_trials=2", "trainer.epochs=2")
    assert first.returncode == 0, first.stderr
    assert "best trial" in first.stdout and "best parameters: algo.num_critics=" in first.stdout
    found, study = states(tmp_path / "sweep")
    assert found == [TrialState.COMPLETE] * 2
    assert all(t.user_attrs["eval_episodes"] == 2 for t in study.trials)  # 2 evaluations x 1 episode
    run = tmp_path / "sweep" / "trial-0001" / "seed-0"
    assert (run / "checkpoint.pt").exists() and (run / "run.json").exists()
    # the same command with more trials continues the study: the two finished trials are kept
    second = sweep_cli(tmp_path, "sweep.n_trials=3", "trainer.epochs=2")
    assert second.returncode == 0, second.stderr
    found, study = states(tmp_path / "sweep")
    assert found == [TrialState.COMPLETE] * 3 and study.trials[0].value == pytest.approx(
        optuna.load_study(study_name="ravl-pendulum", storage=f"sqlite:///{tmp_path / 'sweep' / 'study.db'}")
        .trials[0].value)
    assert second.stdout.count("trial 2:") == 2 and "trial 0:" not in second.stdout


@pytest.mark.extended
@pytest.mark.parametrize("stop", ["ctrl-c", "kill"])
def test_interrupted_trial_is_retried_and_resumes_its_runs(tmp_path, stop):
    process = sweep_cli(tmp_path, "sweep.n_trials=2", "trainer.epochs=40", "sweep.heartbeat_seconds=1", wait=False)
    run = tmp_path / "sweep" / "trial-0000" / "seed-0"
    wait_for(run / "checkpoint.pt", process)
    process.send_signal(signal.SIGINT if stop == "ctrl-c" else signal.SIGKILL)
    process.communicate(timeout=60)
    assert process.returncode == (130 if stop == "ctrl-c" else -9)
    found, study = states(tmp_path / "sweep")
    if stop == "ctrl-c":  # failed at once, and queued again
        assert found == [TrialState.FAIL, TrialState.WAITING] and study.trials[0].user_attrs["interrupted"]
    else:  # the worker's heartbeat stops; the next worker fails the trial once it is stale (2 s)
        assert found == [TrialState.RUNNING]
        time.sleep(2.5)
    stopped_at = len((run / "metrics.jsonl").read_text().splitlines())
    assert 1 <= stopped_at < 40

    resumed = sweep_cli(tmp_path, "sweep.n_trials=2", "trainer.epochs=40", "sweep.heartbeat_seconds=1")
    assert resumed.returncode == 0, resumed.stderr
    found, study = states(tmp_path / "sweep")
    assert found == [TrialState.FAIL, TrialState.COMPLETE, TrialState.COMPLETE]
    retry = study.trials[1]
    assert retry.user_attrs["retry_of"] == 0 and retry.params == study.trials[0].params
    assert retry.user_attrs["trial_dir"] == "trial-0000" and "(retry of trial 0)" in resumed.stdout
    epochs = [int(line.split(",")[0].split(":")[1]) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert epochs == list(range(1, 41))  # the run continued from its checkpoint, no epoch twice
    # only the epochs run after the resume count as new evaluation episodes of the retry
    assert retry.user_attrs["eval_episodes"] <= 40 - stopped_at + 1


@pytest.mark.parametrize("storage", ["study.db", "study.journal"])
@pytest.mark.parametrize("stop", ["api", "tool", "sigterm"])
def test_a_ctrl_c_inside_a_storage_call_leaves_the_study_usable(tmp_path, storage, stop):
    """Ctrl-C at every 7th line of two calls into the study's storage (a trial's report and a user
    attribute, the calls a trial makes after each evaluation), then what a stopped worker does next.
    Each call must end in KeyboardInterrupt, and the worker's next calls (fail the trial, queue it again)
    must run at once: interrupted inside SQLAlchemy's commit or close, the SQLite study stayed locked for
    the 60 s of its lock timeout (as in CI's run of the interrupted-trial test above), later calls raised
    IllegalStateChangeError, and a few interrupts later one waited for ever on a lock inside SQLAlchemy.
    As a tool runs (`interrupts_kept`), from Python (SIGINT with Python's own handler), and as SIGTERM in a
    sweep (`tune._sigterm_as_interrupt`) whose SIGINT is ignored, as a background job's is. In a process of
    its own, so that a call that waits for ever fails the test."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_interrupt_storage_calls, args=(tmp_path, storage, stop, queue))
    child.start()
    child.join(timeout=180)
    if child.is_alive():
        child.kill()
        child.join()
        pytest.fail("after a Ctrl-C inside a storage call, a later call waited for ever")
    outcome = queue.get(timeout=5)
    assert outcome == "ok", outcome


def _interrupt_storage_calls(tmp_path, storage, stop, queue):
    import sqlite3
    from mbrl_offline import tune
    from mbrl_offline.platform import interrupts_kept
    from mbrl_offline.tune import open_storage, storage_location

    tune.SQLITE_LOCK_WAIT_S = 2  # a study left locked fails this test in seconds
    # Python's own handler (pytest in the background ignores SIGINT), or ignored as in a background job
    signal.signal(signal.SIGINT, signal.SIG_IGN if stop == "sigterm" else signal.default_int_handler)
    sent = signal.SIGTERM if stop == "sigterm" else signal.SIGINT
    blocks = {"api": nullcontext, "tool": interrupts_kept, "sigterm": tune._sigterm_as_interrupt}
    location = storage_location(None if storage == "study.db" else str(tmp_path / storage), tmp_path)
    study = optuna.create_study(study_name="s", storage=open_storage(location, 1, lambda study, trial: None))
    trial, step = study.ask(), 0
    counts, reported = {}, []

    def traced(call, at=None):
        """Run ``call`` counting its lines, sending the signal at line ``at``: (lines run, what it raised)."""
        lines = [0]

        def tracer(frame, event, arg):
            if event == "line":
                lines[0] += 1
                if lines[0] == at:
                    signal.raise_signal(sent)
            return tracer
        sys.settrace(tracer)
        try:
            call()
            outcome = None
        except BaseException as exc:
            outcome = exc
        finally:
            sys.settrace(None)
        return lines[0], outcome

    calls = {"report": lambda: trial.report(1.0, step), "user attribute": lambda: trial.set_user_attr("n", step)}
    try:
        with blocks[stop]():
            for name, call in calls.items():
                counts[name], outcome = traced(call)
                assert outcome is None, outcome
                reported += [step] if name == "report" else []
                step += 1
                for at in range(1, counts[name], 7):
                    lines, outcome = traced(call, at)
                    if lines < at:  # this call ran fewer lines than the counted one: no Ctrl-C was sent
                        assert outcome is None, outcome
                    elif not isinstance(outcome, KeyboardInterrupt):
                        raise AssertionError(f"Ctrl-C at line {at} of the {name} call ended in {outcome!r}")
                    reported += [step] if name == "report" else []
                    step += 1
                    if storage == "study.db":
                        database = sqlite3.connect(tmp_path / storage, timeout=0.5)
                        try:
                            database.execute("BEGIN IMMEDIATE")
                        except sqlite3.OperationalError as exc:
                            raise AssertionError(f"Ctrl-C at line {at} of the {name} call left the study "
                                                 f"{exc}") from None
                        database.rollback()
                        database.close()
        assert min(counts.values()) > 100  # the calls were traced: the Ctrl-Cs landed deep inside them
        start = time.time()
        trial.set_user_attr("interrupted", True)
        study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})
        study.tell(trial, state=TrialState.FAIL)
        assert time.time() - start < 10
        assert [t.state for t in study.get_trials()] == [TrialState.FAIL, TrialState.WAITING]
        # a report whose Ctrl-C landed in the storage (most of its lines) was completed before it was raised
        recorded = set(study.trials[0].intermediate_values)
        assert recorded <= set(reported) and len(recorded) > 0.5 * len(reported)
    except BaseException as exc:
        queue.put(f"{type(exc).__name__}: {exc}")
    else:
        queue.put("ok")


SPACE = "algo.num_critics, algo.eta, generator.mixing.real_ratio, generator.rollout.horizon"


def test_bad_sweep_settings_give_one_error_line(tmp_path, capsys):
    cases = [
        ("+sweep.space.algo.etta={type:float,low:0.1,high:1}",
         "error: the search space sets algo.num_critics, algo.eta, algo.etta, generator.mixing.real_ratio, "
         "generator.rollout.horizon: unknown setting 'algo.etta'. Did you mean 'algo.eta'?"),
        ("sweep.space.algo.num_critics.choices=[2.5]", f"error: the search space sets {SPACE}: "
         "algo.num_critics = 2.5 has the wrong type; expected int."),
        ("sweep.space.generator.rollout.horizon.choices=[0]", f"error: the search space sets {SPACE}: "
         "rollout.horizon must be at least 1, got 0."),
        ("sweep.space.generator.mixing.real_ratio=0.5", "error: sweep.space.generator.mixing.real_ratio must be a "
         "parameter spec with a 'type' (float, int, categorical), got 0.5."),
        ("sweep.space.algo.eta.low=-1", "error: sweep.space.algo.eta: need low < high and low > 0 (log scale)"),
        ("sweep.space.algo.eta.type=normal", "error: sweep.space.algo.eta: unknown type 'normal'"),
        ("sweep=mopo", "error: that search space is written for mopo, not ravl; use sweep=ravl or algo=mopo."),
        ("sweep.sampler.name=cmaes", "error: unknown sweep.sampler.name 'cmaes'; choose one of tpe, random, grid."),
        ("sweep.storage=postgresql://nobody:secret@127.0.0.1:1/db", "error: cannot open sweep.storage "
                                                                    "postgresql://nobody:***@127.0.0.1:1/db: "),
    ]
    base = [o for o in TINY if not o.startswith("sweep.space")]
    # the first as a user runs it (what the process prints, its exit status); the rest through the tool's
    # main in this process (a new process per case cost seconds each, most of it imports)
    result = sweep_cli(tmp_path, cases[0][0], base=base)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith(cases[0][1]), result.stderr
    assert not (tmp_path / "sweep").exists()
    from test_tools_cli import run_in_process

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MBRL_OFFLINE_CACHE", str(tmp_path / "cache"))
        patch.chdir(tmp_path)
        for override, message in cases:
            status, _, err = run_in_process("sweep", [*base, f"sweep.dir={tmp_path / 'sweep'}", override], patch,
                                              capsys)
            lines = err.strip().splitlines()
            assert status == 2 and len(lines) == 1 and lines[0].startswith(message), (override, err)
            assert not (tmp_path / "sweep").exists() and not (tmp_path / "cache").exists()


def test_a_study_keeps_its_search_space(tmp_path):
    assert sweep_cli(tmp_path, "sweep.n_trials=1", "trainer.epochs=1").returncode == 0
    changed = sweep_cli(tmp_path, "sweep.n_trials=2", "trainer.epochs=1", "sweep.space.algo.eta.high=5")
    assert changed.returncode == 2 and changed.stderr.strip().startswith(
        "error: study 'ravl-pendulum' was started with another space; keep its settings to resume it")


# ------------------------------------------------------------------------------- the library
def fake_trainer(epochs, seed):
    return SimpleNamespace(config=SimpleNamespace(epochs=epochs, seed=seed), history=[])


def scripted_run(scores_by_trial, epochs=5, failing=()):
    """A `run_trial` that reports fixed scores (trial k scores scores_by_trial[k] at every evaluation)."""
    calls = []

    def run_trial(params, seed, run_dir, callbacks):
        number = len(calls)
        calls.append(params)
        if number in failing:
            raise RuntimeError("the run diverged")
        trainer = fake_trainer(epochs, seed)
        for epoch in range(1, epochs + 1):
            trainer.history.append({"epoch": epoch, "normalized_score": scores_by_trial[number]})
            for callback in callbacks:
                callback.on_eval(trainer, epoch, {"normalized_score": scores_by_trial[number], "returns": [0.0, 0.0]})
        return {"final_score": scores_by_trial[number], "last10_score": scores_by_trial[number]}

    return run_trial


def config(tmp_path, **settings):
    base = dict(n_trials=4, seeds=(0,), dir=str(tmp_path / "sweep"), study_name="test",
                sampler=SamplerConfig(name="random"), pruner=PrunerConfig(n_startup_trials=2, n_warmup_epochs=2),
                space={"algo": {"eta": {"type": "float", "low": 0.1, "high": 10.0, "log": True}}})
    return SweepConfig(**{**base, **settings})


def test_a_trial_reporting_low_scores_is_pruned(tmp_path):
    lines = []
    study = run_sweep(config(tmp_path), scripted_run([60.0, 50.0, 55.0, 5.0]), log=lines.append)
    trials = study.get_trials()
    assert "trial 3 pruned: score 5.0 at epoch 2 of seed 0 is below the pruner's threshold" in lines
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 3 + [TrialState.PRUNED]
    # no pruning before epoch 2, pruned there: 2 evaluations x 2 episodes were used, against 5 x 2
    assert trials[3].user_attrs["eval_episodes"] == 4 and trials[0].user_attrs["eval_episodes"] == 10
    assert study.best_value == 60.0


def test_a_failing_trial_is_recorded_and_the_study_goes_on(tmp_path):
    study = run_sweep(config(tmp_path, n_trials=3), scripted_run([40.0, 0.0, 45.0], failing={1}), log=lambda _: None)
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.COMPLETE]
    assert trials[1].user_attrs["error"] == "RuntimeError: the run diverged"


@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_a_resumed_study_draws_what_one_process_would(tmp_path, sampler):
    """The sampler is seeded per trial: a study run in three processes neither repeats its first draws
    after each restart nor differs from the same study run in one go."""
    settings = dict(sampler=SamplerConfig(name=sampler, n_startup_trials=3), pruner=PrunerConfig(name="none"))
    in_one_go = run_sweep(config(tmp_path / "one", n_trials=6, **settings), scripted_run([50.0] * 6),
                          log=lambda _: None)
    for n_trials in (2, 4, 6):
        resumed = run_sweep(config(tmp_path / "three", n_trials=n_trials, **settings), scripted_run([50.0] * 6),
                            log=lambda _: None)
    drawn = [t.params["algo.eta"] for t in resumed.get_trials()]
    assert len(set(drawn)) == 6
    assert drawn == [t.params["algo.eta"] for t in in_one_go.get_trials()]


@pytest.mark.parametrize("resumes", [False, True])
def test_a_grid_sweep_runs_every_point_once(tmp_path, resumes):
    """A grid of 3 x 2 in 6 trials runs each combination once, in one process or resumed after each trial."""
    space = {"algo": {"alpha": {"type": "categorical", "choices": [1.0, 2.5, 4.0]}},
             "penalty": {"type": "categorical", "choices": ["keep", "off"]}}
    settings = dict(space=space, sampler=SamplerConfig(name="grid"), pruner=PrunerConfig(name="none"))
    for n_trials in (range(1, 7) if resumes else [6]):
        study = run_sweep(config(tmp_path, n_trials=n_trials, **settings), scripted_run([50.0] * 6), log=lambda _: None)
    points = sorted((t.params["algo.alpha"], t.params["penalty"]) for t in study.get_trials())
    assert points == sorted((a, p) for a in (1.0, 2.5, 4.0) for p in ("keep", "off"))


def test_a_journal_file_study_is_readable_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_sweep(config(tmp_path, n_trials=2, storage="studies/test.journal"), scripted_run([40.0, 45.0]),
              log=lambda _: None)
    assert (tmp_path / "studies" / "test.journal").is_file()
    monkeypatch.chdir(tmp_path / "sweep")  # as report.py run from elsewhere
    study, info = load_sweep(tmp_path / "sweep")
    assert info["storage"] == str(tmp_path / "studies" / "test.journal")
    assert [t.value for t in study.get_trials()] == [40.0, 45.0]


def test_space_is_checked():
    with pytest.raises(ConfigError, match="a categorical parameter needs a non-empty list 'choices'"):
        SweepConfig(space={"algo": {"num_critics": {"type": "categorical", "choices": []}}})
    with pytest.raises(ConfigError, match="grid needs every parameter to be categorical"):
        SweepConfig(sampler=SamplerConfig(name="grid"), space={"algo": {"eta": {"type": "float", "low": 0, "high": 1}}})


# ------------------------------------------------------------------------------- many workers
def _worker(storage, sweep_dir, barrier, queue):
    barrier.wait(timeout=60)

    def run_trial(params, seed, run_dir, callbacks):
        run_dir.mkdir(parents=True)  # fails if two workers ever ran the same trial
        time.sleep(0.5)
        return {"final_score": params["algo.eta"], "last10_score": params["algo.eta"]}

    cfg = SweepConfig(n_trials=6, dir=sweep_dir, study_name="shared", storage=storage,
                      sampler=SamplerConfig(name="random", seed=0), pruner=PrunerConfig(name="none"),
                      space={"algo": {"eta": {"type": "float", "low": 0.1, "high": 10.0}}})
    study = run_sweep(cfg, run_trial, log=lambda _: None)
    queue.put(sorted(t.number for t in study.get_trials() if t.user_attrs.get("worker", "").endswith(f":{os.getpid()}")))


def run_two_workers(storage, sweep_dir):
    context = multiprocessing.get_context("spawn")
    barrier, queue = context.Barrier(2), context.Queue()
    workers = [context.Process(target=_worker, args=(storage, sweep_dir, barrier, queue)) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
        assert worker.exitcode == 0
    return [queue.get(timeout=5) for _ in workers]


def assert_distinct_trials(ran, study):
    first, second = ran
    assert first and second and not set(first) & set(second)  # both worked, never on the same trial
    assert sorted(first + second) == [t.number for t in study.get_trials()]
    assert all(t.state == TrialState.COMPLETE for t in study.get_trials()) and len(study.get_trials()) >= 6
    etas = [t.params["algo.eta"] for t in study.get_trials()]
    assert len(set(etas)) == len(etas)  # the same sampler seed in both workers, yet no repeated draws


def test_two_workers_share_a_sqlite_study(tmp_path):
    ran = run_two_workers(None, str(tmp_path / "sweep"))
    study, _ = load_sweep(tmp_path / "sweep")
    assert_distinct_trials(ran, study)


@pytest.fixture(scope="module")
def postgres_url():
    """A PostgreSQL server of our own, started for these tests on a free port and stopped after them."""
    if importlib.util.find_spec("psycopg") is None:  # SQLAlchemy's driver for postgresql:// URLs
        pytest.skip("the PostgreSQL driver is not installed (pip install 'psycopg[binary]', part of the dev extra)")
    binaries = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    initdb = shutil.which("initdb") or (binaries and os.path.join(binaries[-1], "initdb"))
    if not initdb or not os.path.exists(initdb):
        pytest.skip("PostgreSQL is not installed (no initdb on PATH or in /usr/lib/postgresql/*/bin); "
                    ".ci/run installs Debian's postgresql package")
    pg_ctl = os.path.join(os.path.dirname(os.path.realpath(initdb)), "pg_ctl")
    folder = tempfile.mkdtemp(prefix="mbrl-pg-")
    as_user = []
    if os.geteuid() == 0:  # the server refuses to run as root: run it as the package's postgres user
        if shutil.which("runuser") is None:
            pytest.skip("running as root and runuser is missing, so PostgreSQL cannot be started as another user")
        try:
            shutil.chown(folder, user="postgres")
        except LookupError:
            pytest.skip("running as root and there is no 'postgres' user to start the server as")
        as_user = ["runuser", "-u", "postgres", "--"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = os.path.join(folder, "data")
    steps = [[initdb, "-D", data, "-A", "trust", "-U", "postgres"],
             [pg_ctl, "-D", data, "-o", f"-p {port} -k {folder} -c listen_addresses=127.0.0.1", "-w", "-t", "60",
              "-l", os.path.join(folder, "server.log"), "start"]]
    for step in steps:
        result = subprocess.run(as_user + step, capture_output=True, text=True)
        if result.returncode != 0:
            log = Path(folder, "server.log")
            server_log = " " + log.read_text()[-300:] if log.exists() else ""
            shutil.rmtree(folder, ignore_errors=True)
            pytest.skip(f"the PostgreSQL server could not start ({os.path.basename(step[0])} exited with "
                        f"{result.returncode}: {(result.stderr or result.stdout).strip()[-300:]}{server_log})")
    yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    subprocess.run(as_user + [pg_ctl, "-D", data, "-m", "immediate", "stop"], capture_output=True)
    shutil.rmtree(folder, ignore_errors=True)


def test_two_workers_share_a_postgresql_study(tmp_path, postgres_url):
    ran = run_two_workers(postgres_url, str(tmp_path / "sweep"))
    study = optuna.load_study(study_name="shared", storage=postgres_url)
    assert_distinct_trials(ran, study)


def test_sweep_command_on_postgresql(tmp_path, postgres_url):
    result = sweep_cli(tmp_path, "sweep.n_trials=2", "trainer.epochs=1", f"sweep.storage={postgres_url}",
                       "sweep.study_name=cli")
    assert result.returncode == 0, result.stderr
    found, _ = states(tmp_path / "sweep")  # read through sweep.json, which names the server
    assert found == [TrialState.COMPLETE] * 2 and not (tmp_path / "sweep" / "study.db").exists()
