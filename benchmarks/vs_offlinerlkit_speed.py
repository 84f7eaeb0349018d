"""Updates per second of our agents and OfflineRL-Kit's, side by side, in the same minutes.

    git clone https://github.com/yihaosun1124/OfflineRL-Kit /path/to/OfflineRL-Kit      # measured at e3ce697
    python benchmarks/vs_offlinerlkit_speed.py --offlinerlkit /path/to/OfflineRL-Kit [--agents cql edac]
                                               [--pairs 3] [--threads 2]

For each agent it runs Kit's policy and ours in separate processes, one after the other, ``--pairs``
times, so that each pair shares the machine's state, and prints each pair's ratio; each process also
times 1024^3 fp32 matmuls before and after (`throughput.matmul_peak`), as `vs_official.py` does. Both
sides update on the same 20 batches of 256 hopper-medium rows (bundled), cycled: 20 warm-up updates,
then 5 readings of ``--updates`` updates, the median reported. Only the update is timed (Kit's
``learn``, our ``update``); sampling a batch from a buffer is not.

* ``cql``: Kit's ``CQLPolicy`` as ``run_cql.py`` builds it (3x256, R = 10, w = 5, no Lagrange); ours
  `CQL` with its defaults (Kit's settings with the joint log-sum-exp, which costs the same).
* ``edac``: Kit's ``EDACPolicy`` as ``run_edac.py`` builds it (N = 10, eta = 1, 3x256); ours `EDAC`
  with ``EDACConfig.offlinerlkit(num_critics=10)`` (Kit's settings) and Adam's fused kernel, our
  default (the same maths, rounded differently).
* ``combo``: Kit's ``COMBOPolicy`` as ``run_combo.py`` builds it (its CQL's networks, w = 5, R = 10);
  ours `COMBO` with its defaults; batches of 128 real rows and 128 stand-ins for model rows
  (`vs_offlinerlkit.combo_batches`).
* ``rambo``: the agent's update, Kit's ``RAMBOPolicy.learn`` (its SAC, 2x256) against our `RAMBO`'s, on
  the same half-real batches.
* ``rambo-adversarial``: RAMBO's adversarial model training, in adversarial steps per second (rollout
  states of 256 rows, the MLE term on 256 real rows, 7 members of 4x200): Kit's
  ``RAMBOPolicy.update_dynamics`` (its loop: actor samples, ``dynamics_step_and_forward``) with
  ``_adv_train_steps`` set to ``--updates``, against our ``AdversarialTrainer.run`` with as many
  steps, both on standardised hopper-medium rows, from a fresh ensemble of RAMBO's recipe.
* ``combo-rollouts`` and ``rambo-rollouts``: one generation of branched rollouts, in transitions per
  second: 50,000 start states drawn from hopper-medium's observations, h = 5, in an ensemble of the
  agent's published recipe (7 members of 4 x 200, 5 elites) with the same weights on both sides, stepping
  the agent's actor, the transitions stored. Kit's side is its trainer's generation
  (``MBPolicyTrainer.train``: ``real_buffer.sample``, the policy's ``rollout``, ``fake_buffer.add_batch``),
  ours the generator's (`RolloutGenerator.generate` from the real rows, then `TransitionBuffer.add`).
  RAMBO's rolls out in standardised observations (Kit's ``RAMBOPolicy.rollout`` on its normalised buffer;
  our `StandardisedDynamics`). The models' output layers predict no change with a small std, so that no
  rollout of either side ends early (as `vs_official.py` does), and each side counts its own transitions.

Our side's process keeps freed memory for reuse (`mbrl_offline.platform.keep_freed_memory`), as our
training runs on a CPU do and as the other side-by-side scripts measure ours; Kit's side runs under the
system's malloc settings, as its own scripts do. (Until 2026-11-30 this script left ours under the
system's settings too; docs/performance.md says which figures were taken so.)

With ``MBRL_OFFLINE_MKL_AVX512=1`` both sides' processes let MKL run its AVX-512 code on an AMD CPU,
so the comparison stays like for like (both sides are PyTorch).
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

import numpy as np

from mbrl_offline import platform as mbrl_platform

mbrl_platform.apply_environment()  # before torch: MBRL_OFFLINE_MKL_AVX512=1 must act before MKL loads

import torch  # noqa: E402

import throughput  # noqa: E402
from vs_offlinerlkit import (combo_batches, import_offlinerlkit, is_checkout, kit_combo_policy,  # noqa: E402
                             kit_cql_policy, kit_dynamics, kit_edac_policy, kit_rambo_policy)

BATCHES, ROWS = 20, 256


def batches() -> list[dict[str, torch.Tensor]]:
    """20 batches of 256 hopper-medium rows: rewards and terminals as vectors (ours)."""
    from mbrl_offline import load_dataset
    data = load_dataset("hopper-medium")
    rng = np.random.default_rng(0)
    out = []
    for _ in range(BATCHES):
        idx = rng.integers(0, len(data), ROWS)
        out.append({k: torch.as_tensor(getattr(data, k)[idx]).float()
                    for k in ("observations", "actions", "next_observations", "rewards", "terminals")})
    return out


def as_kit(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Kit's batch: rewards and terminals as (B, 1) columns."""
    return {**batch, "rewards": batch["rewards"][:, None], "terminals": batch["terminals"][:, None]}


