"""Train the tiny ShapesWorld text-to-video flow model as a standard diffusers WanPipeline.

    python -m mmreward.synthetic.build.train_video_generator --out assets/shapesworld/video-generator --steps 700

Components (stock diffusers / transformers classes, saved with `pipe.save_pretrained`):
- transformer: a small WanTransformer3DModel on 8 x 32 x 32 RGB pixels (patch (1, 4, 4), so 8 x 64 = 512
  tokens; as for the image generator the output projection must have rank >= 3 * 4 * 4 = 48 per token);
- vae: an analytic identity AutoencoderKLWan (see identity_wan_vae.py): no spatial or temporal compression,
  which makes the model pixel-space and lets it make any frame count (Wan's (T - 1) % 4 == 0 rule comes from
  the temporal factor 4 of the real VAE). diffusers' WanPipeline still rounds `num_frames` as if there were
  a temporal factor (n -> n // 1 * 1 + 1): call the pipeline with num_frames=7 to get the 8 trained frames
  (our WanAdapter takes num_frames=8 as is);
- text_encoder: a small UMT5EncoderModel (Wan's text encoder class) over ShapesWorld's CLIP BPE tokenizer
  (the image generator's small vocabulary), trained jointly with the transformer; WanPipeline pads its
  output with zeros to `max_sequence_length`, so call it with GENERATION_DEFAULTS' 20, as in training;
- scheduler: FlowMatchEulerDiscreteScheduler (shift 1).

Data: one-object moving-shapes clips (mmreward.synthetic.motion) of the training split: no object's start or
end colour-shape pair is one of ShapesWorld's held-out pairs, so prompts like "a red triangle moving ..."
are never seen. Objective: rectified flow (x_t = (1 - s) x_0 + s eps, target eps - x_0, s logit-normal),
10% empty prompts for classifier-free guidance, an EMA of the weights is exported. Checkpoints to `--work`
and resumes; data and noise are seeded by step, so a resumed run sees the same batches.
"""

from __future__ import annotations

import argparse
import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from mmreward.errors import ConfigError
from mmreward.synthetic.build.ema_training import export_with_ema, train_with_ema
from mmreward.synthetic.build.threads import torch_threads
from mmreward.synthetic.motion import motion_caption, motion_specs_for_split, realize_clip, render_clips

# Call-time settings the model was trained for (the adapter/pipeline pads the text to max_sequence_length)
GENERATION_DEFAULTS = {"max_sequence_length": 20, "num_inference_steps": 20, "guidance_scale": 4.0,
                       "num_frames": 8, "height": 32, "width": 32}


# How the shipped model was trained (see its card): 4-frame clips, more training at high noise, the text encoder
# started from the ShapesWorld CLIP's text tower, random starts for 7350 steps then centred clips
SHIPPED_RECIPE = {"steps": 14350, "stop_at": 13000, "num_frames": 4, "sigma_mean": 0.5, "centred_after": 7350}


