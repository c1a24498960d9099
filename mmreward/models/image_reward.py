"""ImageReward v1.0 (Xu et al., 2023): BLIP ViT-L/16 + BLIP "med" BERT with cross-attention + MLP head.

reward = (mlp(h_CLS) - 0.16717362830052426) / 1.0333394966054072, where h_CLS is the [CLS] output of
the text encoder run on the prompt (BERT tokenizer, padded to 35) with cross-attention to all image
tokens of the ViT. Written here on plain torch modules whose parameter names follow the official
`ImageReward.pt` exactly (625 tensors: blip.visual_encoder.*, blip.text_encoder.*, blip.vision_proj,
blip.text_proj, mlp.layers.{0,2,4,6,7}), so the official state dict loads strictly without timm 0.6
or transformers 4.x. BLIP's ViT is the timm ViT (pre-norm blocks, LayerNorm eps 1e-6, exact GELU, no
pre-norm before the blocks); the med BERT is post-norm with absolute positions, no token-type
embeddings, and self-attention masks of (1 - mask) * -10000.

Preprocessing is ImageReward's `_transform(224)`: torchvision Resize(224, bicubic) and CenterCrop on
the PIL image (Pillow on uint8, offset rounded), RGB, ToTensor, OpenAI CLIP mean/std. RGB conversion
comes after the resize, so an RGBA image is resized premultiplied by alpha ("resize_then_drop"). The ViT geometry
is read from the checkpoint's tensor shapes (head width 64), the text geometry from med_config.json.
Only the tokenisation of each unique prompt is cached: the text encoder attends to the image, so its
output cannot be cached per prompt.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from mmreward.attention import attend
from mmreward.types import Reward, RewardOutput

REWARD_MEAN = 0.16717362830052426
REWARD_STD = 1.0333394966054072
MAX_TEXT_LENGTH = 35
WEIGHTS_FILE = "ImageReward.pt"
MED_CONFIG_FILE = "med_config.json"
TOKENIZER_REPO = "google-bert/bert-base-uncased"
BERT_TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")

TINY_MED_CONFIG: dict[str, Any] = {
    "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2, "num_hidden_layers": 2,
    "max_position_embeddings": 64, "layer_norm_eps": 1e-12, "pad_token_id": 0, "hidden_act": "gelu",
    "add_cross_attention": True,
}
TINY_VIT: dict[str, int] = {"image_size": 32, "patch_size": 16, "embed_dim": 32, "depth": 2, "num_heads": 2}


# ----------------------------------------------------------------------------------------------
# BLIP vision transformer (timm ViT layout)
# ----------------------------------------------------------------------------------------------
class PatchEmbed(nn.Module):
    def __init__(self, patch_size: int, embed_dim: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(3, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


class ViTAttention(nn.Module):
    attn_backend = "sdpa"  # set by mmreward.attention.apply_attention (the `attention` load option)

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, c // self.num_heads).permute(2, 0, 3, 1, 4)
        out = attend(q, k, v, None, self.attn_backend)
        return self.proj(out.transpose(1, 2).reshape(b, n, c))


class ViTMlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class ViTBlock(nn.Module):
    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = ViTAttention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = ViTMlp(dim, int(dim * mlp_ratio))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class BlipVisionTransformer(nn.Module):
    def __init__(self, image_size: int = 224, patch_size: int = 16, embed_dim: int = 1024, depth: int = 24,
                 num_heads: int = 16) -> None:
        super().__init__()
        self.image_size = image_size
        num_patches = (image_size // patch_size) ** 2
        self.patch_embed = PatchEmbed(patch_size, embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches + 1, embed_dim))
        self.blocks = nn.ModuleList([ViTBlock(embed_dim, num_heads) for _ in range(depth)])
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(pixels)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed[:, : x.shape[1] + 1]
        for block in self.blocks:
            x = block(x)
        return self.norm(x)


# ----------------------------------------------------------------------------------------------
# BLIP "med" BERT: post-norm encoder whose every layer cross-attends to the image tokens
# ----------------------------------------------------------------------------------------------
class BertEmbeddings(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        h = cfg["hidden_size"]
        self.word_embeddings = nn.Embedding(cfg["vocab_size"], h, padding_idx=cfg.get("pad_token_id", 0))
        self.position_embeddings = nn.Embedding(cfg["max_position_embeddings"], h)
        self.LayerNorm = nn.LayerNorm(h, eps=cfg["layer_norm_eps"])
        # persistent, as in BLIP: the official state dict carries it
        self.register_buffer("position_ids", torch.arange(cfg["max_position_embeddings"]).expand((1, -1)))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        pos = self.position_ids[:, : input_ids.shape[1]]
        return self.LayerNorm(self.word_embeddings(input_ids) + self.position_embeddings(pos))


class BertSelfAttention(nn.Module):
    attn_backend = "sdpa"  # set by mmreward.attention.apply_attention (the `attention` load option)

    def __init__(self, cfg: dict[str, Any], kv_width: int) -> None:
        super().__init__()
        h = cfg["hidden_size"]
        self.num_heads = cfg["num_attention_heads"]
        self.query = nn.Linear(h, h)
        self.key = nn.Linear(kv_width, h)
        self.value = nn.Linear(kv_width, h)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        return x.view(b, n, self.num_heads, c // self.num_heads).transpose(1, 2)

    def forward(self, x: torch.Tensor, context: torch.Tensor, additive_mask: torch.Tensor | None) -> torch.Tensor:
        q, k, v = self._heads(self.query(x)), self._heads(self.key(context)), self._heads(self.value(context))
        out = attend(q, k, v, additive_mask, self.attn_backend)
        return out.transpose(1, 2).reshape(x.shape)


class BertSelfOutput(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg["hidden_size"], cfg["hidden_size"])
        self.LayerNorm = nn.LayerNorm(cfg["hidden_size"], eps=cfg["layer_norm_eps"])

    def forward(self, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(h) + residual)


class BertAttention(nn.Module):
    def __init__(self, cfg: dict[str, Any], kv_width: int) -> None:
        super().__init__()
        self.self = BertSelfAttention(cfg, kv_width)
        self.output = BertSelfOutput(cfg)

    def forward(self, x: torch.Tensor, context: torch.Tensor, additive_mask: torch.Tensor | None) -> torch.Tensor:
        return self.output(self.self(x, context, additive_mask), x)


class BertIntermediate(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg["hidden_size"], cfg["intermediate_size"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.dense(x))


class BertOutput(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg["intermediate_size"], cfg["hidden_size"])
        self.LayerNorm = nn.LayerNorm(cfg["hidden_size"], eps=cfg["layer_norm_eps"])

    def forward(self, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(h) + residual)


class BertLayer(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        self.attention = BertAttention(cfg, cfg["hidden_size"])
        self.crossattention = BertAttention(cfg, cfg["encoder_width"])
        self.intermediate = BertIntermediate(cfg)
        self.output = BertOutput(cfg)

    def forward(self, x: torch.Tensor, self_mask: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        x = self.attention(x, x, self_mask)
        x = self.crossattention(x, image, None)  # every image token is attended (BLIP's all-ones mask)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        self.layer = nn.ModuleList([BertLayer(cfg) for _ in range(cfg["num_hidden_layers"])])


class MedBertModel(nn.Module):
    """BLIP's BertModel(add_pooling_layer=False) in "multimodal" mode."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        if cfg.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"med config: only hidden_act='gelu' is supported, got {cfg['hidden_act']!r}")
        if not cfg.get("add_cross_attention", True):
            raise ValueError("med config: ImageReward's text encoder needs add_cross_attention=true")
        self.embeddings = BertEmbeddings(cfg)
        self.encoder = BertEncoder(cfg)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        x = self.embeddings(input_ids)
        self_mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
        for layer in self.encoder.layer:
            x = layer(x, self_mask, image)
        return x


