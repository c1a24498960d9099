"""Measure a ShapesWorld text-to-image pipeline with ShapesEval on held-out prompts.

    python -m mmreward.synthetic.build.evaluate_generator assets/shapesworld/generator --per-category 48

For each GenEval category, `per_category` held-out prompts (single_object has none held out, so its
prompts come from the full list) are generated with GENERATION_DEFAULTS and checked; "shape" is the
fraction of one-object images (single_object and colors prompts) whose object clause holds.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from mmreward.synthetic.captions import caption
from mmreward.synthetic.checker import check, detect
from mmreward.synthetic.prompts import CATEGORIES
from mmreward.synthetic.scenes import sample_specs


def load_generator(folder: str | Path):
    """The ShapesWorld generator as a diffusers pipeline (CPU, fp32, progress bars off)."""
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(str(folder))
    pipe.set_progress_bar_config(disable=True)
    return pipe


@torch.no_grad()
def generate(pipe, prompts: list[str], seed: int = 0, batch_size: int = 64, **overrides) -> torch.Tensor:
    """Images in [0, 1], (B, 3, H, W), with the generation defaults the model was trained for."""
    from mmreward.synthetic.build.train_generator import GENERATION_DEFAULTS

    kwargs = {**GENERATION_DEFAULTS, **overrides}
    out = []
    for start in range(0, len(prompts), batch_size):
        g = torch.Generator().manual_seed(seed + start)
        out.append(pipe(prompts[start : start + batch_size], generator=g, output_type="pt", **kwargs).images)
    return torch.cat(out).float().clamp(0, 1)


def evaluate(pipe, per_category: int = 48, seed: int = 0, **overrides) -> dict:
    results: dict[str, dict[str, float]] = {}
    shape_hits: list[float] = []
    t0 = time.time()
    n_images = 0
    for cat in CATEGORIES:
        split = "all" if cat == "single_object" else "heldout"
        specs = sample_specs(per_category, seed=seed, split=split, categories=(cat,))
        images = generate(pipe, [caption(s) for s in specs], seed=seed, **overrides)
        n_images += len(specs)
        res = check(specs, detect(images))
        results[cat] = {"strict": float(res.strict.mean()), "partial": float(res.partial.mean())}
        if cat in ("single_object", "colors"):
            shape_hits += res.by_kind["object"].tolist()
    seconds = time.time() - t0
    results["overall"] = {
        "strict": sum(r["strict"] for r in results.values()) / len(CATEGORIES),
        "shape_single_object": sum(shape_hits) / len(shape_hits),
        "seconds_per_image": seconds / n_images,
    }
    return results


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder")
    parser.add_argument("--per-category", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None, help="override num_inference_steps")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    overrides = {} if args.steps is None else {"num_inference_steps": args.steps}
    metrics = evaluate(load_generator(args.folder), args.per_category, args.seed, **overrides)
    print(json.dumps(metrics, indent=1))
    return metrics


if __name__ == "__main__":
    main()


def write_card(folder: str | Path, metrics: dict, few_step: dict | None = None) -> None:
    """README.md of the generator folder from measured metrics and the training record."""
    folder = Path(folder)
    meta = json.loads((folder / "shapesworld.json").read_text())
    cfg = meta["config"]
    rows = "\n".join(
        f"| {cat} | {m['strict']:.3f} | {m['partial']:.3f} |" for cat, m in metrics.items() if cat != "overall"
    )
    ov = metrics["overall"]
    few = ""
    if few_step:
        few = "\n".join(
            f"- {steps} steps: mean strict {m['overall']['strict']:.3f}, single-object shape "
            f"{m['overall']['shape_single_object']:.3f}" for steps, m in few_step.items()
        )
        few = f"\n## Few-step mode (same weights, fewer Euler steps)\n{few}\n"
    (folder / "README.md").write_text(f"""# ShapesWorld tiny text-to-image generator

A stock diffusers `StableDiffusion3Pipeline`: `SD3Transformer2DModel` ({cfg['layers']} layers, width
{cfg['width']}, patch {cfg['patch']}) on {cfg['image_size']}x{cfg['image_size']} RGB pixels through an
analytic identity `AutoencoderKL`, two small `CLIPTextModelWithProjection` towers with ShapesWorld's
CLIP BPE tokenizer, a null T5 (outputs zeros, like SD3 without T5) and `FlowMatchEulerDiscreteScheduler`.

    from diffusers import DiffusionPipeline
    pipe = DiffusionPipeline.from_pretrained("assets/shapesworld/generator")
    images = pipe(prompts, max_sequence_length=4, num_inference_steps=20, guidance_scale=4.0,
                  output_type="pt").images

Always pass `max_sequence_length=4` (see shapesworld.json): it sets how many zero tokens stand in
for T5, and the model was trained with 4.

Training: rectified flow (SD3 loss, logit-normal noise levels), {meta['trained_steps']} steps of
{cfg['batch_size']} freshly rendered training-split scenes, AdamW lr {cfg['lr']}, 10% empty prompts for
guidance, EMA {cfg['ema']}; {meta['train_minutes']} min on 2 shared CPU threads.
Rebuild: `python -m mmreward.synthetic.build.build_assets --only generator`.

## Measured on held-out prompts (ShapesEval; single_object uses all 4 prompts)

{ov['seconds_per_image']:.3f} s per image (20 steps, guidance 4, batches of 64, 2 CPU threads, shared machine).
Single-object shape right: **{ov['shape_single_object']:.3f}**; mean strict over categories: {ov['strict']:.3f}.

| category | strict | partial |
|---|---|---|
{rows}
{few}""")
