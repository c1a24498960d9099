"""GenEval's Mask2Former detector: mmdet checkpoint -> transformers, strictly, and mmdet's numerics.

The mmdet-named checkpoint is the state dict of modules transcribed here from open-mmlab/mmdetection 2.x
(`mmdet/models/backbones/swin.py` WindowMSA / ShiftWindowMSA / SwinBlock / PatchMerging (nn.Unfold) /
PatchEmbed as at 09269cf, `plugins/msdeformattn_pixel_decoder.py` at 3e26931, `dense_heads/mask2former_head.py`,
mmcv 1.x FFN / ConvModule / MultiheadAttention layouts), not from our conversion's inverse. The Swin
forward is transcribed too and gives the reference backbone features, and so are the pixel decoder
(mmcv's pytorch MultiScaleDeformableAttention) and the masked-attention decoder for whole-network logits. Post-processing references:
`maskformer_fusion_head.py` instance_postprocess, `core/mask/utils.py` mask2bbox (loop version),
`core/bbox/transforms.py` bbox2result, then GenEval's (djghosh13/geneval@af4902f) per-class ordering.
mmdet/mmcv 2.x are not installable next to torch 2.14 (mmcv-full 1.7 builds CUDA ops against torch<=2.1).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from mmreward.errors import CheckpointError
from tests._helpers.parity_record import record_parity
from tests._helpers.tolerances import assert_close_scaled

pytest.importorskip("transformers")

from mmreward.geneval import mask2former as m2f  # noqa: E402

DEPTHS, HEADS, EMBED, WINDOW = (2, 2, 2, 2), (1, 2, 2, 4), 16, 3
HIDDEN, ENC_FFN, DEC_FFN, ENC_LAYERS, DEC_LAYERS, QUERIES, CLASSES = 32, 64, 64, 2, 3, 12, 80


# ------------------------------------------------------------------ mmdet's Swin, transcribed
class WindowMSA(nn.Module):
    def __init__(self, dim, heads, window):
        super().__init__()
        self.heads, self.window, self.scale = heads, window, (dim // heads) ** -0.5
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * window - 1) ** 2, heads))
        seq1 = torch.arange(0, (2 * window - 1) * window, 2 * window - 1)  # double_step_seq(2Ww-1, Wh, 1, Ww)
        seq2 = torch.arange(0, window, 1)
        coords = (seq1[:, None] + seq2[None, :]).reshape(1, -1)
        self.register_buffer("relative_position_index", (coords + coords.T).flip(1).contiguous())
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x, mask=None):
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0] * self.scale, qkv[1], qkv[2]
        attn = q @ k.transpose(-2, -1)
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)].view(n, n, -1)
        attn = attn + bias.permute(2, 0, 1).unsqueeze(0)
        if mask is not None:
            nw = mask.shape[0]
            attn = attn.view(b // nw, nw, self.heads, n, n) + mask.unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, self.heads, n, n)
        return self.proj((attn.softmax(-1) @ v).transpose(1, 2).reshape(b, n, c))


class ShiftWindowMSA(nn.Module):
    def __init__(self, dim, heads, window, shift):
        super().__init__()
        self.window, self.shift = window, shift
        self.w_msa = WindowMSA(dim, heads, window)

    def partition(self, x):
        b, h, w, c = x.shape
        ws = self.window
        return x.view(b, h // ws, ws, w // ws, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, ws, ws, c)

    def forward(self, query, hw):
        b, _, c = query.shape
        h, w = hw
        ws = self.window
        query = query.view(b, h, w, c)
        pad_r, pad_b = (ws - w % ws) % ws, (ws - h % ws) % ws
        query = F.pad(query, (0, 0, 0, pad_r, 0, pad_b))
        hp, wp = query.shape[1], query.shape[2]
        if self.shift > 0:
            shifted = torch.roll(query, shifts=(-self.shift, -self.shift), dims=(1, 2))
            img_mask = torch.zeros((1, hp, wp, 1))
            cnt = 0
            for hs in (slice(0, -ws), slice(-ws, -self.shift), slice(-self.shift, None)):
                for wsl in (slice(0, -ws), slice(-ws, -self.shift), slice(-self.shift, None)):
                    img_mask[:, hs, wsl, :] = cnt
                    cnt += 1
            mw = self.partition(img_mask).view(-1, ws * ws)
            attn_mask = mw.unsqueeze(1) - mw.unsqueeze(2)
            attn_mask = attn_mask.masked_fill(attn_mask != 0, -100.0).masked_fill(attn_mask == 0, 0.0)
        else:
            shifted, attn_mask = query, None
        windows = self.w_msa(self.partition(shifted).view(-1, ws * ws, c), mask=attn_mask).view(-1, ws, ws, c)
        bb = int(windows.shape[0] / (hp * wp / ws / ws))
        x = windows.view(bb, hp // ws, wp // ws, ws, ws, -1).permute(0, 1, 3, 2, 4, 5).reshape(bb, hp, wp, -1)
        if self.shift > 0:
            x = torch.roll(x, shifts=(self.shift, self.shift), dims=(1, 2))
        return x[:, :h, :w, :].reshape(b, h * w, c)


class FFN(nn.Module):  # mmcv FFN, num_fcs=2: layers = [[Linear, act, Dropout], Linear, Dropout]; identity added
    def __init__(self, dim, hidden, act):
        super().__init__()
        self.layers = nn.Sequential(nn.Sequential(nn.Linear(dim, hidden), act, nn.Dropout(0.0)), nn.Linear(hidden, dim),
                                    nn.Dropout(0.0))  # fmt: skip

    def forward(self, x, identity):
        return identity + self.layers(x)


class SwinBlock(nn.Module):
    def __init__(self, dim, heads, window, shift):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = ShiftWindowMSA(dim, heads, window, window // 2 if shift else 0)
        self.norm2 = nn.LayerNorm(dim)
        self.ffn = FFN(dim, 4 * dim, nn.GELU())

    def forward(self, x, hw):
        x = self.attn(self.norm1(x), hw) + x
        return self.ffn(self.norm2(x), identity=x)


class PatchMerging(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.sampler = nn.Unfold(kernel_size=2, dilation=1, padding=0, stride=2)
        self.norm = nn.LayerNorm(4 * dim)
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)

    def forward(self, x, hw):
        b, _, c = x.shape
        h, w = hw
        x = x.view(b, h, w, c).permute(0, 3, 1, 2)
        x = F.pad(x, [0, w % 2, 0, h % 2])  # AdaptivePadding 'corner'
        h, w = x.shape[-2:]
        x = self.sampler(x).transpose(1, 2)
        return self.reduction(self.norm(x)), (h // 2, w // 2)


class Stage(nn.Module):
    def __init__(self, dim, heads, depth, window, downsample):
        super().__init__()
        self.blocks = nn.ModuleList([SwinBlock(dim, heads, window, i % 2 == 1) for i in range(depth)])
        self.downsample = PatchMerging(dim) if downsample else None


class PatchEmbed(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.projection = nn.Conv2d(3, dim, 4, 4)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        x = F.pad(x, [0, (-x.shape[-1]) % 4, 0, (-x.shape[-2]) % 4])
        x = self.projection(x)
        hw = x.shape[-2:]
        return self.norm(x.flatten(2).transpose(1, 2)), tuple(hw)


class MmdetSwin(nn.Module):
    def __init__(self):
        super().__init__()
        self.patch_embed = PatchEmbed(EMBED)
        dims = [EMBED * 2**i for i in range(4)]
        self.stages = nn.ModuleList([Stage(dims[i], HEADS[i], DEPTHS[i], WINDOW, i < 3) for i in range(4)])
        for i, d in enumerate(dims):
            self.add_module(f"norm{i}", nn.LayerNorm(d))
        self.dims = dims

    def forward(self, x):
        x, hw = self.patch_embed(x)
        outs = []
        for i, stage in enumerate(self.stages):
            for block in stage.blocks:
                x = block(x, hw)
            out, out_hw = x, hw
            if stage.downsample is not None:
                x, hw = stage.downsample(x, hw)
            out = getattr(self, f"norm{i}")(out)
            outs.append(out.view(-1, *out_hw, self.dims[i]).permute(0, 3, 1, 2).contiguous())
        return outs


# ------------------------------------------------- mmdet's Mask2Former head, module layout only
class ConvModule(nn.Module):
    def __init__(self, cin, cout, k, bias):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, padding=k // 2, bias=bias)
        self.gn = nn.GroupNorm(32, cout)


class MSDeformAttn(nn.Module):
    def __init__(self, dim, heads, levels=3, points=4):
        super().__init__()
        self.sampling_offsets = nn.Linear(dim, heads * levels * points * 2)
        self.attention_weights = nn.Linear(dim, heads * levels * points)
        self.value_proj = nn.Linear(dim, dim)
        self.output_proj = nn.Linear(dim, dim)


class EncoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.attentions = nn.ModuleList([MSDeformAttn(HIDDEN, 2)])
        self.ffns = nn.ModuleList([FFN(HIDDEN, ENC_FFN, nn.ReLU())])
        self.norms = nn.ModuleList([nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)])


class PixelDecoder(nn.Module):
    def __init__(self, in_channels):
        super().__init__()
        self.input_convs = nn.ModuleList([ConvModule(in_channels[i], HIDDEN, 1, True) for i in (3, 2, 1)])
        self.encoder = nn.Module()
        self.encoder.layers = nn.ModuleList([EncoderLayer() for _ in range(ENC_LAYERS)])
        self.level_encoding = nn.Embedding(3, HIDDEN)
        self.lateral_convs = nn.ModuleList([ConvModule(in_channels[0], HIDDEN, 1, False)])
        self.output_convs = nn.ModuleList([ConvModule(HIDDEN, HIDDEN, 3, False)])
        self.mask_feature = nn.Conv2d(HIDDEN, HIDDEN, 1)


class MHA(nn.Module):  # mmcv MultiheadAttention wraps nn.MultiheadAttention as .attn
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(HIDDEN, 2)


class DecoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.attentions = nn.ModuleList([MHA(), MHA()])  # cross, self
        self.ffns = nn.ModuleList([FFN(HIDDEN, DEC_FFN, nn.ReLU())])
        self.norms = nn.ModuleList([nn.LayerNorm(HIDDEN) for _ in range(3)])


class Head(nn.Module):
    def __init__(self, in_channels):
        super().__init__()
        self.pixel_decoder = PixelDecoder(in_channels)
        self.transformer_decoder = nn.Module()
        self.transformer_decoder.layers = nn.ModuleList([DecoderLayer() for _ in range(DEC_LAYERS)])
        self.transformer_decoder.post_norm = nn.LayerNorm(HIDDEN)
        self.decoder_input_projs = nn.ModuleList([nn.Identity() for _ in range(3)])
        self.query_embed = nn.Embedding(QUERIES, HIDDEN)
        self.query_feat = nn.Embedding(QUERIES, HIDDEN)
        self.level_embed = nn.Embedding(3, HIDDEN)
        self.cls_embed = nn.Linear(HIDDEN, CLASSES + 1)
        self.mask_embed = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                                        nn.Linear(HIDDEN, HIDDEN))  # fmt: skip


class MmdetMask2Former(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = MmdetSwin()
        self.panoptic_head = Head(self.backbone.dims)


def _mmdet_model(seed: int = 0) -> MmdetMask2Former:
    torch.manual_seed(seed)
    model = MmdetMask2Former().eval()
    with torch.no_grad():  # every tensor random, norms included, so that a misplaced one shows
        for name, p in model.named_parameters():
            p.normal_(0.0, 0.3 if "norm" in name or ".gn." in name else 0.1)
            if name.endswith("weight") and ("norm" in name or ".gn." in name):
                p.add_(1.0)
    return model


def _ours(state_dict):
    cfg = m2f.mask2former_config(
        embed_dim=EMBED, depths=DEPTHS, num_heads=HEADS, window_size=WINDOW, hidden=HIDDEN, encoder_ffn=ENC_FFN,
        decoder_ffn=DEC_FFN, encoder_layers=ENC_LAYERS, decoder_layers=DEC_LAYERS, attention_heads=2,
        num_queries=QUERIES, num_labels=CLASSES,
    )  # fmt: skip
    return m2f.build_mask2former(cfg, state_dict)


@pytest.fixture(scope="module")
def mmdet_model():
    return _mmdet_model()


@pytest.fixture(scope="module")
def converted(mmdet_model):
    return _ours(mmdet_model.state_dict())


def test_tiny_config_is_the_one_the_tests_transcribe():
    cfg = m2f.tiny_mask2former_config()
    assert list(cfg.backbone_config.depths) == list(DEPTHS) and cfg.backbone_config.window_size == WINDOW
    assert (cfg.hidden_dim, cfg.num_queries, cfg.num_labels) == (HIDDEN, QUERIES, CLASSES)


def test_swin_s_config_matches_mmdet_config():
    cfg = m2f.swin_s_mask2former_config()
    sw = cfg.backbone_config
    assert (sw.embed_dim, list(sw.depths), list(sw.num_heads), sw.window_size) == (96, [2, 2, 18, 2], [3, 6, 12, 24], 7)
    assert (cfg.num_queries, cfg.num_labels, cfg.encoder_layers, cfg.decoder_layers - 1) == (100, 80, 6, 9)
    assert (cfg.hidden_dim, cfg.encoder_feedforward_dim, cfg.dim_feedforward, cfg.num_attention_heads) == (256, 1024, 2048, 8)


@pytest.mark.parity
@pytest.mark.parametrize("size", [(100, 124), (64, 64)])
def test_backbone_features_match_mmdet_swin(mmdet_model, converted, size):
    """Swin-S layout (qkv split, unfold channel order, mmdet's relative position index, shifted windows with
    padding, odd sizes through patch merging) against mmdet's Swin transcribed (mmdetection@09269cf swin.py)."""
    torch.manual_seed(1)
    x = torch.randn(2, 3, *size)
    with torch.no_grad():
        expected = mmdet_model.backbone(x)
        actual = converted.model.pixel_level_module.encoder(x).feature_maps
    assert len(actual) == 4
    for a, e in zip(actual, expected):
        assert a.shape == e.shape
        assert_close_scaled(a, e, rel=1e-5)
    record_parity("geneval-mask2former", original="open-mmlab/mmdetection@09269cf mmdet/models/backbones/swin.py",
                  how="transcribed", actual=torch.cat([a.flatten() for a in actual]),
                  expected=torch.cat([e.flatten() for e in expected]), cases=[f"RGB {size[0]}x{size[1]}"],
                  not_checked="the head: test_whole_network_matches_mmdet_mask2former")  # fmt: skip


