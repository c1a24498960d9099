"""Train the ShapesWorld preference model and aesthetic head on synthetic preferences.

    python -m mmreward.synthetic.build.train_preference --clip assets/shapesworld/clip

Preference pairs (prompt, preferred, rejected): the preferred image is a render of the prompt, lightly
degraded (level <= 0.3); the rejected one is either a render of a corrupted scene (wrong colour or shape,
a missing object, swapped positions) at the same degradation, or the same scene degraded by 0.3-0.7 more.
The preference model is the tiny CLIP fine-tuned with PickScore's loss (cross-entropy over the pair's
scaled cosine scores). The aesthetic head is an MLP on the frozen tiny CLIP's normalised image embedding,
regressing 10 * (1 - degradation level).
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from mmreward.errors import ConfigError
from mmreward.synthetic.build.corruptions import corrupt_scene, degrade
from mmreward.synthetic.build.threads import torch_threads
from mmreward.synthetic.captions import caption
from mmreward.synthetic.scenes import render, sample_scenes


@dataclass
class PreferenceTrainConfig:
    clip: str = "assets/shapesworld/clip"
    pref_out: str = "assets/shapesworld/pref"
    aesthetic_out: str = "assets/shapesworld/aesthetic"
    steps: int = 150
    batch_size: int = 32
    lr: float = 3e-4
    aesthetic_images: int = 2000
    eval_pairs: int = 400
    seed: int = 0
    threads: int = 2

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1 or self.aesthetic_images < 10:
            raise ConfigError("steps, batch_size must be >= 1 and aesthetic_images >= 10")


def preference_pairs(n: int, seed: int, split: str) -> tuple[list[str], torch.Tensor, torch.Tensor, torch.Tensor]:
    """prompts, preferred, rejected images and a (n,) bool tensor: True where the pair differs semantically."""
    scenes = sample_scenes(n, seed=seed, split=split)
    rng = random.Random(f"pairs/{seed}/{split}")
    g = torch.Generator().manual_seed(seed)
    semantic = torch.tensor([rng.random() < 0.6 for _ in scenes])
    bad_scenes = [corrupt_scene(s, rng) if sem else s for s, sem in zip(scenes, semantic.tolist())]
    base = 0.3 * torch.rand(n, generator=g)
    extra = torch.where(semantic, torch.zeros(n), 0.3 + 0.4 * torch.rand(n, generator=g))
    good = degrade(render(scenes), base, g)
    bad = degrade(render(bad_scenes), base + extra, g)
    return [caption(s.spec) for s in scenes], good, bad, semantic


def train_pref(cfg: PreferenceTrainConfig) -> dict:
    from tqdm import tqdm

    from mmreward.models.shapesworld_pref import CLIPPreferenceReward, load_clip_folder

    model, tok = load_clip_folder(cfg.clip, "pretrained")
    reward = CLIPPreferenceReward(model, tok)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    model.train()
    for step in tqdm(range(cfg.steps), desc="pref", mininterval=10):
        prompts, good, bad, _ = preference_pairs(cfg.batch_size, cfg.seed * 7919 + step, "train")
        scores = reward._score(prompts + prompts, torch.cat([good, bad])).scores
        logits = torch.stack([scores[: len(prompts)], scores[len(prompts) :]], 1)
        loss = torch.nn.functional.cross_entropy(logits, torch.zeros(len(prompts), dtype=torch.long))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    model.eval()
    out = Path(cfg.pref_out)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "mmreward.json").write_text(json.dumps({"reward": "shapesworld-pref"}))
    return pairwise_accuracy(reward, cfg.eval_pairs)


@torch.no_grad()
def pairwise_accuracy(reward, n: int = 400, seed: int = 12345) -> dict:
    """Accuracy of P(preferred) > 0.5 on held-out-prompt pairs, overall and by pair type."""
    prompts, good, bad, semantic = preference_pairs(n, seed, "heldout")
    prob = reward.compare(prompts, good, bad).prob_a
    hit = (prob > 0.5).float()
    return {"accuracy": float(hit.mean()), "semantic_pairs": float(hit[semantic].mean()),
            "quality_pairs": float(hit[~semantic].mean()), "pairs": n}


def _quality_set(n: int, seed: int, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    level = torch.rand(n, generator=g) * (torch.rand(n, generator=g) > 0.25)
    return degrade(render(sample_scenes(n, seed=seed, split=split)), level, g), 10 * (1 - level)


def train_aesthetic(cfg: PreferenceTrainConfig) -> dict:
    from safetensors.torch import save_file
    from transformers import CLIPModel, CLIPVisionModelWithProjection

    from mmreward.models.shapesworld_aesthetic import HEAD_FILE, AestheticHeadReward, build_head

    clip = CLIPModel.from_pretrained(cfg.clip)
    vcfg = clip.config.vision_config
    vcfg.projection_dim = clip.config.projection_dim  # not carried over from CLIPConfig by default
    vision = CLIPVisionModelWithProjection(vcfg).eval()
    vision.vision_model.load_state_dict(clip.vision_model.state_dict())
    vision.visual_projection.load_state_dict(clip.visual_projection.state_dict())
    head = build_head(vision.config.projection_dim)
    reward = AestheticHeadReward(vision, head)
    images, target = _quality_set(cfg.aesthetic_images, cfg.seed, "train")
    with torch.no_grad():
        emb = torch.cat([reward.embed(images[i : i + 256]) for i in range(0, len(images), 256)])
    opt = torch.optim.AdamW(head.parameters(), lr=3e-3, weight_decay=1e-3)
    for _ in range(600):
        loss = torch.nn.functional.mse_loss(head(emb).squeeze(-1), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    out = Path(cfg.aesthetic_out)
    vision.save_pretrained(out)
    save_file({k: v.contiguous() for k, v in head.state_dict().items()}, str(out / HEAD_FILE))
    (out / "mmreward.json").write_text(json.dumps({"reward": "shapesworld-aesthetic"}))
    return aesthetic_quality(reward)


@torch.no_grad()
def aesthetic_quality(reward, n: int = 400, seed: int = 4242) -> dict:
    """Pearson r between predicted and true quality on held-out scenes, and clean-vs-damaged ranking accuracy."""
    images, target = _quality_set(n, seed, "heldout")
    pred = reward.score(None, images).scores
    r = torch.corrcoef(torch.stack([pred, target]))[0, 1]
    clean, damaged = pred[target == 10], pred[target < 7]
    rank = (clean.view(-1, 1) > damaged.view(1, -1)).float().mean()
    return {"pearson_r": float(r), "clean_above_damaged": float(rank), "images": n}


def write_cards(cfg: PreferenceTrainConfig, pref: dict, aes: dict) -> None:
    Path(cfg.pref_out, "README.md").write_text(f"""# ShapesWorld preference model (`shapesworld-pref`)

