"""Speed and peak memory of diffusion_rl and the reward zoo at the published model geometries (random weights).

Every row times our code against the bare thing it wraps, side by side in one run, and records the peak
memory of each (targets from issue 16; a time ratio is ours / base):

    rollout_vs_sampling   rollout with log-probs (Flow-SDE / DDIM on every step, CFG) vs the pipeline's own
                          sampling at the same steps, both from precomputed prompt embeddings   ratio <= 1.10
    train_vs_fwd_bwd      one Trainer minibatch step (LoRA, PPO-clip over the trained steps) vs the bare
                          forward + backward + optimizer step of the same LoRA model            ratio <= 1.15
    xformers_vs_sdpa      the denoiser's forward with xformers attention vs PyTorch SDPA        ratio <= 1.00
    scoring_vs_forward    reward.score(prompt, images) vs the bare batched forward on already
                          preprocessed, tokenised inputs                       ratio <= 1/0.9 (>= 0.9x speed)

and a cost model: rollout time and peak memory of one pipeline family at three batch sizes, three
resolutions (x = pixels) and three step counts, with the points more than 15 % off the least-squares line.

`--geometry real` builds SD3.5-Medium (24 MMDiT layers, dual attention 0-12), FLUX.1-dev (19 double + 38
single blocks, width 3072), the SDXL UNet, HPSv2 (open_clip ViT-H-14), PickScore (HF CLIP ViT-H-14),
ImageReward (BLIP ViT-L/16 + BERT-base) and Qwen2.5-VL-7B (VQAScore) from their configs with random weights
(no download). The pipelines' VAEs are real too; their text encoders keep the published output widths with
one layer each, because prompts are encoded once and cached and no timed region runs them. Wan 2.1 T2V 1.3B
(30 blocks, 12 heads x 128, its real 3-D VAE, one UMT5 layer of width 4096) runs at its published 81 frames
of 480x832 through benchmarks/rl_step_video.py: rollout vs WanPipeline sampling and trainer vs bare step
(batch 2, the smallest GRPO group), plus the peak memory of one trainer step at 21, 41 and 81 frames. `--geometry reduced` (the default on CPU) keeps
the same code paths with tiny widths and depths at a small resolution; the test suite runs it.

    python benchmarks/gpu_scale.py --geometry real --device cuda --json gpu_scale.json           # all families
    python benchmarks/gpu_scale.py --geometry real --families sd3 hpsv2 vqascore --batch 8 --size 512
    python benchmarks/gpu_scale.py --geometry reduced --device cpu --json /tmp/gpu_scale.json    # CPU smoke
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: the repo root (for `benchmarks` and the packages) on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks._timing import linear_fit_deviation, memory_metric, peak_memory_mb, timed

PIPELINES = ("sd3", "flux", "sdxl", "wan21")
REWARDS = ("hpsv2", "pickscore", "imagereward", "vqascore")
FAMILIES = PIPELINES + REWARDS
# targets as the largest acceptable time ratio ours / base
TARGETS = {"rollout_vs_sampling": 1.10, "train_vs_fwd_bwd": 1.15, "xformers_vs_sdpa": 1.00,
           "scoring_vs_forward": 1 / 0.9}
NONLINEAR = 0.15  # a cost-model point this far (relative) from the least-squares line is reported

# ---------------------------------------------------------------------------------------------------
# published geometries (diffusers / transformers config fields)
# ---------------------------------------------------------------------------------------------------
SD35_MEDIUM_TRANSFORMER = dict(
    sample_size=128, patch_size=2, in_channels=16, out_channels=16, num_layers=24, attention_head_dim=64,
    num_attention_heads=24, joint_attention_dim=4096, caption_projection_dim=1536, pooled_projection_dim=2048,
    pos_embed_max_size=384, dual_attention_layers=tuple(range(13)), qk_norm="rms_norm",
)
FLUX_DEV_TRANSFORMER = dict(
    patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
    num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
    axes_dims_rope=(16, 56, 56),
)
SDXL_UNET = dict(
    sample_size=128, in_channels=4, out_channels=4, layers_per_block=2, block_out_channels=(320, 640, 1280),
    down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
    up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"), attention_head_dim=(5, 10, 20),
    transformer_layers_per_block=(1, 2, 10), cross_attention_dim=2048, use_linear_projection=True,
    addition_embed_type="text_time", addition_time_embed_dim=256, projection_class_embeddings_input_dim=2816,
)
_VAE = dict(in_channels=3, out_channels=3, block_out_channels=(128, 256, 512, 512), layers_per_block=2,
            down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4, sample_size=1024)
VAES = {
    "sd3": dict(_VAE, latent_channels=16, scaling_factor=1.5305, shift_factor=0.0609, use_quant_conv=False,
                use_post_quant_conv=False),
    "flux": dict(_VAE, latent_channels=16, scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False,
                 use_post_quant_conv=False),
    "sdxl": dict(_VAE, latent_channels=4, scaling_factor=0.13025),
}
# Wan-AI/Wan2.1-T2V-1.3B-Diffusers: transformer/config.json; its VAE is AutoencoderKLWan's defaults
WAN21_T2V_1_3B_TRANSFORMER = dict(
    patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16, out_channels=16,
    text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
    eps=1e-6, rope_max_seq_len=1024,
)
WAN21_GEOMETRY = {"frames": 81, "height": 480, "width": 832, "mem_frames": "21,41,81"}  # WanPipeline's defaults
QWEN25_VL_7B_TEXT = dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                         num_key_value_heads=4, vocab_size=152064, max_position_embeddings=128000,
                         rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]},
                         tie_word_embeddings=False, hidden_act="silu", rms_norm_eps=1e-6, initializer_range=0.02,
                         max_window_layers=28)
QWEN25_VL_7B_VISION = dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584,
                           patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112, tokens_per_second=2,
                           fullatt_block_indexes=[7, 15, 23, 31], in_channels=3, hidden_act="silu")


class UsageError(Exception):
    """A bad command line or an impossible combination of options (exit status 2, one line)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, not argparse's usage block
        raise UsageError(message)


