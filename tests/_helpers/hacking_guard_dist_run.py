"""Run by `torchrun --standalone --nproc_per_node 2` from tests/diffusion_rl/test_hacking_guard_distributed.py: a tiny DRaFT run
on CPU (gloo, DDP) with the reward-hacking monitor in `rollback` mode and a scripted alarm, recording what each
process did for the test to compare.

Rewards (registered here, in every process): `dist-proxy` is the training reward, the mock colour reward when
scored with grad (DRaFT's update, so the weights really move) and the next value of PROXY otherwise (the
evaluations); `dist-gold` is the gold reward, the next value of GOLD. Each process scores its own half of the
evaluation samples, one call per evaluation, so every process steps through the same script.

Each process writes, under OUT:
    pid<r>                         its process id, written first (for the test to stop a hung run)
    rank<r>.json                   its last iteration, whether the guard stopped it, its alarms, and every
                                   checkpoint write it made (`write_checkpoint` calls: folder name)
    rank<r>_final.safetensors      the trained parameters it ends the run with
    rank<r>_before.safetensors     the trained parameters it held just before the rollback

    python hacking_guard_dist_run.py CONFIG.yaml OUT
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from diffusion_rl import checkpointing
from diffusion_rl.config import load_config
from diffusion_rl.trainer import Trainer
from mmreward.models.mock import MockReward
from mmreward.registry import RewardSpec, register_reward
from mmreward.types import Reward, RewardOutput

# evaluations at iterations 1, 2, 3, ... (no evaluation at start): the proxy rises, gold is best at the first
# evaluation and falls from there; with window 3 and tolerance 0.02 the fitted gold change over iterations 1..3
# is 0.45 - 0.70 = -0.25 while the proxy rises by 2: the alarm fires at iteration 3, and the only best-by-gold
# checkpoint is that of iteration 1
PROXY = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
GOLD = [0.70, 0.60, 0.45, 0.40, 0.35, 0.30]


class Scripted(Reward):
    modalities = ("image",)
    differentiable = True
    requires_prompt = False

    def __init__(self, script: list[float]) -> None:
        super().__init__()
        self.script, self.calls, self.mock = script, 0, MockReward()

    def _score(self, prompts: list[str], media: torch.Tensor) -> RewardOutput:
        if torch.is_grad_enabled():
            return self.mock._score(prompts, media)
        value = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        return RewardOutput(torch.full((len(prompts),), value) + 0 * media.flatten(1).mean(1))


def _trained(trainer: Trainer) -> dict[str, torch.Tensor]:
    names = {id(p): n for n, p in trainer.policy.unwrapped.named_parameters()}
    return {names[id(p)]: p.detach().cpu().clone().contiguous() for p in trainer.trainable}


def main(config: str, out: str) -> None:
    # the test stops a hung run by these pids: torchrun starts each worker in a session of its own
    (Path(out) / f"pid{os.environ['RANK']}").write_text(str(os.getpid()))
    for name, script in (("dist-proxy", PROXY), ("dist-gold", GOLD)):
        register_reward(RewardSpec(name, lambda checkpoint=None, s=script, **kw: Scripted(s), "scripted",
                                   differentiable=True, needs_weights=False), overwrite=True)
    trainer = Trainer(load_config(config))
    rank = trainer.accelerator.process_index
    assert trainer.accelerator.num_processes == 2, "launch with torchrun --nproc_per_node 2 and ACCELERATE_USE_CPU=1"
    writes: list[str] = []
    real_write = checkpointing.write_checkpoint

    def recording_write(state: dict[str, Any], path: Any) -> Path:
        writes.append(Path(path).name)
        return real_write(state, path)

    checkpointing.write_checkpoint = recording_write  # the trainer calls it through the module
    real_restore = trainer.guard.actions.restore

    def recording_restore(path: Path) -> None:  # the guard's rollback action, as the trainer gave it
        save_file(_trained(trainer), str(Path(out) / f"rank{rank}_before.safetensors"))
        real_restore(path)

    trainer.guard.actions = dataclasses.replace(trainer.guard.actions, restore=recording_restore)
    hist = trainer.fit()
    save_file(_trained(trainer), str(Path(out) / f"rank{rank}_final.safetensors"))
    record = {"iteration": trainer.iteration, "stopped": trainer.guard.stopped, "writes": writes,
              "alarms": [h["iteration"] for h in hist if h.get("hacking_alarm")],
              "rolled_back_to": [h["guard/rolled_back_to"] for h in hist if "guard/rolled_back_to" in h]}
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(*sys.argv[1:3])
