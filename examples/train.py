"""Train an agent: `python examples/train.py algo=ravl env=hopper [budget=quick] [setting=value ...]`.

Trains on the env's default dataset (bundled hopper-medium for hopper) unless ``env.dataset=`` names
another (a bundled name, a D4RL .hdf5 file or a Minari id). Writes TensorBoard logs, metrics.jsonl
and checkpoint.pt to ``trainer.run_dir``; ``resume=true`` continues a stopped run. Settings:
configs/train.yaml.
"""
import sys
from pathlib import Path

from mbrl_offline.cli import cli_main, compose, config_to_dataclass

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


@cli_main
def main(argv: list[str]) -> None:
    import torch

    from mbrl_offline import load_dataset
    from mbrl_offline.algorithms import get_algorithm
    from mbrl_offline.data.envs import get_env_info
    from mbrl_offline.trainer import Trainer, TrainerConfig

    cfg = compose(CONFIGS, "train", argv)
    agent_cls, config_cls = get_algorithm(cfg.algo.name)
    algo_config = config_to_dataclass(config_cls, {k: v for k, v in cfg.algo.items() if k != "name"}, "algo")
    trainer_config = config_to_dataclass(TrainerConfig, cfg.trainer, "trainer")
    env = get_env_info(cfg.env.name)
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    dataset = load_dataset(cfg.env.dataset or env.default_dataset, env=env.name)
    print(f"{agent_cls.__name__} on {dataset.source} ({len(dataset)} transitions, data score "
          f"{dataset.summary()['normalized_score_mean']:.1f}); run folder {trainer_config.run_dir}", flush=True)
    torch.manual_seed(trainer_config.seed)
    agent = agent_cls.for_dataset(dataset, algo_config, cfg.device, dynamics_path=cfg.dynamics_path,
                                  cache_dir=cfg.dynamics_cache, progress=trainer_config.progress)
    summary = Trainer(agent, dataset, trainer_config).train(resume=cfg.resume)
    print(f"final normalised score {summary['final_score']:.1f} (return {summary['final_return']:.1f}); "
          f"mean of the last {min(10, summary['evaluations'])} evaluations {summary['last10_score']:.1f}")


if __name__ == "__main__":
    main(sys.argv[1:])
