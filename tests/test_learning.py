"""Real learning: each agent ends at least 20 points above its bundled pendulum or inverted-pendulum data,
as the mean of its last three evaluations.

The cases that run an agent's published settings and generator exactly as users run them (`published`:
``python examples/train.py algo=<agent> env=<env> env.dataset=<dataset> budget=cpu``, with only the
schedule the test's own) are IQL, EDAC and RAVL on pendulum-medium-replay, NEUBAY on pendulum-random, and
MOPO, MOReL (NPG and SAC), RAMBO and COPlanner on inverted-pendulum-medium-replay;
`runs_published_settings` decides it by comparing the configs, and docs/learning-seeds.md (written by
`benchmarks/learning_seeds.py --out`) holds their seed tables, every seed clearing the bar, and the
trials of other agents' published settings. The other cases keep settings adjusted for the test (below;
the seed tables of their earlier measurements are in docs/reproducibility.md), on pendulum-medium
(normalised score 39.0) for the model-based agents, which learn from their published generators, and
TD3+BC and CQL. TD3+BC, CQL and EDAC learn from the data alone,
as in their papers (their settings are below), and IQL once more from policy-guided diffusion's
trajectories (``iql-pgd``: mostly synthetic batches, on pendulum-medium-replay); the rest of this
docstring is about the agents on branched rollouts (MOPO's case was one of them).

Every agent is complete at a small scale: OfflineRL-Kit's dynamics recipe (``dynamics_recipe("offlinerlkit")``:
7 members of 4x200, early stopping; MOPO's and COMBO's published one, COMBO's case's own) trained on the data
once for these cases through one cache, model rollouts from dataset states,
5% real data per batch, 2x128 agent networks, 1000 rollouts per epoch and 60 x 250 updates instead
of 3000 x 1000. Shared choices, measured for RAVL on seeds 0-5 (docs/reproducibility.md has the
figures):

* gamma = 0.95 instead of 0.99: with 0.99 the values (about -400, from -4 reward per step) were
  still far from converged after 20k updates and the score rose and fell with them;
* a 4x200 dynamics model instead of a 4x64 one: with 4x64 some seeds learned to spin the
  pendulum, where that model's reward error was 4x its error on the data (model exploitation);
* 2x128 agent networks instead of 2x64: with 2x64, seed 4 of seeds 0-4 settled on a policy that
  swings without getting the pendulum up (returns about -870).

Per agent, beyond its own defaults (COPlanner's case now runs its published settings on
inverted-pendulum-medium-replay, 40 x 250 updates: seeds 0-2 ended at 96.2, 47.4 and 34.1 against the
bar of 23.8): MOBILE uses horizon 5 (its default h = 1 gave 1000 model
transitions per epoch, and seed 0 stood at -38 after 36 epochs) and no target clip (pendulum's
rewards are negative); COPlanner uses alpha's learning rate 3e-4 (RAVL's) instead of OfflineRL-Kit's
1e-4, with which alpha was still 0.25 after 60 epochs and seed 0 ended at 56.5.

`CASES` holds every agent's settings; `benchmarks/learning_seeds.py` runs them for other seeds.
"""
import copy
import dataclasses
import functools
from pathlib import Path

import pytest

from mbrl_offline import build_run, load_dataset
from mbrl_offline.algorithms import (COMBO, CQL, EDAC, IQL, MOBILE, MOPO, NEUBAY, RAMBO, RAVL, TD3BC, COPlanner, MOReL,
                                     MOReLSAC)
from mbrl_offline.generators import NoGeneratorConfig
from mbrl_offline.models.dynamics import dynamics_recipe
from mbrl_offline.trainer import TrainerConfig

# The adjusted model-based cases (MOBILE, COMBO; RAVL's until it took its published settings on
# pendulum-medium-replay, below) step OfflineRL-Kit's recipe, COMBO's published one. Until
# 2026-11-30 they stepped a recipe of their own (the library's default before the recipes: one pair of
# log-variance bounds per member, an uncut init normal, 100-300 epochs), whose fit took 210-250 s of CI's time
# for these three cases alone. MOBILE's published recipe (Kit's capped at 30 epochs) and RAVL's (the official
# edge-of-reach one: at least 350 epochs, 347 s on one thread of the Zen 3 VM on pendulum-medium) would each be
# fitted for one case; with Kit's recipe the three share one fit. Their seeds with it are in
# docs/learning-seeds.md; MOBILE's with its published recipe ended at 67.4, 38.7 and 28.4 (bar 59.0).
ADJUSTED_DYNAMICS = dynamics_recipe("offlinerlkit")