def our_agent(name: str):
    from mbrl_offline.algorithms import COMBO, CQL, EDAC, RAMBO
    from mbrl_offline.algorithms.cql import CQLConfig
    from mbrl_offline.algorithms.edac import EDACConfig
    from mbrl_offline.algorithms.rambo import RAMBOConfig
    if name == "cql":
        return CQL(11, 3, [-1.0] * 3, [1.0] * 3, CQLConfig())
    if name == "edac":
        return EDAC(11, 3, [-1.0] * 3, [1.0] * 3, EDACConfig.offlinerlkit(num_critics=10, fused_adam=True))
    if name == "combo":
        return COMBO(11, 3, [-1.0] * 3, [1.0] * 3)
    if name.startswith("rambo"):
        return RAMBO(11, 3, [-1.0] * 3, [1.0] * 3, RAMBOConfig(bc_epochs=0))
    raise ValueError(name)


def kit_policy(name: str, checkout: Path):
    import_offlinerlkit(checkout)
    if name == "cql":
        return kit_cql_policy(checkout, our_agent("cql"))
    if name == "edac":
        return kit_edac_policy(11, 3, 1.0, num_critics=10, eta=1.0)
    if name == "combo":
        return kit_combo_policy(checkout, our_agent("combo"))
    raise ValueError(name)


AGENTS = ("cql", "edac", "combo", "rambo", "rambo-adversarial", "combo-rollouts", "rambo-rollouts")
UNITS = {"rambo-adversarial": "adversarial steps/s", "combo-rollouts": "transitions/s", "rambo-rollouts": "transitions/s"}


def fresh_model(dynamics_config, observations: np.ndarray, actions: np.ndarray):
    """A fresh ensemble of ``dynamics_config`` for hopper's sizes, its input statistics those of the rows
    ``[observations, actions]`` (as a fit would set them), marked fitted."""
    from mbrl_offline.models.dynamics import GaussianEnsembleDynamics
    model = GaussianEnsembleDynamics(11, 3, dynamics_config)
    inputs = np.concatenate([observations, actions], axis=1)
    with torch.no_grad():
        model.input_mean.copy_(torch.as_tensor(inputs.mean(0)))
        model.input_std.copy_(torch.as_tensor(inputs.std(0)))
    model.mark_fitted()
    return model


def transition_rows(data) -> dict[str, torch.Tensor]:
    """A dataset's transitions as float tensors (ours: rewards and terminals as vectors)."""
    return {k: torch.as_tensor(getattr(data, k)).float() for k in
            ("observations", "actions", "next_observations", "rewards", "terminals")}


def rambo_parts(checkout: Path):
    """Our RAMBO agent (its states standardised by hopper-medium's statistics), a fresh ensemble of
    RAMBO's recipe marked fitted, Kit's ``RAMBOPolicy`` holding the same weights, and the standardised
    rows."""
    from mbrl_offline import load_dataset
    from mbrl_offline.algorithms import RAMBO
    from mbrl_offline.generators.rollouts import StandardisedDynamics
    data = load_dataset("hopper-medium")
    agent = our_agent("rambo")
    agent.normalise.fit(data.observations, agent.config.state_std_eps)
    mean, std = agent.normalise.mean.numpy(), agent.normalise.std.numpy()
    model = fresh_model(RAMBO.published_generator().dynamics, (data.observations - mean) / std, data.actions)
    rows = transition_rows(data)
    standard = {**rows, "observations": (rows["observations"] - torch.as_tensor(mean)) / torch.as_tensor(std),
                "next_observations": (rows["next_observations"] - torch.as_tensor(mean)) / torch.as_tensor(std)}
    kit = kit_rambo_policy(checkout, agent, model, mean, std, 3e-4) if checkout is not None else None
    return agent, StandardisedDynamics(model, torch.as_tensor(mean), torch.as_tensor(std)), kit, rows, standard


