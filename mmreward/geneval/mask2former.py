"""GenEval's detector: mmdet's Mask2Former Swin-S (instance, 80 COCO things) run through transformers.

GenEval (djghosh13/geneval@af4902f `evaluation/evaluate_images.py`) and Flow-GRPO's reward server
(yifan123/reward-server@92ac29f `reward_server/gen_eval.py`) call mmdet 2.x `inference_detector` with
config `mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco.py` and the checkpoint file below. We load that
very file (`torch.load(weights_only=True)`, or a .safetensors of its `state_dict`) into transformers'
`Mask2FormerForUniversalSegmentation` with a Swin-S backbone through a strict key conversion
(`convert_mmdet_state_dict`: every checkpoint tensor used once, every model weight filled, shapes checked;
anything else is a CheckpointError naming the key), then run mmdet 2.x's test pipeline and instance
post-processing (read in open-mmlab/mmdetection 2.x: `configs/mask2former/mask2former_r50_lsj_8x2_50e_coco.py`
test_pipeline, `mmdet/models/detectors/maskformer.py` simple_test, `mask2former_head.py`,
`seg_heads/panoptic_fusion_heads/maskformer_fusion_head.py` instance_postprocess, `core/mask/utils.py` mask2bbox).

Two layout facts the conversion must respect (mmdet `backbone/swin.py`, `swin_converter`):
- mmdet's PatchMerging gathers each 2x2 neighbourhood with nn.Unfold, which orders the 4C input channels
  channel-major (c * 4 + k, k = kernel position (0,0),(0,1),(1,0),(1,1)); the Swin reference (and
  transformers) concatenates [x(0,0), x(1,0), x(0,1), x(1,1)] block-major. `reduction.weight` columns
  and `norm` entries are permuted back (`_unfold_to_swin_order`).
- `w_msa.qkv` is one Linear whose output is [q; k; v] (reshape(B, N, 3, heads, d)); it is split in three.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from mmreward.errors import CheckpointError, ConfigError, MissingExtraError
from mmreward.geneval import Detection
from mmreward.pickle_files import load_torch_file

CHECKPOINT_FILENAME = "mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco_20220504_001756-743b7d99.pth"
CHECKPOINT_URL = (
    "https://download.openmmlab.com/mmdetection/v2.0/mask2former/mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco/"
    + CHECKPOINT_FILENAME
)
# GenEval's evaluation/object_names.txt (= reward-server's): mmdet's 80 COCO classes in label order, with
# GenEval's spellings ("computer mouse", "tv remote", "computer keyboard").
GENEVAL_CLASSES = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat", "traffic light",
    "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat", "dog", "horse", "sheep", "cow",
    "elephant", "bear", "zebra", "giraffe", "backpack", "umbrella", "handbag", "tie", "suitcase", "frisbee",
    "skis", "snowboard", "sports ball", "kite", "baseball bat", "baseball glove", "skateboard", "surfboard",
    "tennis racket", "bottle", "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple",
    "sandwich", "orange", "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair", "couch",
    "potted plant", "bed", "dining table", "toilet", "tv", "laptop", "computer mouse", "tv remote",
    "computer keyboard", "cell phone", "microwave", "oven", "toaster", "sink", "refrigerator", "book", "clock",
    "vase", "scissors", "teddy bear", "hair drier", "toothbrush",
)  # fmt: skip

# mmdet 2.x instance config: img_norm_cfg (RGB order, to_rgb=True), MultiScaleFlipAug img_scale, Pad
PIXEL_MEAN = (123.675, 116.28, 103.53)
PIXEL_STD = (58.395, 57.12, 57.375)
IMG_SCALE = (1333, 800)
SIZE_DIVISOR = 32
PAD_VALUE = 128  # pad_cfg img=(128, 128, 128), applied before Normalize
MAX_PER_IMAGE = 100  # test_cfg.max_per_image


# ----------------------------------------------------------------------------------------- configs
def swin_s_mask2former_config(num_labels: int = 80):
    """transformers config equal to mmdet's mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco (instance, 80 things)."""
    return mask2former_config(
        embed_dim=96, depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24), window_size=7, hidden=256,
        encoder_ffn=1024, decoder_ffn=2048, encoder_layers=6, decoder_layers=9, attention_heads=8,
        num_queries=100, num_labels=num_labels,
    )  # fmt: skip