def small(agent_cls, rollout=None, **settings):
    """The agent's config and its published generator at the small scale: one generation of 1000
    rollouts per epoch of 250 updates, on `ADJUSTED_DYNAMICS` (one fit for every such case)."""
    generator = agent_cls.published_generator()
    generator = dataclasses.replace(
        generator, every=250, dynamics=ADJUSTED_DYNAMICS,
        rollout=dataclasses.replace(generator.rollout, rollouts_per_epoch=1000, **(rollout or {})))
    config = dataclasses.replace(agent_cls.config_class(), hidden_size=128, hidden_layers=2, gamma=0.95, **settings)
    return config, generator


def published(algo: str, dataset: str, generator: str | None = None):
    """A case's configs that are the agent's published settings and generator exactly as users run them:
    ``python examples/train.py algo=<algo> [generator=<generator>] env=<dataset's env> env.dataset=<dataset>
    budget=cpu`` composes them (`run_configs`; budget=cpu changes only the schedule and the amount of
    synthetic data, which tests/test_budgets.py checks). ``generator``: a ``generator=`` choice for a
    pairing (IQL on PGD's data), None for the agent's own. The case's own schedule (its epochs) replaces
    the budget's."""

    def configs():
        return copy.deepcopy(_composed(algo, dataset, generator))  # a copy: the caller may change its own

    return configs


@functools.lru_cache(maxsize=None)
def _composed(algo: str, dataset: str, generator: str | None):
    """`published`'s composition, once per process for each (algo, dataset, generator): the docs' seed-table
    test compares every case with its published settings, which took 26 compositions without it (14 with)."""
    from mbrl_offline.compose import env_choice, run_configs

    config, generator_config, _ = run_configs(algo, "cpu", generator, env=env_choice(load_dataset(dataset)),
                                              overrides=[f"env.dataset={dataset}"])
    return config, generator_config


def pairing(name: str) -> str | None:
    """The ``generator=`` choice of case ``name`` where it pairs its agent with another generator (its
    kind, e.g. ``pgd``), None where the case runs the agent's published generator."""
    agent_cls, configs, *_ = CASES[name]
    kind = configs()[1].kind
    return None if kind == agent_cls.published_generator().kind else kind


def runs_published_settings(name: str) -> bool:
    """Whether case ``name`` runs its agent's published settings and generator as budget=cpu composes them
    (`published`), rather than settings adjusted for the test: decided by comparing the configs, so that a
    case cannot be called published while it changes a setting."""
    agent_cls, configs, dataset, *_ = CASES[name]
    return tuple(configs()) == tuple(published(agent_cls.name, dataset, pairing(name))())


