"""Scalar reward heads on a Qwen2-VL backbone: HPSv3 and VideoReward (VideoAlign).

Both read the language model's last hidden state at special reward tokens placed in the prompt:

- HPSv3 (Ma et al. 2025): one token <|Reward|>; an MLP head hidden -> 1024 -> 16 -> 2 gives the
  mean and the uncertainty (sigma) of a Gaussian preference score; the score is the mean. Images are
  resized to exactly 256*28*28 pixels (Qwen smart_resize with min = max). Official file:
  MizzenAI/HPSv3 `HPSv3.safetensors` (full state dict, transformers-4.x key names).
- VideoReward (Liu et al. 2025): three tokens <|VQ_reward|>, <|MQ_reward|>, <|TA_reward|> in the
  'detailed_special' prompt; a bias-free linear head hidden -> 3, of which token k keeps output k
  (the diagonal). Each dimension is z-scored with the checkpoint's `inference_config` stats and the
  overall score is their sum. Official layout (KwaiVGI/VideoReward): `model_config.json` and
  `checkpoint-<step>/` holding either `model.pth` or `adapter_model.safetensors` (LoRA) plus
  `non_lora_state_dict.pth`; LoRA weights are merged into the base weights at load time.

As the originals' forward (MizzenAI/HPSv3 `Qwen2VLRewardModelBT.forward`, KwaiVGI/VideoAlign trainer.py), the
decoder runs over plain sequential positions (`head_hidden_states`), not Qwen's 3-D M-RoPE positions. Media are
resized as the originals' loaders resize them: HPSv3 with Pillow's 8-bit bicubic (bit-exact, batched), VideoReward
frames with torchvision's bicubic on uint8 tensors, sampled at 2 fps with its vendored `smart_nframes` (count
rounded to the nearest even number). Checked against transcribed forwards in tests/mmreward/test_parity_qwen_heads.py.
Deviation, on purpose: media that require grad (the differentiable path) are resized with a float bicubic
(`qwen_vl.resize_for_qwen(method="float")`), since the 8-bit resizes have no gradient.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from mmreward.checkpoints import load_state_dict, load_strict, read_json, resolve_files
from mmreward.errors import CheckpointError, RewardInputError
from mmreward.prompt_templates.vlm import (  # trained-with prompts
    HPSV3_INSTRUCTION,
    HPSV3_SUFFIX,
    VIDEOALIGN_PROMPT,
)
from mmreward.types import Reward, RewardOutput

HPSV3_TOKEN = "<|Reward|>"
VIDEOALIGN_TOKENS = ("<|VQ_reward|>", "<|MQ_reward|>", "<|TA_reward|>")
VIDEOALIGN_DIMS = ("VQ", "MQ", "TA")


def hpsv3_head(hidden: int) -> nn.Sequential:
    """HPSv3's 'ranknet' head; indices 0, 3, 5 hold the weights (as in the official state dict)."""
    return nn.Sequential(nn.Linear(hidden, 1024), nn.ReLU(), nn.Dropout(0.05), nn.Linear(1024, 16), nn.ReLU(),
                         nn.Linear(16, 2))


