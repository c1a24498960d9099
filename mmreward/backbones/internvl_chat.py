"""Official InternVL checkpoints (remote-code `InternVLChatModel` + InternLM2) as transformers' native InternVL.

The official InternVL 2.5 folders (OpenGVLab/InternVL2_5-8B, OpenGVLab/VisualPRM-8B, ...) hold remote code:
`InternVLChatModel` = InternViT vision tower + `mlp1` projector + `InternLM2ForCausalLM`. transformers 5 has no
InternLM2 class, and this library runs no hub code. Here the folder's config.json (JSON, nothing executed) and its
safetensors weights (no unpickling) are converted in memory to `InternVLForConditionalGeneration` with a Llama
language model, strictly: every file key maps to exactly one model key and every model key is filled.

The mapping follows transformers' own conversion script, src/transformers/models/internvl/
convert_internvl_weights_to_hf.py (huggingface/transformers@015d3b273cbc4a72f2feb1da386896655a23b3da: the
`ORIGINAL_TO_CONVERTED_KEY_MAPPING_*` tables, the `attn.qkv` thirds, the `attention.wqkv` un-packing by key/value
groups, `get_internvl_config`), written anew here (that script needs einops, remote code and the hub). Defaults of
absent config fields are those of the original classes (OpenGVLab/InternVL@2410d1dbf208f0e799459aff9376e5747dbf41a2
internvl_chat/internvl/model: InternVLChatConfig, InternVisionConfig, InternLM2Config).

Equivalences this relies on (checked by tests/mmreward/test_visual_prm_official_layout.py against transcriptions of
modeling_internlm2.py and modeling_intern_vit.py at that commit):
- InternLM2 = Llama with a packed `wqkv` whose rows are, per key/value head, its query heads then its key then its
  value head; SwiGLU with w1 = gate, w3 = up, w2 = down; `bias` on wqkv and wo only (the MLP has none);
- InternViT = transformers' InternVLVision: `ls1`/`ls2` are the layer scales `lambda_1`/`lambda_2`, `norm1`/`norm2`
  the norms before attention/MLP, no final norm (`use_mean_pooling=True` makes it an identity), q/k RMSNorm over the
  whole width (`qk_normalization`, native `use_qk_norm`, whose eps is fixed at 1e-6);
- the projector `mlp1` = LayerNorm, Linear, GELU, Linear; the pixel shuffle of `ps_version="v2"`.
What differs is refused with a CheckpointError: `ps_version` "v1" (a transposed feature map), `select_layer` other
than -1, a `force_image_size` other than the vision tower's (interpolated position embeddings), qk-normalization
with an eps other than 1e-6, rope scaling other than none/"linear"/"dynamic", and language models other than
InternLM2. One behaviour is not reproduced: InternLM2's dynamic-NTK rope keeps the stretched base after a call longer
than `max_position_embeddings` (32768 for InternLM2.5), transformers' resets it for shorter calls.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from mmreward.checkpoints import (
    check_dtype_kinds,
    key_mismatch_error,
    load_state_dict,
    read_json,
    resolve_files,
)
from mmreward.errors import CheckpointError

CHAT_ARCHITECTURE = "InternVLChatModel"
INTERNLM2 = "InternLM2ForCausalLM"
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"

# defaults of the original config classes, for fields a config.json may omit (OpenGVLab/InternVL@2410d1d)
_VISION_DEFAULTS = dict(patch_size=14, image_size=224, qkv_bias=False, hidden_size=3200, num_attention_heads=25,
                        intermediate_size=12800, qk_normalization=True, num_hidden_layers=48, hidden_act="gelu",
                        norm_type="rms_norm", layer_norm_eps=1e-6, initializer_range=0.02, initializer_factor=0.1)
_LLM_DEFAULTS = dict(vocab_size=103168, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                     num_attention_heads=32, num_key_value_heads=None, hidden_act="silu", max_position_embeddings=2048,
                     initializer_range=0.02, rms_norm_eps=1e-6, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                     bias=True, rope_theta=10000, rope_scaling=None)
_CHAT_DEFAULTS = dict(select_layer=-1, force_image_size=None, downsample_ratio=0.5, ps_version="v1", template=None)
NATIVE_QK_NORM_EPS = 1e-6  # InternVLVisionRMSNorm(embed_dim) in transformers' InternVLVisionAttention


def is_internvl_chat(raw: Mapping[str, Any]) -> bool:
    """Whether a config.json (as a dict) is the official remote-code InternVLChatModel layout."""
    return CHAT_ARCHITECTURE in (raw.get("architectures") or ()) or raw.get("model_type") == "internvl_chat"


def _field(section: Mapping[str, Any], defaults: Mapping[str, Any], name: str) -> Any:
    return section[name] if section.get(name) is not None else defaults[name]


def _size(value: Any, what: str) -> int:
    if isinstance(value, (list, tuple)):
        if len(set(value)) != 1:
            raise CheckpointError(f"InternVL checkpoint: {what} {value} is not square; InternViT tiles are square")
        value = value[0]
    if not isinstance(value, int) or value <= 0:
        raise CheckpointError(f"InternVL checkpoint: {what} must be a positive int, got {value!r}")
    return value


def native_config(raw: Mapping[str, Any], image_token_id: int, source: str = "checkpoint"):
    """transformers' InternVLConfig (Llama text model) equivalent to an official InternVLChatModel config.json."""
    from transformers import InternVLConfig

    def refuse(msg: str) -> CheckpointError:
        return CheckpointError(f"{source}: {msg}")

    chat = {k: _field(raw, _CHAT_DEFAULTS, k) for k in _CHAT_DEFAULTS}
    llm, vis = raw.get("llm_config"), raw.get("vision_config")
    if not isinstance(llm, Mapping) or not isinstance(vis, Mapping):
        raise refuse("an InternVLChatModel config.json needs 'llm_config' and 'vision_config' objects")
    arch = (llm.get("architectures") or [None])[0]
    if arch != INTERNLM2:
        raise refuse(f"its language model is {arch!r}; only {INTERNLM2} (InternVL 2.5 with InternLM2/2.5, e.g. "
                     "VisualPRM-8B) is converted. Other InternVLChatModel checkpoints have '-hf' conversions on the hub")
    if chat["ps_version"] != "v2":
        raise refuse(f"ps_version {chat['ps_version']!r}: transformers' InternVL implements the 'v2' pixel shuffle only "
                     "('v1' leaves the feature map transposed)")
    if chat["select_layer"] != -1:
        raise refuse(f"select_layer {chat['select_layer']}: only the last vision layer (-1) is supported")
    v = {k: _field(vis, _VISION_DEFAULTS, k) for k in _VISION_DEFAULTS}
    image_size, patch = _size(v["image_size"], "vision image_size"), _size(v["patch_size"], "vision patch_size")
    if chat["force_image_size"] not in (None, image_size):
        raise refuse(f"force_image_size {chat['force_image_size']} differs from the vision tower's image_size "
                     f"{image_size} (the original interpolates its position embeddings); not supported")
    if v["norm_type"] not in ("layer_norm", "rms_norm"):
        raise refuse(f"vision norm_type {v['norm_type']!r} is neither 'layer_norm' nor 'rms_norm'")
    if v["qk_normalization"] and v["layer_norm_eps"] != NATIVE_QK_NORM_EPS:
        raise refuse(f"qk_normalization with layer_norm_eps {v['layer_norm_eps']}: transformers' InternVL q/k norms use "
                     f"eps {NATIVE_QK_NORM_EPS}, so the converted tower would differ")
    t = {k: _field(llm, _LLM_DEFAULTS, k) for k in _LLM_DEFAULTS}
    heads = t["num_attention_heads"]
    kv = t["num_key_value_heads"] or heads
    if t["hidden_size"] % heads or heads % kv:
        raise refuse(f"hidden_size {t['hidden_size']}, {heads} heads and {kv} key/value heads do not divide evenly")
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": float(t["rope_theta"])}
    scaling = t["rope_scaling"]
    if scaling is not None:
        kind = scaling.get("type") if isinstance(scaling, Mapping) else None
        if kind not in ("linear", "dynamic"):
            raise refuse(f"rope_scaling {scaling!r}: InternLM2 knows 'linear' and 'dynamic' only")
        rope.update(rope_type=kind, factor=float(scaling["factor"]))
    ratio = float(chat["downsample_ratio"])
    text = dict(model_type="llama", vocab_size=t["vocab_size"], hidden_size=t["hidden_size"],
                intermediate_size=t["intermediate_size"], num_hidden_layers=t["num_hidden_layers"],
                num_attention_heads=heads, num_key_value_heads=kv, head_dim=t["hidden_size"] // heads,
                hidden_act=t["hidden_act"], max_position_embeddings=t["max_position_embeddings"],
                initializer_range=t["initializer_range"], rms_norm_eps=t["rms_norm_eps"], rope_parameters=rope,
                attention_bias=bool(t["bias"]), mlp_bias=False, tie_word_embeddings=False,  # as InternVLChatConfig
                pad_token_id=t["pad_token_id"], bos_token_id=t["bos_token_id"], eos_token_id=t["eos_token_id"])
    vision = dict(hidden_size=v["hidden_size"], num_hidden_layers=v["num_hidden_layers"],
                  num_attention_heads=v["num_attention_heads"], intermediate_size=v["intermediate_size"],
                  hidden_act=v["hidden_act"], norm_type=v["norm_type"], layer_norm_eps=v["layer_norm_eps"],
                  use_qk_norm=bool(v["qk_normalization"]), attention_bias=bool(v["qkv_bias"]),
                  image_size=[image_size, image_size], patch_size=[patch, patch], num_channels=3,
                  use_absolute_position_embeddings=True, use_mean_pooling=True, use_mask_token=False,
                  layer_scale_init_value=v["initializer_factor"], initializer_range=v["initializer_range"],
                  attention_dropout=0.0, projection_dropout=0.0, hidden_dropout_prob=0.0)
    return InternVLConfig(vision_config=vision, text_config=text, image_token_id=image_token_id,
                          image_seq_length=int((image_size // patch) ** 2 * ratio ** 2), downsample_ratio=ratio,
                          projector_hidden_act="gelu", vision_feature_layer=-1,
                          vision_feature_select_strategy="default", tie_word_embeddings=False)


# ----------------------------------------------------------------------------------------------
# the state dict
# ----------------------------------------------------------------------------------------------
_VIT = r"vision_model\.encoder\.layers\.(\d+)\."
_NATIVE_VIT = r"model.vision_tower.encoder.layer.\1."
_LM = r"language_model\.model\.layers\.(\d+)\."
_NATIVE_LM = r"model.language_model.layers.\1."
# (official key, native key); a native key with "{}" is a packed q/k/v tensor, split by _SPLITS[its kind]
_RULES: list[tuple[str, str, str | None]] = [
    (r"vision_model\.embeddings\.class_embedding", "model.vision_tower.embeddings.cls_token", None),
    (r"vision_model\.embeddings\.position_embedding", "model.vision_tower.embeddings.position_embeddings", None),
    (r"vision_model\.embeddings\.patch_embedding\.(weight|bias)",
     r"model.vision_tower.embeddings.patch_embeddings.projection.\1", None),
    (_VIT + r"attn\.qkv\.(weight|bias)", _NATIVE_VIT + r"attention.{}_proj.\2", "thirds"),
    (_VIT + r"attn\.proj\.(weight|bias)", _NATIVE_VIT + r"attention.projection_layer.\2", None),
    (_VIT + r"attn\.(q_norm|k_norm)\.weight", _NATIVE_VIT + r"attention.\2.weight", None),
    (_VIT + r"mlp\.(fc1|fc2)\.(weight|bias)", _NATIVE_VIT + r"mlp.\2.\3", None),
    (_VIT + r"norm1\.(weight|bias)", _NATIVE_VIT + r"layernorm_before.\2", None),
    (_VIT + r"norm2\.(weight|bias)", _NATIVE_VIT + r"layernorm_after.\2", None),
    (_VIT + r"ls1", _NATIVE_VIT + r"lambda_1", None),
    (_VIT + r"ls2", _NATIVE_VIT + r"lambda_2", None),
    (r"mlp1\.0\.(weight|bias)", r"model.multi_modal_projector.layer_norm.\1", None),
    (r"mlp1\.1\.(weight|bias)", r"model.multi_modal_projector.linear_1.\1", None),
    (r"mlp1\.3\.(weight|bias)", r"model.multi_modal_projector.linear_2.\1", None),
    (r"language_model\.model\.tok_embeddings\.weight", "model.language_model.embed_tokens.weight", None),
    (_LM + r"attention\.wqkv\.(weight|bias)", _NATIVE_LM + r"self_attn.{}_proj.\2", "kv_groups"),
    (_LM + r"attention\.wo\.(weight|bias)", _NATIVE_LM + r"self_attn.o_proj.\2", None),
    (_LM + r"feed_forward\.w1\.weight", _NATIVE_LM + r"mlp.gate_proj.weight", None),
    (_LM + r"feed_forward\.w3\.weight", _NATIVE_LM + r"mlp.up_proj.weight", None),
    (_LM + r"feed_forward\.w2\.weight", _NATIVE_LM + r"mlp.down_proj.weight", None),
    (_LM + r"attention_norm\.weight", _NATIVE_LM + r"input_layernorm.weight", None),
    (_LM + r"ffn_norm\.weight", _NATIVE_LM + r"post_attention_layernorm.weight", None),
    (r"language_model\.model\.norm\.weight", "model.language_model.norm.weight", None),
    (r"language_model\.output\.weight", "lm_head.weight", None),
]
_COMPILED = [(re.compile(p), n, s) for p, n, s in _RULES]


def _thirds(packed: torch.Tensor, config) -> tuple[torch.Tensor, ...]:
    """InternViT's `qkv`: rows [q | k | v], each hidden_size wide (`reshape(B, N, 3, heads, d)`)."""
    return tuple(packed.chunk(3, dim=0))


def _kv_groups(packed: torch.Tensor, config) -> tuple[torch.Tensor, ...]:
    """InternLM2's `wqkv`: rows grouped per key/value head h as [q heads of h (G of them), k_h, v_h], each head_dim
    rows (modeling_internlm2.py `rearrange(qkv, 'b q (h gs d) -> b q h gs d', gs=2 + G)`); query head h * G + g."""
    text = config.text_config
    kv, d = text.num_key_value_heads, text.head_dim
    groups = text.num_attention_heads // kv
    rows = packed.reshape(kv, groups + 2, d, *packed.shape[1:])
    rest = packed.shape[1:]
    q = rows[:, :groups].reshape(kv * groups * d, *rest)
    return q.contiguous(), rows[:, -2].reshape(kv * d, *rest).contiguous(), rows[:, -1].reshape(kv * d, *rest).contiguous()


_SPLITS: dict[str, Callable[[torch.Tensor, Any], tuple[torch.Tensor, ...]]] = {"thirds": _thirds,
                                                                              "kv_groups": _kv_groups}


def convert_state_dict(state_dict: Mapping[str, torch.Tensor], config, source: str = "checkpoint"
                       ) -> dict[str, torch.Tensor]:
    """Official InternVLChatModel (InternLM2) keys -> native InternVLForConditionalGeneration keys; a key no rule
    maps is a CheckpointError naming it (nothing is dropped silently)."""
    out: dict[str, torch.Tensor] = {}
    unmapped = []
    for key, value in state_dict.items():
        for pattern, target, split in _COMPILED:
            m = pattern.fullmatch(key)
            if m is None:
                continue
            name = m.expand(target)
            if split is None:
                out[name] = value
            else:
                expected = _packed_rows(split, config)
                if value.shape[0] != expected:
                    raise CheckpointError(f"{source}: {key} has {value.shape[0]} rows, the config implies {expected}")
                for part, tensor in zip("qkv", _SPLITS[split](value, config)):
                    out[name.format(part)] = tensor
            break
        else:
            unmapped.append(key)
    if unmapped:
        raise CheckpointError(
            f"{source}: {len(unmapped)} weights have no place in the converted InternVL model (e.g. "
            f"{sorted(unmapped)[:5]}). This converter knows InternVL 2.5 InternViT + InternLM2 checkpoints "
            "(InternVLChatModel); is this one of them, complete and unmodified?")
    return out


def _packed_rows(split: str, config) -> int:
    if split == "thirds":
        return 3 * config.vision_config.hidden_size
    text = config.text_config
    return (text.num_attention_heads + 2 * text.num_key_value_heads) * text.head_dim


# ----------------------------------------------------------------------------------------------
# reading a folder
# ----------------------------------------------------------------------------------------------
def read_config(source: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint's config.json as JSON (no class looked up, nothing executed)."""
    return read_json(resolve_files(source, ["config.json"])["config.json"], "model config")


def weight_files(source: str | os.PathLike) -> list[Path]:
    """The safetensors files of a checkpoint: the shards of model.safetensors.index.json, or model.safetensors."""
    found = resolve_files(source, [], optional=[INDEX, SINGLE])
    if INDEX in found:
        weight_map = read_json(found[INDEX], "safetensors index").get("weight_map")
        if not isinstance(weight_map, Mapping) or not weight_map:
            raise CheckpointError(f"{found[INDEX]} has no 'weight_map' object")
        shards = sorted(set(weight_map.values()))
        if any(not isinstance(s, str) or "/" in s or "\\" in s or s.startswith(".") for s in shards):
            raise CheckpointError(f"{found[INDEX]} names shard files outside the folder: {shards[:5]}")
        return [resolve_files(source, shards)[s] for s in shards]
    if SINGLE in found:
        return [found[SINGLE]]
    raise CheckpointError(f"'{os.fspath(source)}' has no safetensors weights ({INDEX} or {SINGLE}); other formats "
                          "(pickled .bin/.pt) are not read")


def read_weights(files: list[Path]) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for file in files:
        part = load_state_dict(file)
        twice = set(part) & set(state)
        if twice:
            raise CheckpointError(f"{file} repeats weights of another shard: {sorted(twice)[:5]}")
        state.update(part)
    return state


def load_internvl_chat(source: str | os.PathLike, raw_config: Mapping[str, Any], image_token_id: int,
                       dtype: torch.dtype = torch.float32):
    """An official InternVLChatModel (InternLM2) folder or hub id as an InternVLForConditionalGeneration, strictly."""
    from accelerate import init_empty_weights
    from transformers import InternVLForConditionalGeneration

    src = os.fspath(source)
    config = native_config(raw_config, image_token_id, src)
    state = convert_state_dict(read_weights(weight_files(source)), config, src)
    with init_empty_weights(include_buffers=False):  # parameters on "meta": the file's tensors are assigned, not copied
        model = InternVLForConditionalGeneration(config)
    own = model.state_dict()
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    mismatched = [f"{k}: file {tuple(state[k].shape)} vs model {tuple(own[k].shape)}" for k in sorted(set(own) & set(state))
                  if tuple(state[k].shape) != tuple(own[k].shape)]
    if missing or unexpected or mismatched:
        raise key_mismatch_error(src, "InternVLForConditionalGeneration (converted from InternVLChatModel)", missing,
                                 unexpected, mismatched)
    check_dtype_kinds(src, {k: v.dtype for k, v in state.items()}, own)
    model.load_state_dict(state, strict=True, assign=True)
    return model.to(dtype).eval()
