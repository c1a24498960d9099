"""Rollout and trainer-step overheads of the newer generator families at tiny geometry, one row per family,
measured side by side in one run (the same two ratios as benchmarks/rl_step.py):

1. encode + rollout with log-probs (Flow-SDE on every step, the family's CFG or guidance embedding, decoded to
   [0, 1]) / the pipeline's own `__call__` at the same steps and geometry. Both start from text prompts, since
   these pipelines take their embeddings in family-specific shapes (Z-Image's per-prompt lists, Qwen-Image's
   masks, FLUX.2's packed ids): each side encodes its prompts once per call (the rollout caches the negative
   prompt; the pipeline encodes it again), a small share next to the denoising steps.
2. one trainer minibatch step (LoRA, PPO-clip over the trained steps, no KL) / the bare forward + backward +
   optimiser step of the same LoRA model on the same inputs (`adapter.predict`, a squared-output loss).

    python benchmarks/rl_step_families.py [--families qwen_image z_image ...] [--batch 2] [--steps 4]
    python benchmarks/rl_step.py --family qwen_image [...]   # the same, one family

Families and their tiny pipelines (random weights, built from config by mmreward/testing/tiny_*.py):
qwen_image (QwenImagePipeline, true CFG with the negative prompt " "), qwen_image21 (QwenImage21Pipeline, the same
true CFG without the norm rescale, uncached; its RGBA images composited over white as the rollout decodes), z_image (ZImagePipeline, CFG), flux2
(Flux2Pipeline, guidance embedding), flux2_klein (Flux2KleinPipeline, CFG), wan22 (WanPipeline with two experts
switched at boundary_ratio 0.875; the pipeline runs the Euler scheduler the rollout uses), wan_i2v
(WanImageToVideoPipeline, two experts, one first frame for every prompt).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks._timing import timed


@dataclass(frozen=True)
class Family:
    """How to build, drive and call one family's tiny pipeline."""

    save: Callable[[Path], Path]  # writes the tiny pipeline folder, returns it
    size: int
    max_sequence_length: int
    guidance: float
    frames: int | None = None  # video families
    first_frame: bool = False  # image-to-video: prompts are edit records, the pipeline takes `image`
    call_kwargs: Callable[[float, int], dict[str, Any]] = lambda g, n: {"guidance_scale": g}
    takes_max_sequence_length: bool = True  # the pipeline's __call__ has the keyword (QwenImage21Pipeline: no)
    # the pipeline's "pt" images as the rollout decodes them (QwenImage21Pipeline: RGBA composited over white)
    images: Callable[[torch.Tensor], torch.Tensor] = lambda x: x


def _save_qwen(path: Path) -> Path:
    from mmreward.testing.tiny_qwen_image import save_tiny_qwen_image_pipeline

    return save_tiny_qwen_image_pipeline(path)


def _save_qwen21(path: Path) -> Path:
    from mmreward.testing.tiny_qwen_image21 import save_tiny_qwen_image21_pipeline

    return save_tiny_qwen_image21_pipeline(path)


def _over_white(rgba: torch.Tensor) -> torch.Tensor:
    return rgba[:, :3] * rgba[:, 3:] + (1 - rgba[:, 3:])


def _save_z_image(path: Path) -> Path:
    from mmreward.testing.tiny_z_image import save_tiny_z_image_pipeline

    return save_tiny_z_image_pipeline(path)


def _save_flux2(kind: str) -> Callable[[Path], Path]:
    def save(path: Path) -> Path:
        from mmreward.testing.tiny_flux2 import save_tiny_flux2

        return save_tiny_flux2(path, kind)

    return save


def _save_wan22(kind: str) -> Callable[[Path], Path]:
    def save(path: Path) -> Path:
        from mmreward.testing.tiny_wan22 import save_tiny_wan22

        return save_tiny_wan22(kind, path)

    return save


