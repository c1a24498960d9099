"""Generator samples on training-split prompts, labelled by the exact ShapesEval checker.

    python -m mmreward.synthetic.build.generated_pool --generator assets/shapesworld/generator \\
        --prompts 400 --per-prompt 8 --steps 4 20 --out runs/pool.pt

A CLIP trained only on clean renders cannot tell which of a generator's blobby samples the checker
accepts (within-prompt AUC about 0.5 on the shipped generator), so a reward built on it gives noise
search nothing to climb. The pool is the ShapesWorld counterpart of Pick-a-Pic / ImageReward data:
samples of the model being judged, with a verdict per sample, here from the exact checker instead of
humans. Only training-split prompts are used, and of those only the ones not reserved for evaluating
reward optimisation (`reserved_for_evaluation`), so ReNO / best-of-N results on the reserved prompts are
on prompts the reward never saw in any form.

Saved as one torch file: {"images": uint8 (N, 3, H, W), "prompts": [str], "strict": (N,), "partial": (N,),
"steps": (N,), "generator": str}.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from mmreward.errors import ConfigError, RewardInputError
from mmreward.pickle_files import load_torch_file


def reserved_for_evaluation(prompt: str) -> bool:
    """A fixed third of each category's training-split prompts (every third by a hash of the caption) that
    reward-hardening data never uses: ReNO and best-of-N are evaluated on them (the compositional held-out
    split is a separate, harder test)."""
    return prompt in _reserved()


@functools.lru_cache(maxsize=1)
def _reserved() -> frozenset[str]:
    from mmreward.synthetic.captions import caption
    from mmreward.synthetic.scenes import specs_for_split

    out: set[str] = set()
    for specs in specs_for_split("train").values():
        ranked = sorted((caption(s) for s in specs), key=lambda c: hashlib.sha256(c.encode()).hexdigest())
        out.update(ranked[::3])
    return frozenset(out)


def reward_training_specs(n: int, seed: int) -> list:
    """n training-split prompt specs (uniform category, then uniform prompt) outside the evaluation reserve."""
    from mmreward.synthetic.captions import caption
    from mmreward.synthetic.scenes import sample_specs

    out: list = []
    round_ = 0
    while len(out) < n:
        out += [s for s in sample_specs(2 * n, seed=seed * 1000 + round_, split="train")
                if not reserved_for_evaluation(caption(s))]
        round_ += 1
    return out[:n]


@dataclass
class GeneratedPool:
    images: torch.Tensor  # uint8 (N, 3, H, W)
    prompts: list[str]
    strict: torch.Tensor  # (N,) 0/1
    partial: torch.Tensor  # (N,)

    def __post_init__(self) -> None:
        n = self.images.shape[0]
        if self.images.ndim != 4 or self.images.dtype != torch.uint8:
            raise RewardInputError(f"pool images: expected uint8 (N, 3, H, W), got {self.images.dtype} {tuple(self.images.shape)}")
        if not (len(self.prompts) == n == len(self.strict) == len(self.partial)):
            raise RewardInputError(
                f"pool: images, prompts, strict and partial must have one entry per sample, got "
                f"{n}, {len(self.prompts)}, {len(self.strict)}, {len(self.partial)}"
            )

    @classmethod
    def load(cls, path: str | Path) -> GeneratedPool:
        if not Path(path).is_file():
            raise ConfigError(f"generated pool {str(path)!r} does not exist; build it with "
                              "`python -m mmreward.synthetic.build.generated_pool --out PATH`")
        d = load_torch_file(path, what="generated pool")
        return cls(d["images"], list(d["prompts"]), d["strict"], d["partial"])

    @classmethod
    def load_many(cls, paths: str | Sequence[str | Path]) -> GeneratedPool:
        """One pool from several files ("a.pt,b.pt" or a list); images must share one size."""
        if isinstance(paths, str):
            paths = [p for p in paths.split(",") if p]
        pools = [cls.load(p) for p in paths]
        if not pools:
            raise ConfigError("generated: expected at least one pool file")
        sizes = {tuple(p.images.shape[1:]) for p in pools}
        if len(sizes) > 1:
            raise RewardInputError(f"generated pools have different image sizes {sorted(sizes)}; use one size")
        return cls(torch.cat([p.images for p in pools]), [x for p in pools for x in p.prompts],
                   torch.cat([p.strict for p in pools]), torch.cat([p.partial for p in pools]))

    def contrast_groups(self) -> list[tuple[list[int], list[int]]]:
        """Per prompt with both verdicts: (indices the checker accepts, indices it rejects)."""
        if getattr(self, "_groups", None) is None:
            self._groups = self._contrast_groups()
        return self._groups

    def _contrast_groups(self) -> list[tuple[list[int], list[int]]]:
        by_prompt: dict[str, tuple[list[int], list[int]]] = {}
        for i, (p, s) in enumerate(zip(self.prompts, self.strict.tolist())):
            by_prompt.setdefault(p, ([], []))[0 if s > 0.5 else 1].append(i)
        return [g for g in by_prompt.values() if g[0] and g[1]]


@torch.no_grad()
def build_pool(
    generator: str | Path,
    n_prompts: int = 400,
    per_prompt: int = 8,
    steps: Sequence[int] = (4, 20),
    seed: int = 0,
    batch_size: int = 128,
    progress: bool = True,
) -> dict:
    """Sample `per_prompt` images for each of `n_prompts` training prompts at every step count, and check them."""
    from diffusers.utils import logging as diffusers_logging
    from tqdm.auto import tqdm

    from mmreward.synthetic.build.evaluate_generator import generate, load_generator
    from mmreward.synthetic.captions import caption
    from mmreward.synthetic.checker import check, detect

    if n_prompts < 1 or per_prompt < 1 or not steps:
        raise ConfigError(f"need n_prompts >= 1, per_prompt >= 1 and some steps, got {n_prompts}, {per_prompt}, {steps}")
    diffusers_logging.set_verbosity_error()  # every call warns that the 4 zero T5 tokens truncate the prompt
    pipe = load_generator(generator)
    specs = reward_training_specs(n_prompts, seed)
    specs = [s for s in specs for _ in range(per_prompt)]
    prompts = [caption(s) for s in specs]
    images, strict, partial, step_of = [], [], [], []
    for k, n_steps in enumerate(tqdm(list(steps), desc="pool", disable=not progress)):
        imgs = generate(pipe, prompts, seed=seed * 1000 + k * 7 + 1, batch_size=batch_size, num_inference_steps=n_steps)
        res = check(specs, detect(imgs))
        images.append((imgs * 255).round().to(torch.uint8))
        strict.append(res.strict)
        partial.append(res.partial)
        step_of.append(torch.full((len(prompts),), n_steps))
    return {"images": torch.cat(images), "prompts": prompts * len(steps), "strict": torch.cat(strict),
            "partial": torch.cat(partial), "steps": torch.cat(step_of), "generator": str(generator)}


def main(argv: Sequence[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--generator", default="assets/shapesworld/generator")
    p.add_argument("--prompts", type=int, default=400, help="training-split prompts (drawn per category)")
    p.add_argument("--per-prompt", type=int, default=8)
    p.add_argument("--steps", type=int, nargs="+", default=[4, 20], help="sampling step counts")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    t0 = time.time()
    pool = build_pool(args.generator, args.prompts, args.per_prompt, args.steps, args.seed)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    torch.save(pool, args.out)
    summary = {"samples": len(pool["prompts"]), "strict": float(pool["strict"].mean()),
               "groups": len(GeneratedPool(pool["images"], pool["prompts"], pool["strict"], pool["partial"]).contrast_groups()),
               "minutes": round((time.time() - t0) / 60, 1)}
    print(summary)
    return summary


if __name__ == "__main__":
    main()