def test_unfold_permutation_is_what_makes_it_match(mmdet_model):
    """Without the channel permutation the patch-merging layers would load silently and differ."""
    sd = mmdet_model.state_dict()
    model = _ours(sd)
    w = sd["backbone.stages.0.downsample.reduction.weight"]
    ours = model.model.pixel_level_module.encoder.swin.encoder.layers[0].downsample.reduction.weight
    assert not torch.equal(ours, w) and torch.equal(ours.sort(1).values, w.sort(1).values)  # a permutation


def test_conversion_is_strict(mmdet_model):
    sd = dict(mmdet_model.state_dict())
    missing = dict(sd)
    missing.pop("panoptic_head.pixel_decoder.encoder.layers.1.norms.0.weight")
    with pytest.raises(CheckpointError, match=r"absent from the checkpoint \(1\): panoptic_head\.pixel_decoder\.encoder\.layers\.1\.norms\.0\.weight"):
        _ours(missing)
    extra = dict(sd, **{"panoptic_head.unexpected.weight": torch.zeros(3)})
    with pytest.raises(CheckpointError, match=r"unused checkpoint tensors \(1\): panoptic_head\.unexpected\.weight"):
        _ours(extra)
    wrong = dict(sd)
    wrong["panoptic_head.cls_embed.weight"] = torch.zeros(CLASSES + 2, HIDDEN)
    with pytest.raises(CheckpointError, match=r"class_predictor\.weight: checkpoint \(82, 32\)"):
        _ours(wrong)
    bad_index = dict(sd)
    key = "backbone.stages.1.blocks.1.attn.w_msa.relative_position_index"
    bad_index[key] = bad_index[key].flip(0)
    with pytest.raises(CheckpointError, match="relative_position_index is not Swin's index"):
        _ours(bad_index)


