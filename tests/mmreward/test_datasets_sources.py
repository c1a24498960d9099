"""Prompt and preference-pair sources: lists, text and JSONL files, Hugging Face datasets (save_to_disk folders,
hf: ids, builders), GenEval metadata reaching the rewards that read it, and train-pref on Image() columns."""

from __future__ import annotations

import importlib.util
import io
import json
import sys

import numpy as np
import pytest
import torch

import mmreward
from mmreward.errors import CheckpointError, ConfigError, MissingExtraError, RewardInputError
from mmreward.prompt_sources import PromptList, load_prompts, score_with_metadata
from mmreward.types import Reward, RewardOutput

needs_datasets = pytest.mark.skipif(importlib.util.find_spec("datasets") is None, reason="needs mmreward[datasets]")

GENEVAL_ROWS = [
    {"tag": "colors", "include": [{"class": "circle", "count": 1, "color": "red"}], "prompt": "a photo of a red circle"},
    {"tag": "counting", "include": [{"class": "square", "count": 2}], "exclude": [{"class": "square", "count": 3}],
     "prompt": "a photo of two squares"},
    {"tag": "position", "include": [{"class": "cross", "count": 1}, {"class": "triangle", "count": 1,
                                                                      "position": ["left of", 0]}],
     "prompt": "a photo of a triangle left of a cross"},
]


def _metadata(rows):
    return [{k: v for k, v in r.items() if k != "prompt"} for r in rows]


@pytest.fixture
def datasets_cache(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")
    return datasets


def test_prompts_from_lists_text_and_geneval_jsonl(tmp_path):
    from diffusion_rl.config import PromptsConfig

    assert load_prompts(["a", {"prompt": "b", "seed": 3}]).metadata == [{}, {"seed": 3}]
    (tmp_path / "p.txt").write_text("a red circle\n\n  a blue square \n")
    txt = load_prompts(str(tmp_path / "p.txt"))
    assert txt == ["a red circle", "a blue square"] and not txt.has_metadata
    path = tmp_path / "evaluation_metadata.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in GENEVAL_ROWS) + "\n")
    got = PromptsConfig(train=str(path)).load("train")
    assert isinstance(got, PromptList)
    assert got == [r["prompt"] for r in GENEVAL_ROWS]
    assert got.metadata == _metadata(GENEVAL_ROWS)
    assert got.metadata_for(["a photo of two squares"]) == [_metadata(GENEVAL_ROWS)[1]]
    with pytest.raises(ConfigError, match=r"prompts.train: .*missing.txt.* is not a file"):
        PromptsConfig(train=str(tmp_path / "missing.txt")).load("train")
    (tmp_path / "bad.jsonl").write_text('{"text": "no prompt key"}\n')
    with pytest.raises(ConfigError, match=r"bad.jsonl:1: expected a prompt string"):
        load_prompts(str(tmp_path / "bad.jsonl"))
    with pytest.raises(ConfigError, match="different metadata"):
        PromptList(["a", "a"], [{"x": 1}, {"x": 2}]).metadata_for(["a"])


@needs_datasets
def test_prompts_from_datasets_folders_hf_ids_and_builders(tmp_path, datasets_cache):
    datasets = datasets_cache
    rows = {"prompt": ["a red circle", "two blue squares"], "tag": ["colors", "counting"], "seed": [1, 2]}
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "single"))
    got = load_prompts(str(tmp_path / "single"))
    assert got == rows["prompt"] and got.metadata == [{"tag": "colors", "seed": 1}, {"tag": "counting", "seed": 2}]
    assert load_prompts(f"hf:{tmp_path / 'single'}").metadata == got.metadata

    splits = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"caption": ["x", "y"]}),
                                   "test": datasets.Dataset.from_dict({"caption": ["z"]})})
    splits.save_to_disk(str(tmp_path / "splits"))
    assert load_prompts(str(tmp_path / "splits")) == ["x", "y"]  # train by default; caption found by name
    assert load_prompts({"dataset": str(tmp_path / "splits"), "split": "test"}) == ["z"]
    with pytest.raises(ConfigError, match=r"splits \['train', 'test'\]"):
        load_prompts({"dataset": str(tmp_path / "splits"), "split": "validation"})

    jsonl = tmp_path / "meta.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in GENEVAL_ROWS))
    built = load_prompts({"dataset": "json", "data_files": str(jsonl), "column": "prompt"})
    assert built == [r["prompt"] for r in GENEVAL_ROWS]
    assert [m["tag"] for m in built.metadata] == ["colors", "counting", "position"]
    assert built.metadata[2]["include"][1]["position"] == ["left of", 0]
    with pytest.raises(ConfigError, match=r"has the columns \['prompt', 'tag', 'seed'\], not 'text'"):
        load_prompts({"dataset": str(tmp_path / "single"), "column": "text"})


@needs_datasets
def test_a_dataset_missing_offline_names_what_to_download(datasets_cache):
    with pytest.raises(CheckpointError, match="nobody/not-cached.*download it first"):
        load_prompts("hf:nobody/not-cached:train", "prompts.eval")