FAMILIES: dict[str, Family] = {
    # QwenImagePipeline's CFG is true_cfg_scale with a negative prompt (guidance_scale is for distilled models)
    "qwen_image": Family(_save_qwen, 32, 16, 4.0,
                         call_kwargs=lambda g, n: {"true_cfg_scale": g, "negative_prompt": [" "] * n}),
    # QwenImage21Pipeline: the same true CFG without the norm rescale, no KV cache (the rollout runs uncached)
    "qwen_image21": Family(_save_qwen21, 32, 512, 4.0, takes_max_sequence_length=False, images=_over_white,
                           call_kwargs=lambda g, n: {"true_cfg_scale": g, "negative_prompt": [" "] * n,
                                                     "use_kv_cache": False}),
    "z_image": Family(_save_z_image, 32, 32, 5.0),
    "flux2": Family(_save_flux2("dev"), 32, 48, 4.0),
    "flux2_klein": Family(_save_flux2("klein"), 32, 48, 4.0),
    "wan22": Family(_save_wan22("t2v"), 32, 16, 5.0, frames=9),
    "wan_i2v": Family(_save_wan22("i2v"), 32, 16, 5.0, frames=9, first_frame=True),
}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="rl_step_families.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", nargs="+", choices=sorted(FAMILIES), default=list(FAMILIES))
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = p.parse_args(argv)
    for name in ("batch", "steps", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    return args


def _pipeline(folder: str, fam: Family):
    from diffusion_rl.pipelines import load_pipeline

    pipe = load_pipeline(folder)
    if fam.frames is not None:  # Wan ships UniPC; the rollout is the pipeline run with flow-matching Euler
        from diffusers import FlowMatchEulerDiscreteScheduler

        pipe.scheduler = FlowMatchEulerDiscreteScheduler(shift=float(pipe.scheduler.config.flow_shift))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _prompts(fam: Family, n: int, tmp: Path) -> tuple[list[Any], Any]:
    """The rollout's prompts (edit records for image-to-video) and the image the pipeline is called with."""
    texts = [f"a red circle number {i}" for i in range(n)]
    if not fam.first_frame:
        return texts, None
    import numpy as np
    from PIL import Image

    from mmreward.edit import EditPrompt

    path = tmp / "first_frame.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (fam.size, fam.size, 3), dtype=np.uint8)).save(path)
    return [EditPrompt(t, path) for t in texts], Image.open(path).convert("RGB")


def bench_family(name: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    from diffusion_rl.config import from_dict
    from diffusion_rl.kernels import Kernel
    from diffusion_rl.pipelines import make_adapter
    from diffusion_rl.rollout import rollout
    from diffusion_rl.trainer import Trainer

    fam, n, g = FAMILIES[name], args.batch, FAMILIES[name].guidance
    folder = str(fam.save(tmp / name))
    pipe = _pipeline(folder, fam)
    adapter = make_adapter(pipe, fam.size, fam.size, fam.max_sequence_length, num_frames=fam.frames)
    prompts, image = _prompts(fam, n, tmp)
    texts = [str(p) for p in prompts]
    kernel = Kernel("flow_sde", 0.7)

    @torch.no_grad()
    def ours():
        return rollout(adapter, adapter.encode(prompts), list(range(n)), [0] * n, num_steps=args.steps,
                       guidance_scale=g, kernel=kernel).images

    video = {} if fam.frames is None else {"num_frames": fam.frames}
    if fam.takes_max_sequence_length:
        video["max_sequence_length"] = fam.max_sequence_length
    extra = {} if image is None else {"image": image}

    @torch.no_grad()
    def plain():
        out = pipe(prompt=texts, num_inference_steps=args.steps, height=fam.size, width=fam.size, output_type="pt",
                   generator=torch.Generator().manual_seed(0), **fam.call_kwargs(g, n), **video, **extra)
        return out.frames if fam.frames is not None else fam.images(out.images)

    if ours().shape != plain().shape:  # both sides must make the same media, or the ratio compares other work
        raise RuntimeError(f"{name}: rollout makes {tuple(ours().shape)}, the pipeline {tuple(plain().shape)}")
    # the minimum over repeats: on a shared machine other load only ever adds time
    t_ours, t_plain = timed(ours, args.repeats, reduce="min"), timed(plain, args.repeats, reduce="min")

    # -- trainer step vs bare forward/backward -------------------------------------------------
    train_prompts: Any = texts
    if fam.first_frame:
        rows = tmp / f"{name}_first_frames.jsonl"
        rows.write_text("".join(json.dumps({"source_image": str(p.source), "instruction": str(p)}) + "\n"
                                for p in prompts[:1]))
        train_prompts = str(rows)
    model = {"pretrained": folder, "height": fam.size, "width": fam.size, "lora": True,
             "max_sequence_length": fam.max_sequence_length}
    if fam.frames is not None:
        model["num_frames"] = fam.frames
    cfg = from_dict({
        "model": model,
        "sample": {"num_steps": args.steps, "guidance_scale": g, "kernel": "flow_sde", "noise_level": 0.7,
                   "prompts_per_iteration": 1, "group_size": n, "batch_size": n},
        "train": {"iterations": 1, "timestep_fraction": 0.5, "micro_batch_size": n, "probe": "off", "kl_beta": 0.0,
                  "max_grad_norm": 1.0},
        "advantage": {"min_count": 2},
        "reward": {"rewards": {"mock": 1.0}},
        "prompts": {"train": train_prompts if fam.first_frame else texts[:1]},
        "log": {"output_dir": str(tmp / f"{name}_run"), "progress": False},
    })
    trainer = Trainer(cfg, pipeline=_pipeline(folder, fam))
    samples = trainer.sde_rollout(trainer.inputs(0))  # rollout and rewards
    samples.advantages, _ = trainer.algorithm.advantages(samples)
    batch = samples.batch
    idx = torch.arange(len(batch.slots))
    k = batch.train_steps.shape[1]
    traj, sel = batch.traj, torch.arange(len(idx))
    policy_model, opt, ad = trainer.policy.model, trainer.policy.optimizer, trainer.adapter

    def trainer_step():
        trainer.minibatch_step(batch, idx, probe=False)

    def bare_step():
        for s in range(k):
            st = batch.train_steps[:, s]
            out = ad.predict(policy_model, traj.latents[sel, st], traj.schedule.timesteps[st], traj.embeds, g)
            (out.float().square().mean() / k).backward()
        torch.nn.utils.clip_grad_norm_(trainer.trainable, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    t_train, t_bare = timed(trainer_step, args.repeats, reduce="min"), timed(bare_step, args.repeats, reduce="min")
    return {"family": name, "pipeline": type(pipe).__name__, "size": fam.size, "frames": fam.frames, "batch": n,
            "steps": args.steps, "guidance": g, "trained_steps": k,
            "rollout_s": t_ours, "sampling_s": t_plain, "rollout_ratio": t_ours / t_plain,
            "trainer_s": t_train, "bare_s": t_bare, "trainer_ratio": t_train / t_bare}


def format_table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'family':<12}{'pipeline':<28}{'geometry':>12}{'rollout s':>11}{'sampling s':>12}{'ratio':>7}"
             f"{'trainer s':>11}{'bare s':>9}{'ratio':>7}"]
    for r in rows:
        geom = f"{r['size']}px" + (f" x{r['frames']}" if r["frames"] else "")
        lines.append(f"{r['family']:<12}{r['pipeline']:<28}{geom:>12}{r['rollout_s']:11.4f}{r['sampling_s']:12.4f}"
                     f"{r['rollout_ratio']:7.3f}{r['trainer_s']:11.4f}{r['bare_s']:9.4f}{r['trainer_ratio']:7.3f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp_name:
        for name in args.families:
            rows.append(bench_family(name, args, Path(tmp_name)))
            print(format_table(rows[-1:]).splitlines()[-1] if len(rows) > 1 else format_table(rows), flush=True)
    print(f"batch {args.batch}, {args.steps} steps, Flow-SDE 0.7 on every step, LoRA, CPU threads "
          f"{torch.get_num_threads()}; ratios: rollout / pipeline sampling (target <= 1.10), trainer step / bare "
          "fwd+bwd+step (target <= 1.15)")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
