"""Use a trained dynamics ensemble as a plain PyTorch module in your own code.

    python examples/dynamics_in_pytorch.py [--model PATH] [--dataset pendulum-medium]

Without ``--model`` it trains (once; later runs load it from the cache) a model on the dataset.
It then (1) measures one-step prediction error on the data and (2) controls the real env by
model-predictive control: each step it improves a 10-step action plan by gradient ascent on the
elites' mean predicted return, differentiating through the model, and compares the return with
random actions. No library trainer involved:
the model is an ``nn.Module`` with ``predict``, ``step`` and ``elites``.

``--help`` lists the options; ``--cfg job`` prints them as YAML and runs nothing.
"""
import sys

import numpy as np
import torch

import mbrl_offline as m
from mbrl_offline.cli import ToolArgumentParser, cli_main
from mbrl_offline.models.dynamics import DynamicsConfig, GaussianEnsembleDynamics, load_or_fit_dynamics


@cli_main
def main(argv: list[str]) -> None:
    parser = ToolArgumentParser("dynamics_in_pytorch.py", __doc__)
    parser.add_argument("--model", help="a file written by GaussianEnsembleDynamics.save (or the cache)")
    parser.add_argument("--dataset", default="pendulum-medium", help="a bundled name, D4RL .hdf5 file or Minari id "
                        "(default: pendulum-medium)")
    args = parser.parse_args(argv)
    data = m.load_dataset(args.dataset)
    if args.model:
        model = GaussianEnsembleDynamics.load(args.model)
    else:
        model, path = load_or_fit_dynamics(data, DynamicsConfig(hidden_size=64, min_epochs=100, max_epochs=300))
        print(f"model file: {path}")
    model.eval().requires_grad_(False)

    # (1) One-step error of the elites' mean prediction on 2,000 dataset transitions.
    obs, act = torch.as_tensor(data.observations[:2000]), torch.as_tensor(data.actions[:2000])
    mean, _ = model.predict(obs, act)
    elite_mean = mean[model.elites].mean(0)
    next_obs_error = (obs + elite_mean[:, :-1] - torch.as_tensor(data.next_observations[:2000])).abs().mean()
    reward_error = (elite_mean[:, -1] - torch.as_tensor(data.rewards[:2000])).abs().mean()
    print(f"one-step mean absolute error: next state {next_obs_error:.4f}, reward {reward_error:.4f}")

    # (2) Model-predictive control by gradient ascent through the model: every real step, improve a
    # 10-step action plan on the elites' mean predicted return, act with its first action, shift it.
    env_info = m.get_env_info(data.env_name)
    low, high = (torch.as_tensor(b) for b in env_info.action_bounds())
    env = env_info.make()
    raw_plan = torch.zeros(10, data.act_dim, requires_grad=True)
    optimiser = torch.optim.Adam([raw_plan], lr=0.3)
    obs, _ = env.reset(seed=0)
    mpc_return = 0.0
    for _ in range(100):
        for _ in range(20):
            state, predicted = torch.as_tensor(obs, dtype=torch.float32)[None], 0.0
            for action in low + (high - low) * torch.sigmoid(raw_plan):
                mean, _ = model.predict(state, action[None])
                step = mean[model.elites].mean(0)  # differentiable in the action
                state, predicted = state + step[:, :-1], predicted + step[0, -1]
            optimiser.zero_grad()
            (-predicted).backward()
            optimiser.step()
        action = (low + (high - low) * torch.sigmoid(raw_plan[0])).detach().numpy()
        obs, reward, *_ = env.step(action)
        mpc_return += reward
        with torch.no_grad():
            raw_plan.copy_(torch.cat([raw_plan[1:], raw_plan[-1:]]))

    rng = np.random.default_rng(0)
    random_returns = []
    for episode in range(10):
        env.reset(seed=0)
        random_returns.append(sum(env.step(rng.uniform(low.numpy(), high.numpy()))[1] for _ in range(100)))
    print(f"100-step return in the real env from the same start: gradient MPC through the model "
          f"{mpc_return:.1f}, random actions {np.mean(random_returns):.1f} on average")


if __name__ == "__main__":
    main(sys.argv[1:])
