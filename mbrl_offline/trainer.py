"""The training loop shared by every agent and generator: epochs of updates, with generation on the
generator's schedule and evaluation on the trainer's.

The trainer composes the roles of `mbrl_offline.roles`: an *agent*, the *dataset*, an optional
*generator* and the *mixing* rule (the generator's ``config.mixing``). It owns the schedule: the
generator produces synthetic data from the agent's ``policy`` before the first update and then every
``generator.config.every`` updates (0: only before the first) or, when its config sets ``utd``, after
``max(1, ceil(utd * N))`` updates following a generation of N transitions (NEUBAY's update-to-data
ratio), into a synthetic buffer of ``generator.buffer_capacity`` rows; each of the
``updates_per_epoch`` updates of an epoch draws a batch from the real and the synthetic buffer by the
mixing rule; every ``eval_every`` epochs the agent's deterministic episode policy
(``agent.episode_policy(True)``, which carries a recurrent agent's state) is run in the real env; metrics go to TensorBoard and ``metrics.jsonl``
(``run.json`` describes the run, the generator's settings next to the agent's); every
``checkpoint_every`` epochs a checkpoint is written atomically to ``<run_dir>/checkpoint.pt``.
Optionally the agent has ``on_epoch_end(epoch, total_epochs)`` for per-epoch schedules and
``set_total_updates(total)``, called once here with the run's number of updates. A generator with
``adapt_every`` > 0 (RAMBO's adversarial model training) has ``adapt`` called after every
``adapt_every``-th update, with the agent's policy and value role (`mbrl_offline.roles.ValueFunction`).
Batches carry a bool ``synthetic`` field marking generated rows.

Agents of sequences (``agent.consumes == "sequences"``, NEUBAY) learn from tapes of whole episodes:
the dataset is also kept as a `SequenceBuffer` of its episodes, a generator of sequences
(``produces == "sequences"``) fills a synthetic `SequenceBuffer`, and the mixing rule is ``tape``
(``generator=none``: tapes of the dataset, every row real, ``kappa`` 1). `mbrl_offline.build_run` builds the parts from
names and settings.

A run folder that holds an earlier run's files (`run_files`: ``run.json``, ``metrics.jsonl``,
``checkpoint.pt``, and each tracker's folder, ``tensorboard/``, ``wandb/``; a finished run whose
checkpoint was deleted to save disk still counts) is never written over: ``train()`` refuses it unless ``resume=True`` (continue it from its
checkpoint) or ``overwrite=True`` (delete those files and start afresh; ``overwrite=true`` on
``examples/train.py``). Other files in the folder are left alone.

A checkpoint holds the agent (weights, optimisers, config), the generator's settings and state, the
synthetic buffer, every random-number state and the epoch, so ``resume=True`` continues exactly as if
the run had not stopped (same device and thread count). The real buffer is rebuilt from the dataset,
whose fingerprint must match, and the rows of online interaction (``trainer.online``, `mbrl_offline.online`)
come back from the checkpoint. The update at which the generator runs next is saved too
(``next_generation``; checkpoints from before it existed derive it from ``every``). It holds tensors and plain data only and is read with ``weights_only=True``
(`mbrl_offline.checkpoint`), so loading a checkpoint someone shares runs no code.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from mbrl_offline import platform
from mbrl_offline.adjust import AdjustedEpisodePolicy, CDSA, CDSAConfig, check_adjust
from mbrl_offline.buffer import TRANSITION_FIELDS, Mixing, SequenceBuffer, TransitionBuffer, run_mixing
from mbrl_offline.pairing import check_pair  # the one judge of an agent and a generator
from mbrl_offline.checkpoint import CHECKPOINT_FORMAT, read_checkpoint  # noqa: F401  (read_checkpoint: public here too)
from mbrl_offline.checkpoint import (model_fingerprint, numpy_rng_state, python_rng_state, saved_settings,
                                     set_numpy_rng_state, set_python_rng_state)
from mbrl_offline.config import (check_field_types, config_argument, require_in_range, require_nonnegative,
                                 require_positive)
from mbrl_offline.data.dataset import OfflineDataset, dataset_env, require_dataset
from mbrl_offline.errors import CheckpointError, ConfigError, InputTypeError, TrainingDiverged, type_name
from mbrl_offline.evaluation import evaluate_policy
from mbrl_offline.logging import RUN_FILES, RunLogger
from mbrl_offline.online import (MixedRealBuffer, OnlineConfig, OnlineInteraction, add_online_episodes, check_online,
                                 online_steps)
from mbrl_offline.roles import Agent, Generator
from mbrl_offline.torch_files import save_plain
from mbrl_offline.trackers import open_trackers, send_figures, tracker_config, tracker_folders
from mbrl_offline.utils import missing_folders, atomic_write_bytes, progress_bar


def run_files() -> tuple[str, ...]:
    """What a run writes in its run_dir: `RUN_FILES` and every registered tracker's folder
    (`mbrl_offline.trackers.tracker_folders`)."""
    return RUN_FILES + tracker_folders()


def earlier_run_files(run_dir: str | Path) -> list[str]:
    """The files of an earlier run (`run_files`) that ``run_dir`` holds, in that order."""
    run_dir = Path(run_dir)
    return [name for name in run_files() if (run_dir / name).exists()]


def check_run_dir(run_dir: str | Path, resume: bool = False, overwrite: bool = False) -> None:
    """Refuse, in one line (`CheckpointError`), to start a new run in a folder that holds an earlier
    run's files unless ``resume`` or ``overwrite`` says what to do with them. ``train()`` calls it; the
    command-line tools call it before loading data, so the refusal comes before any work. ``resume`` and
    ``overwrite`` must be real booleans (`mbrl_offline.config.parse_setting`): a folder is never deleted
    for a value such as ``"no"`` that merely looks true."""
    from mbrl_offline.config import parse_setting

    resume, overwrite = parse_setting(bool, resume, "resume"), parse_setting(bool, overwrite, "overwrite")
    if resume and overwrite:
        raise ConfigError("resume=true and overwrite=true contradict each other: resume continues the run in "
                          "trainer.run_dir, overwrite deletes it; choose one.")
    found = earlier_run_files(run_dir)
    if found and not resume and not overwrite:
        raise CheckpointError(f"{run_dir} already holds a run ({', '.join(found)}); pass resume=true to continue it, "
                              f"overwrite=true to replace it, or choose another run_dir.")


@dataclass
class TrainerConfig:
    epochs: int = 3000  # RAVL: 3000 epochs x 1000 updates = 3M gradient steps
    updates_per_epoch: int = 1000
    eval_every: int = 1  # epochs between evaluations; the last epoch is always evaluated
    eval_episodes: int = 10  # deterministic-policy episodes per evaluation
    # Episodes of the last epoch's evaluation, the final score reports use; 0: eval_episodes. More
    # episodes here narrow the final score's spread without slowing the periodic evaluations.
    final_eval_episodes: int = 0
    # The risk level alpha of each evaluation's value at risk and conditional value at risk of the
    # returns (`mbrl_offline.evaluation.risk_measures`): the share of worst episodes looked at.
    risk_level: float = 0.1
    # Also evaluate with a test-time adjustment of the policy's actions: "none" or "cdsa" (CDSA,
    # `mbrl_offline.adjust`, with the settings ``cdsa``): each evaluation then also records ``eval_cdsa``,
    # the adjusted policy on the same episodes. Its models are fitted (or loaded) before the run starts.
    adjust: str = "none"
    cdsa: CDSAConfig = field(default_factory=CDSAConfig)
    checkpoint_every: int = 1  # epochs between checkpoints; the last epoch always gets one
    seed: int = 0
    run_dir: str = "runs/run"
    divergence_q: float = 1e6  # stop when |mean Q| exceeds this (or any loss is not finite)
    tensorboard: bool = True  # TensorBoard event files in <run_dir>/tensorboard
    # One more experiment tracker (`mbrl_offline.trackers`) with its settings: {"name": "none"}, or e.g.
    # logger=wandb on the command line (mbrl_offline/configs/logger/wandb.yaml: Weights & Biases, offline).
    logger: dict = field(default_factory=lambda: {"name": "none"})
    # Acting in the real env during training (offline-to-online fine-tuning; `mbrl_offline.online`):
    # trainer.online.enabled=true, or online=true with mbrl-finetune.
    online: OnlineConfig = field(default_factory=OnlineConfig)
    progress: bool = True

    def __post_init__(self):
        check_field_types(self, "trainer")  # types first; nested mappings become configs
        require_positive(self, "epochs", "updates_per_epoch", "eval_every", "eval_episodes", "checkpoint_every",
                         section="trainer")
        require_nonnegative(self, "seed", "final_eval_episodes", section="trainer")
        # inf turns the guard off; NaN or a bound <= 0 would stop every run at its first epoch
        require_in_range(self, "divergence_q", 0.0, low_open=True, finite=False, section="trainer")
        require_in_range(self, "risk_level", 0.0, 1.0, low_open=True, high_open=True, section="trainer")
        check_adjust(self.adjust, "trainer.adjust")
        tracker_config(self.logger)  # a known tracker, its settings, its package installed
        if not isinstance(self.run_dir, (str, Path)) or not str(self.run_dir).strip():
            raise ConfigError(f"trainer.run_dir = {self.run_dir!r} must name a folder, e.g. trainer.run_dir=runs/my-run.")


class Trainer:
    """Trains ``agent`` on ``dataset`` (an `OfflineDataset` with an env) and, when a ``generator`` is
    given, on its synthetic data. ``callbacks`` are objects with an optional ``on_eval(trainer, epoch,
    result)`` method, called after each evaluation (Optuna pruning raises from there)."""

    def __init__(self, agent: Agent, dataset, config: TrainerConfig = TrainerConfig(),
                 generator: Optional[Generator] = None, callbacks: Optional[list] = None):
        check_trainer_parts(agent, dataset, config, generator)
        config = config_argument(config, TrainerConfig, "Trainer's config", "trainer", "TrainerConfig(epochs=100)")
        check_pair(type(agent), generator.config if generator is not None else None, agent.config, agent,
                   type(generator) if generator is not None else None)
        self.agent, self.dataset, self.config, self.generator = agent, dataset, config, generator
        self.env = dataset_env(dataset, "Trainer")  # the env the policy is evaluated in
        self.callbacks = list(callbacks or [])
        self.device = torch.device(agent.device)
        self.run_dir = Path(config.run_dir)
        self.checkpoint_path = self.run_dir / "checkpoint.pt"
        self._model_fingerprint: Optional[str] = None  # the generator model's (`_generator_model`), once
        self.consumes = agent.consumes
        online = config.online
        check_online(online, type(agent), generator.config if generator is not None else None)
        capacity = len(dataset) + online_steps(online, config.epochs * config.updates_per_epoch)
        self.real = (TransitionBuffer(capacity, dataset.obs_dim, dataset.act_dim, self.device)
                     if not online.enabled or online.offline_ratio is None else
                     MixedRealBuffer(capacity, dataset.obs_dim, dataset.act_dim, self.device, online.offline_ratio))
        self.real.add_dataset(dataset)  # every real row, which generators start from; online rows follow
        self.real_sequences = None  # the dataset's episodes (and the online ones), for an agent of sequences
        if self.consumes == "sequences":
            self.real_sequences = SequenceBuffer(capacity, dataset.obs_dim, dataset.act_dim, self.device)
            self.real_sequences.add_dataset(dataset)
        self.online = (OnlineInteraction(online, agent, self.env, self.real, config.seed,
                                         bool(getattr(agent, "deterministic_policy", False)), self.real_sequences)
                       if online.enabled else None)
        self.synthetic = None
        if generator is not None:
            buffer_cls = SequenceBuffer if generator.produces == "sequences" else TransitionBuffer
            self.synthetic = buffer_cls(generator.buffer_capacity, dataset.obs_dim, dataset.act_dim, self.device,
                                        extra_fields=generator.extra_fields)
        self.mixing = Mixing(run_mixing(self.consumes, generator.config if generator is not None else None))
        self.rng = torch.Generator(device=self.device).manual_seed(config.seed)
        self.epoch = 0
        self.next_generation: Optional[int] = 0 if generator is not None else None  # update before which it runs
        # updates between the generator's adapt calls (a model that learns from the agent: RAMBO's); 0: never
        self.adapt_every = int(getattr(generator, "adapt_every", 0) or 0) if generator is not None else 0
        if hasattr(agent, "set_total_updates"):  # schedules over the run's updates (NEUBAY's cosine rates)
            agent.set_total_updates(config.epochs * config.updates_per_epoch)
        self.history: list[dict] = []  # evaluation results, one per evaluated epoch
        self._checkpoints_written = 0  # by train(), in this process
        self.adjuster = None  # CDSA with ``adjust="cdsa"``, built by `train` before it writes anything
        self.origin: dict = {}  # where the run came from, for run.json (`mbrl_offline.finetune`: finetuned_from)

    # ----------------------------------------------------------------------------------- loop
    def train(self, resume: bool = False, overwrite: bool = False) -> dict:
        """Run (or, with ``resume``, continue) to ``config.epochs``; returns `summary()`. A run folder
        holding an earlier run is refused unless ``resume`` or ``overwrite`` (which deletes that run's
        files first) is given (`check_run_dir`)."""
        cfg = self.config
        check_run_dir(self.run_dir, resume, overwrite)
        if cfg.adjust == "cdsa" and self.adjuster is None:  # its models are fitted before any file is written
            low, high = self.env.action_bounds()
            self.adjuster = CDSA.for_dataset(cfg.cdsa, self.dataset, low, high, self.device, progress=cfg.progress)
        if resume:
            self.load_checkpoint(self.checkpoint_path)
        elif overwrite:
            self._delete_earlier_run()
        made_folders = missing_folders(self.run_dir)
        earlier = set(earlier_run_files(self.run_dir))  # this run's own files are the others of run_files()
        checkpoints_before = self._checkpoints_written
        logger = None
        try:
            info = self._write_run_info()
            trackers = open_trackers(cfg.tensorboard, cfg.logger, self.run_dir, info,
                                     resume_step=self.epoch * cfg.updates_per_epoch if resume else None)
            logger = RunLogger(self.run_dir, resume_epoch=self.epoch if resume else None, trackers=trackers)
            summary = self._train_loop(logger)
            send_figures(trackers, self.run_dir, self.epoch * cfg.updates_per_epoch)
            logger.close()
            return summary
        except BaseException:
            if logger is not None:
                logger.close(quiet=True)
            if self._checkpoints_written == checkpoints_before:  # nothing to resume from: leave no run behind
                self._remove_own_files(earlier, made_folders)
            raise

    def _train_loop(self, logger: RunLogger) -> dict:
        cfg = self.config
        bar = progress_bar(total=cfg.epochs * cfg.updates_per_epoch, initial=self.epoch * cfg.updates_per_epoch,
                           desc=f"{self.agent.name} {self.env.name}", unit="upd", disable=not cfg.progress)
        try:
            while self.epoch < cfg.epochs:
                epoch_start = time.perf_counter()
                record = self._run_epoch(bar)
                self.epoch += 1
                if hasattr(self.agent, "on_epoch_end"):  # per-epoch schedules (learning-rate annealing)
                    self.agent.on_epoch_end(self.epoch, cfg.epochs)
                self._check_divergence(record["train"])
                last = self.epoch == cfg.epochs
                if self.epoch % cfg.eval_every == 0 or last:
                    start = time.perf_counter()
                    episodes = cfg.final_eval_episodes if last and cfg.final_eval_episodes else cfg.eval_episodes
                    result = self.evaluate(episodes)
                    record["eval"] = {k: v for k, v in result.items() if k != "returns"}
                    if self.adjuster is not None:
                        adjusted = self.evaluate(episodes, adjusted=True)
                        record["eval_cdsa"] = {k: v for k, v in adjusted.items() if k != "returns"}
                        result = {**result, "cdsa": adjusted}
                    record["speed"]["eval_seconds"] = time.perf_counter() - start
                    self.history.append({"epoch": self.epoch, **result})
                    bar.set_postfix(score=f"{result['normalized_score']:.1f}")
                # the epoch's wall time: its generations, updates and evaluation (`mbrl_offline.reproduce` sums them)
                record["speed"]["epoch_seconds"] = time.perf_counter() - epoch_start
                logger.log(self.epoch, self.epoch * cfg.updates_per_epoch, record)
                if self.epoch % cfg.checkpoint_every == 0 or last:
                    self.save_checkpoint(self.checkpoint_path)
                    self._checkpoints_written += 1
                if "eval" in record:
                    for callback in self.callbacks:
                        if hasattr(callback, "on_eval"):
                            callback.on_eval(self, self.epoch, self.history[-1])
        finally:
            bar.close()
        return self.summary()

    def _remove_own_files(self, earlier: set, made_folders: list[Path]) -> None:
        """After a run that failed before its first checkpoint: remove the run files (`run_files`) that
        this run made (not those in ``earlier``, which an earlier run wrote) and the folders it made
        (``made_folders``, innermost first) where they are empty, so that the same command can be run
        again without resume or overwrite."""
        import shutil

        for name in run_files():
            path = self.run_dir / name
            if name in earlier or not (path.exists() or path.is_symlink()):
                continue
            try:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
            except OSError:  # the error being raised says what went wrong; this cleanup is best effort
                pass
        for folder in made_folders:
            try:
                folder.rmdir()
            except OSError:
                break

    def _delete_earlier_run(self) -> None:
        """Remove the earlier run's files (`run_files`) from the run folder, and nothing else."""
        import shutil

        for name in earlier_run_files(self.run_dir):
            path = self.run_dir / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()

    def _write_run_info(self) -> dict:
        """``run.json``: what the run is (algorithm, env, dataset, seed, settings), for reports; and
        whether MKL ran its AVX-512 code on an AMD CPU (`mbrl_offline.platform`), which changes the rounding;
        and the code that ran it (`mbrl_offline.platform.code_version`: version, git commit). A resumed run
        rewrites it, so it names the code of the latest session."""
        text = json.dumps({
                "algorithm": self.agent.name, "env": self.env.name, "dataset": self.dataset.source,
                "dataset_score": float(self.dataset.summary()["normalized_score_mean"]), "seed": self.config.seed,
                "trainer": asdict(self.config), "agent": asdict(self.agent.config),
                "generator": self._generator_settings(),
                "mkl_avx512": platform.status(), "code": platform.code_version(), **self.origin}, indent=2, default=str)
        atomic_write_bytes(self.run_dir / "run.json", text)
        return json.loads(text)  # as written: what the trackers record as the run's config

    def _generator_settings(self) -> Optional[dict]:
        return asdict(self.generator.config) if self.generator is not None else None

    def _generate(self, record: dict, step: int) -> None:
        """One generation into the synthetic buffer, from the agent's current policy, before update
        ``step``; sets when the next one is due (`next_generation_after`)."""
        start = time.perf_counter()
        n = len(self.real)
        real = {key: value[:n] for key, value in self.real.data.items()}
        rows, stats = self.generator.generate(self.agent.policy, real, self.rng)
        if isinstance(self.synthetic, SequenceBuffer):
            self.synthetic.add_episodes(**rows)
        else:
            self.synthetic.add(**rows)
        self.next_generation = next_generation_after(self.generator.config, step, stats["transitions"])
        elapsed = time.perf_counter() - start
        record["rollout"] = stats  # with several generations in one epoch, the last one's
        record["speed"]["rollout_transitions_per_s"] = stats["transitions"] / elapsed
        record["speed"]["generations"] = record["speed"].get("generations", 0) + 1

    def _adapt(self, record: dict) -> None:
        """The generator's ``adapt`` (`mbrl_offline.roles.Generator`: its model learns from the agent's
        current policy and value role), after every ``adapt_every``-th update."""
        start = time.perf_counter()
        n = len(self.real)
        real = {key: value[:n] for key, value in self.real.data.items()}
        record["adapt"] = self.generator.adapt(self.agent.policy, self.agent, real, self.rng)
        record["speed"]["adapt_seconds"] = record["speed"].get("adapt_seconds", 0.0) + time.perf_counter() - start

    def _refit(self, record: dict) -> None:
        """The generator's ``refit`` on every real row so far, the offline data and the online rows
        (``trainer.online.refit_every``; `mbrl_offline.online`)."""
        start = time.perf_counter()
        self._generator_model()  # the fingerprint of the model as the run was built with it, before it changes
        n = len(self.real)
        rows = {key: self.real.data[key][:n].cpu().numpy() for key in TRANSITION_FIELDS}
        data = OfflineDataset(**rows, env_name=self.env.name, source=f"{self.dataset.source} + {self.online.env_steps} "
                              f"online steps", metadata=dict(getattr(self.dataset, "metadata", {})))
        record["refit"] = self.generator.refit(data, progress=False)
        record["speed"]["refit_seconds"] = record["speed"].get("refit_seconds", 0.0) + time.perf_counter() - start

    def _run_epoch(self, bar) -> dict:
        cfg, agent = self.config, self.agent
        record: dict[str, dict[str, float]] = {"speed": {}}
        sums: dict[str, torch.Tensor] = {}
        update_seconds = 0.0
        first = self.epoch * cfg.updates_per_epoch
        online_seconds = 0.0
        if self.online is not None:
            self.online.start_epoch(self.epoch)
        refit_every = cfg.online.refit_every if self.online is not None else None
        for step in range(first, first + cfg.updates_per_epoch):
            if self.online is not None:
                start, before = time.perf_counter(), self.online.env_steps
                for _ in range(cfg.online.steps_per_update):
                    self.online.step()
                online_seconds += time.perf_counter() - start
                if refit_every and self.online.env_steps // refit_every > before // refit_every:
                    self._refit(record)
            if self.next_generation is not None and step >= self.next_generation:
                self._generate(record, step)
            start = time.perf_counter()
            batch = self.mixing.sample(self.real if self.real_sequences is None else self.real_sequences,
                                       self.synthetic, agent.config.batch_size, self.rng)
            for key, value in agent.update(batch).items():
                sums[key] = sums[key] + value if key in sums else value
            update_seconds += time.perf_counter() - start
            platform.raise_if_interrupted()  # a Ctrl-C that Python lost in a weakref callback (`interrupts_kept`)
            if self.adapt_every and (step + 1) % self.adapt_every == 0:
                self._adapt(record)
            bar.update(1)
        record["train"] = {k: v.item() / cfg.updates_per_epoch for k, v in sums.items()}
        record["speed"]["updates_per_s"] = cfg.updates_per_epoch / update_seconds
        if self.online is not None:
            record["online"] = self.online.end_epoch()
            record["speed"]["env_steps_per_s"] = cfg.updates_per_epoch * cfg.online.steps_per_update / online_seconds
        return record

    def _check_divergence(self, metrics: dict[str, float]) -> None:
        bad = [k for k, v in metrics.items() if not math.isfinite(v)]
        watched = self.agent.divergence_metric  # the agent's declared value estimate (`roles.AgentClass`)
        if not bad and watched is not None and abs(metrics.get(watched, 0.0)) > self.config.divergence_q:
            bad = [watched]
        if bad:
            kept = (f"the last good checkpoint ({self.checkpoint_path}) is kept" if self.checkpoint_path.exists()
                    else "no checkpoint was written yet")
            raise TrainingDiverged(
                f"training diverged in epoch {self.epoch}: {bad[0]} = {metrics[bad[0]]:.4g}; {kept}. "
                f"Try lower learning rates, a smaller horizon or more real data (generator.mixing.real_ratio).")

    def evaluate(self, episodes: int, adjusted: bool = False) -> dict:
        """The deterministic episode policy in the real env; seeds depend on the run seed and the epoch only.
        With ``adjusted``, its actions adjusted by the run's adjuster (``trainer.adjust``), on the same seeds."""
        seed = int(np.random.SeedSequence([self.config.seed, self.epoch]).generate_state(1)[0] % 2**31)
        policy = self.agent.episode_policy(deterministic=True)
        if adjusted:
            if self.adjuster is None:
                raise ConfigError("evaluate(adjusted=True) needs trainer.adjust=cdsa (its models are built by train()).")
            policy = AdjustedEpisodePolicy(policy, self.adjuster)
        return evaluate_policy(policy, self.env, episodes, seed, self.config.risk_level)

    def summary(self) -> dict:
        """Final and last-ten mean normalised scores (as OfflineRL-Kit reports), never only the best."""
        scores = [h["normalized_score"] for h in self.history]
        return {"epochs": self.epoch, "evaluations": len(scores), "final_score": scores[-1] if scores else float("nan"),
                "last10_score": float(np.mean(scores[-10:])) if scores else float("nan"),
                "final_return": self.history[-1]["return_mean"] if scores else float("nan")}

    # ------------------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, path: str | Path) -> None:
        agent = self.agent
        save_plain({
            "format": CHECKPOINT_FORMAT,
            "epoch": self.epoch,
            "algorithm": agent.name,
            "env": self.env.name,
            "agent": agent.state_dict(),
            "generator_config": self._generator_settings(),
            "generator": self._generator_state(),
            "synthetic_buffer": self.synthetic.state_dict() if self.synthetic is not None else None,
            "next_generation": self.next_generation,
            "trainer_config": asdict(self.config),
            "dataset": {"source": str(self.dataset.source), "fingerprint": self.dataset.fingerprint()},
            "online": self._online_state(),
            "history": self.history,
            "rng": {"trainer": self.rng.get_state(), "torch": torch.get_rng_state(),
                    "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
                    "numpy": numpy_rng_state(), "python": python_rng_state()},
        }, path)

    def _online_state(self) -> Optional[dict]:
        """With online interaction: its counters and noise stream, and the online rows of the real buffer
        (those after the offline data)."""
        if self.online is None:
            return None
        n, size = len(self.dataset), len(self.real)
        return {"state": self.online.state_dict(), "rows": {k: v[n:size].cpu() for k, v in self.real.data.items()}}

    def _generator_state(self) -> Optional[dict]:
        """The generator's checkpoint section, by one rule for every generator (`mbrl_offline.roles.GeneratorClass`):
        its own ``state_dict()`` and its model's fingerprint, never the model's weights (they come back from
        the cache or ``dynamics_path``; a generator whose ``refit`` changed them during the run keeps the
        refitted weights in its ``state_dict()``)."""
        if self.generator is None:
            return None
        return {"state": self.generator.state_dict(), "model": self._generator_model()}

    def _generator_model(self) -> Optional[str]:
        """The fingerprint of the generator's model as the run was built with it (None without one),
        computed once: at the first checkpoint, or before the first refit of online fine-tuning (which
        changes the model) if that comes first."""
        if self._model_fingerprint is None and self.generator.model is not None:
            self._model_fingerprint = model_fingerprint(self.generator.model.state_dict())
        return self._model_fingerprint

    def load_checkpoint(self, path: str | Path) -> None:
        state = read_checkpoint(path)
        if state["algorithm"] != self.agent.name or state["env"] != self.env.name:
            raise CheckpointError(f"{path} is a {state['algorithm']} run on {state['env']}, not "
                                  f"{self.agent.name} on {self.env.name}; choose another run_dir.")
        if state["dataset"]["fingerprint"] != self.dataset.fingerprint():
            raise CheckpointError(f"{path} was trained on different data ({state['dataset']['source']}); "
                                  f"resume with the same dataset or choose another run_dir.")
        saved_config = asdict(saved_settings(type(self.agent.config), state["agent"]["config"], path, "algo"))
        config = asdict(self.agent.config)
        if saved_config != config:
            changed = sorted(k for k in saved_config if saved_config[k] != config.get(k))
            raise CheckpointError(f"{path} was trained with other algorithm settings ({', '.join(changed)}); "
                                  f"resume with the same settings or choose another run_dir.")
        saved_generator, generator = state["generator_config"], self._generator_settings()
        if saved_generator and generator and saved_generator.get("kind") == generator.get("kind"):
            saved_generator = asdict(saved_settings(type(self.generator.config), saved_generator, path, "generator"))
        if saved_generator != generator:
            changed = (sorted(k for k in saved_generator if saved_generator[k] != generator.get(k))
                       if saved_generator and generator else ["generator"])
            raise CheckpointError(f"{path} was trained with other generator settings ({', '.join(changed)}); "
                                  f"resume with the same settings or choose another run_dir.")
        self.agent.load_state_dict(state["agent"])
        if self.generator is not None:
            saved = state["generator"]
            if saved["model"] != self._generator_model():
                raise CheckpointError(f"{path} was trained with another {self.generator.config.kind} model (its weights "
                                      f"differ from the cached or given one); resume with the model it used "
                                      f"(dynamics_path=), or choose another run_dir.")
            self.generator.load_state_dict(saved["state"])
            self.synthetic.load_state_dict(state["synthetic_buffer"])
        saved_online = state.get("online")  # None: an offline run, or one from before online interaction
        if (saved_online is None) != (self.online is None):
            raise CheckpointError(f"{path} was trained {'with' if saved_online else 'without'} online interaction; "
                                  f"resume with the same trainer.online settings or choose another run_dir.")
        if self.online is not None:
            if len(saved_online["rows"]["rewards"]) > self.real.capacity - len(self.real):
                raise CheckpointError(f"{path} holds more online rows than this run's schedule makes room for; resume "
                                      f"with the same trainer.epochs, updates_per_epoch and online settings.")
            offline = len(self.real)
            self.real.add(**saved_online["rows"])
            if self.real_sequences is not None and len(self.real) > offline:  # whole episodes, as they were added
                add_online_episodes(self.real_sequences, self.real, offline, len(self.real))
            self.online.load_state_dict(saved_online["state"])
        self.epoch, self.history = state["epoch"], state["history"]
        if self.generator is not None:
            self.next_generation = (state["next_generation"] if "next_generation" in state else
                                    _next_generation_by_every(self.generator.config.every,
                                                              self.epoch * self.config.updates_per_epoch))
        rng = state["rng"]
        self.rng.set_state(rng["trainer"])
        torch.set_rng_state(rng["torch"])
        if rng["cuda"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        set_numpy_rng_state(rng["numpy"])
        set_python_rng_state(rng["python"])


def next_generation_after(generator_config, step: int, transitions: float) -> Optional[int]:
    """The update before which the generator runs next, after a generation of ``transitions`` rows
    before update ``step``: ``step + max(1, ceil(utd * transitions))`` where the config sets ``utd``
    (NEUBAY's update-to-data ratio, ``math.ceil`` as its code), else ``step + every`` where ``every`` > 0,
    else never (None)."""
    utd = generator_config.utd
    if utd is not None:
        return step + max(1, math.ceil(utd * transitions))
    every = generator_config.every
    return step + every if every > 0 else None


def _next_generation_by_every(every: int, step: int) -> Optional[int]:
    """The next generation at or after update ``step`` under the ``every`` schedule (generations at
    0, every, 2 every, ...; only at 0 when every is 0): for checkpoints written before
    ``next_generation`` was saved."""
    if every > 0:
        return -(-step // every) * every
    return 0 if step == 0 else None


def check_trainer_parts(agent, dataset, config, generator) -> None:
    """Refuse parts of the wrong type handed to `Trainer` in one line (`InputTypeError`), before any of
    them is used."""
    if not isinstance(agent, Agent):
        raise InputTypeError(f"Trainer needs an agent (mbrl_offline.roles.Agent), got {type_name(agent)}; make one "
                             f"with e.g. mbrl_offline.algorithms.RAVL.for_dataset(dataset), or use "
                             f"build_run('ravl', dataset).")
    require_dataset(dataset, "Trainer")
    config_argument(config, TrainerConfig, "Trainer's config", "trainer", "TrainerConfig(epochs=100)")  # None: default
    if generator is not None and not isinstance(generator, Generator):
        raise InputTypeError(f"Trainer's generator must be a generator (mbrl_offline.roles.Generator) or None, got "
                             f"{type_name(generator)}; build one with mbrl_offline.generators.build_generator.")
    dims = (getattr(agent, "obs_dim", dataset.obs_dim), getattr(agent, "act_dim", dataset.act_dim))
    if dims != (dataset.obs_dim, dataset.act_dim):
        raise ConfigError(f"the {agent.name} agent was built for observations of {dims[0]} and actions of {dims[1]} "
                          f"numbers, but the dataset ({dataset.source}, env {dataset.env_name}) has {dataset.obs_dim} "
                          f"and {dataset.act_dim}: the agent is for another env. Build it for this dataset, e.g. "
                          f"{type(agent).__name__}.for_dataset(dataset), or use build_run('{agent.name}', dataset).")