class QwenVLHeadReward(Reward):
    """Hidden states of a Qwen2-VL LM at special tokens -> a head. Subclasses build prompts and outputs."""

    requires_prompt = True
    media_kind = "image"
    # Precision: the VLM may run in bf16 (as the originals do on GPU); the reward head reads its hidden
    # states in fp32, since its outputs are the scores (and HPSv3's mu/sigma).
    keep_fp32 = ("rm_head",)
    # How media reach Qwen's smart size (`qwen_vl.resize_for_qwen`): as the original's loader resizes. Media
    # that require grad (the differentiable path) always take the float bicubic.
    resize_method = "pillow"

    def __init__(self, vlm, processor, rm_head: nn.Module, token_ids: list[int], *, min_pixels: int,
                 max_pixels: int, micro_batch_size: int = 4) -> None:
        super().__init__(micro_batch_size=micro_batch_size)
        self.vlm = vlm
        self.processor = processor
        self.rm_head = rm_head
        self.min_pixels, self.max_pixels = min_pixels, max_pixels
        self.register_buffer("token_ids", torch.tensor(token_ids), persistent=False)

    def _prompt(self, prompt: str) -> str:
        raise NotImplementedError

    def _prepare_media(self, media):
        return media

    def reward_token_states(self, prompts, media) -> torch.Tensor:
        """(B, n_tokens, hidden) last hidden states at the reward tokens, in prompt order."""
        from mmreward.backbones.qwen_vl import build_batch, model_inputs

        batch = build_batch(self.processor, [self._prompt(p) for p in prompts], self._prepare_media(media),
                            kind=self.media_kind, min_pixels=self.min_pixels, max_pixels=self.max_pixels,
                            resize=self.resize_method)
        inputs = model_inputs(batch, self.device, self.dtype)
        hidden = head_hidden_states(self.vlm, inputs)
        mask = torch.isin(inputs["input_ids"], self.token_ids)
        n_tok = self.token_ids.numel()
        counts = mask.sum(dim=1)
        if bool((counts != n_tok).any()):
            raise RewardInputError(
                f"prompts: each item must contain the {n_tok} reward token(s) exactly once, found counts "
                f"{counts.tolist()}; a prompt containing a reward token's text breaks the head"
            )
        return hidden[mask].view(len(prompts), n_tok, -1)


def head_hidden_states(vlm, inputs: dict) -> torch.Tensor:
    """(B, L, hidden) last hidden states as the reward-head originals compute them: visual features scattered
    into the token embeddings, then the decoder over plain sequential positions (`sequential_position_ids`),
    not Qwen's 3-D M-RoPE ones, which `vlm.model(**inputs)` would switch on."""
    from mmreward.backbones.qwen_vl import sequential_position_ids

    return vlm.model(**inputs, position_ids=sequential_position_ids(inputs["attention_mask"])).last_hidden_state


class HPSv3(QwenVLHeadReward):
    name = "hpsv3"
    modalities = ("image",)

    def _prompt(self, prompt: str) -> str:
        return HPSV3_INSTRUCTION.format(text_prompt=prompt) + HPSV3_SUFFIX

    def _score(self, prompts, media):
        states = self.reward_token_states(prompts, media)[:, 0]
        out = self.rm_head(states.float())
        return RewardOutput(out[:, 0], {"mu": out[:, 0], "sigma": out[:, 1]})


