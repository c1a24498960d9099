"""The per-method config sections (issue 33 item 2): `train` keeps what every method shares, each method's knobs
live in its own section, one rule refuses a method key the run's algorithm does not read, and the flat keys of
earlier versions fail with where they moved."""

from __future__ import annotations

import dataclasses

import pytest

from diffusion_rl.config import (
    ALGORITHMS,
    METHOD_SECTIONS,
    MOVED_TRAIN_KEYS,
    NFTConfig,
    RunConfig,
    TrainConfig,
    from_dict,
    load_config,
)
from mmreward.errors import ConfigError

MOCK = {"reward": {"rewards": {"mock": 1.0}}}

# who reads each section, from the algorithm modules and the trainer (written out here, not taken from config.py)
READERS = {
    "ppo": {"grpo", "grpo_guard", "pref_grpo", "ddpo"}, "draft": {"draft"}, "nft": {"nft"}, "dpo": {"dpo"},
    "prdp": {"prdp"}, "raft": {"raft"}, "awm": {"awm"}, "dgpo": {"dgpo"}, "crd": {"crd"}, "refl": {"refl"},
}
# a key of each section, a value other than its default, and what the algorithm needs besides to be valid
PROBE = {"ppo": ("kl_mode", "flow_grpo"), "draft": ("backprop_steps", 2), "nft": ("beta", 2.0),
         "dpo": ("beta", 10.0), "prdp": ("beta", 5.0), "raft": ("top_k", 2), "awm": ("adv_clip", 2.0),
         "dgpo": ("timesteps", 2), "crd": ("beta", 2.0), "refl": ("margin", 1.0)}
NEEDS = {"draft": {"sample": {"kernel": "ode", "noise_level": 0.0}}, "refl": {"sample": {"kernel": "ode"}},
         **{a: {"sample": {"kernel": "ode"}} for a in ("nft", "dpo", "raft", "awm", "dgpo", "crd")}}


def _run(algo: str, **sections) -> dict:
    return {"train": {"algorithm": algo}, **NEEDS.get(algo, {}), **sections, **MOCK}


def test_the_sections_and_their_readers():
    assert set(METHOD_SECTIONS) == set(READERS)
    assert {s: set(cls.READERS) for s, cls in METHOD_SECTIONS.items()} == READERS
    assert set().union(*READERS.values()) == set(ALGORITHMS)  # every algorithm's own keys have a section
    # what stays in train is read by several methods (or is the loop / optimizer)
    shared = {"clip_range", "timestep_fraction", "timestep_selection", "kl_beta", "kl_reference"}
    assert shared <= {f.name for f in dataclasses.fields(TrainConfig)}


@pytest.mark.parametrize("section", sorted(READERS))
def test_a_method_key_is_read_only_by_its_algorithms(section):
    key, value = PROBE[section]
    for algo in ALGORITHMS:
        data = _run(algo, **{section: {key: value}})
        if algo in READERS[section]:
            assert getattr(getattr(from_dict(data), section), key) == value
        else:
            with pytest.raises(ConfigError, match=rf"{section}\.{key} is read by .*, not by train.algorithm {algo}"):
                from_dict(data)


def test_a_key_given_at_its_default_is_refused_too_and_a_narrower_key_names_its_readers():
    with pytest.raises(ConfigError, match="nft.beta is read by nft, not by train.algorithm grpo"):
        from_dict({"nft": {"beta": 1.0}, **MOCK})  # the default value: still a key grpo ignores
    with pytest.raises(ConfigError, match="ppo.best_worst_k is read by grpo, grpo_guard and pref_grpo, not by "
                                          "train.algorithm ddpo"):
        from_dict({"preset": "ddpo", "ppo": {"best_worst_k": 0}, **MOCK})
    assert from_dict({"preset": "ddpo", "ppo": {"ratio_norm": True}, **MOCK}).ppo.ratio_norm


def test_a_config_built_in_code_is_held_to_the_same_rule():
    reward = from_dict(MOCK).reward
    with pytest.raises(ConfigError, match="nft.beta is read by nft, not by train.algorithm grpo"):
        RunConfig(nft=NFTConfig(beta=2.0), reward=reward)
    assert RunConfig(train=TrainConfig(algorithm="nft"), nft=NFTConfig(beta=2.0), reward=reward).nft.beta == 2.0
    assert RunConfig(nft=NFTConfig(), reward=reward).train.algorithm == "grpo"  # defaults: nothing was set


@pytest.mark.parametrize("old, new", [("nft_beta", "nft.beta"), ("hacking_guard", "guard.mode"),
                                      ("kl_mode", "ppo.kl_mode"), ("crd_kl_cfg", "crd.kl_cfg"),
                                      ("refl_step_range", "refl.step_range"), ("dpo_pairs", "dpo.pairs"),
                                      ("backprop_steps", "draft.backprop_steps")])
def test_an_old_flat_key_says_where_it_moved(old, new, tmp_path):
    with pytest.raises(ConfigError, match=rf"train\.{old} moved to {new}"):
        from_dict({"train": {old: 1}, **MOCK})
    path = tmp_path / "old.yaml"
    path.write_text(f"train:\n  {old}: 1\nreward:\n  rewards: {{mock: 1.0}}\n")
    with pytest.raises(ConfigError, match=rf"train\.{old} moved to {new}"):
        load_config(path)
    with pytest.raises(ConfigError, match=rf"train\.{old} moved to {new}"):
        load_config(None, [f"train.{old}=1", "reward.rewards={mock: 1}"])


def test_every_moved_key_left_train_and_names_an_existing_key():
    cfg = from_dict(MOCK)
    train = {f.name for f in dataclasses.fields(TrainConfig)}
    for old, where in MOVED_TRAIN_KEYS.items():
        section, key = where.split()[0].split(".")
        assert old not in train and hasattr(getattr(cfg, section), key), (old, where)


@pytest.mark.parametrize("preset", ["flow_grpo", "diffusion_nft", "crd", "draft", "diffusion_dpo"])
def test_to_dict_keeps_the_read_sections_and_round_trips(preset):
    cfg = from_dict({"preset": preset, **MOCK})
    data = cfg.to_dict()
    algo = cfg.train.algorithm
    assert {s for s in READERS if s in data} == {s for s in READERS if algo in READERS[s]}
    assert "guard" in data and "train" in data
    assert from_dict(data) == cfg  # a saved config.yaml loads back to the same run
