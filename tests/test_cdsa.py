"""CDSA's test-time action adjustment (`mbrl_offline.adjust`): the ascent on the score model, each way of
combining the correction written out, that a fitted score model pulls actions toward the data's, the
wrapper around any agent's episode policy, the evaluate tool's and the trainer's ``adjust=cdsa``, and
bad settings or a checkpoint whose data is gone refused in one line."""
import numpy as np
import pytest
import torch

from mbrl_offline.adjust import AdjustedEpisodePolicy, CDSA, CDSAConfig, InverseDynamics
from mbrl_offline.data.dataset import OfflineDataset
from mbrl_offline.errors import ConfigError, InputError, NotFittedError
from mbrl_offline.models.diffusion import DiffusionModel, DiffusionTrainConfig
from test_tools_cli import run_in_process, run_script
from test_train_cli import RUN_TINY


def shrinking_score(dim: int, mean=0.0, std=1.0) -> DiffusionModel:
    """A 'score model' whose denoiser returns 0 in normalised units (D(x; sigma) = 0: the data's mean)."""
    model = DiffusionModel((dim,), denoiser_kwargs={"width": 8, "blocks": 1}).mark_fitted()
    model.normalizer.mean.fill_(mean)
    model.normalizer.std.fill_(std)
    model.diffusion.denoise = lambda x, sigma: torch.zeros_like(x)
    return model


class ShiftDynamics:
    """predict: every elite says s' = s + 1 (reward 0)."""

    def predict(self, obs, act, elites_only=False):
        mean = torch.cat([torch.ones_like(obs), torch.zeros(len(obs), 1)], -1)
        return torch.stack([mean, mean]), torch.zeros(2, *mean.shape)


class LinearInverse:
    """I(s, s') = sum(s') / 10, one action."""

    def __call__(self, obs, next_obs):
        return next_obs.sum(-1, keepdim=True) / 10


def test_the_ascent_moves_by_step_size_towards_the_denoised_point_at_each_step():
    cdsa = CDSA(CDSAConfig(score_on="state_actions", steps=3, step_size=0.5), shrinking_score(3, mean=1.0, std=2.0),
                low=[-10.0], high=[10.0])
    x = torch.tensor([[5.0, -3.0, 9.0]])
    z = (x - 1.0) / 2.0
    assert torch.allclose(cdsa.ascend(x), (z * 0.5 ** 3) * 2.0 + 1.0)
    moved = cdsa.ascend(x, slice(2, None))  # only the action column moves
    assert torch.allclose(moved[:, :2], x[:, :2]) and torch.allclose(moved[:, 2], (z[:, 2] * 0.125) * 2 + 1)


@pytest.mark.parametrize("combine, weight", [("delta", 1.0), ("delta", 0.5), ("blend", 0.3), ("replace", 1.0)])
def test_each_way_of_combining_the_correction(combine, weight):
    config = CDSAConfig(steps=1, step_size=1.0, combine=combine, weight=weight)  # one full step: s'* = the mean 0
    cdsa = CDSA(config, shrinking_score(2), low=[-1.0], high=[1.0], dynamics=ShiftDynamics(), inverse=LinearInverse())
    obs, act = np.array([[1.0, 2.0], [0.0, -1.0]], np.float32), np.array([[0.5], [-0.2]], np.float32)
    predicted = obs + 1  # ShiftDynamics
    inverse_moved = np.zeros((2, 1))  # s'* = 0, I = 0
    expected = {"delta": act + weight * (inverse_moved - predicted.sum(-1, keepdims=True) / 10),
                "blend": (1 - weight) * act + weight * inverse_moved, "replace": inverse_moved}[combine]
    out = cdsa.adjust(obs, act)
    assert isinstance(out, np.ndarray) and np.allclose(out, np.clip(expected, -1, 1), atol=1e-6)
    tensor = cdsa.adjust(torch.as_tensor(obs), torch.as_tensor(act))
    assert isinstance(tensor, torch.Tensor) and np.allclose(tensor.numpy(), out)