class VideoAlign(QwenVLHeadReward):
    name = "videoalign"
    modalities = ("video",)
    media_kind = "video"
    resize_method = "torchvision"  # VideoReward's vision_process.fetch_video resizes uint8 frame tensors
    # VideoReward's linear head runs in the model's dtype (bf16 on GPU), not in fp32 as HPSv3's does
    keep_fp32 = ()

    def __init__(self, *args, stats: dict[str, float] | None = None, num_frames: int | None = None,
                 dimension_weights: dict[str, float] | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # VideoAlign's Overall is VQ + MQ + TA; DanceGRPO trains on vq_coef * VQ + mq_coef * MQ instead
        self.dimension_weights = _check_dimension_weights(dimension_weights)
        mean = torch.zeros(3)
        std = torch.ones(3)
        if stats:
            mean = torch.tensor([float(stats[f"{d}_mean"]) for d in VIDEOALIGN_DIMS])
            std = torch.tensor([float(stats[f"{d}_std"]) for d in VIDEOALIGN_DIMS])
        self.register_buffer("stat_mean", mean, persistent=False)
        self.register_buffer("stat_std", std, persistent=False)
        self.num_frames = num_frames

    def _prompt(self, prompt: str) -> str:
        return VIDEOALIGN_PROMPT.format(text_prompt=prompt)

    def _prepare_media(self, media):
        if self.num_frames is None:
            return media
        from mmreward.models.video import subsample_clip

        # the card's count, whatever the generator made (a trainer hands full clips)
        return [subsample_clip(v, self.num_frames) for v in media]

    def _score(self, prompts, media):
        states = self.reward_token_states(prompts, media)  # (B, 3, H)
        raw = self.rm_head(states.to(self.rm_head.weight.dtype)).float()  # (B, 3, output_dim)
        raw = raw.diagonal(dim1=1, dim2=2) if raw.shape[-1] == 3 else raw[..., 0]
        z = (raw - self.stat_mean.float()) / self.stat_std.float()
        details = {d: z[:, i] for i, d in enumerate(VIDEOALIGN_DIMS)}
        details.update({f"{d}_raw": raw[:, i] for i, d in enumerate(VIDEOALIGN_DIMS)})
        weights = torch.tensor([self.dimension_weights[d] for d in VIDEOALIGN_DIMS], device=z.device, dtype=z.dtype)
        return RewardOutput((z * weights).sum(dim=1), details)


def _check_dimension_weights(weights: Mapping[str, float] | None) -> dict[str, float]:
    if weights is None:
        return dict.fromkeys(VIDEOALIGN_DIMS, 1.0)
    if not isinstance(weights, Mapping):
        raise RewardInputError(f"dimension_weights: expected a mapping such as {{'VQ': 1.0, 'MQ': 0.0}}, "
                               f"got {type(weights).__name__}")
    unknown = sorted(set(weights) - set(VIDEOALIGN_DIMS))
    if unknown:
        raise RewardInputError(f"dimension_weights: unknown dimension(s) {unknown}; VideoAlign scores {list(VIDEOALIGN_DIMS)}")
    out = {}
    for d in VIDEOALIGN_DIMS:
        w = weights.get(d, 0.0)
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w):
            raise RewardInputError(f"dimension_weights[{d!r}] must be a finite number, got {w!r}")
        out[d] = float(w)
    return out


# ----------------------------------------------------------------------------------------------
# loaders
# ----------------------------------------------------------------------------------------------
def _text_hidden(vlm) -> int:
    cfg = vlm.config
    return getattr(cfg, "text_config", cfg).hidden_size


def _add_tokens(processor, tokens) -> list[int]:
    processor.tokenizer.add_special_tokens({"additional_special_tokens": list(tokens)})
    return processor.tokenizer.convert_tokens_to_ids(list(tokens))


def _split_head(sd: dict[str, torch.Tensor], head_prefix: str = "rm_head.") -> tuple[dict, dict]:
    head = {k[len(head_prefix):]: v for k, v in sd.items() if k.startswith(head_prefix)}
    rest = {k: v for k, v in sd.items() if not k.startswith(head_prefix)}
    return head, rest


def load_hpsv3(checkpoint=None, *, weights="pretrained", base_model: str = "Qwen/Qwen2-VL-7B-Instruct",
               tiny: bool = False, **options) -> HPSv3:
    from mmreward.backbones import qwen_vl

    if tiny:
        base_model = _tiny_base(extra_tokens=())
        options.setdefault("min_pixels", 56 * 56)
        options.setdefault("max_pixels", 56 * 56)
    options.setdefault("min_pixels", 256 * 28 * 28)
    options.setdefault("max_pixels", 256 * 28 * 28)
    processor = qwen_vl.load_processor(base_model)
    token_ids = _add_tokens(processor, [HPSV3_TOKEN])
    vlm = qwen_vl.vlm_from_config(qwen_vl.load_config(base_model))
    vlm.resize_token_embeddings(len(processor.tokenizer), mean_resizing=False)
    head = hpsv3_head(_text_hidden(vlm))
    if weights == "pretrained":
        path = resolve_files(checkpoint, ["HPSv3.safetensors"])["HPSv3.safetensors"]
        sd = load_state_dict(path)
        if "model" in sd and isinstance(sd["model"], dict):
            sd = sd["model"]
        head_sd, rest = _split_head(sd)
        load_strict(vlm, qwen_vl.legacy_to_current_keys(rest), str(path))
        load_strict(head, head_sd, str(path) + " (rm_head)")
    return HPSv3(vlm, processor, head, token_ids, **options)


