"""Our MOPO, MOBILE, CQL, EDAC, COMBO and RAMBO against OfflineRL-Kit's own code, learning side by side on the same
arrays; our CQL's update against Kit's ``CQLPolicy.learn``, our COMBO's against its ``COMBOPolicy.learn``,
our EDAC's against Kit's ``EDACPolicy`` and our RAMBO's adversarial steps against its ``RAMBOPolicy``,
from the same weights, batches and draws.

    git clone https://github.com/yihaosun1124/OfflineRL-Kit /path/to/OfflineRL-Kit
    python benchmarks/vs_offlinerlkit.py --offlinerlkit /path/to/OfflineRL-Kit --algo mopo mobile cql edac combo rambo \\
        --dataset hopper-medium halfcheetah-medium --seeds 0 1 2 [--jobs 2] [--results runs/parity]
    python benchmarks/vs_offlinerlkit.py --offlinerlkit /path/to/OfflineRL-Kit --algo cql --sides ours \\
        --ours-algo lse_mode=per_repeat --label ours-per-repeat ...   # ours with Kit's log-sum-exp, beside
    python benchmarks/vs_offlinerlkit.py --results runs/parity --report docs/parity.md
    python benchmarks/vs_offlinerlkit.py --cql-update --offlinerlkit /path/to/OfflineRL-Kit [--updates 5]

``--cql-update`` (`cql_update_main`) builds Kit's ``CQLPolicy`` as ``run_cql.py`` does (3 x 256
``ActorProb``/``Critic``, w = 5, T = 1, R = 10, its learning rates), copies our CQL's initial weights
into it, and runs both on the same hopper-medium batches with the same torch seed before each update
(both draw their samples in the same order), ours in the Kit-compatible setting
(``lse_mode=per_repeat``) and, for contrast, in the default (``joint``); with and without the Lagrange
variant. It prints the losses and the largest difference in any weight after each update;
``--kit-exact-log-det`` writes Kit's tanh log-determinant without its 1e-6 (in that process only), to
attribute the actor's last difference.
    python benchmarks/vs_offlinerlkit.py --edac-update --offlinerlkit /path/to/OfflineRL-Kit \\
        [--dataset hopper-medium] [--num-critics 10] [--eta 1.0] [--updates 1]
    python benchmarks/vs_offlinerlkit.py --combo-update --offlinerlkit /path/to/OfflineRL-Kit [--updates 3]

``--edac-update`` builds Kit's EDAC as ``run_edac.py`` does (``ActorProb`` with a 3x256 ``MLP`` and
``TanhDiagGaussian``, ``EnsembleCritic`` with the script's init, Adam at Kit's rates, ``EDACPolicy``)
and ours with ``EDACConfig.offlinerlkit()``, copies Kit's weights into ours, and runs both on the same
batches of dataset rows with the same torch seed before each update (both draw their policy noise in
the same order): it prints, per update, the largest difference of each parameter group and of the
losses and alpha, beside the largest change that update made (`edac_update_differences`).

    python benchmarks/vs_offlinerlkit.py --rambo-update --offlinerlkit /path/to/OfflineRL-Kit [--coef 3e-4 1.0] [--steps 5]

``--rambo-update`` (`rambo_side_by_side`) builds Kit's ``RAMBOPolicy`` as ``run_rambo.py`` does, with our
RAMBO agent's weights and a fresh ensemble of its recipe copied in, and runs ``--steps`` chained
adversarial steps (one rollout) of Kit's ``dynamics_step_and_forward`` and of ours from the same
standardised hopper-medium states, actions, real batches and draws (Kit's ``np.random.choice`` of elites
replaced by our draw): it prints per step and side the adversarial and MLE losses, log p, the
advantage's statistics, and the largest differences of the next states, of the gradients and of the
model's parameters after the step.

``--combo-update`` (`combo_update_main`) builds Kit's ``COMBOPolicy`` as ``run_combo.py`` does (its
CQL's networks, from `kit_cql_policy`, holding our COMBO's initial weights) and runs both on the same
batches of 128 hopper-medium rows and 128 stand-ins for model rows (`combo_batches`), with the same
torch seed before each update, for ``rho_s`` mix and model and ``lse_mode`` per_repeat (Kit's) and
joint (ours): it prints a table of each side's critic loss, push-down term and mean Q on the real rows,
and the largest weight differences after each update (`combo_side_by_side`).

`parity.py` (beside this file) holds what the harnesses share: the common data split, the
measurements, our side, the processes and the report; its docstring says what is measured.

OfflineRL-Kit's side builds the objects that ``run_mopo.py`` / ``run_mobile.py`` build
(``EnsembleDynamicsModel``, ``EnsembleDynamics``, ``StandardScaler``, its termination function,
``ActorProb``/``Critic``/``TanhDiagGaussian``, ``MOPOPolicy``/``MOBILEPolicy``, its ``ReplayBuffer``s,
the cosine actor schedule), and for COMBO what ``run_combo.py`` builds (``COMBOPolicy`` on its CQL's
3 x 256 networks, `kit_combo_policy`, starting from weights drawn by torch's ``nn.Linear`` init through
our COMBO's constructor with the run's seed, as for CQL; no reward penalty; 50% real rows per batch),
with the per-dataset values of our preset
(``mbrl_offline/configs/preset/<algo>-<dataset>.yaml``, which holds OfflineRL-Kit's suggested values), seeded as
those scripts seed, then runs ``EnsembleDynamics.train`` and ``MBPolicyTrainer.train`` themselves, with one generation of
rollouts per agent epoch on both sides (Kit's ``rollout_freq`` is set to ``--updates-per-epoch``: its
1000 at the default budget).
The budget (``--dynamics-max-epochs``, ``--epochs``, ``--updates-per-epoch``, ``--rollouts``,
``--eval-episodes``) is the same for both sides. For CQL and EDAC (model-free, `run_offlinerlkit_model_free`)
it builds what ``run_cql.py`` / ``run_edac.py`` build (``CQLPolicy`` or ``EDACPolicy``, with the
dataset's w, or N and eta, from our preset) and runs ``MFPolicyTrainer.train`` on the same training
rows; Kit's CQL starts from weights drawn by torch's ``nn.Linear`` init (Kit's own) through our CQL's
constructor with the run's seed.

Adapters that a CPU and the missing ``gym``/``d4rl`` force, none of which changes what is trained:
``gym`` and the modules OfflineRL-Kit imports from it are gymnasium's; the dataset arrays are handed
to ``ReplayBuffer.load_dataset`` directly (no ``qlearning_dataset``, which needs d4rl); the logger is
a stub that keeps the numbers in memory instead of writing CSV and TensorBoard files;
``MBPolicyTrainer._evaluate`` is replaced by the evaluation our trainer runs (gymnasium's v5 env,
the same episode seeds), which also takes the measurements.
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import parity
from parity import common_data, eval_seed, model_measures, scaled, settings, standardised_rows, weight_differences


# ---------------------------------------------------------------------------------- OfflineRL-Kit
def import_offlinerlkit(checkout: Path):
    """OfflineRL-Kit's modules from a checkout, with gymnasium standing in for ``gym``."""
    try:
        import gym  # noqa: F401
    except ImportError:
        import gymnasium
        import gymnasium.envs.mujoco.mujoco_env
        sys.modules["gym"] = gymnasium
        sys.modules["gym.envs"] = gymnasium.envs
        sys.modules["gym.envs.mujoco"] = gymnasium.envs.mujoco
        sys.modules["gym.envs.mujoco.mujoco_env"] = gymnasium.envs.mujoco.mujoco_env
    sys.path.insert(0, str(checkout))
    import offlinerlkit  # noqa: F401
    return sys.modules["offlinerlkit"]


class _Logger:
    """OfflineRL-Kit's ``Logger`` interface, keeping the numbers in memory."""

    def __init__(self, folder: str):
        self.model_dir = self.checkpoint_dir = folder
        self.current: dict[str, list] = {}
        self.dumps: list[dict] = []
        self.extra: dict = {}

    def log(self, message: str) -> None:
        pass

    def logkv(self, key, value):
        self.current[key] = [float(value)]

    def logkv_mean(self, key, value):
        self.current.setdefault(key, []).append(float(value))

    def set_timestep(self, step):
        self.current["timestep"] = [float(step)]

    def dumpkvs(self, exclude=None):
        self.dumps.append({**{k: float(np.mean(v)) for k, v in self.current.items()}, **self.extra})
        self.current, self.extra = {}, {}

    def close(self):
        pass