# TD3+BC and IQL: the data alone (generator=none), as in their papers, with CORL's settings but for
# the shared choices above (gamma 0.95, 2x128 networks), 80 x 250 updates and one setting or dataset
# each, chosen from these runs (seed 0 unless said; the mean of the last three evaluations). IQL's case
# now runs its published settings instead (gamma 0.99, 2x256 networks) on pendulum-medium-replay; TD3+BC's
# published settings did not reach the bar on pendulum-medium-replay, inverted-pendulum-medium-replay,
# inverted-pendulum-random, pendulum-random or pendulum-medium-expert (docs/learning-seeds.md), nor on
# pendulum-medium (docs/results.md); the other bundled cheap datasets score 99.6-100, which leaves no room
# for 20 points. So TD3+BC's published settings reach the bar on no cheap dataset (docs/reproducibility.md).
#
# * TD3+BC on pendulum-medium: CORL's alpha = 2.5 held the policy at the data's level (36.2 after 30k
#   updates, against the data's 39.0; its behaviour-cloning term dominates on this data); alpha = 10,
#   a weaker pull to the data, gave 83.1 (30k updates); at this test's 20k updates seeds 0-2 gave
#   77.3, 84.4 and 78.8 (`python benchmarks/learning_seeds.py --agents td3bc iql --seeds 0 1 2`).
# * IQL (its case before it ran the published settings) on pendulum-medium stayed near the bar whatever
#   was tried (20-30k updates: CORL's settings 57.5 and 57.8 with seeds 0 and 1; beta = 10: 61.6, 52.3,
#   70.1 with seeds 0-2; a deterministic actor 56.5, with beta = 10 62.4; expectile 0.9: 2.3): its
#   evaluations swung between about 30 and 80. On pendulum-medium-replay (the replay buffer of the run
#   that made the medium data: normalised score -8.3, 3,400 transitions from random to medium), which
#   advantage-weighted regression is made for, CORL's settings gave 84.8, and 92.2 and 86.6 with seeds 1
#   and 2 (beta = 10: 63.3).
# * EDAC: its published settings (budget=cpu: N = 10, eta = 1, 3 x 256, gamma 0.99) clear the bar on
#   pendulum-medium-replay in 24 x 250 updates (seeds 0-2: 96.6, 98.4 and 99.7 against the bar of 11.7), but a
#   run took 14.5-17.5 minutes on one thread of the Zen 3 VM, and CI's run of that case did not finish in its
#   90 minutes; with 24 x 125 updates (7 minutes) they passed by less (44.2, 20.1, 47.1; docs/learning-seeds.md).
#   So the case took the model-free tests' choices (128 wide, gamma = 0.95; the networks' 3 layers, N and eta
#   as published) on pendulum-medium-replay for 24 x 250 updates: seeds 0-2 ended at 95.8, 96.2 and 96.5 (Zen 3 VM).
#   It now runs the published settings at 24 x 125 updates, where every seed measured clears the bar (measured
#   again at f64930d: 44.2, 20.1, 47.1, the same scores; 5.5-5.9 minutes a run on one thread of the Zen 3 VM;
#   after the critics' shared backward of 6c3fe78, which changes the rounding, at 19193b3 on a Zen 1 VM: 34.6, 47.4,
#   46.8, 8.8-9.1 minutes a run).
#   An earlier case, the same for 80 x 250 updates: on pendulum-medium, seed 0 ended at 44.2, below the bar of
#   59.0 (evaluations between -48 and 10 for 16k updates, then 24.8, 62.2, 45.7, with alpha, tuned from 1,
#   still at 0.13); on pendulum-medium-replay it ended at 97.8 (above 90 from the 4k-th update on), and seeds 1
#   and 2 at 101.0 and 97.9.
#
# CQL: OfflineRL-Kit's settings (w = 5, T = 1, R = 10, the joint log-sum-exp) at 2 x 128 (Kit: 3 x 256;
# the shared widths) and gamma 0.95, on pendulum-medium for 40 x 250 updates: seed 0 ended at 95.6
# (evaluations 3.8, 51.9, 82.1, 73.9, 85.3, 87.4, 96.9, 95.8, 92.9, 98.0) against the data's 39.0;
# seeds 1 and 2 ended at 91.6 and 74.7 (`python benchmarks/learning_seeds.py --agents cql --seeds 1 2`).
# CQL's published settings (budget=cpu: 3 x 256, gamma 0.99) also clear the bar there, at 20 x 250 updates:
# seeds 0-2 ended at 81.4, 80.7 and 83.6 (docs/learning-seeds.md). The case keeps the adjusted settings
# for CI's time alone: such a run took 33-36 minutes on one thread of a Zen 3 VM (two runs at a time), about
# a third of CI's whole budget for one test. For CI's time too, the case now takes 40 epochs of 125 updates
# (5k updates, evaluations every 500): seed 0 ended at 91.0 (evaluations -14.9, 7.8, 50.6, 34.8, 58.6, 67.3,
# 89.6, 90.9, 89.2, 93.0), 6.5 minutes on one thread of the Zen 3 VM (docs/learning-seeds.md).
#
# COMBO: its published generator at the small scale (`small`: the shared dynamics model, h = 5, 1000
# rollouts per epoch of 250 updates, 50% real rows) and OfflineRL-Kit's learner settings (w = 5, T = 1,
# R = 10, the joint log-sum-exp, rho_s = mix, the push-up term on the real rows, the actor's rate
# cosine-annealed over the 40 epochs) at 2 x 128 and gamma 0.95, on pendulum-medium for 40 x 250 updates,
# as CQL: seed 0 ended at 87.5 (evaluations -7.7, 34.6, 85.7, 70.2, 85.5, 77.2, 86.6, 96.0, 82.7, 84.0)
# against the data's 39.0; seed 1 ended at 66.0 (evaluations 7.2, 11.2, 60.2, 80.0, 86.7, 88.6, 70.2, 74.2, 72.0,
# 51.8). The case now takes 40 epochs of 125 updates, for CI's time: seed 0 ended at 84.0 (evaluations -15.6,
# 7.3, 29.3, 21.0, 44.6, 60.4, 86.9, 84.1, 81.2, 86.7), 6.9 minutes on one thread of the Zen 3 VM.
def model_free(agent_cls, **settings):
    config = dataclasses.replace(agent_cls.config_class(), hidden_size=128, gamma=0.95, **settings)
    return config, NoGeneratorConfig()