@contextlib.contextmanager
def _building(device: torch.device, dtype: torch.dtype) -> Iterator[None]:
    """Create parameters directly on `device` in `dtype`: FLUX.1-dev is 12B parameters, which an fp32 CPU
    build followed by a cast would hold twice."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(old)


# ---------------------------------------------------------------------------------------------------
# pipelines
# ---------------------------------------------------------------------------------------------------
def _text_encoders(real: bool, tok_dir: Path, widths: Sequence[tuple[int, int | None]]):
    """CLIP text encoders with the given (hidden, projection) widths: real widths with one layer, or tiny."""
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

    from mmreward.testing.tiny_models import tiny_clip_text_config

    out = []
    for hidden, proj in widths:
        if real:
            cfg = CLIPTextConfig(hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=1,
                                 num_attention_heads=hidden // 64, projection_dim=proj or hidden,
                                 vocab_size=49408, max_position_embeddings=77)
        else:
            cfg = tiny_clip_text_config(32, projection_dim=proj and 32)
        out.append(CLIPTextModelWithProjection(cfg) if proj else CLIPTextModel(cfg))
    return out, CLIPTokenizer.from_pretrained(str(tok_dir))


def _t5(real: bool, d_model: int, tok_dir: Path):
    from transformers import T5Config, T5EncoderModel

    from mmreward.testing.tiny_models import build_t5_tokenizer

    tok = build_t5_tokenizer(tok_dir)
    if not real:
        d_model = 32
    cfg = T5Config(d_model=d_model, d_ff=2 * d_model, d_kv=64 if real else 8, num_layers=1,
                   num_heads=d_model // 64 if real else 4, vocab_size=len(tok))
    return T5EncoderModel(cfg), tok


def build_pipeline(family: str, real: bool, device: torch.device, dtype: torch.dtype, tmp: Path):
    """A diffusers pipeline of `family` at the published (real) or a tiny (reduced) geometry, random weights."""
    import diffusers

    from mmreward.testing.tiny_models import build_clip_tokenizer, build_tiny_pipeline

    tok_dir = tmp / "clip_tokenizer"
    if not (tok_dir / "vocab.json").exists():
        build_clip_tokenizer(tok_dir)
    torch.manual_seed(0)
    # schedulers outside _building: their tables stay on the CPU, as from_pretrained leaves them
    if family == "flux":
        sched = diffusers.FlowMatchEulerDiscreteScheduler(
            shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15, base_image_seq_len=256,
            max_image_seq_len=4096)
    elif family == "sdxl":  # DDIM: the kernel DDPO-style RL samples SDXL with (the published config ships Euler)
        sched = diffusers.DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                        clip_sample=False, set_alpha_to_one=False, steps_offset=1)
    else:
        sched = diffusers.FlowMatchEulerDiscreteScheduler(shift=3.0)
    with _building(device, dtype):
        if family in ("sd3", "flux") and not real:
            pipe = build_tiny_pipeline(family, tok_dir)
        elif family == "sd3":
            (clip_l, clip_g), tok = _text_encoders(real, tok_dir, [(768, 768), (1280, 1280)])
            t5, t5_tok = _t5(real, 4096, tmp / "t5")
            pipe = diffusers.StableDiffusion3Pipeline(
                transformer=diffusers.SD3Transformer2DModel(**SD35_MEDIUM_TRANSFORMER),
                scheduler=sched, vae=diffusers.AutoencoderKL(**VAES["sd3"]), text_encoder=clip_l, tokenizer=tok,
                text_encoder_2=clip_g, tokenizer_2=tok, text_encoder_3=t5, tokenizer_3=t5_tok)
        elif family == "flux":
            (clip_l,), tok = _text_encoders(real, tok_dir, [(768, None)])
            t5, t5_tok = _t5(real, 4096, tmp / "t5")
            pipe = diffusers.FluxPipeline(
                transformer=diffusers.FluxTransformer2DModel(**FLUX_DEV_TRANSFORMER), scheduler=sched,
                vae=diffusers.AutoencoderKL(**VAES["flux"]), text_encoder=clip_l, tokenizer=tok,
                text_encoder_2=t5, tokenizer_2=t5_tok)
        elif family == "sdxl":
            (clip_l, clip_g), tok = _text_encoders(real, tok_dir, [(768, None), (1280, 1280)])
            if real:
                unet, vae = diffusers.UNet2DConditionModel(**SDXL_UNET), diffusers.AutoencoderKL(**VAES["sdxl"])
            else:  # SDXL's layout (text_time conditioning, linear projections) with tiny widths
                unet = diffusers.UNet2DConditionModel(
                    block_out_channels=(8, 16), layers_per_block=1, sample_size=8, in_channels=4, out_channels=4,
                    down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                    up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), attention_head_dim=(2, 4),
                    use_linear_projection=True, addition_embed_type="text_time", addition_time_embed_dim=8,
                    transformer_layers_per_block=(1, 1), projection_class_embeddings_input_dim=80,
                    cross_attention_dim=64, norm_num_groups=4)
                vae = diffusers.AutoencoderKL(
                    block_out_channels=(4, 8), in_channels=3, out_channels=3, latent_channels=4,
                    down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                    layers_per_block=1, norm_num_groups=2, sample_size=16)
            pipe = diffusers.StableDiffusionXLPipeline(
                vae=vae, text_encoder=clip_l, tokenizer=tok, text_encoder_2=clip_g, tokenizer_2=tok, unet=unet,
                scheduler=sched)
        else:
            raise ValueError(f"no pipeline builder for {family!r}")
    pipe.set_progress_bar_config(disable=True)
    for name in ("vae", "text_encoder", "text_encoder_2", "text_encoder_3", "unet", "transformer"):
        module = getattr(pipe, name, None)
        if isinstance(module, torch.nn.Module):
            module.requires_grad_(False).eval()
    return pipe.to(device)  # built in `dtype` already (see _building)


def _row(family: str, measure: str, ours: str, base: str, items: int, t_ours: float, t_base: float,
         m_ours: float, m_base: float) -> dict[str, Any]:
    ratio = t_ours / t_base
    return {"family": family, "measure": measure, "status": "ok", "ours": ours, "base": base, "items": items,
            "ours_s": t_ours, "base_s": t_base, "time_ratio": ratio, "speed_ratio": t_base / t_ours,
            "target_max_time_ratio": TARGETS[measure], "meets_target": ratio <= TARGETS[measure],
            "ours_items_per_s": items / t_ours, "base_items_per_s": items / t_base,
            "ours_peak_mb": m_ours, "base_peak_mb": m_base,
            "peak_ratio": m_ours / m_base if m_base > 0 else None}


def _skipped(family: str, measure: str, why: str) -> dict[str, Any]:
    return {"family": family, "measure": measure, "status": f"skipped: {why}"}


def _measure(fn: Callable[[], object], args: argparse.Namespace) -> tuple[float, float]:
    return timed(fn, args.repeats, args.device), peak_memory_mb(fn, args.device)


def bench_pipeline(family: str, pipe, args: argparse.Namespace, tmp: Path,
                   rows: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The three rows of one pipeline family, appended to `rows` as each is measured (a later failure keeps them)."""
    from diffusion_rl.config import from_dict
    from diffusion_rl.kernels import Kernel
    from diffusion_rl.pipelines import make_adapter
    from diffusion_rl.rollout import rollout
    from diffusion_rl.trainer import Trainer

    n, size, steps, cfg_scale = args.batch, args.size, args.steps, args.guidance
    adapter = make_adapter(pipe, size, size)
    emb = adapter.encode(["a photo of a red circle above a blue square"]).expand(n)
    kernel = Kernel("flow_sde", 0.7) if adapter.is_flow else Kernel("ddim", 1.0)
    rows = [] if rows is None else rows

    def ours():
        with torch.no_grad():
            return rollout(adapter, emb, list(range(n)), [0] * n, num_steps=steps, guidance_scale=cfg_scale,
                           kernel=kernel).images

    x_t = rollout(adapter, emb, list(range(n)), [0] * n, num_steps=1, guidance_scale=cfg_scale,
                  kernel=kernel).latents[:, 0]
    kw = dict(emb.tensors)
    if adapter.uses_cfg(cfg_scale):
        kw.update({f"negative_{k}": v for k, v in adapter.negative().expand(n).tensors.items()})
    if family == "flux":  # guidance-distilled: no negative prompt
        kw = {k: v for k, v in kw.items() if not k.startswith("negative_")}

    def plain():
        with torch.no_grad():
            return pipe(num_inference_steps=steps, guidance_scale=cfg_scale, height=size, width=size,
                        latents=x_t.clone().to(adapter.model_dtype), output_type="pt", **kw).images

    t_o, m_o = _measure(ours, args)
    t_b, m_b = _measure(plain, args)
    rows.append(_row(family, "rollout_vs_sampling", "rollout with log-probs", "pipeline sampling", n,
                     t_o, t_b, m_o, m_b))

    # attention backends on the frozen denoiser (before LoRA), one forward at the middle timestep
    rows.append(_attention_row(family, adapter, emb, x_t, cfg_scale, steps, args))

    # trainer step vs bare forward + backward + optimizer step on the same LoRA model and inputs
    cfg = from_dict({
        "model": {"pretrained": "(in memory)", "height": size, "width": size, "lora": True},
        "sample": {"num_steps": steps, "guidance_scale": cfg_scale, "kernel": kernel.name,
                   "noise_level": kernel.noise_level, "prompts_per_iteration": 1, "group_size": n, "batch_size": n},
        "train": {"iterations": 1, "timestep_fraction": 0.5, "micro_batch_size": n, "probe": "off", "kl_beta": 0.0,
                  "max_grad_norm": 1.0, "mixed_precision": "bf16" if args.dtype == torch.bfloat16 else "no"},
        "prompts": {"train": ["a red circle"]},
        "reward": {"rewards": {"mock": 1.0}},
        "log": {"output_dir": str(tmp / f"run_{family}"), "progress": False},
    })
    trainer = Trainer(cfg, pipeline=pipe)
    samples = trainer.sde_rollout(trainer.inputs(0))  # rollout and rewards
    samples.advantages, _ = trainer.algorithm.advantages(samples)
    batch = samples.batch
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
                                 traj.embeds, cfg_scale)
            (out.float().square().mean() / k).backward()
        torch.nn.utils.clip_grad_norm_(trainer.trainable, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    t_o, m_o = _measure(trainer_step, args)
    t_b, m_b = _measure(bare_step, args)
    rows.append(_row(family, "train_vs_fwd_bwd", f"trainer step ({k} trained steps)", "bare fwd+bwd+step", n,
                     t_o, t_b, m_o, m_b))
    return rows


def build_wan21(real: bool, device: torch.device, dtype: torch.dtype, tmp: Path) -> str:
    """A WanPipeline folder: Wan 2.1 T2V 1.3B's geometry (real) or the test kit's tiny Wan (reduced)."""
    from mmreward.testing.tiny_models import save_tiny_pipeline

    if not real:
        return str(save_tiny_pipeline("wan", tmp / "wan21"))
    import diffusers
    from transformers import UMT5Config, UMT5EncoderModel

    from mmreward.testing.tiny_models import build_t5_tokenizer

    tok = build_t5_tokenizer(tmp / "umt5")
    torch.manual_seed(0)
    with _building(device, dtype):
        text_encoder = UMT5EncoderModel(UMT5Config(d_model=4096, d_ff=10240, d_kv=64, num_layers=1, num_heads=64,
                                                   vocab_size=len(tok)))
        pipe = diffusers.WanPipeline(
            tokenizer=tok, text_encoder=text_encoder, vae=diffusers.AutoencoderKLWan(),
            transformer=diffusers.WanTransformer3DModel(**WAN21_T2V_1_3B_TRANSFORMER),
            scheduler=diffusers.UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                                         flow_shift=3.0))
    pipe.save_pretrained(str(tmp / "wan21"))
    del pipe
    return str(tmp / "wan21")


