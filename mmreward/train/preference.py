"""Pairwise preference reward models trained with the Bradley-Terry loss, on accelerate.

Data: JSONL rows, a .parquet file, a `datasets` save_to_disk folder or "hf:org/name[:split]" with the same columns

    {"prompt": "...", "image_a": "a.png", "image_b": "b.png", "label": 1}

label 1 means a is preferred, 0 means b, 0.5 a tie (a soft target, as PickScore treats ties); the
aliases chosen/rejected (label 1) and Pick-a-Pic's caption/jpg_0/jpg_1/label_0 are accepted. Images
are paths (relative ones read from the JSONL's folder), image bytes or `datasets.Image()` values.

Model: a CLIP backbone (any CLIP-based registered reward, e.g. 'clipscore') gives normalised image
and text embeddings; the reward is
    head='linear': w . [img, img * txt] + b
    head='mlp':    a BaseReward-style two-layer MLP on the same features (hidden 256, GELU)
    head='clip':   PickScore/HPS-style logit_scale * cos(img, txt), fine-tuning the backbone itself.
The loss is BCE-with-logits(s_a - s_b, label) = -[y log sigma(d) + (1-y) log sigma(-d)], the
Bradley-Terry negative log-likelihood with soft targets. Held-out pairwise accuracy ignores ties.

Saved folder: mmreward.json (reward 'preference-head', the backbone's name/checkpoint/options and the
head config), head.safetensors, and backbone.safetensors when the backbone was trained or is random.
`mmreward.load(folder)` rebuilds it.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mmreward.errors import ConfigError, RewardInputError
from mmreward.hf_datasets import (
    HUB_PREFIX,
    DatasetSource,
    decode_image,
    is_dataset_folder,
    load_rows,
    parse_source,
)
from mmreward.types import Reward, RewardOutput

HEADS = ("linear", "mlp", "clip")


@dataclass
class PrefTrainConfig:
    data: str  # JSONL file, datasets save_to_disk folder or hf:org/name[:split] of preference pairs
    out: str  # output folder (written with mmreward.json)
    backbone: str = "clipscore"  # a CLIP-based registered reward providing the embeddings
    backbone_checkpoint: str | None = None
    backbone_weights: str = "pretrained"  # 'random' for demos and tests
    backbone_options: dict[str, Any] = field(default_factory=dict)
    head: str = "linear"  # linear | mlp | clip (fine-tunes the backbone)
    lr: float = 1e-3
    epochs: int = 3
    batch_size: int = 16
    val_fraction: float = 0.2  # held-out share of the pairs
    seed: int = 0
    cpu: bool = False  # force accelerate onto the CPU

    def __post_init__(self) -> None:
        if self.head not in HEADS:
            raise ConfigError(f"head: expected one of {HEADS}, got {self.head!r}")
        if not 0 <= self.val_fraction < 1:
            raise ConfigError(f"val_fraction must be in [0, 1), got {self.val_fraction}")
        if self.lr <= 0 or self.epochs < 1 or self.batch_size < 1:
            raise ConfigError("lr must be > 0, epochs and batch_size >= 1")
        if not self.data.startswith(HUB_PREFIX) and not Path(self.data).exists():
            raise ConfigError(f"data: {self.data} does not exist; pass a .jsonl file, a datasets save_to_disk "
                              f"folder or {HUB_PREFIX}org/name[:split]")


# ----------------------------------------------------------------------------------------------
# data
# ----------------------------------------------------------------------------------------------
# (prompt keys, image a, image b, label of a) per accepted row layout; chosen/rejected implies label 1
LAYOUTS = (
    ("chosen", "rejected", None),
    ("image_a", "image_b", "label"),
    ("jpg_0", "jpg_1", "label_0"),  # Pick-a-Pic: label_0 = P(image 0 preferred), 0.5 for ties
)
PROMPT_KEYS = ("prompt", "caption")
EXPECTED = ("{prompt, image_a, image_b, label}, {prompt, chosen, rejected} or Pick-a-Pic's "
            "{caption, jpg_0, jpg_1, label_0}")


def _layout(keys, where: str) -> tuple[str, str, str | None]:
    for a, b, y in LAYOUTS:
        if a in keys and b in keys and (y is None or y in keys):
            return a, b, y
    raise RewardInputError(f"{where} has the columns {sorted(keys)}; expected {EXPECTED}")


def _image_ref(value: Any, root: Path | None, where: str) -> Any:
    """A path (made absolute against `root`) or an in-memory image value, decoded per batch by `_decode`."""
    from PIL import Image

    if isinstance(value, (str, Path)):
        return decode_image(value, root, where)
    if isinstance(value, (bytes, bytearray, Image.Image)):
        return value
    if isinstance(value, Mapping) and (value.get("bytes") or value.get("path")):
        return value if value.get("bytes") else decode_image(value["path"], root, where)
    raise RewardInputError(f"{where}: expected an image path, image bytes or a datasets Image() value, "
                           f"got {type(value).__name__}")


def _rows(data: str) -> tuple[Any, Path | None, str]:
    """(rows, folder that relative paths are read from, name for errors) of a JSONL file or a dataset."""
    source = parse_source(data, "data")
    parquet = source is None and Path(data).suffix == ".parquet"
    if parquet:  # read by datasets' parquet builder; relative image paths are read from the file's folder
        source = DatasetSource("parquet", data_files=str(Path(data).resolve()))
    if source is None:
        path = Path(data)
        rows = []
        for i, line in enumerate(path.read_text().splitlines()):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise RewardInputError(f"{path}:{i + 1} is not valid JSON: {exc}") from exc
        return rows, path.parent, str(path)
    rows = load_rows(source, "data")  # first: without datasets installed, this is the MissingExtraError
    from datasets import Image

    _layout(rows.column_names, source.describe())  # a bad layout fails before any image is read
    # Image() columns would decode every image of the split now; keep the encoded bytes until a batch needs them
    for name, feature in rows.features.items():
        if isinstance(feature, Image) and feature.decode:
            rows = rows.cast_column(name, Image(decode=False))
    if parquet:
        return rows, Path(data).resolve().parent, str(data)
    root = Path(source.dataset) if is_dataset_folder(source.dataset) else None
    return rows, root, source.describe()


def read_pairs(data: str | Path) -> list[dict]:
    """Rows with keys prompt, image_a, image_b (paths or encoded images) and label in {0, 0.5, 1}.

    `data`: a JSONL file, a `save_to_disk` folder or "hf:org/name[:split]" (see `mmreward.hf_datasets`).
    """
    rows, root, name = _rows(str(data))
    pairs = []
    for i, r in enumerate(rows):
        if not isinstance(r, Mapping):
            raise RewardInputError(f"row {i} of {name} is a {type(r).__name__}; expected an object {EXPECTED}")
        ka, kb, ky = _layout(r.keys(), f"row {i} of {name}")
        where = f"row {i} of {name}"
        try:
            y = 1.0 if ky is None else float(r[ky])
        except (TypeError, ValueError):
            raise RewardInputError(f"{where}: label must be 0, 0.5 or 1, got {r[ky]!r}") from None
        if y not in (0.0, 0.5, 1.0):
            raise RewardInputError(f"{where}: label must be 0, 0.5 or 1, got {y}")
        prompt = next((r[k] for k in PROMPT_KEYS if r.get(k) is not None), "")
        if not isinstance(prompt, str):
            raise RewardInputError(f"{where}: the prompt must be a string, got {type(prompt).__name__}")
        pairs.append({"prompt": prompt, "image_a": _image_ref(r[ka], root, f"{where}: {ka}"),
                      "image_b": _image_ref(r[kb], root, f"{where}: {kb}"), "label": y})
    if len(pairs) < 2:
        raise RewardInputError(f"{name} holds {len(pairs)} pairs; need at least 2")
    return pairs


# ----------------------------------------------------------------------------------------------
# model
# ----------------------------------------------------------------------------------------------
def make_head(kind: str, dim: int) -> nn.Module | None:
    if kind == "linear":
        return nn.Linear(2 * dim, 1)
    if kind == "mlp":
        return nn.Sequential(nn.Linear(2 * dim, 256), nn.GELU(), nn.Linear(256, 1))
    return None


class PreferenceHeadReward(Reward):
    name = "preference-head"
    differentiable = True
    # Precision: the backbone may run in bf16; the trained head reads fp32 normalised features
    keep_fp32 = ("head",)

    def __init__(self, backbone: nn.Module, head_kind: str, head: nn.Module | None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.backbone = backbone
        self.head_kind = head_kind
        self.head = head

    def _features(self, prompts, media):
        img = nn.functional.normalize(self.backbone.image_features(media).float(), dim=-1)
        txt = nn.functional.normalize(self.backbone.encode_text(prompts).float(), dim=-1)
        return img, txt

    def _score(self, prompts, media):
        img, txt = self._features(prompts, media)
        if self.head_kind == "clip":
            s = self.backbone.logit_scale().float().exp().clamp(max=100) * (img * txt).sum(dim=-1)
        else:
            s = self.head(torch.cat([img, img * txt], dim=-1)).squeeze(-1)
        return RewardOutput(s, {"cosine": (img * txt).sum(dim=-1)})


def bt_loss(s_a: torch.Tensor, s_b: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    """Bradley-Terry NLL with soft targets (ties = 0.5)."""
    return nn.functional.binary_cross_entropy_with_logits(s_a - s_b, label)


def pairwise_accuracy(s_a: torch.Tensor, s_b: torch.Tensor, label: torch.Tensor) -> float:
    decided = label != 0.5
    if not bool(decided.any()):
        return float("nan")
    return float(((s_a > s_b).float() == label)[decided].float().mean())


# ----------------------------------------------------------------------------------------------
# training loop
# ----------------------------------------------------------------------------------------------
def train(cfg: PrefTrainConfig) -> dict[str, float]:
    """Train, evaluate on the held-out pairs, save to cfg.out. Returns the metrics."""
    from accelerate import Accelerator
    from tqdm.auto import tqdm

    import mmreward
    from mmreward import media as media_io

    pairs = read_pairs(cfg.data)
    rng = random.Random(cfg.seed)
    rng.shuffle(pairs)
    n_val = max(1, int(round(len(pairs) * cfg.val_fraction))) if cfg.val_fraction > 0 else 0
    val, tr = pairs[:n_val], pairs[n_val:]
    torch.manual_seed(cfg.seed)
    clip = mmreward.load(cfg.backbone, checkpoint=cfg.backbone_checkpoint, weights=cfg.backbone_weights,
                         device="cpu", **cfg.backbone_options)
    backbone = getattr(clip, "backbone", None)
    if backbone is None or not hasattr(backbone, "image_features"):
        raise ConfigError(f"backbone: '{cfg.backbone}' is not a CLIP-based reward (needs .backbone.image_features)")
    dim = backbone.encode_text(["x"]).shape[-1]
    head = make_head(cfg.head, dim)
    model = PreferenceHeadReward(backbone, cfg.head, head)
    for p in backbone.parameters():
        p.requires_grad_(cfg.head == "clip")
    params = [p for p in model.parameters() if p.requires_grad]
    accel = Accelerator(cpu=cfg.cpu)
    opt = torch.optim.AdamW(params, lr=cfg.lr)
    model, opt = accel.prepare(model, opt)
    inner = accel.unwrap_model(model)

    def load_batch(rows):
        a = media_io.to_batch([decode_image(r["image_a"], None, "image_a") for r in rows], modality="image",
                              device=accel.device)
        b = media_io.to_batch([decode_image(r["image_b"], None, "image_b") for r in rows], modality="image",
                              device=accel.device)
        y = torch.tensor([r["label"] for r in rows], device=accel.device)
        return [r["prompt"] for r in rows], a, b, y

    steps = math.ceil(len(tr) / cfg.batch_size) * cfg.epochs
    bar = tqdm(total=steps, desc="train-pref", disable=not accel.is_main_process)
    last = float("nan")
    for epoch in range(cfg.epochs):
        order = list(range(len(tr)))
        random.Random(cfg.seed + epoch).shuffle(order)
        model.train()
        for start in range(0, len(order), cfg.batch_size):
            prompts, a, b, y = load_batch([tr[i] for i in order[start:start + cfg.batch_size]])
            s = inner._score(prompts + prompts, media_io.concat_batches(a, b)).scores
            loss = bt_loss(s[: len(prompts)], s[len(prompts):], y)
            opt.zero_grad()
            accel.backward(loss)
            opt.step()
            last = float(loss.detach())
            bar.update(1)
            bar.set_postfix(loss=f"{last:.4f}")
    bar.close()
    model.eval()
    metrics = {"train_loss": last, "train_pairs": len(tr), "val_pairs": len(val)}
    for split, rows in (("train", tr), ("val", val)):
        if rows:
            with torch.no_grad():
                prompts, a, b, y = load_batch(rows)
                s = inner._score(prompts + prompts, media_io.concat_batches(a, b)).scores
            metrics[f"{split}_accuracy"] = pairwise_accuracy(s[: len(rows)], s[len(rows):], y)
    if accel.is_main_process:
        save(inner, cfg, metrics)
    return metrics


def save(model: PreferenceHeadReward, cfg: PrefTrainConfig, metrics: dict) -> Path:
    from safetensors.torch import save_file

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    save_backbone = cfg.head == "clip" or cfg.backbone_weights == "random"
    if model.head is not None:
        save_file({k: v.detach().cpu().contiguous() for k, v in model.head.state_dict().items()},
                  str(out / "head.safetensors"))
    if save_backbone:
        save_file({k: v.detach().cpu().contiguous() for k, v in model.backbone.state_dict().items()},
                  str(out / "backbone.safetensors"))
    card = {
        "reward": "preference-head",
        "options": {"backbone": cfg.backbone, "backbone_checkpoint": cfg.backbone_checkpoint,
                    "backbone_options": cfg.backbone_options, "head": cfg.head,
                    "backbone_weights_file": save_backbone},
        "train_config": asdict(cfg),
        "metrics": metrics,
    }
    (out / "mmreward.json").write_text(json.dumps(card, indent=2, default=str))
    return out


def load_preference_head(checkpoint=None, *, weights="pretrained", backbone: str = "clipscore",
                         backbone_checkpoint: str | None = None, backbone_options: dict | None = None,
                         head: str = "linear", backbone_weights_file: bool = False, **options) -> PreferenceHeadReward:
    import mmreward
    from mmreward.checkpoints import load_state_dict, load_strict

    if head not in HEADS:
        raise ConfigError(f"head: expected one of {HEADS}, got {head!r}")
    random_backbone = weights == "random" or backbone_weights_file
    clip = mmreward.load(backbone, checkpoint=backbone_checkpoint, weights="random" if random_backbone else weights,
                         device="cpu", **(backbone_options or {}))
    net = clip.backbone
    dim = net.encode_text(["x"]).shape[-1]
    head_mod = make_head(head, dim)
    if weights == "pretrained":
        folder = Path(checkpoint)
        if head_mod is not None:
            load_strict(head_mod, load_state_dict(folder / "head.safetensors"), str(folder / "head.safetensors"))
        if backbone_weights_file:
            load_strict(net, load_state_dict(folder / "backbone.safetensors"), str(folder / "backbone.safetensors"))
    return PreferenceHeadReward(net, head, head_mod, **options)
