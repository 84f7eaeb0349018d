"""Make datasets the D4RL way: train a SAC behaviour policy online, then record it at several levels.

One run of `collect` produces, for one env, any of these levels (D4RL's names and recipe):

* ``random``: a uniformly random policy.
* ``medium``: the SAC policy stopped early, at the first evaluation whose normalised score reaches
  ``medium_score`` (D4RL: "about one third of expert"), rolled out with its stochastic actions.
* ``medium-replay``: everything the agent's replay buffer held when it reached medium.
* ``expert``: the SAC policy after ``expert_steps`` environment steps, rolled out likewise.
* ``medium-expert``: the medium and expert datasets concatenated.

Each level is written as a Minari dataset ``{namespace}/{env}/{level}-{version}`` with the env's
reference scores and the provenance (policy return and normalised score, training steps, seed,
config) in its metadata, and optionally exported to a D4RL-format HDF5 file beside the run. A level
is written as soon as its policy exists, so medium data is available long before the expert is.

The run is resumable: every ``checkpoint_every`` steps (at an episode end) the agent, optimisers,
replay buffer, random-number states and progress are saved atomically in ``run_dir`` (tensors and
plain data, read back with ``weights_only=True``: `mbrl_offline.torch_files`); calling
`collect` again with the same config continues from there and gives the same datasets as an
uninterrupted run. Episode ``i`` of training is reset with seed ``seed * 1_000_003 + i``.
"""
from __future__ import annotations

import copy
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch

from mbrl_offline.algorithms.sac import SAC, SACConfig
from mbrl_offline.buffer import TransitionBuffer
from mbrl_offline.config import (check_field_types,
                                 check_device, check_writable_dir, require_in_range, require_nonnegative,
                                 require_positive)
from mbrl_offline.data.dataset import OfflineDataset
from mbrl_offline.data.envs import EnvInfo, get_env_info
from mbrl_offline.data.minari_io import minari_dataset_dir, read_minari, write_minari
from mbrl_offline.errors import ConfigError
from mbrl_offline.torch_files import load_plain, save_plain
from mbrl_offline.utils import atomic_write_bytes
from mbrl_offline.utils import progress_bar

LEVELS = ("random", "medium", "medium-replay", "expert", "medium-expert")
STATE_FILE = "collect_state.pt"