def bench_wan(args: argparse.Namespace, tmp: Path, report: dict[str, Any], save: Callable[[], None]) -> None:
    """Wan 2.1 rows (rollout vs sampling, trainer vs bare step) and the memory grid, via rl_step_video, into
    `report`; `save` is called between the two, so a run stopped during the (long) grid keeps the rows."""
    from benchmarks import rl_step_video

    real = args.geometry == "real"
    geo = WAN21_GEOMETRY if real else {"frames": 5, "height": args.size, "width": args.size, "mem_frames": "5,9"}
    folder = build_wan21(real, args.device, args.dtype, tmp)
    argv = ["--pretrained", folder, "--device", str(args.device), "--dtype", "bf16" if args.dtype == torch.bfloat16
            else "fp32", "--frames", str(geo["frames"]), "--height", str(geo["height"]), "--width", str(geo["width"]),
            "--batch", "2" if real else str(args.batch), "--steps", str(args.steps), "--guidance", str(args.guidance),
            "--repeats", str(args.repeats), "--mem-frames", geo["mem_frames"],
            "--mem-sizes", f"{geo['height']}x{geo['width']}", "--max-sequence-length", "226" if real else "16"]
    vargs = rl_step_video.parse_args(argv)
    items = 2 if real else args.batch  # 2: the smallest GRPO group (group_size >= 2)
    torch.manual_seed(0)  # as rl_step_video.run seeds
    overheads = rl_step_video.overheads(folder, rl_step_video._pipeline(folder, vargs), vargs, tmp)
    report["rows"].extend(_row("wan21", r["measure"], r["ours"], r["base"], items, r["ours_s"], r["base_s"],
                               r["ours_peak_mb"], r["base_peak_mb"]) for r in overheads)
    save()
    if args.device.type == "cuda":
        torch.cuda.empty_cache()
    report["wan_memory"] = rl_step_video.memory_grid(folder, vargs, tmp)


