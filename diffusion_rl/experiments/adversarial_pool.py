"""ReNO iterates on training prompts, labelled by the ShapesEval checker: data to harden a CLIP reward.

    python -m diffusion_rl.experiments.adversarial_pool --clip runs/clip_gen --prompts 256 --out runs/adv_pool.pt

Noise optimisation against a small CLIP finds images the CLIP likes and the checker rejects (jagged,
speckled shapes). Training the CLIP on those iterates, with the checker's verdict, is one round of the
usual fix for reward hacking: collect what the policy exploits, label it, retrain the reward model
(as in iterated RLHF). Only training-split prompts outside the evaluation reserve are used. The file has the GeneratedPool format
(mmreward.synthetic.build.generated_pool), so `train_clip --generated a.pt,b.pt` takes it.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

import torch


def build_adversarial_pool(
    generator,
    objective,
    n_prompts: int = 256,
    iterations: Sequence[int] = (0, 10, 25, 49),
    reno_config=None,
    chunk: int = 64,
    seed: int = 0,
    progress: bool = True,
) -> dict:
    """ReNO on `n_prompts` training prompts; keep the images of the given iterations with checker verdicts."""
    from tqdm.auto import tqdm

    from diffusion_rl.inference.reno import RenoConfig, reno
    from diffusion_rl.seeding import mix_seed
    from mmreward.errors import ConfigError
    from mmreward.synthetic import caption, evaluate_images
    from mmreward.synthetic.build.generated_pool import reward_training_specs

    reno_config = reno_config or RenoConfig(keep_all_images=True)
    if not reno_config.keep_all_images:
        raise ConfigError("reno_config.keep_all_images must be True: the pool stores intermediate iterates")
    if max(iterations) >= reno_config.n_iters:
        raise ConfigError(f"iterations {list(iterations)} must be < n_iters={reno_config.n_iters}")
    prompts = [caption(s) for s in reward_training_specs(n_prompts, seed + 17)]
    images, labels = [], []
    for start in tqdm(range(0, len(prompts), chunk), desc="adversarial pool", disable=not progress):
        part = prompts[start : start + chunk]
        noise = generator.sample_noise([mix_seed(seed, start + i) for i in range(len(part))])
        res = reno(generator, objective, part, reno_config, noise=noise, progress=False)
        for it in iterations:
            images.append(res.all_images[it])
            labels += part
    imgs = torch.cat(images).float().clamp(0, 1)
    check = evaluate_images(labels, imgs)
    return {"images": (imgs * 255).round().to(torch.uint8), "prompts": labels, "strict": check.strict,
            "partial": check.partial, "iterations": list(iterations)}


def main(argv: Sequence[str] | None = None) -> dict:
    from diffusion_rl.experiments.shapesworld import load_generator_and_objective
    from diffusion_rl.inference.reno import RenoConfig

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--generator", default="assets/shapesworld/generator")
    p.add_argument("--clip", default="assets/shapesworld/clip")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--prompts", type=int, default=256)
    p.add_argument("--iterations", type=int, nargs="+", default=[0, 10, 25, 49])
    p.add_argument("--reno-iters", type=int, default=50, help="ReNO iterations (the paper's 50)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    t0 = time.time()
    generator, objective = load_generator_and_objective(args.generator, args.clip, steps=args.steps)
    pool = build_adversarial_pool(generator, objective, args.prompts, args.iterations,
                                  RenoConfig(n_iters=args.reno_iters, keep_all_images=True), seed=args.seed,
                                  progress=False)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    torch.save(pool, args.out)
    n = len(pool["prompts"]) // len(args.iterations)
    by_it = {it: float(pool["strict"][k * n : (k + 1) * n].mean()) for k, it in enumerate(args.iterations)}
    summary = {"samples": len(pool["prompts"]), "strict_by_iteration": by_it, "minutes": round((time.time() - t0) / 60, 1)}
    print(summary)
    return summary


if __name__ == "__main__":
    main()