class BlipPretrain(nn.Module):
    """The parts of BLIP_Pretrain that ImageReward.pt holds (the projections are unused for the reward)."""

    def __init__(self, vit: dict[str, int], med_cfg: dict[str, Any], embed_dim: int = 256) -> None:
        super().__init__()
        self.visual_encoder = BlipVisionTransformer(**vit)
        text_cfg = {**med_cfg, "encoder_width": vit["embed_dim"]}
        self.text_encoder = MedBertModel(text_cfg)
        self.vision_proj = nn.Linear(vit["embed_dim"], embed_dim)
        self.text_proj = nn.Linear(med_cfg["hidden_size"], embed_dim)


class RewardHead(nn.Module):
    """ImageReward's MLP: five Linear layers (no activations), dropout after the first three."""

    def __init__(self, input_size: int = 768) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(input_size, 1024), nn.Dropout(0.2),
            nn.Linear(1024, 128), nn.Dropout(0.2),
            nn.Linear(128, 64), nn.Dropout(0.1),
            nn.Linear(64, 16),
            nn.Linear(16, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class ImageRewardModel(nn.Module):
    def __init__(self, vit: dict[str, int], med_cfg: dict[str, Any]) -> None:
        super().__init__()
        self.blip = BlipPretrain(vit, med_cfg)
        self.mlp = RewardHead(med_cfg["hidden_size"])

    def forward(self, pixels: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        image = self.blip.visual_encoder(pixels)
        hidden = self.blip.text_encoder(input_ids, attention_mask, image)
        raw = self.mlp(hidden[:, 0, :].float()).squeeze(-1)
        return (raw - REWARD_MEAN) / REWARD_STD


def vit_geometry(sd: dict[str, torch.Tensor], head_width: int = 64, prefix: str = "blip.visual_encoder.") -> dict[str, int]:
    """ViT sizes from the checkpoint's tensor shapes (BLIP's ViTs use 64-wide heads)."""
    proj = sd[prefix + "patch_embed.proj.weight"]
    embed_dim, patch = int(proj.shape[0]), int(proj.shape[-1])
    grid = math.isqrt(int(sd[prefix + "pos_embed"].shape[1]) - 1)
    depth = 1 + max(int(k[len(prefix) + 7 :].split(".")[0]) for k in sd if k.startswith(prefix + "blocks."))
    return {"image_size": grid * patch, "patch_size": patch, "embed_dim": embed_dim, "depth": depth,
            "num_heads": max(1, embed_dim // head_width)}


# ----------------------------------------------------------------------------------------------
# the reward
# ----------------------------------------------------------------------------------------------
class ImageReward(Reward):
    name = "imagereward"
    differentiable = True
    # Precision: BLIP may run in bf16; the MLP head whose output is the score (and its mean/std
    # normalisation) runs in fp32 on the [CLS] state, as the head is a few thousand weights.
    keep_fp32 = ("model.mlp",)

    def __init__(self, model: ImageRewardModel, tokenizer, preprocess, micro_batch_size: int = 32,
                 cache_size: int = 4096) -> None:
        super().__init__(micro_batch_size=micro_batch_size)
        self.model = model
        self.tokenizer = tokenizer
        self.preprocess = preprocess
        self.cache_size = cache_size
        self._tokens: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def tokenize(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        missing = [p for p in dict.fromkeys(prompts) if p not in self._tokens]
        if missing:
            if len(self._tokens) + len(missing) > self.cache_size:
                self._tokens.clear()
            tok = self.tokenizer(missing, padding="max_length", truncation=True, max_length=MAX_TEXT_LENGTH,
                                 return_tensors="pt")
            for i, p in enumerate(missing):
                self._tokens[p] = (tok["input_ids"][i], tok["attention_mask"][i])
        ids = torch.stack([self._tokens[p][0] for p in prompts]).to(self.device)
        mask = torch.stack([self._tokens[p][1] for p in prompts]).to(self.device)
        return ids, mask

    def _score(self, prompts: list[str], media) -> RewardOutput:
        pixels = self.preprocess(media).to(device=self.device, dtype=self.dtype)
        ids, mask = self.tokenize(prompts)
        return RewardOutput(self.model(pixels, ids, mask).float())

    @property
    def image_alpha(self) -> str:
        return self.preprocess.alpha


def load_bert_tokenizer(source: str):
    """bert-base-uncased's WordPiece tokenizer plus BLIP's two added tokens ([DEC] as bos, [ENC])."""
    from transformers import BertTokenizerFast

    from mmreward.checkpoints import load_files, resolve_files
    from mmreward.errors import CheckpointError

    files = resolve_files(source, [], optional=BERT_TOKENIZER_FILES)
    if "vocab.txt" not in files and "tokenizer.json" not in files:
        raise CheckpointError(
            f"'{source}' holds no BERT tokenizer (vocab.txt or tokenizer.json). ImageReward tokenises with "
            f"bert-base-uncased: pass tokenizer='<folder or hub id>' or put vocab.txt next to {WEIGHTS_FILE}"
        )
    tok = load_files(BertTokenizerFast.from_pretrained, next(iter(files.values())).parent, "BERT tokenizer")
    tok.add_special_tokens({"bos_token": "[DEC]"})
    tok.add_special_tokens({"additional_special_tokens": ["[ENC]"]})
    return tok


def load_imagereward(
    checkpoint: str | None,
    *,
    weights: str = "pretrained",
    tokenizer: str | None = None,
    tiny: bool = False,
    med_config: dict[str, Any] | None = None,
    vit: dict[str, int] | None = None,
    resize_backend: Literal["pil", "torch"] = "pil",
    cache_size: int = 4096,
    micro_batch_size: int = 32,
) -> ImageReward:
    """checkpoint: a folder or hub repo holding ImageReward.pt and med_config.json (and optionally the BERT
    tokenizer's vocab.txt), or the ImageReward.pt file itself with med_config.json beside it."""
    from mmreward.checkpoints import load_state_dict, load_strict, read_json, resolve_files
    from mmreward.errors import CheckpointError, ConfigError
    from mmreward.preprocess import ImagePreprocess

    if weights == "random":
        if not tiny and (med_config is None or vit is None):
            raise ConfigError("weights='random' needs tiny=True or both med_config and vit geometry dicts")
        med = dict(med_config or TINY_MED_CONFIG)
        geo = dict(vit or TINY_VIT)
        if tiny and tokenizer is None:
            import tempfile

            from mmreward.tokenizers import build_bert_tokenizer

            with tempfile.TemporaryDirectory() as tmp:
                tok = build_bert_tokenizer(tmp)
                tok.add_special_tokens({"bos_token": "[DEC]"})
                tok.add_special_tokens({"additional_special_tokens": ["[ENC]"]})
        else:
            tok = load_bert_tokenizer(tokenizer or TOKENIZER_REPO)
        med.setdefault("vocab_size", len(tok))
        model = ImageRewardModel(geo, med)
        with torch.no_grad():  # the reference head init makes every score equal; redraw it
            for layer in model.mlp.layers:
                if isinstance(layer, nn.Linear):
                    nn.init.normal_(layer.weight, std=1.0 / math.sqrt(layer.in_features))
    else:
        if checkpoint is None:
            raise CheckpointError("imagereward: weights='pretrained' needs a checkpoint")
        path = Path(checkpoint).expanduser()
        if path.is_file():
            weight_file, med_file = path, path.parent / MED_CONFIG_FILE
            if not med_file.exists():
                raise CheckpointError(f"{med_file} not found: put ImageReward's {MED_CONFIG_FILE} next to {path.name}")
        else:
            files = resolve_files(checkpoint, [WEIGHTS_FILE, MED_CONFIG_FILE])
            weight_file, med_file = files[WEIGHTS_FILE], files[MED_CONFIG_FILE]
        med = read_json(med_file, "ImageReward med_config")
        sd = load_state_dict(weight_file)
        if "blip.visual_encoder.pos_embed" not in sd:
            raise CheckpointError(f"{weight_file} is not an ImageReward state dict (no blip.visual_encoder.pos_embed)")
        geo = {**vit_geometry(sd), **(vit or {})}
        model = ImageRewardModel(geo, med)
        load_strict(model, sd, str(weight_file))
        tok_source = tokenizer
        if tok_source is None:
            folder = Path(weight_file).parent
            tok_source = str(folder) if (folder / "vocab.txt").exists() or (folder / "tokenizer.json").exists() else TOKENIZER_REPO
        tok = load_bert_tokenizer(tok_source)
    pre = ImagePreprocess(size=geo["image_size"], crop=geo["image_size"], crop_rounding="round",
                          resize_backend=resize_backend, alpha="resize_then_drop")
    return ImageReward(model.float().eval(), tok, pre, micro_batch_size=micro_batch_size, cache_size=cache_size)