# IQL on policy-guided diffusion (generator=pgd): the quick budget's U-Net (base 32) fitted for 3,000
# steps on pendulum-medium-replay's 32-row windows, 256 trajectories of 129 rows per generation, the
# first unguided and one every 5,000 updates guided with lambda = 0.1, batches of 16 real + 240
# synthetic rows (the official mix), IQL as in the model-free case, for 80 x 125 updates: seed 0 ended at
# 17.6 against the bar of 11.7 (evaluations rose to 32.6-34.0 at 4.5-6k updates and settled at 16-20).
# The published pairing (``algo=iql generator=pgd budget=cpu``: IQL's published settings, unguided diffusion
# as in the official code, a U-Net fitted for 5,000 steps, 512 trajectories every 10,000 updates) cleared the
# bar of 59.0 on pendulum-medium at 80 x 125 updates in seeds 0-4 on a Zen 4 VM (83.7, 65.7, 88.9, 90.7,
# 86.1; docs/learning-seeds.md), and the case ran it from e34d921; but CI's run of that case on a Zen 1 VM (AMD
# EPYC family 23 model 1, AVX2 only) ended at 40.1 in seed 0 (evaluations still rising: 28.2, 39.3, 39.0,
# 41.9 in the last 16 epochs), so on pendulum-medium the pairing's outcome depends on the CPU's rounding, and
# the case went back to the adjusted pairing (docs/reproducibility.md). The published pairing did not clear
# the bar on pendulum-medium-replay (8.3, 9.9, -2.6 at 80 x 250), inverted-pendulum-medium-replay (6.9, 6.8,
# 7.1 at 80 x 125) or pendulum-random (22.2, 16.1, 5.1 against 15.3 at 80 x 125).
def pgd(agent_cls, **settings):
    from mbrl_offline.compose import run_configs
    from mbrl_offline.generators.pgd import PGDGuidanceConfig

    config, _ = model_free(agent_cls, **settings)
    generator = run_configs(agent_cls.name, "quick", "pgd")[1]  # the CPU sizes (U-Net base 32, 32 sampler steps)
    return config, dataclasses.replace(generator, every=5000, trajectories=256, guidance=PGDGuidanceConfig(scale=0.1),
                                       train=dataclasses.replace(generator.train, steps=3000))


# NEUBAY on pendulum-random (normalised score -4.7: a uniformly random policy's 10,000 transitions, the
# low-quality data the paper's claim is about) runs its published settings (budget=cpu: the official
# agent at 512-row tapes and widths 64, its posterior of 16 members keeping 12, 12 rollouts per
# collection). Until it did, the case was ``neubay_small``: a posterior of 10 members keeping 8, at most 40
# epochs, 16 rollouts per collection; the agent at widths 32 (encoders) and 64 (heads) on 256-row tapes,
# learning rates 3e-4, gamma = 0.95, kappa = 0.5 (docs/reproducibility.md has its seeds).


# RAMBO runs its published settings (budget=cpu: its generator, with the adversarial phases of 50 steps
# after every 250 updates) on inverted-pendulum-medium-replay (normalised score 3.8), 60 epochs: seeds 0-2
# all ended at 100.0, where on pendulum-medium they ended at 2.4, -35.3 and -35.3 against the bar of 59.0
# (docs/learning-seeds.md). For CI's time its epochs are now of 125 updates (7.5k in all; the adversarial
# phases still after every 250 updates): seeds 0-2 again ended at 100.0, and once more with the agent's
# optimisers on Adam's fused kernel, its default since 240b9f4 (docs/learning-seeds.md).
# Until the case moved, it was this, on pendulum-medium:
#   at the small scale: its published generator with the shared model (fitted on raw observations, so
# generator.standardise_observations is off: the agent still standardises inside itself), 5 generations
# kept as for the others, and the adversarial phases scaled down as the rollouts are: 50 steps (not
# 1000) of batch 256 after every 250 updates (not 1000), lambda = 3e-4; 50 epochs of behaviour cloning.
# Seeds 0 and 1 ended at 95.4 and 88.8 (the mean of the last three evaluations; data 39.0; 4 min each on one
# thread, `python benchmarks/learning_seeds.py --agents rambo --seeds 0 1`).