def _tiny_base(extra_tokens) -> str:
    from mmreward.backbones.tiny_qwen_vl import tiny_qwen_vl_folder

    return tiny_qwen_vl_folder(extra_tokens)


def _videoalign_folder(checkpoint: str) -> Path:
    from mmreward.backbones.qwen_vl import local_or_hub

    path, local = local_or_hub(checkpoint)
    if local:
        return Path(path)
    from mmreward.checkpoints import hub_is_offline

    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(path, local_files_only=hub_is_offline()))
    except Exception as exc:  # noqa: BLE001 - offline / missing repo raise several types
        raise CheckpointError(
            f"checkpoint '{checkpoint}' is not a local folder and is not in the Hugging Face cache ({exc}). "
            f"Download it on a connected machine (`hf download {path}`) or pass the folder."
        ) from exc


def _latest_step(folder: Path, step: int | None) -> Path:
    steps = sorted((p for p in folder.glob("checkpoint-*") if p.is_dir()), key=lambda p: int(p.name.split("-")[-1]))
    if not steps:
        raise CheckpointError(f"VideoReward folder {folder} has no checkpoint-<step>/ subfolder")
    if step is None:
        return steps[-1]
    chosen = folder / f"checkpoint-{step}"
    if not chosen.is_dir():
        raise CheckpointError(f"VideoReward folder {folder} has no checkpoint-{step}; it has {[p.name for p in steps]}")
    return chosen


def merge_lora_(model: nn.Module, lora_sd: dict[str, torch.Tensor], scale: float) -> int:
    """Add scale * B @ A to each targeted weight in place (what PEFT's merge does). Returns the count."""
    modules = dict(model.named_modules())
    merged = 0
    for key in lora_sd:
        if not key.endswith("lora_A.weight"):
            continue
        name = key[: -len(".lora_A.weight")]
        b_key = name + ".lora_B.weight"
        if b_key not in lora_sd or name not in modules:
            raise CheckpointError(f"LoRA weights for '{name}' do not match the model (missing module or lora_B)")
        a, b = lora_sd[key].float(), lora_sd[b_key].float()
        weight = modules[name].weight
        with torch.no_grad():
            weight.add_((b @ a).to(weight.dtype) * scale)
        merged += 1
    return merged


