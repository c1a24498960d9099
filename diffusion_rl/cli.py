"""`diffusion-rl` command line: one subcommand per entry point, each a `main(argv)` callable from tests.

    diffusion-rl train --config configs/shapes_grpo.yaml [section.key=value ...]
    diffusion-rl config --preset flow_grpo reward.rewards='{pickscore: 1}'   # print a resolved config as YAML
    diffusion-rl config --config configs/flow_grpo_sd35_ocr.yaml --check    # resolve it offline, weights aside
    diffusion-rl config --help-keys                   # every key with its type, default and help
    accelerate launch --num_processes 2 -m diffusion_rl train --config FILE   # data parallel
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import yaml

from diffusion_rl.usage_errors import USAGE_ERRORS, one_line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="diffusion-rl", description="Reward fine-tuning of diffusion and flow models")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command")
    train = sub.add_parser("train", help="run Flow-GRPO / DanceGRPO / Pref-GRPO / DDPO from a YAML config")
    train.add_argument("--config", help="YAML file with sections model, sample, reward, advantage, train, prompts, log")
    train.add_argument("overrides", nargs="*", help="section.key=value overrides, e.g. train.iterations=5")
    show = sub.add_parser("config", help="print the resolved configuration (preset < file < overrides) as YAML")
    show.add_argument("--config", help="YAML file")
    show.add_argument("--preset", help="start from this preset")
    show.add_argument("--check", action="store_true",
                      help="resolve the config offline (types, presets, reward names and options, prompt files, "
                           "pipeline) without loading weights; print OK and a summary")
    show.add_argument("--num-processes", type=int, default=1,
                      help="with --check: the number of processes the run will use (e.g. 8 GPUs)")
    show.add_argument("--help-keys", action="store_true", help="list every key with its type, default and help")
    show.add_argument("overrides", nargs="*", help="section.key=value overrides")
    from diffusion_rl.inference.cli import add_subcommands

    add_subcommands(sub)  # reno, best-of-n
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        from diffusion_rl import __version__

        print(__version__)
        return 0
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    from diffusion_rl.inference import cli as inference_cli

    if args.command in inference_cli.COMMANDS:
        return inference_cli.run(args)
    from diffusion_rl.config import load_config

    if args.command == "config" and args.help_keys:
        from diffusion_rl.config_check import config_keys, format_keys

        print(format_keys(config_keys()))
        return 0
    overrides = list(args.overrides)
    if getattr(args, "preset", None):
        overrides.insert(0, f"preset={args.preset}")
    try:
        cfg = load_config(args.config, overrides)
        if args.command == "config" and args.check:
            from diffusion_rl.config_check import check_config

            summary = check_config(cfg, args.num_processes)
            print(f"OK {args.config or '(no file)'}: resolves offline (weights are loaded at train time)")
            print("\n".join("  " + line for line in summary))
            return 0
        if args.command == "config":
            print(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
            return 0
        from diffusion_rl.trainer import train

        trainer = train(cfg)
        history = trainer.history
    except USAGE_ERRORS as exc:
        print(f"diffusion-rl {args.command}: {one_line(exc)}", file=sys.stderr)
        return 2
    except OSError as exc:
        from mmreward.output_paths import is_write_error, output_error

        if not is_write_error(exc, disk_only=True):
            raise
        # a full disk (or a read-only mount) while writing checkpoints/metrics: one line; resume_from=latest continues
        print(f"diffusion-rl {args.command}: {one_line(output_error(exc, 'log.output_dir'))}", file=sys.stderr)
        return 2
    if trainer.accelerator.is_main_process:
        evals = [h for h in history if any(k.startswith("eval/") for k in h)]
        if len(evals) >= 2:
            for k in (k for k in evals[-1] if k.startswith("eval/") and not k.endswith("_se")):
                first, last = evals[0].get(k), evals[-1][k]
                if first is not None:
                    print(f"{k}: {first:.4f} -> {last:.4f} (+/- {evals[-1].get(k + '_se', 0):.4f} SE)")
        print(f"outputs in {trainer.out_dir}")
    return 0
