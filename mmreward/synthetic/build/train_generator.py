"""Train the tiny ShapesWorld text-to-image flow model as a standard diffusers StableDiffusion3Pipeline.

    python -m mmreward.synthetic.build.train_generator --out assets/shapesworld/generator --steps 4000

Components (all stock diffusers / transformers classes, saved with `pipe.save_pretrained`):
- transformer: a small SD3Transformer2DModel on 32x32 RGB pixels (patch 4, so 64 image tokens; the
  output projection must have rank >= 3 * patch^2 = 48 per token or the noise outside its span is never
  removed, which is why patch 8 with width 128 failed);
- vae: an analytic identity AutoencoderKL (see identity_vae.py), which makes the model pixel-space;
- text_encoder / text_encoder_2: two small CLIPTextModelWithProjection towers with ShapesWorld's
  CLIP BPE tokenizer, trained jointly with the transformer;
- text_encoder_3: a "null" T5EncoderModel whose final norm has zero gain, so it outputs exact zeros,
  which is what SD3 does without T5 (text_encoder_3=None); it is there only so that
  `DiffusionPipeline.from_pretrained(folder)` needs no extra arguments. The pipeline appends
  `max_sequence_length` of these zero tokens: call it with GENERATION_DEFAULTS (4, as in training);
- scheduler: FlowMatchEulerDiscreteScheduler (shift 1).

Objective: rectified flow as in SD3 (x_t = (1 - s) x_0 + s eps, target eps - x_0, s logit-normal),
10% empty prompts for classifier-free guidance, an EMA of the weights is what gets exported. The run
checkpoints to `--work` every `--ckpt-every` steps and resumes from there; data and noise are seeded
by step, so a resumed run sees the same batches as an uninterrupted one.
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
from mmreward.synthetic.captions import caption
from mmreward.synthetic.scenes import render, sample_scenes

# Call-time settings the model was trained for; `max_sequence_length` sets how many zero "T5" tokens
# the pipeline appends, and changing it shifts the attention distribution the model saw in training.
GENERATION_DEFAULTS = {"max_sequence_length": 4, "num_inference_steps": 20, "guidance_scale": 4.0}


@dataclass
class GeneratorTrainConfig:
    out: str = "assets/shapesworld/generator"
    work: str = "build/shapesworld/generator"
    steps: int = 4000
    batch_size: int = 24
    lr: float = 8e-4
    warmup: int = 100
    width: int = 128
    layers: int = 4
    patch: int = 4
    image_size: int = 32
    text_len: int = 16
    cfg_dropout: float = 0.1
    ema: float = 0.998
    seed: int = 0
    threads: int = 2
    ckpt_every: int = 100
    export_every: int = 500

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1:
            raise ConfigError(f"steps and batch_size must be >= 1, got {self.steps}, {self.batch_size}")
        if self.image_size % self.patch:
            raise ConfigError(f"image_size {self.image_size} must be divisible by patch {self.patch}")
        if self.width < 3 * self.patch**2:
            raise ConfigError(
                f"width {self.width} < 3 * patch^2 = {3 * self.patch**2}: the output projection could not "
                "represent a whole patch, so part of the noise would never be removed; widen or use a smaller patch"
            )
        if self.width % 32:
            raise ConfigError(f"width must be a multiple of the head size 32, got {self.width}")
        if not 0 <= self.cfg_dropout < 1 or not 0 <= self.ema < 1:
            raise ConfigError(f"cfg_dropout and ema must be in [0, 1), got {self.cfg_dropout}, {self.ema}")


def _text_encoder(vocab: int, width: int, layers: int, text_len: int):
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    return CLIPTextModelWithProjection(CLIPTextConfig(
        vocab_size=vocab, hidden_size=width, intermediate_size=4 * width, num_hidden_layers=layers,
        num_attention_heads=max(1, width // 16), max_position_embeddings=text_len, projection_dim=width,
        bos_token_id=vocab - 2, eos_token_id=vocab - 1, pad_token_id=vocab - 1,
    ))


def null_t5(dim: int, vocab: int):
    """A one-layer T5 encoder whose output is exactly zero (final RMSNorm gain 0)."""
    from transformers import T5Config, T5EncoderModel

    model = T5EncoderModel(T5Config(vocab_size=vocab, d_model=dim, d_kv=8, d_ff=8, num_layers=1, num_heads=1))
    with torch.no_grad():
        model.encoder.final_layer_norm.weight.zero_()
    return model.requires_grad_(False)


def build_pipeline(cfg: GeneratorTrainConfig, tokenizer_dir: str | os.PathLike):
    """A fresh (randomly initialised) pipeline with the ShapesWorld architecture."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    from mmreward.synthetic.identity_vae import build_identity_vae
    from mmreward.synthetic.tokenizer import build_shapes_tokenizer

    torch.manual_seed(cfg.seed)
    tok = build_shapes_tokenizer(tokenizer_dir, max_length=cfg.text_len)
    te1 = _text_encoder(len(tok), 64, 2, cfg.text_len)
    te2 = _text_encoder(len(tok), 32, 2, cfg.text_len)
    transformer = SD3Transformer2DModel(
        sample_size=cfg.image_size, patch_size=cfg.patch, in_channels=3, out_channels=3,
        num_layers=cfg.layers, attention_head_dim=32, num_attention_heads=cfg.width // 32,
        joint_attention_dim=96, caption_projection_dim=cfg.width, pooled_projection_dim=96,
        pos_embed_max_size=cfg.image_size // cfg.patch,
    )
    return StableDiffusion3Pipeline(
        transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=1.0), vae=build_identity_vae(),
        text_encoder=te1, tokenizer=tok, text_encoder_2=te2, tokenizer_2=tok,
        text_encoder_3=null_t5(96, len(tok)), tokenizer_3=tok,
    )