def test_without_datasets_a_dataset_source_asks_for_the_extra(tmp_path, monkeypatch):
    from mmreward.train.preference import read_pairs

    (tmp_path / "saved").mkdir()
    (tmp_path / "saved" / "state.json").write_text("{}")  # what save_to_disk writes for a Dataset
    monkeypatch.setitem(sys.modules, "datasets", None)  # an import of it now fails as if not installed
    with pytest.raises(MissingExtraError, match=r"pip install 'mmreward\[datasets\]'"):
        load_prompts(str(tmp_path / "saved"))
    with pytest.raises(MissingExtraError, match=r"mmreward\[datasets\]"):
        read_pairs("hf:org/pairs")
    assert load_prompts(["still fine"]) == ["still fine"]


def _scenes():
    from mmreward.synthetic.captions import parse_prompt
    from mmreward.synthetic.scenes import render, scenes_for_specs

    specs = [parse_prompt(p) for p in ("a red circle", "two squares", "a triangle left of a cross")]
    return render(scenes_for_specs(specs, seed=0), size=64)


def test_geneval_reads_the_clauses_from_metadata_not_the_prompt():
    images = _scenes()
    reward = mmreward.load("geneval", detector="shapesworld")
    true_prompts = [r["prompt"] for r in GENEVAL_ROWS]
    assert reward.score(true_prompts, images).scores.tolist() == [1.0, 1.0, 1.0]
    # prompt texts that contradict the images (and the metadata)
    wrong = ["a photo of a blue square", "a photo of three squares", "a photo of a triangle right of a cross"]
    assert reward.score(wrong, images).scores.tolist() == [0.0, 0.0, 0.0]
    by_meta = reward.score(wrong, images, metadata=_metadata(GENEVAL_ROWS))
    assert by_meta.scores.tolist() == [1.0, 1.0, 1.0]
    # and the other way round: true prompts, metadata asking for what is not there
    wrong_meta = [{"tag": "colors", "include": [{"class": "circle", "count": 1, "color": "blue"}]},
                  {"tag": "counting", "include": [{"class": "square", "count": 3}],
                   "exclude": [{"class": "square", "count": 4}]},
                  {"tag": "position", "include": [{"class": "cross", "count": 1},
                                                  {"class": "triangle", "count": 1, "position": ["right of", 0]}]}]
    assert reward.score(true_prompts, images, metadata=wrong_meta).scores.tolist() == [0.0, 0.0, 0.0]
    # a row without 'include' (plain JSONL metadata) falls back to the prompt
    assert reward.score(true_prompts, images, metadata=[{"seed": 1}] * 3).scores.tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(RewardInputError, match="exclude.*counting form"):
        reward.score(true_prompts[:1], images[:1], metadata=[{"tag": "colors", "include": [{"class": "circle"}],
                                                             "exclude": [{"class": "square", "count": 1}]}])


class _SpyReward(Reward):
    name = "spy"
    requires_prompt = True
    accepts_metadata = True

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[list[str], list[dict] | None]] = []

    def _score(self, prompts, media, metadata=None):
        self.seen.append((list(prompts), metadata))
        return RewardOutput(torch.tensor([float(m["value"]) if metadata else 0.0 for m in (metadata or prompts)]))


def test_score_with_metadata_passes_it_only_to_rewards_that_read_it():
    prompts = PromptList(["a", "b"], [{"value": 2}, {"value": 5}])
    images = torch.rand(3, 3, 8, 8)
    spy = _SpyReward()
    out = score_with_metadata(spy, ["b", "a", "b"], images, prompts)
    assert out.scores.tolist() == [5.0, 2.0, 5.0]
    assert spy.seen[-1] == (["b", "a", "b"], [{"value": 5}, {"value": 2}, {"value": 5}])
    mock = mmreward.load("mock")
    torch.testing.assert_close(score_with_metadata(mock, ["a", "b", "a"], images, prompts).scores,
                               mock.score(["a", "b", "a"], images).scores)
    with pytest.raises(RewardInputError, match="does not read per-prompt metadata"):
        mock.score(["a"], images[:1], metadata=[{"value": 1}])
    with pytest.raises(RewardInputError, match="got 1 dicts for 3 media items"):
        spy.score(["a", "b", "a"], images, metadata=[{"value": 1}])


def _pair_images(n: int):
    from PIL import Image

    rng = np.random.default_rng(0)
    reds, blues = [], []
    for _ in range(n):
        red, blue = np.zeros((24, 24, 3), np.uint8), np.zeros((24, 24, 3), np.uint8)
        red[..., 0] = 180 + rng.integers(0, 70)
        blue[..., 2] = 180 + rng.integers(0, 70)
        reds.append(Image.fromarray(red))
        blues.append(Image.fromarray(blue))
    return reds, blues