The tiny ShapesWorld CLIP (../clip) fine-tuned PickScore-style for {cfg.steps} steps of {cfg.batch_size}
synthetic preference pairs: the preferred image renders the prompt (lightly degraded), the rejected one
renders a corrupted scene (wrong colour/shape, missing object, swapped positions) or is degraded more.
Score = exp(logit_scale) * cosine; `compare` = softmax over a pair. Load with
`mmreward.load("shapesworld-pref")` or `mmreward.load("<this folder>")`.
Rebuild: `python -m mmreward.synthetic.build.build_assets --only pref`.

## Measured on {pref['pairs']} held-out-prompt pairs
- accuracy P(preferred) > 0.5: **{pref['accuracy']:.3f}**
- semantic pairs (prompt mismatch): {pref['semantic_pairs']:.3f}; quality pairs (more damage): {pref['quality_pairs']:.3f}
""")
    Path(cfg.aesthetic_out, "README.md").write_text(f"""# ShapesWorld aesthetic head (`shapesworld-aesthetic`)

An MLP (64-64-32-1, GELU) on the frozen tiny ShapesWorld CLIP's normalised image embedding, regressing
10 * (1 - damage) where damage in [0, 1] is blur, noise, washed-out contrast or holes in the shapes
({cfg.aesthetic_images} training images, 25% clean). Prompt-free. Load with
`mmreward.load("shapesworld-aesthetic")`. Rebuild: `python -m mmreward.synthetic.build.build_assets --only pref`.

## Measured on {aes['images']} held-out images
- Pearson r (predicted vs true quality): **{aes['pearson_r']:.3f}**
- P(clean image scores above a damaged one with damage > 0.3): {aes['clean_above_damaged']:.3f}
""")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for f, v in asdict(PreferenceTrainConfig()).items():
        parser.add_argument(f"--{f.replace('_', '-')}", type=type(v), default=v)
    cfg = PreferenceTrainConfig(**vars(parser.parse_args(argv)))
    with torch_threads(cfg.threads):
        torch.manual_seed(cfg.seed)
        metrics = {"pref": train_pref(cfg), "aesthetic": train_aesthetic(cfg)}
    write_cards(cfg, metrics["pref"], metrics["aesthetic"])
    Path(cfg.pref_out, "training.json").write_text(json.dumps({"config": asdict(cfg), **metrics}, indent=1))
    print(json.dumps(metrics, indent=1))
    return metrics


if __name__ == "__main__":
    main()