def test_actions_are_clipped_to_the_bounds_and_bad_shapes_refused():
    cdsa = CDSA(CDSAConfig(score_on="state_actions", steps=1, step_size=1.0), shrinking_score(2, mean=5.0),
                low=[-1.0], high=[1.0])
    assert np.allclose(cdsa.adjust(np.zeros((1, 1)), np.zeros((1, 1))), [[1.0]])  # pulled to 5, clipped at 1
    with pytest.raises(InputError, match=r"observations \(B, 1\) and actions \(B, 1\)"):
        cdsa.adjust(np.zeros((2, 3)), np.zeros((2, 1)))
    with pytest.raises(ConfigError, match="needs a dynamics model and an inverse dynamics model"):
        CDSA(CDSAConfig(), shrinking_score(2), low=[-1.0], high=[1.0])
    with pytest.raises(NotFittedError):
        CDSA(CDSAConfig(score_on="state_actions"), DiffusionModel((2,), denoiser_kwargs={"width": 8, "blocks": 1}),
             low=[-1.0], high=[1.0])


def clustered(rows: int = 2000, seed: int = 0) -> OfflineDataset:
    """States around 0; actions around 0.5 (std 0.05); next states s + 0.1 a."""
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(rows, 2)).astype(np.float32)
    act = (0.5 + 0.05 * rng.normal(size=(rows, 1))).astype(np.float32)
    timeouts = np.zeros(rows, bool)
    timeouts[99::100] = True
    return OfflineDataset(obs, act, np.zeros(rows, np.float32), obs + 0.1 * act, np.zeros(rows, bool), timeouts,
                          source="clustered")


def test_a_fitted_score_model_pulls_actions_towards_the_datas(tmp_path):
    """Fitted on (s, a) with a around 0.5 (std 0.05), the score moves an action of -0.5, twenty stds
    away, more than half the way toward 0.5 (to 0.14 when written), and leaves the data's own actions
    near where they were."""
    data = clustered()
    cdsa = CDSA.for_dataset(CDSAConfig(score_on="state_actions", score_steps=1500, score_width=64, score_blocks=2,
                                       sigma=0.5, steps=10, step_size=0.5),
                            data, low=[-1.0], high=[1.0], cache_dir=tmp_path)
    obs = torch.as_tensor(data.observations[:200])
    away = cdsa.adjust(obs, torch.full((200, 1), -0.5))
    assert float(away.mean()) > 0.0, float(away.mean())
    near = cdsa.adjust(obs, torch.as_tensor(data.actions[:200]))
    assert float((near - torch.as_tensor(data.actions[:200])).abs().mean()) < 0.1
    assert len(list((tmp_path / "diffusion").glob("*.pt"))) == 1  # cached


def test_the_inverse_dynamics_model_recovers_the_datas_actions():
    data = clustered()
    inverse = InverseDynamics(2, 1, [-1.0], [1.0], hidden=64).fit(data, updates=1500)
    obs, nxt = torch.as_tensor(data.observations[:300]), torch.as_tensor(data.next_observations[:300])
    with torch.no_grad():
        error = (inverse(obs, nxt) - torch.as_tensor(data.actions[:300])).abs().mean()
    assert error < 0.05, float(error)


def test_the_wrapper_adjusts_any_episode_policys_actions():
    seen = []

    class Inner:
        def reset(self, episodes):
            seen.append(("reset", episodes))

        def __call__(self, observations, rewards, starts, rows):
            return np.full((len(observations), 1), 0.25, np.float32)

    class Halving:
        def adjust(self, observations, actions):
            return actions / 2

    policy = AdjustedEpisodePolicy(Inner(), Halving())
    policy.reset(3)
    assert seen == [("reset", 3)]
    assert np.allclose(policy(np.zeros((2, 3)), np.zeros(2), np.ones(2, bool), np.arange(2)), 0.125)


