"""CLIP backbones shared by the CLIP-based rewards: one interface over transformers and open_clip.

A backbone maps normalised pixels to image embeddings and prompts to text embeddings (both projected,
not yet L2-normalised). Text embeddings go through a per-prompt LRU cache: GRPO-style training scores G
images per prompt, so each unique prompt is encoded once. Cached embeddings are computed outside
inference mode (under no_grad) so they can enter an autograd graph on the differentiable path.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from mmreward.checkpoints import (
    load_files,
    load_pretrained,
    load_state_dict,
    load_strict,
    read_json,
    resolve_files,
)
from mmreward.errors import CheckpointError, ConfigError
from mmreward.preprocess import ImagePreprocess

HF_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json")
OPEN_CLIP_CONFIG = "open_clip_config.json"
OPEN_CLIP_WEIGHT_FILES = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")
# transformers < 4.31 saved these buffers; newer models do not have them
_HF_LEGACY_BUFFERS = ("text_model.embeddings.position_ids", "vision_model.embeddings.position_ids")


class TextEmbeddingCache:
    """Least-recently-used map from (prompt, device, dtype) to a text embedding row."""

    def __init__(self, max_entries: int = 4096) -> None:
        self.max_entries = max_entries
        self._store: OrderedDict[tuple[str, str, torch.dtype], torch.Tensor] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._store)

    def clear(self) -> None:
        self._store.clear()

    def lookup(self, prompts: list[str], device: torch.device, dtype: torch.dtype, encode) -> torch.Tensor:
        """Rows for `prompts` (B, D); `encode(list_of_unique_missing_prompts) -> (N, D)` fills the gaps."""
        keys = [(p, str(device), dtype) for p in prompts]
        missing = list(dict.fromkeys(k[0] for k in keys if k not in self._store))
        self.misses += len(missing)
        self.hits += len(prompts) - len(missing)
        if missing:
            with torch.inference_mode(False), torch.no_grad():
                rows = encode(missing)
            for p, row in zip(missing, rows):
                self._store[(p, str(device), dtype)] = row
        for k in keys:
            self._store.move_to_end(k)
        out = torch.stack([self._store[k] for k in keys])
        while len(self._store) > self.max_entries:
            self._store.popitem(last=False)
        return out


class ClipBackbone(torch.nn.Module):
    """Common interface; subclasses wrap a transformers CLIPModel or an open_clip CLIP."""

    def __init__(self, preprocess: ImagePreprocess, cache_size: int = 4096) -> None:
        super().__init__()
        self.preprocess = preprocess
        self.text_cache = TextEmbeddingCache(cache_size)

    @property
    def _param(self) -> torch.Tensor:
        # skip the 0-dim logit_scale (CLIPModel's first parameter), which a reward may keep in fp32
        return next(p for p in self.parameters() if p.ndim > 0)

    def image_features(self, media: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
        """Media in [0, 1] -> projected image embeddings (B, D), computed in the model's dtype."""
        pixels = self.preprocess(media).to(device=self._param.device, dtype=self._param.dtype)
        return self.encode_pixels(pixels)

    def text_features(self, prompts: list[str]) -> torch.Tensor:
        p = self._param
        return self.text_cache.lookup(prompts, p.device, p.dtype, self.encode_text)

    def encode_pixels(self, pixels: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def encode_text(self, prompts: list[str]) -> torch.Tensor:
        raise NotImplementedError

    @property
    def logit_scale(self) -> torch.Tensor:
        raise NotImplementedError


class HFClipBackbone(ClipBackbone):
    def __init__(self, model, tokenizer, preprocess: ImagePreprocess, cache_size: int = 4096) -> None:
        super().__init__(preprocess, cache_size)
        self.model = model
        self.tokenizer = tokenizer
        self.max_length = int(model.config.text_config.max_position_embeddings)

    def encode_pixels(self, pixels: torch.Tensor) -> torch.Tensor:
        pooled = self.model.vision_model(pixel_values=pixels).pooler_output
        return self.model.visual_projection(pooled)

    def encode_text(self, prompts: list[str]) -> torch.Tensor:
        tok = self.tokenizer(prompts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt")
        dev = self._param.device
        out = self.model.text_model(input_ids=tok["input_ids"].to(dev), attention_mask=tok["attention_mask"].to(dev))
        return self.model.text_projection(out.pooler_output)

    @property
    def logit_scale(self) -> torch.Tensor:
        return self.model.logit_scale


class OpenClipBackbone(ClipBackbone):
    def __init__(self, model, tokenizer, preprocess: ImagePreprocess, cache_size: int = 4096) -> None:
        super().__init__(preprocess, cache_size)
        self.model = model
        self.tokenizer = tokenizer

    def encode_pixels(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.model.encode_image(pixels)

    def encode_text(self, prompts: list[str]) -> torch.Tensor:
        return self.model.encode_text(self.tokenizer(prompts).to(self._param.device))

    @property
    def logit_scale(self) -> torch.Tensor:
        return self.model.logit_scale


# ----------------------------------------------------------------------------------------------
# loading: transformers CLIPModel folders / hub repos
# ----------------------------------------------------------------------------------------------
def resolve_first(checkpoint: str, candidates: tuple[str, ...], what: str) -> Path:
    """The first of `candidates` that the checkpoint holds (never fetches more than one weight file)."""
    errors = []
    for name in candidates:
        try:
            return resolve_files(checkpoint, [name])[name]
        except CheckpointError as exc:
            errors.append(str(exc))
    raise CheckpointError(
        f"checkpoint '{checkpoint}' has none of the {what} files {list(candidates)}. " + (errors[-1] if errors else "")
    )


def hf_folder(checkpoint: str) -> Path:
    """A local folder holding config.json and the weights of a transformers checkpoint (resolving hub ids)."""
    config = resolve_files(checkpoint, ["config.json"])["config.json"]
    resolve_first(checkpoint, HF_WEIGHT_FILES, "weight")
    return config.parent


def load_hf_clip_model(checkpoint: str, *, weights: str, config: dict[str, Any] | None = None, seed: int | None = None):
    """A transformers CLIPModel from a checkpoint (strict: missing or unexpected keys are an error).

    weights="random" draws the initialisation from `seed` when given (without touching the global RNG)."""
    from transformers import CLIPConfig, CLIPModel

    if weights == "random":
        if config is None and checkpoint is None:
            raise ConfigError("weights='random' needs either a checkpoint holding config.json or a `config` dict")
        if config is not None:
            cfg = CLIPConfig(**config)
        else:
            cfg_file = resolve_files(checkpoint, ["config.json"])["config.json"]
            try:
                cfg = CLIPConfig(**read_json(cfg_file, "model config"))
            except (TypeError, ValueError) as exc:
                raise CheckpointError(f"{cfg_file} is not a valid CLIP config: {exc}") from exc
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed)
            return CLIPModel(cfg).eval()
    folder = hf_folder(checkpoint)
    model = load_pretrained(CLIPModel, folder, ignore_unexpected=_HF_LEGACY_BUFFERS)
    return model.float().eval()


def load_hf_clip_tokenizer(source: str | os.PathLike | None):
    """A CLIP tokenizer from a folder or hub repo (tokenizer.json, or vocab.json + merges.txt)."""
    from transformers import CLIPTokenizerFast

    if source is None:
        return default_clip_tokenizer()
    files = resolve_files(os.fspath(source), [], optional=HF_TOKENIZER_FILES)
    if "tokenizer.json" not in files and not {"vocab.json", "merges.txt"} <= set(files):
        raise CheckpointError(
            f"'{source}' holds no CLIP tokenizer (tokenizer.json, or vocab.json + merges.txt); "
            "pass tokenizer='<folder or hub id with the tokenizer files>'"
        )
    return load_files(CLIPTokenizerFast.from_pretrained, next(iter(files.values())).parent, "CLIP tokenizer")


def has_files(checkpoint: str | None, names: tuple[str, ...]) -> bool:
    if checkpoint is None:
        return False
    try:
        return bool(resolve_files(checkpoint, [], optional=names))
    except CheckpointError:
        return False


_DEFAULT_TOKENIZER: dict[str, Any] = {}


def default_clip_tokenizer():
    """The real CLIP BPE tokenizer built offline from open_clip's shipped vocabulary (random-weight models)."""
    if "tok" not in _DEFAULT_TOKENIZER:
        import tempfile

        from mmreward.tokenizers import build_clip_tokenizer

        with tempfile.TemporaryDirectory() as tmp:
            _DEFAULT_TOKENIZER["tok"] = build_clip_tokenizer(tmp)
    return _DEFAULT_TOKENIZER["tok"]


def read_hf_preprocess(
    checkpoint: str | None, image_size: int, crop_rounding: str, resize_backend: str, alpha: str = "drop_first"
) -> ImagePreprocess:
    """The preprocess card from preprocessor_config.json when the checkpoint has one, else CLIP's defaults."""
    size, crop = image_size, image_size
    kwargs: dict[str, Any] = {}
    files = resolve_files(checkpoint, [], optional=["preprocessor_config.json"]) if checkpoint else {}
    if "preprocessor_config.json" in files:
        cfg = read_json(files["preprocessor_config.json"], "preprocessor config")
        s = cfg.get("size", size)
        size = int(s.get("shortest_edge", size)) if isinstance(s, dict) else int(s)
        c = cfg.get("crop_size", crop)
        crop = int(c.get("height", crop)) if isinstance(c, dict) else int(c)
        if cfg.get("image_mean"):
            kwargs["mean"] = tuple(float(v) for v in cfg["image_mean"])
        if cfg.get("image_std"):
            kwargs["std"] = tuple(float(v) for v in cfg["image_std"])
        if cfg.get("resample", 3) != 3:
            raise CheckpointError(f"{files['preprocessor_config.json']}: only bicubic resampling (3) is supported")
    return ImagePreprocess(size=size, crop=crop, crop_rounding=crop_rounding, resize_backend=resize_backend,
                           alpha=alpha, **kwargs)


def build_hf_backbone(
    checkpoint: str | None,
    *,
    weights: str,
    tokenizer: str | None = None,
    processor: str | None = None,
    config: dict[str, Any] | None = None,
    crop_rounding: str = "floor",
    resize_backend: str = "pil",
    cache_size: int = 4096,
    seed: int | None = None,
    alpha: str = "drop_first",
) -> HFClipBackbone:
    """Model from `checkpoint`; tokenizer and preprocessor from `tokenizer`/`processor` or the checkpoint.

    alpha: "drop_first" is the Hugging Face CLIP processor's (transformers 4.x convert("RGB") before resizing)."""
    model = load_hf_clip_model(checkpoint, weights=weights, config=config, seed=seed)
    tok_source = tokenizer or (checkpoint if has_files(checkpoint, HF_TOKENIZER_FILES) else processor)
    tok = load_hf_clip_tokenizer(tok_source)
    proc_source = processor if processor and not has_files(checkpoint, ("preprocessor_config.json",)) else checkpoint
    pre = read_hf_preprocess(proc_source, int(model.config.vision_config.image_size), crop_rounding, resize_backend,
                             alpha)
    return HFClipBackbone(model, tok, pre, cache_size)


# ----------------------------------------------------------------------------------------------
# loading: open_clip models
# ----------------------------------------------------------------------------------------------
def build_open_clip_model(model_cfg: dict[str, Any]):
    """An open_clip CLIP/CustomTextCLIP from a model config dict (the `model_cfg` of open_clip_config.json)."""
    from open_clip.model import CLIP, CustomTextCLIP

    cfg = dict(model_cfg)
    custom = cfg.pop("custom_text", False) or "hf_model_name" in cfg.get("text_cfg", {})
    cls = CustomTextCLIP if custom else CLIP
    try:
        return cls(**cfg).eval()
    except TypeError as exc:
        raise CheckpointError(f"open_clip model config is not valid for {cls.__name__}: {exc}") from exc


def open_clip_tokenizer(model_cfg: dict[str, Any]):
    from open_clip.tokenizer import HFTokenizer, SimpleTokenizer

    text_cfg = model_cfg.get("text_cfg", {})
    context = int(text_cfg.get("context_length", 77))
    if text_cfg.get("hf_tokenizer_name"):
        return HFTokenizer(text_cfg["hf_tokenizer_name"], context_length=context)
    return SimpleTokenizer(context_length=context)


def load_open_clip_weights(model: torch.nn.Module, path: Path, *, key: str | None = None) -> None:
    sd = load_state_dict(path, key)
    sd = {k[len("module.") :] if k.startswith("module.") else k: v for k, v in sd.items()}
    own_scale = model.state_dict().get("logit_scale")
    if own_scale is not None and "logit_scale" in sd and sd["logit_scale"].ndim != own_scale.ndim:
        sd["logit_scale"] = sd["logit_scale"].reshape(own_scale.shape)
    load_strict(model, sd, str(path))
    model.float()


def open_clip_preprocess(
    model,
    preprocess_cfg: dict[str, Any] | None,
    resize_backend: str,
    mode: str = "shortest-crop",
    alpha: str = "resize_then_drop",
) -> ImagePreprocess:
    """open_clip's eval transform. Its RGB conversion comes after Resize and CenterCrop ("resize_then_drop")."""
    size = model.visual.image_size
    size = int(size[0] if isinstance(size, (tuple, list)) else size)
    cfg = preprocess_cfg or {}
    if cfg.get("interpolation", "bicubic") != "bicubic":
        raise CheckpointError(f"only bicubic open_clip preprocessing is supported, got {cfg.get('interpolation')!r}")
    if cfg.get("resize_mode", "shortest") not in ("shortest",) and mode == "shortest-crop":
        raise CheckpointError(f"only resize_mode='shortest' is supported, got {cfg.get('resize_mode')!r}")
    kwargs: dict[str, Any] = {}
    if cfg.get("mean"):
        kwargs["mean"] = tuple(float(v) for v in cfg["mean"])
    if cfg.get("std"):
        kwargs["std"] = tuple(float(v) for v in cfg["std"])
    return ImagePreprocess(
        size=size, crop=size, mode=mode, crop_rounding="round", resize_backend=resize_backend, alpha=alpha, **kwargs
    )


def build_open_clip_backbone(
    checkpoint: str | None,
    *,
    weights: str,
    model_name: str | None = None,
    model_cfg: dict[str, Any] | None = None,
    resize_backend: str = "pil",
    cache_size: int = 4096,
) -> OpenClipBackbone:
    """From a folder/hub repo in open_clip's hub layout (open_clip_config.json + weights), or a weights file
    plus `model_name` (a built-in open_clip architecture such as 'ViT-L-14') or `model_cfg`."""
    import open_clip

    preprocess_cfg = None
    if model_cfg is None and model_name is None:
        if checkpoint is None:
            raise ConfigError("open_clip backbone: pass a checkpoint, model_name or model_cfg")
        cfg_path = resolve_files(checkpoint, [OPEN_CLIP_CONFIG])[OPEN_CLIP_CONFIG]
        data = read_json(cfg_path, "open_clip config")
        if not isinstance(data.get("model_cfg"), dict):
            raise CheckpointError(f"{cfg_path} has no 'model_cfg' object; is this an open_clip hub-layout folder?")
        model_cfg, preprocess_cfg = data["model_cfg"], data.get("preprocess_cfg")
    elif model_cfg is None:
        model_cfg = open_clip.get_model_config(model_name)
        if model_cfg is None:
            raise ConfigError(f"unknown open_clip model_name {model_name!r}; see open_clip.list_models()")
    model = build_open_clip_model(model_cfg)
    if weights == "pretrained":
        if checkpoint is None:
            raise CheckpointError("open_clip backbone: weights='pretrained' needs a checkpoint")
        path = Path(os.path.expanduser(checkpoint))
        weight_path = path if path.is_file() else resolve_first(checkpoint, OPEN_CLIP_WEIGHT_FILES, "open_clip weight")
        load_open_clip_weights(model, weight_path)
    return OpenClipBackbone(model, open_clip_tokenizer(model_cfg), open_clip_preprocess(model, preprocess_cfg, resize_backend))
