"""Rebuild every ShapesWorld asset from scratch, deterministically (fixed seeds, seeded data per step).

    python -m mmreward.synthetic.build.build_assets                 # clip, generator, pref + aesthetic, cards
    python -m mmreward.synthetic.build.build_assets --only clip     # one asset
    python -m mmreward.synthetic.build.build_assets --only clip-regions   # CLIP + absolute regions (not in "all")
    python -m mmreward.synthetic.build.build_assets --quick --root /tmp/sw   # a 1-minute smoke build
    python -m mmreward.synthetic.build.build_assets --only video-generator   # text-to-video model (not in "all")
    python -m mmreward.synthetic.build.build_assets --only edit-model   # FLUX Kontext edit model (not in "all")
    python -m mmreward.synthetic.build.build_assets --only vqa-policy   # tiny Qwen2-VL VQA policy (not in "all")

Order: the CLIP first (the preference model and aesthetic head start from it), then the generator
(the long job: it checkpoints to build/shapesworld/ and resumes if interrupted), then measurement and
cards. Time on this 2-core shared machine: see assets/shapesworld/README.md.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from mmreward.synthetic.build import (
    evaluate_edit_model,
    evaluate_generator,
    evaluate_video_generator,
    train_clip,
    train_edit_model,
    train_generator,
    train_preference,
    train_video_generator,
    train_vqa_policy,
)
from mmreward.synthetic.build.threads import torch_threads

STEPS = {"clip": 300, "generator": 4500, "pref": 150, "video-generator": 14350, "edit-model": 2500, "vqa-policy": train_vqa_policy.VQAPolicyTrainConfig.steps}
QUICK = {"clip": 3, "generator": 3, "pref": 2, "video-generator": 2, "edit-model": 2, "vqa-policy": 2}


def measure_generator(folder: Path, per_category: int) -> dict:
    """Measure the generator at 20, 4 and 1 Euler steps; write metrics.json and the card."""
    pipe = evaluate_generator.load_generator(folder)
    metrics = evaluate_generator.evaluate(pipe, per_category)
    few = {n: evaluate_generator.evaluate(pipe, per_category, num_inference_steps=n) for n in (4, 1)}
    evaluate_generator.write_card(folder, metrics, few)
    (folder / "metrics.json").write_text(json.dumps({"20": metrics, **{str(k): v for k, v in few.items()}}, indent=1))
    return metrics


def measure_video_generator(folder: Path, clips: int) -> dict:
    """Measure the video generator on held-out and training-split prompts; write metrics.json and the card."""
    metrics = evaluate_video_generator.evaluate(evaluate_video_generator.load_video_generator(folder), clips)
    (folder / "metrics.json").write_text(json.dumps(metrics, indent=1))
    evaluate_video_generator.write_card(folder, metrics)
    return metrics


def measure_edit_model(folder: Path, tasks: int) -> dict:
    """Measure the edit model on held-out and training-split edits; write metrics.json and the card."""
    metrics = evaluate_edit_model.evaluate(evaluate_edit_model.load_edit_model(folder), tasks)
    (folder / "metrics.json").write_text(json.dumps(metrics, indent=1))
    evaluate_edit_model.write_card(folder, metrics)
    return metrics


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default="assets/shapesworld", help="output folder of the assets")
    parser.add_argument("--work", default="build/shapesworld", help="checkpoints of the generator run")
    parser.add_argument("--only", choices=["clip", "generator", "pref", "clip-regions", "video-generator", "edit-model",
                                           "vqa-policy", "all"],
                        default="all")
    parser.add_argument("--measure-only", action="store_true", help="re-measure a generator and rewrite its card")
    parser.add_argument("--quick", action="store_true", help="tiny budgets: checks the pipeline, not quality")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    with torch_threads(args.threads):
        return _build(args)


def _build(args: argparse.Namespace) -> dict:
    root, steps = Path(args.root), QUICK if args.quick else STEPS
    timings: dict[str, float] = {}
    todo = ["clip", "generator", "pref"] if args.only == "all" else [args.only]
    small = {"eval_images": 4} if args.quick else {}
    for name in todo:
        t0 = time.time()
        if name == "clip":
            train_clip.train(train_clip.ClipTrainConfig(out=str(root / "clip"), steps=steps["clip"],
                                                        threads=args.threads, **small))
        elif name == "clip-regions":  # fine-tunes the CLIP above on quadrant captions (vlm_rm region task)
            train_clip.train(train_clip.ClipTrainConfig(
                out=str(root / "clip-regions"), init=str(root / "clip"), region_fraction=0.5,
                steps=3 if args.quick else 600, warmup=1 if args.quick else 20, threads=args.threads, **small))
        elif name == "generator":
            cfg = train_generator.GeneratorTrainConfig(
                out=str(root / "generator"), work=str(Path(args.work) / "generator"), steps=steps["generator"],
                threads=args.threads, **({"batch_size": 4, "warmup": 1} if args.quick else {}),
            )
            if not args.measure_only:
                train_generator.train(cfg)
            measure_generator(root / "generator", 2 if args.quick else 48)
        elif name == "video-generator":  # one CPU thread: on a shared 2-core machine two threads were far slower
            clip = root / "clip"
            if not (clip / "config.json").is_file():  # e.g. a quick build into an empty folder: the shipped CLIP
                clip = Path(__file__).resolve().parents[3] / "assets" / "shapesworld" / "clip"
            recipe = {**train_video_generator.SHIPPED_RECIPE, "steps": steps["video-generator"]}
            if args.quick:
                recipe.update(batch_size=2, warmup=1, layers=1, centred_after=1, stop_at=0)
            vcfg = train_video_generator.VideoGeneratorTrainConfig(
                out=str(root / "video-generator"), work=str(Path(args.work) / "video-generator"), threads=1,
                text_encoder=str(clip), **recipe,
            )
            if not args.measure_only:
                train_video_generator.train(vcfg)
            measure_video_generator(root / "video-generator", 4 if args.quick else 128)
            evaluate_video_generator.write_prompt_sets(root / "video-generator")
        elif name == "edit-model":  # one CPU thread, as the video generator
            ecfg = train_edit_model.EditTrainConfig(
                out=str(root / "edit-model"), work=str(Path(args.work) / "edit-model"), steps=steps["edit-model"],
                threads=1, **({"batch_size": 2, "warmup": 1, "layers": 1, "single_layers": 1} if args.quick else {}),
            )
            if not args.measure_only:
                train_edit_model.train(ecfg)
            train_edit_model.write_prompt_sets(root / "edit-model" / "prompts")
            measure_edit_model(root / "edit-model", 4 if args.quick else 128)
        elif name == "vqa-policy":  # the GRPO recipe's starting policy (vlm_rm.trl_shapes_vqa)
            # one thread: the shipped weights are bit-reproducible only with the thread count they were built with
            # (two threads change the reductions' order, and the run drifts from step 1)
            train_vqa_policy.train(train_vqa_policy.VQAPolicyTrainConfig(
                out=str(root / "vqa-policy"), steps=steps["vqa-policy"], threads=1,
                **({"train_questions": 64, "eval_questions": 10, "first_steps": 1} if args.quick else {})))
        else:
            pcfg = train_preference.PreferenceTrainConfig(
                clip=str(root / "clip"), pref_out=str(root / "pref"), aesthetic_out=str(root / "aesthetic"),
                steps=steps["pref"], threads=args.threads,
                **({"aesthetic_images": 32, "eval_pairs": 16, "batch_size": 4} if args.quick else {}),
            )
            train_preference.main([f"--{k.replace('_', '-')}={v}" for k, v in vars(pcfg).items()])
        timings[name] = round((time.time() - t0) / 60, 1)
        print(f"built {name} in {timings[name]} min")
    return timings


if __name__ == "__main__":
    main()
