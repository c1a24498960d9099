"""The official InternVL 2.5 layout (remote-code InternVLChatModel: InternViT + mlp1 + InternLM2), for tests.

- `write_native` / `write_official`: one tiny random model saved twice, in transformers' native InternVL layout
  (Llama text model) and in the official layout (InternLM2 / InternViT key names, packed `wqkv` and `qkv`, the
  InternVLChatModel config.json, sharded safetensors with an index, the tokenizer_config naming the remote
  `InternLM2Tokenizer`, and remote-code files that leave a mark if anything imports them). The official tensors are
  packed here from the native ones (the packing is the layout the transcribed forward below reads, so a wrong
  packing fails the logits check);
- `internlm2_logits`: the InternLM2 causal LM forward transcribed from OpenGVLab/InternVL@2410d1dbf208f0e799459aff9376e5747dbf41a2
  internvl_chat/internvl/model/internlm2/modeling_internlm2.py (InternLM2RMSNorm, InternLM2RotaryEmbedding and its
  Linear/DynamicNTK variants, rotate_half / apply_rotary_pos_emb, the `wqkv` rearrange of InternLM2Attention,
  repeat_kv, the eager attention with the causal mask and the fp32 softmax, InternLM2MLP, InternLM2DecoderLayer,
  InternLM2Model.norm, InternLM2ForCausalLM.output), on the official tensors by their official names;
- `internvit_features`: InternVLChatModel.extract_feature transcribed from the same commit
  (internvl_chat/internvl/model/internvl_chat/modeling_intern_vit.py InternVisionEmbeddings with `_get_pos_embed`,
  InternAttention `_naive_attn`, InternMLP, InternVisionEncoderLayer; modeling_internvl_chat.py `pixel_shuffle`
  and `mlp1`).
Nothing here imports mmreward's converter.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import torch
import torch.nn.functional as F

IMG_TOKENS = ["<img>", "</img>", "<IMG_CONTEXT>"]
SIZES = dict(hidden=32, heads=4, kv_heads=2, layers=2, intermediate=48, vit_hidden=16, vit_heads=2, vit_layers=2,
             vit_intermediate=32, image=56, patch=14, max_pos=64, rope_theta=1e6, rope_factor=2.0, rms_eps=1e-5)


def _tokenizer(folder: Path):
    from mmreward.backbones.tiny_qwen_vl import build_qwen_tokenizer

    return build_qwen_tokenizer(folder, IMG_TOKENS)


def write_native(folder: str | Path, seed: int = 0, *, qk_norm: bool = False, norm_type: str = "layer_norm"):
    """A tiny InternVLForConditionalGeneration (Llama text model, grouped-query attention, biases), every parameter
    drawn at random (norms and layer scales too, so that swapped names change the output)."""
    from transformers import InternVLConfig, InternVLForConditionalGeneration

    out = Path(folder)
    tok = _tokenizer(out)
    ids = tok.convert_tokens_to_ids
    s = SIZES
    text = dict(model_type="llama", vocab_size=len(tok), hidden_size=s["hidden"], intermediate_size=s["intermediate"],
                num_hidden_layers=s["layers"], num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"],
                max_position_embeddings=s["max_pos"], rms_norm_eps=s["rms_eps"], attention_bias=True, mlp_bias=False,
                rope_parameters=dict(rope_type="dynamic", factor=s["rope_factor"], rope_theta=s["rope_theta"]),
                tie_word_embeddings=False, pad_token_id=ids("<|endoftext|>"), eos_token_id=ids("<|im_end|>"))
    vision = dict(hidden_size=s["vit_hidden"], num_hidden_layers=s["vit_layers"], num_attention_heads=s["vit_heads"],
                  intermediate_size=s["vit_intermediate"], image_size=[s["image"]] * 2, patch_size=[s["patch"]] * 2,
                  attention_bias=True, use_qk_norm=qk_norm, norm_type=norm_type, layer_norm_eps=1e-6)
    config = InternVLConfig(vision_config=vision, text_config=text, image_token_id=ids("<IMG_CONTEXT>"),
                            image_seq_length=(s["image"] // s["patch"]) ** 2 // 4, downsample_ratio=0.5,
                            tie_word_embeddings=False)
    gen = torch.Generator().manual_seed(seed)
    model = InternVLForConditionalGeneration(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if ("norm" in name and name.endswith("weight")) or "lambda" in name:
                p.copy_(1 + 0.3 * noise)
            elif name.endswith("bias") or "position_embeddings" in name or "cls_token" in name:
                p.copy_(0.2 * noise)
            else:
                p.copy_(0.4 * noise)
    model.save_pretrained(str(out))
    return out


# native -> official: the names of modeling_intern_vit.py / modeling_internlm2.py / modeling_internvl_chat.py
def _official_name(native: str) -> str:
    n = native
    for old, new in [("model.vision_tower.embeddings.cls_token", "vision_model.embeddings.class_embedding"),
                     ("model.vision_tower.embeddings.position_embeddings", "vision_model.embeddings.position_embedding"),
                     ("model.vision_tower.embeddings.patch_embeddings.projection", "vision_model.embeddings.patch_embedding"),
                     ("model.vision_tower.encoder.layer.", "vision_model.encoder.layers."),
                     (".attention.projection_layer.", ".attn.proj."), (".attention.q_norm.", ".attn.q_norm."),
                     (".attention.k_norm.", ".attn.k_norm."), (".layernorm_before.", ".norm1."),
                     (".layernorm_after.", ".norm2."), (".lambda_1", ".ls1"), (".lambda_2", ".ls2"),
                     ("model.multi_modal_projector.layer_norm.", "mlp1.0."),
                     ("model.multi_modal_projector.linear_1.", "mlp1.1."),
                     ("model.multi_modal_projector.linear_2.", "mlp1.3."),
                     ("model.language_model.embed_tokens.", "language_model.model.tok_embeddings."),
                     ("model.language_model.layers.", "language_model.model.layers."),
                     (".self_attn.o_proj.", ".attention.wo."), (".mlp.gate_proj.", ".feed_forward.w1."),
                     (".mlp.up_proj.", ".feed_forward.w3."), (".mlp.down_proj.", ".feed_forward.w2."),
                     (".input_layernorm.", ".attention_norm."), (".post_attention_layernorm.", ".ffn_norm."),
                     ("model.language_model.norm.", "language_model.model.norm."),
                     ("lm_head.", "language_model.output.")]:
        n = n.replace(old, new)
    return n


def official_state_dict(native: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    s = SIZES
    d = s["hidden"] // s["heads"]
    group = s["heads"] // s["kv_heads"]
    out: dict[str, torch.Tensor] = {}
    for key, value in native.items():
        if ".attention.q_proj." in key:  # InternViT: one qkv Linear, rows [q | k | v]
            k, v = native[key.replace("q_proj", "k_proj")], native[key.replace("q_proj", "v_proj")]
            out[_official_name(key.replace(".attention.q_proj.", ".attn.qkv."))] = torch.cat([value, k, v])
        elif ".self_attn.q_proj." in key:  # InternLM2: per key/value head h, [its G query heads, k_h, v_h]
            k, v = native[key.replace("q_proj", "k_proj")], native[key.replace("q_proj", "v_proj")]
            rows = []
            for h in range(s["kv_heads"]):
                rows += [value[h * group * d:(h + 1) * group * d], k[h * d:(h + 1) * d], v[h * d:(h + 1) * d]]
            out[_official_name(key.replace(".self_attn.q_proj.", ".attention.wqkv."))] = torch.cat(rows)
        elif "k_proj" in key or "v_proj" in key:
            continue
        else:
            out[_official_name(key)] = value
    return out


def official_config(native_config: dict, qk_norm: bool = False, norm_type: str = "layer_norm") -> dict:
    s, text = SIZES, native_config["text_config"]
    remote = {"AutoConfig": "configuration_internvl_chat.InternVLChatConfig",
              "AutoModel": "modeling_internvl_chat.InternVLChatModel"}
    return {
        "architectures": ["InternVLChatModel"], "model_type": "internvl_chat", "auto_map": remote,
        "downsample_ratio": 0.5, "dynamic_image_size": True, "force_image_size": s["image"], "max_dynamic_patch": 12,
        "min_dynamic_patch": 1, "ps_version": "v2", "select_layer": -1, "template": "internvl2_5",
        "use_thumbnail": True, "torch_dtype": "float32", "use_backbone_lora": 0, "use_llm_lora": 0,
        "llm_config": {
            "architectures": ["InternLM2ForCausalLM"], "model_type": "internlm2", "attn_implementation": "eager",
            "auto_map": {"AutoModelForCausalLM": "modeling_internlm2.InternLM2ForCausalLM"}, "bias": True,
            "vocab_size": text["vocab_size"], "hidden_size": s["hidden"], "intermediate_size": s["intermediate"],
            "num_hidden_layers": s["layers"], "num_attention_heads": s["heads"], "num_key_value_heads": s["kv_heads"],
            "hidden_act": "silu", "max_position_embeddings": s["max_pos"], "rms_norm_eps": s["rms_eps"],
            "rope_theta": s["rope_theta"], "rope_scaling": {"type": "dynamic", "factor": s["rope_factor"]},
            "tie_word_embeddings": False, "pad_token_id": text["pad_token_id"], "bos_token_id": 1,
            "eos_token_id": text["eos_token_id"], "initializer_range": 0.02, "use_cache": True},
        "vision_config": {
            "architectures": ["InternVisionModel"], "model_type": "intern_vit_6b", "hidden_size": s["vit_hidden"],
            "num_hidden_layers": s["vit_layers"], "num_attention_heads": s["vit_heads"],
            "intermediate_size": s["vit_intermediate"], "image_size": s["image"], "patch_size": s["patch"],
            "num_channels": 3, "qkv_bias": True, "qk_normalization": qk_norm, "norm_type": norm_type,
            "layer_norm_eps": 1e-6, "hidden_act": "gelu", "drop_path_rate": 0.1, "dropout": 0.0,
            "attention_dropout": 0.0, "initializer_factor": 0.1, "initializer_range": 0.02, "use_flash_attn": False},
    }


REMOTE_CODE = "import pathlib\npathlib.Path(__file__).with_name('REMOTE_CODE_RAN').write_text('yes')\n"


def write_official(native_folder: str | Path, folder: str | Path, *, qk_norm: bool = False,
                   norm_type: str = "layer_norm", shards: int = 2) -> Path:
    """The native folder's model in the official InternVLChatModel layout (see the module docstring)."""
    from safetensors.torch import save_file
    from transformers import InternVLForConditionalGeneration

    src, out = Path(native_folder), Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    # the model's own names (save_pretrained writes transformers' older key layout to the file)
    native = dict(InternVLForConditionalGeneration.from_pretrained(str(src)).state_dict())
    state = official_state_dict(native)
    keys = sorted(state)
    weight_map = {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: state[k].contiguous() for k in keys[i::shards]}
        save_file(part, str(out / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in part})
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    cfg = official_config(json.loads((src / "config.json").read_text()), qk_norm, norm_type)
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    for name in ("tokenizer.json", "special_tokens_map.json", "chat_template.jinja"):
        if (src / name).exists():
            shutil.copy(src / name, out / name)
    tok_cfg = json.loads((src / "tokenizer_config.json").read_text())
    tok_cfg.update(tokenizer_class="InternLM2Tokenizer",
                   auto_map={"AutoTokenizer": ["tokenization_internlm2.InternLM2Tokenizer", None]})
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    for code in ("modeling_internvl_chat.py", "configuration_internvl_chat.py", "modeling_internlm2.py",
                 "tokenization_internlm2.py", "modeling_intern_vit.py"):
        (out / code).write_text(REMOTE_CODE)
    return out


