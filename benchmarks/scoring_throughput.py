"""Scoring throughput of the image reward zoo, three ways on the same random-weight network.

1. per-image loop, as the reference packages score (hpsv2.score, ImageReward.score, PickScore's demo):
   convert each image to PIL, run the reference torchvision/HF preprocessing, tokenise and encode the
   prompt again, forward one image under no_grad;
2. ours: `reward.score(prompt, batch)` (batched preprocessing, inference_mode, text cache);
3. bare batched forward of the network on already-preprocessed pixels and tokens (the practical limit).

Targets: ours >= 1.5x the per-image loop, and >= 0.9x the bare forward. GRPO's setting: one prompt and
G generated images (float tensors in [0, 1]). `--geometry real` builds the real architectures
(ViT-L/14, ViT-H-14, BLIP ViT-L/16 + BERT-base); `small` keeps the key layouts with narrow layers.

    python benchmarks/scoring_throughput.py --geometry real --images 8 --families clipscore imagereward
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

if __package__ in (None, ""):  # run as a script: the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks import _timing

FAMILIES = ("clipscore", "pickscore", "hpsv2", "aesthetic", "imagereward")


@dataclasses.dataclass
class BenchConfig:
    geometry: str = "small"
    images: int = 8
    size: int = 512
    repeats: int = 2
    families: tuple[str, ...] = FAMILIES
    threads: int = 0

    def __post_init__(self) -> None:
        if self.geometry not in ("small", "real"):
            raise ValueError(f"geometry must be 'small' or 'real', got {self.geometry!r}")
        unknown = set(self.families) - set(FAMILIES)
        if unknown:
            raise ValueError(f"unknown families {sorted(unknown)}; choose from {FAMILIES}")
        if self.images < 1 or self.repeats < 1:
            raise ValueError("images and repeats must be >= 1")


def hf_clip_config(real: bool, huge: bool) -> dict:
    if not real:
        from mmreward.models.clip_score import TINY_CLIP_CONFIG

        cfg = {k: dict(v) if isinstance(v, dict) else v for k, v in TINY_CLIP_CONFIG.items()}
        cfg["vision_config"].update(image_size=224, patch_size=14, hidden_size=64, num_hidden_layers=4)
        return cfg
    text = {"vocab_size": 49408, "max_position_embeddings": 77, "bos_token_id": 49406, "eos_token_id": 49407,
            "pad_token_id": 1 if huge else 49407}
    if huge:  # laion ViT-H-14 / PickScore
        text.update(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                    hidden_act="gelu")
        vision = {"hidden_size": 1280, "intermediate_size": 5120, "num_hidden_layers": 32, "num_attention_heads": 16,
                  "image_size": 224, "patch_size": 14, "hidden_act": "gelu"}
        return {"projection_dim": 1024, "text_config": text, "vision_config": vision}
    text.update(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12)
    vision = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24, "num_attention_heads": 16,
              "image_size": 224, "patch_size": 14}
    return {"projection_dim": 768, "text_config": text, "vision_config": vision}


def build(family: str, real: bool):
    """(reward, naive per-image scorer, bare batched forward factory)."""
    import mmreward

    if family in ("clipscore", "pickscore", "aesthetic"):
        cfg = hf_clip_config(real, huge=family == "pickscore")
        reward = mmreward.load(family, weights="random", config=cfg)
    elif family == "hpsv2":
        import open_clip

        cfg = open_clip.get_model_config("ViT-H-14")
        if not real:
            cfg = {"embed_dim": 64, "vision_cfg": {"image_size": 224, "layers": 4, "width": 64, "head_width": 32,
                                                   "patch_size": 14},
                   "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2}}
        reward = mmreward.load("hpsv2", weights="random", model_cfg=cfg)
    else:
        from mmreward.models.image_reward import TINY_MED_CONFIG

        med = dict(TINY_MED_CONFIG)
        vit = {"image_size": 224, "patch_size": 16, "embed_dim": 64, "depth": 4, "num_heads": 1}
        if real:
            med.update(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                       max_position_embeddings=512)
            vit = {"image_size": 224, "patch_size": 16, "embed_dim": 1024, "depth": 24, "num_heads": 16}
        reward = mmreward.load("imagereward", weights="random", tiny=True, med_config=med, vit=vit)
    return reward


def reference_transform(reward, family: str) -> Callable:
    """The reference package's per-image PIL pipeline for this family."""
    from torchvision import transforms as tvt

    pre = reward.preprocess if family == "imagereward" else reward.backbone.preprocess
    norm = tvt.Normalize(pre.mean, pre.std)
    if family == "hpsv2":  # HPSv2: ToTensor first, then resize-longest-and-pad on the tensor
        to_tensor = tvt.ToTensor()
        return lambda im: pre(to_tensor(im.convert("RGB"))[None])[0]
    return tvt.Compose([tvt.Resize(pre.size, interpolation=tvt.InterpolationMode.BICUBIC), tvt.CenterCrop(pre.crop),
                        lambda im: im.convert("RGB"), tvt.ToTensor(), norm])


