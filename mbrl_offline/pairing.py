"""The one judge of an agent and a generator (`check_pair`, exported by `mbrl_offline.compose`), from
their classes' declarations (`mbrl_offline.roles.AgentClass`, `GeneratorClass`) and their settings, and
its judgment of a policy at generation time (`check_policy`)."""
from __future__ import annotations

from mbrl_offline import registry
from mbrl_offline.buffer import Mixing, run_mixing
from mbrl_offline.errors import ConfigError


def check_pair(agent_cls, generator_config, algo_config=None, agent=None, generator_cls=None) -> None:
    """The one judge of an agent and a generator: refuse, in one `ConfigError` line, every mistake that
    the agent's class (`mbrl_offline.roles.AgentClass`), its settings ``algo_config`` (None: its
    defaults) and the generator's settings ``generator_config`` (None or ``kind='none'``: no generator)
    show on their own. `build_run` and the command line call it before any data is loaded, model
    fitted or file written; `mbrl_offline.trainer.Trainer` calls it for parts built by hand (``agent``:
    the instance, for checks that read it; ``generator_cls``: the generator's class, where it is known
    and perhaps not registered; None: the registry's for the config's kind).

    Checked, from the classes' declarations: that the generator produces what the agent learns from
    (``produces``/``consumes``), that it can roll out the agent's policy (``recurrent_policy`` for a
    recurrent agent), and that it has the dynamics model the agent's losses need
    (``provides_dynamics``/``needs_dynamics``). From the settings: that the mixing rule draws what the
    agent learns from (tapes for an agent of sequences, rows otherwise) and can fill its batch
    (``mixing.real_rows`` at most ``algo.batch_size``), and the generator config's own checks of the
    agent (``check_agent``, e.g. the posterior's rollouts per elite). An ``on_policy`` agent (MOReL's NPG)
    needs a generator that generates before every update (``every=1``) and the ``latest`` mixing rule. A generator config's checks of
    itself (its kind, schedule and mixing settings) ran when it was made (`mbrl_offline.roles.GeneratorConfig`)."""
    kind = getattr(generator_config, "kind", "none")
    if generator_cls is None and kind in registry.GENERATORS:
        generator_cls = registry.GENERATORS[kind][1]
    name = agent_cls.name
    if generator_cls is not None:
        if generator_cls.produces != agent_cls.consumes:
            raise ConfigError(f"generator '{kind}' produces {generator_cls.produces}, but {name} learns from "
                              f"{agent_cls.consumes}; choose a generator that produces {agent_cls.consumes}.")
        if agent_cls.recurrent and not generator_cls.recurrent_policy:
            raise ConfigError(_recurrent_policy_message(kind, f"{name}'s policy"))
    if agent_cls.needs_dynamics and (generator_cls is None or not generator_cls.provides_dynamics):
        raise ConfigError(f"{name}'s penalty needs the generator's dynamics model, and generator '{kind}' has none; "
                          f"use generator=rollouts, or leave generator unset for {name}'s own.")
    if algo_config is None:
        algo_config = agent_cls.config_class()
    mixing = run_mixing(agent_cls.consumes, generator_config)
    if (mixing.rule == "tape") != (agent_cls.consumes == "sequences"):
        raise ConfigError(f"{name} learns from {agent_cls.consumes}, and mixing.rule={mixing.rule} "
                          + ("draws rows, not tapes; set generator.mixing.rule=tape." if agent_cls.consumes == "sequences"
                             else "draws tapes of episodes; choose another mixing rule (e.g. fraction)."))
    Mixing(mixing).real_rows(algo_config.batch_size)  # a rule that cannot fill the agent's batch fails here
    if getattr(agent_cls, "on_policy", False):  # learns from the current policy's fresh paths only (MOReL's NPG)
        if generator_cls is None:
            raise ConfigError(f"{name} learns from rollouts of its current policy only, and generator '{kind}' makes "
                              f"none; leave generator unset for {name}'s own.")
        if mixing.rule != "latest" or getattr(generator_config, "every", 0) != 1 or generator_config.utd is not None:
            raise ConfigError(f"{name} learns on-policy: each update must take a fresh generation whole; set "
                              f"generator.every=1, generator.utd=null and generator.mixing.rule=latest (got every="
                              f"{getattr(generator_config, 'every', None)}, rule={mixing.rule}).")
    if generator_config is not None:
        generator_config.check_agent(agent if agent is not None else agent_cls, algo_config)


def _recurrent_policy_message(kind: str, policy: str) -> str:
    return (f"generator '{kind}' rolls out feed-forward policies, and {policy} is recurrent: a recurrent agent needs "
            f"a sequence generator (e.g. generator=posterior).")


def check_policy(generator, policy) -> None:
    """``check_pair``'s judgment of the policy, for a generator used by hand (its ``generate`` calls
    this): a recurrent ``policy`` is refused, in one line, by a generator whose class declares
    ``recurrent_policy`` False."""
    if getattr(policy, "recurrent", False) and not type(generator).recurrent_policy:
        raise ConfigError(_recurrent_policy_message(generator.config.kind, "this policy"))
