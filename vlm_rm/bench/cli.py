"""`vlm-rm bench`: evaluate a registered reward (or a judge) on a local copy of a benchmark."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from mmreward.errors import ConfigError


def add_parser(subparsers) -> argparse.ArgumentParser:
    from vlm_rm.bench.suites import BENCHMARKS

    p = subparsers.add_parser("bench", help="evaluate a reward model on a reward-model benchmark")
    p.add_argument("--reward", help="registered reward name, hub id, folder or pkg.module:Class")
    p.add_argument("--judge", help="registered judge name (e.g. unifiedreward) or pkg.module:factory returning a "
                                   "judge callable (prompts, media) -> texts; the factory must be declared with "
                                   "@vlm_rm.bench.judges.judge_factory (naming a module imports it, i.e. runs its code)")
    p.add_argument("--load-option", action="append", default=[], metavar="KEY=VALUE",
                   help="extra mmreward.load option of the reward/judge, e.g. backend=openai, tiny=true (JSON values)")
    p.add_argument("--pointwise", action="store_true",
                   help="with --reward: score a generative judge pointwise as a scalar reward even on a benchmark "
                        "that can ask it pairwise questions (the default there is judge mode)")
    p.add_argument("--benchmark", required=True, choices=sorted(BENCHMARKS), help="benchmark to run")
    p.add_argument("--data", required=True, help="the benchmark's annotation file in its published layout")
    p.add_argument("--out", default="bench_out", help="folder for run.jsonl (resumable) and the results card")
    p.add_argument("--media-root", help="folder that relative media paths start from (default: the data file's folder)")
    p.add_argument("--checkpoint", help="checkpoint of the reward (local folder or hub id)")
    p.add_argument("--weights", default="pretrained", choices=["pretrained", "random"])
    p.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda when available)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--zero-margin", default="wrong", choices=["wrong", "half", "drop"],
                   help="credit of an exact model tie on a human-decided pair")
    p.add_argument("--parse-failure", default="wrong", choices=["random", "wrong", "half", "drop"],
                   help="credit of an unparsable judge verdict (random = the seeded coin of Multimodal RewardBench)")
    p.add_argument("--orders", default="AB,BA", help="judge orders to ask: AB, BA or AB,BA")
    p.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples for the confidence intervals")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--validation", help="Pick-a-Pic validation file, used to tune the tie threshold")
    p.add_argument("--tie-threshold", type=float, help="Pick-a-Pic: fixed tie threshold instead of tuning")
    p.add_argument("--perspective", help="MJ-Bench perspective (alignment, safety, quality)")
    p.add_argument("--num-frames", type=int, default=None,
                   help="frames sampled per video by the judge or reward (video benchmarks); recorded in the card")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="extra benchmark loader option")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def parse_key_values(pairs: Sequence[str], flag: str, as_json: bool = False) -> dict:
    """KEY=VALUE strings -> dict; values read as JSON (true, 3, 0.5, "x") when as_json, else kept as text."""
    out = {}
    for kv in pairs:
        key, sep, value = kv.partition("=")
        if not sep or not key:
            raise ConfigError(f"{flag} expects KEY=VALUE, got {kv!r}")
        if as_json:
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                pass  # a bare string such as backend=openai
        out[key] = value
    return out


def _orders(text: str) -> tuple[str, ...]:
    from vlm_rm.bench.suites.base import ORDERS

    orders = tuple(o.strip() for o in text.split(",") if o.strip())
    if not orders or any(o not in ORDERS for o in orders):
        raise ConfigError(f"--orders must be AB, BA or AB,BA; got {text!r}")
    return orders


def check_args(args: argparse.Namespace) -> None:
    """What can be checked before a model is loaded: files, numbers, the orders."""
    from pathlib import Path

    for flag, path in (("--data", args.data), ("--validation", args.validation), ("--media-root", args.media_root)):
        if path is not None and not Path(path).exists():
            raise ConfigError(f"{flag} {path} does not exist; pass the benchmark's file or folder as published")
    from mmreward.output_paths import check_output_folder

    # a file, a folder under a file, a read-only place: one line now, not a traceback after loading the model
    check_output_folder(args.out, "--out")
    if args.batch_size < 1:
        raise ConfigError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.num_frames is not None and args.num_frames < 1:
        raise ConfigError(f"--num-frames must be >= 1, got {args.num_frames}")
    if args.n_boot < 0:
        raise ConfigError(f"--n-boot must be >= 0, got {args.n_boot}")
    _orders(args.orders)


def run(args: argparse.Namespace) -> int:
    from vlm_rm.bench.api import run_benchmark
    from vlm_rm.bench.results import EvalPolicy

    if (args.reward is None) == (args.judge is None):
        raise ConfigError("pass exactly one of --reward NAME (a reward or a registered judge) or --judge NAME|pkg.module:factory")
    check_args(args)
    options = parse_key_values(args.option, "--option")
    load_options = parse_key_values(args.load_option, "--load-option", as_json=True)
    from mmreward.registry import refuse_load_arguments

    # dtype has no flag here, so it may go through --load-option
    refuse_load_arguments(load_options, "--load-option", "use --checkpoint, --device or --weights",
                          ("checkpoint", "device", "weights"))
    if args.validation:
        options["validation"] = args.validation
    if args.perspective:
        options["perspective"] = args.perspective
    policy = EvalPolicy(zero_margin=args.zero_margin, parse_failure=args.parse_failure, n_boot=args.n_boot,
                        seed=args.seed, pickapic_threshold=args.tie_threshold)
    from vlm_rm.bench.judges import resolve_judge_factory
    from vlm_rm.bench.registry_judge import is_text_judge, judge_from_reward
    from vlm_rm.bench.suites import get_benchmark

    kwargs = {}
    name = args.reward or args.judge
    info = {"checkpoint": args.checkpoint, "weights": args.weights, **({"load_options": load_options} if load_options else {})}
    if args.judge and ":" in args.judge:
        if args.num_frames is not None:
            raise ConfigError("--num-frames applies to registered judges and rewards; a judge factory samples its own frames")
        kwargs["judge"] = resolve_judge_factory(args.judge)()
        info = {"judge": args.judge}
    else:
        import mmreward

        reward = mmreward.load(name, checkpoint=args.checkpoint, device=args.device, weights=args.weights, **load_options)
        judge_mode = args.judge is not None or (
            is_text_judge(reward) and get_benchmark(args.benchmark).judge_template is not None and not args.pointwise
        )
        if judge_mode:
            # the registered judge answers the benchmark's own pairwise question
            kwargs["judge"] = judge_from_reward(reward, num_frames=args.num_frames)
            info["judge"] = name
        else:
            if args.num_frames is not None:
                if not hasattr(reward, "num_frames"):
                    raise ConfigError(f"--num-frames: reward '{name}' has no frame-sampling setting; "
                                      "leave the flag out or use a video reward that samples frames")
                reward.num_frames = args.num_frames  # the reward's own sampler reads it at scoring time
            kwargs["reward"] = reward
            info["reward"] = name
    if args.num_frames is not None:
        info["num_frames"] = args.num_frames
    from mmreward.output_paths import is_write_error, output_error

    try:
        results = run_benchmark(args.benchmark, args.data, args.out, policy=policy, media_root=args.media_root,
                                options=options, orders=_orders(args.orders), batch_size=args.batch_size,
                                progress=not args.quiet, run_info=info, **kwargs)
    except OSError as exc:
        if not is_write_error(exc):
            raise
        raise output_error(exc, f"--out {args.out}") from None  # e.g. a full disk while writing run.jsonl
    print(json.dumps({k: v.to_json() for k, v in results.metrics.items()}, indent=2))
    print(f"results card: {args.out}/results.md")
    n_failed = results.counts.get("failed_items", 0)
    if n_failed:
        import sys

        # like `mmreward score`: the run finished, but some items are missing from the metrics
        print(f"vlm-rm bench: {n_failed} of {results.counts['items_total']} items failed and are excluded from the "
              f"metrics; see the 'error' field of their lines in {args.out}/run.jsonl (a rerun retries them)",
              file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    import sys

    from mmreward.cli import OneLineArgumentParser, run_main

    parser = OneLineArgumentParser(prog="vlm-rm")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return run_main(parser, ["bench", *(sys.argv[1:] if argv is None else argv)], run, "vlm-rm")
