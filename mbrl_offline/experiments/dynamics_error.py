"""PGD's claim and the refiner's effect, measured: one-step and long-horizon dynamics error and
target-policy likelihood of policy-guided diffusion, unguided diffusion and dynamics-ensemble rollouts
(with and without the PDE-Refiner) from the same start states.

    mbrl-dynamics-error  # pendulum-medium, TD3+BC trained here
    mbrl-dynamics-error env=hopper starts=128 scale=0.3 out=hopper_error.png
    mbrl-dynamics-error checkpoint=runs/td3bc-pendulum-seed0/checkpoint.pt
    mbrl-dynamics-error length=200 methods=[ensemble,refiner]  # a whole pendulum episode, the models only

From the same ``starts`` start states (drawn from the data with ``seed``) and for the same target
policy, the chosen ``methods`` (default: all four) make trajectories of ``length`` transitions:

(a) **PGD**: the PGD diffusion model (``generator=pgd``'s, from the library's cache) samples
    trajectories whose action channels are guided by the target policy with λ = ``scale``;
(b) **unguided diffusion**: the same model, the same starting noise and churn draws, λ = 0;
(c) **dynamics ensemble**: the learned ensemble (``load_or_fit_dynamics``, cached) rolled out
    autoregressively under the target policy (its ``sample``: TD3+BC's deterministic π(s)), each step's
    next state drawn from a random elite, as the library's branched rollouts do;
(d) **ensemble + refiner**: the same rollouts with each step refined by the PDE-Refiner
    (`mbrl_offline.models.refiner`, ``refiner_steps``, ``refiner_sigma_min``, ``refiner_updates``;
    fitted on the data and cached), as ``generator.rollout.refiner.enabled=true`` runs them;
(e) **ensemble, UP-MPC actions** (``upmpc``): the same ensemble rollouts with each action chosen by
    COPlanner's UP-MPC among the target policy's samples (`mbrl_offline.generators.upmpc`, at its
    defaults), as ``generator.rollout.planner=upmpc`` chooses them. It needs a stochastic target policy
    (``policy=iql``, or a checkpoint's); a deterministic one is refused before any model is fitted.

For each generated (s_t, a_t, s_{t+1}) it measures the **one-step dynamics error**
‖s_{t+1} − f(s_t, a_t)‖₂, with f the true simulator reset to s_t (`TrueDynamics`: pendulum and the
MuJoCo envs hopper, walker2d, halfcheetah), by position t = 1 … ``length`` in the trajectory, and the
**target policy's log-likelihood** of the actions, log π(a_t | s_t) (the policy's ``log_prob``; for
TD3+BC the N(π(s), I) density PGD's code gives a deterministic actor).

It also measures the **long-horizon error**: each trajectory's actions are replayed open loop in the
true simulator from its start state, and at every step t the generated state is compared with the
simulator's, as the root mean square over the state's dimensions of their difference in units of the
dataset's per-dimension std. A trajectory stays **within the tolerance** up to step t while that
error has not exceeded ``tolerance`` at any step so far.

Wherever the learned ensemble is loaded (methods c-e), it also measures the ensemble's **model
uncertainty** u at every generated (s_t, a_t): COPlanner's, the mean over outputs of the std over the
members of one sample each, the quantity UP-MPC penalises (`model_uncertainty`).

It prints markdown tables: the mean one-step error at positions 1, 2, 4, 8, … and over all
positions, and the mean log-likelihood; and the mean long-horizon error at the same positions with
the share of trajectories within the tolerance at a quarter, half and all of the length; and, with
the ensemble loaded, the mean uncertainty u at the same positions. It writes a PNG (``out``; its folder
is checked before any work) of panels by position: the one-step error, the long-horizon error, the
share within the tolerance and (with the ensemble) the uncertainty u. ``main`` returns the measures,
by method (`measure`).

The target policy is a checkpoint's (``checkpoint=``, any agent with a log-probability) or one trained
here on the data for ``policy_updates`` updates (``policy``: td3bc, alpha 10, or iql, CORL's settings;
2×128 networks, γ 0.95: the settings of the library's pendulum learning tests). The models' sizes (``unet_base``,
``diffusion_steps``, ``sampler_steps``, ``dynamics_hidden``) default to small CPU sizes; at the
defaults the PGD model is ``generator=pgd budget=quick``'s (``diffusion_steps`` training steps, not the
paper's epochs), so training runs and this tool share the cached model.

Deviations from the paper's experiment (Jackson et al. 2024, whose protocol and numbers are not
public: only the abstract's claim of "a lower dynamics error than an offline world model baseline"
with comparable target-policy likelihood is):

* the start state is imposed on the diffusion samples by inpainting the first row's state channels
  at the start and after every denoising step (Diffuser's conditioning:
  `mbrl_offline.models.diffusion.KnownEntries`), where PGD's own generator samples unconditionally.
  The start state comes out exactly, but the model's second row follows it only loosely: the
  denoiser sees the clean entries scaled by c_in = 1/sqrt(σ² + 1), i.e. hardly at all while the
  trajectory takes shape at high noise. So the diffusion samples' first transition mostly measures the
  cost of this conditioning, and the table also gives the mean error from position 2 on. (Measured on
  pendulum at the defaults: the first transition's error is about 3 with the start imposed, 0.26 in
  unconditional samples; writing the known entries noised to the sampler's level, the replacement
  imputation of Song et al. 2021, and 128 sampler steps instead of 32 left it about 3.)
* the trajectories are not cut at terminations (no method's is), so on hopper and walker2d the later
  positions may follow states past a fall;
* with TD3+BC (deterministic) as the target, the ensemble's actions are π(s) exactly, so its
  log-likelihood is the density's maximum, −(act_dim/2) log 2π;
* the sizes are CPU sizes, and one seed.

Settings: mbrl_offline/configs/dynamics_error.yaml; ``--help`` lists them; ``--cfg job`` prints the
composed config and runs nothing.
"""
from __future__ import annotations

