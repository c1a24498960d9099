"""Registry, sources, checkpoints: names, tags, hub ids, local folders, classes, strict loading, offline errors."""

from __future__ import annotations

import json

import pytest
import torch

import mmreward
from mmreward import checkpoints, registry
from mmreward.errors import CheckpointError, MissingExtraError, UnknownRewardError
from mmreward.registry import RewardSpec, register_reward


@pytest.fixture(autouse=True)
def _restore_registry():
    saved = dict(registry.specs())
    yield
    registry._REGISTRY.clear()
    registry._REGISTRY.update(saved)


def test_unknown_name_lists_valid_ones_and_suggests():
    with pytest.raises(UnknownRewardError) as err:
        mmreward.load("jpeg-compressibilty")
    msg = str(err.value)
    assert "Did you mean 'jpeg-compressibility'" in msg and "mock" in msg


def test_parse_source_kinds(tmp_path):
    names = ["clipscore", "mock"]
    assert checkpoints.parse_source("mock", names).kind == "name"
    assert checkpoints.parse_source("clipscore:openai-l14", names) == checkpoints.Source("name", "clipscore", "openai-l14")
    assert checkpoints.parse_source("hf-hub:org/repo@v1", names) == checkpoints.Source("hub", "org/repo", revision="v1")
    assert checkpoints.parse_source(str(tmp_path), names).kind == "local"
    assert checkpoints.parse_source(f"local-dir:{tmp_path}", names).kind == "local"
    assert checkpoints.parse_source("mmreward.models.mock:MockReward", names).kind == "class"
    with pytest.raises(CheckpointError, match="org/repo"):
        checkpoints.parse_source("hf-hub:justone", names)


def test_tags_class_sources_and_local_cards(tmp_path):
    seen = {}

    def loader(checkpoint, *, weights, **options):
        seen.update(checkpoint=checkpoint, weights=weights, **options)
        return mmreward.load("mock")

    register_reward(RewardSpec("test-tagged", loader, "t", default_checkpoint="org/default",
                               tags={"small": "org/small"}, card_options={"head": "value"}), overwrite=True)
    mmreward.load("test-tagged:small")
    assert seen["checkpoint"] == "org/small"
    with pytest.raises(UnknownRewardError, match="no tag 'huge'"):
        mmreward.load("test-tagged:huge")
    mmreward.load("hf-hub:org/small")
    assert seen["checkpoint"] == "hf-hub:org/small"
    with pytest.raises(UnknownRewardError, match="no registered reward uses the hub repo"):
        mmreward.load("hf-hub:org/unknown")

    (tmp_path / "mmreward.json").write_text(json.dumps({"reward": "test-tagged", "options": {"head": "mlp"}}))
    mmreward.load(tmp_path)
    assert seen["checkpoint"] == str(tmp_path) and seen["head"] == "mlp"
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UnknownRewardError, match="no mmreward.json"):
        mmreward.load(empty)

    r = mmreward.load("mmreward.models.mock:MockReward", micro_batch_size=2)
    assert r.micro_batch_size == 2
    with pytest.raises(UnknownRewardError, match="not an mmreward.Reward"):
        mmreward.load("collections:OrderedDict")
    with pytest.raises(CheckpointError, match="weights must be"):
        mmreward.load("mock", weights="zeros")


def test_missing_weights_and_extras_are_errors_not_random_models():
    register_reward(RewardSpec("test-noweights", lambda c, **k: None, "t"), overwrite=True)
    with pytest.raises(CheckpointError, match="no default checkpoint"):
        mmreward.load("test-noweights")
    register_reward(RewardSpec("test-extra", lambda c, **k: None, "t", requires=("surely_not_a_module",),
                               extra="detectors"), overwrite=True)
    with pytest.raises(MissingExtraError, match=r"mmreward\[detectors\]"):
        mmreward.load("test-extra")
    register_reward(RewardSpec("test-hint", lambda c, **k: None, "t", requires=("surely_not_a_module",),
                               install_hint="pip install --no-deps weights-pkg"), overwrite=True)
    with pytest.raises(MissingExtraError, match="pip install --no-deps weights-pkg"):
        mmreward.load("test-hint")


def test_offline_hub_miss_names_files_and_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(CheckpointError) as err:
        checkpoints.resolve_files("someorg/somemodel", ["model.safetensors", "config.json"])
    msg = str(err.value)
    assert "model.safetensors" in msg and "config.json" in msg and "offline" in msg and "checkpoint='/path/to/folder'" in msg


def test_resolve_files_in_folders_and_files(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"x")
    assert checkpoints.resolve_files(tmp_path, ["a.bin"]) == {"a.bin": tmp_path / "a.bin"}
    assert checkpoints.resolve_files(tmp_path / "a.bin", ["weights.pt"]) == {"weights.pt": tmp_path / "a.bin"}
    with pytest.raises(CheckpointError, match=r"missing \['b.json'\]"):
        checkpoints.resolve_files(tmp_path, ["a.bin", "b.json"])
    with pytest.raises(CheckpointError, match="neither an existing file"):
        checkpoints.resolve_files(tmp_path / "nope" / "x", ["a"])


def test_state_dict_files_and_strict_loading(tmp_path):
    from safetensors.torch import save_file

    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1))
    sd = model.state_dict()
    torch.save({"state_dict": sd}, tmp_path / "w.pt")
    save_file(sd, str(tmp_path / "w.safetensors"))
    for name in ("w.pt", "w.safetensors"):
        loaded = checkpoints.load_state_dict(tmp_path / name)
        fresh = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1))
        checkpoints.load_strict(fresh, loaded, name)
        torch.testing.assert_close(fresh[0].weight, model[0].weight)
    broken = dict(sd)
    broken.pop("1.bias")
    broken["extra.weight"] = torch.zeros(1)
    broken["0.weight"] = torch.zeros(5, 5)
    with pytest.raises(CheckpointError) as err:
        checkpoints.load_strict(model, broken, "w.pt")
    msg = str(err.value)
    assert "1 missing keys" in msg and "'1.bias'" in msg and "1 unexpected keys" in msg and "0.weight: file (5, 5)" in msg
    (tmp_path / "junk.pt").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="cannot read weights file"):
        checkpoints.load_state_dict(tmp_path / "junk.pt")
    with pytest.raises(CheckpointError, match="no 'model' entry"):
        checkpoints.load_state_dict(tmp_path / "w.pt", key="model")


def test_device_and_dtype_resolution():
    assert checkpoints.resolve_dtype("bf16") == torch.bfloat16
    assert checkpoints.resolve_dtype(None) == torch.float32
    with pytest.raises(CheckpointError, match="dtype"):
        checkpoints.resolve_dtype("fp8")
    if not torch.cuda.is_available():
        with pytest.raises(CheckpointError, match="CUDA is not available"):
            checkpoints.resolve_device("cuda")
        assert checkpoints.resolve_device(None).type == "cpu"