# MOReL (NPG, on-policy) runs its published settings (budget=cpu: 50 start states per iteration, each
# rolled out in every elite of its 4 x 512 x 2 models for up to 700 steps, HALT reward 0, kappa_p = 3) on
# inverted-pendulum-medium-replay (normalised score 3.8): 12 epochs of 1 NPG iteration (of 2 until CI's time
# asked for less; seeds 0-2 ended at 100.0 with either; with the closed-form Fisher products of 7cf4a1d, which
# round differently, at 72.3, 100.0 and 100.0; docs/learning-seeds.md). Pendulum cannot
# take them: its rewards are negative, so with the published HALT reward 0 halting pays more than any
# path. Until the case moved, it was this, on pendulum-medium (its measurements follow):
#   its published generator on the shared model (deterministic means of its 7
# members, 5 elites) with the official 50 start states per iteration, each rolled out in every elite for
# up to pendulum's 200 steps, the normalised step 0.01 (official 0.02; below), gamma 0.99 (official 0.999); 24 epochs
# of 2 NPG iterations (each takes one generation whole). Two settings of the pessimistic MDP differ from
# hopper-medium's official ones: kappa_p = 1 (with 3 the threshold, max_D delta / 3, was below the
# disagreement at the start states: every path halted at its 4th step; 1.5 gave 59.5 and 22.4 with seeds
# 2 and 0) and the HALT reward -500 (the paper's -kappa): with the official 0 and pendulum's negative
# rewards (-16 to 0), halting beats continuing, and seed 0 collapsed (evaluations 17, 11, -2, -20, -29,
# 16 over 30 iterations). Seeds 0, 1, 2 (evaluations every 8 iterations; data 39.0): 48.2, 89.2, 92.7,
# 89.3, 50.8, 89.4 (last three 76.5); 62.4, 87.8, 97.0, 93.0, 93.3, 90.5 (92.3); 51.2, 85.9, 46.2, 92.0,
# 43.1, 60.4 (65.2). With 25 start states and step 0.05 seeds 1 and 2 ended at 41.5 and 49.7; with 25
# and 0.02 seed 2 at 54.8. Those were measured on an AMD Zen 5 VM; on an Intel Xeon (family 6 model 167),
# with step 0.02, seeds 0-3 ended at 35.0 (evaluations 50.4, 88.7, 98.9, 43.9, 35.8, 25.2: up, then down),
# 63.9, 62.5 and 74.6 against the bar of 59.0, and with the step halved to 0.01 at 76.6, 76.6, 93.7 and
# 96.7 (`python benchmarks/learning_seeds.py --agents morel --seeds 0 1 2 3 --jobs 2`).