def adversarial_rates(side: str, checkout: Path, steps: int) -> list[float]:
    """Adversarial steps per second: 5 phases of ``steps`` steps after one of 20."""
    from mbrl_offline.data.envs import get_env_info
    from mbrl_offline.generators.rollouts import AdversarialConfig, AdversarialTrainer
    agent, wrapped, kit, rows, standard = rambo_parts(checkout if side == "offlinerlkit" else None)
    if side == "offlinerlkit":
        from offlinerlkit.buffer import ReplayBuffer
        buffer = ReplayBuffer(buffer_size=len(standard["observations"]), obs_shape=(11,), obs_dtype=np.float32,
                              action_dim=3, action_dtype=np.float32, device="cpu")
        buffer.load_dataset({k: v.numpy() for k, v in standard.items()})

        def phase(n: int) -> float:
            kit._adv_train_steps = n
            start = time.perf_counter()
            kit.update_dynamics(buffer)
            return n / (time.perf_counter() - start)
    else:
        trainer = AdversarialTrainer(wrapped, get_env_info("hopper").termination_fn, AdversarialConfig(every=1000),
                                     horizon=5)
        generator = torch.Generator().manual_seed(0)

        def phase(n: int) -> float:
            trainer.config = AdversarialConfig(every=1000, steps=n)
            start = time.perf_counter()
            trainer.run(agent.policy, agent, rows, generator)
            return n / (time.perf_counter() - start)
    phase(20)
    return [phase(steps) for _ in range(5)]