from pathlib import Path

from mbrl_offline.cli import cli_main, tool_config
from mbrl_offline.config import CONFIG_DIR

METHODS = ("PGD", "unguided diffusion", "dynamics ensemble", "ensemble + refiner", "ensemble, UP-MPC actions")
METHOD_KEYS = dict(zip(("pgd", "unguided", "ensemble", "refiner", "upmpc"), METHODS))  # the names ``methods=`` takes
# The target policies the tool trains itself (``policy=``): name -> (the name shown, the agent's class in
# `mbrl_offline.algorithms`, its settings beyond the class's defaults), at the settings of the library's
# pendulum learning tests (2x128 networks, gamma 0.95). TD3+BC's policy is deterministic; IQL's is a
# Gaussian actor, which UP-MPC can sample.
POLICIES = {
    "td3bc": ("TD3+BC", "TD3BC", {"alpha": 10.0, "hidden_size": 128, "gamma": 0.95}),
    "iql": ("IQL", "IQL", {"hidden_size": 128, "gamma": 0.95}),  # CORL's settings otherwise
}


# ------------------------------------------------------------------------------------------- the parts
def start_states(dataset, count: int, seed: int, device="cpu"):
    """``count`` observations of ``dataset`` drawn without replacement (with, if it has fewer), seeded."""
    import torch

    rng = torch.Generator().manual_seed(seed)
    n = len(dataset)
    index = torch.randperm(n, generator=rng)[:count] if count <= n else torch.randint(0, n, (count,), generator=rng)
    return torch.as_tensor(dataset.observations, device=device)[index.to(device)]


def train_policy(dataset, updates: int, seed: int, device="cpu", kind: str = "td3bc"):
    """A target policy trained on ``dataset`` alone for ``updates`` updates of its batch size, seeded:
    ``kind`` one of `POLICIES` (td3bc: alpha 10, a deterministic policy; iql: a Gaussian actor)."""
    import torch

    from mbrl_offline import algorithms
    from mbrl_offline.buffer import TRANSITION_FIELDS

    torch.manual_seed(seed)
    _, class_name, settings = POLICIES[kind]
    agent_cls = getattr(algorithms, class_name)
    config = agent_cls.config_class(**settings)
    agent = agent_cls.for_dataset(dataset, config, device)
    data = {k: torch.as_tensor(getattr(dataset, k), device=device) for k in TRANSITION_FIELDS}
    rng = torch.Generator(device=device).manual_seed(seed)
    for _ in range(updates):
        index = torch.randint(0, len(dataset), (config.batch_size,), generator=rng, device=device)
        agent.update({k: v[index] for k, v in data.items()})
    return agent