# MOReL's SAC option (morel_sac) at the small scale, seed 0 (the mean of the last three evaluations; data
# 39.0; bar 59.0): its published USAD with kappa_p = 3 ended at 16.2 with the HALT reward -500 and at -11.7
# with -100; kappa_p = 1 and -500 at 43.2 after 60 epochs (evaluations still rising: 75.7 after 80); with
# kappa_p = 0.5 (a threshold twice the dataset's largest disagreement: halts only well outside the data)
# and -500 (as the NPG case, since pendulum's rewards are negative) 85.5 after 60 epochs; seeds 1 and 2
# ended at 67.3 and 69.9. The case now runs its published settings (budget=cpu: kappa_p = 3, HALT reward 0, the
# NPG case's dynamics recipe, so `model_cache` fits that model once for both) on inverted-pendulum-medium-replay
# (normalised score 3.8; bar 23.8), where inverted pendulum's positive rewards suit the HALT reward 0: at 60 x 250
# updates seeds 0-2 ended at 21.5, 17.0 and 100.0; at 100 x 250 at 83.5, 100.0 and 100.0 (each seed's evaluations
# stayed between 10 and 35 for about 60 epochs, then rose to 100; docs/learning-seeds.md).
# Schedules and CI's time. CI's run of b720bc0 did not finish in its 90 minutes, on a VM slower than the ones
# that had passed; the learning cases are most of the suite's time. So the cases whose seeds still cleared the
# bar with epochs of 125 updates (evaluations every 500 updates) take them: COMBO, CQL, IQL on PGD (seed 0) and
# RAMBO (seeds 0-2). At 60 x 125 MOBILE (seed 0: -22.2), RAVL (-4.3), MOReL-SAC (-6.0) and MOPO (2.8) did not,
# and keep epochs of 250 (docs/learning-seeds.md has these trials). EDAC's case moved from its published
# settings to the model-free choices, and later back (its comment above).
# A second round, after CI's run of 49cb0ef also ran past its 90 minutes (`python benchmarks/learning_seeds.py
# --agents <names> --seeds 0 1 2 --threads 1 --out docs/learning-seeds.md` on the Zen 3 VM, three or four runs
# on the two cores): MOPO's case moved to inverted-pendulum-medium-replay, where its published dynamics recipe is
# COPlanner's, so that `model_cache` fits that model once for both, at 60 x 125 updates (seeds 0-2: 49.5, 48.4,
# 56.3 against the bar of 23.8); IQL's case takes 80 x 125 (24.4, 39.4, 76.2 against 11.7) and MOReL's 12
# epochs of one NPG iteration (100.0 in each seed). Tried and not taken: RAMBO at 30 x 125 (seed 1 at 11.6),
# NEUBAY at 24 x 125 (seeds 0 and 1 at -11.9 and -5.4 against 15.3), COPlanner at 40 x 125 (32.0, 100.0, 11.9
# against 23.8) and EDAC's case at 12 x 250 (seeds 0 and 1 at 5.7 and 3.2 against 11.7).
# Published settings on inverted-pendulum-medium-replay at 20 x 125 updates, seed 0 (bar 23.8): COMBO 10.3, CQL 9.8,
# EDAC 9.5, MOBILE 20.8, and MOBILE at 40 x 125 15.6 and 11.6 (seeds 0, 1; docs/learning-seeds.md); so those cases
# keep their adjusted settings.
# MOBILE's case sampled 5 next states per elite for its penalty (num_samples; published 10) until 2026-11-30:
# those samples' target-critic values are most of an update's work, as 95% of a batch's rows are synthetic.
# It now samples the published 10, with which every seed measured clears the bar (below). With 5, seed 0
# ended at 79.2 (evaluations -51.1, -28.9, 1.7, -16.9, -11.3, -23.9, 5.9, 40.5, 25.8, 37.1, 37.5, 80.5, 64.5,
# 82.9, 90.2; 10.3 minutes beside other runs on the Zen 3 VM), with 10 at 85.0 (seeds 1 and 2: 69.2 and 63.0).
# Those were on the adjusted cases' own dynamics recipe (the comment above `small`). On OfflineRL-Kit's recipe
# (2026-11-30, Zen 3 VM, `python benchmarks/learning_seeds.py --agents mobile ravl combo --seeds 0 1 2 --jobs 2`):
# MOBILE's seeds 0-2 ended at 84.0, 56.8 and 76.1 (seed 1 misses the bar of 59.0 by 2.2: its evaluations rose
# only after 48 epochs, 65.1, 60.8, 44.4 at the end), on its published recipe (30 epochs) at 67.4, 38.7 and
# 28.4; RAVL's at 98.1, 94.3 and 83.4; COMBO's at 83.9, 77.6 and 79.3 (docs/learning-seeds.md). With the
# published 10 samples (the same day, `--agents mobile ravl --seeds 0 1 2 --jobs 2`) MOBILE's seeds ended at
# 86.4, 65.2 and 69.8 against 59.0.
# RAVL runs its published settings (budget=cpu: 10 critics of 3 x 256, eta 1, its official edge-of-reach
# dynamics recipe, h = 5) on pendulum-medium-replay (normalised score -8.3; bar 11.7) for 16 x 250 updates:
# seeds 0-2 ended at 72.6, 67.3 and 68.0, and after 6c3fe78's shared backward (at 19193b3) at 64.0, 65.4 and 67.0
# (docs/learning-seeds.md); at 24 x 250, seed 0 ended at 97.7. On
# inverted-pendulum-medium-replay its published settings had not cleared the bar (11.1-21.5 against 23.8 at
# 20 and 40 x 250), nor on pendulum-medium at budget=cpu's 20 x 250 (docs/results.md). MOBILE's published
# settings did not on pendulum-medium-replay either (seed 0 at -10.6 after 24 x 250), nor its case's settings
# there (-24.7, -37.5, -35.6 at 40 x 125).
# name -> (agent class, a function giving its config and generator config, dataset, epochs of 250 updates
# (or of the fifth entry's updates)), the longest first (CI's two workers take them in this order; by their
# times in the fresh-clone CI run of c73ebc2, docs/reproducibility.md, and for MOBILE's and RAVL's cases as
# they now are, their seed-0 runs of 2026-11-30 with their models' fits)
CASES = {
    "mobile": (MOBILE, lambda: small(MOBILE, rollout={"horizon": 5}, target_floor=None),
               "pendulum-medium", 60),
    "coplanner": (COPlanner, published("coplanner", "inverted-pendulum-medium-replay"),
                  "inverted-pendulum-medium-replay", 40),
    "ravl": (RAVL, published("ravl", "pendulum-medium-replay"), "pendulum-medium-replay", 16),
    "morel_sac": (MOReLSAC, published("morel_sac", "inverted-pendulum-medium-replay"),
                  "inverted-pendulum-medium-replay", 100),
    "neubay": (NEUBAY, published("neubay", "pendulum-random"), "pendulum-random", 24),
    "edac": (EDAC, published("edac", "pendulum-medium-replay"), "pendulum-medium-replay", 24, 125),
    "rambo": (RAMBO, published("rambo", "inverted-pendulum-medium-replay"), "inverted-pendulum-medium-replay",
              60, 125),
    "combo": (COMBO, lambda: small(COMBO), "pendulum-medium", 40, 125),
    "cql": (CQL, lambda: model_free(CQL, hidden_layers=2), "pendulum-medium", 40, 125),
    "iql-pgd": (IQL, lambda: pgd(IQL), "pendulum-medium-replay", 80, 125),
    "morel": (MOReL, published("morel", "inverted-pendulum-medium-replay"), "inverted-pendulum-medium-replay",
              12, 1),
    "iql": (IQL, published("iql", "pendulum-medium-replay"), "pendulum-medium-replay", 80, 125),
    "mopo": (MOPO, published("mopo", "inverted-pendulum-medium-replay"), "inverted-pendulum-medium-replay", 60, 125),
    "td3bc": (TD3BC, lambda: model_free(TD3BC, alpha=10.0), "pendulum-medium", 80),
}