def test_every_checkpoint_tensor_lands_somewhere(mmdet_model, converted):
    """Spot checks across the head: the same numbers under transformers' names."""
    sd = mmdet_model.state_dict()
    ours = converted.state_dict()
    pairs = {
        "panoptic_head.query_feat.weight": "model.transformer_module.queries_features.weight",
        "panoptic_head.pixel_decoder.level_encoding.weight": "model.pixel_level_module.decoder.level_embed",
        "panoptic_head.transformer_decoder.layers.2.attentions.0.attn.in_proj_weight":
            "model.transformer_module.decoder.layers.2.cross_attn.in_proj_weight",
        "panoptic_head.mask_embed.4.bias": "model.transformer_module.decoder.mask_predictor.mask_embedder.2.0.bias",
        "panoptic_head.pixel_decoder.lateral_convs.0.gn.weight": "model.pixel_level_module.decoder.adapter_1.1.weight",
    }  # fmt: skip
    for src, dst in pairs.items():
        assert torch.equal(ours[dst], sd[src]), (src, dst)
    q, k, v = sd["panoptic_head.transformer_decoder.layers.1.attentions.1.attn.in_proj_weight"].chunk(3)
    assert torch.equal(ours["model.transformer_module.decoder.layers.1.self_attn.k_proj.weight"], k)