def tiny_mask2former_config(num_labels: int = 80):
    """A few-layer random Mask2Former Swin for tests and weights='random' (GroupNorm needs hidden % 32 == 0)."""
    return mask2former_config(
        embed_dim=16, depths=(2, 2, 2, 2), num_heads=(1, 2, 2, 4), window_size=3, hidden=32, encoder_ffn=64,
        decoder_ffn=64, encoder_layers=2, decoder_layers=3, attention_heads=2, num_queries=12, num_labels=num_labels,
    )  # fmt: skip


def mask2former_config(
    *, embed_dim: int, depths: Sequence[int], num_heads: Sequence[int], window_size: int, hidden: int,
    encoder_ffn: int, decoder_ffn: int, encoder_layers: int, decoder_layers: int, attention_heads: int,
    num_queries: int, num_labels: int,
):  # fmt: skip
    """`decoder_layers` counts mmdet's transformer decoder layers (transformers counts one more: the first
    prediction from the query features)."""
    from transformers import Mask2FormerConfig, SwinConfig

    swin = SwinConfig(
        image_size=224, patch_size=4, embed_dim=embed_dim, depths=list(depths), num_heads=list(num_heads),
        window_size=window_size, mlp_ratio=4.0, qkv_bias=True, hidden_act="gelu", layer_norm_eps=1e-5,
        drop_path_rate=0.0, out_features=["stage1", "stage2", "stage3", "stage4"],
    )  # fmt: skip
    return Mask2FormerConfig(
        backbone_config=swin, feature_size=hidden, mask_feature_size=hidden, hidden_dim=hidden,
        encoder_feedforward_dim=encoder_ffn, dim_feedforward=decoder_ffn, encoder_layers=encoder_layers,
        decoder_layers=decoder_layers + 1, num_attention_heads=attention_heads, num_queries=num_queries,
        num_labels=num_labels, id2label={i: str(i) for i in range(num_labels)},
    )  # fmt: skip


