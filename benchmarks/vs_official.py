"""Our RAVL pipeline against the official RAVL code on this machine, in the same minutes.

    git clone https://github.com/anyasims/edge-of-reach /path/to/edge-of-reach
    python benchmarks/vs_official.py --edge-of-reach /path/to/edge-of-reach [--pairs 3] [--threads 2]
                                     [--measures dynamics agent rollouts]

A ratio to the official code's figures from another machine or another day says little (the VMs'
speed drifts by about 10% over minutes), so this script measures both codes here:
for each measure it runs the official code and ours in separate processes, one after the other,
``--pairs`` times, so that each pair shares the machine's state, and prints each pair's ratio. Each
process also times 1024^3 fp32 matmuls before and after, as `throughput.py` does.

The official side builds the official classes and runs the official training loops' bodies around
them, on the CPU (the official scripts themselves need CUDA, D4RL and wandb), each timed as follows:

* agent: the update loop body (5% of a 256 batch from a 1M-row dataset buffer, the rest from a full
  1.25M-row model buffer, ``torch.cat``, ``Agent.update``) at the official defaults (10 critics,
  3x256, eta 1), 30 warm-up updates, then 5 x 200 timed; ours: `throughput.bench_updates`;
* dynamics: the batch loop of ``train_dynamics_model.train`` (its ``DataLoader`` over an
  ``EnsembleTransitionDataset``, the member permutation, the 7 member modules one after another, Adam
  with the per-layer weight decay groups) on 100k random hopper-shaped rows, 20 warm-up batches, then
  3 x 300 timed; ours: the training batches of `GaussianEnsembleDynamics.fit` (the epoch log's
  ``samples_per_s``) over one epoch of the same number of rows, 3 fits;
* rollouts: ``RolloutGenerator.generate_rollouts`` on 50,000 start states sampled from a 1M-row
  ``DataBuffer`` (horizon 5, buffer insert included), 1 warm-up call and 3 timed; ours:
  `throughput.bench_rollouts`. No rollout ends early on either side (the official model predicts
  no change from an upright hopper; ours uses a never-terminating function), so both generate all
  250,000 transitions per call.

With ``MBRL_OFFLINE_MKL_AVX512=1`` in the environment both sides' processes let MKL run its AVX-512
code on an AMD CPU (`mbrl_offline.platform`), so the comparison stays like for like; the peak column
shows which code ran (about twice the GFLOP/s with it).

Two adapters, needed on a CPU, change nothing that is timed: ``gym`` is aliased to gymnasium if it
is not installed, and the official rollout's ``done.to(reward.get_device())``, which is ``.to(-1)``
on a CPU and raises, gets a tensor wrapper that keeps ``done`` on the CPU. The official dynamics model
for rollouts is built with its ``Ensemble`` class directly instead of loaded from a saved run.

Learning mode (``--learn``): RAVL trained by the official code and by ours on the same arrays, seed
by seed, with what `parity.py` measures on both sides (holdout error on one common split, the
model's uncertainty and rewards on the same states, mean Q on the same rows, the normalised score
after every epoch), into the same results folder and report as `vs_offlinerlkit.py`:

    python benchmarks/vs_official.py --edge-of-reach /path/to/edge-of-reach --learn --dataset hopper-medium \\
        --seeds 0 1 2 --dynamics-max-epochs 25 --epochs 10 [--results runs/parity]
    python benchmarks/vs_official.py --learn --results runs/parity --report docs/parity.md

The official side runs the bodies of ``train_dynamics_model.train`` and ``train_ravl_agent.train``
(the scripts themselves assert a CUDA device and need D4RL, gym and wandb) around the official
classes at the official defaults (``EnsembleTrainConfig``, ``TrainConfig``): ``Ensemble`` with its
``load_memory`` split and filters, the epoch loop over its ``EnsembleTransitionDataset`` loader with
the member permutation, the validation check, the learning-rate drop and the early stop; the best
weights loaded and the elites selected as ``load_ensemble_model`` does; then ``DataBuffer``,
``Actor``, ``VectorizedCritic``, ``Agent`` and ``RolloutGenerator`` in the epoch loop of
``train_ravl_agent.train``. Adapters besides the two above: the arrays are handed to ``load_memory``
and ``load_d4rl_dataset`` directly (no ``d4rl.qlearning_dataset``); ``--dynamics-max-epochs`` is the
loop's ``epochs`` (and ``min_epochs``, 350 in the official config, is capped below it, as the
official script asserts ``min_epochs < epochs``); the evaluation is `parity.py`'s (gymnasium's v5
env, our trainer's episode seeds, ``Actor.act`` in eval mode, which is the deterministic action).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from mbrl_offline import platform as mbrl_platform  # noqa: E402
mbrl_platform.apply_environment()  # before torch: MBRL_OFFLINE_MKL_AVX512=1 acts on both sides' MKL
import numpy as np
import torch

import throughput

OBS, ACT = throughput.OBS, throughput.ACT
UNITS = {"agent": "updates/s", "dynamics": "samples/s", "rollouts": "transitions/s"}


def random_dataset(rows: int, upright: bool = False) -> dict[str, np.ndarray]:
    """`throughput.random_transitions` as the numpy arrays the official loaders take."""
    data = {key: value.numpy() for key, value in throughput.random_transitions(rows, torch.device("cpu")).items()}
    if upright:  # hopper standing: height 1.25, angle 0, so the termination function never fires
        data["observations"][:] = 0.0
        data["observations"][:, 0] = 1.25
    return data


class _DoneOnCPU:
    """The official rollout moves ``done`` with ``.to(reward.get_device())``, which is -1 on a CPU."""

    def __init__(self, done: torch.Tensor):
        self.done = done

    def to(self, device_index):
        return self.done if device_index == -1 else self.done.to(device_index)


def import_official(checkout: Path) -> None:
    """Make the official modules importable: the checkout on the path, gymnasium standing in for gym."""
    try:
        import gym  # noqa: F401
    except ImportError:
        import gymnasium
        sys.modules["gym"] = gymnasium
    sys.path.insert(0, str(checkout))


def official_rates(checkout: Path, measure: str) -> list[float]:
    import_official(checkout)
    from agent_training.agent import Actor, Agent, VectorizedCritic
    from shared.data_buffer import DataBuffer

    if measure == "agent":
        actor, critic = Actor(OBS, ACT, 256, 1.0), VectorizedCritic(OBS, ACT, 256, 10)
        agent = Agent(actor=actor, actor_optimizer=torch.optim.Adam(actor.parameters(), lr=3e-4), critic=critic,
                      critic_optimizer=torch.optim.Adam(critic.parameters(), lr=3e-4), gamma=0.99, tau=5e-3,
                      eta=1.0, auto_alpha=True, alpha_learning_rate=3e-4, device="cpu")
        dataset_buffer, model_buffer = DataBuffer(OBS, ACT, 1_000_000), DataBuffer(OBS, ACT, 1_250_000)
        dataset_buffer.load_d4rl_dataset(random_dataset(1_000_000))
        model_buffer.load_d4rl_dataset(random_dataset(1_250_000))
        from_dataset = int(0.05 * 256)

        def updates(n: int) -> float:
            start = time.perf_counter()
            for _ in range(n):
                real, synthetic = dataset_buffer.sample(from_dataset), model_buffer.sample(256 - from_dataset)
                agent.update([torch.cat([real[i], synthetic[i]]) for i in range(len(real))])
            return n / (time.perf_counter() - start)

        updates(30)
        return [updates(200) for _ in range(5)]

    from dynamics_training.ensemble import Ensemble, EnsembleTransitionDataset, Transition
    params = dict(env_name="hopper-medium-v2", seed=0, num_models=7, num_elites=5, train_memory=2_000_000,
                  val_memory=500_000, train_val_ratio=0.2, l2_reg_multiplier=1.0, hidden_dim=200,
                  ob_dim=OBS, ac_dim=ACT)
    if measure == "dynamics":
        from torch.utils.data import DataLoader
        ensemble = Ensemble(params)
        ensemble.load_memory(random_dataset(100_000))
        optimizer = torch.optim.Adam(ensemble.weights, lr=1e-3)
        train = Transition(*ensemble.memory.sample_all())
        loader = DataLoader(EnsembleTransitionDataset(train, ensemble.state_filter, ensemble.action_filter,
                                                      n_models=7), shuffle=True, batch_size=256)
        batches = iter(loader)

        def train_batches(n: int) -> float:
            nonlocal batches
            start = time.perf_counter()
            for _ in range(n):
                try:
                    x, delta, reward = next(batches)
                except StopIteration:
                    batches = iter(loader)
                    x, delta, reward = next(batches)
                perm = np.random.choice(7, size=7, replace=False)
                x, delta, reward = x[:, perm], delta[:, perm], reward[:, perm]
                loss = 0
                for member in range(7):
                    loss += ensemble.networks[member].train_model_forward(x[:, member], delta[:, member],
                                                                          reward[:, member])
                loss.item()  # the official loop logs it every batch
                loss += 0.01 * ensemble.max_logvar.sum() - 0.01 * ensemble.min_logvar.sum()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            return n * 256 / (time.perf_counter() - start)

        train_batches(20)
        return [train_batches(300) for _ in range(3)]

    if measure == "rollouts":
        from agent_training.rollout_generation import DynamicsModel, RolloutGenerator, hopper_is_done_func
        model = DynamicsModel.__new__(DynamicsModel)  # its __init__ loads a saved run; build the ensemble here
        model.env_name, model.state_dim, model.action_dim = "hopper-medium-v2", OBS, ACT
        model.done_func = lambda next_obs: _DoneOnCPU(hopper_is_done_func(next_obs))
        model.ensemble = Ensemble(params)
        statistics_from = random_dataset(10_000)  # the input normalisers, as loading a trained model sets them
        model.ensemble.state_filter.update(statistics_from["observations"])
        model.ensemble.action_filter.update(statistics_from["actions"])
        with torch.no_grad():  # predict no change with a small std: no rollout ends early
            for network in model.ensemble.networks.values():
                for head in (network.net.delta, network.net.logvar):
                    head.weight.zero_()
                network.net.delta.bias.zero_()
                network.net.logvar.bias.fill_(-10.0)
        dataset_buffer = DataBuffer(OBS, ACT, 1_000_000)
        dataset_buffer.load_d4rl_dataset(random_dataset(1_000_000, upright=True))
        generator = RolloutGenerator(model=model, actor=Actor(OBS, ACT, 256, 1.0), steps_k=5, num_rollouts=50_000,
                                     buffer=DataBuffer(OBS, ACT, 1_250_000))

        def call() -> float:
            start = time.perf_counter()
            added = generator.generate_rollouts(dataset_buffer.sample(50_000)[0])["rollouts/transitions_added"]
            if added != 250_000:
                raise RuntimeError(f"the official rollouts ended early ({added} transitions): not comparable")
            return added / (time.perf_counter() - start)

        call()
        return [call() for _ in range(3)]
    raise ValueError(measure)


def our_rates(measure: str) -> list[float]:
    from mbrl_offline.platform import keep_freed_memory
    keep_freed_memory()  # as training on a CPU does
    device = torch.device("cpu")
    if measure == "agent":
        return [throughput.bench_updates(device, 5)[0]]
    if measure == "dynamics":
        return [throughput.bench_dynamics(device, 1, epochs=1)[1] for _ in range(3)]
    if measure == "rollouts":
        return [throughput.bench_rollouts(device, 3)[0]]
    raise ValueError(measure)


def child(args) -> None:
    torch.set_num_threads(args.threads)
    peak = throughput.matmul_peak(torch.device("cpu"))
    rates = official_rates(args.edge_of_reach, args.measure) if args.side == "official" else our_rates(args.measure)
    peak += throughput.matmul_peak(torch.device("cpu"))
    print("RESULT " + json.dumps({"rate": statistics.median(rates), "rates": rates, "peak": statistics.median(peak)}))


def run_child(side: str, measure: str, args) -> dict:
    command = [sys.executable, __file__, "--side", side, "--measure", measure, "--threads", str(args.threads),
               "--edge-of-reach", str(args.edge_of_reach)]
    # a CPU comparison: the official modules would pick a GPU by themselves where there is one
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    results = [line[len("RESULT "):] for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not results:
        sys.exit(f"error: the {side} {measure} measurement failed:\n{done.stderr[-3000:]}")
    return json.loads(results[-1])


def run_official_ravl(args, checkout: Path) -> dict:
    """The official RAVL code's dynamics and agent training loops on the CPU (module docstring)."""
    import random

    import_official(checkout)
    from torch.utils.data import DataLoader, SequentialSampler

    from agent_training.agent import Actor, Agent, VectorizedCritic
    from agent_training.rollout_generation import DynamicsModel, RolloutGenerator, get_done_func
    from dynamics_training.ensemble import Ensemble, EnsembleTransitionDataset, Transition, TransitionDataset
    from shared.data_buffer import DataBuffer

    from mbrl_offline.data.envs import get_env_info
    from mbrl_offline.evaluation import evaluate_policy
    from parity import common_data, eval_seed, model_measures, settings

    data, train, holdout, q_rows = common_data(args.dataset)
    env = get_env_info(data.env_name)
    low, high = env.action_bounds()
    obs_dim, act_dim = data.obs_dim, data.act_dim
    arrays = {k: getattr(train, k) for k in ("observations", "actions", "next_observations", "rewards", "terminals")}
    env_name = f"{args.dataset}-v2"

    # train_dynamics_model.train, with EnsembleTrainConfig's defaults
    os.environ["PYTHONHASHSEED"] = str(args.seed)  # shared.utils.set_seed
    np.random.seed(args.seed)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    epochs = args.dynamics_max_epochs
    min_epochs = min(350, epochs - 1)
    params = dict(env_name=env_name, seed=args.seed, num_models=7, num_elites=5, train_memory=2_000_000,
                  val_memory=500_000, train_val_ratio=0.2, l2_reg_multiplier=1.0, hidden_dim=200,
                  ob_dim=obs_dim, ac_dim=act_dim)
    start = time.perf_counter()
    ensemble = Ensemble(params)
    ensemble.load_memory(arrays)
    optimizer = torch.optim.Adam(ensemble.weights, lr=1e-3)
    lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.3)
    from collections import deque
    val_improve = deque(maxlen=6)
    lr_lower = False
    n_samples, n_samples_val = len(ensemble.memory), len(ensemble.memory_val)
    samples_train = Transition(*ensemble.memory.sample(n_samples))
    samples_validate = Transition(*ensemble.memory_val.sample_all())
    new_train, new_validate = dict.fromkeys(samples_train._fields), dict.fromkeys(samples_validate._fields)
    randperm = np.random.permutation(n_samples + n_samples_val)
    train_idx, valid_idx = randperm[:n_samples], randperm[n_samples:]
    for i, key in enumerate(samples_train._fields):
        all_vals = np.array(list(samples_train[i]) + list(samples_validate[i]))
        new_train[key], new_validate[key] = tuple(all_vals[train_idx]), tuple(all_vals[valid_idx])
    samples_train, samples_validate = Transition(**new_train), Transition(**new_validate)
    transition_loader = DataLoader(EnsembleTransitionDataset(samples_train, ensemble.state_filter, ensemble.action_filter,
                                                             n_models=ensemble.num_models), shuffle=True, batch_size=256)
    validation_loader = DataLoader(TransitionDataset(samples_validate, ensemble.state_filter, ensemble.action_filter),
                                   sampler=SequentialSampler(range(n_samples_val)), batch_size=256)

    def check_validation_losses():
        improved_any = False
        current_losses, current_weights = ensemble._get_validation_losses(validation_loader, get_weights=True)
        improvements = ((ensemble.current_best_losses - current_losses) / ensemble.current_best_losses) > 0.01
        for i, improved in enumerate(improvements):
            if improved:
                ensemble.current_best_losses[i] = current_losses[i]
                ensemble.current_best_weights[i] = current_weights[i]
                improved_any = True
        return improved_any, current_losses

    improved_any, losses = check_validation_losses()
    val_improve.append(improved_any)
    dynamics_log = []
    for i in range(epochs):
        loss = 0
        perm = np.random.choice(ensemble.num_models, size=ensemble.num_models, replace=False)
        for x_batch, diff_batch, r_batch in transition_loader:
            x_batch, diff_batch, r_batch = x_batch[:, perm], diff_batch[:, perm], r_batch[:, perm]
            for idx in range(ensemble.num_models):
                loss += ensemble.networks[idx].train_model_forward(x_batch[:, idx], diff_batch[:, idx], r_batch[:, idx])
            loss += 0.01 * ensemble.max_logvar.sum() - 0.01 * ensemble.min_logvar.sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            loss = 0
        improved_any, losses = check_validation_losses()
        dynamics_log.append(float(np.sort(losses)[:5].mean()))
        val_improve.append(improved_any)
        if len(val_improve) > 5 and not any(np.array(val_improve)[1:]):
            if i >= min_epochs:
                break
            elif not lr_lower:
                lr_scheduler.step()
                lr_lower = True
                val_improve = deque(maxlen=6)
                val_improve.append(True)
    # as save_ensemble_model + load_ensemble_model: the best weights, the bounds' last values, elites
    for index in ensemble.networks:
        ensemble.networks[index].load_state_dict(ensemble.current_best_weights[index])
    ensemble.select_elites(validation_loader)
    ensemble.set_model_logvar_limits()
    dynamics_seconds = time.perf_counter() - start

    model = DynamicsModel.__new__(DynamicsModel)  # its __init__ loads a saved run
    model.env_name, model.state_dim, model.action_dim, model.ensemble = env_name, obs_dim, act_dim, ensemble
    done_func = get_done_func(env_name)
    model.done_func = lambda next_obs: _DoneOnCPU(done_func(next_obs))

    def predict(obs, act):
        with torch.no_grad():
            mean, logvar = ensemble.get_means_logvars(torch.as_tensor(obs), torch.as_tensor(act))
        mean = mean.transpose(0, 1).numpy()  # (members, B, D) as parity.model_measures takes them
        mean[..., :obs_dim] -= obs  # get_means_logvars adds the state: back to the change
        return mean, logvar.transpose(0, 1).numpy()

    def step(obs, act):
        return model.transition_function_torch(torch.as_tensor(obs), torch.as_tensor(act))[1].numpy()

    s = settings(args.algo, args.dataset)
    measures = model_measures(predict, step, np.array(ensemble._elites_idx), holdout, s["mopo_lambda"], low, high)
    measures.update(own_holdout_loss=dynamics_log[-1], epochs=len(dynamics_log), seconds=dynamics_seconds,
                    logvar_bounds={"max_mean": ensemble.max_logvar.mean().item(),
                                   "min_mean": ensemble.min_logvar.mean().item()})
    if args.epochs == 0:
        return {"model": measures, "curve": [], "dynamics_holdout_log": dynamics_log}

    # train_ravl_agent.train, with TrainConfig's defaults
    np.random.seed(args.seed)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    modelfree_buffer = DataBuffer(state_dim=obs_dim, action_dim=act_dim, buffer_size=len(train), as_numpy=False)
    modelfree_buffer.load_d4rl_dataset(arrays)
    actor = Actor(obs_dim, act_dim, 256, 1.0)
    critic = VectorizedCritic(obs_dim, act_dim, 256, 10)
    agent = Agent(actor=actor, actor_optimizer=torch.optim.Adam(actor.parameters(), lr=3e-4), critic=critic,
                  critic_optimizer=torch.optim.Adam(critic.parameters(), lr=3e-4), gamma=0.99, tau=5e-3, eta=1.0,
                  auto_alpha=True, alpha_learning_rate=3e-4, target_entropy=None, alpha=0.1, device="cpu")
    modelbased_buffer = DataBuffer(state_dim=obs_dim, action_dim=act_dim, buffer_size=args.rollouts * 5 * 5,
                                   as_numpy=False)
    generator = RolloutGenerator(model=model, actor=actor, steps_k=5, num_rollouts=args.rollouts,
                                 buffer=modelbased_buffer)
    q_obs, q_act = torch.as_tensor(train.observations[q_rows]), torch.as_tensor(train.actions[q_rows])
    curve, start = [], time.perf_counter()
    for epoch in range(args.epochs):
        rollout_info = generator.generate_rollouts(modelfree_buffer.sample(args.rollouts)[0])
        alpha_sum = 0.0
        for _ in range(args.updates_per_epoch):
            n_d4rl = int(0.05 * 256)
            modelfree_batch, modelbased_batch = modelfree_buffer.sample(n_d4rl), modelbased_buffer.sample(256 - n_d4rl)
            agent.update([torch.cat([modelfree_batch[i], modelbased_batch[i]]) for i in range(len(modelfree_batch))])
            alpha_sum += float(agent.alpha)  # the epoch's mean, as our trainer and OfflineRL-Kit's logger report it
        actor.eval()
        result = evaluate_policy(lambda o: actor.act(torch.as_tensor(o)).numpy(), env, args.eval_episodes,
                                 eval_seed(args.seed, epoch + 1))
        actor.train()
        with torch.no_grad():
            q = agent.critic(q_obs, q_act).min(dim=0).values.mean().item()
        # the official 'rollouts/mean_reward' divides by the rollouts and the horizon: the mean per transition
        # only when no rollout ends early, so the mean over the stored transitions is taken here
        stored = modelbased_buffer._rewards[:modelbased_buffer._size]
        added = rollout_info["rollouts/transitions_added"]
        latest = torch.roll(stored, -modelbased_buffer._pointer, 0)[-added:] if added else stored[:0]
        curve.append({"epoch": epoch + 1, "normalized_score": result["normalized_score"],
                      "return_mean": result["return_mean"], "rollout_reward_mean": latest.mean().item(),
                      "q_mean": q, "alpha": alpha_sum / max(args.updates_per_epoch, 1)})
    return {"model": measures, "curve": curve, "agent_seconds": time.perf_counter() - start,
            "dynamics_holdout_log": dynamics_log, "code": str(checkout)}