def run_offlinerlkit_model_free(args, checkout: Path) -> dict:
    """CQL or EDAC as Kit's ``run_cql.py`` / ``run_edac.py`` train them (``MFPolicyTrainer`` on the
    dataset alone), with the per-dataset settings both sides share (`parity.settings`) and our
    evaluation and measurements after every epoch."""
    import random
    kit = import_offlinerlkit(checkout)
    from offlinerlkit.buffer import ReplayBuffer
    from offlinerlkit.policy_trainer import MFPolicyTrainer

    from mbrl_offline.algorithms.cql import CQL, CQLConfig
    from mbrl_offline.data.envs import get_env_info
    from mbrl_offline.evaluation import evaluate_policy

    data, train, _, q_rows = common_data(args.dataset)
    env = get_env_info(data.env_name)
    _, high = env.action_bounds()
    s = settings(args.algo, args.dataset)
    obs_dim, act_dim = data.obs_dim, data.act_dim
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    if args.algo == "cql":  # run_cql.py: Kit's defaults are CQLConfig's, w per the preset (5 everywhere)
        # Kit's networks, starting from weights drawn as torch's nn.Linear draws them (Kit's init), by a CQL
        # built here with the run's seed
        policy = kit_cql_policy(checkout, CQL(obs_dim, act_dim, -high, high, CQLConfig(cql_weight=s["agent"]["cql_weight"])))

        def q_of(obs, act):
            return torch.min(policy.critic1(obs, act), policy.critic2(obs, act))
    else:  # run_edac.py with the dataset's N and eta
        policy = kit_edac_policy(obs_dim, act_dim, float(high[0]), s["agent"]["num_critics"], s["agent"]["eta"])

        def q_of(obs, act):
            return policy.critics(obs, act).min(0).values
    buffer = ReplayBuffer(buffer_size=len(train), obs_shape=(obs_dim,), obs_dtype=np.float32,
                          action_dim=act_dim, action_dtype=np.float32, device="cpu")
    buffer.load_dataset({k: getattr(train, k) for k in
                         ("observations", "actions", "next_observations", "rewards", "terminals")})
    q_obs, q_act = torch.as_tensor(train.observations[q_rows]), torch.as_tensor(train.actions[q_rows])
    logger = _Logger(tempfile.mkdtemp(prefix="offlinerlkit-"))

    class Trainer(MFPolicyTrainer):
        epoch = 0

        def _evaluate(self):
            Trainer.epoch += 1
            self.policy.eval()
            result = evaluate_policy(lambda o: self.policy.select_action(o, deterministic=True), env,
                                     args.eval_episodes, eval_seed(args.seed, Trainer.epoch))
            with torch.no_grad():
                logger.extra = {"q_mean": q_of(q_obs, q_act).mean().item(),
                                "normalized_score": result["normalized_score"], "return_mean": result["return_mean"]}
            return {"eval/episode_reward": result["returns"], "eval/episode_length": [0] * len(result["returns"])}

    class _EvalEnv:  # only get_normalized_score is used once _evaluate is replaced
        def get_normalized_score(self, ret):
            return (ret - env.ref_min_score) / (env.ref_max_score - env.ref_min_score)

    trainer = Trainer(policy=policy, eval_env=_EvalEnv(), buffer=buffer, logger=logger, epoch=args.epochs,
                      step_per_epoch=args.updates_per_epoch, batch_size=256, eval_episodes=args.eval_episodes)
    start = time.perf_counter()
    trainer.train()
    curve = [{"epoch": i + 1, "normalized_score": d["normalized_score"], "return_mean": d["return_mean"],
              "rollout_reward_mean": float("nan"), "q_mean": d["q_mean"], "alpha": d.get("alpha", s["init_alpha"])}
             for i, d in enumerate(logger.dumps)]  # alpha: the mean of what learn() reported over the epoch
    return {"model": None, "curve": curve, "agent_seconds": time.perf_counter() - start,
            "code": str(checkout), "offlinerlkit_path": kit.__file__}


def run_offlinerlkit(args, checkout: Path) -> dict:
    if args.algo in ("cql", "edac"):
        return run_offlinerlkit_model_free(args, checkout)
    import random
    kit = import_offlinerlkit(checkout)
    from offlinerlkit.buffer import ReplayBuffer
    from offlinerlkit.dynamics import EnsembleDynamics
    from offlinerlkit.modules import ActorProb, Critic, EnsembleDynamicsModel, TanhDiagGaussian
    from offlinerlkit.nets import MLP
    from offlinerlkit.policy import MOBILEPolicy, MOPOPolicy, RAMBOPolicy
    from offlinerlkit.policy_trainer import MBPolicyTrainer
    from offlinerlkit.utils.scaler import StandardScaler
    from offlinerlkit.utils.termination_fns import get_termination_fn, obs_unnormalization

    from mbrl_offline.data.envs import get_env_info
    from mbrl_offline.evaluation import evaluate_policy

    data, train, holdout, q_rows = common_data(args.dataset)
    env = get_env_info(data.env_name)
    low, high = env.action_bounds()
    s = settings(args.algo, args.dataset)
    obs_dim, act_dim = data.obs_dim, data.act_dim
    arrays = {k: getattr(train, k) for k in ("observations", "actions", "next_observations", "rewards", "terminals")}

    # run_mopo.py / run_mobile.py / run_combo.py / run_rambo.py, as far as training goes
    real_buffer = ReplayBuffer(buffer_size=len(train), obs_shape=(obs_dim,), obs_dtype=np.float32,
                               action_dim=act_dim, action_dtype=np.float32, device="cpu")
    real_buffer.load_dataset(arrays)
    if s["standardise_observations"]:  # run_rambo.py: the buffer's observations standardised in place
        obs_mean, obs_std = real_buffer.normalize_obs(s["observation_std_eps"])
        holdout = standardised_rows(holdout, obs_mean, obs_std)  # the model is measured in its own coordinates
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    hidden = [256, 256]
    if args.algo == "combo":  # run_combo.py: its CQL's networks (3 x 256) and optimisers, Kit's init, as for CQL
        from mbrl_offline.algorithms.combo import COMBO, COMBOConfig
        combo = COMBO(obs_dim, act_dim, low, high, COMBOConfig(cql_weight=s["cql_weight"]))
        cql = kit_cql_policy(checkout, combo)
        actor, actor_optim = cql.actor, cql.actor_optim
    else:
        actor_backbone = MLP(input_dim=obs_dim, hidden_dims=hidden)
        dist = TanhDiagGaussian(latent_dim=actor_backbone.output_dim, output_dim=act_dim, unbounded=True,
                                conditioned_sigma=True, max_mu=float(high[0]))
        actor = ActorProb(actor_backbone, dist, "cpu")
        actor_optim = torch.optim.Adam(actor.parameters(), lr=1e-4)
    if args.algo in ("mopo", "rambo"):
        critic1 = Critic(MLP(input_dim=obs_dim + act_dim, hidden_dims=hidden), "cpu")
        critic2 = Critic(MLP(input_dim=obs_dim + act_dim, hidden_dims=hidden), "cpu")
        critic1_optim = torch.optim.Adam(critic1.parameters(), lr=3e-4)
        critic2_optim = torch.optim.Adam(critic2.parameters(), lr=3e-4)
    elif args.algo == "mobile":
        critics = torch.nn.ModuleList([Critic(MLP(input_dim=obs_dim + act_dim, hidden_dims=hidden), "cpu")
                                       for _ in range(2)])
        critics_optim = torch.optim.Adam(critics.parameters(), lr=3e-4)
    # the actor's cosine schedule (run_mopo.py, run_mobile.py, run_combo.py; run_rambo.py has none)
    lr_scheduler = None if args.algo == "rambo" else torch.optim.lr_scheduler.CosineAnnealingLR(actor_optim, args.epochs)
    if args.algo == "combo":
        alpha = (cql._target_entropy, cql._log_alpha, cql.alpha_optim)
    elif s["auto_alpha"]:
        log_alpha = torch.zeros(1, requires_grad=True)
        alpha = (-act_dim, log_alpha, torch.optim.Adam([log_alpha], lr=1e-4))
    else:
        alpha = s["init_alpha"]
    dynamics_model = EnsembleDynamicsModel(obs_dim=obs_dim, action_dim=act_dim, hidden_dims=[200] * 4,
                                           num_ensemble=7, num_elites=5,
                                           weight_decays=[2.5e-5, 5e-5, 7.5e-5, 7.5e-5, 1e-4], device="cpu")
    dynamics_optim = torch.optim.Adam(dynamics_model.parameters(), lr=s["dynamics"]["learning_rate"])
    scaler = StandardScaler()
    termination_fn = get_termination_fn(task=args.dataset)
    if args.algo == "rambo":  # its dynamics in standardised coordinates, trained adversarially by the policy
        dynamics = EnsembleDynamics(dynamics_model, dynamics_optim, scaler,
                                    obs_unnormalization(termination_fn, obs_mean, obs_std))
        policy = RAMBOPolicy(dynamics, actor, critic1, critic2, actor_optim, critic1_optim, critic2_optim,
                             torch.optim.Adam(dynamics_model.parameters(), lr=3e-4), tau=0.005, gamma=0.99,
                             alpha=alpha, adv_weight=s["adversarial"]["coef"],
                             adv_train_steps=scaled(s["adversarial"]["steps"], args),  # an epoch's updates
                             adv_rollout_length=s["horizon"], adv_rollout_batch_size=256, include_ent_in_adv=False,
                             scaler=StandardScaler(mu=obs_mean, std=obs_std), device="cpu")
    elif args.algo == "combo":  # no reward penalty (EnsembleDynamics' default penalty_coef 0)
        dynamics = EnsembleDynamics(dynamics_model, dynamics_optim, scaler, termination_fn)
        policy = kit_combo_policy(checkout, combo, dynamics, cql)
    elif args.algo == "mopo":
        dynamics = EnsembleDynamics(dynamics_model, dynamics_optim, scaler, termination_fn, penalty_coef=s["penalty_coef"])
        policy = MOPOPolicy(dynamics, actor, critic1, critic2, actor_optim, critic1_optim, critic2_optim,
                            tau=0.005, gamma=0.99, alpha=alpha)
    else:
        dynamics = EnsembleDynamics(dynamics_model, dynamics_optim, scaler, termination_fn)
        policy = MOBILEPolicy(dynamics, actor, critics, actor_optim, critics_optim, tau=0.005, gamma=0.99,
                              alpha=alpha, penalty_coef=s["penalty_coef"], num_samples=10,
                              deterministic_backup=True, max_q_backup=False)
    fake_buffer = ReplayBuffer(buffer_size=args.rollouts * s["horizon"] * s["retain"], obs_shape=(obs_dim,),
                               obs_dtype=np.float32, action_dim=act_dim, action_dtype=np.float32, device="cpu")

    folder = tempfile.mkdtemp(prefix="offlinerlkit-")
    logger = _Logger(folder)
    if args.algo == "rambo":  # run_rambo.py: behaviour cloning first (bc-epoch 50, batch 256, lr 1e-4)
        policy.pretrain(real_buffer.sample_all(), s["bc_epochs"], 256, 1e-4, logger)
    start = time.perf_counter()
    d = s["dynamics"]
    dynamics.train(real_buffer.sample_all(), logger, max_epochs=args.dynamics_max_epochs,
                   max_epochs_since_update=d["patience"], holdout_ratio=d["holdout_ratio"],
                   logvar_loss_coef=d["logvar_bound_coef"])
    dynamics_seconds = time.perf_counter() - start
    dynamics_log = [d["loss/dynamics_holdout_loss"] for d in logger.dumps]
    logger.dumps = []

    def predict(obs, act):
        with torch.no_grad():
            mean, logvar = dynamics_model(scaler.transform(np.concatenate([obs, act], axis=1)))
        return mean.numpy(), logvar.numpy()

    def step(obs, act):
        return dynamics.step(obs, act)[3]["raw_reward"][:, 0]  # the sampled reward before any penalty

    model = model_measures(predict, step, dynamics_model.elites.numpy(), holdout, s["mopo_lambda"], low, high)
    model["own_holdout_loss"] = dynamics_log[-1]
    model["epochs"] = len(dynamics_log)
    model["seconds"] = dynamics_seconds
    model["logvar_bounds"] = {"max_mean": dynamics_model.max_logvar.mean().item(),
                              "min_mean": dynamics_model.min_logvar.mean().item()}

    if args.epochs == 0:  # the dynamics model alone
        return {"model": model, "curve": [], "dynamics_holdout_log": dynamics_log}
    q_obs = torch.as_tensor(train.observations[q_rows])
    if s["standardise_observations"]:  # RAMBO's critics see standardised states
        q_obs = torch.as_tensor(real_buffer.observations[q_rows])
    q_act = torch.as_tensor(train.actions[q_rows])
    h_obs, h_act = torch.as_tensor(holdout.observations), torch.as_tensor(holdout.actions)

    class Trainer(MBPolicyTrainer):
        epoch = 0

        def _evaluate(self):
            Trainer.epoch += 1
            self.policy.eval()
            result = evaluate_policy(lambda o: self.policy.select_action(o, deterministic=True), env,
                                     args.eval_episodes, eval_seed(args.seed, Trainer.epoch))
            with torch.no_grad():
                if hasattr(policy, "critic1"):  # MOPO's, COMBO's and RAMBO's two critics; MOBILE's list
                    q = torch.min(policy.critic1(q_obs, q_act), policy.critic2(q_obs, q_act))
                else:
                    q = torch.stack([c(q_obs, q_act) for c in policy.critics]).min(0).values
                extra = {"q_mean": q.mean().item()}
                if args.algo == "mobile":
                    penalty = policy.compute_lcb(h_obs, h_act)
                    extra.update(penalty_mean=penalty.mean().item(), penalty_std=penalty.std().item())
            logger.extra = {**extra, "normalized_score": result["normalized_score"], "return_mean": result["return_mean"]}
            return {"eval/episode_reward": result["returns"], "eval/episode_length": [0] * len(result["returns"])}

    class _EvalEnv:  # only get_normalized_score is used once _evaluate is replaced
        def get_normalized_score(self, ret):
            return (ret - env.ref_min_score) / (env.ref_max_score - env.ref_min_score)

    trainer = Trainer(policy=policy, eval_env=_EvalEnv(), real_buffer=real_buffer, fake_buffer=fake_buffer,
                      logger=logger, rollout_setting=(scaled(s["every"], args), args.rollouts, s["horizon"]),
                      dynamics_update_freq=scaled(s["adversarial"]["every"], args) if s["adversarial"]["every"] else 0,
                      epoch=args.epochs,
                      step_per_epoch=args.updates_per_epoch, batch_size=256, real_ratio=s["real_ratio"],
                      eval_episodes=args.eval_episodes, lr_scheduler=lr_scheduler)
    start = time.perf_counter()
    trainer.train()
    curve = [{"epoch": i + 1, "normalized_score": d["normalized_score"], "return_mean": d["return_mean"],
              "rollout_reward_mean": d.get("rollout_info/reward_mean", float("nan")), "q_mean": d["q_mean"],
              "alpha": d.get("alpha", s["init_alpha"]),
              **({"penalty_mean": d["penalty_mean"], "penalty_std": d["penalty_std"]} if args.algo == "mobile" else {})}
             for i, d in enumerate(logger.dumps)]
    return {"model": model, "curve": curve, "agent_seconds": time.perf_counter() - start,
            "dynamics_holdout_log": dynamics_log, "code": str(checkout), "offlinerlkit_path": kit.__file__}