def naive_loop(reward, family: str, prompt: str, images: torch.Tensor) -> torch.Tensor:
    import torch.nn.functional as F
    from PIL import Image

    tf = reference_transform(reward, family)
    out = []
    for img in images:  # the reference packages' loop: PIL, preprocess, tokenise, forward, one at a time
        pil = Image.fromarray((img * 255).round().clamp(0, 255).byte().permute(1, 2, 0).numpy())
        with torch.no_grad():
            pixels = tf(pil)[None]
            if family == "imagereward":
                tok = reward.tokenizer(prompt, padding="max_length", truncation=True, max_length=35, return_tensors="pt")
                out.append(reward.model(pixels, tok["input_ids"], tok["attention_mask"]))
                continue
            bb = reward.backbone
            a = F.normalize(bb.encode_pixels(pixels), dim=-1)
            if family == "aesthetic":
                out.append(reward.head(a)[:, 0])
                continue
            b = F.normalize(bb.encode_text([prompt]), dim=-1)
            out.append((a * b).sum(-1))
    return torch.cat(out)


def bare_forward(reward, family: str, prompt: str, images: torch.Tensor) -> Callable[[], torch.Tensor]:
    """The network alone on already-preprocessed, already-tokenised inputs (one micro-batch)."""
    import torch.nn.functional as F

    with torch.inference_mode():
        pre = reward.preprocess if family == "imagereward" else reward.backbone.preprocess
        # preprocessing computes in fp32; the network takes its own dtype (bf16 on a GPU)
        pixels = pre(images).to(next(reward.parameters()).dtype).clone()
    if family == "imagereward":
        tok = reward.tokenizer([prompt] * len(images), padding="max_length", truncation=True, max_length=35,
                               return_tensors="pt").to(pixels.device)

        def run():
            with torch.inference_mode():
                return reward.model(pixels, tok["input_ids"], tok["attention_mask"])
        return run
    bb = reward.backbone
    if hasattr(bb, "model") and hasattr(bb.model, "text_model"):
        toks = bb.tokenizer([prompt], padding=True, truncation=True, max_length=77, return_tensors="pt").to(pixels.device)

        def text():
            return bb.model.text_projection(bb.model.text_model(**toks).pooler_output)
    else:
        toks = bb.tokenizer([prompt]).to(pixels.device)

        def text():
            return bb.model.encode_text(toks)

    def run():
        with torch.inference_mode():
            a = F.normalize(bb.encode_pixels(pixels), dim=-1)
            if family == "aesthetic":
                return reward.head(a)[:, 0]
            return (a * F.normalize(text(), dim=-1)).sum(-1)
    return run


def timed(fn: Callable[[], object], repeats: int) -> float:
    return _timing.timed(fn, repeats, reduce="min")


def main(argv: Sequence[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--geometry", default="small", choices=["small", "real"])
    p.add_argument("--images", type=int, default=8, help="images per batch (one prompt, as in a GRPO group)")
    p.add_argument("--size", type=int, default=512, help="generated image side")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--families", nargs="+", default=list(FAMILIES))
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = p.parse_args(argv)
    cfg = BenchConfig(args.geometry, args.images, args.size, args.repeats, tuple(args.families), args.threads)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    g = torch.Generator().manual_seed(0)
    base = torch.rand(cfg.images, 3, 8, 8, generator=g)
    images = torch.nn.functional.interpolate(base, size=(cfg.size, cfg.size), mode="bilinear").clamp(0, 1)
    prompt = "a photo of a red circle above a blue square"
    rows = []
    print(f"geometry={cfg.geometry} images={cfg.images} size={cfg.size} threads={torch.get_num_threads()}")
    print(f"{'family':<12} {'loop s':>8} {'ours s':>8} {'bare s':>8} {'ours/loop':>10} {'ours/bare':>10}")
    for family in cfg.families:
        torch.manual_seed(0)
        reward = build(family, cfg.geometry == "real")
        reward.micro_batch_size = cfg.images
        bare = bare_forward(reward, family, prompt, images)
        t_loop = timed(lambda r=reward, f=family: naive_loop(r, f, prompt, images), cfg.repeats)
        t_ours = timed(lambda r=reward: r.score(prompt, images), cfg.repeats)
        t_bare = timed(bare, cfg.repeats)
        row = {"family": family, "loop_s": t_loop, "ours_s": t_ours, "bare_s": t_bare,
               "speedup_vs_loop": t_loop / t_ours, "fraction_of_bare": t_bare / t_ours}
        rows.append(row)
        print(f"{family:<12} {t_loop:8.3f} {t_ours:8.3f} {t_bare:8.3f} {row['speedup_vs_loop']:9.2f}x "
              f"{row['fraction_of_bare']:9.2f}x", flush=True)
        del reward
    return rows


if __name__ == "__main__":
    main()