def test_mmdet_checkpoint_file_reads_with_weights_only(mmdet_model, tmp_path):
    """mmdet's file layout: {'meta': strings, tuples, ints, 'state_dict': tensors}."""
    path = tmp_path / m2f.CHECKPOINT_FILENAME
    meta = {"mmdet_version": "2.25.0", "CLASSES": tuple(m2f.GENEVAL_CLASSES), "config": "model = dict()", "iter": 368750}
    torch.save({"meta": meta, "state_dict": mmdet_model.state_dict()}, path)
    sd = m2f.read_mmdet_checkpoint(path)
    assert set(sd) == set(mmdet_model.state_dict())
    with pytest.raises(CheckpointError, match=m2f.CHECKPOINT_FILENAME) as err:
        m2f.read_mmdet_checkpoint(tmp_path / "nope.pth")
    assert m2f.CHECKPOINT_URL in str(err.value)


# ------------------------------------------- mmdet's pixel decoder and decoder forward, transcribed
def _sine(b, h, w, num_feats):
    """mmdet SinePositionalEncoding(normalize=True) on an all-valid mask."""
    not_mask = torch.ones(b, h, w)
    y, x = not_mask.cumsum(1), not_mask.cumsum(2)
    y = y / (y[:, -1:, :] + 1e-6) * (2 * math.pi)
    x = x / (x[:, :, -1:] + 1e-6) * (2 * math.pi)
    dim_t = torch.arange(num_feats, dtype=torch.float32)
    dim_t = 10000 ** (2 * (dim_t // 2) / num_feats)
    px, py = x[..., None] / dim_t, y[..., None] / dim_t
    px = torch.stack((px[..., 0::2].sin(), px[..., 1::2].cos()), dim=4).view(b, h, w, -1)
    py = torch.stack((py[..., 0::2].sin(), py[..., 1::2].cos()), dim=4).view(b, h, w, -1)
    return torch.cat((py, px), dim=3).permute(0, 3, 1, 2)


def _msda(attn, query, query_pos, reference_points, shapes, heads=2, levels=3, points=4):
    """mmcv MultiScaleDeformableAttention.forward (batch_first=False, value=query) with
    multi_scale_deformable_attn_pytorch."""
    identity, value = query, query
    query = (query + query_pos).permute(1, 0, 2)
    value = attn.value_proj(value.permute(1, 0, 2))
    bs, nq, _ = query.shape
    value = value.view(bs, value.shape[1], heads, -1)
    off = attn.sampling_offsets(query).view(bs, nq, heads, levels, points, 2)
    weights = attn.attention_weights(query).view(bs, nq, heads, levels * points).softmax(-1)
    weights = weights.view(bs, nq, heads, levels, points)
    normalizer = torch.stack([shapes[..., 1], shapes[..., 0]], -1)
    loc = reference_points[:, :, None, :, None, :] + off / normalizer[None, None, None, :, None, :]
    dims = value.shape[-1]
    grids = 2 * loc - 1
    sampled = []
    for level, (h, w) in enumerate(shapes.tolist()):
        start = int(sum(a * b for a, b in shapes.tolist()[:level]))
        v = value[:, start:start + h * w].flatten(2).transpose(1, 2).reshape(bs * heads, dims, h, w)
        g = grids[:, :, :, level].transpose(1, 2).flatten(0, 1)
        sampled.append(F.grid_sample(v, g, mode="bilinear", padding_mode="zeros", align_corners=False))
    weights = weights.transpose(1, 2).reshape(bs * heads, 1, nq, levels * points)
    out = (torch.stack(sampled, dim=-2).flatten(-2) * weights).sum(-1).view(bs, heads * dims, nq).transpose(1, 2)
    return attn.output_proj(out).permute(1, 0, 2) + identity


def _conv_module(m, x, act=False):
    y = m.gn(m.conv(x))
    return F.relu(y) if act else y


def _mmdet_head_forward(head, feats):
    """MSDeformAttnPixelDecoder.forward + Mask2FormerHead.forward/_forward_head (mmdet 2.x), last layer's outputs."""
    pd, b = head.pixel_decoder, feats[0].shape[0]
    strides = [4, 8, 16, 32]
    inputs, poses, shapes, refs = [], [], [], []
    for i in range(3):
        level = 3 - i
        feat = feats[level]
        h, w = feat.shape[-2:]
        proj = _conv_module(pd.input_convs[i], feat)
        pos = _sine(b, h, w, HIDDEN // 2) + pd.level_encoding.weight[i].view(1, -1, 1, 1)
        sx, sy = (torch.arange(w) + 0.5) * strides[level], (torch.arange(h) + 0.5) * strides[level]
        ref = torch.stack([sx.repeat(h), sy.view(-1, 1).repeat(1, w).view(-1)], -1)
        refs.append(ref / (torch.tensor([[w, h]]) * strides[level]))
        inputs.append(proj.flatten(2).permute(2, 0, 1))
        poses.append(pos.flatten(2).permute(2, 0, 1))
        shapes.append((h, w))
    shapes_t = torch.as_tensor(shapes, dtype=torch.long)
    query, query_pos = torch.cat(inputs, 0), torch.cat(poses, 0)
    reference_points = torch.cat(refs, 0)[None, :, None].repeat(b, 1, 3, 1)
    for layer in pd.encoder.layers:
        query = layer.norms[0](_msda(layer.attentions[0], query, query_pos, reference_points, shapes_t))
        query = layer.norms[1](layer.ffns[0](query, identity=query))
    memory = query.permute(1, 2, 0)
    outs = [x.reshape(b, -1, h, w) for x, (h, w) in zip(memory.split([h * w for h, w in shapes], -1), shapes)]
    y = _conv_module(pd.lateral_convs[0], feats[0])
    y = y + F.interpolate(outs[-1], size=y.shape[-2:], mode="bilinear", align_corners=False)
    outs.append(_conv_module(pd.output_convs[0], y, act=True))
    mask_features, memorys = pd.mask_feature(outs[-1]), outs[:3]

    dec_inputs, dec_pos = [], []
    for i in range(3):
        dec_inputs.append(memorys[i].flatten(2).permute(2, 0, 1) + head.level_embed.weight[i].view(1, 1, -1))
        dec_pos.append(_sine(b, *memorys[i].shape[-2:], HIDDEN // 2).flatten(2).permute(2, 0, 1))
    query_feat = head.query_feat.weight.unsqueeze(1).repeat((1, b, 1))
    query_embed = head.query_embed.weight.unsqueeze(1).repeat((1, b, 1))

    def forward_head(out, size):
        out = head.transformer_decoder.post_norm(out).transpose(0, 1)
        cls_pred = head.cls_embed(out)
        mask_pred = torch.einsum("bqc,bchw->bqhw", head.mask_embed(out), mask_features)
        attn_mask = F.interpolate(mask_pred, size, mode="bilinear", align_corners=False)
        attn_mask = attn_mask.flatten(2).unsqueeze(1).repeat((1, 2, 1, 1)).flatten(0, 1).sigmoid() < 0.5
        return cls_pred, mask_pred, attn_mask

    cls_pred, mask_pred, attn_mask = forward_head(query_feat, memorys[0].shape[-2:])
    for i, layer in enumerate(head.transformer_decoder.layers):
        level = i % 3
        attn_mask[torch.where(attn_mask.sum(-1) == attn_mask.shape[-1])] = False
        cross = layer.attentions[0].attn(query_feat + query_embed, dec_inputs[level] + dec_pos[level],
                                         dec_inputs[level], attn_mask=attn_mask)[0]  # fmt: skip
        query_feat = layer.norms[0](query_feat + cross)
        q = query_feat + query_embed
        query_feat = layer.norms[1](query_feat + layer.attentions[1].attn(q, q, query_feat)[0])
        query_feat = layer.norms[2](layer.ffns[0](query_feat, identity=query_feat))
        cls_pred, mask_pred, attn_mask = forward_head(query_feat, memorys[(i + 1) % 3].shape[-2:])
    return cls_pred, mask_pred


@pytest.mark.parity
def test_whole_network_matches_mmdet_mask2former(mmdet_model, converted):
    """Class and mask logits of the last decoder layer from pixels: transformers with the converted weights
    vs mmdet's Swin + MSDeformAttnPixelDecoder + Mask2FormerHead transcribed (mmcv's pytorch MSDeformAttn)."""
    torch.manual_seed(5)
    x = torch.randn(2, 3, 128, 160)
    with torch.no_grad():
        cls_ref, mask_ref = _mmdet_head_forward(mmdet_model.panoptic_head, mmdet_model.backbone(x))
        out = converted(pixel_values=x)
    assert_close_scaled(out.class_queries_logits, cls_ref, rel=1e-5)
    assert_close_scaled(out.masks_queries_logits, mask_ref, rel=1e-5)
    record_parity("geneval-mask2former", original="open-mmlab/mmdetection 2.x mask2former_head.py, "
                  "msdeformattn_pixel_decoder.py@3e26931, swin.py@09269cf", how="transcribed",
                  actual=torch.cat([out.class_queries_logits.flatten(), out.masks_queries_logits.flatten()]),
                  expected=torch.cat([cls_ref.flatten(), mask_ref.flatten()]), cases=["RGB 128x160 (network input)"],
                  not_checked="the real checkpoint (not downloadable offline)")  # fmt: skip


# ------------------------------------------------------------------ pre- and post-processing
def _mmdet_pipeline_reference(img_uint8_bgr):
    """mmcv imrescale (cv2 bilinear) -> impad_to_multiple(32, 128) -> imnormalize(to_rgb) as mmdet 2.x runs them."""
    import cv2

    h, w = img_uint8_bgr.shape[:2]
    scale = min(1333 / max(h, w), 800 / min(h, w))
    new = (int(w * float(scale) + 0.5), int(h * float(scale) + 0.5))
    img = cv2.resize(img_uint8_bgr, new, interpolation=cv2.INTER_LINEAR)
    ph, pw = int(np.ceil(img.shape[0] / 32)) * 32, int(np.ceil(img.shape[1] / 32)) * 32
    img = cv2.copyMakeBorder(img, 0, ph - img.shape[0], 0, pw - img.shape[1], cv2.BORDER_CONSTANT, value=(128, 128, 128))
    img = img.astype(np.float32)
    mean, stdinv = np.array([123.675, 116.28, 103.53]), 1 / np.array([58.395, 57.12, 57.375])
    img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
    img = cv2.multiply(cv2.subtract(img, mean.reshape(1, -1)), stdinv.reshape(1, -1))
    return img.transpose(2, 0, 1), new


@pytest.mark.parametrize("hw", [(300, 517), (512, 512)])
def test_test_pipeline_matches_mmdet(hw):
    pytest.importorskip("cv2")
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (*hw, 3), dtype=np.uint8)
    ours, (rh, rw) = m2f.mmdet_test_input(rgb)
    ref, new = _mmdet_pipeline_reference(np.ascontiguousarray(rgb[..., ::-1]))  # GenEval reads the file as BGR
    assert (rw, rh) == new and ours.shape[-2] % 32 == 0 and ours.shape[-1] % 32 == 0
    assert_close_scaled(ours, torch.from_numpy(ref), rel=1e-6)
    # Flow-GRPO's server hands RGB arrays to a pipeline that assumes BGR
    swapped, _ = m2f.mmdet_test_input(rgb, swap_rb=True)
    ref_swapped, _ = _mmdet_pipeline_reference(rgb)
    assert_close_scaled(swapped, torch.from_numpy(ref_swapped), rel=1e-6)


def _mmdet_instance_postprocess(mask_cls, mask_pred, num_classes=CLASSES, max_per_image=100):
    """maskformer_fusion_head.instance_postprocess + mask2bbox + bbox2result (mmdet 2.x), transcribed."""
    num_queries = mask_cls.shape[0]
    scores = F.softmax(mask_cls, dim=-1)[:, :-1]
    labels = torch.arange(num_classes).unsqueeze(0).repeat(num_queries, 1).flatten(0, 1)
    scores_per_image, top_indices = scores.flatten(0, 1).topk(max_per_image, sorted=False)
    labels_per_image = labels[top_indices]
    mask_pred = mask_pred[top_indices // num_classes]
    mask_pred_binary = (mask_pred > 0).float()
    mask_scores = (mask_pred.sigmoid() * mask_pred_binary).flatten(1).sum(1) / (mask_pred_binary.flatten(1).sum(1) + 1e-6)
    det_scores = scores_per_image * mask_scores
    mask_pred_binary = mask_pred_binary.bool()
    n = mask_pred_binary.shape[0]
    bboxes = torch.zeros((n, 4))
    x_any, y_any = torch.any(mask_pred_binary, dim=1), torch.any(mask_pred_binary, dim=2)
    for i in range(n):
        x, y = torch.where(x_any[i, :])[0], torch.where(y_any[i, :])[0]
        if len(x) > 0 and len(y) > 0:
            bboxes[i, :] = torch.tensor([x[0], y[0], x[-1] + 1, y[-1] + 1], dtype=torch.float32)
    bboxes = torch.cat([bboxes, det_scores[:, None]], dim=-1).numpy()
    labels_np = labels_per_image.numpy()
    bbox_results = [bboxes[labels_np == c, :] for c in range(num_classes)]
    masks = [[m.numpy() for m, lab in zip(mask_pred_binary, labels_np) if lab == c] for c in range(num_classes)]
    return bbox_results, masks


def _as_rows(dets):
    return sorted((d.label, round(d.score, 6), tuple(d.box)) for d in dets)


def test_instance_postprocess_matches_mmdet():
    torch.manual_seed(3)
    cls = torch.randn(40, CLASSES + 1) * 3
    masks = torch.randn(40, 37, 53) * 2 + torch.linspace(-4, 4, 53)  # some empty, some full masks
    masks[5] = -1.0
    bbox_results, _ = _mmdet_instance_postprocess(cls, masks)
    queries, labels, class_scores = m2f.select_instances(cls, 100)
    binary, scores, boxes = m2f.instance_scores(masks[queries], class_scores)
    ours = sorted(zip(labels.tolist(), scores.tolist(), map(tuple, boxes.tolist())))
    ref = sorted((c, float(r[4]), tuple(float(v) for v in r[:4])) for c in range(CLASSES) for r in bbox_results[c])
    assert len(ours) == len(ref) == 100
    assert [(o[0], o[2]) for o in ours] == [(r[0], r[2]) for r in ref]
    assert_close_scaled(torch.tensor([o[1] for o in ours]), torch.tensor([r[1] for r in ref]), rel=1e-6)


def test_detector_matches_mmdet_postprocessing_of_its_outputs(mmdet_model, converted):
    """detect() = mmdet's instance results for the same network outputs, read the way GenEval reads them."""
    det = m2f.Mask2FormerDetector(converted, max_per_image=100)
    torch.manual_seed(4)
    image = torch.rand(3, 61, 90)
    names = [["dog", "cat", "computer mouse"]]
    ours = det.detect([image], names)[0]
    cls, masks, size = det.raw_outputs(image)
    assert tuple(size) == (61, 90) and masks.shape == (QUERIES, 61, 90)
    bbox_results, mask_results = _mmdet_instance_postprocess(cls, masks, max_per_image=100)
    ref = []
    for index, classname in enumerate(m2f.GENEVAL_CLASSES):
        if classname in names[0]:
            for row in bbox_results[index][np.argsort(bbox_results[index][:, 4])[::-1]]:
                ref.append((classname, round(float(row[4]), 6), tuple(float(v) for v in row[:4])))
    assert _as_rows(ours) == sorted(ref) and len(ref) > 0
    assert all(d.mask.shape == (61, 90) and d.mask.dtype == bool for d in ours)


def test_geneval_reward_with_mask2former_detector(tmp_path, mmdet_model):
    from mmreward.models.geneval_reward import load_geneval

    reward = load_geneval(weights="random", detector="mask2former", colors="hsv", score="dense")
    assert type(reward.detector).__name__ == "Mask2FormerDetector"
    out = reward.score(["a photo of a dog"], torch.rand(1, 3, 48, 64))
    assert out.scores.shape == (1,)
    with pytest.raises(CheckpointError, match=m2f.CHECKPOINT_FILENAME):
        load_geneval(str(tmp_path / "missing.pth"), detector="mask2former", colors="hsv")
    # the mmdet file as checkpoint picks GenEval's detector without naming it
    with pytest.raises(CheckpointError, match=m2f.CHECKPOINT_URL):
        load_geneval(str(tmp_path / m2f.CHECKPOINT_FILENAME), colors="hsv")