# ---------------------------------------------------------------------------------- EDAC: update by update
def edac_update_differences(checkout: Path, dataset: str = "hopper-medium", num_critics: int = 10, eta: float = 1.0,
                            hidden_size: int = 256, updates: int = 1, seed: int = 0, batch_size: int = 256,
                            exact_log_det: bool = False) -> list[dict]:
    """OfflineRL-Kit's ``EDACPolicy`` (built as ``run_edac.py`` builds it) and our EDAC with
    ``EDACConfig.offlinerlkit()``, from the same weights (Kit's, copied into ours), on the same batches of
    ``dataset`` rows, the torch seed set to the same value before each side's update. Per update, a dict
    of ``quantity: (value, scale)``: the largest |ours - Kit| of the actor's and critics' gradients (beside
    the largest |Kit's gradient|), of the actor, critics, target critics and log alpha after the update
    (beside the largest change Kit's update made), of the losses and alpha (beside Kit's value); and
    how many weights differ by more than 1e-6 (beside the count of weights) with the largest |Kit's
    gradient| among them (beside the largest overall). Adam's first step moves a weight by about
    lr * g / (|g| + 1e-8): where |g| is near 1e-8 it turns rounding into a visible part of the step.

    ``exact_log_det``: Kit's tanh-Gaussian log-probability computes log(1 - tanh(u)^2 + 1e-6), ours the
    exact log(1 - tanh(u)^2) (`mbrl_offline.models.networks.TanhGaussianActor`); with this flag Kit's
    ``TanhNormalWrapper.log_prob`` is replaced, for this call only, by the exact form, so that what
    remains is rounding."""
    import_offlinerlkit(checkout)
    from offlinerlkit.modules import dist_module

    kit_log_prob = dist_module.TanhNormalWrapper.log_prob
    if exact_log_det:
        exact_kit_log_det()
    try:
        return _edac_updates(dataset, num_critics, eta, hidden_size, updates, seed, batch_size)
    finally:
        dist_module.TanhNormalWrapper.log_prob = kit_log_prob


def kit_edac_policy(obs_dim: int, act_dim: int, max_action: float, num_critics: int = 10, eta: float = 1.0,
                    hidden_size: int = 256):
    """OfflineRL-Kit's ``EDACPolicy`` built as its ``run_edac.py`` builds it (Kit already imported)."""
    from offlinerlkit.modules import ActorProb, EnsembleCritic, TanhDiagGaussian
    from offlinerlkit.nets import MLP
    from offlinerlkit.policy import EDACPolicy

    hidden = [hidden_size] * 3
    backbone = MLP(input_dim=obs_dim, hidden_dims=hidden)
    dist = TanhDiagGaussian(latent_dim=backbone.output_dim, output_dim=act_dim, unbounded=True,
                            conditioned_sigma=True, max_mu=max_action)
    actor = ActorProb(backbone, dist, "cpu")
    critics = EnsembleCritic(obs_dim, act_dim, hidden, num_ensemble=num_critics, device="cpu")
    for layer in critics.model[::2]:
        torch.nn.init.constant_(layer.bias, 0.1)
    torch.nn.init.uniform_(critics.model[-1].weight, -3e-3, 3e-3)
    torch.nn.init.uniform_(critics.model[-1].bias, -3e-3, 3e-3)
    log_alpha = torch.zeros(1, requires_grad=True)
    return EDACPolicy(actor, critics, torch.optim.Adam(actor.parameters(), lr=1e-4),
                      torch.optim.Adam(critics.parameters(), lr=3e-4), tau=0.005, gamma=0.99,
                      alpha=(-float(act_dim), log_alpha, torch.optim.Adam([log_alpha], lr=1e-4)),
                      max_q_backup=False, deterministic_backup=False, eta=eta)