def with_refiner(generator, refiner):
    """``generator`` (rollouts or NEUBAY's posterior) with each model step refined by ``refiner`` (a
    `RefinerConfig`)."""
    if generator.kind == "rollouts":
        return dataclasses.replace(generator, rollout=dataclasses.replace(generator.rollout, refiner=refiner))
    if generator.kind == "posterior":
        return dataclasses.replace(generator, posterior=dataclasses.replace(generator.posterior, refiner=refiner))
    raise ValueError(f"generator {generator.kind} steps no dynamics model to refine")


def learning_trainer(name: str, run_dir, cache_dir, seed: int = 0, device: str = "cpu", refiner=None,
                     **trainer_settings):
    """Case ``name``'s data and its `Trainer`, built and not yet trained: the case's agent, generator and
    schedule, with ``seed`` (`TrainerConfig.seed`; `build_run` seeds torch with it), evaluations every 4
    epochs of 10 episodes unless ``trainer_settings`` (other `TrainerConfig` fields) say otherwise. With
    ``refiner`` (a `RefinerConfig`), its generator's model steps are refined (`with_refiner`)."""
    agent_cls, configs, dataset, epochs, *updates = CASES[name]
    data = load_dataset(dataset)
    config, generator = configs()
    if refiner is not None:
        generator = with_refiner(generator, refiner)
    settings = dict(epochs=epochs, updates_per_epoch=(updates or [250])[0], eval_every=4, eval_episodes=10, seed=seed,
                    run_dir=str(run_dir), progress=False, tensorboard=False)
    trainer = build_run(agent_cls.name, data, config, generator, TrainerConfig(**{**settings, **trainer_settings}),
                        device, cache_dir=cache_dir)
    return data, trainer


def learning_run(name: str, run_dir, cache_dir, seed: int = 0, device: str = "cpu",
                 refiner=None) -> tuple[float, list[float]]:
    """Case ``name`` trained (`learning_trainer`): the data's normalised score and the evaluations'
    (`benchmarks/learning_seeds.py` runs it for any seeds)."""
    data, trainer = learning_trainer(name, run_dir, cache_dir, seed, device, refiner)
    trainer.train()
    return data.summary()["normalized_score_mean"], [h["normalized_score"] for h in trainer.history]


def uses_dynamics(name: str) -> bool:
    """Whether case ``name``'s generator steps the shared dynamics model (rollouts)."""
    return CASES[name][1]()[1].kind == "rollouts"


@pytest.fixture(scope="module")
def model_cache(tmp_path_factory):
    """The cache folder of every case whose generator steps a dynamics model, in a folder that pytest-xdist's
    workers share (the cache's file lock lets one of them fit a model while the other waits): each recipe on
    one dataset is fitted once for the cases that share it (OfflineRL-Kit's on pendulum-medium for MOBILE,
    RAVL and COMBO; on inverted-pendulum-medium-replay for COPlanner and MOPO), by the first case that needs it."""
    # imported here: benchmarks/learning_seeds.py loads this file without tests/ on the path
    from conftest import shared_folder

    return shared_folder(tmp_path_factory, "learning-dynamics")


