"""NEUBAY's bandit illustration: an unpenalised Bayesian agent tries the arm the data never pulled and keeps
it where it pays more; agents penalised for uncertainty never try it (Ni et al. 2025, Section 3, Figure 3).

    mbrl-bandit               # CPU sizes, penalties 0, 0.1, 0.5, 2.5
    mbrl-bandit penalties=[0,2.5] seed=1 out=bandit_seed1.png
    mbrl-bandit bandit=paper  # the official sizes (20,000 updates, width 256)

A two-armed Bernoulli bandit, 100 pulls an episode. The offline data are 10 episodes of pulling arm 0
(which pays 1 with probability 0.5); a 128-member reward ensemble fitted to them is the posterior (its
100 best members, by holdout NLL). For each penalty λ a recurrent dueling double-DQN agent (NEUBAY's LRU
history encoder) is trained in rollouts of the ensemble, each rollout playing one member, with the
reward μ + εσ − λ·U (U: the members' disagreement on the pulled arm). The agents are evaluated
greedily, 20 episodes each, on bandits paying 0.5 on arm 0 and p1 ∈ {0.01, 0.15, 0.3, 0.45, 0.55,
0.7, 0.85, 0.99} on arm 1. The tool prints a markdown table of the final evaluation (return per pull
and, in parentheses, the share of pulls of the better arm) and writes a PNG of return per pull against
updates, one panel per p1, one curve per penalty (``out``; its folder is checked before any work).

The bandit, the reward ensemble, the agent and its training are in
mbrl_offline/experiments/bandit_parts.py, whose docstring gives the official details and the deviations;
docs/bandit.md has measured results and their times. ``bandit=cpu`` (the default) is sized for
2 CPU cores; ``bandit=paper`` has the official sizes; ``bandit.<field>=value`` sets any field of
BanditConfig.

Settings: mbrl_offline/configs/bandit.yaml and mbrl_offline/configs/bandit/; ``--help`` lists them;
``--cfg job`` prints the composed config and runs nothing.
"""
from __future__ import annotations

from pathlib import Path

from mbrl_offline.cli import cli_main, tool_config
from mbrl_offline.config import CONFIG_DIR


def check_settings(cfg):
    """The BanditConfig and every top-level setting, each refused in one line (`ConfigError`), before any
    work."""
    from mbrl_offline.experiments.bandit_parts import BanditConfig
    from mbrl_offline.config import check_device, check_writable_dir, config_to_dataclass
    from mbrl_offline.errors import ConfigError

    config = config_to_dataclass(BanditConfig, cfg.bandit, "bandit").validate()
    penalties = cfg.penalties
    if isinstance(penalties, str) or not hasattr(penalties, "__len__") or not len(penalties):
        raise ConfigError(f"penalties = {penalties!r} must be a non-empty list of numbers, e.g. penalties=[0,2.5].")
    for p in penalties:
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not p >= 0 or p == float("inf"):
            raise ConfigError(f"penalties = {list(penalties)}: each must be a finite number >= 0, got {p!r}.")
    if len(set(float(p) for p in penalties)) != len(penalties):
        raise ConfigError(f"penalties = {list(penalties)} repeats a penalty.")
    if isinstance(cfg.seed, bool) or not isinstance(cfg.seed, int) or cfg.seed < 0:
        raise ConfigError(f"seed = {cfg.seed!r} must be a whole number >= 0.")
    threads = cfg.torch_threads
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 0):
        raise ConfigError(f"torch_threads = {threads!r} must be a whole number >= 0 (or null: torch's default).")
    device = check_device(cfg.device)
    out = Path(str(cfg.out or ""))
    if not str(cfg.out or "").strip() or out.suffix.lower() != ".png":
        raise ConfigError(f"out = {cfg.out!r} must name a .png file, e.g. out=bandit.png.")
    if out.is_dir():
        raise ConfigError(f"out={out} is a folder; name a .png file.")
    check_writable_dir(out.parent if str(out.parent) else Path("."), "out")
    return config, [float(p) for p in penalties], device


@cli_main
def main(argv: list[str]) -> None:
    import time

    import torch

    from mbrl_offline.experiments.bandit_parts import plot_results, results_table, run_bandit

    cfg = tool_config(argv, __doc__, CONFIG_DIR, "bandit")
    config, penalties, device = check_settings(cfg)
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    start = time.perf_counter()
    results = run_bandit(config, penalties, cfg.seed, device, log=lambda line: print(line, flush=True))
    minutes = (time.perf_counter() - start) / 60
    print(f"\nFinal evaluation after {config.updates} updates (seed {cfg.seed}, {minutes:.1f} min on "
          f"{torch.get_num_threads()} thread(s)): return per pull, and in parentheses the share of pulls of the "
          f"better arm, on bandits paying {config.known_p:g} on arm 0 and p1 on arm 1 ({config.eval_episodes} "
          f"greedy episodes of {config.horizon} pulls each).\n")
    print(results_table(results))
    title = (f"NEUBAY bandit: return/T by penalty, seed {cfg.seed}, {config.updates} updates, "
             f"LRU {config.d_model}/{config.d_hidden}")
    print(f"\nwrote {plot_results(results, cfg.out, title)}")


if __name__ == "__main__":
    main()
