"""Overheads and memory of diffusion_rl on a video model (Wan), measured side by side in one run:

1. rollout with log-probs (Flow-SDE on every step, CFG, decoding to (B, T, 3, H, W)) / WanPipeline's own
   sampling at the same steps with the same Euler scheduler, from the same prompt embeddings and noise
2. one trainer minibatch step (LoRA, PPO-clip over the trained steps) / the bare forward + backward +
   optimiser step of the same LoRA model on the same inputs
3. the peak memory (and time) of one trainer minibatch step for each frames x resolution of a grid, with
   the number of latent tokens, so the growth can be read against frames x H x W

    python benchmarks/rl_step.py --family wan [--pretrained WAN_DIR] [--frames 9] [--size 32]
    python benchmarks/rl_step_video.py --mem-frames 5,9,17 --mem-sizes 32,64 --json wan_memory.json

Memory: on CUDA torch.cuda.max_memory_allocated above the allocation before the call; on CPU the process's
peak RSS above the RSS before the call, sampled every millisecond (benchmarks/_timing.py says how), which
includes the allocator's and the autograd engine's overhead and so is an upper bound with some noise.
Without --pretrained the test kit's tiny WanPipeline is built from config (random weights).
Wan 2.2 A14B (two experts) and Wan image-to-video have their overhead rows in benchmarks/rl_step_families.py
(`rl_step.py --family wan22` / `--family wan_i2v`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks._timing import memory_metric, peak_memory_mb, timed


class UsageError(Exception):
    """A bad command line (exit status 2, one line)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        raise UsageError(message)


def _ints(text: str) -> list[int]:
    try:
        vals = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers like 5,9,17, got {text!r}")
    return vals


