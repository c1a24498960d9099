"""How much of a GRPO gradient is signal: policy gradients of independent rollout batches of the same prompts.

For one config, the trainer samples `--batches` iterations' worth of rollouts of one fixed set of prompts (fresh
noise each time), computes each batch's GRPO gradient exactly as an on-policy update would (one minibatch, the
config's trained steps, no KL term) and never steps the optimiser. It prints:

- the mean pairwise cosine of the gradients (0 when each batch's gradient is noise around a small mean);
- the signal fraction |E g|^2 / E|g|^2, estimated without bias from n gradients as
  (n |mean g|^2 - mean |g|^2) / ((n - 1) mean |g|^2): 1 for a noiseless gradient, 0 for pure noise;
- the batches needed for the mean gradient to be as large as its noise (1 / signal fraction).

    python benchmarks/gradient_agreement.py --config configs/shapes_video_grpo.yaml [--batches 6] [key=value ...]

Measured on 2 CPU threads (2026-11-24, 6 batches of 48 samples): the ShapesWorld image config and the video
config both give a cosine of about 0 and a signal fraction under 0.01 (see docs/results/shapes_video_grpo/).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):  # run as a script: the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch


def agreement(grads: torch.Tensor) -> dict[str, float]:
    """Statistics of an (n, P) stack of gradients, n >= 2 (see the module docstring)."""
    if grads.ndim != 2 or grads.shape[0] < 2:
        raise ValueError(f"grads: expected an (n >= 2, P) tensor, got shape {tuple(grads.shape)}")
    g = grads.double()
    n = g.shape[0]
    unit = g / g.norm(dim=1, keepdim=True).clamp_min(1e-30)
    cos = unit @ unit.T
    off = cos[~torch.eye(n, dtype=torch.bool)]
    sq = (g * g).sum(1).mean()
    signal = (n * g.mean(0).square().sum() - sq) / ((n - 1) * sq)
    return {"cosine_mean": float(off.mean()), "cosine_min": float(off.min()), "cosine_max": float(off.max()),
            "signal_fraction": float(signal), "grad_norm_mean": float(g.norm(dim=1).mean())}


def batch_gradients(config: str, overrides: Sequence[str], batches: int, same_noise: bool = False) -> torch.Tensor:
    """(batches, P) GRPO gradients of one prompt set; `same_noise` reuses iteration 1's noise (a determinism check:
    every row is then the same gradient)."""
    from diffusion_rl.config import load_config
    from diffusion_rl.trainer import Trainer

    cfg = load_config(config, [*overrides, "train.num_minibatches=1", "train.kl_beta=0.0", "log.progress=false"])
    trainer = Trainer(cfg)
    grads: list[torch.Tensor] = []

    def record() -> None:  # replaces the optimiser step: keep the gradient, leave the weights alone
        grads.append(torch.cat([p.grad.detach().flatten() for p in trainer.policy.trainable if p.grad is not None]))
        trainer.policy.optimizer.zero_grad(set_to_none=True)

    trainer.policy.step = record
    fixed = trainer.local_prompts(0)
    trainer.local_prompts = lambda it: fixed
    for b in range(batches):
        samples = trainer.sde_rollout(trainer.inputs(1 if same_noise else b + 1))  # rollout and rewards
        samples.advantages, _ = trainer.algorithm.advantages(samples)
        batch = samples.batch
        trainer.update(batch)
    return torch.stack(grads)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="a diffusion-rl training config (grpo)")
    parser.add_argument("--batches", type=int, default=6, help="independent rollout batches (>= 2)")
    parser.add_argument("overrides", nargs="*", help="section.key=value overrides of the config")
    args = parser.parse_args(argv)
    if args.batches < 2:
        parser.error("--batches must be >= 2")
    stats = agreement(batch_gradients(args.config, args.overrides, args.batches))
    print(f"{args.batches} batches, mean |g| {stats['grad_norm_mean']:.3g}")
    print(f"pairwise cosine: mean {stats['cosine_mean']:+.4f} (min {stats['cosine_min']:+.4f}, "
          f"max {stats['cosine_max']:+.4f})")
    frac = stats["signal_fraction"]
    print(f"signal fraction |E g|^2 / E|g|^2: {frac:+.4f}"
          + (f"; batches for signal = noise: {1 / frac:.0f}" if frac > 0 else "; no signal detected"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
