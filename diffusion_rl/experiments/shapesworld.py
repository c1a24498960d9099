"""ReNO and best-of-N on ShapesWorld: the CLIP reward they optimise, and the exact checker they should move.

    python -m diffusion_rl.experiments.shapesworld --clip assets/shapesworld/clip-hardened --views 4 \
        --prompt-set reserved --prompts-per-category 6 --seeds 4 --output runs/reno_shapes

For the prompts of a set (`reserved`: training-split prompts that no reward-hardening data used, every
category; `heldout`: the compositional held-out split) and several initial noises each:
- ReNO against the ShapesWorld CLIP reward: the CLIP score (on the plain images) of the un-optimised and
  the returned image, and ShapesEval strict / partial accuracy of both (the checker is never seen by the
  optimiser);
- best-of-N selected by the same CLIP reward from a pool of 16 samples per prompt: expected CLIP score
  and ShapesEval accuracy of the chosen sample for N = 1, 2, 4, 8, 16 (exact over subsets of the pool).
Writes report.json (and before/after grids) and prints a summary.

`--views K` optimises the CLIP score averaged over K random views (shift, blur, pixel noise) instead of
the score of the exact pixels, which keeps ReNO from growing adversarial textures on a 0.3M-parameter CLIP.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch


def held_out_prompts(per_category: int, categories: Sequence[str] | None = None) -> list[str]:
    """The first `per_category` held-out prompts of each category, spread over the category's list."""
    from mmreward.synthetic import caption
    from mmreward.synthetic.scenes import specs_for_split

    out = []
    for _cat, specs in specs_for_split("heldout", tuple(categories) if categories else None).items():
        step = max(1, len(specs) // per_category)
        out += [caption(s) for s in specs[::step][:per_category]]
    return out


def reserved_prompts(per_category: int, categories: Sequence[str] | None = None) -> list[str]:
    """Up to `per_category` training-split prompts per category from the evaluation reserve: prompts that no
    reward-hardening data used (mmreward.synthetic.build.generated_pool.reserved_for_evaluation)."""
    from mmreward.synthetic import caption
    from mmreward.synthetic.build.generated_pool import reserved_for_evaluation
    from mmreward.synthetic.scenes import specs_for_split

    out = []
    for _cat, specs in specs_for_split("train", tuple(categories) if categories else None).items():
        mine = [caption(s) for s in specs if reserved_for_evaluation(caption(s))]
        step = max(1, len(mine) // per_category)
        out += mine[::step][:per_category]
    return out


PROMPT_SETS = {"heldout": held_out_prompts, "reserved": reserved_prompts}


def _mean_se(x: torch.Tensor) -> tuple[float, float]:
    x = x.double()
    return float(x.mean()), float(x.std() / math.sqrt(len(x))) if len(x) > 1 else 0.0


def run(
    generator,
    objective,
    prompts: list[str],
    *,
    seeds: int = 1,
    reno_config=None,
    pool: int = 16,
    batch_size: int = 8,
    prompt_set: str = "",
    output: Path | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """The ReNO and best-of-N measurements above, as a JSON-ready dict."""
    from diffusion_rl.inference.best_of_n import best_of_n, best_of_n_curve
    from diffusion_rl.inference.objective import RewardObjective
    from diffusion_rl.inference.reno import RenoConfig, reno
    from diffusion_rl.reporting import save_grid
    from mmreward.synthetic import evaluate_images

    reno_config = reno_config or RenoConfig()
    name = objective.terms[0].name
    items = [p for p in prompts for _ in range(seeds)]
    report: dict[str, Any] = {"prompts": prompts, "seeds": seeds, "prompt_set": prompt_set, "reward": name,
                              "objective": {t.name: [t.weight, t.detail] for t in objective.terms}}

    # -- ReNO: every (prompt, seed) optimised in one batch, with independent per-item steps and best iterates
    from diffusion_rl.seeding import mix_seed

    noise = generator.sample_noise([mix_seed(reno_config.seed, p, s) for p in range(len(prompts)) for s in range(seeds)])
    res = reno(generator, objective, items, reno_config, noise=noise, progress=progress)
    before, after = evaluate_images(items, res.initial_images), evaluate_images(items, res.images)
    # "the reward" is the first term (the CLIP reward), re-scored on the plain images: with augmentation the
    # objective is a random-view average, which is not the reward users score with
    term = objective.terms[0]
    with torch.inference_mode():
        plain = [term.reward.score(items, x) for x in (res.initial_images, res.images)]
    initial_reward, best_reward = ((o.details[term.detail] if term.detail else o.scores).float().cpu() for o in plain)
    raised = best_reward > initial_reward
    report["reno"] = {
        "config": vars(reno_config),
        "augment": asdict(objective.augment) if objective.augment is not None else None,
        "clip_initial": _mean_se(initial_reward),
        "clip_best": _mean_se(best_reward),
        "objective_initial": _mean_se(res.initial_total),
        "objective_best": _mean_se(res.best_total),
        "clip_raised_fraction": float(raised.float().mean()),
        "clip_raised_every_prompt": bool(raised.all()),
        "strict_initial": _mean_se(before.strict),
        "strict_best": _mean_se(after.strict),
        "partial_initial": _mean_se(before.partial),
        "partial_best": _mean_se(after.partial),
        "strict_paired_diff": _mean_se(after.strict - before.strict),
        "partial_paired_diff": _mean_se(after.partial - before.partial),
        "best_iteration_mean": float(res.best_iteration.float().mean()),
        "per_item": [
            {"prompt": p, "clip": [float(initial_reward[i]), float(best_reward[i])],
             "strict": [float(before.strict[i]), float(after.strict[i])],
             "partial": [float(before.partial[i]), float(after.partial[i])]}
            for i, p in enumerate(items)
        ],
    }
    if output is not None:
        output.mkdir(parents=True, exist_ok=True)
        save_grid(res.initial_images, output / "reno_initial.png", ncol=8)
        save_grid(res.images, output / "reno_best.png", ncol=8)

    # -- best-of-N from one pool per prompt, selected by the plain rewards (no random views)
    plain_objective = RewardObjective(objective.terms)
    bon = best_of_n(generator, plain_objective, prompts, pool, seed=reno_config.seed + 1, batch_size=batch_size,
                    keep_all=True, progress=progress)
    flat = bon.all_images.flatten(0, 1)
    flat_prompts = [p for p in prompts for _ in range(pool)]
    check = evaluate_images(flat_prompts, flat)
    ns = [n for n in (1, 2, 4, 8, 16, 32, 64) if n <= pool]
    curves = {
        "objective": best_of_n_curve(bon.totals, ns),
        "strict": best_of_n_curve(bon.totals, ns, evaluation=check.strict.view(len(prompts), pool)),
        "partial": best_of_n_curve(bon.totals, ns, evaluation=check.partial.view(len(prompts), pool)),
    }
    report["best_of_n"] = {key: {str(n): _mean_se(v) for n, v in c.items()} for key, c in curves.items()}
    if output is not None:
        save_grid(bon.images, output / "best_of_n.png", ncol=8)
        (output / "report.json").write_text(json.dumps(report, indent=2))
    return report


def format_report(report: dict[str, Any]) -> str:
    r = report["reno"]

    def ms(v):
        return f"{v[0]:.3f} +/- {v[1]:.3f}"

    lines = [
        f"ReNO on {len(r['per_item'])} (prompt, seed) items of the {report.get('prompt_set') or 'given'} prompt set:",
        f"  objective  {ms(r['objective_initial'])} -> {ms(r['objective_best'])}",
        f"  {report['reward']} {ms(r['clip_initial'])} -> {ms(r['clip_best'])}; raised on "
        f"{r['clip_raised_fraction']:.0%} of items (every one: {r['clip_raised_every_prompt']})",
        f"  strict     {ms(r['strict_initial'])} -> {ms(r['strict_best'])} (paired diff {ms(r['strict_paired_diff'])})",
        f"  partial    {ms(r['partial_initial'])} -> {ms(r['partial_best'])} (paired diff {ms(r['partial_paired_diff'])})",
        "Best-of-N selected by the reward (expected value of the chosen sample, mean +/- SE over prompts):",
    ]
    for key, curve in report["best_of_n"].items():
        lines.append(f"  {key:8s} " + "  ".join(f"N={n}: {v[0]:.3f}" for n, v in curve.items()))
    return "\n".join(lines)


def load_generator_and_objective(
    generator: str,
    clip: str,
    *,
    steps: int = 4,
    guidance_scale: float = 4.0,
    size: int | None = None,
    max_sequence_length: int = 4,
    also: dict[str, float] | None = None,
    augment=None,
    random_clip: bool = False,
):
    """The ShapesWorld generator as a NoiseToImage and ReNO's CLIP objective on it: 100 * cosine, unclamped
    (CLIPScore's clamp at 0 leaves no gradient on bad starts), plus any `also` rewards."""
    from diffusers.utils import logging as diffusers_logging

    from diffusion_rl.inference.noise_to_image import NoiseToImage
    from diffusion_rl.inference.objective import RewardObjective

    diffusers_logging.set_verbosity_error()  # the pipeline warns on every call that T5 prompts are truncated to 4 tokens
    gen = NoiseToImage.from_pretrained(generator, num_inference_steps=steps, guidance_scale=guidance_scale,
                                       height=size, width=size, max_sequence_length=max_sequence_length)
    weights = {"clipscore": 100.0, **(also or {})}
    details = {"clipscore": "cosine"}
    if random_clip:
        objective = RewardObjective.load(weights, reward_weights="random", details=details, augment=augment)
    else:
        objective = RewardObjective.load(weights, options={"clipscore": {"checkpoint": clip}}, details=details,
                                         augment=augment)
    return gen, objective


def main(argv: Sequence[str] | None = None) -> int:
    from diffusion_rl.inference.reno import RenoConfig

    p = argparse.ArgumentParser(prog="python -m diffusion_rl.experiments.shapesworld", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--generator", default="assets/shapesworld/generator", help="diffusers pipeline folder")
    p.add_argument("--clip", default="assets/shapesworld/clip", help="CLIP folder for mmreward.load('clipscore', ...)")
    p.add_argument("--random-clip", action="store_true", help="tiny random CLIP instead of --clip (smoke tests)")
    p.add_argument("--also", action="append", default=[], metavar="NAME=WEIGHT",
                   help="add a differentiable registry reward to the objective, e.g. shapesworld-pref=1")
    p.add_argument("--steps", type=int, default=4, help="generator sampling steps (few-step mode)")
    p.add_argument("--guidance-scale", type=float, default=4.0, help="CFG scale (<= 1: off)")
    p.add_argument("--max-sequence-length", type=int, default=4, help="T5 tokens (the generator was trained with 4)")
    p.add_argument("--size", type=int, default=None, help="image size (default: the pipeline's)")
    p.add_argument("--prompt-set", choices=sorted(PROMPT_SETS), default="reserved",
                   help="reserved: training-split prompts no reward-hardening data used; heldout: the compositional "
                        "held-out split (colour-shape pairs, counts and shape pairs the generator never saw)")
    p.add_argument("--prompts-per-category", type=int, default=4)
    p.add_argument("--categories", nargs="*", default=None, help="default: all six GenEval categories")
    p.add_argument("--seeds", type=int, default=2, help="initial noises per prompt for ReNO")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--lr", type=float, default=5.0)
    p.add_argument("--views", type=int, default=1,
                   help="score the objective as the mean over this many random views (1: the plain image)")
    p.add_argument("--max-shift", type=int, default=2, help="random views: max shift in pixels")
    p.add_argument("--max-blur", type=float, default=1.0, help="random views: max Gaussian blur sigma")
    p.add_argument("--view-noise", type=float, default=0.03, help="random views: pixel noise std")
    p.add_argument("--pool", type=int, default=16, help="best-of-N pool per prompt")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--output", default="runs/reno_shapesworld")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)

    from diffusion_rl.inference.augment import RandomViews
    from diffusion_rl.inference.objective import parse_weighted

    augment = (RandomViews(args.views, args.max_shift, args.max_blur, args.view_noise) if args.views > 1 else None)
    generator, objective = load_generator_and_objective(
        args.generator, args.clip, steps=args.steps, guidance_scale=args.guidance_scale, size=args.size,
        max_sequence_length=args.max_sequence_length, also=parse_weighted(args.also) if args.also else None,
        augment=augment, random_clip=args.random_clip)
    prompts = PROMPT_SETS[args.prompt_set](args.prompts_per_category, args.categories)
    report = run(generator, objective, prompts, seeds=args.seeds,
                 reno_config=RenoConfig(n_iters=args.iters, lr=args.lr), pool=args.pool,
                 batch_size=args.batch_size, prompt_set=args.prompt_set, output=Path(args.output), progress=not args.no_progress)
    print(format_report(report))
    print(f"report in {Path(args.output) / 'report.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
