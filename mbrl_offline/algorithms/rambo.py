"""RAMBO: Robust Adversarial Model-Based Offline RL (Rigter, Lacerda & Hawes, NeurIPS 2022; official code:
github.com/marc-rigter/rambo, TF1), as OfflineRL-Kit runs it (``offlinerlkit/policy/model_based/rambo.py``,
``run_example/run_rambo.py``), with the official code's choices as settings.

SAC on real data mixed half and half with branched rollouts of a dynamics ensemble that is trained,
during the run, *against* the agent: every 1000 updates, 1000 gradient steps lower the model's
likelihood of the transitions whose advantage under the agent's current critics is high,

    L(model) = lambda mean_b(A_hat_b log p(s'_b, r_b | s_b, a_b)) + L_MLE(real batch),

while the MLE term keeps it consistent with the data. That adversarial training is a part of the rollout
generator (`mbrl_offline.generators.rollouts.AdversarialConfig`, ``generator.adversarial``, with the
maths in that module's docstring), so any agent with critics can take it
(``algo=iql generator=rambo``); this module is the agent and the generator it was published with.

The agent is OfflineRL-Kit's SAC (`OfflineRLKitSACConfig`: 2 critics of 2 x 256, actor lr 1e-4, critic lr
3e-4, alpha tuned from 1 at lr 1e-4 towards -|A| and capped at 1, gamma 0.99, tau 5e-3), without the actor's
cosine schedule (``run_rambo.py`` sets none), on observations standardised with the dataset's mean and
std + 1e-3 (OfflineRL-Kit standardises its real buffer, ``ReplayBuffer.normalize_obs``). Here the agent
standardises inside itself (``normalize_states``, as TD3+BC, IQL and CQL do) and the generator fits its
model on, and rolls out in, the same standardised coordinates (``generator.standardise_observations``),
storing raw rows: the agent, the model, the rollouts and the termination function see what
OfflineRL-Kit's see, up to float rounding, while the buffers and ``act`` keep the env's units.

Before training, the actor is pre-trained by behaviour cloning (``bc_epochs`` = 50 epochs of batches of
256 at lr 1e-4): OfflineRL-Kit's loss, the mean squared error between a reparameterised *sample* of the
actor and the data's action (``bc_loss="mse_sample"``), over contiguous batches in the dataset's order
(OfflineRL-Kit shuffles an index array it never uses: every epoch sees the same batches), or the official
code's negative log-likelihood of the data's actions, skipping every batch that holds an action with
|a| >= 1 (``bc_loss="nll"``). It runs in ``for_dataset`` (after the generator's model is fitted: the
other order from OfflineRL-Kit's, which changes nothing but the random draws).

Published generator (`RAMBO.published_generator`), OfflineRL-Kit's settings:

* rollouts every 250 updates (``generator.every``; the official ``model_train_freq``: 1000) from 50k
  start states, h = 5, kept for 20 generations (OfflineRL-Kit's buffer of (1000 / 250) x 5 epochs x
  50k x h; with ``every=1000`` set ``rollout.retain_epochs=5``), half the rows of a batch real;
* the dynamics recipe of OfflineRL-Kit (``dynamics_recipe("offlinerlkit")``) with ``run_rambo.py``'s fit:
  holdout 10% (at most 1000 rows), log-variance bound coefficient 1e-3, 10 epochs of patience, Adam at 3e-4;
* adversarial training every 1000 updates, 1000 steps, lambda = 3e-4, batch 256, its own Adam at 3e-4,
  adversarial rollouts of the rollouts' h; lambda = 0 still runs the MLE steps (``when_zero``:
  "mle_finetune", OfflineRL-Kit; "skip" is the official code's), one real batch shared by the members
  (``mle_batch``: "shared"; the official: "per_member"), A_hat's eps 1e-6 (the official: 0).

Per dataset, (h, lambda) are configs: ``mbrl_offline/configs/preset/rambo-<env>-<dataset>.yaml`` hold
OfflineRL-Kit's table (the docstring of its ``run_rambo.py``), each naming the official value where it
differs (the official ``examples/config/rambo/mujoco/*.py``: hopper-medium-replay h = 2,
halfcheetah- and hopper-medium-expert lambda = 3e-4; it also has the random datasets, which
OfflineRL-Kit does not).

Differences from OfflineRL-Kit (``rambo.py``, ``sac.py``, ``mb_policy_trainer.py``), with their reasons:

* none in the SAC update: ``update_order="offlinerlkit_sac"`` is OfflineRL-Kit's ``SACPolicy.learn``
  (the critics towards the target of the actor and alpha before the update, then the actor against the
  stepped critics, then alpha, the draws in Kit's order). ``benchmarks/vs_offlinerlkit.py --sac-update``
  runs it beside Kit's from the same weights and batches: the weights agree to 3e-7 after 3 updates
  (docs/parity.md), and over 3 seeds of 2000 updates on hopper-medium the learning curves of both codes
  agree within the seeds' spread (at this order and at ``"official"``, the earlier default, whose actor
  read the critics before their step);
* the optimisers' steps run as torch's fused Adam kernel (``fused_adam``; OfflineRL-Kit: torch's default
  Adam): the same update rounded differently, one pass per parameter, which makes the update faster
  (docs/performance.md); ``fused_adam=False`` gives Kit's numbers bit for bit (torch's multi-tensor step,
  `mbrl_offline.utils.adam_kernel`), and the step-by-step comparison runs it;
* the critics are one batched ensemble; the rollouts' start states are drawn without replacement
  (OfflineRL-Kit's ``ReplayBuffer.sample``: with replacement), and the rollouts' noise and elite draws
  come from torch, not numpy (`mbrl_offline.generators.rollouts`);
* the adversarial step's differences are listed in `mbrl_offline.generators.rollouts`'s docstring
  (log p by logsumexp; lambda = 0 skips the rollout part of the step it multiplies by 0);
* OfflineRL-Kit's model input scaler takes the population std, ours the unbiased one, and it trains on
  an epoch's last partial batch (`mbrl_offline.models.dynamics`).

``benchmarks/vs_offlinerlkit.py --rambo-update`` runs five chained adversarial steps of OfflineRL-Kit's
``RAMBOPolicy.dynamics_step_and_forward`` beside `mbrl_offline.generators.rollouts.adversarial_step` from
the same weights, inputs and draws (docs/parity.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from mbrl_offline.algorithms.model_based import OfflineRLKitSACConfig
from mbrl_offline.algorithms.model_free import ObservationNormaliser
from mbrl_offline.algorithms.sac import SAC, load_soft_actor_critic_state, soft_actor_critic_state
from mbrl_offline.buffer import MixingConfig
from mbrl_offline.config import config_argument, require_above_zero, require_nonnegative, require_positive
from mbrl_offline.errors import ConfigError
from mbrl_offline.generators.rollouts import AdversarialConfig, RolloutConfig, RolloutGeneratorConfig
from mbrl_offline.models.dynamics import dynamics_recipe
from mbrl_offline.policies import agent_for_dataset
from mbrl_offline.registry import register_agent
from mbrl_offline.utils import adam_kernel

BC_LOSSES = ("mse_sample", "nll")


@dataclass
class RAMBOConfig(OfflineRLKitSACConfig):
    # The learner: OfflineRL-Kit's SAC (2 critics of 256x2, actor lr 1e-4, critic lr 3e-4, alpha from 1
    # at lr 1e-4 towards -|A|, gamma 0.99, tau 5e-3; OfflineRLKitSACConfig), with alpha capped at 1 and
    # OfflineRL-Kit's SACPolicy.learn's order (the critics first, towards the target of the actor and
    # alpha before the update; then the actor against the stepped critics), and no learning-rate
    # schedule (run_rambo.py sets none).
    actor_lr_cosine: bool = False
    update_order: str = "offlinerlkit_sac"
    # Adam's fused kernel for the actor, critics and alpha: the same update as torch's per-tensor loop
    # (OfflineRL-Kit's), rounded differently; False (the loop's numbers exactly) for the step-by-step comparison
    # with Kit's code.
    fused_adam: bool = True
    alpha_max: Optional[float] = 1.0
    # Observations standardised inside the agent with the dataset's mean and std + state_std_eps
    # (OfflineRL-Kit's normalize_obs: 1e-3); the generator's standardise_observations matches it.
    normalize_states: bool = True
    state_std_eps: float = 1e-3
    # Behaviour-cloning pre-training of the actor before any update (for_dataset): epochs (0: none),
    # Adam's rate, rows per batch, and the loss: "mse_sample" (OfflineRL-Kit: squared error of a
    # reparameterised sample) or "nll" (the official: -log pi(a|s), batches with |a| >= 1 skipped).
    bc_epochs: int = 50
    bc_lr: float = 1e-4
    bc_batch_size: int = 256
    bc_loss: str = "mse_sample"
    bc_shuffle: bool = False  # shuffle the batches each epoch (OfflineRL-Kit: no, contiguous in dataset order)

    def __post_init__(self):
        super().__post_init__()
        require_nonnegative(self, "bc_epochs", "state_std_eps")
        require_positive(self, "bc_batch_size")
        require_above_zero(self, "bc_lr")
        if self.bc_loss not in BC_LOSSES:
            raise ConfigError(f"unknown algo.bc_loss '{self.bc_loss}'; choose one of {', '.join(BC_LOSSES)}.")


@register_agent
class RAMBO(SAC):
    """A RAMBO agent: OfflineRL-Kit's SAC on standardised observations, its actor pre-trained by
    behaviour cloning (`for_dataset`); the adversarial model training is its generator's
    (`published_generator`, `mbrl_offline.generators.rollouts.AdversarialConfig`)."""

    name = "rambo"
    # what it is, for the docs' tables
    summary = "SAC on rollouts of a model trained adversarially against the agent's critics"
    defaults_from = "OfflineRL-Kit's `run_rambo.py`"  # the code its defaults come from
    config_class = RAMBOConfig

    def __init__(self, obs_dim: int, act_dim: int, action_low, action_high,
                 config: Optional[RAMBOConfig] = None, device: str | torch.device = "cpu"):
        config = config_argument(config, type(self).config_class, f"{type(self).__name__}'s config")
        super().__init__(obs_dim, act_dim, action_low, action_high, config, device)
        self.normalise = ObservationNormaliser(obs_dim, self.device)  # the identity until for_dataset

    @classmethod
    def published_generator(cls) -> RolloutGeneratorConfig:
        """OfflineRL-Kit's (module docstring): rollouts of h = 5 from 50k states every 250 updates, 20
        generations kept, half the batch real, a model fitted with run_rambo.py's recipe in standardised
        coordinates and trained adversarially (lambda = 3e-4, 1000 steps every 1000 updates)."""
        return RolloutGeneratorConfig(
            every=250, rollout=RolloutConfig(horizon=5, rollouts_per_epoch=50_000, retain_epochs=20),
            dynamics=dynamics_recipe("offlinerlkit", holdout_ratio=0.1, logvar_bound_coef=0.001, patience=10,
                                     learning_rate=3e-4),
            mixing=MixingConfig(rule="fraction", real_ratio=0.5), standardise_observations=True,
            observation_std_eps=1e-3, adversarial=AdversarialConfig(every=1000, steps=1000, coef=3e-4))

    @classmethod
    def for_dataset(cls, dataset, config: Optional[RAMBOConfig] = None, device: str | torch.device = "cpu",
                    **parts) -> "RAMBO":
        """The agent for ``dataset``'s env: the state statistics from the data (``normalize_states``) and
        the actor pre-trained by behaviour cloning on it (`pretrain`)."""
        agent = agent_for_dataset(cls, dataset, config, device, parts)
        if agent.config.normalize_states:
            agent.normalise.fit(dataset.observations, agent.config.state_std_eps)
        agent.pretrain(dataset.observations, dataset.actions)
        return agent

    def pretrain(self, observations: np.ndarray, actions: np.ndarray) -> list[float]:
        """Behaviour cloning of the actor (``bc_*`` settings; module docstring) on the data's raw
        observations and actions; returns each epoch's mean loss over the batches it stepped on."""
        cfg = self.config
        if cfg.bc_epochs == 0:
            return []
        obs = self.normalise(torch.as_tensor(observations, dtype=torch.float32, device=self.device))
        act = torch.as_tensor(actions, dtype=torch.float32, device=self.device)
        optimizer = torch.optim.Adam(self.actor.parameters(), lr=cfg.bc_lr, **adam_kernel())
        batches = len(obs) // cfg.bc_batch_size
        scale = self.actor.action_scale
        losses = []
        for _ in range(cfg.bc_epochs):
            order = torch.randperm(len(obs), device=self.device) if cfg.bc_shuffle else None
            total, stepped = 0.0, 0
            for i in range(batches):
                rows = slice(i * cfg.bc_batch_size, (i + 1) * cfg.bc_batch_size)
                index = order[rows] if order is not None else rows
                batch_obs, batch_act = obs[index], act[index]
                if cfg.bc_loss == "mse_sample":
                    loss = (self.actor(batch_obs, with_log_prob=False)[0] - batch_act).pow(2).mean()
                else:  # the official: skip a batch holding an action at or beyond the bounds
                    if bool(((batch_act - self.actor.action_offset).abs() >= scale).any()):
                        continue
                    loss = -self.actor.log_prob_of(batch_obs, batch_act).mean()
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                total, stepped = total + loss.item(), stepped + 1
            losses.append(total / max(stepped, 1))
        return losses

    # ------------------------------------------------------------------ acting, on raw observations
    @torch.no_grad()
    def act(self, obs: np.ndarray, deterministic: bool = False) -> np.ndarray:
        """Action(s) for raw observation(s), as numpy (standardised here)."""
        obs_t = self.act_input(obs)  # checked: shape (obs_dim,) or (B, obs_dim), finite
        action, _ = self.actor(self.normalise(obs_t), deterministic=deterministic, with_log_prob=False)
        return action.cpu().numpy()

    @torch.no_grad()
    def sample(self, observations: torch.Tensor, state=None, starts=None) -> tuple[torch.Tensor, None]:
        return super().sample(self.normalise(observations))

    def log_prob(self, observations: torch.Tensor, actions: torch.Tensor, state=None, starts=None) -> torch.Tensor:
        return super().log_prob(self.normalise(observations), actions)

    @torch.no_grad()
    def mode(self, observations: torch.Tensor) -> torch.Tensor:
        return super().mode(self.normalise(observations))

    # ------------------------------------------------------------------ learning
    def update(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """SAC's update on the batch with its observations standardised."""
        batch = dict(batch, observations=self.normalise(batch["observations"]),
                     next_observations=self.normalise(batch["next_observations"]))
        return super().update(batch)

    def state_dict(self) -> dict:
        return {**soft_actor_critic_state(self), "normalise": self.normalise.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        load_soft_actor_critic_state(self, state)
        self.normalise.load_state_dict(state["normalise"])
        self._graphed_update.reset()


__all__ = ["RAMBO", "RAMBOConfig"]