@dataclass
class CollectConfig:
    env: str = "hopper"  # short env name from the registry
    levels: tuple = LEVELS  # which datasets to write
    seed: int = 0
    dataset_size: Optional[int] = None  # transitions per rolled-out dataset; None: the env's default
    expert_steps: Optional[int] = None  # online SAC steps that make the expert; None: the env's default
    medium_score: float = 100.0 / 3  # normalised score at which the policy counts as "medium"
    max_medium_steps: Optional[int] = None  # stop with an error if medium is not reached by then; None: expert_steps
    eval_every: Optional[int] = None  # SAC steps between behaviour-policy evaluations; None: env default
    eval_episodes: int = 5  # episodes per evaluation (stochastic policy, as the data is collected)
    confirm_episodes: int = 20  # an evaluation that reaches medium_score is repeated with this many episodes,
                                # which must agree, so a lucky few episodes do not choose the medium policy
    start_steps: Optional[int] = None  # random-action steps before SAC acts and learns; None: env default
    checkpoint_every: int = 20_000  # SAC steps between resumable checkpoints
    run_dir: str = "runs/collect"  # checkpoint, logs and HDF5 exports
    namespace: str = "mbrl"  # dataset ids are {namespace}/{env}/{level}-{version}
    version: str = "v0"
    minari_root: Optional[str] = None  # None: $MINARI_DATASETS_PATH or ~/.minari/datasets
    export_hdf5: bool = True  # also write {run_dir}/{env}-{level}.hdf5 in D4RL's format
    overwrite: bool = False  # replace existing datasets with the same ids
    device: str = "cpu"
    torch_threads: Optional[int] = None  # None: PyTorch's default
    progress: bool = True  # show a progress bar
    sac: SACConfig = field(default_factory=SACConfig)

    def __post_init__(self):
        check_field_types(self, "collect")  # types first; nested mappings become configs
        get_env_info(self.env)  # an unknown env is refused here, with a suggestion
        unknown = [level for level in self.levels if level not in LEVELS]
        if unknown:
            raise ConfigError(f"unknown dataset level(s) {unknown} in collect.levels; choose from {list(LEVELS)}.")
        require_nonnegative(self, "seed", "start_steps", section="collect")
        require_positive(self, "dataset_size", "expert_steps", "max_medium_steps", "eval_every", "eval_episodes",
                         "confirm_episodes", "checkpoint_every", section="collect")
        require_in_range(self, "medium_score", section="collect")  # any finite normalised score
        require_nonnegative(self, "torch_threads", section="collect", hint=" (0 or null: torch's default)")
        check_device(self.device, "collect.device")
        for name in ("namespace", "version", "run_dir"):  # parts of the datasets' ids and the run's folder
            if not isinstance(getattr(self, name), str) or not getattr(self, name).strip():
                raise ConfigError(f"collect.{name} = {getattr(self, name)!r} must be a non-empty name.")

    def resolved(self) -> "CollectConfig":
        """A copy with every env-dependent default filled in."""
        info = get_env_info(self.env)
        cfg = copy.deepcopy(self)
        cfg.env = info.name
        unknown = [level for level in cfg.levels if level not in LEVELS]
        if unknown:
            raise ConfigError(f"unknown dataset level(s) {unknown}; choose from {list(LEVELS)}.")
        cfg.levels = tuple(cfg.levels)
        cfg.dataset_size = cfg.dataset_size or info.dataset_size
        cfg.expert_steps = cfg.expert_steps or info.expert_steps
        cfg.max_medium_steps = cfg.max_medium_steps or cfg.expert_steps
        cfg.eval_every = cfg.eval_every or info.eval_every
        cfg.start_steps = info.start_steps if cfg.start_steps is None else cfg.start_steps
        for name in ("dataset_size", "expert_steps", "eval_every", "eval_episodes", "checkpoint_every"):
            if getattr(cfg, name) <= 0:
                raise ConfigError(f"collect.{name} must be positive, got {getattr(cfg, name)}.")
        return cfg


def dataset_id(cfg: CollectConfig, level: str) -> str:
    return f"{cfg.namespace}/{cfg.env}/{level}-{cfg.version}"


def collect(config: CollectConfig) -> dict[str, Path]:
    """Run (or resume) a collection; returns ``{level: dataset folder}`` for the levels written. The run
    folder and the Minari root are checked for writing before anything is trained."""
    config = config.resolved()
    check_writable_dir(config.run_dir, "collect.run_dir")
    check_writable_dir(minari_dataset_dir("", config.minari_root), "collect.minari_root")
    return _Collector(config).run()