def _attention_row(family: str, adapter, emb, x_t: torch.Tensor, cfg_scale: float, steps: int,
                   args: argparse.Namespace) -> dict[str, Any]:
    if args.device.type != "cuda":
        return _skipped(family, "xformers_vs_sdpa", "xformers runs on CUDA only")
    try:
        import xformers  # noqa: F401
    except ImportError:
        return _skipped(family, "xformers_vs_sdpa", "xformers is not installed")
    model = adapter.denoiser
    t = adapter.schedule(steps).timesteps[steps // 2].expand(len(x_t)).to(args.device)

    def forward():
        with torch.no_grad():
            return adapter.predict(model, x_t, t, emb, cfg_scale)

    def use(backend: str) -> None:
        if hasattr(model, "set_attention_backend"):
            model.set_attention_backend("xformers" if backend == "xformers" else "native")
        elif backend == "xformers":
            model.enable_xformers_memory_efficient_attention()
        else:
            model.disable_xformers_memory_efficient_attention()

    try:
        use("xformers")
        t_x, m_x = _measure(forward, args)
    except Exception as exc:  # noqa: BLE001 - a backend that cannot run this model is a result, not a crash
        use("sdpa")
        return _skipped(family, "xformers_vs_sdpa", f"xformers failed: {type(exc).__name__}: {exc}"[:200])
    use("sdpa")
    t_s, m_s = _measure(forward, args)
    return _row(family, "xformers_vs_sdpa", "xformers forward", "SDPA forward", len(x_t), t_x, t_s, m_x, m_s)


def cost_model(family: str, pipe, args: argparse.Namespace) -> dict[str, Any]:
    """Rollout time and peak memory along batch, resolution and steps (the others at their base value)."""
    from diffusion_rl.kernels import Kernel
    from diffusion_rl.pipelines import make_adapter
    from diffusion_rl.rollout import rollout

    b0, s0, n0 = args.cost_batches[0], args.cost_sizes[0], args.cost_steps[0]
    axes = {"batch": [(b, s0, n0) for b in args.cost_batches], "resolution": [(b0, s, n0) for s in args.cost_sizes],
            "steps": [(b0, s0, n) for n in args.cost_steps]}
    out: dict[str, Any] = {"family": family, "measure": "rollout with log-probs", "threshold": NONLINEAR, "axes": {}}
    cache: dict[tuple[int, int, int], tuple[float, float]] = {}
    for axis, points in axes.items():
        rows = []
        for b, s, n in points:
            if (b, s, n) not in cache:
                adapter = make_adapter(pipe, s, s)
                emb = adapter.encode(["a red circle"]).expand(b)
                kernel = Kernel("flow_sde", 0.7) if adapter.is_flow else Kernel("ddim", 1.0)

                def run(adapter=adapter, emb=emb, kernel=kernel, b=b, n=n):
                    with torch.no_grad():
                        return rollout(adapter, emb, list(range(b)), [0] * b, num_steps=n,
                                       guidance_scale=args.guidance, kernel=kernel).images

                cache[(b, s, n)] = _measure(run, args)
            t, m = cache[(b, s, n)]
            x = {"batch": b, "resolution": s * s, "steps": n}[axis]
            rows.append({"x": x, "batch": b, "size": s, "steps": n, "time_s": t, "peak_mb": m})
        dev_t = linear_fit_deviation([r["x"] for r in rows], [r["time_s"] for r in rows])
        dev_m = linear_fit_deviation([r["x"] for r in rows], [r["peak_mb"] for r in rows]) \
            if all(r["peak_mb"] > 0 for r in rows) else [None] * len(rows)
        for r, dt, dm in zip(rows, dev_t, dev_m):
            r.update(time_dev=dt, peak_dev=dm,
                     nonlinear=[q for q, d in (("time", dt), ("peak", dm)) if d is not None and d > NONLINEAR])
        out["axes"][axis] = rows
    return out


# ---------------------------------------------------------------------------------------------------
# rewards
# ---------------------------------------------------------------------------------------------------
def build_vqascore(real: bool, device: torch.device, dtype: torch.dtype, tmp: Path):
    """VQAScore on Qwen2.5-VL: the 7B geometry (real) or one tiny layer per tower, with the Qwen tokenizer."""
    from transformers import Qwen2_5_VLConfig

    from mmreward.backbones.qwen_vl import vlm_from_config
    from mmreward.backbones.tiny_qwen_vl import build_tiny_qwen_vl, tiny_qwen_vl_config
    from mmreward.models.vqascore import VQAScore

    max_pixels = 448 * 448 if real else 56 * 56
    torch.manual_seed(0)
    model, processor = build_tiny_qwen_vl(tmp / "qwen", variant="qwen2_5_vl", max_pixels=max_pixels)
    if real:
        tiny = tiny_qwen_vl_config(processor.tokenizer, "qwen2_5_vl")
        # the tiny config's token ids and vocabulary, nothing of its shape: its per-layer list (layer_types, one
        # entry), its rope section (sized for head_dim 16) and its wide init (std 0.5, which overflows bf16 at 28
        # layers of 3584) would contradict or break the 7B geometry
        shape_keys = ("layer_types", "rope_parameters", "rope_scaling", "rope_theta", "initializer_range",
                      "max_window_layers", "head_dim")
        text = {k: v for k, v in tiny.text_config.to_dict().items() if k not in shape_keys}
        text.update(QWEN25_VL_7B_TEXT)
        config = Qwen2_5_VLConfig(text_config=text, vision_config=QWEN25_VL_7B_VISION,
                                  image_token_id=tiny.image_token_id, video_token_id=tiny.video_token_id,
                                  vision_start_token_id=tiny.vision_start_token_id,
                                  vision_end_token_id=tiny.vision_end_token_id)
        with _building(device, dtype):
            model = vlm_from_config(config, dtype)
    return VQAScore(model.eval(), processor, max_pixels=max_pixels, micro_batch_size=1 << 20).to(device, dtype)


def bench_reward(family: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    from benchmarks import scoring_throughput as st

    real = args.geometry == "real"
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    base = torch.rand(args.batch, 3, 8, 8, generator=g)
    images = torch.nn.functional.interpolate(base, size=(args.size, args.size), mode="bilinear").clamp(0, 1)
    images = images.to(args.device)
    prompt = "a photo of a red circle above a blue square"
    if family == "vqascore":
        from mmreward.backbones.qwen_vl import build_batch, model_inputs

        reward = build_vqascore(real, args.device, args.dtype, tmp)
        min_pixels, max_pixels = reward._pixels("image", 1)  # the bounds score() resolves (None: the original's)
        batch = build_batch(reward.processor, [reward.question_template.format(prompt)] * len(images), images,
                            kind="image", min_pixels=min_pixels, max_pixels=max_pixels,
                            suffixes=[reward.answer_template] * len(images))
        inputs = model_inputs(batch, reward.device, reward.dtype)

        def bare():
            with torch.inference_mode():
                return reward.model(**inputs).logits
    else:
        reward = st.build(family, real).to(args.device, args.dtype)
        reward.micro_batch_size = len(images)
        bare = st.bare_forward(reward, family, prompt, images.to(args.dtype))

    def ours():
        return reward.score(prompt, images).scores

    t_o, m_o = _measure(ours, args)
    t_b, m_b = _measure(bare, args)
    return _row(family, "scoring_vs_forward", "reward.score", "bare batched forward", len(images), t_o, t_b, m_o, m_b)


# ---------------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------------
def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def format_table(report: dict[str, Any]) -> str:
    lines = [f"device {report['device']}  dtype {report['dtype']}  geometry {report['geometry']}  "
             f"batch {report['batch']}  size {report['size']}  steps {report['steps']}",
             f"memory: {report['memory_metric']}",
             f"{'family':<12}{'measure':<21}{'ours s':>9}{'base s':>9}{'ratio':>7}{'target':>8}{'ok':>4}"
             f"{'ours it/s':>11}{'base it/s':>11}{'ours MiB':>10}{'base MiB':>10}{'mem x':>7}"]
    for r in report["rows"]:
        if r["status"] != "ok":
            lines.append(f"{r['family']:<12}{r['measure']:<21}{r['status']}")
            continue
        lines.append(
            f"{r['family']:<12}{r['measure']:<21}{r['ours_s']:9.4f}{r['base_s']:9.4f}{r['time_ratio']:7.3f}"
            f"{'<=' + format(r['target_max_time_ratio'], '.2f'):>8}{'yes' if r['meets_target'] else 'NO':>4}"
            f"{r['ours_items_per_s']:11.2f}{r['base_items_per_s']:11.2f}{r['ours_peak_mb']:10.1f}"
            f"{r['base_peak_mb']:10.1f}{_fmt(r['peak_ratio'], '7.2f'):>7}")
    if report.get("wan_memory"):
        lines.append("wan21: one trainer step's peak memory vs frames x resolution")
        lines.append(f"{'frames':>7}{'HxW':>10}{'tokens':>8}{'step s':>9}{'peak MiB':>10}")
        for r in report["wan_memory"]:
            lines.append(f"{r['frames']:>7}{str(r['height']) + 'x' + str(r['width']):>10}{r['tokens']:>8}"
                         f"{r['step_s']:9.3f}{r['peak_mb']:10.1f}")
    cm = report.get("cost_model")
    if cm:
        lines.append(f"cost model: {cm['family']} {cm['measure']} (points > {cm['threshold']:.0%} off the "
                     "least-squares line are flagged)")
        lines.append(f"{'axis':<12}{'x':>10}{'batch':>7}{'size':>6}{'steps':>7}{'time s':>10}{'time dev':>10}"
                     f"{'peak MiB':>10}{'peak dev':>10}  nonlinear")
        for axis, rows in cm["axes"].items():
            for r in rows:
                lines.append(f"{axis:<12}{r['x']:>10}{r['batch']:>7}{r['size']:>6}{r['steps']:>7}"
                             f"{r['time_s']:10.4f}{r['time_dev']:10.3f}{r['peak_mb']:10.1f}"
                             f"{_fmt(r['peak_dev'], '10.3f'):>10}  {','.join(r['nonlinear']) or '-'}")
    return "\n".join(lines)


def _write_json(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(report, f, indent=1, allow_nan=False)
        os.replace(tmp, path)  # atomic: a reader never sees half a report
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _positive_ints(text: str) -> list[int]:
    try:
        vals = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if len(vals) != 3 or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected three positive integers like 1,2,4, got {text!r}")
    return vals


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = _Parser(prog="gpu_scale.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--geometry", choices=["real", "reduced"], default=None,
                   help="published configs or tiny ones (default: real on CUDA, reduced on CPU)")
    p.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda when available)")
    p.add_argument("--dtype", choices=["bf16", "fp32"], default=None, help="default: bf16 on CUDA, fp32 on CPU")
    p.add_argument("--families", nargs="+", default=None, metavar="FAMILY",
                   help=f"any of {' '.join(FAMILIES)} (default: all)")
    p.add_argument("--batch", type=int, default=None, help="images per call (default: 4 real, 2 reduced)")
    p.add_argument("--size", type=int, default=None, help="image side in pixels (default: 512 real, 32 reduced)")
    p.add_argument("--steps", type=int, default=None, help="sampling steps (default: 10 real, 3 reduced)")
    p.add_argument("--guidance", type=float, default=4.5)
    p.add_argument("--repeats", type=int, default=None, help="timed calls after a warm-up (default: 3 real, 1 reduced)")
    p.add_argument("--cost-batches", type=_positive_ints, default=None, help="three batch sizes, e.g. 1,2,4")
    p.add_argument("--cost-sizes", type=_positive_ints, default=None, help="three image sides, e.g. 256,512,768")
    p.add_argument("--cost-steps", type=_positive_ints, default=None, help="three step counts, e.g. 5,10,20")
    p.add_argument("--json", type=Path, default=None, help="write the report here as JSON")
    args = p.parse_args(argv)
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        args.device = torch.device(args.device)
    except RuntimeError:
        raise UsageError(f"--device {args.device!r} is not a torch device; use cuda, cuda:N or cpu") from None
    if args.device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda but torch sees no CUDA device; run on a GPU machine or pass --device cpu")
    cuda = args.device.type == "cuda"
    args.geometry = args.geometry or ("real" if cuda else "reduced")
    if args.geometry == "real" and not cuda:
        raise UsageError("--geometry real needs a CUDA device (FLUX.1-dev alone is 12B parameters); "
                         "use --geometry reduced on CPU")
    args.dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype or ("bf16" if cuda else "fp32")]
    real = args.geometry == "real"
    families = args.families or list(FAMILIES)
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        raise UsageError(f"unknown families {unknown}; choose from {' '.join(FAMILIES)}")
    args.families = list(dict.fromkeys(families))
    for name, r, d in (("batch", 4, 2), ("size", 512, 32), ("steps", 10, 3), ("repeats", 3, 1)):
        if getattr(args, name) is None:
            setattr(args, name, r if real else d)
        if getattr(args, name) < 1:
            raise UsageError(f"--{name} must be >= 1, got {getattr(args, name)}")
    args.cost_batches = args.cost_batches or [1, 2, 4]
    args.cost_sizes = args.cost_sizes or ([256, 512, 768] if real else [16, 32, 48])
    args.cost_steps = args.cost_steps or ([5, 10, 20] if real else [2, 4, 8])
    return args


def _run_family(family: str, args: argparse.Namespace, tmp: Path, report: dict[str, Any]) -> None:
    """Measure one family into `report` (in a function of its own, so its models die with the frame)."""
    if family == "wan21":
        def save() -> None:
            if args.json is not None:
                _write_json(args.json, report)

        bench_wan(args, tmp, report, save)
    elif family in PIPELINES:
        pipe = build_pipeline(family, args.geometry == "real", args.device, args.dtype, tmp)
        if report["cost_model"] is None:  # the first pipeline family, before LoRA is added
            report["cost_model"] = cost_model(family, pipe, args)
        bench_pipeline(family, pipe, args, tmp, report["rows"])
    else:
        report["rows"].append(bench_reward(family, args, tmp))


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except UsageError as exc:
        print(f"gpu_scale.py: error: {exc}", file=sys.stderr)
        return 2
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(args.device) if args.device.type == "cuda" else "cpu",
        "torch": torch.__version__, "cuda": torch.version.cuda if args.device.type == "cuda" else None,
        "threads": torch.get_num_threads(), "dtype": str(args.dtype).removeprefix("torch."),
        "geometry": args.geometry, "batch": args.batch, "size": args.size, "steps": args.steps,
        "repeats": args.repeats, "memory_metric": memory_metric(args.device), "rows": [], "cost_model": None,
        "wan_memory": [], "family_seconds": {}}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for family in args.families:
            t0 = time.perf_counter()
            try:
                _run_family(family, args, tmp, report)
            except Exception as exc:  # noqa: BLE001 - at the real geometry one family can run out of memory or
                # meet an API its installed package lacks; that is a result, and the other families still run
                traceback.print_exc()
                report["rows"].append({"family": family, "measure": "all", "status":
                                       f"failed: {type(exc).__name__}: {exc}"[:300]})
            report["family_seconds"][family] = time.perf_counter() - t0
            print(f"gpu_scale.py: {family} took {report['family_seconds'][family]:.1f} s", file=sys.stderr,
                  flush=True)
            if args.device.type == "cuda":
                torch.cuda.empty_cache()
            if args.json is not None:  # after every family, so a run killed by a time limit keeps what it measured
                _write_json(args.json, report)
    print(format_table(report), flush=True)
    bad = [r for r in report["rows"] if r["status"].startswith("failed") or (r["status"] == "ok" and not all(
        math.isfinite(r[k]) for k in ("ours_s", "base_s", "ours_peak_mb", "base_peak_mb")))]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