# ------------------------------------------------------------------------------------- conversion
def _unfold_to_swin_order(t: torch.Tensor) -> torch.Tensor:
    """Last dim from nn.Unfold's channel-major order (c*4 + k) to Swin's blocks [x0, x1, x2, x3]
    (x1 = the (1, 0) neighbour, x2 = (0, 1)): the inverse of mmdet's `correct_unfold_*_order`."""
    c4 = t.shape[-1]
    t = t.reshape(*t.shape[:-1], c4 // 4, 4).transpose(-1, -2)  # (..., 4 kernel positions, C)
    return t[..., [0, 2, 1, 3], :].reshape(*t.shape[:-2], c4)


def swin_relative_position_index(window: int) -> torch.Tensor:
    """The Swin reference's (window^2, window^2) index into the bias table: (dy + w - 1) * (2w - 1) + dx + w - 1."""
    coords = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")).flatten(1)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (window - 1)
    return rel[..., 0] * (2 * window - 1) + rel[..., 1]


def _mmdet_to_transformers_names(depths: Sequence[int], encoder_layers: int, decoder_layers: int) -> dict[str, str]:
    """mmdet checkpoint name -> transformers name, for every tensor copied as is (the rest: `_special`)."""
    names: dict[str, str] = {}
    bb, tb = "backbone.", "model.pixel_level_module.encoder."

    def pair(src: str, dst: str, params=("weight", "bias")) -> None:
        for p in params:
            names[f"{src}.{p}"] = f"{dst}.{p}"

    pair(bb + "patch_embed.projection", tb + "swin.embeddings.patch_embeddings.projection")
    pair(bb + "patch_embed.norm", tb + "swin.embeddings.norm")
    for i, depth in enumerate(depths):
        for j in range(depth):
            s, d = f"{bb}stages.{i}.blocks.{j}.", f"{tb}swin.encoder.layers.{i}.blocks.{j}."
            pair(s + "norm1", d + "layernorm_before")
            pair(s + "norm2", d + "layernorm_after")
            pair(s + "attn.w_msa.proj", d + "attention.o_proj")
            names[s + "attn.w_msa.relative_position_bias_table"] = (
                d + "attention.relative_position_bias.relative_position_bias_table"
            )
            pair(s + "ffn.layers.0.0", d + "mlp.fc1")
            pair(s + "ffn.layers.1", d + "mlp.fc2")
        pair(f"{bb}norm{i}", f"{tb}hidden_states_norms.stage{i + 1}")
    pd, tp = "panoptic_head.pixel_decoder.", "model.pixel_level_module.decoder."
    for k in range(3):  # input_convs: ConvModule(conv, gn), low to high resolution in both
        pair(f"{pd}input_convs.{k}.conv", f"{tp}input_projections.{k}.0")
        pair(f"{pd}input_convs.{k}.gn", f"{tp}input_projections.{k}.1")
    for layer in range(encoder_layers):
        s, d = f"{pd}encoder.layers.{layer}.", f"{tp}encoder.layers.{layer}."
        for m in ("sampling_offsets", "attention_weights", "value_proj", "output_proj"):
            pair(s + f"attentions.0.{m}", d + f"self_attn.{m}")
        pair(s + "norms.0", d + "self_attn_layer_norm")
        pair(s + "norms.1", d + "final_layer_norm")
        pair(s + "ffns.0.layers.0.0", d + "fc1")
        pair(s + "ffns.0.layers.1", d + "fc2")
    names[pd + "level_encoding.weight"] = tp + "level_embed"
    # one FPN level (stride 4) below the three encoder levels: lateral_convs.0 / output_convs.0 act on feats[0]
    names[pd + "lateral_convs.0.conv.weight"] = tp + "adapter_1.0.weight"
    pair(pd + "lateral_convs.0.gn", tp + "adapter_1.1")
    names[pd + "output_convs.0.conv.weight"] = tp + "layer_1.0.weight"
    pair(pd + "output_convs.0.gn", tp + "layer_1.1")
    pair(pd + "mask_feature", tp + "mask_projection")
    td, tt = "panoptic_head.transformer_decoder.", "model.transformer_module.decoder."
    for layer in range(decoder_layers):
        s, d = f"{td}layers.{layer}.", f"{tt}layers.{layer}."
        # operation_order ('cross_attn', 'norm', 'self_attn', 'norm', 'ffn', 'norm'): attentions.0 is cross
        pair(s + "attentions.0.attn", d + "cross_attn", ("in_proj_weight", "in_proj_bias"))
        pair(s + "attentions.0.attn.out_proj", d + "cross_attn.out_proj")
        pair(s + "attentions.1.attn.out_proj", d + "self_attn.out_proj")
        pair(s + "norms.0", d + "cross_attn_layer_norm")
        pair(s + "norms.1", d + "self_attn_layer_norm")
        pair(s + "norms.2", d + "final_layer_norm")
        pair(s + "ffns.0.layers.0.0", d + "fc1")
        pair(s + "ffns.0.layers.1", d + "fc2")
    pair(td + "post_norm", tt + "layernorm")
    ph = "panoptic_head."
    names[ph + "query_embed.weight"] = "model.transformer_module.queries_embedder.weight"
    names[ph + "query_feat.weight"] = "model.transformer_module.queries_features.weight"
    names[ph + "level_embed.weight"] = "model.transformer_module.level_embed.weight"
    pair(ph + "cls_embed", "class_predictor")
    for k in range(3):  # nn.Sequential(Linear, ReLU, Linear, ReLU, Linear)
        pair(f"{ph}mask_embed.{2 * k}", f"{tt}mask_predictor.mask_embedder.{k}.0")
    return names


# transformers weights with no mmdet counterpart: SwinModel's final LayerNorm (SwinBackbone never calls it)
# and the loss's no-object weight (a buffer the model computes from its config)
_UNUSED_TARGETS = ("model.pixel_level_module.encoder.swin.layernorm.", "criterion.empty_weight")


def convert_mmdet_state_dict(state_dict: Mapping[str, torch.Tensor], model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """mmdet Mask2Former (Swin backbone) tensors -> `model`'s state dict, strictly.

    Raises CheckpointError naming every checkpoint key left unused, every model weight left unfilled,
    and every shape that differs."""
    config = model.config
    depths = list(config.backbone_config.depths)
    window = int(config.backbone_config.window_size)
    decoder_layers = config.decoder_layers - 1
    names = _mmdet_to_transformers_names(depths, config.encoder_layers, decoder_layers)
    out: dict[str, torch.Tensor] = {}
    used: set[str] = set()
    problems: list[str] = []

    absent: list[str] = []

    def take(key: str) -> torch.Tensor | None:
        if key not in state_dict:
            absent.append(key)
            return None
        used.add(key)
        return state_dict[key]

    for src, dst in names.items():
        t = take(src)
        if t is not None:
            out[dst] = t
    bb, tb = "backbone.", "model.pixel_level_module.encoder.swin.encoder.layers."
    expected_index = swin_relative_position_index(window)
    for i, depth in enumerate(depths):
        for j in range(depth):
            s, d = f"{bb}stages.{i}.blocks.{j}.attn.w_msa.", f"{tb}{i}.blocks.{j}.attention."
            for p in ("weight", "bias"):
                qkv = take(s + f"qkv.{p}")
                if qkv is not None:
                    for name, part in zip(("q_proj", "k_proj", "v_proj"), qkv.chunk(3, dim=0)):
                        out[d + f"{name}.{p}"] = part
            index = take(s + "relative_position_index")
            # a buffer in mmdet's file: transformers recomputes it, so it must be the Swin reference's index
            if index is not None and not torch.equal(index.long().cpu(), expected_index):
                problems.append(f"{s}relative_position_index is not Swin's index for window {window}")
        if i < len(depths) - 1:
            s, d = f"{bb}stages.{i}.downsample.", f"{tb}{i}.downsample."
            w = take(s + "reduction.weight")
            if w is not None:
                out[d + "reduction.weight"] = _unfold_to_swin_order(w)
            for p in ("weight", "bias"):
                t = take(s + f"norm.{p}")
                if t is not None:
                    out[d + f"norm.{p}"] = _unfold_to_swin_order(t)
    td, tt = "panoptic_head.transformer_decoder.layers.", "model.transformer_module.decoder.layers."
    for layer in range(decoder_layers):
        for p, q in (("in_proj_weight", "weight"), ("in_proj_bias", "bias")):
            t = take(f"{td}{layer}.attentions.1.attn.{p}")  # self-attention: nn.MultiheadAttention's [q; k; v]
            if t is not None:
                for name, part in zip(("q_proj", "k_proj", "v_proj"), t.chunk(3, dim=0)):
                    out[f"{tt}{layer}.self_attn.{name}.{q}"] = part

    target = model.state_dict()
    unused = sorted(set(state_dict) - used)
    missing = sorted(k for k in target if k not in out and not k.startswith(_UNUSED_TARGETS))
    extra = sorted(k for k in out if k not in target)
    shapes = [f"{k}: checkpoint {tuple(v.shape)}, model {tuple(target[k].shape)}"
              for k, v in out.items() if k in target and tuple(v.shape) != tuple(target[k].shape)]
    for label, keys in (("unused checkpoint tensors", unused), ("tensors the model needs, absent from the checkpoint", absent),
                        ("model weights not filled", missing),
                        ("converted names the model lacks (another transformers layout?)", extra),
                        ("shape mismatches", shapes)):  # fmt: skip
        if keys:
            problems.append(f"{label} ({len(keys)}): {', '.join(keys[:8])}{' ...' if len(keys) > 8 else ''}")
    if problems:
        raise CheckpointError(
            "the mmdet Mask2Former checkpoint does not match the Swin Mask2Former built from its config: "
            + "; ".join(problems)
        )
    return out


def read_mmdet_checkpoint(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The tensors of an mmdet checkpoint ({'meta', 'state_dict'}) or of a .safetensors file of that state_dict."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(
            f"Mask2Former checkpoint '{path}' not found. GenEval's detector weights are user-supplied: download "
            f"{CHECKPOINT_FILENAME} from {CHECKPOINT_URL} (mmdet's model zoo; GenEval's download_models.sh saves it "
            "as mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco.pth) and pass its path as checkpoint="
        )
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    # weights_only: a refused pickle's error says how to convert it to safetensors, never torch's retry advice
    ckpt = load_torch_file(path, what="mmdet checkpoint")
    sd = ckpt.get("state_dict", ckpt) if isinstance(ckpt, dict) else None
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise CheckpointError(f"'{path}' holds no tensor state_dict (expected mmdet's {{'meta', 'state_dict'}})")
    return dict(sd)


# ---------------------------------------------------------------------------------- pre/post-processing
def mmdet_test_input(image_uint8: np.ndarray, *, swap_rb: bool = False) -> tuple[torch.Tensor, tuple[int, int]]:
    """mmdet 2.x test pipeline for one (H, W, 3) uint8 RGB image: Resize keep_ratio to (1333, 800) with
    cv2 bilinear (mmcv.imrescale), Pad to a multiple of 32 with 128, Normalize (RGB mean/std).
    Returns the (3, H', W') float32 input and the resized, unpadded (h, w).

    `swap_rb`: Flow-GRPO's server passes RGB arrays to `inference_detector`, whose pipeline takes arrays
    as BGR and flips them (to_rgb=True), so its detector sees blue and red swapped; True reproduces that."""
    try:
        import cv2
    except ImportError as exc:  # mmcv resizes with OpenCV; another resize changes pixels and scores
        raise MissingExtraError(
            "the Mask2Former detector resizes as mmcv does, with OpenCV: pip install opencv-python-headless "
            "(in the 'ocr' extra)"
        ) from exc
    h, w = image_uint8.shape[:2]
    scale = min(max(IMG_SCALE) / max(h, w), min(IMG_SCALE) / min(h, w))
    new_w, new_h = int(w * float(scale) + 0.5), int(h * float(scale) + 0.5)
    img = cv2.resize(np.ascontiguousarray(image_uint8), (new_w, new_h), interpolation=cv2.INTER_LINEAR)
    if swap_rb:
        img = img[..., ::-1]
    pad_h, pad_w = -(-new_h // SIZE_DIVISOR) * SIZE_DIVISOR, -(-new_w // SIZE_DIVISOR) * SIZE_DIVISOR
    padded = np.full((pad_h, pad_w, 3), PAD_VALUE, dtype=np.uint8)
    padded[:new_h, :new_w] = img
    x = torch.from_numpy(padded).float()
    x = (x - torch.tensor(PIXEL_MEAN)) * (1.0 / torch.tensor(PIXEL_STD, dtype=torch.float64)).float()
    return x.permute(2, 0, 1).contiguous(), (new_h, new_w)


def mask_to_boxes(masks: torch.Tensor) -> torch.Tensor:
    """mmdet's mask2bbox: (N, H, W) bool -> (N, 4) [x_first, y_first, x_last + 1, y_last + 1]; empty masks give 0s."""
    n, h, w = masks.shape
    boxes = torch.zeros((n, 4), dtype=torch.float32, device=masks.device)
    x_any, y_any = masks.any(dim=1), masks.any(dim=2)
    xs = torch.arange(w, device=masks.device).expand(n, w)
    ys = torch.arange(h, device=masks.device).expand(n, h)
    ok = x_any.any(1) & y_any.any(1)
    big_x, big_y = torch.full_like(xs, w), torch.full_like(ys, h)
    boxes[:, 0] = torch.where(x_any, xs, big_x).amin(1).float()
    boxes[:, 1] = torch.where(y_any, ys, big_y).amin(1).float()
    boxes[:, 2] = torch.where(x_any, xs, -1).amax(1).float() + 1
    boxes[:, 3] = torch.where(y_any, ys, -1).amax(1).float() + 1
    return torch.where(ok[:, None], boxes, torch.zeros_like(boxes))


def select_instances(class_logits: torch.Tensor, max_per_image: int = MAX_PER_IMAGE) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """mmdet's instance_postprocess, first half: the top `max_per_image` (query, class) pairs of the softmax
    without the no-object column. Returns (query indices, labels, class scores)."""
    num_classes = class_logits.shape[-1] - 1
    scores = F.softmax(class_logits.float(), dim=-1)[:, :-1]
    top_scores, top = scores.flatten().topk(min(max_per_image, scores.numel()), sorted=False)
    return top // num_classes, top % num_classes, top_scores


def instance_scores(mask_logits: torch.Tensor, class_scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Second half: binary masks (logit > 0), score = class score x mean sigmoid inside the mask, boxes."""
    binary = mask_logits > 0
    fb = binary.float()
    mask_scores = (mask_logits.sigmoid() * fb).flatten(1).sum(1) / (fb.flatten(1).sum(1) + 1e-6)
    return binary, class_scores * mask_scores, mask_to_boxes(binary)


# ------------------------------------------------------------------------------------------ detector
class Mask2FormerDetector(torch.nn.Module):
    """GenEval's Mask2Former: detections with boxes, scores and masks in the input image's pixels."""

    def __init__(self, model: torch.nn.Module, *, class_names: Sequence[str] = GENEVAL_CLASSES, swap_rb: bool = False,
                 max_per_image: int = MAX_PER_IMAGE) -> None:  # fmt: skip
        super().__init__()
        if model.config.num_labels != len(class_names):
            raise ConfigError(f"class_names has {len(class_names)} names, the model {model.config.num_labels} classes")
        self.model, self.class_names, self.swap_rb, self.max_per_image = model.eval(), tuple(class_names), swap_rb, max_per_image

    @torch.no_grad()
    def raw_outputs(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int]]:
        """Class logits (Q, C + 1) and mask logits (Q, H, W) at the image's size, as mmdet's simple_test has them
        before instance_postprocess, for one (3, H, W) image in [0, 1]."""
        from mmreward.geneval.clip_colors import to_uint8_hwc

        pixels = to_uint8_hwc(image)
        x, (rh, rw) = mmdet_test_input(pixels, swap_rb=self.swap_rb)
        param = next(self.model.parameters())
        out = self.model(pixel_values=x[None].to(device=param.device, dtype=param.dtype))
        cls = out.class_queries_logits[0].float()
        masks = out.masks_queries_logits[0].float()
        # MaskFormerHead.simple_test: to the padded input size; fusion head: crop the padding, then to the
        # original size (both bilinear, align_corners=False)
        masks = F.interpolate(masks[None], size=tuple(x.shape[-2:]), mode="bilinear", align_corners=False)[0]
        masks = masks[:, :rh, :rw]
        masks = F.interpolate(masks[None], size=pixels.shape[:2], mode="bilinear", align_corners=False)[0]
        return cls, masks, pixels.shape[:2]

    def detect(self, images: torch.Tensor | list[torch.Tensor], names: Sequence[Sequence[str]]) -> list[list[Detection]]:
        out: list[list[Detection]] = []
        for image, wanted in zip(images, names):
            cls, masks, _ = self.raw_outputs(image)
            queries, labels, class_scores = select_instances(cls, self.max_per_image)
            binary, scores, boxes = instance_scores(masks[queries], class_scores)
            wanted_set = set(wanted)
            dets = []
            for k in range(len(labels)):
                name = self.class_names[int(labels[k])]
                if name in wanted_set:  # GenEval only ever looks up the prompt's classes
                    dets.append(Detection(name, float(scores[k]), tuple(float(v) for v in boxes[k]),
                                          mask=binary[k].cpu().numpy()))  # fmt: skip
            out.append(dets)
        return out


def build_mask2former(config, state_dict: Mapping[str, torch.Tensor] | None = None) -> torch.nn.Module:
    """transformers' Mask2FormerForUniversalSegmentation from `config`, loaded strictly from mmdet tensors if given."""
    from transformers import Mask2FormerForUniversalSegmentation

    model = Mask2FormerForUniversalSegmentation(config).eval()
    if state_dict is not None:
        converted = convert_mmdet_state_dict(state_dict, model)
        model.load_state_dict(converted, strict=False)  # strictness checked by the conversion (unused targets aside)
    return model


def load_mask2former(checkpoint: str | os.PathLike | None, *, weights: str = "pretrained", swap_rb: bool = False,
                     max_per_image: int = MAX_PER_IMAGE) -> Mask2FormerDetector:  # fmt: skip
    """GenEval's detector from mmdet's checkpoint file (weights='random': a tiny random model, for tests)."""
    if weights == "random":
        torch.manual_seed(0)
        return Mask2FormerDetector(build_mask2former(tiny_mask2former_config()), swap_rb=swap_rb, max_per_image=max_per_image)
    if checkpoint is None:
        raise CheckpointError(
            f"the Mask2Former detector needs mmdet's checkpoint file: download {CHECKPOINT_FILENAME} from "
            f"{CHECKPOINT_URL} and pass its path as checkpoint="
        )
    state = read_mmdet_checkpoint(checkpoint)
    return Mask2FormerDetector(build_mask2former(swin_s_mask2former_config(), state), swap_rb=swap_rb,
                               max_per_image=max_per_image)  # fmt: skip
