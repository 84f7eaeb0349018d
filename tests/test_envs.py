import numpy as np
import pytest
import torch

from mbrl_offline import ConfigError, get_env_info
from mbrl_offline.data.envs import ENVS


def test_lookup_by_short_name_and_gym_id():
    assert get_env_info("hopper").gym_id == "Hopper-v5"
    assert get_env_info("Walker2d-v5").name == "walker2d"


def test_unknown_env_suggests_the_closest_name():
    with pytest.raises(ConfigError, match="unknown env 'hoper'. Did you mean 'hopper'?"):
        get_env_info("hoper")


@pytest.mark.parametrize("name", list(ENVS))
def test_registry_matches_the_real_env(name):
    info = get_env_info(name)
    env = info.make()
    assert env.observation_space.shape == (info.obs_dim,)
    assert env.action_space.shape == (info.act_dim,)
    assert info.ref_min_score < info.ref_max_score


@pytest.mark.parametrize("name", list(ENVS))
def test_termination_function_agrees_with_env_step(name):
    """Random and biased-random actions drive each env into its terminal states; the function must
    predict every `terminated` flag the env reports, and no others."""
    info = get_env_info(name)
    env = info.make()
    rng = np.random.default_rng(0)
    next_obs, flags = [], []
    for episode in range(40):
        obs, _ = env.reset(seed=episode)
        bias = rng.uniform(-1, 1, info.act_dim) * env.action_space.high
        for _ in range(300):
            action = np.clip(bias + rng.normal(0, 0.5, info.act_dim) * env.action_space.high,
                             env.action_space.low, env.action_space.high).astype(np.float32)
            obs, _, terminated, truncated, _ = env.step(action)
            next_obs.append(obs)
            flags.append(terminated)
            if terminated or truncated:
                break
    predicted = info.termination_fn(torch.as_tensor(np.array(next_obs), dtype=torch.float32)).numpy()
    np.testing.assert_array_equal(predicted, np.array(flags))
    if name in ("hopper", "walker2d", "inverted-pendulum", "ant"):
        assert any(flags), "the rollouts should reach terminal states"


def test_termination_functions_take_batched_leading_dimensions():
    obs = torch.zeros(4, 5, 11)
    assert get_env_info("hopper").termination_fn(obs).shape == (4, 5)


@pytest.mark.parametrize("name", list(ENVS))
def test_max_episode_steps_is_gymnasiums_time_limit(name):
    import gymnasium as gym

    info = get_env_info(name)
    assert info.max_episode_steps == gym.spec(info.gym_id).max_episode_steps
    assert info.max_episode_steps == (200 if name == "pendulum" else 1000)
