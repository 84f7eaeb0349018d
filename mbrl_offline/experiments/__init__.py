"""The experiments: programs that use the library to measure a claim of a paper, not parts of the library.
Each is a command-line tool (`mbrl_offline.cli.TOOLS`) whose module docstring is its ``--help`` text:

* `mbrl_offline.experiments.bandit` (``mbrl-bandit``): NEUBAY's bandit illustration; its env, reward
  ensemble and recurrent agent are in `mbrl_offline.experiments.bandit_parts`;
* `mbrl_offline.experiments.dynamics_error` (``mbrl-dynamics-error``): policy-guided diffusion's dynamics
  error against a learned world model's;
* `mbrl_offline.experiments.edge_of_reach` (``mbrl-edge-of-reach``): MOPO and RAVL trained with learned and
  with true dynamics.

They use the library's parts (datasets, models, generators, agents, trainer, the NaN-safe gradient clipper
`mbrl_offline.utils.clean_and_clip`); the library never imports them. Each imports torch only inside its
``main``, after the platform settings are applied (`mbrl_offline.cli.cli_main`).
"""
