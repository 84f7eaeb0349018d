"""Collection on Pendulum at a tiny budget: the full pipeline, the round trips and exact resumption."""
import json

import pytest

from mbrl_offline import ConfigError, load_dataset
from mbrl_offline.algorithms.sac import SAC
from mbrl_offline.collect import CollectConfig, collect

from conftest import assert_same_transitions

# "medium" here is any policy better than -1100 (random: -1208), reached at the first evaluation,
# so the pipeline runs end to end within seconds; the levels' real thresholds are the defaults.
TINY = dict(env="pendulum", expert_steps=600, start_steps=200, eval_every=200, eval_episodes=2, checkpoint_every=200,
            dataset_size=400, medium_score=-100.0, torch_threads=1, progress=False)


def test_collect_writes_every_level_and_both_formats_load_identically(tmp_path, minari_root):
    written = collect(CollectConfig(**TINY, run_dir=str(tmp_path / "run")))
    assert list(written) == ["random", "medium-replay", "medium", "expert", "medium-expert"]
    levels = {}
    for level in written:
        from_minari = load_dataset(f"mbrl/pendulum/{level}-v0")
        from_hdf5 = load_dataset(str(tmp_path / "run" / f"pendulum-{level}.hdf5"))
        assert_same_transitions(from_minari, from_hdf5)
        assert from_minari.env_id == "Pendulum-v1" and from_minari.ref_min_score == pytest.approx(-1207.555)
        assert from_minari.metadata == from_hdf5.metadata and from_minari.metadata["level"] == level
        levels[level] = from_minari
    for level in ("random", "medium", "expert"):
        assert len(levels[level]) == 400
    medium_meta = levels["medium"].metadata
    assert medium_meta["policy_train_steps"] == 200 and medium_meta["seed"] == 0
    assert medium_meta["policy_eval_episodes"] == 20  # the confirming evaluation describes the policy
    assert levels["expert"].metadata["policy_eval_episodes"] == 20
    assert medium_meta["policy_eval_normalized_score"] >= -100.0
    # medium-replay is the replay buffer when medium was reached: whole episodes, SAC's first steps.
    assert len(levels["medium-replay"]) == 200 and levels["medium-replay"].timeouts[-1]
    # medium-expert is medium followed by expert, unchanged.
    assert_same_transitions(levels["medium-expert"], type(levels["medium"]).concatenate(
        [levels["medium"], levels["expert"]], source="x"))
    returns = levels["random"].episode_returns()
    assert levels["random"].metadata["data_return_mean"] == pytest.approx(returns.mean())


@pytest.mark.extended
def test_interrupted_collection_resumes_to_the_same_datasets(tmp_path, minari_root, monkeypatch):
    config = dict(TINY, levels=("medium", "medium-replay", "expert"), expert_steps=700)
    collect(CollectConfig(**config, run_dir=str(tmp_path / "whole"), namespace="whole"))

    original_update, calls = SAC.update, {"n": 0}

    def crash_after_450_updates(self, batch):
        calls["n"] += 1
        if calls["n"] > 450:
            raise KeyboardInterrupt("simulated kill")
        return original_update(self, batch)

    monkeypatch.setattr(SAC, "update", crash_after_450_updates)
    with pytest.raises(KeyboardInterrupt):
        collect(CollectConfig(**config, run_dir=str(tmp_path / "split"), namespace="split"))
    monkeypatch.setattr(SAC, "update", original_update)
    assert (tmp_path / "split" / "collect_state.pt").exists()
    collect(CollectConfig(**config, run_dir=str(tmp_path / "split"), namespace="split"))

    for level in ("medium", "medium-replay", "expert"):
        whole, split = load_dataset(f"whole/pendulum/{level}-v0"), load_dataset(f"split/pendulum/{level}-v0")
        assert_same_transitions(whole, split)
    evaluations = (tmp_path / "whole" / "evaluations.jsonl").read_text()
    assert evaluations and evaluations == (tmp_path / "split" / "evaluations.jsonl").read_text()


def test_a_lucky_short_evaluation_does_not_choose_the_medium_policy(tmp_path, minari_root, monkeypatch):
    from mbrl_offline import collect as collect_module

    evaluate = collect_module._Collector._evaluate

    def lucky(self, actor, episodes, seed_offset):
        result = evaluate(self, actor, episodes, seed_offset)
        if episodes == TINY["eval_episodes"]:
            result["normalized"] = 100.0  # every short evaluation looks excellent
        return result

    monkeypatch.setattr(collect_module._Collector, "_evaluate", lucky)
    config = CollectConfig(**dict(TINY, levels=("medium",), medium_score=50.0, max_medium_steps=600),
                           run_dir=str(tmp_path / "run"))
    with pytest.raises(ConfigError, match="did not reach the medium score"):
        collect(config)
    evaluations = [json.loads(line) for line in (tmp_path / "run" / "evaluations.jsonl").read_text().splitlines()]
    assert evaluations and all(e["confirmation"]["episodes"] == 20 for e in evaluations)
    assert all(e["confirmation"]["normalized"] < 50.0 for e in evaluations)


def test_existing_datasets_are_not_overwritten(tmp_path, minari_root):
    config = dict(TINY, levels=("random",))
    collect(CollectConfig(**config, run_dir=str(tmp_path / "a")))
    before = (minari_root / "mbrl/pendulum/random-v0/data/main_data.hdf5").read_bytes()
    with pytest.raises(ConfigError, match="already exist .* overwrite=true"):
        collect(CollectConfig(**config, run_dir=str(tmp_path / "b")))
    assert (minari_root / "mbrl/pendulum/random-v0/data/main_data.hdf5").read_bytes() == before
    assert not (tmp_path / "b").exists()


def test_resume_with_other_settings_is_refused(tmp_path, minari_root):
    collect(CollectConfig(**dict(TINY, levels=("random",)), run_dir=str(tmp_path / "a")))
    with pytest.raises(ConfigError, match=r"different settings \(seed\)"):
        collect(CollectConfig(**dict(TINY, levels=("random",), seed=1), run_dir=str(tmp_path / "a")))


def test_unreached_medium_level_fails_with_advice(tmp_path, minari_root):
    config = CollectConfig(**dict(TINY, levels=("medium",), medium_score=99.0, max_medium_steps=400),
                           run_dir=str(tmp_path / "a"))
    with pytest.raises(ConfigError, match="did not reach the medium score 99.0 within 400 steps"):
        collect(config)
    assert (tmp_path / "a" / "collect_state.pt").exists()
    # As the message advises: a lower threshold resumes the same run and reaches medium.
    config.medium_score = -100.0
    written = collect(config)
    assert list(written) == ["medium"]
    assert load_dataset("mbrl/pendulum/medium-v0").metadata["medium_score_threshold"] == -100.0
    # Once medium is chosen, its threshold is part of what the data means and cannot change.
    config.medium_score = -50.0
    with pytest.raises(ConfigError, match=r"different settings \(medium_score\)"):
        collect(config)


def test_bad_levels_are_rejected():
    with pytest.raises(ConfigError, match="unknown dataset level"):
        collect(CollectConfig(env="pendulum", levels=("mediocre",)))
    with pytest.raises(ConfigError, match="unknown env"):
        collect(CollectConfig(env="pendulumm"))
