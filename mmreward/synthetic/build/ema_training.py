"""The training loop the ShapesWorld generators share (image, video, edit): AdamW with warm-up and a cosine
decay to 10%, gradient clipping at 1, an EMA of the trained weights, a resumable checkpoint written atomically
(tensors only, read back with weights_only) and exports of the pipeline with the EMA weights swapped in.
Each trainer brings its pipeline, the modules it trains and the loss of one step."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from mmreward.pickle_files import load_torch_file


def named_parameters(modules: dict[str, torch.nn.Module]) -> dict[str, torch.nn.Parameter]:
    return {f"{n}.{k}": p for n, m in modules.items() for k, p in m.named_parameters()}


def export_with_ema(pipe, modules: dict[str, torch.nn.Module], ema: dict[str, torch.Tensor], out: Path,
                    meta: dict, generation_defaults: dict) -> None:
    """Save the pipeline with the EMA weights swapped in (training weights restored afterwards)."""
    params = named_parameters(modules)
    backup = {k: p.detach().clone() for k, p in params.items()}
    with torch.no_grad():
        for k, p in params.items():
            p.copy_(ema[k])
        pipe.save_pretrained(out)
        for k, p in params.items():
            p.copy_(backup[k])
    (out / "shapesworld.json").write_text(json.dumps({"generation_defaults": generation_defaults, **meta}, indent=1))


def train_with_ema(cfg: Any, pipe, modules: dict[str, torch.nn.Module], step_loss: Callable[[int], torch.Tensor], *,
                   generation_defaults: dict, desc: str, last: int | None = None, loss_window: int = 100,
                   log_every: int = 20) -> Path:
    """Train `modules` for steps [resumed step, `last` or cfg.steps) of a cfg.steps-long schedule; `step_loss(step)`
    is the loss of one step (its data and noise seeded by the step, so a resumed run sees the same batches).
    `cfg` gives lr, warmup, steps, ema, ckpt_every, export_every, work and out (and `device`, if any)."""
    from tqdm import tqdm

    work, out = Path(cfg.work), Path(cfg.out)
    device = getattr(cfg, "device", "cpu")
    params = named_parameters(modules)
    for m in modules.values():
        m.train()
    opt = torch.optim.AdamW(params.values(), lr=cfg.lr, weight_decay=0.01, betas=(0.9, 0.99))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / cfg.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s / cfg.steps, 1))))
    )
    ema = {k: p.detach().clone() for k, p in params.items()}
    start, log, elapsed = 0, [], 0.0
    ckpt = work / "checkpoint.pt"
    if ckpt.exists():  # tensors only (weights_only): nothing is unpickled
        state = load_torch_file(ckpt, what="training checkpoint")
        with torch.no_grad():
            for k, p in params.items():
                p.copy_(state["params"][k])
        ema = {k: v.to(device) for k, v in state["ema"].items()}
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        start, log, elapsed = state["step"], state["log"], state.get("elapsed", 0.0)
        print(f"resumed from {ckpt} at step {start}", flush=True)
    t0 = time.time() - elapsed
    last = last or cfg.steps
    bar = tqdm(range(start, last), initial=start, total=last, desc=desc, mininterval=30)
    for step in bar:
        loss = step_loss(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        opt.step()
        sched.step()
        decay = min(cfg.ema, (1 + step) / (10 + step))
        with torch.no_grad():
            for k, p in params.items():
                ema[k].lerp_(p.detach(), 1 - decay)
        log.append(round(loss.item(), 5))
        if step % log_every == 0:
            bar.set_postfix(loss=f"{sum(log[-50:]) / len(log[-50:]):.4f}")
        done = step + 1
        if done % cfg.ckpt_every == 0 or done == last:
            tmp = work / "checkpoint.pt.tmp"
            torch.save({"step": done, "params": {k: p.detach().cpu() for k, p in params.items()},
                        "ema": {k: v.cpu() for k, v in ema.items()}, "opt": opt.state_dict(),
                        "sched": sched.state_dict(), "log": log, "elapsed": time.time() - t0, "config": asdict(cfg)},
                       tmp)
            os.replace(tmp, ckpt)
        if done % cfg.export_every == 0 or done == last:
            export_with_ema(pipe, modules, ema, out, {
                "trained_steps": done, "train_minutes": round((time.time() - t0) / 60, 1), "config": asdict(cfg),
                f"final_loss_mean_last_{loss_window}": round(sum(log[-loss_window:]) / len(log[-loss_window:]), 5),
            }, generation_defaults)
    return out
