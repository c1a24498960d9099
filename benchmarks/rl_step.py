"""Overheads of diffusion_rl measured side by side in one run (targets from the issue):

1. rollout with log-probs (Flow-SDE on every step, CFG) / the pipeline's own sampling at the same steps,
   both from precomputed prompt embeddings and decoding to images           target <= 1.10
2. one trainer minibatch step (PPO-clip over k steps, no KL) / the bare forward + backward + optimiser
   step of the same model on the same inputs                                target <= 1.15

    python benchmarks/rl_step.py [--pretrained PIPELINE_DIR] [--size 64] [--batch 8] [--steps 10]
    python benchmarks/rl_step.py --family wan [...]   # video: benchmarks/rl_step_video.py (its own options),
                                                      # with the peak memory of a step vs frames x resolution
    python benchmarks/rl_step.py --family qwen_image  # also z_image, flux2, flux2_klein, wan22 (two experts),
                                                      # wan_i2v: benchmarks/rl_step_families.py, one row

Without --pretrained a tiny SD3 pipeline is built from config (random weights, real CLIP tokenizer).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):  # run as a script: the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks._timing import timed as _median_time


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--family" in argv or any(a.startswith("--family=") for a in argv):
        family = argparse.ArgumentParser(add_help=False)
        family.add_argument("--family", default="image")
        known, rest = family.parse_known_args(argv)
        from benchmarks import rl_step_families

        newer = sorted(rl_step_families.FAMILIES)
        if known.family not in ("image", "wan", *newer):
            print(f"rl_step.py: error: --family must be 'image' (SD3/FLUX/SD, default), 'wan' or one of {newer}, "
                  f"got {known.family!r}", file=sys.stderr)
            return 2
        if known.family == "wan":  # video models have their own script (frames, memory grid)
            from benchmarks import rl_step_video

            return rl_step_video.main(rest)
        if known.family in newer:  # one row of benchmarks/rl_step_families.py
            return rl_step_families.main(["--families", known.family, *rest])
        argv = rest
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pretrained", help="a StableDiffusion3/FLUX/SD pipeline folder (default: tiny SD3)")
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--guidance", type=float, default=4.5)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    from diffusion_rl.config import from_dict
    from diffusion_rl.kernels import Kernel
    from diffusion_rl.pipelines import load_pipeline, make_adapter
    from diffusion_rl.rollout import rollout
    from diffusion_rl.trainer import Trainer

    tmp = tempfile.TemporaryDirectory()
    pretrained = args.pretrained
    if pretrained is None:
        from mmreward.testing.tiny_models import save_tiny_pipeline

        pretrained = str(save_tiny_pipeline("sd3", f"{tmp.name}/sd3"))
    pipe = load_pipeline(pretrained)
    adapter = make_adapter(pipe, args.size, args.size)
    prompts = [f"a red circle number {i}" for i in range(args.batch)]
    emb = adapter.encode(prompts)
    kernel = Kernel("ddim", 1.0) if not adapter.is_flow else Kernel("flow_sde", 0.7)

    def ours():
        return rollout(adapter, emb, list(range(args.batch)), [0] * args.batch, num_steps=args.steps,
                       guidance_scale=args.guidance, kernel=kernel)

    x_t = ours().latents[:, 0]
    kw = dict(emb.tensors)
    if adapter.uses_cfg(args.guidance):
        neg = adapter.negative().expand(args.batch)
        kw.update({f"negative_{k}": v for k, v in neg.tensors.items()})
    if adapter.family == "flux":
        kw.pop("negative_prompt_embeds", None)
        kw.pop("negative_pooled_prompt_embeds", None)

    @torch.no_grad()
    def plain():
        return pipe(num_inference_steps=args.steps, guidance_scale=args.guidance, height=args.size, width=args.size,
                    latents=x_t.clone().to(adapter.model_dtype), output_type="pt", **kw).images

    t_ours = _median_time(ours, args.repeats)
    t_plain = _median_time(plain, args.repeats)

    # -- trainer step vs bare forward/backward -------------------------------------------------
    cfg = from_dict({
        "model": {"pretrained": pretrained, "height": args.size, "width": args.size, "lora": False},
        "sample": {"num_steps": args.steps, "guidance_scale": args.guidance, "kernel": kernel.name,
                   "noise_level": kernel.noise_level, "prompts_per_iteration": 1, "group_size": args.batch,
                   "batch_size": args.batch},
        "train": {"iterations": 1, "timestep_fraction": 0.3, "micro_batch_size": args.batch, "probe": "off",
                  "kl_beta": 0.0, "max_grad_norm": 1.0},
        "reward": {"rewards": {"mock": 1.0}},
        "prompts": {"train": ["a red circle"]},
        "log": {"output_dir": f"{tmp.name}/run", "progress": False},
    })
    trainer = Trainer(cfg, pipeline=load_pipeline(pretrained))
    samples = trainer.sde_rollout(trainer.inputs(0))  # rollout and rewards
    samples.advantages, _ = trainer.algorithm.advantages(samples)
    batch = samples.batch
    idx = torch.arange(len(batch.slots))
    k = batch.train_steps.shape[1]
    traj = batch.traj
    rows = torch.arange(len(idx))

    def trainer_step():
        trainer.minibatch_step(batch, idx, probe=False)

    model, opt, ad = trainer.policy.model, trainer.policy.optimizer, trainer.adapter

    def bare_step():
        for s in range(k):
            steps = batch.train_steps[:, s]
            x = traj.latents[rows, steps]
            t = traj.schedule.timesteps[steps]
            out = ad.predict(model, x, t, traj.embeds, args.guidance)
            (out.float().square().mean() / k).backward()
        torch.nn.utils.clip_grad_norm_(trainer.trainable, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    t_train = _median_time(trainer_step, args.repeats)
    t_bare = _median_time(bare_step, args.repeats)
    print(f"model: {type(pipe).__name__} ({pretrained}), {args.size}x{args.size}, batch {args.batch}, "
          f"{args.steps} steps, CFG {args.guidance}, kernel {kernel.name}, {k} trained steps")
    print(f"rollout with log-probs: {t_ours * 1e3:8.1f} ms   pipeline sampling: {t_plain * 1e3:8.1f} ms   "
          f"ratio {t_ours / t_plain:.3f} (target <= 1.10)")
    print(f"trainer step:           {t_train * 1e3:8.1f} ms   bare fwd+bwd+step: {t_bare * 1e3:8.1f} ms   "
          f"ratio {t_train / t_bare:.3f} (target <= 1.15)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