@needs_datasets
def test_train_pref_on_a_datasets_folder_with_image_columns(tmp_path, datasets_cache):
    from datasets import Dataset, Features, Image, Value

    from mmreward.models.clip_score import TINY_CLIP_CONFIG
    from mmreward.train.preference import PrefTrainConfig, read_pairs, train

    reds, blues = _pair_images(12)
    a = [r if i % 2 else b for i, (r, b) in enumerate(zip(reds, blues))]
    b = [b if i % 2 else r for i, (r, b) in enumerate(zip(reds, blues))]
    features = Features({"prompt": Value("string"), "image_a": Image(), "image_b": Image(), "label": Value("float32")})
    ds = Dataset.from_dict({"prompt": ["a red square"] * 12, "image_a": a, "image_b": b,
                            "label": [float(i % 2) for i in range(12)]}, features=features)
    ds.save_to_disk(str(tmp_path / "pairs"))
    pairs = read_pairs(str(tmp_path / "pairs"))
    assert [p["label"] for p in pairs] == [float(i % 2) for i in range(12)]

    out = tmp_path / "head"
    cfg = PrefTrainConfig(data=str(tmp_path / "pairs"), out=str(out), backbone_weights="random",
                          backbone_options={"config": TINY_CLIP_CONFIG, "resize_backend": "torch"},
                          lr=0.05, epochs=1, batch_size=8, val_fraction=0.25, cpu=True)
    metrics = train(cfg)
    assert metrics["train_pairs"] == 9 and metrics["val_pairs"] == 3  # 2 optimizer steps of <= 8 pairs
    assert 0.0 <= metrics["val_accuracy"] <= 1.0
    card = json.loads((out / "mmreward.json").read_text())
    assert "val_accuracy" in card["metrics"]
    scores = mmreward.load(str(out)).score("a red square", [reds[0], blues[0]]).scores
    assert scores.shape == (2,) and torch.isfinite(scores).all()


@needs_datasets
def test_pick_a_pic_columns_and_bad_columns(tmp_path, datasets_cache):
    from datasets import Dataset, DatasetDict

    from mmreward.train.preference import read_pairs

    reds, blues = _pair_images(3)

    def png(img):
        buf = io.BytesIO()
        img.save(buf, format="PNG")
        return buf.getvalue()

    pick = Dataset.from_dict({"caption": ["a red square"] * 3, "jpg_0": [png(r) for r in reds],
                              "jpg_1": [png(b) for b in blues], "label_0": [1.0, 0.5, 0.0], "label_1": [0.0, 0.5, 1.0]})
    DatasetDict({"validation": pick}).save_to_disk(str(tmp_path / "pickapic"))
    pairs = read_pairs(f"hf:{tmp_path / 'pickapic'}:validation")
    assert [p["label"] for p in pairs] == [1.0, 0.5, 0.0] and {p["prompt"] for p in pairs} == {"a red square"}
    from mmreward.hf_datasets import decode_image

    img = decode_image(pairs[0]["image_a"], None, "image_a")
    assert img.size == (24, 24) and img.getpixel((0, 0))[0] >= 180

    Dataset.from_dict({"prompt": ["x", "y"], "img1": ["a.png", "b.png"], "img2": ["c.png", "d.png"]}).save_to_disk(
        str(tmp_path / "bad"))
    with pytest.raises(RewardInputError, match=r"columns \['img1', 'img2', 'prompt'\]; expected .*image_a, image_b, label"):
        read_pairs(str(tmp_path / "bad"))


def test_trainer_passes_prompt_metadata_to_rewards_that_read_it(tmp_path, tiny_pipeline_dir):
    from diffusion_rl.config import from_dict
    from diffusion_rl.trainer import Trainer

    rows = [{"prompt": "a red circle", "value": 1}, {"prompt": "a blue square", "value": 2},
            {"prompt": "a green star", "value": 3}]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    pipe = tiny_pipeline_dir("sd3")  # the session's (built once per worker, used read-only)
    cfg = from_dict({
        "model": {"pretrained": str(pipe), "height": 16, "width": 16, "lora_rank": 4, "lora_alpha": 4,
                  "max_sequence_length": 8},
        "sample": {"num_steps": 2, "prompts_per_iteration": 2, "group_size": 2, "batch_size": 4},
        "train": {"algorithm": "grpo", "iterations": 1, "timestep_fraction": 0.5},
        "reward": {"rewards": {"mock": 1.0}},
        "prompts": {"train": str(tmp_path / "train.jsonl"), "eval": [{"prompt": "a red star", "value": 7}]},
        "log": {"output_dir": str(tmp_path / "run"), "eval_every": 0, "grid_every": 0, "progress": False},
    })
    trainer = Trainer(cfg)
    spy = _SpyReward()
    trainer.rewards.train = {"mock": spy}  # under the configured name, which the advantages weight
    trainer.rewards.eval = {"mock": spy}
    trainer.train_iteration(0)
    prompts, metadata = spy.seen[-1]
    assert len(prompts) == 4 and metadata == [{"value": next(r["value"] for r in rows if r["prompt"] == p)}
                                              for p in prompts]
    assert trainer.evaluate()["eval/mock"] == 7.0