@dataclass
class VideoGeneratorTrainConfig:
    out: str = "assets/shapesworld/video-generator"
    work: str = "build/shapesworld/video-generator"
    steps: int = 700  # length of the learning-rate schedule
    stop_at: int = 0  # stop (and export) after this many steps of that schedule; 0 = all of it
    batch_size: int = 16
    lr: float = 1e-3
    warmup: int = 50
    width: int = 128
    layers: int = 4
    ffn: int = 256
    text_width: int = 64
    patch: int = 4
    text_encoder: str = "umt5"  # "umt5" (Wan's class, from scratch) or a ShapesWorld CLIP folder: its text tower
    patch_t: int = 2  # two frames per token: 4 x 64 = 256 tokens per clip (CPU budget)
    num_frames: int = 8
    image_size: int = 32
    cfg_dropout: float = 0.1
    centred_after: int = -1  # from this step on, train on centred clips (motion.realize_clip); -1 never
    sigma_mean: float = 0.0  # mean of the logit-normal noise levels; > 0 trains more at high noise (the layout)
    ema: float = 0.995
    seed: int = 0
    threads: int = 1  # on the shared 2-core machine 2 threads ran 10-20x slower per step than 1 (spin contention)
    ckpt_every: int = 50
    export_every: int = 200
    device: str = "cpu"  # e.g. cuda: data and noise are still drawn on the CPU, so the batches do not change

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1:
            raise ConfigError(f"steps and batch_size must be >= 1, got {self.steps}, {self.batch_size}")
        if not 0 <= self.stop_at <= self.steps:
            raise ConfigError(f"stop_at must be in [0, steps={self.steps}] (0 = run the whole schedule), got {self.stop_at}")
        if self.image_size % self.patch:
            raise ConfigError(f"image_size {self.image_size} must be divisible by patch {self.patch}")
        if self.num_frames % self.patch_t:
            raise ConfigError(f"num_frames {self.num_frames} must be divisible by patch_t {self.patch_t}")
        if self.width < 3 * self.patch_t * self.patch**2:
            raise ConfigError(
                f"width {self.width} < 3 * patch_t * patch^2 = {3 * self.patch_t * self.patch**2}: the output projection could not "
                "represent a whole patch, so part of the noise would never be removed; widen or use a smaller patch"
            )
        if self.width % 32:
            raise ConfigError(f"width must be a multiple of the head size 32, got {self.width}")
        if not 0 <= self.cfg_dropout < 1 or not 0 <= self.ema < 1:
            raise ConfigError(f"cfg_dropout and ema must be in [0, 1), got {self.cfg_dropout}, {self.ema}")


def generation_defaults(cfg: VideoGeneratorTrainConfig) -> dict:
    """GENERATION_DEFAULTS with the clip geometry this configuration trains."""
    return {**GENERATION_DEFAULTS, "num_frames": cfg.num_frames, "height": cfg.image_size, "width": cfg.image_size}


def build_pipeline(cfg: VideoGeneratorTrainConfig, tokenizer_dir: str | os.PathLike):
    """A fresh (randomly initialised) WanPipeline with the ShapesWorld video architecture."""
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    from mmreward.synthetic.identity_wan_vae import build_identity_wan_vae
    from mmreward.synthetic.tokenizer import build_shapes_tokenizer

    torch.manual_seed(cfg.seed)
    tok = build_shapes_tokenizer(tokenizer_dir, max_length=GENERATION_DEFAULTS["max_sequence_length"])
    if cfg.text_encoder == "umt5":
        text_encoder = UMT5EncoderModel(UMT5Config(
            vocab_size=len(tok), d_model=cfg.text_width, d_kv=16, d_ff=2 * cfg.text_width, num_layers=2,
            num_heads=cfg.text_width // 16, relative_attention_num_buckets=16, dropout_rate=0.0,
            pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, decoder_start_token_id=tok.pad_token_id,
        ))
    else:
        # WanPipeline reads `text_encoder(ids, mask).last_hidden_state`, which a CLIPTextModel also returns: starting
        # from the ShapesWorld CLIP's text tower gives the denoiser colour and shape words it can already tell apart
        from transformers import CLIPTextModel

        text_encoder = CLIPTextModel.from_pretrained(cfg.text_encoder)
        if text_encoder.config.vocab_size != len(tok) or text_encoder.config.hidden_size != cfg.text_width:
            raise ConfigError(
                f"{cfg.text_encoder}: its text tower (vocab {text_encoder.config.vocab_size}, width "
                f"{text_encoder.config.hidden_size}) does not match the ShapesWorld tokenizer ({len(tok)}) and "
                f"--text-width {cfg.text_width}"
            )
    transformer = WanTransformer3DModel(
        patch_size=(cfg.patch_t, cfg.patch, cfg.patch), num_attention_heads=cfg.width // 32, attention_head_dim=32,
        in_channels=3, out_channels=3, text_dim=cfg.text_width, freq_dim=64, ffn_dim=cfg.ffn,
        num_layers=cfg.layers, cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=64,
    )
    return WanPipeline(tokenizer=tok, text_encoder=text_encoder, transformer=transformer,
                       vae=build_identity_wan_vae(), scheduler=FlowMatchEulerDiscreteScheduler(shift=1.0))