def _edac_updates(dataset, num_critics, eta, hidden_size, updates, seed, batch_size) -> list[dict]:
    from mbrl_offline import load_dataset
    from mbrl_offline.algorithms.edac import EDAC, EDACConfig
    from mbrl_offline.data.envs import get_env_info

    data = load_dataset(dataset)
    obs_dim, act_dim = data.obs_dim, data.act_dim
    low, high = get_env_info(data.env_name).action_bounds()
    torch.manual_seed(seed)
    policy = kit_edac_policy(obs_dim, act_dim, float(high[0]), num_critics, eta, hidden_size)
    actor, critics, log_alpha = policy.actor, policy.critics, policy._log_alpha
    backbone, dist = actor.backbone, actor.dist_net

    config = EDACConfig.offlinerlkit(num_critics=num_critics, eta=eta, hidden_size=hidden_size, hidden_layers=3,
                                     batch_size=batch_size)
    ours = EDAC(obs_dim, act_dim, low, high, config, "cpu")
    kit_actor = [m for m in backbone.model if isinstance(m, torch.nn.Linear)]
    kit_critics = list(critics.model[::2])

    def kit_groups(grad: bool = False) -> dict[str, list[torch.Tensor]]:
        """Kit's parameters (or their gradients), arranged as ours are: one (out, in) head for mu and sigma."""
        get = (lambda p: p.grad) if grad else (lambda p: p.detach())
        head = [torch.cat([get(dist.mu.weight), get(dist.sigma.weight)]), torch.cat([get(dist.mu.bias), get(dist.sigma.bias)])]
        groups = {"actor": [get(p) for m in kit_actor for p in (m.weight, m.bias)] + head,
                  "critics": [get(p) for m in kit_critics for p in (m.weight, m.bias)]}
        if not grad:
            groups["target critics"] = [p.detach() for m in list(policy.critics_old.model[::2]) for p in (m.weight, m.bias)]
            groups["log alpha"] = [log_alpha.detach()[0]]
        return groups

    def our_groups(grad: bool = False) -> dict[str, list[torch.Tensor]]:
        get = (lambda p: p.grad) if grad else (lambda p: p)
        groups = {"actor": [get(p) for m in ours.actor.linears for p in (m.weight, m.bias)],
                  "critics": [get(p) for m in ours.critic.net.linears for p in (m.weight, m.bias)]}
        if not grad:
            groups["target critics"] = [p for m in ours.target_critic.net.linears for p in (m.weight, m.bias)]
            groups["log alpha"] = [ours.log_alpha]
        return groups

    with torch.no_grad():
        for group, kit_params in kit_groups().items():
            for mine, theirs in zip(our_groups()[group], kit_params):
                mine.copy_(theirs.reshape(mine.shape))

    rng = np.random.default_rng(seed)
    results = []
    for step in range(updates):
        rows = rng.integers(0, len(data), batch_size)
        arrays = {k: torch.as_tensor(getattr(data, k)[rows]) for k in
                  ("observations", "actions", "next_observations", "rewards", "terminals")}
        kit_batch = {**arrays, "rewards": arrays["rewards"][:, None].clone(),
                     "terminals": arrays["terminals"].float()[:, None], "actions": arrays["actions"].clone()}
        before = {group: [p.clone() for p in params] for group, params in kit_groups().items()}
        torch.manual_seed(seed + 1 + step)
        kit = policy.learn(kit_batch)
        torch.manual_seed(seed + 1 + step)
        mine = ours.update(arrays)
        result = {}
        for group, kit_grads in kit_groups(grad=True).items():  # this update's gradients (left in .grad)
            pairs = [(a.detach(), b.reshape(a.shape)) for a, b in zip(our_groups(grad=True)[group], kit_grads)]
            result[f"{group}: gradient"] = (max((a - b).abs().max().item() for a, b in pairs),
                                            max(b.abs().max().item() for _, b in pairs))
        for group, kit_params in kit_groups().items():
            after = [a.detach() for a in our_groups()[group]]
            grads = ([g.reshape(a.shape) for g, a in zip(kit_groups(grad=True)[group], after)]
                     if group in ("actor", "critics") else None)
            result.update(weight_differences(group, after, [b.reshape(a.shape) for b, a in zip(kit_params, after)],
                                             [c.reshape(a.shape) for c, a in zip(before[group], after)], grads))
        critic_loss = mine["critic_loss"] + eta * mine["diversity_loss"]
        for name, (a, b) in {"actor loss": (mine["actor_loss"], kit["loss/actor"]),
                             "critic loss (TD + eta x diversity)": (critic_loss, kit["loss/critics"]),
                             "alpha": (mine["alpha"], kit["alpha"])}.items():
            result[name] = (abs(float(a) - float(b)), abs(float(b)))
        results.append(result)
    return results


def edac_update_main(argv: list[str]) -> None:
    import argparse
    parser = argparse.ArgumentParser(description="our EDAC against OfflineRL-Kit's EDACPolicy, update by update")
    parser.add_argument("--edac-update", action="store_true", required=True)
    parser.add_argument("--offlinerlkit", required=True, help="a checkout of github.com/yihaosun1124/OfflineRL-Kit")
    parser.add_argument("--dataset", default="hopper-medium")
    parser.add_argument("--num-critics", type=int, default=10)
    parser.add_argument("--eta", type=float, default=1.0)
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--updates", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--exact-log-det", action="store_true",
                        help="Kit's log(1 - tanh^2 + 1e-6) replaced by the exact form ours computes, for this run")
    args = parser.parse_args(argv)
    if not is_checkout(Path(args.offlinerlkit)):
        parser.exit(2, "error: --offlinerlkit must name a checkout of github.com/yihaosun1124/OfflineRL-Kit; clone it "
                       "and pass its path.\n")
    torch.set_num_threads(1)
    results = edac_update_differences(Path(args.offlinerlkit), args.dataset, args.num_critics, args.eta,
                                      args.hidden_size, args.updates, args.seed, exact_log_det=args.exact_log_det)
    print(f"EDAC on {args.dataset}, N = {args.num_critics}, eta = {args.eta}, {args.hidden_size}-wide: ours "
          f"(EDACConfig.offlinerlkit()) against OfflineRL-Kit's EDACPolicy from the same weights and batches"
          + (", Kit's log-det made exact" if args.exact_log_det else ""))
    print(f"{'update':>6}  {'quantity':<48} {'value':>10}  {'of':>10}")
    for step, result in enumerate(results, 1):
        for name, (value, scale) in result.items():
            print(f"{step:>6}  {name:<48} {value:>10.3g}  {scale:>10.3g}")


def is_checkout(path: Path) -> bool:
    return (path / "offlinerlkit" / "dynamics" / "ensemble_dynamics.py").is_file()


# ---------------------------------------------------------------------------------- CQL, one update
def kit_actor_and_critics(agent):
    """OfflineRL-Kit's ``ActorProb`` (``MLP`` backbone, ``TanhDiagGaussian``) and two ``Critic``s of
    ``agent``'s sizes, as its run scripts build them, holding ``agent``'s weights (Kit's actor's mu and
    sigma heads are our actor's one output layer, split; Kit imported)."""
    from offlinerlkit.modules import ActorProb, Critic, TanhDiagGaussian
    from offlinerlkit.nets import MLP

    cfg, obs_dim, act_dim = agent.config, agent.obs_dim, agent.act_dim
    hidden = [cfg.hidden_size] * cfg.hidden_layers
    high = agent.actor.action_scale.numpy() + agent.actor.action_offset.numpy()
    backbone = MLP(input_dim=obs_dim, hidden_dims=hidden)
    dist = TanhDiagGaussian(latent_dim=backbone.output_dim, output_dim=act_dim, unbounded=True, conditioned_sigma=True,
                            max_mu=float(high[0]))
    actor = ActorProb(backbone, dist, "cpu")
    critics = [Critic(MLP(input_dim=obs_dim + act_dim, hidden_dims=hidden), "cpu") for _ in range(2)]
    with torch.no_grad():
        *ours, head = agent.actor.linears
        for kit_layer, layer in zip([m for m in backbone.model if isinstance(m, torch.nn.Linear)], ours):
            kit_layer.weight.copy_(layer.weight)
            kit_layer.bias.copy_(layer.bias)
        dist.mu.weight.copy_(head.weight[:act_dim])
        dist.mu.bias.copy_(head.bias[:act_dim])
        dist.sigma.weight.copy_(head.weight[act_dim:])
        dist.sigma.bias.copy_(head.bias[act_dim:])
        for i, critic in enumerate(critics):
            kit_layers = [m for m in critic.backbone.model if isinstance(m, torch.nn.Linear)] + [critic.last]
            for kit_layer, layer in zip(kit_layers, agent.critic.net.linears):
                kit_layer.weight.copy_(layer.weight[i].t())
                kit_layer.bias.copy_(layer.bias[i, 0])
    return actor, critics, high


