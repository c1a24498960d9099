"""`diffusion-rl reno` and `diffusion-rl best-of-n`: inference-time reward optimisation from the command line.

    diffusion-rl reno --pipeline stabilityai/sdxl-turbo --prompt "a red dog and a green cat" \\
        --reward hpsv2.1=5 --reward imagereward=1 --reward clipscore=0.01 --reward pickscore=0.05 --output out/
    diffusion-rl reno ... --explore 8 --top-k 2          # CARINOX-style: explore 8 noises, optimise the best 2
    diffusion-rl best-of-n --pipeline PATH --prompt TEXT --reward shapes-eval=1 --n 16 --output out/
    diffusion-rl best-of-n --pipeline Wan-AI/Wan2.1-T2V-1.3B-Diffusers --num-frames 33 --height 480 --width 832 \
        --steps 30 --guidance-scale 5 --prompt "a red ball rolling left" --reward videoalign=1 --n 4 --output out/
    diffusion-rl reno --pipeline WAN_FEW_STEP_DIR --num-frames 9 --steps 2 --reward temporal-consistency=1 ...

Video pipelines (any with a video adapter, e.g. WanPipeline) are driven through their adapter
(`NoiseToVideo`) and need video rewards; an image reward on a video pipeline, or a video reward on an image
one, is a one-line error before anything is sampled.

Outputs: best_<i>.png (and initial_<i>.png for ReNO) for images; for videos best_<i>.mp4 (.gif without an
H.264 encoder) plus best_<i>.png, the frame strip; summary.json, and for ReNO history.jsonl with one line per
iteration holding every reward's per-prompt value.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

COMMANDS = ("reno", "best-of-n")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pipeline", required=True, help="diffusers pipeline folder or hub id (SD/SDXL/SD3/FLUX, or a video "
                   "pipeline such as Wan)")
    p.add_argument("--prompt", action="append", default=[], help="a prompt (repeat for several)")
    p.add_argument("--prompts-file", help="text file with one prompt per line")
    p.add_argument("--reward", action="append", default=[], metavar="NAME=WEIGHT",
                   help="a registry reward and its weight, e.g. hpsv2.1=5 (repeat for several)")
    p.add_argument("--reward-checkpoint", action="append", default=[], metavar="NAME=PATH",
                   help="checkpoint (folder or hub id) for one of the rewards")
    p.add_argument("--reward-detail", action="append", default=[], metavar="NAME=DETAIL",
                   help="optimise a reward's detail instead of its score, e.g. clipscore=cosine (unclamped)")
    p.add_argument("--reward-weights", choices=["pretrained", "random"], default="pretrained",
                   help="'random' builds tiny random rewards (smoke tests only)")
    p.add_argument("--steps", type=int, help="sampler steps (default: the pipeline card's, else 1: SD/SDXL-Turbo; "
                   "1-4 for FLUX-schnell)")
    p.add_argument("--guidance-scale", type=float, help="CFG scale (<= 1: off, as one-step models use; default: the "
                   "pipeline card's, else 0)")
    p.add_argument("--height", type=int, help="image height (default: the pipeline's)")
    p.add_argument("--width", type=int, help="image width (default: the pipeline's)")
    p.add_argument("--num-frames", type=int, help="video pipelines: frames per clip (default: the pipeline's)")
    p.add_argument("--fps", type=int, default=8, help="video pipelines: frame rate of the written clips")
    p.add_argument("--decode-batch-size", type=int, default=1, help="video pipelines: clips per VAE decode call")
    p.add_argument("--max-sequence-length", type=int, help="T5 tokens for SD3/FLUX prompts (default: the pipeline's)")
    p.add_argument("--seed", type=int, default=0, help="seed of the initial noise (counter-based per prompt/sample)")
    p.add_argument("--device", help="cpu, cuda, mps... (default: cuda when available)")
    p.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default="float32",
                   help="pipeline weights dtype (half precision on GPU saves memory; the noise stays fp32)")
    p.add_argument("--attention", choices=["auto", "sdpa", "xformers", "flash", "math"], default="auto",
                   help="attention backend of the pipeline and the rewards (auto: xformers on CUDA when it works, "
                   "else sdpa)")
    p.add_argument("--output", default="reno_out", help="output folder")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    reno = sub.add_parser("reno", help="ReNO: optimise the initial noise against differentiable rewards")
    _common(reno)
    reno.add_argument("--iters", type=int, default=50, help="reward evaluations (ReNO: 50)")
    reno.add_argument("--lr", type=float, default=5.0, help="SGD learning rate (ReNO: 5; 10 for Hyper-SD)")
    reno.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    reno.add_argument("--no-nesterov", action="store_true", help="plain momentum instead of Nesterov")
    reno.add_argument("--grad-clip", type=float, default=0.1, help="per-prompt gradient-norm clip")
    reno.add_argument("--reg-weight", type=float, default=0.01, help="weight of the noise-norm regulariser (0: off)")
    reno.add_argument("--views", type=int, default=1,
                      help="optimise the mean reward over this many random views (shift/blur/noise; 1: off). "
                           "Helps against adversarial textures when the reward model is small")
    reno.add_argument("--view-shift", type=int, default=2, help="random views: max shift in pixels")
    reno.add_argument("--view-blur", type=float, default=1.0, help="random views: max Gaussian blur sigma")
    reno.add_argument("--view-noise", type=float, default=0.03, help="random views: pixel noise std")
    reno.add_argument("--gradient-checkpointing", action="store_true", help="recompute denoiser/VAE activations")
    reno.add_argument("--explore", type=int, default=0, help="CARINOX-style: explore this many noises per prompt first")
    reno.add_argument("--top-k", type=int, default=1, help="with --explore: optimise the best k explored noises")
    bon = sub.add_parser("best-of-n", help="best-of-N sampling with any reward (differentiable or not)")
    _common(bon)
    bon.add_argument("--n", type=int, default=16, help="samples per prompt")
    bon.add_argument("--batch-size", type=int, default=8, help="images generated and scored per batch")


def _pairs(items: list[str], what: str) -> dict[str, str]:
    from mmreward.errors import ConfigError

    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise ConfigError(f"{what}: expected NAME=VALUE, got {item!r}")
        out[name] = value
    return out


def _prompts(args) -> list[str]:
    from mmreward.errors import ConfigError

    prompts = list(args.prompt)
    if args.prompts_file:
        path = Path(args.prompts_file)
        if not path.is_file():
            raise ConfigError(f"--prompts-file: {path} is not a file")
        from mmreward.prompt_sources import read_utf8
        from mmreward.text_checks import check_text

        prompts += [check_text(line.strip(), f"--prompts-file {path} line {i}")
                    for i, line in enumerate(read_utf8(path, "--prompts-file").splitlines(), 1) if line.strip()]
    if not prompts:
        raise ConfigError("give at least one prompt with --prompt TEXT or --prompts-file FILE")
    return prompts


@contextlib.contextmanager
def _quiet_loading(quiet: bool) -> Iterator[None]:
    """--no-progress also hides diffusers' and transformers' loading bars (so an error is the only stderr line)."""
    if not quiet:
        yield
        return
    from diffusers.utils import logging as d_logging
    from transformers.utils import logging as t_logging

    d_on, t_on = d_logging.is_progress_bar_enabled(), t_logging.is_progress_bar_enabled()
    d_logging.disable_progress_bar()
    t_logging.disable_progress_bar()
    try:
        yield
    finally:
        if d_on:
            d_logging.enable_progress_bar()
        if t_on:
            t_logging.enable_progress_bar()


def _load_generator(args, device: str):
    """NoiseToImage for image pipelines, NoiseToVideo for video ones (decided by the adapter's modality)."""
    from diffusion_rl.inference.noise_to_image import NoiseToImage
    from diffusion_rl.inference.noise_to_video import NoiseToVideo
    from diffusion_rl.pipelines import ADAPTERS, DTYPES, load_pipeline, pipeline_family
    from mmreward.errors import ConfigError

    with _quiet_loading(args.no_progress):
        pipe = load_pipeline(args.pipeline, DTYPES[args.dtype], device, args.attention, what="--pipeline")
    # flags left unset come from the pipeline folder's card (generation_defaults), then the built-in defaults
    card = getattr(pipe, "generation_defaults", {}) or {}

    def pick(flag: Any, key: str, fallback: Any = None) -> Any:
        return flag if flag is not None else card.get(key, fallback)

    common = {"num_inference_steps": pick(args.steps, "num_inference_steps", 1),
              "guidance_scale": pick(args.guidance_scale, "guidance_scale", 0.0),
              "height": pick(args.height, "height"), "width": pick(args.width, "width"),
              "gradient_checkpointing": getattr(args, "gradient_checkpointing", False),
              "max_sequence_length": pick(args.max_sequence_length, "max_sequence_length")}
    if ADAPTERS[pipeline_family(pipe, " for noise search and optimisation")].modality == "video":
        return NoiseToVideo(pipe, num_frames=pick(args.num_frames, "num_frames"),
                            decode_batch_size=args.decode_batch_size, **common)
    from diffusion_rl.pipelines import check_token_limit

    check_token_limit(pipe, common["max_sequence_length"])
    if args.num_frames is not None:
        raise ConfigError(f"--num-frames is for video pipelines; {type(pipe).__name__} makes images (drop the flag)")
    return NoiseToImage(pipe, seed=args.seed, **common)


def _setup(args, differentiable: bool):
    import torch

    from diffusion_rl.inference.objective import RewardObjective, parse_weighted

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    from diffusion_rl.inference.augment import RandomViews

    weights = parse_weighted(args.reward)
    checkpoints = _pairs(args.reward_checkpoint, "--reward-checkpoint")
    views = getattr(args, "views", 1)
    augment = RandomViews(views, args.view_shift, args.view_blur, args.view_noise, seed=args.seed) if views != 1 else None
    objective = RewardObjective.load(
        weights, options={k: {"attention": args.attention, **({"checkpoint": checkpoints[k]} if k in checkpoints else {})}
                          for k in {**weights, **checkpoints}}, device=device,
        reward_weights=args.reward_weights, details=_pairs(args.reward_detail, "--reward-detail"), augment=augment,
    )
    if differentiable:
        objective.require_differentiable("ReNO")
    generator = _load_generator(args, device)
    objective.check_modality(generator.modality, f"a {generator.family} pipeline")
    return generator, objective


def _save(images, out: Path, stem: str, fps: int = 8) -> None:
    from diffusion_rl.inference.clips import save_clip
    from diffusion_rl.reporting import save_grid

    for i, img in enumerate(images):
        if img.ndim == 4:  # a clip (T, 3, H, W)
            save_clip(img, out / f"{stem}_{i:03d}", fps)
        else:
            save_grid(img[None], out / f"{stem}_{i:03d}.png", ncol=1)


_AT_LEAST_ONE = ("steps", "n", "batch_size", "iters", "views", "top_k", "height", "width", "max_sequence_length",
                 "num_frames", "fps", "decode_batch_size")


def _check_numbers(args) -> None:
    """Counts >= 1 and finite floats, checked before the (slow) pipeline and reward loads."""
    import math

    from mmreward.errors import ConfigError

    for name, value in vars(args).items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{flag} must be a finite number, got {value}")
        if name in _AT_LEAST_ONE and value is not None and value < 1:
            raise ConfigError(f"{flag} must be >= 1, got {value}")
    if getattr(args, "explore", 0) < 0:
        raise ConfigError(f"--explore must be >= 0, got {args.explore}")


def run(args) -> int:
    from diffusion_rl.usage_errors import one_line
    from mmreward.errors import MMRewardError

    try:
        from mmreward.errors import DIFFUSION_EXTRA, require_installed

        # before any reward or prompt is loaded: without diffusers nothing here can run
        require_installed("diffusers", DIFFUSION_EXTRA, f"diffusion-rl {args.command}")
        _check_numbers(args)
        prompts = _prompts(args)
        if args.command == "reno":
            return _run_reno(args, prompts)
        return _run_best_of_n(args, prompts)
    except MMRewardError as exc:
        print(f"diffusion-rl {args.command}: {one_line(exc)}", file=sys.stderr)
        return 2


def _run_reno(args, prompts: list[str]) -> int:
    from diffusion_rl.inference.exploration import explore_then_optimize
    from diffusion_rl.inference.reno import RenoConfig, reno

    config = RenoConfig(n_iters=args.iters, lr=args.lr, momentum=args.momentum, nesterov=not args.no_nesterov,
                        grad_clip=args.grad_clip, reg_weight=args.reg_weight, seed=args.seed)
    generator, objective = _setup(args, differentiable=True)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    if args.explore:
        explored = explore_then_optimize(generator, objective, prompts, n_explore=args.explore, top_k=args.top_k,
                                         config=config, progress=not args.no_progress)
        result, images = explored.reno, explored.images
        summary: dict[str, Any] = {"explored_best_total": explored.explored_best_total.tolist(),
                                   "best_total": explored.total.tolist(), "reno": result.summary()}
    else:
        result = reno(generator, objective, prompts, config, progress=not args.no_progress)
        images = result.images
        summary = result.summary()
        _save(result.initial_images, out, "initial", args.fps)
    _save(images, out, "best", args.fps)
    with open(out / "history.jsonl", "w") as f:
        for record in result.history:
            f.write(json.dumps(record) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    init, best = result.initial_total, result.best_total
    for i in range(len(init)):
        print(f"[{i}] {result.prompts[i]!r}: objective {float(init[i]):.4f} -> {float(best[i]):.4f} "
              f"(best iteration {int(result.best_iteration[i])})")
    print(f"outputs in {out}")
    return 0


def _run_best_of_n(args, prompts: list[str]) -> int:
    from diffusion_rl.inference.best_of_n import best_of_n, best_of_n_curve

    generator, objective = _setup(args, differentiable=False)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    res = best_of_n(generator, objective, prompts, args.n, seed=args.seed, batch_size=args.batch_size,
                    progress=not args.no_progress)
    _save(res.images, out, "best", args.fps)
    ns = [n for n in (1, 2, 4, 8, 16, 32, 64, 128) if n <= args.n]
    curve = best_of_n_curve(res.totals, ns)
    summary = {"prompts": prompts, "best_index": res.best_index.tolist(), "totals": res.totals.tolist(),
               "scores": {k: v.tolist() for k, v in res.scores.items()},
               "curve": {str(n): float(v.mean()) for n, v in curve.items()}}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print("expected best objective by N: " + ", ".join(f"N={n}: {float(v.mean()):.4f}" for n, v in curve.items()))
    print(f"outputs in {out}")
    return 0
