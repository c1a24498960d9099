"""Edit records as prompts: {source_image, instruction} rows, the source image reaching the rewards."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from mmreward.edit import EditPrompt, source_images
from mmreward.errors import ConfigError, RewardInputError
from mmreward.prompt_sources import load_prompts, score_with_metadata
from mmreward.types import Reward, RewardOutput


def _png(path, value):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((8, 8, 3), value, dtype=np.uint8)).save(path)
    return path


class _SourceGap(Reward):
    """Mean |edited - source| per item: what an edit reward computes from the source in its metadata."""

    name = "source-gap"
    accepts_metadata = True

    def _score(self, prompts, media, metadata=None):
        src = source_images(metadata, len(prompts), self.name, size=tuple(media.shape[-2:]))
        return RewardOutput((media - src).abs().flatten(1).mean(1))


def test_jsonl_edit_records_resolve_paths_and_keep_sources_apart(tmp_path):
    _png(tmp_path / "data" / "scenes" / "a.png", 0)
    _png(tmp_path / "data" / "scenes" / "b.png", 255)
    rows = [{"source_image": "scenes/a.png", "instruction": "make the circle blue", "edit": {"kind": "color"}},
            {"source_image": "scenes/b.png", "instruction": "make the circle blue"}]
    path = tmp_path / "data" / "edits.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")

    prompts = load_prompts(str(path))  # relative to the JSONL file, not the working directory
    assert [str(p) for p in prompts] == ["make the circle blue"] * 2
    assert all(isinstance(p, EditPrompt) for p in prompts)
    assert prompts[0] != prompts[1] and len({prompts[0], prompts[1]}) == 2  # same text, two prompts
    assert prompts.metadata[0] == {"source_image": str((tmp_path / "data/scenes/a.png").resolve()),
                                   "edit": {"kind": "color"}}
    # the metadata lookup by prompt (what the trainer does) finds each record's own source
    assert [m["source_image"] for m in prompts.metadata_for([prompts[1], prompts[0]])] == [
        str((tmp_path / "data/scenes/b.png").resolve()), str((tmp_path / "data/scenes/a.png").resolve())]

    # an edit reward gets the source pixels: a black source and a white one against a grey edit
    edited = torch.full((2, 3, 8, 8), 0.25)
    out = score_with_metadata(_SourceGap(), list(prompts), edited, prompts)
    torch.testing.assert_close(out.scores, torch.tensor([0.25, 0.75]), rtol=1e-6, atol=1e-6)


def test_inline_edit_rows_and_tensor_sources(tmp_path, monkeypatch):
    _png(tmp_path / "s.png", 128)
    monkeypatch.chdir(tmp_path)
    prompts = load_prompts([{"source_image": "s.png", "prompt": "add a circle"}, "a plain prompt"])
    assert isinstance(prompts[0], EditPrompt) and not isinstance(prompts[1], EditPrompt)
    assert prompts[0].source == str((tmp_path / "s.png").resolve())
    # called directly, an edit reward takes tensors as sources, resized to the edit's size
    out = _SourceGap().score(["x"], torch.zeros(1, 3, 4, 4), metadata=[{"source_image": torch.ones(3, 8, 8)}])
    torch.testing.assert_close(out.scores, torch.ones(1))


@pytest.mark.parametrize("row, match", [
    ({"source_image": "missing.png", "instruction": "make it red"}, "does not exist"),
    ({"source_image": "s.png"}, "instruction"),
    ({"source_image": "s.png", "instruction": "a", "prompt": "b"}, "exactly one"),
    ({"source_image": 3, "instruction": "a"}, "path string"),
])
def test_malformed_edit_records_are_config_errors(tmp_path, row, match):
    _png(tmp_path / "s.png", 0)
    path = tmp_path / "e.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(ConfigError, match=match) as info:
        load_prompts(str(path))
    assert "e.jsonl:1" in str(info.value)  # the error names the line


def test_edit_reward_without_sources_says_how_to_pass_them():
    with pytest.raises(RewardInputError, match="source_image"):
        _SourceGap().score(["x"], torch.zeros(1, 3, 4, 4), metadata=[{}])