def trained_modules(pipe) -> dict[str, torch.nn.Module]:
    return {"transformer": pipe.transformer, "text_encoder": pipe.text_encoder}


def flow_matching_loss(pipe, prompts: list[str], x0: torch.Tensor, generator: torch.Generator,
                       sigma_mean: float = 0.0) -> torch.Tensor:
    """Rectified-flow loss on (B, 3, T, H, W) pixels in [-1, 1] with logit-normal(sigma_mean, 1) noise levels."""
    embeds = pipe._get_t5_prompt_embeds(prompts, max_sequence_length=GENERATION_DEFAULTS["max_sequence_length"],
                                        device=x0.device, dtype=x0.dtype)
    b = x0.shape[0]
    sigma = torch.sigmoid(torch.randn(b, generator=generator) + sigma_mean).view(b, 1, 1, 1, 1)
    noise = torch.randn(x0.shape, generator=generator).to(x0.device)
    sigma = sigma.to(x0.device)
    xt = (1 - sigma) * x0 + sigma * noise
    pred = pipe.transformer(hidden_states=xt, timestep=sigma.flatten() * 1000, encoder_hidden_states=embeds,
                            return_dict=False)[0]
    return F.mse_loss(pred, noise - x0)


def _batch(step: int, cfg: VideoGeneratorTrainConfig, specs) -> tuple[list[str], torch.Tensor]:
    rng = random.Random(f"video-gen/{cfg.seed}/{step}")
    centred = 0 <= cfg.centred_after <= step
    clips = [realize_clip(rng.choice(specs), rng, cfg.num_frames, cfg.image_size, centred)
             for _ in range(cfg.batch_size)]
    prompts = ["" if rng.random() < cfg.cfg_dropout else motion_caption(c.spec) for c in clips]
    video = render_clips(clips) * 2 - 1  # (B, T, 3, H, W)
    return prompts, video.permute(0, 2, 1, 3, 4).contiguous()  # the pipeline's latent layout (B, C, T, H, W)


def export(pipe, ema: dict[str, torch.Tensor], out: Path, meta: dict, cfg: VideoGeneratorTrainConfig) -> None:
    """Save the pipeline with the EMA weights swapped in (training weights restored afterwards)."""
    export_with_ema(pipe, trained_modules(pipe), ema, out, meta, generation_defaults(cfg))


def train(cfg: VideoGeneratorTrainConfig) -> Path:
    """Train on cfg.threads threads, restoring the caller's torch thread count afterwards."""
    with torch_threads(cfg.threads):
        return _train(cfg)


def _train(cfg: VideoGeneratorTrainConfig) -> Path:
    work = Path(cfg.work)
    work.mkdir(parents=True, exist_ok=True)
    pipe = build_pipeline(cfg, work / "tokenizer").to(cfg.device)
    specs = motion_specs_for_split("train")

    def step_loss(step: int) -> torch.Tensor:
        prompts, x0 = _batch(step, cfg, specs)
        g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        return flow_matching_loss(pipe, prompts, x0.to(cfg.device), g, cfg.sigma_mean)

    return train_with_ema(cfg, pipe, trained_modules(pipe), step_loss, generation_defaults=generation_defaults(cfg),
                          desc="video generator", last=cfg.stop_at or cfg.steps, log_every=10)


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for f, v in asdict(VideoGeneratorTrainConfig()).items():
        parser.add_argument(f"--{f.replace('_', '-')}", type=type(v), default=v)
    return train(VideoGeneratorTrainConfig(**vars(parser.parse_args(argv))))


if __name__ == "__main__":
    main()