def read_official(folder: str | Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {k: v for f in sorted(Path(folder).glob("*.safetensors")) for k, v in load_file(str(f)).items()}


# ------------------------------------------------------------------------------------------------
# modeling_internlm2.py, transcribed
# ------------------------------------------------------------------------------------------------
def _rms_norm(x, weight, eps):
    input_dtype = x.dtype
    x = x.to(torch.float32)
    variance = x.pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(variance + eps)
    return weight * x.to(input_dtype)


def _cos_sin(llm: dict, head_dim: int, seq_len: int):
    """InternLM2RotaryEmbedding (+ Linear / DynamicNTK scaling) of a freshly built module called at seq_len."""
    base, max_pos = llm["rope_theta"], llm["max_position_embeddings"]
    scaling = llm.get("rope_scaling")
    cached = max(seq_len, max_pos)  # the cache is built for max_position_embeddings and rebuilt when longer
    if scaling and scaling["type"] == "dynamic" and cached > max_pos:
        factor = scaling["factor"]
        base = base * ((factor * cached / max_pos) - (factor - 1)) ** (head_dim / (head_dim - 2))
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2).float() / head_dim))
    t = torch.arange(cached).to(dtype=inv_freq.dtype)
    if scaling and scaling["type"] == "linear":
        t = t / scaling["factor"]
    freqs = torch.einsum("i,j->ij", t, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos()[:seq_len], emb.sin()[:seq_len]


def _rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def _linear(x, sd, name):
    return F.linear(x, sd[name + ".weight"], sd.get(name + ".bias"))


def internlm2_logits(sd: dict[str, torch.Tensor], llm: dict, inputs_embeds: torch.Tensor) -> torch.Tensor:
    """InternLM2ForCausalLM(inputs_embeds=...).logits with eager attention, no padding, positions 0..T-1."""
    bsz, q_len, hidden = inputs_embeds.shape
    heads = llm["num_attention_heads"]
    kv_heads = llm["num_key_value_heads"]
    head_dim = hidden // heads
    groups = heads // kv_heads
    eps = llm["rms_norm_eps"]
    cos, sin = _cos_sin(llm, head_dim, q_len)
    position_ids = torch.arange(q_len)[None]
    cos, sin = cos[position_ids].unsqueeze(1), sin[position_ids].unsqueeze(1)
    mask = torch.full((q_len, q_len), torch.finfo(inputs_embeds.dtype).min)
    mask = mask.masked_fill(torch.arange(q_len)[:, None] >= torch.arange(q_len)[None], 0.0)[None, None]
    h = inputs_embeds
    for i in range(llm["num_hidden_layers"]):
        p = f"language_model.model.layers.{i}."
        residual = h
        x = _rms_norm(h, sd[p + "attention_norm.weight"], eps)
        qkv = _linear(x, sd, p + "attention.wqkv")
        qkv = qkv.reshape(bsz, q_len, kv_heads, 2 + groups, head_dim)  # 'b q (h gs d) -> b q h gs d'
        q = qkv[..., :groups, :].reshape(bsz, q_len, kv_heads * groups, head_dim)  # 'b q h gs d -> b q (h gs) d'
        k, v = qkv[..., -2, :], qkv[..., -1, :]
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        k = k[:, :, None].expand(bsz, kv_heads, groups, q_len, head_dim).reshape(bsz, heads, q_len, head_dim)
        v = v[:, :, None].expand(bsz, kv_heads, groups, q_len, head_dim).reshape(bsz, heads, q_len, head_dim)
        w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(head_dim) + mask
        w = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        a = torch.matmul(w, v).transpose(1, 2).reshape(bsz, q_len, hidden)
        h = residual + _linear(a, sd, p + "attention.wo")
        residual = h
        x = _rms_norm(h, sd[p + "ffn_norm.weight"], eps)
        x = _linear(F.silu(_linear(x, sd, p + "feed_forward.w1")) * _linear(x, sd, p + "feed_forward.w3"), sd,
                    p + "feed_forward.w2")
        h = residual + x
    h = _rms_norm(h, sd["language_model.model.norm.weight"], eps)
    return F.linear(h, sd["language_model.output.weight"]).float()


# ------------------------------------------------------------------------------------------------
# modeling_intern_vit.py + InternVLChatModel.extract_feature, transcribed
# ------------------------------------------------------------------------------------------------
def _vit_norm(x, sd, name, vis):
    if vis["norm_type"] == "rms_norm":
        return _rms_norm(x, sd[name + ".weight"], vis["layer_norm_eps"])
    return F.layer_norm(x, x.shape[-1:], sd[name + ".weight"], sd[name + ".bias"], vis["layer_norm_eps"])


def internvit_features(sd: dict[str, torch.Tensor], cfg: dict, pixel_values: torch.Tensor) -> torch.Tensor:
    vis = cfg["vision_config"]
    size, patch = vis["image_size"], vis["patch_size"]
    patch_embeds = F.conv2d(pixel_values, sd["vision_model.embeddings.patch_embedding.weight"],
                            sd["vision_model.embeddings.patch_embedding.bias"], stride=patch)
    batch_size, _, height, width = patch_embeds.shape
    patch_embeds = patch_embeds.flatten(2).transpose(1, 2)
    class_embeds = sd["vision_model.embeddings.class_embedding"].expand(batch_size, 1, -1)
    x = torch.cat([class_embeds, patch_embeds], dim=1)
    pos = sd["vision_model.embeddings.position_embedding"]
    grid = pos[:, 1:, :].float().reshape(1, size // patch, size // patch, -1).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, size=(height, width), mode="bicubic", align_corners=False)
    grid = grid.reshape(1, -1, height * width).permute(0, 2, 1)
    x = x + torch.cat([pos[:, :1, :], grid], dim=1)
    heads = vis["num_attention_heads"]
    for i in range(vis["num_hidden_layers"]):
        p = f"vision_model.encoder.layers.{i}."
        y = _vit_norm(x, sd, p + "norm1", vis)
        B, N, C = y.shape
        qkv = _linear(y, sd, p + "attn.qkv").reshape(B, N, 3, heads, C // heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        if vis["qk_normalization"]:
            B_, H_, N_, D_ = q.shape
            q = _rms_norm(q.transpose(1, 2).flatten(-2, -1), sd[p + "attn.q_norm.weight"], vis["layer_norm_eps"])
            q = q.view(B_, N_, H_, D_).transpose(1, 2)
            k = _rms_norm(k.transpose(1, 2).flatten(-2, -1), sd[p + "attn.k_norm.weight"], vis["layer_norm_eps"])
            k = k.view(B_, N_, H_, D_).transpose(1, 2)
        attn = ((q * (C // heads) ** -0.5) @ k.transpose(-2, -1)).softmax(dim=-1)
        y = (attn @ v).transpose(1, 2).reshape(B, N, C)
        x = x + _linear(y, sd, p + "attn.proj") * sd[p + "ls1"]
        y = _vit_norm(x, sd, p + "norm2", vis)
        y = _linear(F.gelu(_linear(y, sd, p + "mlp.fc1")), sd, p + "mlp.fc2")
        x = x + y * sd[p + "ls2"]
    x = x[:, 1:, :]
    h = w = int(x.shape[1] ** 0.5)
    x = x.reshape(x.shape[0], h, w, -1)
    scale = cfg["downsample_ratio"]
    n, w_, h_, c = x.size()  # pixel_shuffle, ps_version 'v2'
    x = x.view(n, w_, int(h_ * scale), int(c / scale)).permute(0, 2, 1, 3).contiguous()
    x = x.view(n, int(h_ * scale), int(w_ * scale), int(c / (scale * scale))).permute(0, 2, 1, 3).contiguous()
    x = x.reshape(x.shape[0], -1, x.shape[-1])
    x = F.layer_norm(x, x.shape[-1:], sd["mlp1.0.weight"], sd["mlp1.0.bias"], 1e-5)
    return _linear(F.gelu(_linear(x, sd, "mlp1.1")), sd, "mlp1.3")