def still_model(model) -> None:
    """Make ``model``'s output layer predict no change (and no reward) with log-variance -10 before its
    bounds, so that rollouts from the data's states stay in them (none ends early)."""
    with torch.no_grad():
        model.head.weight.zero_()
        model.head.bias.zero_()
        model.head.bias[..., model.head.bias.shape[-1] // 2:] = -10.0


def rollout_rates(side: str, name: str, checkout: Path) -> list[float]:
    """Transitions per second of one generation of rollouts (the module docstring): 5 readings after one."""
    from mbrl_offline import load_dataset
    from mbrl_offline.buffer import TransitionBuffer
    from mbrl_offline.data.envs import get_env_info
    from mbrl_offline.generators.rollouts import RolloutGenerator
    agent_name = name.split("-")[0]
    if agent_name == "rambo":  # ours: raw rows (the model's wrapper standardises); Kit's buffer: standardised
        agent, dynamics, _, real, kit_rows = rambo_parts(None)
        model = dynamics.inner
    else:
        from mbrl_offline.algorithms import COMBO
        data = load_dataset("hopper-medium")
        agent = our_agent("combo")
        model = fresh_model(COMBO.published_generator().dynamics, data.observations, data.actions)
        dynamics = model
        real = kit_rows = transition_rows(data)
    still_model(model)
    config = (agent.published_generator()).rollout
    starts, horizon = config.rollouts_per_epoch, config.horizon
    if side == "offlinerlkit":
        import_offlinerlkit(checkout)
        from offlinerlkit.buffer import ReplayBuffer
        from offlinerlkit.utils.termination_fns import get_termination_fn
        if agent_name == "combo":
            kit = kit_combo_policy(checkout, agent, kit_dynamics(model, get_termination_fn(task="hopper")))
        else:  # its states standardised by the same statistics as ours
            kit = kit_rambo_policy(checkout, agent, model, agent.normalise.mean.numpy(), agent.normalise.std.numpy(), 3e-4)
        rows = {k: v.numpy() for k, v in kit_rows.items()}
        real_buffer = ReplayBuffer(buffer_size=len(rows["observations"]), obs_shape=(11,), obs_dtype=np.float32,
                                   action_dim=3, action_dtype=np.float32, device="cpu")
        real_buffer.load_dataset({**rows, "rewards": rows["rewards"][:, None], "terminals": rows["terminals"][:, None]})
        fake_buffer = ReplayBuffer(buffer_size=starts * horizon * 5, obs_shape=(11,), obs_dtype=np.float32,
                                   action_dim=3, action_dtype=np.float32, device="cpu")

        def call() -> float:
            start = time.perf_counter()
            init_obss = real_buffer.sample(starts)["observations"].cpu().numpy()  # MBPolicyTrainer.train
            transitions, info = kit.rollout(init_obss, horizon)
            fake_buffer.add_batch(**transitions)
            return info["num_transitions"] / (time.perf_counter() - start)
    else:
        env = get_env_info("hopper")
        generator_config = agent.published_generator()
        generator = RolloutGenerator(dynamics, env.termination_fn, generator_config)
        buffer = TransitionBuffer(generator.buffer_capacity, 11, 3, extra_fields=generator.extra_fields)
        rng = torch.Generator().manual_seed(0)

        def call() -> float:
            start = time.perf_counter()
            batch, _ = generator.generate(agent.policy, real, rng)
            buffer.add(**batch)
            return len(batch["rewards"]) / (time.perf_counter() - start)
    call()
    return [call() for _ in range(5)]


def rates(side: str, name: str, checkout: Path, updates: int) -> list[float]:
    """Updates per second: 5 readings of ``updates`` updates after 20 warm-up updates (adversarial steps
    per second for ``rambo-adversarial``)."""
    if name == "rambo-adversarial":
        return adversarial_rates(side, checkout, updates)
    if name.endswith("-rollouts"):
        return rollout_rates(side, name, checkout)
    if name in ("combo", "rambo"):  # half real rows, half stand-ins for model rows
        pairs = list(combo_batches(BATCHES))
        data = [kit for _, kit in pairs] if side == "offlinerlkit" else [ours for ours, _ in pairs]
    else:
        data = batches()
        data = [as_kit(b) for b in data] if side == "offlinerlkit" else data
    if side == "offlinerlkit":
        step = (rambo_parts(checkout)[2] if name == "rambo" else kit_policy(name, checkout)).learn
    else:
        step = our_agent(name).update

    def run(n: int) -> float:
        start = time.perf_counter()
        for i in range(n):
            step(data[i % BATCHES])
        return n / (time.perf_counter() - start)

    run(20)
    return [run(updates) for _ in range(5)]


def child(args) -> None:
    torch.set_num_threads(args.threads)
    if args.side == "ours":
        from mbrl_offline.platform import keep_freed_memory
        keep_freed_memory()  # as training on a CPU does; Kit's side runs as its own scripts run it
    peak = throughput.matmul_peak(torch.device("cpu"))
    measured = rates(args.side, args.agent, args.offlinerlkit, args.updates)
    peak += throughput.matmul_peak(torch.device("cpu"))
    print("RESULT " + json.dumps({"rate": statistics.median(measured), "rates": measured,
                                  "peak": statistics.median(peak)}))


def run_child(side: str, agent: str, args) -> dict:
    command = [sys.executable, __file__, "--side", side, "--agent", agent, "--threads", str(args.threads),
               "--updates", str(args.updates), "--offlinerlkit", str(args.offlinerlkit)]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    results = [line[len("RESULT "):] for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not results:
        sys.exit(f"error: the {side} {agent} measurement failed:\n{done.stderr[-3000:]}")
    return json.loads(results[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--offlinerlkit", type=Path, required=True, help="a checkout of yihaosun1124/OfflineRL-Kit")
    parser.add_argument("--agents", nargs="+", default=list(AGENTS), choices=AGENTS)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--updates", type=int, default=100, help="updates per reading (5 readings per process)")
    parser.add_argument("--side", choices=["offlinerlkit", "ours"], help=argparse.SUPPRESS)
    parser.add_argument("--agent", choices=AGENTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    mbrl_platform.check_environment()
    if not is_checkout(args.offlinerlkit):
        parser.exit(2, "error: --offlinerlkit must name a checkout of github.com/yihaosun1124/OfflineRL-Kit; "
                       "clone it and pass its path.\n")
    if args.side:
        child(args)
        return
    print(f"cpu: {throughput.cpu_name()}; {args.threads} threads; torch {torch.__version__}; "
          f"MKL's AVX-512 code on AMD CPUs: {mbrl_platform.status()}")
    print("| agent (updates/s unless named) | pair | OfflineRL-Kit | ours | ours / Kit | peak GFLOP/s (Kit / ours) |")
    print("|---|---:|---:|---:|---:|---:|")
    for agent in args.agents:
        ratios = []
        for pair in range(1, args.pairs + 1):
            kit, ours = run_child("offlinerlkit", agent, args), run_child("ours", agent, args)
            ratios.append(ours["rate"] / kit["rate"])
            label = f"{agent} ({UNITS[agent]})" if agent in UNITS else agent
            print(f"| {label} | {pair} | {kit['rate']:,.1f} | {ours['rate']:,.1f} | {ratios[-1]:.2f}x | "
                  f"{kit['peak']:.0f} / {ours['peak']:.0f} |", flush=True)
        print(f"{agent}: ours / Kit = {min(ratios):.2f}-{max(ratios):.2f}x", flush=True)


if __name__ == "__main__":
    main()
