"""PGD's claim, measured: one-step dynamics error and target-policy likelihood of policy-guided
diffusion, unguided diffusion and dynamics-ensemble rollouts from the same start states.

    mbrl-dynamics-error  # pendulum-medium, TD3+BC trained here
    mbrl-dynamics-error env=hopper starts=128 scale=0.3 out=hopper_error.png
    mbrl-dynamics-error checkpoint=runs/td3bc-pendulum-seed0/checkpoint.pt

From the same ``starts`` start states (drawn from the data with ``seed``) and for the same target
policy, three methods make trajectories of ``length`` transitions:

(a) **PGD**: the PGD diffusion model (``generator=pgd``'s, from the library's cache) samples
    trajectories whose action channels are guided by the target policy with λ = ``scale``;
(b) **unguided diffusion**: the same model, the same starting noise and churn draws, λ = 0;
(c) **dynamics ensemble**: the learned ensemble (``load_or_fit_dynamics``, cached) rolled out
    autoregressively under the target policy (its ``sample``: TD3+BC's deterministic π(s)), each step's
    next state drawn from a random elite, as the library's branched rollouts do.

For each generated (s_t, a_t, s_{t+1}) it measures the **one-step dynamics error**
‖s_{t+1} − f(s_t, a_t)‖₂, with f the true simulator reset to s_t (`TrueDynamics`: pendulum and the
MuJoCo envs hopper, walker2d, halfcheetah), by position t = 1 … ``length`` in the trajectory, and the
**target policy's log-likelihood** of the actions, log π(a_t | s_t) (the policy's ``log_prob``; for
TD3+BC the N(π(s), I) density PGD's code gives a deterministic actor). It prints a markdown table
(the mean error at positions 1, 2, 4, 8, … and over all positions, and the mean log-likelihood) and
writes a PNG of the mean error by position (``out``; its folder is checked before any work).

The target policy is a checkpoint's (``checkpoint=``, any agent with a log-probability) or a TD3+BC
agent trained here on the data for ``policy_updates`` updates (alpha 10, 2×128 networks, γ 0.95: the
settings of the library's pendulum learning test). The models' sizes (``unet_base``,
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

METHODS = ("PGD", "unguided diffusion", "dynamics ensemble")


# ------------------------------------------------------------------------------------------- the parts
def start_states(dataset, count: int, seed: int, device="cpu"):
    """``count`` observations of ``dataset`` drawn without replacement (with, if it has fewer), seeded."""
    import torch

    rng = torch.Generator().manual_seed(seed)
    n = len(dataset)
    index = torch.randperm(n, generator=rng)[:count] if count <= n else torch.randint(0, n, (count,), generator=rng)
    return torch.as_tensor(dataset.observations, device=device)[index.to(device)]


def train_td3bc(dataset, updates: int, seed: int, device="cpu"):
    """A TD3+BC agent trained on ``dataset`` alone for ``updates`` updates (batch 256, alpha 10, 2x128
    networks, gamma 0.95), seeded."""
    import torch

    from mbrl_offline.algorithms import TD3BC, TD3BCConfig
    from mbrl_offline.buffer import TRANSITION_FIELDS

    torch.manual_seed(seed)
    config = TD3BCConfig(alpha=10.0, hidden_size=128, gamma=0.95)
    agent = TD3BC.for_dataset(dataset, config, device)
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


def policy_rollouts(dynamics, policy, starts, length: int, seed: int = 0):
    """Autoregressive rollouts of ``policy`` (its ``sample``) in ``dynamics`` (a `GaussianEnsembleDynamics`,
    each step from a random elite; or `TrueDynamics`) for ``length`` steps from ``starts``, never cut:
    ``(observations (N, length + 1, obs_dim), actions (N, length, act_dim))``."""
    import torch

    rng = torch.Generator(device=starts.device).manual_seed(seed)
    observations, actions = [starts], []
    with torch.no_grad():
        for _ in range(length):
            act = policy.sample(observations[-1])[0]
            actions.append(act)
            observations.append(dynamics.step(observations[-1], act, rng)["next_observations"])
    return torch.stack(observations, 1), torch.stack(actions, 1)


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


def measure(true_dynamics, policy, trajectories: dict) -> dict:
    """For each method's ``(observations, actions)``: ``{"error": (N, T), "log_prob": (N, T)}``."""
    return {name: {"error": one_step_errors(true_dynamics, obs, act), "log_prob": log_likelihoods(policy, obs, act)}
            for name, (obs, act) in trajectories.items()}


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


