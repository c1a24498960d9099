"""Held-out evaluation during training: deterministic samples of fixed noise, scored by the eval rewards."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from diffusion_rl.config import RunConfig
from diffusion_rl.context_parallel import degree
from diffusion_rl.kernels import Kernel
from diffusion_rl.memory_settings import rollout_kwargs
from diffusion_rl.pipelines import PipelineAdapter, PromptEmbeds
from diffusion_rl.policy import Policy
from diffusion_rl.rollout import rollout
from diffusion_rl.sample_assignment import DataRank
from mmreward.errors import ConfigError
from mmreward.prompt_sources import score_with_metadata

EVAL_EPOCH = 1_000_003  # the noise counter of evaluation samples: fixed, so every evaluation sees the same x_T



@torch.no_grad()
def evaluate(cfg: RunConfig, policy: Policy, adapter: PipelineAdapter, kernel: Kernel, prompts: list[str],
             rewards: dict[str, Any], embeds_for: Callable[[list[str]], PromptEmbeds], grid: Path | None) -> dict[str, float]:
    """ODE / DDIM eta=0 samples of the held-out prompts (EMA weights if kept), `eval_samples_per_prompt` each,
    split over the data ranks (a context-parallel group samples the same ones). Returns the mean and standard
    error of each reward (and of each per-sample detail a reward reports); saves a grid to `grid` on the main
    process."""
    if not prompts:
        return {}
    acc = policy.accelerator
    n = cfg.prompts.eval_samples_per_prompt
    items = [(p, i) for p in range(len(prompts)) for i in range(n)]
    data = DataRank.of(acc, degree(cfg.model.context_parallel))
    mine = items[data.items]
    model = policy.model.eval()  # the prepared model: under FSDP only it can gather the sharded weights
    scores: dict[str, list[float]] = {name: [] for name in rewards}
    images_all = []
    with policy.averaged():
        for start in range(0, len(mine), cfg.sample.batch_size):
            part = mine[start : start + cfg.sample.batch_size]
            texts = [prompts[p] for p, _ in part]
            with acc.autocast():
                traj = rollout(adapter, embeds_for(texts), [p for p, _ in part], [i for _, i in part],
                               num_steps=cfg.sample.eval_num_steps or cfg.sample.num_steps,
                               guidance_scale=cfg.sample.eval_guidance_scale or cfg.sample.guidance_scale,
                               kernel=kernel.deterministic(), seed=cfg.train.seed, epoch=EVAL_EPOCH, model=model,
                               **rollout_kwargs(cfg.sample, adapter))
            for name, r in rewards.items():
                res = score_with_metadata(r, texts, traj.images, prompts)
                scores[name] += res.scores.float().cpu().tolist()
                for key, val in res.details.items():  # e.g. ShapesEval's strict and partial accuracies
                    if val.ndim == 1 and len(val) == len(texts):
                        scores.setdefault(f"{name}/{key}", []).extend(val.float().cpu().tolist())
            images_all.append(traj.images.cpu())
    if cfg.log.gold_rewards and images_all:  # the hacking monitor's per-prompt diversity, renamed by the monitor
        from diffusion_rl.hacking_guard import DIVERSITY_KEY, pairwise_distances

        scores[DIVERSITY_KEY] = pairwise_distances(torch.cat(images_all), [p for p, _ in mine])
    from accelerate.utils import gather_object

    out = {}
    for name, vals in scores.items():
        # one copy per context-parallel group: its other processes scored the same samples
        allv = torch.tensor(gather_object(vals if data.leader else []) if acc.num_processes > 1 else vals,
                            dtype=torch.float64)
        allv = allv[~torch.isnan(allv)]  # a detail may not apply to every prompt (NaN)
        if len(allv) == 0:
            continue
        out[f"eval/{name}"] = float(allv.mean())
        out[f"eval/{name}_se"] = float(allv.std() / math.sqrt(len(allv))) if len(allv) > 1 else 0.0
    if acc.is_main_process and images_all and grid is not None:
        from diffusion_rl.reporting import grid_selection, save_captioned_grid

        rows = grid_selection(mine, cfg.log.max_grid_images)
        first = next(iter(rewards), None)
        captions = []
        for idx in rows:
            shown = " ".join(f"{scores[first][k]:.2f}" for k in idx) if first else ""
            captions.append(f"{prompts[mine[idx[0]][0]]} | {first}: {shown}" if first else prompts[mine[idx[0]][0]])
        save_captioned_grid(torch.cat(images_all), rows, captions, grid)
    return out


def check_sharded_evaluation(cfg: RunConfig, n_prompts: int, sharded: bool, num_processes: int) -> None:
    """A sharded model's forward is a collective: every process must sample the same number of images."""
    n_eval = n_prompts * cfg.prompts.eval_samples_per_prompt
    if sharded and n_eval % num_processes:
        raise ConfigError(f"with sharded weights (FSDP) the evaluation samples (prompts.eval x eval_samples_per_prompt"
                          f" = {n_eval}) must divide evenly over {num_processes} processes")
