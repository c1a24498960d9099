"""Train the tiny ShapesWorld instruction-editing model as a standard diffusers FluxKontextPipeline.

    python -m mmreward.synthetic.build.train_edit_model --out assets/shapesworld/edit-model --steps 2500

Components (stock diffusers / transformers classes, saved with `pipe.save_pretrained`):
- transformer: a small FluxTransformer2DModel on 32x32 RGB pixels. Kontext packs 2x2 latent patches, so with
  the 3-channel identity VAE a token is a 2x2 pixel patch (in_channels 12): 256 noisy tokens plus 256 source
  tokens whose position ids differ only in the first coordinate (the pipeline's `image_ids[..., 0] = 1`),
  which lets the rotary attention copy the source pixel-for-pixel where nothing changes;
- vae: the analytic identity AutoencoderKL (identity_vae.py): the model is pixel-space (scale factor 1);
- text_encoder: a small CLIPTextModel (its pooled output is FLUX's pooled projection), text_encoder_2: a small
  T5EncoderModel (FLUX's per-token condition); both read ShapesWorld's CLIP BPE tokenizer and are trained
  jointly with the transformer;
- scheduler: FlowMatchEulerDiscreteScheduler (shift 1, no dynamic shifting); no guidance embedding, no CFG.

Objective: rectified flow on (source, instruction, edited) triples of `mmreward.synthetic.edits` (training
split, freshly rendered each step): x_t = (1 - s) x_edit + s eps with s logit-normal, target eps - x_edit,
the source's packed pixels in the condition. An EMA of the weights is exported. Checkpoints to `--work` and
resumes; data and noise are seeded by step.

Calling it: pass the source as PIL images, or as tensors already in [-1, 1] (with 3 channels, equal to the
VAE's latent channels, the pipeline takes a tensor as latents), with GENERATION_DEFAULTS:
    pipe(image=src * 2 - 1, prompt=instructions, **GENERATION_DEFAULTS, output_type="pt")
"""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from mmreward.errors import ConfigError
from mmreward.synthetic.build.ema_training import export_with_ema, train_with_ema
from mmreward.synthetic.build.threads import torch_threads
from mmreward.synthetic.edits import render_edit_targets, sample_edit_tasks

# What the model was trained for: 32x32 pixels, no resizing of the source, 16 text tokens, no guidance.
GENERATION_DEFAULTS = {"height": 32, "width": 32, "max_area": 32 * 32, "_auto_resize": False,
                       "max_sequence_length": 16, "num_inference_steps": 8}


@dataclass
class EditTrainConfig:
    out: str = "assets/shapesworld/edit-model"
    work: str = "build/shapesworld/edit-model"
    steps: int = 2500
    batch_size: int = 16
    lr: float = 1e-3
    warmup: int = 50
    heads: int = 3  # width = 32 * heads
    layers: int = 2  # double-stream blocks
    single_layers: int = 2
    text_len: int = 16
    ema: float = 0.995
    seed: int = 0
    threads: int = 1
    ckpt_every: int = 100
    export_every: int = 250

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1 or self.heads < 1:
            raise ConfigError(f"steps, batch_size and heads must be >= 1, got {self.steps}, {self.batch_size}, "
                              f"{self.heads}")
        if not 0 <= self.ema < 1:
            raise ConfigError(f"ema must be in [0, 1), got {self.ema}")


def build_pipeline(cfg: EditTrainConfig, tokenizer_dir: str | os.PathLike):
    """A fresh (randomly initialised) FluxKontextPipeline with the ShapesWorld edit architecture."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxKontextPipeline, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    from mmreward.synthetic.identity_vae import build_identity_vae
    from mmreward.synthetic.tokenizer import build_shapes_tokenizer

    torch.manual_seed(cfg.seed)
    tok = build_shapes_tokenizer(tokenizer_dir, max_length=cfg.text_len)
    vocab = len(tok)
    clip = CLIPTextModel(CLIPTextConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=cfg.text_len, bos_token_id=vocab - 2, eos_token_id=vocab - 1, pad_token_id=vocab - 1,
    ))
    # T5's default dropout (0.1) is on in training; a loaded pipeline is in eval mode, so inference has none
    t5 = T5EncoderModel(T5Config(vocab_size=vocab, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                                 relative_attention_num_buckets=8, relative_attention_max_distance=16,
                                 dropout_rate=0.1))
    transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=12, num_layers=cfg.layers, num_single_layers=cfg.single_layers,
        attention_head_dim=32, num_attention_heads=cfg.heads, joint_attention_dim=64, pooled_projection_dim=64,
        guidance_embeds=False, axes_dims_rope=(8, 12, 12),
    )
    return FluxKontextPipeline(
        transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=1.0), vae=build_identity_vae(),
        text_encoder=clip, tokenizer=tok, text_encoder_2=t5, tokenizer_2=tok,
    )


def trained_modules(pipe) -> dict[str, torch.nn.Module]:
    return {"transformer": pipe.transformer, "text_encoder": pipe.text_encoder, "text_encoder_2": pipe.text_encoder_2}


def pack(pipe, pixels: torch.Tensor) -> torch.Tensor:
    """(B, 3, 32, 32) in [-1, 1] -> Kontext's packed tokens (B, 256, 12) (identity VAE: latents are pixels)."""
    b, c, h, w = pixels.shape
    return pipe._pack_latents(pixels, b, c, h, w)