class _Collector:
    def __init__(self, cfg: CollectConfig):
        self.cfg = cfg
        self.info: EnvInfo = get_env_info(cfg.env)
        self.run_dir = Path(cfg.run_dir)
        self.state_path = self.run_dir / STATE_FILE
        if cfg.torch_threads:
            torch.set_num_threads(cfg.torch_threads)
        env = self.info.make()
        self.action_low, self.action_high = env.action_space.low, env.action_space.high
        self.needs_medium = any(level in cfg.levels for level in ("medium", "medium-replay", "medium-expert"))
        self.needs_expert = any(level in cfg.levels for level in ("expert", "medium-expert"))
        self.needs_training = self.needs_medium or self.needs_expert
        capacity = (cfg.expert_steps if self.needs_expert else cfg.max_medium_steps) + 2 * env.spec.max_episode_steps
        torch.manual_seed(cfg.seed)  # before the networks are built: their initial weights follow the seed
        self.agent = SAC(self.info.obs_dim, self.info.act_dim, self.action_low, self.action_high, cfg.sac, cfg.device)
        self.buffer = TransitionBuffer(capacity, self.info.obs_dim, self.info.act_dim, cfg.device)
        self.rng = np.random.default_rng(cfg.seed)
        self.sample_generator = torch.Generator(device=cfg.device).manual_seed(cfg.seed)
        self.step = 0  # environment steps of online training
        self.episode = 0  # training episodes finished
        self.next_eval = cfg.eval_every
        self.evaluations: list[dict] = []
        self.snapshots: dict[str, dict] = {}  # "medium"/"expert" -> actor weights and evaluation
        self.written: dict[str, str] = {}  # level -> dataset folder

    def _write_evaluations(self) -> None:
        """``evaluations.jsonl``, one line per evaluation so far, written whole (`atomic_write_bytes`)."""
        atomic_write_bytes(self.run_dir / "evaluations.jsonl",
                           "".join(json.dumps(evaluation) + "\n" for evaluation in self.evaluations))

    # ----------------------------------------------------------------------------- top level
    def run(self) -> dict[str, Path]:
        cfg = self.cfg
        if self.state_path.exists():
            self._load()
        else:
            self._refuse_to_overwrite()
            atomic_write_bytes(self.run_dir / "config.json", json.dumps(asdict(cfg), indent=2, default=str))
        if "random" in cfg.levels and "random" not in self.written:
            self._write("random", self._rollout(None, "random"))
        if self.needs_training:
            self._train()
        if "expert" in self.snapshots:
            if "expert" in cfg.levels and "expert" not in self.written:
                self._write("expert", self._rollout(self.snapshots["expert"], "expert"))
            if "medium-expert" in cfg.levels and "medium-expert" not in self.written:
                both = OfflineDataset.concatenate([self._level_data("medium"), self._level_data("expert")],
                                                  source="medium-expert",
                                                  metadata=self._provenance("medium-expert", None))
                self._write("medium-expert", both)
        return {level: Path(path) for level, path in self.written.items()}

    def _level_data(self, level: str) -> OfflineDataset:
        """A policy level's data: read back if written (rollouts are deterministic), else rolled out."""
        if level in self.written:
            return read_minari(self.written[level])
        return self._rollout(self.snapshots[level], level)

    def _refuse_to_overwrite(self) -> None:
        if self.cfg.overwrite:
            return
        existing = [dataset_id(self.cfg, level) for level in self.cfg.levels
                    if minari_dataset_dir(dataset_id(self.cfg, level), self.cfg.minari_root).exists()]
        if existing:
            raise ConfigError(f"dataset(s) {', '.join(existing)} already exist under "
                              f"{minari_dataset_dir('', self.cfg.minari_root)}; choose another namespace or "
                              "version, delete them, or pass overwrite=true.")

    # ------------------------------------------------------------------------------ training
    def _training_done(self) -> bool:
        medium_done = "medium" in self.snapshots or not self.needs_medium
        if not self.needs_expert:
            return medium_done
        return medium_done and self.step >= self.cfg.expert_steps

    def _train(self) -> None:
        cfg = self.cfg
        if self._training_done():
            self._finish_training()
            return
        env = self.info.make()
        obs, _ = env.reset(seed=self._episode_seed(self.episode))
        episode_return, last_return = 0.0, float("nan")
        total = cfg.expert_steps if self.needs_expert else cfg.max_medium_steps
        next_checkpoint = self.step + cfg.checkpoint_every
        start_time, start_step = time.time(), self.step
        bar = progress_bar(total=total, initial=self.step, desc=f"SAC {cfg.env}", disable=not cfg.progress)
        while True:
            if self.step < cfg.start_steps:
                action = self.rng.uniform(self.action_low, self.action_high).astype(np.float32)
            else:
                action = self.agent.act(obs.astype(np.float32))
            next_obs, reward, terminated, truncated, _ = env.step(action)
            self.buffer.add(single=True, observations=obs, actions=action, rewards=reward,
                            next_observations=next_obs, terminals=terminated, timeouts=truncated)
            self.step += 1
            episode_return += reward
            bar.update(1)
            if self.step >= cfg.start_steps:
                self.agent.update(self.buffer.sample(cfg.sac.batch_size, self.sample_generator))
            if not (terminated or truncated):
                obs = next_obs
                continue
            # Episode end: the only place where evaluations, snapshots and checkpoints happen, so
            # medium-replay holds whole episodes and a resumed run starts with a fresh episode.
            self.episode += 1
            last_return, episode_return = episode_return, 0.0
            if self.step >= self.next_eval:
                self._evaluate_and_snapshot()
                self.next_eval += cfg.eval_every
            last_eval = self.evaluations[-1] if self.evaluations else {}
            bar.set_postfix(ret=f"{last_return:.0f}", eval=f"{last_eval.get('return', float('nan')):.0f}",
                            score=f"{last_eval.get('normalized', float('nan')):.1f}",
                            medium=self.snapshots.get("medium", {}).get("step", "-"),
                            sps=f"{(self.step - start_step) / max(time.time() - start_time, 1e-9):.0f}")
            if self._training_done():
                break
            if self.needs_medium and "medium" not in self.snapshots and self.step >= cfg.max_medium_steps:
                best = max((e["normalized"] for e in self.evaluations), default=float("nan"))
                self._save()
                raise ConfigError(f"the SAC policy did not reach the medium score {cfg.medium_score:.1f} within "
                                  f"{cfg.max_medium_steps} steps (best evaluation {best:.1f}); raise "
                                  "max_medium_steps (the run resumes from its checkpoint) or lower medium_score.")
            if self.step >= next_checkpoint:
                self._save()
                next_checkpoint = self.step + cfg.checkpoint_every
            obs, _ = env.reset(seed=self._episode_seed(self.episode))
        bar.close()
        self._finish_training()

    def _finish_training(self) -> None:
        if self.needs_expert and "expert" not in self.snapshots:
            self.snapshots["expert"] = self._snapshot(self._evaluate(
                self.agent.actor, max(self.cfg.eval_episodes, self.cfg.confirm_episodes), seed_offset=0))
        self._save()

    def _snapshot(self, evaluation: dict) -> dict:
        """The current actor with the evaluation that describes it."""
        return {"actor": copy.deepcopy(self.agent.actor.state_dict()), "step": self.step,
                "return": evaluation["return"], "normalized": evaluation["normalized"],
                "eval_episodes": evaluation["episodes"]}

    def _evaluate_and_snapshot(self) -> None:
        evaluation = self._evaluate(self.agent.actor, self.cfg.eval_episodes, seed_offset=0)
        candidate = (self.needs_medium and "medium" not in self.snapshots
                     and evaluation["normalized"] >= self.cfg.medium_score)
        if candidate and self.cfg.confirm_episodes > 0:
            evaluation["confirmation"] = self._evaluate(self.agent.actor, self.cfg.confirm_episodes, seed_offset=500)
            candidate = evaluation["confirmation"]["normalized"] >= self.cfg.medium_score
        self.evaluations.append({"step": self.step, **evaluation})
        self._write_evaluations()
        if candidate:
            # The confirming evaluation, the more precise one, describes the policy.
            self.snapshots["medium"] = self._snapshot(evaluation.get("confirmation", evaluation))
            self._save()  # the snapshot must survive an interruption during the writes below
            if "medium-replay" in self.cfg.levels and "medium-replay" not in self.written:
                rows = self.buffer.ordered()
                replay = OfflineDataset(**rows, env_name=self.info.name, env_id=self.info.gym_id,
                                        ref_min_score=self.info.ref_min_score,
                                        ref_max_score=self.info.ref_max_score, source="medium-replay",
                                        metadata=self._provenance("medium-replay", self.snapshots["medium"]))
                self._write("medium-replay", replay)
            if "medium" in self.cfg.levels and "medium" not in self.written:
                self._write("medium", self._rollout(self.snapshots["medium"], "medium"))

    def _evaluate(self, actor, episodes: int, seed_offset: int) -> dict:
        """Mean return of the stochastic policy over ``episodes`` episodes on their own seeds."""
        env = self.info.make()
        returns = []
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.cfg.seed + 7919 * (len(self.evaluations) + 1) + seed_offset)
            for index in range(episodes):
                obs, _ = env.reset(seed=10**8 + 1000 * len(self.evaluations) + seed_offset + index)
                done, total = False, 0.0
                while not done:
                    obs, reward, terminated, truncated, _ = env.step(self._policy_action(actor, obs))
                    total += reward
                    done = terminated or truncated
                returns.append(total)
        mean = float(np.mean(returns))
        return {"return": mean, "normalized": float(self.info.normalized_score(mean)), "episodes": episodes}

    @torch.no_grad()
    def _policy_action(self, actor, obs: np.ndarray) -> np.ndarray:
        obs_t = torch.as_tensor(obs, dtype=torch.float32, device=self.cfg.device)
        return actor(obs_t, with_log_prob=False)[0].cpu().numpy()

    # ------------------------------------------------------------------------------ datasets
    def _rollout(self, snapshot: Optional[dict], level: str) -> OfflineDataset:
        """``dataset_size`` transitions of the snapshot's stochastic policy (uniform if None).

        Seeded by level only, so the same snapshot always gives the same data (medium-expert's medium
        half equals the medium dataset)."""
        cfg, info = self.cfg, self.info
        level_seed = cfg.seed * 1_000_003 + 10**7 * (LEVELS.index(level) + 1)
        rng = np.random.default_rng(level_seed)
        if snapshot is None:
            policy: Callable = lambda obs: rng.uniform(self.action_low, self.action_high).astype(np.float32)
        else:
            actor = copy.deepcopy(self.agent.actor)
            actor.load_state_dict(snapshot["actor"])
            policy = lambda obs: self._policy_action(actor, obs)
        env = info.make()
        n = cfg.dataset_size
        rows = {"observations": np.empty((n, info.obs_dim), np.float32), "actions": np.empty((n, info.act_dim), np.float32),
                "rewards": np.empty(n, np.float32), "next_observations": np.empty((n, info.obs_dim), np.float32),
                "terminals": np.zeros(n, bool), "timeouts": np.zeros(n, bool)}
        bar = progress_bar(total=n, desc=f"{level} data", disable=not cfg.progress)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(level_seed)
            episode, i = 0, 0
            while i < n:
                obs, _ = env.reset(seed=level_seed + episode)
                episode += 1
                done = False
                while not done and i < n:
                    action = policy(obs)
                    next_obs, reward, terminated, truncated, _ = env.step(action)
                    rows["observations"][i], rows["actions"][i], rows["rewards"][i] = obs, action, reward
                    rows["next_observations"][i], rows["terminals"][i], rows["timeouts"][i] = next_obs, terminated, truncated
                    obs, done, i = next_obs, terminated or truncated, i + 1
                    bar.update(1)
        bar.close()
        return OfflineDataset(**rows, env_name=info.name, env_id=info.gym_id, ref_min_score=info.ref_min_score,
                              ref_max_score=info.ref_max_score, source=level,
                              metadata=self._provenance(level, snapshot))

    def _provenance(self, level: str, snapshot: Optional[dict]) -> dict:
        from mbrl_offline import __version__

        record = {"level": level, "env": self.info.gym_id, "seed": self.cfg.seed, "mbrl_offline": __version__,
                  "medium_score_threshold": self.cfg.medium_score, "collect_config": asdict(self.cfg)}
        if level == "random":
            record["policy"] = "uniform random actions"
        elif level == "medium-expert":
            record["policy"] = "medium and expert SAC policies (concatenated datasets)"
            for name in ("medium", "expert"):
                snap = self.snapshots[name]
                record[f"{name}_policy"] = {"train_steps": snap["step"], "eval_return": snap["return"],
                                            "eval_normalized_score": snap["normalized"]}
        else:
            record["policy"] = ("SAC replay buffer up to the medium policy" if level == "medium-replay"
                                else "SAC policy, stochastic actions")
            record.update(policy_train_steps=snapshot["step"], policy_eval_return=snapshot["return"],
                          policy_eval_normalized_score=snapshot["normalized"],
                          policy_eval_episodes=snapshot["eval_episodes"])
        return record

    def _write(self, level: str, dataset: OfflineDataset) -> None:
        cfg = self.cfg
        returns = dataset.episode_returns()
        dataset.metadata.update(transitions=len(dataset), episodes=len(returns),
                                data_return_mean=float(returns.mean()),
                                data_normalized_score_mean=float(dataset.normalized_score(returns).mean()))
        ident = dataset_id(cfg, level)
        description = (f"{level} dataset for {self.info.gym_id}, made by mbrl_offline's collector "
                       f"(SAC behaviour policy, D4RL recipe). Provenance in metadata['mbrl_offline'].")
        path = write_minari(dataset, ident, cfg.minari_root, description=description, overwrite=True)
        if cfg.export_hdf5:
            from mbrl_offline.data.d4rl_hdf5 import write_d4rl_hdf5

            write_d4rl_hdf5(dataset, self.run_dir / f"{cfg.env}-{level}.hdf5", overwrite=True)
        self.written[level] = str(path)
        print(f"wrote {ident}: {len(dataset)} transitions, {len(returns)} episodes, mean return "
              f"{dataset.metadata['data_return_mean']:.1f} (normalised {dataset.metadata['data_normalized_score_mean']:.1f})"
              f" -> {path}", flush=True)
        self._save()

    # ---------------------------------------------------------------------------- checkpoints
    def _episode_seed(self, episode: int) -> int:
        return self.cfg.seed * 1_000_003 + episode

    def _save(self) -> None:
        state = {
            "config": asdict(self.cfg), "step": self.step, "episode": self.episode, "next_eval": self.next_eval,
            "evaluations": self.evaluations, "snapshots": self.snapshots, "written": self.written,
            "agent": self.agent.state_dict(), "buffer": self.buffer.state_dict(),
            "numpy_rng": self.rng.bit_generator.state, "torch_rng": torch.get_rng_state(),
            "sample_generator": self.sample_generator.get_state(),
        }
        save_plain(state, self.state_path)

    def _load(self) -> None:
        state = load_plain(self.state_path, self.cfg.device,
                           "If an older version of mbrl_offline wrote it, it cannot be resumed: delete it or "
                           "choose another run_dir; otherwise load only files from a source you trust.")
        saved, current = dict(state["config"]), asdict(self.cfg)
        # Settings a resumed run may change: run-time ones, budgets, and the medium selection rule until
        # the medium policy has been chosen (afterwards it would no longer describe the data).
        ignore = {"progress", "torch_threads", "overwrite", "export_hdf5", "checkpoint_every", "expert_steps",
                  "max_medium_steps", "levels"}
        if "medium" not in state["snapshots"]:
            ignore |= {"medium_score", "confirm_episodes"}
        changed = sorted(k for k in current if k not in ignore and saved.get(k) != current[k])
        if changed:
            raise ConfigError(f"{self.state_path} was made with different settings ({', '.join(changed)}); "
                              "resume with the same settings or use another run_dir.")
        self.step, self.episode, self.next_eval = state["step"], state["episode"], state["next_eval"]
        self.evaluations, self.snapshots, self.written = state["evaluations"], state["snapshots"], state["written"]
        self.agent.load_state_dict(state["agent"])
        self.buffer.load_state_dict(state["buffer"])
        self.rng.bit_generator.state = state["numpy_rng"]
        torch.set_rng_state(state["torch_rng"])
        self.sample_generator.set_state(state["sample_generator"])
        # Evaluations after the checkpoint will run again: the log restarts from the checkpoint's.
        self._write_evaluations()
        print(f"resumed {self.state_path} at step {self.step} (written: {', '.join(self.written) or 'none'})", flush=True)
