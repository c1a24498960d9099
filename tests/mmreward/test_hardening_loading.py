"""Loading hardening: every family's loader is strict, nothing unpickles, and no string runs code.

Each family's checkpoint is written in its official format from a random-weight model, then tampered
with four ways (drop a key, add a key, reshape a key, remove a whole submodule); every one of them must
be a CheckpointError that names the offending key, never a silently random reward.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

import mmreward
from mmreward.errors import CheckpointError, ConfigError, UnknownOptionError, UnknownRewardError


# ----------------------------------------------------------------------------------------------
# one checkpoint per family, in its official layout
# ----------------------------------------------------------------------------------------------
@dataclass
class Family:
    name: str  # registered reward
    options: dict[str, Any]  # extra load options besides checkpoint
    weights: str  # the weights file (relative to the folder) that is tampered with
    submodule: str  # a key prefix naming a whole submodule
    checkpoint: str = "."  # what is passed as checkpoint=, relative to the folder
    folder_options: tuple[str, ...] = ()  # options whose values are paths relative to the folder


def _save_sd(sd: dict[str, torch.Tensor], path: Path, container: str | None = None) -> None:
    sd = {k: v.detach().clone().contiguous() for k, v in sd.items()}
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(sd, str(path))
    else:
        torch.save({container: sd} if container else sd, path)


_HF_CLIP_FILES: list[Path] = []  # the files of the first tiny CLIP written in this session


def _hf_clip(folder: Path) -> Family:
    from mmreward.testing.tiny_models import save_tiny_transformers_clip

    if _HF_CLIP_FILES:  # same seed, same bytes: five families share it, so copy rather than rebuild it
        folder.mkdir(parents=True, exist_ok=True)
        for f in _HF_CLIP_FILES:
            shutil.copy2(f, folder / f.name)
    else:
        save_tiny_transformers_clip(folder, image_size=32, patch_size=8, seed=1)
        _HF_CLIP_FILES.extend(sorted(f for f in folder.iterdir() if f.is_file()))
    return Family("clipscore", {}, "model.safetensors", "vision_model.")


def _pickscore(folder: Path) -> Family:
    return Family("pickscore", {}, _hf_clip(folder).weights, "text_model.")


OPEN_CLIP_CFG = {
    "embed_dim": 16,
    "quick_gelu": True,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "head_width": 16, "patch_size": 8},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}


def _open_clip(folder: Path) -> Family:
    from open_clip.model import CLIP

    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": OPEN_CLIP_CFG}))
    _save_sd(CLIP(**OPEN_CLIP_CFG).state_dict(), folder / "open_clip_model.safetensors")
    return Family("clipscore", {}, "open_clip_model.safetensors", "visual.")


def _hpsv2(folder: Path) -> Family:
    from open_clip.model import CLIP

    _save_sd(CLIP(**OPEN_CLIP_CFG).state_dict(), folder / "HPS_v2_compressed.pt", container="state_dict")
    return Family("hpsv2", {"model_cfg": OPEN_CLIP_CFG}, "HPS_v2_compressed.pt", "transformer.")


def _aesthetic(folder: Path) -> Family:
    from mmreward.models.aesthetic import HEAD_FILE, AestheticHead

    _hf_clip(folder)
    _save_sd(AestheticHead(16).state_dict(), folder / HEAD_FILE)
    return Family("aesthetic", {}, HEAD_FILE, "layers.")


def _aesthetic_backbone(folder: Path) -> Family:
    fam = _aesthetic(folder)
    return Family(fam.name, {}, "model.safetensors", "vision_model.")


def _shapes_pref(folder: Path) -> Family:
    from mmreward.models.shapesworld_pref import load_clip_folder

    model, tok = load_clip_folder(None, "random")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return Family("shapesworld-pref", {}, "model.safetensors", "vision_model.")


def _shapes_aesthetic(folder: Path, which: str) -> Family:
    from mmreward.models.shapesworld_aesthetic import HEAD_FILE

    reward = mmreward.load("shapesworld-aesthetic", weights="random", device="cpu")
    reward.vision.save_pretrained(folder)
    _save_sd(reward.head.state_dict(), folder / HEAD_FILE)
    if which == "head":
        return Family("shapesworld-aesthetic", {}, HEAD_FILE, "0.")
    return Family("shapesworld-aesthetic", {}, "model.safetensors", "vision_model.")


def _imagereward(folder: Path) -> Family:
    from mmreward.models.image_reward import MED_CONFIG_FILE, TINY_MED_CONFIG, TINY_VIT, WEIGHTS_FILE

    reward = mmreward.load("imagereward", weights="random", tiny=True, device="cpu")
    reward.tokenizer.save_pretrained(folder)
    _save_sd(reward.model.state_dict(), folder / WEIGHTS_FILE)
    (folder / MED_CONFIG_FILE).write_text(json.dumps({**TINY_MED_CONFIG, "vocab_size": len(reward.tokenizer)}))
    return Family("imagereward", {"vit": dict(TINY_VIT)}, WEIGHTS_FILE, "blip.text_encoder.")


def _classifier(folder: Path) -> Family:
    import torchvision

    from mmreward.models.classifier import WEIGHTS_FILE

    _save_sd(torchvision.models.mobilenet_v2(weights=None).state_dict(), folder / WEIGHTS_FILE)
    return Family("imagenet-classifier", {}, WEIGHTS_FILE, "classifier.")


def _mtcnn(folder: Path) -> Family:
    from mmreward.models.faces import NET_FILES, _import_mtcnn

    mtcnn = _import_mtcnn()()
    for net, name in zip((mtcnn.pnet, mtcnn.rnet, mtcnn.onet), NET_FILES):
        _save_sd(net.state_dict(), folder / name)
    return Family("face-mtcnn", {}, "onet.pt", "conv2.")


def _realism(folder: Path) -> Family:
    from mmreward.testing.tiny_realism import save_tiny_image_classifier

    save_tiny_image_classifier(folder)
    # transformers renames ViT encoder keys on load; the head keeps its name in the file and the model
    return Family("realism-classifier", {}, "model.safetensors", "classifier.")


def _univfd(folder: Path, which: str) -> Family:
    from mmreward.testing.tiny_realism import save_tiny_univfd

    clip, fc = save_tiny_univfd(folder)
    options = {"backbone": clip.name}
    if which == "probe":
        return Family("univfd", options, fc.name, "", checkpoint=fc.name, folder_options=("backbone",))
    return Family("univfd", options, f"{clip.name}/model.safetensors", "vision_model.", checkpoint=fc.name,
                  folder_options=("backbone",))


def _preference_head(folder: Path) -> Family:
    from mmreward.train.preference import make_head

    _hf_clip(folder / "clip")
    (folder / "mmreward.json").write_text(json.dumps({
        "reward": "preference-head",
        # relative to the card's folder: a card may not point outside it (a copied folder keeps working)
        "options": {"backbone": "clipscore", "backbone_checkpoint": "clip", "head": "mlp"},
    }))
    _save_sd(make_head("mlp", 16).state_dict(), folder / "head.safetensors")
    return Family("preference-head", {}, "head.safetensors", "0.")


def _owlv2(folder: Path) -> Family:
    from mmreward.geneval.owlv2 import save_tiny_owlv2
    from mmreward.testing.tokenizers import build_clip_tokenizer

    build_clip_tokenizer(folder / "tok")
    save_tiny_owlv2(folder / "owl", folder / "tok")
    return Family("geneval", {}, "owl/model.safetensors", "owlv2.vision_model.", checkpoint="owl")


def _qwen(folder: Path, name: str) -> Family:
    from mmreward.testing.qwen_vl import build_tiny_qwen_vl

    build_tiny_qwen_vl(folder)
    # files use the transformers-4 layout (visual.*); the model names them model.visual.*
    return Family(name, {}, "model.safetensors", "visual.")


def _hpsv3(folder: Path) -> Family:
    reward = mmreward.load("hpsv3", weights="random", tiny=True, device="cpu")
    sd = dict(reward.vlm.state_dict())
    sd.update({f"rm_head.{k}": v for k, v in reward.rm_head.state_dict().items()})
    _save_sd(sd, folder / "HPSv3.safetensors")
    return Family("hpsv3", {"tiny": True}, "HPSv3.safetensors", "model.visual.")


FAMILIES: dict[str, Callable[[Path], Family]] = {
    "clipscore-transformers": _hf_clip,
    "clipscore-open_clip": _open_clip,
    "pickscore": _pickscore,
    "hpsv2": _hpsv2,
    "aesthetic-head": _aesthetic,
    "aesthetic-backbone": _aesthetic_backbone,
    "shapesworld-pref": _shapes_pref,
    "shapesworld-aesthetic-head": lambda f: _shapes_aesthetic(f, "head"),
    "shapesworld-aesthetic-backbone": lambda f: _shapes_aesthetic(f, "backbone"),
    "imagereward": _imagereward,
    "imagenet-classifier": _classifier,
    "face-mtcnn": _mtcnn,
    "realism-classifier": _realism,
    "univfd-probe": lambda f: _univfd(f, "probe"),
    "univfd-backbone": lambda f: _univfd(f, "backbone"),
    "preference-head": _preference_head,
    "geneval-owlv2": _owlv2,
    "vqascore": lambda f: _qwen(f, "vqascore"),
    "unifiedreward": lambda f: _qwen(f, "unifiedreward"),
    "hpsv3": _hpsv3,
}


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    cache: dict[str, tuple[Path, Family]] = {}

    def get(key: str) -> tuple[Path, Family]:
        if key not in cache:
            folder = tmp_path_factory.mktemp(key.replace(".", "_"))
            torch.manual_seed(0)
            cache[key] = folder, FAMILIES[key](folder)
        return cache[key]

    return get


def _read(path: Path) -> tuple[dict[str, torch.Tensor], str | None]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path)), None
    data = torch.load(path, weights_only=True)
    if "state_dict" in data and isinstance(data["state_dict"], dict):
        return data["state_dict"], "state_dict"
    return data, None


def _tamper(sd: dict[str, torch.Tensor], how: str, submodule: str) -> tuple[dict[str, torch.Tensor], list[str]]:
    """(tampered state dict, keys of which at least one must be named in the error)."""
    sd = dict(sd)
    # a weight matrix or vector that is not a buffer of integers (position ids)
    key = next(k for k in sorted(sd) if k.startswith(submodule) and sd[k].is_floating_point())
    if how == "drop":
        sd.pop(key)
        return sd, [key]
    if how == "add":
        extra = submodule + "tampered_extra.weight"
        sd[extra] = torch.zeros(3)
        return sd, [extra]
    if how == "reshape":
        sd[key] = torch.zeros(*sd[key].shape[:-1], sd[key].shape[-1] + 1)
        return sd, [key]
    removed = sorted(k for k in sd if k.startswith(submodule))
    for k in removed:
        sd.pop(k)
    return sd, removed


def _load(folder: Path, fam: Family):
    checkpoint = folder / fam.checkpoint
    if fam.name == "preference-head":  # its card names the backbone
        return mmreward.load(checkpoint, device="cpu")
    options = {k: str(folder / v) if k in fam.folder_options else v for k, v in fam.options.items()}
    return mmreward.load(fam.name, checkpoint=checkpoint, device="cpu", **options)


@pytest.mark.parametrize("how", ["drop", "add", "reshape", "remove-submodule"])
@pytest.mark.parametrize("key", sorted(FAMILIES))
def test_every_family_rejects_tampered_weights_naming_the_keys(family_dirs, tmp_path, key, how):
    folder, fam = family_dirs(key)
    if how == "drop":  # once per family: the untampered checkpoint loads (the cases below are meaningful)
        assert isinstance(_load(folder, fam), mmreward.Reward)
    work = tmp_path / "ckpt"
    shutil.copytree(folder, work)
    sd, container = _read(work / fam.weights)
    tampered, named = _tamper(sd, how, fam.submodule)
    _save_sd(tampered, work / fam.weights, container)
    with pytest.raises(CheckpointError) as err:
        _load(work, fam)
    msg = str(err.value)
    assert any(k in msg for k in named), f"{key}/{how}: the error names none of {named[:3]}: {msg}"


# ----------------------------------------------------------------------------------------------
# corrupt files, refused pickles, bad JSON
# ----------------------------------------------------------------------------------------------
def test_corrupt_safetensors_and_config_name_the_file(family_dirs, tmp_path):
    folder, fam = family_dirs("shapesworld-pref")
    work = tmp_path / "a"
    shutil.copytree(folder, work)
    (work / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError, match="model.safetensors"):
        mmreward.load("shapesworld-pref", checkpoint=work)
    work = tmp_path / "b"
    shutil.copytree(folder, work)
    (work / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json"):
        mmreward.load("shapesworld-pref", checkpoint=work)
    work = tmp_path / "t"
    shutil.copytree(folder, work)
    (work / "tokenizer.json").write_text("{truncated")
    with pytest.raises(CheckpointError, match="tokenizer"):
        mmreward.load("shapesworld-pref", checkpoint=work)
    work = tmp_path / "c"
    shutil.copytree(folder, work)
    (work / "mmreward.json").write_text("[1, 2")
    with pytest.raises(CheckpointError, match="mmreward.json"):
        mmreward.load(work)


def test_corrupt_open_clip_config_names_the_file(family_dirs, tmp_path):
    folder, _ = family_dirs("clipscore-open_clip")
    work = tmp_path / "w"
    shutil.copytree(folder, work)
    (work / "open_clip_config.json").write_text('{"model_cfg": ')
    with pytest.raises(CheckpointError, match="open_clip_config.json"):
        mmreward.load("clipscore", checkpoint=work)
    (work / "open_clip_config.json").write_text('{"preprocess_cfg": {}}')
    with pytest.raises(CheckpointError, match="model_cfg"):
        mmreward.load("clipscore", checkpoint=work)


class _Evil:
    def __reduce__(self):
        return (print, ("pickled code ran",))


def test_refused_pickle_says_convert_to_safetensors(family_dirs, tmp_path):
    from mmreward.models.classifier import WEIGHTS_FILE

    torch.save({"features.0.0.weight": torch.zeros(1), "hook": _Evil()}, tmp_path / WEIGHTS_FILE)
    with pytest.raises(CheckpointError) as err:
        mmreward.load("imagenet-classifier", checkpoint=tmp_path)
    msg = str(err.value)
    assert WEIGHTS_FILE in msg and "safetensors" in msg and "unpickle" in msg
    (tmp_path / WEIGHTS_FILE).write_bytes(b"not a pickle")
    with pytest.raises(CheckpointError, match="corrupt"):
        mmreward.load("imagenet-classifier", checkpoint=tmp_path)


# ----------------------------------------------------------------------------------------------
# strings from configs, cards and requests never reach arbitrary callables
# ----------------------------------------------------------------------------------------------
def test_module_attr_source_is_checked_before_anything_is_called(tmp_path):
    marker = tmp_path / "pwned"
    for source in ("subprocess:run", "os:system", "builtins:exec", "pathlib:Path"):
        with pytest.raises(UnknownRewardError, match="not an mmreward.Reward subclass"):
            mmreward.load(source, args=["touch", str(marker)])
    assert not marker.exists()
    # a Reward subclass is still a valid source
    assert type(mmreward.load("mmreward.models.mock:MockReward")).__name__ == "MockReward"


def test_local_card_cannot_name_code(tmp_path):
    marker = tmp_path / "pwned"
    cases = [
        {"reward": "subprocess:run", "options": {"args": ["touch", str(marker)]}},
        {"reward": "mock", "loader": "subprocess:run"},
        # a nested load from a card's options may only use registered names either
        {"reward": "video-frames", "options": {"image_reward": "mmreward.models.mock:MockReward"}},
    ]
    for i, card in enumerate(cases):
        folder = tmp_path / f"card{i}"
        folder.mkdir()
        (folder / "mmreward.json").write_text(json.dumps(card))
        with pytest.raises((UnknownRewardError, CheckpointError)):
            mmreward.load(folder)
    assert not marker.exists()


def test_diffusion_rl_reward_config_cannot_run_code(tmp_path):

    from diffusion_rl.config import RewardConfig
    from diffusion_rl.rewards import load_reward

    marker = tmp_path / "pwned"
    cfg = RewardConfig(rewards={"subprocess:run": 1.0}, options={"subprocess:run": {"args": ["touch", str(marker)]}})
    # the trainer's reward loading, without building a pipeline around it
    with pytest.raises(UnknownRewardError):
        load_reward("subprocess:run", cfg, "cpu")
    assert not marker.exists()


def test_bench_judge_factory_must_be_a_declared_judge(tmp_path):
    from vlm_rm.bench.judges import resolve_judge_factory

    with pytest.raises(UnknownRewardError, match="judge factory"):
        resolve_judge_factory("subprocess:run")
    with pytest.raises(UnknownRewardError, match="judge factory"):
        resolve_judge_factory("os:getcwd")


def test_classifier_arch_must_be_a_torchvision_classification_model():
    with pytest.raises(ConfigError, match="mobilenet_v2"):
        mmreward.load("imagenet-classifier", weights="random", arch="get_model")


# ----------------------------------------------------------------------------------------------
# unknown loader options
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, good", [
    ("jpeg-compressibility", "micro_batch_size"),
    ("mock", "micro_batch_size"),
    ("clipscore", "convention"),
    ("hpsv2", "model_cfg"),
    ("shapesworld-pref", "micro_batch_size"),
])
def test_unknown_loader_option_is_typed_and_lists_accepted(name, good):
    with pytest.raises(UnknownOptionError) as err:
        mmreward.load(name, weights="random", bogus_option=1)
    msg = str(err.value)
    assert "bogus_option" in msg and good in msg
    assert isinstance(err.value, TypeError)  # what Python raises for an unexpected keyword