def velocity(pipe, instructions: list[str], source: torch.Tensor, xt: torch.Tensor, sigma: torch.Tensor,
             text_len: int) -> torch.Tensor:
    """The transformer's flow prediction for packed noisy tokens `xt` (B, 256, 12) at noise levels `sigma` (B,),
    conditioned as FluxKontextPipeline conditions it: the instruction and the source's packed pixels (in [-1, 1])."""
    prompt_embeds, pooled, text_ids = pipe.encode_prompt(instructions, None, max_sequence_length=text_len)
    b, _, h, w = source.shape
    ids = pipe._prepare_latent_image_ids(b, h // 2, w // 2, xt.device, xt.dtype)
    src_ids = ids.clone()
    src_ids[..., 0] = 1  # the pipeline's image_ids: the source's grid, first coordinate 1
    return pipe.transformer(
        hidden_states=torch.cat([xt, pack(pipe, source)], dim=1), timestep=sigma, guidance=None,
        pooled_projections=pooled, encoder_hidden_states=prompt_embeds, txt_ids=text_ids,
        img_ids=torch.cat([ids, src_ids], dim=0), return_dict=False,
    )[0][:, : xt.shape[1]]


def edit_flow_loss(pipe, instructions: list[str], source: torch.Tensor, target: torch.Tensor,
                   generator: torch.Generator, text_len: int) -> torch.Tensor:
    """Rectified-flow loss of the edited image given the source (both in [-1, 1]) and the instruction."""
    b = target.shape[0]
    sigma = torch.sigmoid(torch.randn(b, generator=generator)).view(b, 1, 1)
    x0 = pack(pipe, target)
    noise = torch.randn(x0.shape, generator=generator)
    xt = (1 - sigma) * x0 + sigma * noise
    return F.mse_loss(velocity(pipe, instructions, source, xt, sigma.flatten(), text_len), noise - x0)


def batch(step: int, cfg: EditTrainConfig) -> tuple[list[str], torch.Tensor, torch.Tensor]:
    tasks = sample_edit_tasks(cfg.batch_size, seed=cfg.seed * 1_000_003 + step, split="train")
    src, tgt = render_edit_targets(tasks, size=32)
    return [t.instruction for t in tasks], src * 2 - 1, tgt * 2 - 1


def export(pipe, ema: dict[str, torch.Tensor], out: Path, meta: dict) -> None:
    """Save the pipeline with the EMA weights swapped in (training weights restored afterwards)."""
    export_with_ema(pipe, trained_modules(pipe), ema, out, meta, GENERATION_DEFAULTS)


def train(cfg: EditTrainConfig) -> Path:
    """Train on cfg.threads threads, restoring the caller's torch thread count afterwards."""
    with torch_threads(cfg.threads):
        return _train(cfg)


def _train(cfg: EditTrainConfig) -> Path:
    work = Path(cfg.work)
    work.mkdir(parents=True, exist_ok=True)
    pipe = build_pipeline(cfg, work / "tokenizer")

    def step_loss(step: int) -> torch.Tensor:
        instructions, src, tgt = batch(step, cfg)
        g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        return edit_flow_loss(pipe, instructions, src, tgt, g, cfg.text_len)

    return train_with_ema(cfg, pipe, trained_modules(pipe), step_loss, generation_defaults=GENERATION_DEFAULTS,
                          desc="edit model")


PROMPT_SETS = {"train": (96, 0), "heldout": (64, 1)}  # split -> (number of edits, seed of sample_edit_tasks)


def write_prompt_sets(folder: str | Path) -> dict[str, Path]:
    """The edit records of configs/shapes_edit_grpo.yaml and shapes_edit_nft.yaml: `folder`/train (training split)
    and `folder`/heldout (held-out split, the first tasks `evaluate_edit_model` measures), each source PNGs +
    edits.jsonl."""
    from mmreward.synthetic.edits import write_edit_dataset

    return {split: write_edit_dataset(Path(folder) / split, sample_edit_tasks(n, seed=seed, split=split))
            for split, (n, seed) in PROMPT_SETS.items()}


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for f, v in asdict(EditTrainConfig()).items():
        parser.add_argument(f"--{f.replace('_', '-')}", type=type(v), default=v)
    return train(EditTrainConfig(**vars(parser.parse_args(argv))))


if __name__ == "__main__":
    main()