def diffusion_trajectories(generator, starts, guidance=None, seed: int = 0):
    """Trajectories of PGD's model from the start states ``starts`` (N, obs_dim): ``(observations
    (N, L, obs_dim), actions (N, L - 1, act_dim))`` for the generator's ``length`` L rows, guided by
    ``guidance`` (None: unguided). The same ``seed`` gives the same starting noise and churn draws."""
    import torch

    rng = torch.Generator(device=starts.device).manual_seed(seed)
    rows = generator.sample_trajectories(len(starts), guidance, rng, start_observations=starts)
    fields = generator.rows.decode(rows)
    return fields["observations"], fields["actions"][:, :-1]


def policy_rollouts(dynamics, policy, starts, length: int, seed: int = 0, refiner=None, planner=None):
    """Autoregressive rollouts of ``policy`` (its ``sample``) in ``dynamics`` (a `GaussianEnsembleDynamics`,
    each step from a random elite; or `TrueDynamics`) for ``length`` steps from ``starts``, never cut,
    each step refined by ``refiner`` (a `DynamicsRefiner`) where one is given, and each action chosen by
    COPlanner's UP-MPC among the policy's samples where ``planner`` (an `UPMPCConfig`) is given, as
    ``generator.rollout.planner=upmpc`` chooses them:
    ``(observations (N, length + 1, obs_dim), actions (N, length, act_dim))``."""
    import torch

    from mbrl_offline.generators.upmpc import upmpc_actions

    rng = torch.Generator(device=starts.device).manual_seed(seed)
    observations, actions = [starts], []
    with torch.no_grad():
        for _ in range(length):
            obs = observations[-1]
            if planner is None:
                act = policy.sample(obs)[0]
            else:
                act = upmpc_actions(dynamics, lambda o: policy.sample(o)[0], obs, planner, rng)
            actions.append(act)
            step = dynamics.step(obs, act, rng)
            if refiner is not None:
                step = refiner.refine(obs, act, step["next_observations"], step["rewards"], rng, samples=1)
            observations.append(step["next_observations"])
    return torch.stack(observations, 1), torch.stack(actions, 1)


def replay_errors(true_dynamics, observations, actions, scale):
    """The long-horizon error of trajectories ``observations`` (N, T + 1, obs_dim), ``actions`` (N, T, act_dim):
    their actions replayed open loop in the simulator from ``observations[:, 0]``, and at each step the
    RMS over dimensions of (generated − simulated state) / ``scale`` (the data's per-dimension std):
    ``(N, T)``."""
    import torch

    state, errors = observations[:, 0], []
    for t in range(actions.shape[1]):
        state, _ = true_dynamics.transition(state, actions[:, t])
        errors.append((((observations[:, t + 1] - state) / scale) ** 2).mean(-1).sqrt())
    return torch.stack(errors, 1)


def within_tolerance(errors, tolerance: float):
    """The share of trajectories whose error ``errors`` (N, T) has stayed at or below ``tolerance`` at every
    step up to t: ``(T,)``."""
    return (errors.cummax(dim=1).values <= tolerance).float().mean(0)


def one_step_errors(true_dynamics, observations, actions):
    """‖s_{t+1} − f(s_t, a_t)‖₂ for every transition of trajectories ``observations`` (N, T + 1, obs_dim),
    ``actions`` (N, T, act_dim), f the true simulator (`TrueDynamics.transition`): ``(N, T)``."""
    n, t = actions.shape[:2]
    obs = observations[:, :-1].reshape(n * t, -1)
    true_next, _ = true_dynamics.transition(obs, actions.reshape(n * t, -1))
    return (observations[:, 1:].reshape(n * t, -1) - true_next).norm(dim=-1).view(n, t)


def log_likelihoods(policy, observations, actions):
    """The policy's log π(a_t | s_t) of every transition: ``(N, T)``."""
    import torch

    n, t = actions.shape[:2]
    with torch.no_grad():
        return policy.log_prob(observations[:, :-1].reshape(n * t, -1), actions.reshape(n * t, -1)).view(n, t)