def plot_errors(results: dict, path, title: str = "") -> Path:
    """A PNG of each method's mean one-step error by position (log scale), with its 25-75 % band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch

    fig, ax = plt.subplots(figsize=(7.0, 4.2), dpi=100)
    for name, r in results.items():
        error = r["error"].detach().cpu().double()
        positions = range(1, error.shape[1] + 1)
        ax.plot(positions, error.mean(0).numpy(), label=name, marker=".")
        low, high = torch.quantile(error, torch.tensor([0.25, 0.75], dtype=error.dtype), dim=0).numpy()
        ax.fill_between(positions, low, high, alpha=0.15)
    ax.set_yscale("log")
    ax.set_xlabel("position t in the trajectory")
    ax.set_ylabel("one-step error ‖s′ − f(s, a)‖")
    ax.set_title(f"{title}\nmean over the trajectories, band: 25-75 %" if title else "mean, band: 25-75 %", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
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
             "dynamics_max_epochs", "seed")
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
    if cfg.checkpoint is None and cfg.policy_updates == 0:
        raise ConfigError("policy_updates = 0 trains no policy; give policy_updates >= 1 or a checkpoint=.")


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
    return train_td3bc(dataset, cfg.policy_updates, cfg.seed, device), f"TD3+BC, {cfg.policy_updates} updates"


@cli_main
def main(argv: list[str]) -> None:
    import dataclasses

    import torch

    from mbrl_offline import load_dataset
    from mbrl_offline.data.envs import get_env_info
    from mbrl_offline.generators.pgd import (PGDGenerator, PGDGeneratorConfig, PGDGuidanceConfig, UNetConfig,
                                             policy_guidance, require_log_prob)
    from mbrl_offline.models.dynamics import DynamicsConfig, load_or_fit_dynamics
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
    default = PGDGeneratorConfig()  # generator=pgd's, with this tool's sizes (train_epochs None: the steps count)
    pgd = dataclasses.replace(
        default, unet=UNetConfig(base=cfg.unet_base), edm=dataclasses.replace(default.edm, steps=cfg.sampler_steps),
        train=dataclasses.replace(default.train, steps=cfg.diffusion_steps), train_epochs=None, length=cfg.length + 1,
        trajectories=cfg.starts, sample_batch=min(cfg.starts, 256), guidance=PGDGuidanceConfig(scale=cfg.scale))
    generator = PGDGenerator.for_dataset(pgd, dataset, device)
    require_log_prob(policy, generator.rows, "the target policy's log-likelihood")
    torch.manual_seed(cfg.seed)
    dynamics, _ = load_or_fit_dynamics(dataset, DynamicsConfig(hidden_size=cfg.dynamics_hidden,
                                                               max_epochs=cfg.dynamics_max_epochs, seed=cfg.seed),
                                       device=device)

    starts = start_states(dataset, cfg.starts, cfg.seed, device)
    guidance = policy_guidance(policy, generator.rows, generator.model.normalizer, pgd.guidance)
    trajectories = {
        METHODS[0]: diffusion_trajectories(generator, starts, guidance, cfg.seed),
        METHODS[1]: diffusion_trajectories(generator, starts, None, cfg.seed),
        METHODS[2]: policy_rollouts(dynamics, policy, starts, cfg.length, cfg.seed),
    }
    results = measure(true_dynamics, policy, trajectories)
    print(f"\nTarget policy: {what}. PGD λ = {cfg.scale}; U-Net base {cfg.unet_base}, {cfg.diffusion_steps} training "
          f"steps, {cfg.sampler_steps} sampler steps; ensemble width {cfg.dynamics_hidden}; seed {cfg.seed}.\n")
    print(markdown_table(results))
    title = (f"{dataset.source}: {cfg.starts} starts, λ = {cfg.scale}, target {what.split(' from ')[0]}, "
             f"seed {cfg.seed}")
    print(f"\nwrote {plot_errors(results, cfg.out, title)}")


if __name__ == "__main__":
    main()