def kit_cql_policy(checkout, agent, with_lagrange: bool = False):
    """OfflineRL-Kit's ``CQLPolicy`` built as ``run_cql.py`` builds it, for ``agent``'s sizes and
    settings, holding ``agent``'s weights (`kit_actor_and_critics`)."""
    import types
    import_offlinerlkit(Path(checkout))
    from offlinerlkit.policy import CQLPolicy

    cfg = agent.config
    actor, critics, high = kit_actor_and_critics(agent)
    log_alpha = torch.full((1,), agent.log_alpha.item(), requires_grad=True)
    alpha = (agent.target_entropy, log_alpha, torch.optim.Adam([log_alpha], lr=cfg.alpha_lr))
    space = types.SimpleNamespace(low=-high, high=high)
    return CQLPolicy(actor, critics[0], critics[1], torch.optim.Adam(actor.parameters(), lr=cfg.actor_lr),
                     torch.optim.Adam(critics[0].parameters(), lr=cfg.critic_lr),
                     torch.optim.Adam(critics[1].parameters(), lr=cfg.critic_lr), action_space=space, tau=cfg.tau,
                     gamma=cfg.gamma, alpha=alpha, cql_weight=cfg.cql_weight, temperature=cfg.temperature,
                     max_q_backup=cfg.max_q_backup, deterministic_backup=cfg.deterministic_backup,
                     with_lagrange=with_lagrange, lagrange_threshold=cfg.lagrange_threshold,
                     cql_alpha_lr=cfg.cql_alpha_lr, num_repeart_actions=cfg.num_repeats)


def kit_weights(policy) -> dict[str, torch.Tensor]:
    """Kit's actor, critics and target critics in our layout (`CQL`'s modules' parameters, flattened)."""
    backbone = [m for m in policy.actor.backbone.model if isinstance(m, torch.nn.Linear)]
    dist = policy.actor.dist_net
    actor = [t for layer in backbone for t in (layer.weight, layer.bias)]
    actor += [torch.cat([dist.mu.weight, dist.sigma.weight]), torch.cat([dist.mu.bias, dist.sigma.bias])]

    def critics(c1, c2):
        layers = [[m for m in c.backbone.model if isinstance(m, torch.nn.Linear)] + [c.last] for c in (c1, c2)]
        return [t for a, b in zip(*layers) for t in (torch.stack([a.weight.t(), b.weight.t()]),
                                                     torch.stack([a.bias, b.bias])[:, None])]
    out = {"actor": torch.cat([t.detach().flatten() for t in actor]),
           "critic": torch.cat([t.detach().flatten() for t in critics(policy.critic1, policy.critic2)]),
           "target_critic": torch.cat([t.detach().flatten() for t in critics(policy.critic1_old, policy.critic2_old)]),
           "log_alpha": policy._log_alpha.detach().flatten().clone()}
    if hasattr(policy, "cql_log_alpha"):  # CQL's and COMBO's alpha'
        out["log_alpha_prime"] = policy.cql_log_alpha.detach().flatten().clone()
    return out


def our_weights(agent) -> dict[str, torch.Tensor]:
    out = {name: torch.cat([p.detach().flatten() for p in getattr(agent, name).parameters()])
           for name in ("actor", "critic", "target_critic")} | {"log_alpha": agent.log_alpha.detach().flatten().clone()}
    if hasattr(agent, "log_alpha_prime"):
        out["log_alpha_prime"] = agent.log_alpha_prime.detach().flatten().clone()
    return out


def cql_batches(count: int, rows: int = 256, seed: int = 0):
    """``count`` batches of hopper-medium rows: ours and Kit's (rewards and terminals as columns)."""
    from mbrl_offline import load_dataset
    data = load_dataset("hopper-medium")
    rng = np.random.default_rng(seed)
    for _ in range(count):
        idx = rng.integers(0, len(data), rows)
        ours = {k: torch.as_tensor(getattr(data, k)[idx]).float()
                for k in ("observations", "actions", "next_observations", "rewards", "terminals")}
        yield ours, {**ours, "rewards": ours["rewards"][:, None], "terminals": ours["terminals"][:, None]}


def cql_side_by_side(checkout, lse_mode: str, with_lagrange: bool = False, updates: int = 3, seed: int = 0) -> list[dict]:
    """Our CQL (Kit's settings, ``lse_mode``) and Kit's ``CQLPolicy`` from the same weights, updated on
    the same batches with the same torch seed before each update: per update, each side's critic loss
    (TD + conservative, both critics), the largest weight difference per module, and the relative
    difference of the update itself, |delta_ours - delta_kit| / |delta_kit|."""
    from mbrl_offline.algorithms.cql import CQL, CQLConfig
    from mbrl_offline.data.envs import get_env_info
    env = get_env_info("hopper")
    low, high = env.action_bounds()
    torch.manual_seed(seed)
    agent = CQL(env.obs_dim, env.act_dim, low, high, CQLConfig(lse_mode=lse_mode, with_lagrange=with_lagrange))
    kit = kit_cql_policy(checkout, agent, with_lagrange)
    rows = []
    for t, (ours_batch, kit_batch) in enumerate(cql_batches(updates, seed=seed)):
        before_ours, before_kit = our_weights(agent), kit_weights(kit)
        torch.manual_seed(1000 + t)
        kit_out = kit.learn(kit_batch)
        torch.manual_seed(1000 + t)
        ours_out = agent.update(ours_batch)
        after_ours, after_kit = our_weights(agent), kit_weights(kit)
        row = {"update": t + 1, "kit_critic_loss": kit_out["loss/critic1"] + kit_out["loss/critic2"],
               "our_critic_loss": float(ours_out["critic_loss"] + ours_out["cql_loss"]),
               "kit_actor_loss": kit_out["loss/actor"], "our_actor_loss": float(ours_out["actor_loss"])}
        for name in after_ours:
            step_kit, step_ours = after_kit[name] - before_kit[name], after_ours[name] - before_ours[name]
            row[f"{name}_max_diff"] = float((after_ours[name] - after_kit[name]).abs().max())
            if step_kit.norm() > 0:
                row[f"{name}_step_rel_diff"] = float((step_ours - step_kit).norm() / step_kit.norm())
        rows.append(row)
    return rows


def kit_conservative_terms(checkout) -> dict[str, torch.Tensor]:
    """Kit's critic loss (both critics, TD + conservative) on one update from fixed weights and batch,
    and ours from the same weights and draws with ``lse_mode`` per_repeat and joint: Kit's equals the
    per-repeat one (the TD parts are the same)."""
    out = {}
    for mode in ("per_repeat", "joint"):
        row = cql_side_by_side(checkout, mode, updates=1)[0]
        out[mode], out["kit"] = torch.tensor(row["our_critic_loss"]), torch.tensor(row["kit_critic_loss"])
    return out


def exact_kit_log_det() -> None:
    """Replace Kit's ``TanhNormalWrapper.log_prob``, which takes log(max (1 - tanh(u)^2) + 1e-6), with the
    exact log-determinant ours computes, in this process only: what is left of the actor's difference
    is then rounding (``--kit-exact-log-det``)."""
    from offlinerlkit.modules import dist_module

    def log_prob(self, action, raw_action=None):
        raw = self.arctanh(action / self._max_action) if raw_action is None else raw_action
        gaussian = torch.distributions.Normal.log_prob(self, raw).sum(-1, keepdim=True)
        log_det = 2 * (np.log(2) - raw - torch.nn.functional.softplus(-2 * raw)) + np.log(self._max_action)
        return gaussian - log_det.sum(-1, keepdim=True)

    dist_module.TanhNormalWrapper.log_prob = log_prob


def kit_update_arguments(argv, flag: str, description: str, exact_help: str):
    """The arguments of a one-update comparison (``--cql-update``, ``--combo-update``): the flag, the
    checkout (refused in one line, exit status 2, unless it is one), ``--updates`` and
    ``--kit-exact-log-det`` (which, when given, makes Kit's log-determinant exact in this process)."""
    import argparse
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(flag, action="store_true")
    parser.add_argument("--offlinerlkit", required=True, help="a checkout of github.com/yihaosun1124/OfflineRL-Kit")
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--kit-exact-log-det", action="store_true", help=exact_help)
    args = parser.parse_args(argv)
    if not is_checkout(Path(args.offlinerlkit)):
        parser.exit(2, "error: --offlinerlkit must name a checkout of github.com/yihaosun1124/OfflineRL-Kit; "
                       "clone it and pass its path.\n")
    torch.set_num_threads(1)
    if args.kit_exact_log_det:
        import_offlinerlkit(Path(args.offlinerlkit))
        exact_kit_log_det()
    return args