def model_uncertainty(dynamics, observations, actions, seed: int = 0):
    """COPlanner's model uncertainty u (`sampled_disagreement`: the mean over outputs of the std over all
    members of one sample each, the quantity UP-MPC penalises) of the learned ensemble ``dynamics`` at
    every (s_t, a_t) of trajectories ``observations`` (N, T + 1, obs_dim), ``actions`` (N, T, act_dim),
    with a seeded draw: ``(N, T)``."""
    import torch

    from mbrl_offline.models.uncertainty import sample_members, sampled_disagreement

    n, t = actions.shape[:2]
    rng = torch.Generator(device=actions.device).manual_seed(seed)
    with torch.no_grad():
        mean, logvar = dynamics.predict(observations[:, :-1].reshape(n * t, -1), actions.reshape(n * t, -1))
        return sampled_disagreement(sample_members(mean, logvar, rng)).view(n, t)


def measure(true_dynamics, policy, trajectories: dict, scale, dynamics=None, seed: int = 0) -> dict:
    """For each method's ``(observations, actions)``: ``{"error": (N, T), "log_prob": (N, T), "drift": (N, T)}``
    (one-step error, log-likelihood, long-horizon error in units of ``scale``) and, with the learned
    ensemble ``dynamics``, ``"uncertainty": (N, T)`` (`model_uncertainty`)."""
    results = {}
    for name, (obs, act) in trajectories.items():
        results[name] = {"error": one_step_errors(true_dynamics, obs, act), "log_prob": log_likelihoods(policy, obs, act),
                         "drift": replay_errors(true_dynamics, obs, act, scale)}
        if dynamics is not None:
            results[name]["uncertainty"] = model_uncertainty(dynamics, obs, act, seed)
    return results


def report_positions(length: int) -> list[int]:
    """Positions 1, 2, 4, 8, ... up to ``length`` (and ``length`` itself)."""
    positions, p = [], 1
    while p <= length:
        positions.append(p)
        p *= 2
    return positions if positions[-1] == length else positions + [length]


