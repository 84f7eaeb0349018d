"""Real learning: RAVL ends at least 20 points above the bundled pendulum-medium data (normalised
score 39.0). 8-9 minutes on CI's 2 cores (the rest of the suite takes about 2).

A small but complete RAVL: the default dynamics ensemble (7 members, 4x200) trained on the data,
branched rollouts of k = 5 from dataset states with a random elite per step, 10 EDAC critics
(eta = 1), 5% real data per batch. Smaller than the paper: 2x128 agent networks, 1000 rollouts per
epoch, 60 x 250 updates instead of 3000 x 1000. Three choices were needed for every seed to pass
(measured on seeds 0-5; the README's Tests section has the figures):

* gamma = 0.95 instead of 0.99: with 0.99 the values (about -400, from -4 reward per step) were
  still far from converged after 20k updates and the score rose and fell with them;
* the default 4x200 dynamics model instead of a 4x64 one: with 4x64 some seeds learned to spin the
  pendulum, where that model's reward error was 4x its error on the data (model exploitation);
* 2x128 agent networks instead of 2x64: with 2x64, seed 4 of seeds 0-4 settled on a policy that
  swings without getting the pendulum up (returns about -870).
"""
import torch

from mbrl_offline import load_dataset
from mbrl_offline.algorithms import RAVL, RAVLConfig
from mbrl_offline.generators import RolloutConfig
from mbrl_offline.models.dynamics import DynamicsConfig
from mbrl_offline.trainer import Trainer, TrainerConfig


def test_ravl_beats_its_dataset_on_pendulum(tmp_path):
    data = load_dataset("pendulum-medium")
    data_score = data.summary()["normalized_score_mean"]
    config = RAVLConfig(hidden_size=128, hidden_layers=2, gamma=0.95, rollout=RolloutConfig(rollouts_per_epoch=1000),
                        dynamics=DynamicsConfig(min_epochs=100, max_epochs=300))
    torch.manual_seed(0)
    agent = RAVL.for_dataset(data, config, cache_dir=tmp_path / "cache", progress=False)
    trainer = Trainer(agent, data, TrainerConfig(epochs=60, updates_per_epoch=250, eval_every=4, eval_episodes=10,
                                                 run_dir=str(tmp_path / "run"), progress=False, tensorboard=False))
    trainer.train()
    scores = [h["normalized_score"] for h in trainer.history]
    final = sum(scores[-3:]) / 3  # the last three evaluations, so one lucky or unlucky one cannot decide
    assert final >= data_score + 20, f"RAVL scored {final:.1f} (evaluations {[round(s, 1) for s in scores]}); data {data_score:.1f}"
