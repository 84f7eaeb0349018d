"""Evaluate a trained policy: `mbrl-evaluate checkpoint=runs/ravl-hopper-seed0/checkpoint.pt`.

Runs the deterministic policy in the real env and prints the mean return and D4RL-normalised score, and
the value at risk and conditional value at risk of the returns at ``risk_level``
(`mbrl_offline.evaluation.risk_measures`).
Settings: ``episodes=10`` (at least 1), ``seed=0`` (at least 0), ``risk_level=0.1`` (in (0, 1)),
``device=cpu`` (one this machine has);
each is checked before the checkpoint is read (mbrl_offline/configs/evaluate.yaml). ``--help`` lists them;
``--cfg job`` prints the composed config and evaluates nothing.
"""

from mbrl_offline.cli import cli_main, tool_config
from mbrl_offline.config import CONFIG_DIR


@cli_main
def main(argv: list[str]) -> None:
    from mbrl_offline.algorithms import load_policy
    from mbrl_offline.config import check_device, require_nonnegative, require_positive
    from mbrl_offline.data.envs import get_env_info
    from mbrl_offline.errors import ConfigError
    from mbrl_offline.evaluation import check_risk_level, evaluate_policy

    cfg = tool_config(argv, __doc__, CONFIG_DIR, "evaluate")
    if not cfg.checkpoint:
        raise ConfigError("give the checkpoint to evaluate: checkpoint=runs/<run>/checkpoint.pt")
    require_positive(cfg, "episodes", section="")
    require_nonnegative(cfg, "seed", section="")
    if not isinstance(cfg.seed, int):
        raise ConfigError(f"seed = {cfg.seed!r} must be a whole number of at least 0.")
    check_risk_level(cfg.risk_level)
    check_device(cfg.device)
    agent, state = load_policy(cfg.checkpoint, cfg.device)
    env = get_env_info(state["env"])
    result = evaluate_policy(agent.episode_policy(deterministic=True), env, cfg.episodes, cfg.seed, cfg.risk_level)
    print(f"{state['algorithm']} on {env.gym_id}, epoch {state['epoch']}, {cfg.episodes} episodes: "
          f"return {result['return_mean']:.1f} ± {result['return_std']:.1f}, "
          f"normalised score {result['normalized_score']:.1f} ± {result['normalized_score_std']:.1f}; "
          f"at risk level {cfg.risk_level:g}: value at risk {result['return_var']:.1f} "
          f"(score {result['normalized_score_var']:.1f}), conditional value at risk {result['return_cvar']:.1f} "
          f"(score {result['normalized_score_cvar']:.1f})")


if __name__ == "__main__":
    main()