def markdown_table(results: dict) -> str:
    """The table: one row per method, the mean one-step error at `report_positions` (1-based: position 1
    is the transition from the start state), over all positions and over positions 2 on (the diffusion
    samples' first transition carries the cost of imposing the start state: see the module docstring),
    and the mean log-likelihood."""
    length = next(iter(results.values()))["error"].shape[1]
    positions = report_positions(length)
    head = ["method", *[f"error t={p}" for p in positions], "error mean", "error mean t≥2", "log π mean"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in results.items():
        by_position = r["error"].mean(0)
        later = r["error"][:, 1:].mean().item() if length > 1 else float("nan")
        cells = [name, *[f"{by_position[p - 1].item():.4f}" for p in positions], f"{r['error'].mean().item():.4f}",
                 f"{later:.4f}", f"{r['log_prob'].mean().item():.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def tolerance_positions(length: int) -> list[int]:
    """A quarter, half and all of the length (distinct, at least 1)."""
    return sorted({max(1, length // 4), max(1, length // 2), length})


def long_horizon_table(results: dict, tolerance: float) -> str:
    """The long-horizon table: one row per method, the mean long-horizon error at `report_positions` and
    the share of trajectories within ``tolerance`` at `tolerance_positions`."""
    length = next(iter(results.values()))["drift"].shape[1]
    positions, shares = report_positions(length), tolerance_positions(length)
    head = ["method", *[f"error t={p}" for p in positions], *[f"within {tolerance:g} to t={p}" for p in shares]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in results.items():
        by_position, share = r["drift"].mean(0), within_tolerance(r["drift"], tolerance)
        cells = [name, *[f"{by_position[p - 1].item():.4f}" for p in positions],
                 *[f"{share[p - 1].item():.0%}" for p in shares]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def uncertainty_table(results: dict) -> str:
    """The learned ensemble's uncertainty u at the methods' (s_t, a_t) (`model_uncertainty`): one row per
    method, its mean at `report_positions` and over all positions."""
    length = next(iter(results.values()))["uncertainty"].shape[1]
    positions = report_positions(length)
    head = ["method", *[f"u t={p}" for p in positions], "u mean"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in results.items():
        by_position = r["uncertainty"].mean(0)
        cells = [name, *[f"{by_position[p - 1].item():.4f}" for p in positions], f"{r['uncertainty'].mean().item():.4f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_errors(results: dict, path, tolerance: float, title: str = "") -> Path:
    """A PNG of three panels by position: each method's mean one-step error and mean long-horizon error (log
    scale, with their 25-75 % bands) and the share of its trajectories within ``tolerance``; and a fourth,
    the ensemble's uncertainty u (log scale, band), where the results have it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch

    keys = ("error", "drift", "uncertainty") if all("uncertainty" in r for r in results.values()) else ("error", "drift")
    fig, axes = plt.subplots(1, len(keys) + 1, figsize=(5.0 * (len(keys) + 1), 4.2), dpi=100)
    log_axes = [axes[0], axes[1], *axes[3:]]
    for name, r in results.items():
        for ax, key in zip(log_axes, keys):
            error = r[key].detach().cpu().double()
            positions = range(1, error.shape[1] + 1)
            ax.plot(positions, error.mean(0).numpy(), label=name, marker="." if error.shape[1] <= 64 else None)
            low, high = torch.quantile(error, torch.tensor([0.25, 0.75], dtype=error.dtype), dim=0).numpy()
            ax.fill_between(positions, low, high, alpha=0.15)
        share = within_tolerance(r["drift"].detach().cpu(), tolerance)
        axes[2].plot(range(1, len(share) + 1), share.numpy(), label=name)
    for ax, label in zip(axes, ("one-step error ‖s′ − f(s, a)‖", "long-horizon error (RMS, data stds)",
                                f"share within {tolerance:g} so far", "ensemble uncertainty u (COPlanner's)")):
        ax.set_xlabel("position t in the trajectory")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    for ax in log_axes:
        ax.set_yscale("log")
    axes[2].set_ylim(-0.02, 1.02)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{title}\nmean over the trajectories, band: 25-75 %" if title else "mean, band: 25-75 %",
                 fontsize=9)
    fig.tight_layout()
    from mbrl_offline.utils import save_figure

    try:
        return save_figure(fig, Path(path))
    finally:
        plt.close(fig)


# ------------------------------------------------------------------------------------------- the tool
def check_settings(cfg) -> None:
    """Every setting, each refused in one line (`ConfigError`), before any data is read or model fitted."""
    from types import SimpleNamespace

    from mbrl_offline.config import check_device, check_writable_dir, require_nonnegative, require_positive
    from mbrl_offline.errors import ConfigError

    whole = ("policy_updates", "starts", "length", "unet_base", "diffusion_steps", "sampler_steps", "dynamics_hidden",
             "dynamics_max_epochs", "refiner_steps", "refiner_updates", "seed")
    for name in whole:
        value = cfg.get(name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name} = {value!r} must be a whole number.")
    top = SimpleNamespace(**{k: cfg[k] for k in whole})
    require_positive(top, *[k for k in whole if k not in ("seed", "policy_updates")], section="")
    require_nonnegative(top, "seed", "policy_updates", section="")
    if cfg.unet_base < 16 or cfg.unet_base % 8:
        raise ConfigError(f"unet_base = {cfg.unet_base} must be a multiple of 8 (the U-Net's GroupNorm groups) "
                          f"and at least 16.")
    if cfg.length < 3:
        raise ConfigError(f"length = {cfg.length} must be at least 3 transitions (the U-Net needs 4 rows).")
    if isinstance(cfg.scale, bool) or not isinstance(cfg.scale, (int, float)):
        raise ConfigError(f"scale = {cfg.scale!r} must be a number (λ, PGD's guidance coefficient).")
    threads = cfg.torch_threads
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 0):
        raise ConfigError(f"torch_threads = {threads!r} must be a whole number >= 0 (or null: torch's default).")
    check_device(cfg.device)
    out = Path(str(cfg.out or ""))
    if not str(cfg.out or "").strip() or out.suffix.lower() != ".png":
        raise ConfigError(f"out = {cfg.out!r} must name a .png file, e.g. out=dynamics_error.png.")
    if out.is_dir():
        raise ConfigError(f"out={out} is a folder; name a .png file.")
    check_writable_dir(out.parent if str(out.parent) else Path("."), "out")
    if cfg.policy not in POLICIES:
        raise ConfigError(f"policy = {cfg.policy!r} must be one of {', '.join(POLICIES)} (the target policy trained "
                          f"here when no checkpoint= is given).")
    if cfg.checkpoint is None and cfg.policy_updates == 0:
        raise ConfigError("policy_updates = 0 trains no policy; give policy_updates >= 1 or a checkpoint=.")
    methods = cfg.methods
    if isinstance(methods, str) or not hasattr(methods, "__len__") or not len(methods) or \
            any(m not in METHOD_KEYS for m in methods) or len(set(methods)) != len(methods):
        raise ConfigError(f"methods = {methods!r} must be a list of distinct names from {', '.join(METHOD_KEYS)}, "
                          f"e.g. methods=[ensemble,refiner].")
    if isinstance(cfg.tolerance, bool) or not isinstance(cfg.tolerance, (int, float)) or not cfg.tolerance > 0:
        raise ConfigError(f"tolerance = {cfg.tolerance!r} must be a number above 0 (the long-horizon error, in "
                          f"data stds, that a trajectory stays within).")
    sigma_min = cfg.refiner_sigma_min
    if isinstance(sigma_min, bool) or not isinstance(sigma_min, (int, float)) or not 0 < sigma_min < 1:
        raise ConfigError(f"refiner_sigma_min = {sigma_min!r} must be a number in (0, 1) (the refiner's last noise "
                          f"std, in target stds).")


def target_policy(cfg, dataset, env, device):
    """The checkpoint's policy (its env must be the data's), or TD3+BC trained here: ``(policy, what)``."""
    from mbrl_offline.errors import ConfigError

    if cfg.checkpoint:
        from mbrl_offline.algorithms import load_policy

        agent, state = load_policy(cfg.checkpoint, device)
        if getattr(agent, "recurrent", False):
            raise ConfigError(f"checkpoint={cfg.checkpoint} holds a {state['algorithm']} policy, which is recurrent "
                              f"(it acts on histories), and this tool rolls out and scores feed-forward policies "
                              f"of the state alone; give a feed-forward checkpoint (td3bc, iql, ravl, mopo, mobile, "
                              f"coplanner), or leave checkpoint unset to train TD3+BC here.")
        if state["env"] != env.name:
            raise ConfigError(f"checkpoint={cfg.checkpoint} holds a {state['env']} policy, not one for {env.name}; "
                              f"use env={state['env']}.")
        return agent, f"{state['algorithm']} from {cfg.checkpoint} (epoch {state['epoch']})"
    name = POLICIES[cfg.policy][0]
    return train_policy(dataset, cfg.policy_updates, cfg.seed, device, cfg.policy), f"{name}, {cfg.policy_updates} updates"


def require_stochastic(policy, starts, what: str) -> None:
    """Refuse (`ConfigError`) a target policy whose ``sample`` gives the same actions twice: UP-MPC chooses
    among sampled candidates, and a deterministic policy's are all the same action."""
    import torch

    from mbrl_offline.errors import ConfigError

    with torch.no_grad():
        if torch.equal(policy.sample(starts)[0], policy.sample(starts)[0]):
            raise ConfigError(f"methods has upmpc, but the target policy ({what}) is deterministic, so UP-MPC's "
                              f"candidates would all be one action; use policy=iql (a Gaussian actor) or the "
                              f"checkpoint= of a stochastic policy (ravl, mopo, mobile, coplanner, iql).")


@cli_main
def main(argv: list[str]) -> dict:
    import dataclasses

    import torch

    from mbrl_offline import load_dataset
    from mbrl_offline.data.envs import get_env_info
    from mbrl_offline.generators.upmpc import UPMPCConfig
    from mbrl_offline.generators.pgd import (PGDGenerator, PGDGeneratorConfig, PGDGuidanceConfig, UNetConfig,
                                             policy_guidance, require_log_prob)
    from mbrl_offline.models.dynamics import DynamicsConfig, load_or_fit_dynamics
    from mbrl_offline.models.refiner import RefinerConfig, load_or_fit_refiner
    from mbrl_offline.models.true_dynamics import TrueDynamics

    cfg = tool_config(argv, __doc__, CONFIG_DIR, "dynamics_error")
    check_settings(cfg)
    env = get_env_info(cfg.env.name)
    true_dynamics = TrueDynamics(env.name)  # refuses an env without a true-dynamics stepper, before any work
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    device = torch.device(cfg.device)
    dataset = load_dataset(cfg.env.dataset or env.default_dataset, env=env.name)
    print(f"{dataset.source}: {len(dataset)} transitions; {cfg.starts} start states, {cfg.length} steps", flush=True)

    policy, what = target_policy(cfg, dataset, env, device)
    chosen = [METHOD_KEYS[m] for m in cfg.methods]
    methods = [m for m in METHODS if m in chosen]  # in the tables' fixed order
    diffusion = {METHODS[0], METHODS[1]} & set(methods)
    starts = start_states(dataset, cfg.starts, cfg.seed, device)
    if METHODS[4] in methods:  # before any model is fitted
        require_stochastic(policy, starts, what)
    if diffusion:
        default = PGDGeneratorConfig()  # generator=pgd's, with this tool's sizes (train_epochs None: the steps count)
        pgd = dataclasses.replace(
            default, unet=UNetConfig(base=cfg.unet_base), edm=dataclasses.replace(default.edm, steps=cfg.sampler_steps),
            train=dataclasses.replace(default.train, steps=cfg.diffusion_steps), train_epochs=None,
            length=cfg.length + 1, trajectories=cfg.starts, sample_batch=min(cfg.starts, 256),
            guidance=PGDGuidanceConfig(scale=cfg.scale))
        generator = PGDGenerator.for_dataset(pgd, dataset, device)
        require_log_prob(policy, generator.rows, "the target policy's log-likelihood")
    torch.manual_seed(cfg.seed)
    dynamics = refiner = None
    if {METHODS[2], METHODS[3], METHODS[4]} & set(methods):
        dynamics, _ = load_or_fit_dynamics(dataset, DynamicsConfig(hidden_size=cfg.dynamics_hidden,
                                                                   max_epochs=cfg.dynamics_max_epochs, seed=cfg.seed),
                                           device=device)
    if METHODS[3] in methods:
        refiner, _ = load_or_fit_refiner(dataset, RefinerConfig(enabled=True, steps=cfg.refiner_steps,
                                                                sigma_min=cfg.refiner_sigma_min,
                                                                updates=cfg.refiner_updates, seed=cfg.seed),
                                         device=device)

    make = {
        METHODS[0]: lambda: diffusion_trajectories(generator, starts, policy_guidance(
            policy, generator.rows, generator.model.normalizer, pgd.guidance), cfg.seed),
        METHODS[1]: lambda: diffusion_trajectories(generator, starts, None, cfg.seed),
        METHODS[2]: lambda: policy_rollouts(dynamics, policy, starts, cfg.length, cfg.seed),
        METHODS[3]: lambda: policy_rollouts(dynamics, policy, starts, cfg.length, cfg.seed, refiner),
        METHODS[4]: lambda: policy_rollouts(dynamics, policy, starts, cfg.length, cfg.seed, planner=UPMPCConfig()),
    }
    trajectories = {name: make[name]() for name in methods}
    scale = torch.as_tensor(dataset.observations, device=device).std(0).clamp_min(1e-6)
    results = measure(true_dynamics, policy, trajectories, scale, dynamics, cfg.seed)
    sizes = []
    if diffusion:
        sizes.append(f"PGD λ = {cfg.scale}; U-Net base {cfg.unet_base}, {cfg.diffusion_steps} training steps, "
                     f"{cfg.sampler_steps} sampler steps")
    if dynamics is not None:
        sizes.append(f"ensemble width {cfg.dynamics_hidden}")
    if METHODS[4] in methods:
        sizes.append("UP-MPC at COPlanner's defaults (K = 5, H_p = 5, alpha_c = 2)")
    if refiner is not None:
        sizes.append(f"refiner K = {cfg.refiner_steps}, σ_min = {cfg.refiner_sigma_min:g}, "
                     f"{cfg.refiner_updates} updates")
    print(f"\nTarget policy: {what}. {'; '.join(sizes)}; seed {cfg.seed}.\n")
    print(markdown_table(results))
    print(f"\nLong-horizon error (the actions replayed in the simulator; RMS over dimensions, in data stds) and "
          f"the share of trajectories within {cfg.tolerance:g}:\n")
    print(long_horizon_table(results, cfg.tolerance))
    if dynamics is not None:
        print("\nThe ensemble's uncertainty u (COPlanner's: the mean over outputs of the members' std) at each "
              "method's (s_t, a_t):\n")
        print(uncertainty_table(results))
    guided = f", λ = {cfg.scale}" if diffusion else ""
    title = f"{dataset.source}: {cfg.starts} starts{guided}, target {what.split(' from ')[0]}, seed {cfg.seed}"
    print(f"\nwrote {plot_errors(results, cfg.out, cfg.tolerance, title)}")
    return results


if __name__ == "__main__":
    main()