def test_evaluate_and_train_take_adjust_cdsa(tmp_path):
    run_dir = tmp_path / "run"
    small = ["score_on=state_actions", "score_steps=40", "score_width=16", "score_blocks=1"]
    trained = run_script("train", "algo=td3bc", *RUN_TINY, f"trainer.run_dir={run_dir}", "trainer.adjust=cdsa",
                         *[f"trainer.cdsa.{s}" for s in small], tmp_path=tmp_path)
    assert trained.returncode == 0, trained.stderr
    metrics = (run_dir / "metrics.jsonl").read_text()
    assert metrics.count('"eval_cdsa"') == 2 and (run_dir / "tensorboard").exists()
    evaluated = run_script("evaluate", f"checkpoint={run_dir / 'checkpoint.pt'}", "episodes=2", "adjust=cdsa",
                           *[f"cdsa.{s}" for s in small], tmp_path=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr
    lines = evaluated.stdout.strip().splitlines()
    assert lines[-2].startswith("td3bc on Pendulum-v1, epoch 2, 2 episodes: return ")
    assert lines[-1].startswith("td3bc on Pendulum-v1, epoch 2, 2 episodes, adjusted by CDSA: return ")


@pytest.mark.parametrize("argv, message", [
    (["adjust=cdsb"], "error: unknown adjust 'cdsb'; choose one of none, cdsa."),
    (["adjust=cdsa", "cdsa.sigma=0"], "error: cdsa.sigma must be above 0, got 0.0."),
    (["adjust=cdsa", "cdsa.combine=add"], "error: unknown cdsa.combine 'add'; choose one of delta, blend, replace."),
    (["adjust=cdsa", "cdsa.weight=2"], "error: cdsa.weight must be in [0, 1], got 2."),
    (["adjust=cdsa", "cdsa.sigmaa=1"], "error: unknown setting 'cdsa.sigmaa'. Did you mean 'cdsa.sigma'?"),
])
def test_bad_adjust_settings_are_one_line_before_the_checkpoint_is_read(argv, message, tmp_path, monkeypatch, capsys):
    status, out, err = run_in_process("evaluate", [f"checkpoint={tmp_path / 'none.pt'}", *argv], monkeypatch, capsys)
    assert status == 2 and len(err.strip().splitlines()) == 1 and err.startswith(message), err


def test_a_checkpoint_whose_data_is_gone_is_refused_in_one_line(tmp_path):
    from mbrl_offline.tools.evaluate import checkpoint_dataset

    with pytest.raises(ConfigError, match="records no dataset"):
        checkpoint_dataset("run/checkpoint.pt", {"env": "pendulum"})
    gone = tmp_path / "gone.hdf5"
    with pytest.raises(ConfigError, match=f"the dataset run/checkpoint.pt was trained on, {gone}, cannot be read"):
        checkpoint_dataset("run/checkpoint.pt", {"env": "pendulum", "dataset": {"source": str(gone)}})
    with pytest.raises(ConfigError, match="has changed since run/checkpoint.pt was trained on it"):
        checkpoint_dataset("run/checkpoint.pt", {"env": "pendulum", "dataset": {"source": "pendulum-medium",
                                                                                 "fingerprint": "0" * 16}})


def test_the_trainer_refuses_an_unknown_adjuster():
    from mbrl_offline.trainer import TrainerConfig

    with pytest.raises(ConfigError, match="unknown trainer.adjust 'cdsb'"):
        TrainerConfig(adjust="cdsb")
    assert TrainerConfig(adjust="cdsa", cdsa={"sigma": 0.2}).cdsa.sigma == 0.2


def test_the_benchmarks_plot_draws_each_agents_measures(tmp_path):
    """`benchmarks/cdsa.py --plot`: one panel per agent from the result rows the benchmark collects."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import cdsa as benchmark

    measures = dict.fromkeys(benchmark.MEASURES, 50.0)
    results = [(name, seed, 39.0, measures, {m: v - 20 for m, v in measures.items()})
               for name in ("td3bc", "iql") for seed in (0, 1)]
    benchmark.plot(results, ["td3bc", "iql"], str(tmp_path / "cdsa.png"), "title")
    assert (tmp_path / "cdsa.png").read_bytes()[:4] == b"\x89PNG"


def test_the_benchmark_refuses_a_plot_that_is_not_a_png_before_any_work(tmp_path):
    """`benchmarks/cdsa.py --plot x.txt` exits 2 with the reason, having trained and written nothing."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "cdsa.py"
    done = subprocess.run([sys.executable, str(script), "--plot", "x.txt"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert done.returncode == 2 and done.stderr == "cdsa.py: error: --plot x.txt must name a .png file\n", done.stderr
    assert not list(tmp_path.iterdir())
    done = subprocess.run([sys.executable, str(script), "--cdsa", "sigma=-1"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "sigma" in done.stderr, done.stderr
    assert not list(tmp_path.iterdir())