# The cases that only the extended run takes (setup.cfg; docs/reproducibility.md), for CI's time: MOReL-SAC's, MOReL's
# option of a SAC learner (the paper's NPG learner has its case in the default run), 100 x 250 updates, the
# second-longest case (14 minutes of one core of the Zen 1 VM in CI's run of fea2323); and IQL on PGD's data, a
# generator's case beside IQL's own (5.3 minutes there on the published pairing, 2.6-2.9 on the adjusted one). The default run keeps one case per agent.
EXTENDED_CASES = ("morel_sac", "iql-pgd")


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.extended) if name in EXTENDED_CASES else name
                                  for name in CASES])
def test_each_agent_beats_its_dataset(name, request, tmp_path, device):
    if device != "cpu" and name != "ravl":
        pytest.skip("on a GPU only RAVL's learning test runs (the others are CPU tests)")
    cache = request.getfixturevalue("model_cache") if uses_dynamics(name) else tmp_path / "cache"
    data_score, scores = learning_run(name, tmp_path / "run", cache, device=device)
    final = sum(scores[-3:]) / 3  # the last three evaluations, so one lucky or unlucky one cannot decide
    assert final >= data_score + 20, (f"{name} scored {final:.1f} (evaluations "
                                      f"{[round(s, 1) for s in scores]}); data {data_score:.1f}")


def test_the_published_cases_on_one_dataset_share_their_dynamics_fit():
    """COPlanner's and MOPO's cases fit the same dynamics recipe on the same data, so that `model_cache` holds
    one fit for both (CI's time: the fit is minutes on a slow VM)."""
    (_, coplanner, data_a, *_), (_, mopo, data_b, *_) = CASES["coplanner"], CASES["mopo"]
    assert data_a == data_b and coplanner()[1].dynamics == mopo()[1].dynamics


def test_every_registered_agent_has_a_learning_case():
    """A new agent (a module registered in `mbrl_offline.algorithms`) needs its case in `CASES`."""
    from mbrl_offline.algorithms import ALGORITHMS

    missing = set(ALGORITHMS) - {agent_cls.name for agent_cls, *_ in CASES.values()}
    assert not missing, f"no learning test for {sorted(missing)}: add a case to CASES"


SEEDS_PAGE = Path(__file__).resolve().parent.parent / "docs" / "learning-seeds.md"


def seed_rows() -> list[list[str]]:
    """docs/learning-seeds.md's rows (written by `benchmarks/learning_seeds.py --out`), each as its cells."""
    rows = []
    for line in SEEDS_PAGE.read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] in CASES:
            rows.append(cells)
    return rows


def test_each_case_on_published_settings_has_seeds_that_all_pass_in_the_docs():
    """A case that runs its agent's published settings (`runs_published_settings`) has a row of those settings
    in docs/learning-seeds.md, on its dataset and schedule, over at least 3 seeds, every one clearing the
    bar: so a case cannot take the published settings, or change its dataset or schedule, without its seeds
    measured. (Rows of published settings for a case that is adjusted record where the defaults did not
    pass.)"""
    rows = seed_rows()
    assert {cells[1] for cells in rows} <= {"published (budget=cpu)", "adjusted"}, rows
    for name in CASES:
        if not runs_published_settings(name):
            continue
        agent_cls, _, dataset, epochs, *updates = CASES[name]
        schedule = f"{epochs} x {(updates or [250])[0]} updates"
        measured = [cells for cells in rows if cells[0] == name and cells[1].startswith("published")
                    and cells[2].startswith(dataset + " (") and cells[3] == schedule]
        assert measured, (f"{name} runs its published settings on {dataset} ({schedule}) and {SEEDS_PAGE.name} has "
                          f"no row of them: python benchmarks/learning_seeds.py --agents {name} --seeds 0 1 2 "
                          f"--out docs/{SEEDS_PAGE.name}")
        finals, passed = measured[0][4], measured[0][5]
        assert len(finals.split(",")) >= 3 and passed == "yes", (name, finals, passed)


@pytest.mark.parametrize("arguments, message", [
    (["--dataset", "pendulum-mediun"], "--dataset pendulum-mediun is not a bundled dataset"),
    (["--defaults", "--updates", "0"], "--epochs and --updates must be at least 1"),
    (["--epochs", "0"], "--epochs and --updates must be at least 1"),
])
def test_the_seed_tool_refuses_a_schedule_it_cannot_run(arguments, message):
    """`benchmarks/learning_seeds.py` refuses a dataset it does not bundle and a schedule of no updates, with
    or without ``--defaults``, with argparse's error line and exit status 2, before any run starts."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "learning_seeds.py"), "--agents", "iql",
                           *arguments], capture_output=True, text=True, timeout=300)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 2 and message in last and done.stdout == "", done.stderr