def load_videoalign(checkpoint=None, *, weights="pretrained", base_model: str | None = None, step: int | None = None,
                    tiny: bool = False, num_frames: int | None = None, **options) -> VideoAlign:
    from mmreward.backbones import qwen_vl

    cfg: dict = {}
    folder = None
    if weights == "pretrained":
        if checkpoint is None:
            raise CheckpointError("videoalign needs a checkpoint folder or hub id")
        folder = _videoalign_folder(checkpoint)
        cfg_path = resolve_files(folder, ["model_config.json"])["model_config.json"]
        cfg = read_json(cfg_path, "VideoReward model config")
    model_cfg = cfg.get("model_config", {})
    data_cfg = cfg.get("data_config", {})
    if tiny:
        base_model = base_model or _tiny_base(())
        options.setdefault("min_pixels", 28 * 28)
        options.setdefault("max_pixels", 56 * 56)
    base_model = base_model or model_cfg.get("model_name_or_path") or "Qwen/Qwen2-VL-2B-Instruct"
    if model_cfg and (not model_cfg.get("use_special_tokens", False) or model_cfg.get("reward_token") != "special"):
        raise CheckpointError("only VideoReward checkpoints with use_special_tokens=true and reward_token='special' are supported")
    template = data_cfg.get("prompt_template_type", "detailed_special")
    if template != "detailed_special":
        raise CheckpointError(f"VideoReward prompt_template_type {template!r} is not supported; expected 'detailed_special'")
    options.setdefault("min_pixels", 128 * 28 * 28)
    options.setdefault("max_pixels", int(data_cfg.get("max_frame_pixels", 240 * 320)))
    if num_frames is None and data_cfg.get("num_frames"):
        num_frames = int(data_cfg["num_frames"])
    output_dim = int(model_cfg.get("output_dim", 3))

    processor = qwen_vl.load_processor(base_model)
    token_ids = _add_tokens(processor, VIDEOALIGN_TOKENS)
    full = None
    if folder is not None:
        step_dir = _latest_step(folder, step)
        if (step_dir / "model.pth").exists():
            full = load_state_dict(step_dir / "model.pth")
    vlm = (qwen_vl.load_vlm(base_model) if folder is not None and full is None
           else qwen_vl.vlm_from_config(qwen_vl.load_config(base_model)))
    vlm.resize_token_embeddings(len(processor.tokenizer), mean_resizing=False)
    head = nn.Linear(_text_hidden(vlm), output_dim, bias=False)
    if folder is not None:
        source = str(step_dir)
        if full is not None:
            head_sd, rest = _split_head(full)
            load_strict(vlm, qwen_vl.legacy_to_current_keys(rest), source)
            load_strict(head, head_sd, source + " (rm_head)")
        else:
            files = resolve_files(step_dir, ["adapter_model.safetensors", "non_lora_state_dict.pth"])
            non_lora = load_state_dict(files["non_lora_state_dict.pth"])
            prefix = "base_model.model."
            head_sd, rest = _split_head({k[len(prefix):] if k.startswith(prefix) else k: v for k, v in non_lora.items()})
            if not head_sd:
                raise CheckpointError(f"{files['non_lora_state_dict.pth']} holds no rm_head weights")
            load_strict(head, head_sd, source + " (rm_head)")
            # the non-LoRA file overlays the trained modules on the (strictly loaded) base model
            load_strict(vlm, qwen_vl.legacy_to_current_keys(rest), str(files["non_lora_state_dict.pth"]), partial=True)
            lora = qwen_vl.legacy_to_current_keys(load_state_dict(files["adapter_model.safetensors"]), prefix)
            lcfg = cfg.get("peft_lora_config", {})
            r, alpha = int(lcfg.get("lora_r", 16)), float(lcfg.get("lora_alpha", 32))
            scale = alpha / (r ** 0.5) if lcfg.get("use_rslora", False) else alpha / r
            if merge_lora_(vlm, lora, scale) == 0:
                raise CheckpointError(f"{files['adapter_model.safetensors']} holds no LoRA weights")
    stats = cfg.get("inference_config")
    reward = VideoAlign(vlm, processor, head, token_ids, stats=stats, num_frames=num_frames, **options)
    if num_frames is None and data_cfg.get("fps"):
        # VideoReward samples by time (2 frames per second): files at their own rate, generated clips at
        # the rate their pipeline states (`set_clip_fps`, or `score(fps=...)`)
        reward.card_fps = float(data_cfg["fps"])
        reward.card_fps_sampling = "qwen-vl"  # VideoReward reads videos with qwen_vl_utils
    return reward


def write_videoalign_config(folder: str | os.PathLike, base_model: str, stats: dict[str, float] | None,
                            lora: dict | None = None, max_frame_pixels: int = 56 * 56) -> Path:
    """The model_config.json of a VideoReward checkpoint (used to package fine-tuned heads and tests)."""
    data = {
        "data_config": {"max_frame_pixels": max_frame_pixels, "num_frames": None, "fps": 2.0,
                        "eval_dim": list(VIDEOALIGN_DIMS), "prompt_template_type": "detailed_special",
                        "sample_type": "uniform", "meta_data": "", "data_dir": ""},
        "model_config": {"model_name_or_path": base_model, "output_dim": 3, "use_special_tokens": True,
                         "reward_token": "special"},
        "peft_lora_config": lora or {"lora_enable": False},
    }
    if stats is not None:
        data["inference_config"] = stats
    path = Path(folder) / "model_config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))
    return path