def _resolutions(text: str) -> list[tuple[int, int]]:
    """'32,64' (squares) or '480x832,240x416' (height x width)."""
    out = []
    for item in text.split(","):
        h, _, w = item.partition("x")
        try:
            hw = (int(h), int(w or h))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected sides like 32,64 or 480x832, got {text!r}") from None
        if min(hw) < 1:
            raise argparse.ArgumentTypeError(f"sides must be positive, got {item!r}")
        out.append(hw)
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = _Parser(prog="rl_step_video.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pretrained", help="a WanPipeline folder (default: the test kit's tiny Wan, random weights)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default=None, help="default: bf16 on CUDA, fp32 on CPU")
    p.add_argument("--frames", type=int, default=9, help="frames of the overhead rows")
    p.add_argument("--size", type=int, default=32, help="square side of the overhead rows, in pixels")
    p.add_argument("--height", type=int, default=None, help="height of the overhead rows (default: --size)")
    p.add_argument("--width", type=int, default=None, help="width of the overhead rows (default: --size)")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--guidance", type=float, default=5.0)
    p.add_argument("--max-sequence-length", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--mem-frames", type=_ints, default=[5, 9, 17], help="frame counts of the memory grid")
    p.add_argument("--mem-sizes", type=_resolutions, default=[(32, 32), (64, 64)],
                   help="resolutions of the memory grid: squares (32,64) or HxW (480x832)")
    p.add_argument("--skip-overheads", action="store_true", help="only the memory grid")
    p.add_argument("--json", type=Path, default=None, help="also write the report here (atomically)")
    args = p.parse_args(argv)
    args.device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda but torch sees no CUDA device; pass --device cpu")
    args.dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype or
                                                                 ("bf16" if args.device.type == "cuda" else "fp32")]
    args.height, args.width = args.height or args.size, args.width or args.size
    for name in ("frames", "size", "height", "width", "batch", "steps", "repeats", "max_sequence_length"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


def _pipeline(pretrained: str, args: argparse.Namespace):
    from diffusers import FlowMatchEulerDiscreteScheduler

    from diffusion_rl.pipelines import load_pipeline

    pipe = load_pipeline(pretrained, args.dtype, args.device)
    # our rollouts use flow-matching Euler at the pipeline's shift; the base runs the same scheduler
    shift = float(pipe.scheduler.config.get("flow_shift", None) or pipe.scheduler.config.get("shift", 1.0))
    pipe.scheduler = FlowMatchEulerDiscreteScheduler(shift=shift)
    return pipe


def _trainer(pretrained: str, frames: int, height: int, width: int, args: argparse.Namespace, out: Path):
    """A LoRA GRPO trainer on a freshly loaded pipeline (LoRA is added in place) making `frames` x size x size
    clips (height x width), with one collected, scored batch."""
    pipe = _pipeline(pretrained, args)
    from diffusion_rl.config import from_dict

    model: dict[str, Any] = {"pretrained": pretrained, "height": height, "width": width, "lora": True,
                             "max_sequence_length": args.max_sequence_length, "num_frames": frames}
    cfg = from_dict({
        "model": model,
        "sample": {"num_steps": args.steps, "guidance_scale": args.guidance, "kernel": "flow_sde",
                   "noise_level": 0.7, "prompts_per_iteration": 1, "group_size": args.batch,
                   "batch_size": args.batch},
        "train": {"iterations": 1, "timestep_fraction": 0.5, "micro_batch_size": args.batch, "probe": "off",
                  "kl_beta": 0.0, "max_grad_norm": 1.0,
                  "mixed_precision": "bf16" if args.dtype == torch.bfloat16 else "no"},
        "reward": {"rewards": {"mock": 1.0}},
        "prompts": {"train": ["a red circle moving left"]},
        "log": {"output_dir": str(out), "progress": False},
    })
    from diffusion_rl.trainer import Trainer

    trainer = Trainer(cfg, pipeline=pipe)
    samples = trainer.sde_rollout(trainer.inputs(0))  # rollout and rewards
    samples.advantages, _ = trainer.algorithm.advantages(samples)
    batch = samples.batch
    return trainer, batch


def overheads(pretrained: str, pipe, args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    from diffusion_rl.kernels import Kernel
    from diffusion_rl.pipelines import make_adapter
    from diffusion_rl.rollout import rollout

    n = args.batch
    adapter = make_adapter(pipe, args.height, args.width, args.max_sequence_length, num_frames=args.frames)
    emb = adapter.encode(["a red circle moving left"]).expand(n)
    kernel = Kernel("flow_sde", 0.7)

    def ours():
        with torch.no_grad():
            return rollout(adapter, emb, list(range(n)), [0] * n, num_steps=args.steps, guidance_scale=args.guidance,
                           kernel=kernel).images

    x_t = rollout(adapter, emb, list(range(n)), [0] * n, num_steps=1, guidance_scale=args.guidance, kernel=kernel,
                  decode=False).latents[:, 0]
    kw = dict(emb.tensors)
    if adapter.uses_cfg(args.guidance):
        kw.update({f"negative_{k}": v for k, v in adapter.negative().expand(n).tensors.items()})

    def plain():
        with torch.no_grad():
            return pipe(num_inference_steps=args.steps, guidance_scale=args.guidance, height=args.height,
                        width=args.width, num_frames=args.frames, latents=x_t.clone().to(adapter.model_dtype), output_type="pt",
                        max_sequence_length=args.max_sequence_length, **kw).frames

    rows = [_row("rollout_vs_sampling", "rollout with log-probs", "WanPipeline sampling (Euler)", ours, plain, args)]
    trainer, batch = _trainer(pretrained, args.frames, args.height, args.width, args, tmp / "run")
    idx = torch.arange(len(batch.slots))
    k = batch.train_steps.shape[1]
    traj, sel = batch.traj, torch.arange(len(idx))
    model, opt, ad = trainer.policy.model, trainer.policy.optimizer, trainer.adapter

    def trainer_step():
        trainer.minibatch_step(batch, idx, probe=False)

    def bare_step():
        for s in range(k):
            st = batch.train_steps[:, s]
            with trainer.accelerator.autocast():
                # the trajectory keeps timesteps (and offloaded latents) on the CPU; the trainer moves them too
                out = ad.predict(model, traj.latents[sel, st].to(args.device), traj.schedule.timesteps[st].to(args.device),
                                 traj.embeds, args.guidance)
            (out.float().square().mean() / k).backward()
        torch.nn.utils.clip_grad_norm_(trainer.trainable, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    rows.append(_row("train_vs_fwd_bwd", f"trainer step ({k} trained steps)", "bare fwd+bwd+step", trainer_step,
                     bare_step, args))
    return rows


def _row(measure: str, ours: str, base: str, fn_ours, fn_base, args: argparse.Namespace) -> dict[str, Any]:
    t_o, t_b = timed(fn_ours, args.repeats, args.device), timed(fn_base, args.repeats, args.device)
    m_o, m_b = peak_memory_mb(fn_ours, args.device), peak_memory_mb(fn_base, args.device)
    return {"measure": measure, "ours": ours, "base": base, "ours_s": t_o, "base_s": t_b, "time_ratio": t_o / t_b,
            "ours_peak_mb": m_o, "base_peak_mb": m_b}


def memory_grid(pretrained: str, args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    """Peak memory and time of one trainer minibatch step per (frames, size) point."""
    rows = []
    for height, width in args.mem_sizes:
        for frames in args.mem_frames:
            trainer, batch = _trainer(pretrained, frames, height, width, args, tmp / f"mem_{frames}_{height}x{width}")
            idx = torch.arange(len(batch.slots))

            def step(trainer=trainer, batch=batch, idx=idx):
                trainer.minibatch_step(batch, idx, probe=False)

            t = timed(step, 1, args.device, reduce="min")
            m = peak_memory_mb(step, args.device)
            shape = trainer.adapter.latent_shape()  # (C, T', H', W')
            patch = trainer.adapter.denoiser.config.patch_size
            tokens = (shape[1] // patch[0]) * (shape[2] // patch[1]) * (shape[3] // patch[2])
            rows.append({"frames": frames, "height": height, "width": width, "latent_frames": int(shape[1]),
                         "tokens": int(tokens), "pixels": frames * height * width, "step_s": t, "peak_mb": m,
                         "trained_steps": int(batch.train_steps.shape[1]), "batch": len(idx)})
            del trainer, batch
    return rows


def format_table(report: dict[str, Any]) -> str:
    lines = [f"model {report['model']}  device {report['device']}  dtype {report['dtype']}  batch {report['batch']}  "
             f"steps {report['steps']}  CFG {report['guidance']}",
             f"memory: {report['memory_metric']}"]
    if report["overheads"]:
        lines.append(f"overheads at {report['frames']} frames, {report['height']}x{report['width']}:")
        lines.append(f"{'measure':<20}{'ours s':>10}{'base s':>10}{'ratio':>8}{'ours MiB':>10}{'base MiB':>10}")
        for r in report["overheads"]:
            lines.append(f"{r['measure']:<20}{r['ours_s']:10.4f}{r['base_s']:10.4f}{r['time_ratio']:8.3f}"
                         f"{r['ours_peak_mb']:10.1f}{r['base_peak_mb']:10.1f}")
    lines.append("one trainer minibatch step vs frames x resolution:")
    lines.append(f"{'frames':>7}{'HxW':>10}{'lat T':>7}{'tokens':>8}{'step s':>9}{'peak MiB':>10}")
    for r in report["memory"]:
        lines.append(f"{r['frames']:>7}{str(r['height']) + 'x' + str(r['width']):>10}{r['latent_frames']:>7}{r['tokens']:>8}{r['step_s']:9.3f}"
                     f"{r['peak_mb']:10.1f}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The report (overheads and memory grid) for parsed arguments; benchmarks/gpu_scale.py calls this too."""
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        pretrained = args.pretrained
        if pretrained is None:
            from mmreward.testing.tiny_models import save_tiny_pipeline

            pretrained = str(save_tiny_pipeline("wan", tmp / "wan"))
        report: dict[str, Any] = {
            "model": args.pretrained or "tiny WanPipeline (test kit, random weights)",
            "device": torch.cuda.get_device_name(args.device) if args.device.type == "cuda" else "cpu",
            "threads": torch.get_num_threads(), "dtype": str(args.dtype).removeprefix("torch."), "batch": args.batch,
            "steps": args.steps, "guidance": args.guidance, "frames": args.frames, "height": args.height, "width": args.width,
            "memory_metric": memory_metric(args.device), "overheads": [], "memory": []}
        if not args.skip_overheads:
            report["overheads"] = overheads(pretrained, _pipeline(pretrained, args), args, tmp)
        report["memory"] = memory_grid(pretrained, args, tmp)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except UsageError as exc:
        print(f"rl_step_video.py: error: {exc}", file=sys.stderr)
        return 2
    report = run(args)
    print(format_table(report), flush=True)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_path = tempfile.mkstemp(dir=args.json.parent, prefix=f".{args.json.name}.")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(report, f, indent=1)
            os.replace(tmp_path, args.json)  # atomic
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp_path)
            raise
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