def cql_update_main(argv) -> None:
    args = kit_update_arguments(argv, "--cql-update", "our CQL's update against OfflineRL-Kit's CQLPolicy.learn",
                                "Kit's tanh log-determinant without its 1e-6, to attribute the actor's difference")
    for lagrange in (False, True):
        for mode in ("per_repeat", "joint"):
            print(f"lse_mode={mode} with_lagrange={lagrange}")
            for row in cql_side_by_side(args.offlinerlkit, mode, lagrange, args.updates):
                print("  " + "  ".join(f"{k} {v:.6g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()))


# ---------------------------------------------------------------------------------- RAMBO, one adversarial step
def kit_rambo_policy(checkout, agent, model, obs_mean: np.ndarray, obs_std: np.ndarray, coef: float):
    """OfflineRL-Kit's ``RAMBOPolicy`` built as ``run_rambo.py`` builds it (``ActorProb``/``Critic`` of
    ``agent``'s sizes, ``EnsembleDynamicsModel`` of ``model``'s, its scaler, the termination function
    wrapped by ``obs_unnormalization``, Adam at 3e-4 for the adversarial steps), holding ``agent``'s and
    ``model``'s weights and ``model``'s input statistics and elites."""
    import_offlinerlkit(Path(checkout))
    from offlinerlkit.policy import RAMBOPolicy
    from offlinerlkit.utils.scaler import StandardScaler
    from offlinerlkit.utils.termination_fns import get_termination_fn, obs_unnormalization

    cfg = agent.config
    actor, critics, _ = kit_actor_and_critics(agent)
    dynamics = kit_dynamics(model, obs_unnormalization(get_termination_fn(task="hopper"), obs_mean, obs_std))
    kit_model = dynamics.model
    log_alpha = torch.full((1,), agent.log_alpha.item(), requires_grad=True)
    alpha = (agent.target_entropy, log_alpha, torch.optim.Adam([log_alpha], lr=cfg.alpha_lr))
    return RAMBOPolicy(dynamics, actor, critics[0], critics[1], torch.optim.Adam(actor.parameters(), lr=cfg.actor_lr),
                       torch.optim.Adam(critics[0].parameters(), lr=cfg.critic_lr),
                       torch.optim.Adam(critics[1].parameters(), lr=cfg.critic_lr),
                       torch.optim.Adam(kit_model.parameters(), lr=3e-4), tau=cfg.tau, gamma=cfg.gamma, alpha=alpha,
                       adv_weight=coef, adv_rollout_length=5, adv_rollout_batch_size=256, include_ent_in_adv=False,
                       scaler=StandardScaler(mu=obs_mean, std=obs_std), device="cpu")


def kit_dynamics(model, termination_fn):
    """OfflineRL-Kit's ``EnsembleDynamics`` (no penalty) over an ``EnsembleDynamicsModel`` of our
    ``model``'s sizes holding its weights, log-variance bounds, elites and input statistics (its scaler),
    with ``termination_fn`` (Kit imported)."""
    from offlinerlkit.dynamics import EnsembleDynamics
    from offlinerlkit.modules import EnsembleDynamicsModel
    from offlinerlkit.utils.scaler import StandardScaler

    mcfg = model.config
    kit_model = EnsembleDynamicsModel(obs_dim=model.obs_dim, action_dim=model.act_dim,
                                      hidden_dims=[mcfg.hidden_size] * mcfg.hidden_layers,
                                      num_ensemble=mcfg.ensemble_size, num_elites=mcfg.num_elites,
                                      weight_decays=list(mcfg.weight_decay), device="cpu")
    with torch.no_grad():
        for kit_layer, layer in zip([*kit_model.backbones, kit_model.output_layer], [*model.hidden, model.head]):
            kit_layer.weight.copy_(layer.weight)
            kit_layer.bias.copy_(layer.bias)
        kit_model.max_logvar.copy_(model.max_logvar.flatten())
        kit_model.min_logvar.copy_(model.min_logvar.flatten())
    kit_model.set_elites(model.elites.tolist())
    scaler = StandardScaler(mu=model.input_mean[None].numpy().copy(), std=model.input_std[None].numpy().copy())
    return EnsembleDynamics(kit_model, torch.optim.Adam(kit_model.parameters(), lr=mcfg.learning_rate), scaler,
                            termination_fn)


def kit_model_parameters(kit_model, grad: bool = False) -> torch.Tensor:
    """Kit's ensemble's trained parameters (or their gradients) in our layout
    (`GaussianEnsembleDynamics.parameters` order)."""
    layers = [*kit_model.backbones, kit_model.output_layer]
    tensors = [t for layer in layers for t in (layer.weight, layer.bias)] + [kit_model.max_logvar, kit_model.min_logvar]
    return torch.cat([(t.grad if grad else t).detach().flatten() for t in tensors])


def our_model_parameters(model, grad: bool = False) -> torch.Tensor:
    layers = [*model.hidden, model.head]
    tensors = [t for layer in layers for t in (layer.weight, layer.bias)] + [model.max_logvar, model.min_logvar]
    return torch.cat([(t.grad if grad else t).detach().flatten() for t in tensors])


def rambo_side_by_side(checkout, coef: float = 3e-4, seed: int = 0, rows: int = 256, steps: int = 1) -> list[dict]:
    """``steps`` adversarial steps of OfflineRL-Kit's ``RAMBOPolicy.dynamics_step_and_forward`` and of ours
    (`mbrl_offline.generators.rollouts.adversarial_step`) on hopper-medium, one rollout as Kit's
    ``update_dynamics`` chains them (each side's next states are its next step's states), from the same
    weights (our RAMBO agent's 2x256 actor and critics, a freshly initialised 7-member 4x200 ensemble of
    OfflineRL-Kit's recipe with 5 elites, copied into Kit's modules; each side keeps its own Adam), the
    same standardised start states, the same actions at each step (one sample of the actor at our
    states, handed to both), the same real batch per step for the MLE term and the same draws: both
    sides sample every member's noise from a torch seed set just before (Kit's ``Normal.sample``, our
    ``torch.randn``), and Kit's elite choice (``np.random.choice``) is replaced by the rows our
    ``torch.randint`` draws after that noise. Kit reports mean(A_hat), not A's statistics: A is
    recomputed on Kit's side, before its step, from Kit's own model, critics and actor at Kit's own
    draw (labelled ``kit_``). Per step: both sides' losses, log p, the advantage statistics, the
    largest differences of the next states, of the model's gradients (beside the largest gradient:
    Adam's first step is about lr x sign, so the gradients are the finer check) and of its parameters
    after the step, and the largest change the step made."""
    from mbrl_offline import load_dataset
    from mbrl_offline.algorithms.rambo import RAMBO, RAMBOConfig
    from mbrl_offline.data.envs import get_env_info
    import mbrl_offline.generators.rollouts as rollouts
    from mbrl_offline.generators.rollouts import AdversarialConfig, StandardisedDynamics, adversarial_step
    from mbrl_offline.models.dynamics import GaussianEnsembleDynamics
    from mbrl_offline.policies import FunctionPolicy

    torch.manual_seed(seed)
    data = load_dataset("hopper-medium")
    env = get_env_info("hopper")
    low, high = env.action_bounds()
    agent = RAMBO(data.obs_dim, data.act_dim, low, high, RAMBOConfig(bc_epochs=0))
    agent.normalise.fit(data.observations, agent.config.state_std_eps)
    obs_mean, obs_std = agent.normalise.mean.numpy(), agent.normalise.std.numpy()
    model = GaussianEnsembleDynamics(data.obs_dim, data.act_dim, RAMBO.published_generator().dynamics)
    standard_obs = (data.observations - obs_mean) / obs_std
    inputs = np.concatenate([standard_obs, data.actions], axis=1)
    with torch.no_grad():
        model.input_mean.copy_(torch.as_tensor(inputs.mean(0)))
        model.input_std.copy_(torch.as_tensor(inputs.std(0)))
        model.elites.copy_(torch.tensor([5, 2, 0, 6, 3]))
    model.mark_fitted()
    wrapped = StandardisedDynamics(model, torch.as_tensor(obs_mean), torch.as_tensor(obs_std))
    policy = kit_rambo_policy(checkout, agent, model, obs_mean, obs_std, coef)
    kit_model = policy.dynamics.model
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-4)
    original, captured = rollouts.normalised_advantage, {}

    def capture(advantage, eps):  # our A, as adversarial_step normalises it
        captured["advantage"] = advantage.clone()
        return original(advantage, eps)

    rng = np.random.default_rng(seed)
    ours = torch.as_tensor(standard_obs[rng.integers(0, len(data), rows)])
    kit_obs = ours.clone()
    results = []
    for step in range(steps):
        torch.manual_seed(seed + 100 + step)
        actions = agent.sample(wrapped.unstandardise(ours))[0]
        real = rng.integers(0, len(data), rows)
        raw = {k: torch.as_tensor(getattr(data, k)[real]) for k in ("observations", "actions", "next_observations",
                                                                      "rewards")}
        sl = [wrapped.standardise(raw["observations"]), raw["actions"], wrapped.standardise(raw["next_observations"]),
              raw["rewards"][:, None]]
        # the draws: noise for every member, then each row's elite, from one seed
        draws = torch.Generator().manual_seed(seed + 1 + step)
        torch.randn((model.config.ensemble_size, rows, data.obs_dim + 1), generator=draws)
        choice = torch.randint(0, len(model.elites), (rows,), generator=draws)
        kit_model.random_elite_idxs = lambda batch_size, choice=choice: model.elites[choice].numpy()
        before = kit_model_parameters(kit_model)

        with torch.no_grad():  # A on Kit's side, before its step: Kit's model, critics and actor at Kit's own draw
            mean, logvar = kit_model(policy.dynamics.scaler.transform(
                np.concatenate([kit_obs.numpy(), actions.numpy()], -1)))
            mean = torch.cat([mean[..., :-1] + kit_obs, mean[..., -1:]], dim=-1)
            torch.manual_seed(seed + 1 + step)
            sample = torch.distributions.Normal(mean, torch.sqrt(torch.exp(logvar))).sample()[
                model.elites[choice], torch.arange(rows)]
            next_kit, reward_kit = sample[:, :-1], sample[:, -1:]
            done = torch.as_tensor(policy.dynamics.terminal_fn(kit_obs.numpy(), actions.numpy(),
                                                               next_kit.numpy())).float()
            next_q = torch.minimum(*(c(next_kit, policy.actforward(next_kit, deterministic=True)[0])
                                     for c in (policy.critic1, policy.critic2)))
            kit_advantage = (reward_kit + (1 - done) * policy._gamma * next_q
                             - torch.minimum(policy.critic1(kit_obs, actions), policy.critic2(kit_obs, actions))).flatten()
        torch.manual_seed(seed + 1 + step)
        kit_next, kit_terminals, info = policy.dynamics_step_and_forward(kit_obs.numpy(), actions.numpy(), *sl)

        rollouts.normalised_advantage = capture
        try:
            next_obs, metrics = adversarial_step(model, optimizer, ours, FunctionPolicy(lambda o: actions), agent, raw,
                                                 env.termination_fn, AdversarialConfig(every=1, coef=coef),
                                                 wrapped.unstandardise, wrapped.standardise,
                                                 torch.Generator().manual_seed(seed + 1 + step))
        finally:
            rollouts.normalised_advantage = original
        ours_terminals = env.termination_fn(wrapped.unstandardise(next_obs)).numpy()
        after_ours, after_kit = our_model_parameters(model), kit_model_parameters(kit_model)
        a = captured["advantage"]
        results.append({
            "step": step,
            "ours_adversarial_loss": metrics["adversarial_loss"].item(),
            "kit_adversarial_loss": info["adv_dynamics_update/adv_loss"],
            "ours_mle_loss": metrics["mle_loss"].item(), "kit_mle_loss": info["adv_dynamics_update/sl_loss"],
            "ours_log_prob": metrics["log_prob"].item(), "kit_log_prob": info["adv_dynamics_update/adv_log_prob"],
            "ours_advantage_mean": a.mean().item(), "kit_advantage_mean": kit_advantage.mean().item(),
            "ours_advantage_std": a.std().item(), "kit_advantage_std": kit_advantage.std().item(),
            "ours_advantage_hat_mean": original(a, 1e-6).mean().item(),
            "kit_advantage_hat_mean": info["adv_dynamics_update/adv_advantage"],
            "kit_terminals": int(kit_terminals.sum()),
            "terminal_mismatches": int((ours_terminals != kit_terminals.flatten()).sum()),
            "next_obs_max_diff": (next_obs - torch.as_tensor(kit_next)).abs().max().item(),
            "grad_max_diff": (our_model_parameters(model, True) - kit_model_parameters(kit_model, True)).abs().max().item(),
            "grad_max": kit_model_parameters(kit_model, True).abs().max().item(),
            "param_max_diff": (after_ours - after_kit).abs().max().item(),
            "param_max_step": (after_kit - before).abs().max().item(),
        })
        ours, kit_obs = next_obs, torch.as_tensor(kit_next)
    return results


def rambo_update_main(argv) -> None:
    import argparse
    parser = argparse.ArgumentParser(description="adversarial model steps of ours against OfflineRL-Kit's "
                                                 "RAMBOPolicy.dynamics_step_and_forward")
    parser.add_argument("--rambo-update", action="store_true")
    parser.add_argument("--offlinerlkit", required=True, help="a checkout of github.com/yihaosun1124/OfflineRL-Kit")
    parser.add_argument("--coef", type=float, nargs="+", default=[3e-4, 1.0], help="lambda (adv_weight)")
    parser.add_argument("--steps", type=int, default=5, help="chained steps (one rollout of h = 5: run_rambo.py's)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not (Path(args.offlinerlkit) / "offlinerlkit" / "policy" / "model_based" / "rambo.py").is_file():
        parser.exit(2, "error: --offlinerlkit must name a checkout of github.com/yihaosun1124/OfflineRL-Kit; "
                       "clone it and pass its path.\n")
    torch.set_num_threads(1)
    for coef in args.coef:
        for row in rambo_side_by_side(args.offlinerlkit, coef, args.seed, steps=args.steps):
            print(f"lambda={coef:g} seed={args.seed} step={row['step']}")
            for key in ("adversarial_loss", "mle_loss", "log_prob", "advantage_mean", "advantage_std",
                        "advantage_hat_mean"):
                print(f"  {key:<20} ours {row['ours_' + key]:>14.7g}  kit {row['kit_' + key]:>14.7g}")
            for key in ("kit_terminals", "terminal_mismatches", "next_obs_max_diff", "grad_max_diff", "grad_max",
                        "param_max_diff", "param_max_step"):
                print(f"  {key:<20} {row[key]:.4g}")

# ---------------------------------------------------------------------------------- COMBO, one update
def kit_combo_policy(checkout, agent, dynamics=None, cql=None):
    """OfflineRL-Kit's ``COMBOPolicy`` built as ``run_combo.py`` builds it: its CQL's networks, optimisers
    and settings (``cql``, Kit's ``CQLPolicy`` from `kit_cql_policy`, holding our COMBO ``agent``'s
    weights; built here when not given), ``agent``'s ``rho_s``, and ``dynamics`` (Kit's
    ``EnsembleDynamics``, for its rollouts; ``learn`` alone does not use them)."""
    cfg = agent.config
    cql = cql if cql is not None else kit_cql_policy(checkout, agent)  # imports the checkout
    from offlinerlkit.policy import COMBOPolicy

    return COMBOPolicy(dynamics, cql.actor, cql.critic1, cql.critic2, cql.actor_optim, cql.critic1_optim,
                       cql.critic2_optim, action_space=cql.action_space, tau=cfg.tau, gamma=cfg.gamma,
                       alpha=(cql._target_entropy, cql._log_alpha, cql.alpha_optim), cql_weight=cfg.cql_weight,
                       temperature=cfg.temperature, max_q_backup=cfg.max_q_backup,
                       deterministic_backup=cfg.deterministic_backup, with_lagrange=False,
                       lagrange_threshold=cfg.lagrange_threshold, cql_alpha_lr=cfg.cql_alpha_lr,
                       num_repeart_actions=cfg.num_repeats, uniform_rollout=False, rho_s=cfg.rho_s)


def combo_batches(count: int, rows: int = 256, seed: int = 0):
    """``count`` batches of 50% hopper-medium rows and 50% stand-ins for model rows (other dataset rows
    with uniform actions and Gaussian-perturbed next states): ours (real rows first, marked by the
    ``synthetic`` field, as `mbrl_offline.buffer.Mixing` builds them) and Kit's ``{"real", "fake"}``."""
    rng = np.random.default_rng(seed + 1)
    real_rows = rows // 2
    for (real, _), (fake, _) in zip(cql_batches(count, real_rows, seed), cql_batches(count, rows - real_rows, seed + 1)):
        fake["actions"] = torch.as_tensor(rng.uniform(-1, 1, fake["actions"].shape), dtype=torch.float32)
        fake["next_observations"] = fake["next_observations"] + 0.1 * torch.as_tensor(
            rng.standard_normal(fake["next_observations"].shape), dtype=torch.float32)
        ours = {k: torch.cat([real[k], fake[k]]) for k in real}
        ours["synthetic"] = torch.arange(rows) >= real_rows
        as_kit = (lambda b: {**b, "rewards": b["rewards"][:, None], "terminals": b["terminals"][:, None]})
        yield ours, {"real": as_kit(real), "fake": as_kit(fake)}


def combo_side_by_side(checkout, lse_mode: str, rho_s: str = "mix", updates: int = 3, seed: int = 0) -> list[dict]:
    """Our COMBO (Kit's settings, ``lse_mode``, ``rho_s``) and Kit's ``COMBOPolicy.learn`` from the same
    weights, on the same real and model halves with the same torch seed before each update: per update,
    each side's critic loss (TD + conservative, both critics), the push-down term T E[log sum exp(v / T)]
    (the mean over the critics: the regulariser's scale), the mean Q of both critics on the batch's real
    rows at their actions after the update, and per module the largest weight difference, the number of
    weights that differ by more than 1e-5 and the relative difference of the update itself."""
    from mbrl_offline.algorithms.combo import COMBO, COMBOConfig
    from mbrl_offline.data.envs import get_env_info
    env = get_env_info("hopper")
    low, high = env.action_bounds()
    torch.manual_seed(seed)
    agent = COMBO(env.obs_dim, env.act_dim, low, high, COMBOConfig(lse_mode=lse_mode, rho_s=rho_s))
    kit = kit_combo_policy(checkout, agent)
    temperature = agent.config.temperature
    rows = []
    for t, (ours_batch, kit_batch) in enumerate(combo_batches(updates, seed=seed)):
        before_ours, before_kit = our_weights(agent), kit_weights(kit)
        kit_lse, logsumexp = [], torch.logsumexp

        def recorded(values, *args, **kwargs):  # Kit's two log-sum-exps (one per critic), as its learn takes them
            out = logsumexp(values, *args, **kwargs)
            kit_lse.append(float(out.detach().mean()) * temperature)
            return out

        torch.manual_seed(1000 + t)
        torch.logsumexp = recorded
        try:
            kit_out = kit.learn(kit_batch)
        finally:
            torch.logsumexp = logsumexp
        torch.manual_seed(1000 + t)
        ours_out = agent.update(ours_batch)
        after_ours, after_kit = our_weights(agent), kit_weights(kit)
        real = kit_batch["real"]
        with torch.no_grad():
            kit_q = torch.cat([kit.critic1(real["observations"], real["actions"]),
                               kit.critic2(real["observations"], real["actions"])]).mean()
            our_q = agent.critic(real["observations"], real["actions"]).mean()
        row = {"update": t + 1, "kit_critic_loss": kit_out["loss/critic1"] + kit_out["loss/critic2"],
               "our_critic_loss": float(ours_out["critic_loss"] + ours_out["cql_loss"]),
               "kit_logsumexp": sum(kit_lse) / len(kit_lse), "our_logsumexp": float(ours_out["ood_mean"]),
               "kit_q_real": float(kit_q), "our_q_real": float(our_q),
               "kit_actor_loss": kit_out["loss/actor"], "our_actor_loss": float(ours_out["actor_loss"])}
        for name in ("actor", "critic", "target_critic", "log_alpha"):
            step_kit, step_ours = after_kit[name] - before_kit[name], after_ours[name] - before_ours[name]
            row[f"{name}_max_diff"] = float((after_ours[name] - after_kit[name]).abs().max())
            row[f"{name}_over_1e-5"] = int(((after_ours[name] - after_kit[name]).abs() > 1e-5).sum())
            if step_kit.norm() > 0:
                row[f"{name}_step_rel_diff"] = float((step_ours - step_kit).norm() / step_kit.norm())
        rows.append(row)
    return rows


def combo_update_main(argv) -> None:
    args = kit_update_arguments(argv, "--combo-update", "our COMBO's update against OfflineRL-Kit's COMBOPolicy.learn",
                                "Kit's tanh log-determinant without its 1e-6, to attribute the remaining differences")
    columns = ("update", "kit_critic_loss", "our_critic_loss", "kit_logsumexp", "our_logsumexp", "kit_q_real",
               "our_q_real", "actor_max_diff", "critic_max_diff", "target_critic_max_diff", "log_alpha_max_diff",
               "critic_over_1e-5", "actor_step_rel_diff", "critic_step_rel_diff")
    print("| rho_s | lse_mode | " + " | ".join(columns) + " |")
    print("|---|---|" + "---|" * len(columns))
    for rho_s in ("mix", "model"):
        for mode in ("per_repeat", "joint"):
            for row in combo_side_by_side(args.offlinerlkit, mode, rho_s, args.updates):
                print(f"| {rho_s} | {mode} | " + " | ".join(
                    f"{row[c]:.6g}" if isinstance(row[c], float) else str(row.get(c, "")) for c in columns) + " |")


# ---------------------------------------------------------------------------------- RAMBO's agent (Kit's SAC)
def sac_side_by_side(checkout, update_order: str = "offlinerlkit_sac", updates: int = 3, bc_epochs: int = 1,
                     seed: int = 0, rows: int = 256) -> list[dict]:
    """Our RAMBO agent (``update_order``) beside OfflineRL-Kit's ``SACPolicy.learn``, which its
    ``RAMBOPolicy.learn`` and ``MOPOPolicy.learn`` run on the real and model rows put together: Kit's
    ``ActorProb`` and two ``Critic``s (2 x 256) holding our agent's weights after ``bc_epochs`` of its
    behaviour cloning on hopper-medium, alpha from the same log alpha, Kit's learning rates, the same
    batches (raw rows to ours, which standardises them inside; the same rows standardised by our agent's
    statistics to Kit, whose buffer is standardised in place; `cql_batches`) and the same torch seed
    before each side's update. Per update: the largest weight differences of the actor, the critics and the target
    critics beside the largest step Kit's update took, and alpha and the losses on each side."""
    import_offlinerlkit(Path(checkout))
    from offlinerlkit.policy import SACPolicy

    from mbrl_offline.algorithms.rambo import RAMBO, RAMBOConfig

    _, train, _, _ = common_data("hopper-medium")
    torch.manual_seed(seed)
    agent = RAMBO.for_dataset(train, RAMBOConfig(bc_epochs=bc_epochs, update_order=update_order,
                                                    fused_adam=False))  # Kit's Adam: the same rounding
    cfg = agent.config
    actor, critics, _ = kit_actor_and_critics(agent)
    log_alpha = torch.full((1,), agent.log_alpha.item(), requires_grad=True)
    kit = SACPolicy(actor, critics[0], critics[1], torch.optim.Adam(actor.parameters(), lr=cfg.actor_lr),
                    torch.optim.Adam(critics[0].parameters(), lr=cfg.critic_lr),
                    torch.optim.Adam(critics[1].parameters(), lr=cfg.critic_lr), tau=cfg.tau, gamma=cfg.gamma,
                    alpha=(agent.target_entropy, log_alpha, torch.optim.Adam([log_alpha], lr=cfg.alpha_lr)))

    results = []
    for step, (batch, kit_batch) in enumerate(cql_batches(updates, rows, seed)):
        kit_batch = {**kit_batch, "observations": agent.normalise(batch["observations"]),
                     "next_observations": agent.normalise(batch["next_observations"])}
        before = kit_weights(kit)  # flattened, in our layout (the actor's heads as one, the critics stacked)
        torch.manual_seed(seed + 1 + step)
        kit_out = kit.learn(kit_batch)
        torch.manual_seed(seed + 1 + step)
        ours = agent.update(batch)
        theirs, mine = kit_weights(kit), our_weights(agent)
        row = {"alpha": (float(ours["alpha"]), kit_out["alpha"]),
               "actor loss": (float(ours["actor_loss"]), kit_out["loss/actor"]),
               "critic loss (sum of both)": (float(ours["critic_loss"]), kit_out["loss/critic1"] + kit_out["loss/critic2"])}
        for group in theirs:
            row[f"{group}: max |ours - Kit| / Kit's step"] = ((mine[group] - theirs[group]).abs().max().item(),
                                                             (theirs[group] - before[group]).abs().max().item())
        results.append(row)
    return results


def sac_update_main(argv) -> None:
    import argparse
    from mbrl_offline.algorithms.sac import UPDATE_ORDERS

    parser = argparse.ArgumentParser(description="our RAMBO agent's update against OfflineRL-Kit's SACPolicy.learn")
    parser.add_argument("--sac-update", action="store_true")
    parser.add_argument("--offlinerlkit", required=True, help="a checkout of github.com/yihaosun1124/OfflineRL-Kit")
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--bc-epochs", type=int, default=1, help="our behaviour cloning before the first update")
    parser.add_argument("--update-order", nargs="+", default=["offlinerlkit_sac", "official"], choices=UPDATE_ORDERS)
    args = parser.parse_args(argv)
    if not is_checkout(Path(args.offlinerlkit)):
        parser.exit(2, "error: --offlinerlkit must name a checkout of github.com/yihaosun1124/OfflineRL-Kit; clone it "
                       "and pass its path.\n")
    torch.set_num_threads(1)
    for order in args.update_order:
        print(f"update_order={order} (ours), OfflineRL-Kit's SACPolicy.learn, hopper-medium, "
              f"{args.bc_epochs} epoch(s) of behaviour cloning first")
        for step, row in enumerate(sac_side_by_side(args.offlinerlkit, order, args.updates, args.bc_epochs), 1):
            print(f"  update {step}: " + "; ".join(f"{k} {a:.6g} / {b:.6g}" for k, (a, b) in row.items()))


PEER = parity.Peer(side="offlinerlkit", option="--offlinerlkit", repository="github.com/yihaosun1124/OfflineRL-Kit",
                   algos=("mopo", "mobile", "cql", "edac", "combo", "rambo"), is_checkout=is_checkout, run=run_offlinerlkit,
                   script=__file__)

if __name__ == "__main__":
    if "--cql-update" in sys.argv[1:]:
        cql_update_main(sys.argv[1:])
    elif "--combo-update" in sys.argv[1:]:
        combo_update_main(sys.argv[1:])
    elif "--edac-update" in sys.argv[1:]:
        edac_update_main(sys.argv[1:])
    elif "--rambo-update" in sys.argv[1:]:
        rambo_update_main(sys.argv[1:])
    elif "--sac-update" in sys.argv[1:]:
        sac_update_main(sys.argv[1:])
    else:
        parity.main(PEER, __doc__.split("\n")[0])