def is_checkout(path: Path) -> bool:
    return (path / "agent_training" / "agent.py").is_file()


def learn(argv: list[str]) -> None:
    import parity
    peer = parity.Peer(side="official", option="--edge-of-reach", repository="github.com/anyasims/edge-of-reach",
                       algos=("ravl",), is_checkout=is_checkout, run=run_official_ravl, script=__file__,
                       script_args=("--learn",))
    parity.main(peer, "RAVL learning side by side with the official code (vs_official.py --learn)", argv)


def main() -> None:
    if "--learn" in sys.argv[1:]:
        learn([a for a in sys.argv[1:] if a != "--learn"])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edge-of-reach", type=Path, required=True, help="a checkout of anyasims/edge-of-reach")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--measures", nargs="+", default=["dynamics", "agent", "rollouts"],
                        choices=["dynamics", "agent", "rollouts"])
    parser.add_argument("--side", choices=["official", "ours"], help=argparse.SUPPRESS)
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not (args.edge_of_reach / "agent_training" / "agent.py").is_file():
        sys.exit(f"error: {args.edge_of_reach} is not a checkout of anyasims/edge-of-reach "
                 "(no agent_training/agent.py). Clone it and pass its path with --edge-of-reach.")
    if args.side:
        child(args)
        return
    print(f"cpu: {throughput.cpu_name()}; {args.threads} threads; torch {torch.__version__}; "
          f"MKL's AVX-512 code on AMD CPUs: {mbrl_platform.status()}")
    print(f"{'measure':<11}{'pair':>5}{'official':>14}{'ours':>14}{'ratio':>8}{'peak GFLOP/s (off./ours)':>27}")
    for measure in args.measures:
        ratios = []
        for pair in range(1, args.pairs + 1):
            official, ours = run_child("official", measure, args), run_child("ours", measure, args)
            ratios.append(ours["rate"] / official["rate"])
            print(f"{measure:<11}{pair:>5}{official['rate']:>14,.1f}{ours['rate']:>14,.1f}{ratios[-1]:>7.2f}x"
                  f"{official['peak']:>15.0f} / {ours['peak']:.0f}", flush=True)
        print(f"{measure}: ours / official = {min(ratios):.2f}-{max(ratios):.2f}x ({UNITS[measure]})", flush=True)


if __name__ == "__main__":
    main()
