"""Evaluate a trained policy: `mbrl-evaluate checkpoint=runs/ravl-hopper-seed0/checkpoint.pt`.

Runs the deterministic policy in the real env and prints the mean return and D4RL-normalised score, and
the value at risk and conditional value at risk of the returns at ``risk_level``
(`mbrl_offline.evaluation.risk_measures`).
With ``adjust=cdsa`` it evaluates the policy a second time, on the same episodes, with its actions
adjusted by CDSA (`mbrl_offline.adjust`; settings ``cdsa.*``), whose models are fitted on the
checkpoint's own dataset (or loaded from the cache), and prints both.
Settings: ``episodes=10`` (at least 1), ``seed=0`` (at least 0), ``risk_level=0.1`` (in (0, 1)),
``adjust=none`` (or ``cdsa``), ``device=cpu`` (one this machine has);
each is checked before the checkpoint is read (mbrl_offline/configs/evaluate.yaml). ``--help`` lists them;
``--cfg job`` prints the composed config and evaluates nothing. ``-m`` evaluates a grid, as Hydra's
multirun does (``-m checkpoint=runs/a/checkpoint.pt,runs/b/checkpoint.pt seed=0,1``), through Hydra's
launcher (``hydra/launcher=``; see ``mbrl-train``'s help).
"""

from mbrl_offline.cli import cli_main, tool_runs
from mbrl_offline.config import CONFIG_DIR


def check(cfg) -> None:
    """The settings, each checked before the checkpoint is read."""
    from mbrl_offline.adjust import CDSAConfig, check_adjust
    from mbrl_offline.config import check_device, config_to_dataclass, require_nonnegative, require_positive
    from mbrl_offline.errors import ConfigError
    from mbrl_offline.evaluation import check_risk_level

    if not cfg.checkpoint:
        raise ConfigError("give the checkpoint to evaluate: checkpoint=runs/<run>/checkpoint.pt")
    require_positive(cfg, "episodes", section="")
    require_nonnegative(cfg, "seed", section="")
    if not isinstance(cfg.seed, int):
        raise ConfigError(f"seed = {cfg.seed!r} must be a whole number of at least 0.")
    check_risk_level(cfg.risk_level)
    check_adjust(cfg.adjust)
    config_to_dataclass(CDSAConfig, cfg.cdsa, "cdsa")
    check_device(cfg.device)


def run(cfg) -> None:
    """One evaluation of a composed, checked ``evaluate`` config."""
    from mbrl_offline.adjust import AdjustedEpisodePolicy, CDSA, CDSAConfig
    from mbrl_offline.algorithms import load_policy
    from mbrl_offline.config import config_to_dataclass
    from mbrl_offline.data.envs import get_env_info
    from mbrl_offline.evaluation import evaluate_policy

    cdsa = config_to_dataclass(CDSAConfig, cfg.cdsa, "cdsa")
    agent, state = load_policy(cfg.checkpoint, cfg.device)
    env = get_env_info(state["env"])
    adjuster = None
    if cfg.adjust == "cdsa":
        low, high = env.action_bounds()
        adjuster = CDSA.for_dataset(cdsa, checkpoint_dataset(cfg.checkpoint, state), low, high, cfg.device)
    policy = agent.episode_policy(deterministic=True)
    result = evaluate_policy(policy, env, cfg.episodes, cfg.seed, cfg.risk_level)
    what = f"{state['algorithm']} on {env.gym_id}, epoch {state['epoch']}, {cfg.episodes} episodes"
    print(f"{what}: {summary(result, cfg.risk_level)}")
    if adjuster is not None:
        adjusted = evaluate_policy(AdjustedEpisodePolicy(policy, adjuster), env, cfg.episodes, cfg.seed,
                                   cfg.risk_level)
        print(f"{what}, adjusted by CDSA: {summary(adjusted, cfg.risk_level)}")


@cli_main
def main(argv: list[str]) -> None:
    tool_runs("evaluate", argv, __doc__, CONFIG_DIR, "evaluate", run, check)


def summary(result: dict, risk_level: float) -> str:
    return (f"return {result['return_mean']:.1f} ± {result['return_std']:.1f}, "
            f"normalised score {result['normalized_score']:.1f} ± {result['normalized_score_std']:.1f}; "
            f"at risk level {risk_level:g}: value at risk {result['return_var']:.1f} "
            f"(score {result['normalized_score_var']:.1f}), conditional value at risk {result['return_cvar']:.1f} "
            f"(score {result['normalized_score_cvar']:.1f})")


def checkpoint_dataset(checkpoint, state: dict):
    """The dataset a checkpoint was trained on (its recorded source, checked by fingerprint); a missing
    record, or data that cannot be read or has changed, is one `ConfigError` line."""
    from mbrl_offline import load_dataset
    from mbrl_offline.errors import ConfigError, DatasetError

    record = state.get("dataset")
    if not isinstance(record, dict) or "source" not in record:
        raise ConfigError(f"{checkpoint} records no dataset, and adjust=cdsa fits its models on the run's data; "
                          f"evaluate a checkpoint written by a training run, or set adjust=none.")
    try:
        dataset = load_dataset(record["source"], env=state["env"])
    except (DatasetError, OSError, ValueError) as exc:
        raise ConfigError(f"the dataset {checkpoint} was trained on, {record['source']}, cannot be read "
                          f"({str(exc).splitlines()[0]}); adjust=cdsa fits its models on it: put the data back, or "
                          f"set adjust=none.") from None
    if record.get("fingerprint") and dataset.fingerprint() != record["fingerprint"]:
        raise ConfigError(f"{record['source']} has changed since {checkpoint} was trained on it; adjust=cdsa fits "
                          f"its models on the run's data: put the original back, or set adjust=none.")
    return dataset


if __name__ == "__main__":
    main()