def trained_modules(pipe) -> dict[str, torch.nn.Module]:
    return {"transformer": pipe.transformer, "text_encoder": pipe.text_encoder, "text_encoder_2": pipe.text_encoder_2}


def flow_matching_loss(pipe, prompts: list[str], x0: torch.Tensor, generator: torch.Generator, zero_tokens: int):
    """SD3's rectified-flow loss with logit-normal(0, 1) noise levels."""
    prompt_embeds, _, pooled, _ = pipe.encode_prompt(
        prompts, None, None, do_classifier_free_guidance=False, max_sequence_length=zero_tokens
    )
    b = x0.shape[0]
    sigma = torch.sigmoid(torch.randn(b, generator=generator)).view(b, 1, 1, 1)
    noise = torch.randn(x0.shape, generator=generator)
    xt = (1 - sigma) * x0 + sigma * noise
    pred = pipe.transformer(
        hidden_states=xt, timestep=sigma.flatten() * 1000, encoder_hidden_states=prompt_embeds,
        pooled_projections=pooled,
    ).sample
    return F.mse_loss(pred, noise - x0)


def _batch(step: int, cfg: GeneratorTrainConfig) -> tuple[list[str], torch.Tensor]:
    scenes = sample_scenes(cfg.batch_size, seed=cfg.seed * 1_000_003 + step, split="train")
    rng = random.Random(f"gen/{cfg.seed}/{step}")
    prompts = ["" if rng.random() < cfg.cfg_dropout else caption(s.spec, photo=rng.random() < 0.25) for s in scenes]
    return prompts, render(scenes, cfg.image_size) * 2 - 1


def export(pipe, ema: dict[str, torch.Tensor], out: Path, meta: dict) -> None:
    """Save the pipeline with the EMA weights swapped in (training weights restored afterwards)."""
    export_with_ema(pipe, trained_modules(pipe), ema, out, meta, GENERATION_DEFAULTS)


def train(cfg: GeneratorTrainConfig) -> Path:
    """Train on cfg.threads threads, restoring the caller's torch thread count afterwards."""
    with torch_threads(cfg.threads):
        return _train(cfg)


def _train(cfg: GeneratorTrainConfig) -> Path:
    work = Path(cfg.work)
    work.mkdir(parents=True, exist_ok=True)
    pipe = build_pipeline(cfg, work / "tokenizer")

    def step_loss(step: int) -> torch.Tensor:
        prompts, x0 = _batch(step, cfg)
        g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        return flow_matching_loss(pipe, prompts, x0, g, GENERATION_DEFAULTS["max_sequence_length"])

    return train_with_ema(cfg, pipe, trained_modules(pipe), step_loss, generation_defaults=GENERATION_DEFAULTS,
                          desc="generator", loss_window=200)


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for f, v in asdict(GeneratorTrainConfig()).items():
        parser.add_argument(f"--{f.replace('_', '-')}", type=type(v), default=v)
    return train(GeneratorTrainConfig(**vars(parser.parse_args(argv))))


if __name__ == "__main__":
    main()
