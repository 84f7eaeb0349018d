"""Budgets from Python read the same files as the command line (`mbrl_offline.compose.run_configs`,
``build_run(..., budget=)``), so the same run from Python and from the command line is the same run."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mbrl_offline import build_run, load_dataset
from mbrl_offline.config_files import compose, train_sections
from mbrl_offline.config import CONFIG_DIR
from mbrl_offline.compose import run_configs
from mbrl_offline.errors import InputTypeError
from mbrl_offline.generators import RolloutGeneratorConfig, SyntherGeneratorConfig
from mbrl_offline.trainer import TrainerConfig

ROOT = Path(__file__).resolve().parent.parent


def test_run_configs_are_the_command_lines():
    for choices in (["algo=iql", "generator=synther", "budget=quick"], ["algo=neubay", "budget=quick"],
                    ["algo=td3bc", "budget=paper"], ["algo=mopo", "generator=ravl", "budget=quick"]):
        values = dict(c.split("=") for c in choices)
        expected = train_sections(compose(CONFIG_DIR, "train", choices))[1:]
        assert run_configs(values["algo"], values["budget"], values.get("generator")) == expected
    algo, generator, trainer = run_configs("iql", "quick", "synther")
    assert isinstance(generator, SyntherGeneratorConfig) and generator.samples == 20_000  # the quick budget's
    assert (trainer.epochs, trainer.updates_per_epoch) == (40, 1000)  # its setting for algo.name=iql
    assert run_configs("iql", "quick", overrides=["trainer.epochs=3"])[2].epochs == 3


def test_build_run_takes_a_budget_for_the_sections_it_is_not_given(tmp_path):
    data = load_dataset("pendulum-medium")
    trainer = build_run("td3bc", data, budget="quick", trainer_config=TrainerConfig(run_dir=str(tmp_path / "a")))
    assert trainer.config.run_dir == str(tmp_path / "a")  # given: used as it is
    quick = build_run("td3bc", data, budget="quick")
    assert (quick.config.epochs, quick.config.run_dir) == (40, "runs/td3bc-pendulum-seed0")  # the budget's
    assert build_run("td3bc", data).config.epochs == 1000  # budget paper, the command line's default
    with pytest.raises(InputTypeError, match="budget must be a budget's name"):
        build_run("td3bc", data, budget={"name": "quick"})


@pytest.mark.extended
def test_the_same_run_from_python_and_the_command_line_gives_identical_metrics(tmp_path):
    """IQL on model rollouts under the quick budget, shortened the same way on both sides, on as many
    threads; the model is fitted once (by the command line) and read from the same cache by Python."""
    cache = tmp_path / "cache"
    short = dict(epochs=2, updates_per_epoch=150, eval_every=1, eval_episodes=2, checkpoint_every=1, tensorboard=False)
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "train.py"), "algo=iql", "generator=rollouts", "env=pendulum",
         "budget=quick", f"trainer.run_dir={tmp_path / 'cli'}", f"dynamics_cache={cache}",
         f"torch_threads={torch.get_num_threads()}",  # as this process (tests/conftest.py): the same sums
         *(f"trainer.{k}={str(v).lower()}" for k, v in short.items())], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-2000:]
    trainer = build_run("iql", load_dataset("pendulum-medium"), generator_config="rollouts", budget="quick",
                        trainer_config=TrainerConfig(run_dir=str(tmp_path / "python"), progress=False, **short),
                        cache_dir=cache)
    assert isinstance(trainer.generator.config, RolloutGeneratorConfig) and trainer.generator.config.every == 250
    trainer.train()

    def metrics(folder):
        records = [json.loads(line) for line in (tmp_path / folder / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if k not in ("speed", "time", "seconds")} for r in records]

    cli, python = metrics("cli"), metrics("python")
    assert len(cli) == 2 and cli == python


# What the cpu budget (budget/cpu.yaml, the results page's) may change from the published settings: the schedule,
# the amount of synthetic data, and NEUBAY's sizes and its posterior's members (the quick budget's).
CPU_BUDGET_CHANGES = {"trainer.epochs", "trainer.updates_per_epoch", "trainer.eval_every", "trainer.eval_episodes",
                      "trainer.final_eval_episodes", "trainer.checkpoint_every", "generator.every",
                      "generator.rollout.rollouts_per_epoch", "generator.adversarial.every",
                      "generator.adversarial.steps", "generator.posterior.parallel", "generator.buffer_rows",
                      "generator.dynamics.ensemble_size", "generator.dynamics.num_elites", "generator.dynamics.max_epochs"}


def leaves(tree, prefix=""):
    if not isinstance(tree, dict):
        return {prefix[:-1]: tree}
    return {k: v for key, value in tree.items() for k, v in leaves(value, f"{prefix}{key}.").items()}


@pytest.mark.parametrize("algo", sorted(__import__("mbrl_offline.algorithms", fromlist=["ALGORITHMS"]).ALGORITHMS))
def test_the_cpu_budget_keeps_every_agents_published_settings(algo):
    from omegaconf import OmegaConf

    def composed(budget):
        cfg = OmegaConf.to_container(compose(CONFIG_DIR, "train", [f"algo={algo}", "env=pendulum", f"budget={budget}"]))
        return leaves({k: v for k, v in cfg.items() if k in ("algo", "generator", "trainer")})

    paper, cpu = composed("paper"), composed("cpu")
    changed = {key for key in paper.keys() | cpu.keys() if paper.get(key) != cpu.get(key)}
    allowed = CPU_BUDGET_CHANGES | ({"algo.batch_size", "algo.d_model", "algo.d_hidden", "algo.head_hidden"}
                                    if algo == "neubay" else set())
    assert changed <= allowed, sorted(changed - allowed)
    assert cpu["trainer.updates_per_epoch"] * cpu["trainer.epochs"] in (2_500, 5_000, 6_000, 10_000, 15_000, 20_000, 48)
