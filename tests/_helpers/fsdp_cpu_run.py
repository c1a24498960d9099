"""Run by `torchrun --nproc_per_node 2` from tests/diffusion_rl/test_diffusion_rl_accelerate.py: tiny full fine-tunes under
FSDP2 and DDP on CPU (gloo), written to OUT/<mode>.

accelerate (1.15) does not shard on CPU: with an FSDP config and ACCELERATE_USE_CPU it runs plain DDP. So the
FSDP runs here use `CpuFSDP2`, an Accelerator that prepares the model the way accelerate's FSDP2 path does on
GPUs (torch `fully_shard`, the optimizer switched to the sharded parameters, clipping over DTensors, no
unwrapping), and the trainer runs unchanged on top: rollouts, EMA, clipping and checkpoints all see sharded
DTensor parameters, which is what this test is for.

After the uninterrupted FSDP runs (a full fine-tune, and a LoRA one), both processes sample with the trained,
still-sharded model (its EMA weights, which is what `final/` holds) and the main process saves the images to
OUT/<mode>/trained_samples.safetensors, for the test to compare with the exported `final/` loaded in diffusers.

`CpuFSDP2` shards the way an FSDP launch config with `fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP` does: each
module of the adapter's `block_classes` (named into the plugin by `diffusion_rl.accelerator.name_fsdp_blocks`)
is its own FSDP unit, then the root; each FSDP run writes the class names of its units to OUT/<mode>/fsdp_units.json.

    python fsdp_cpu_run.py CONFIG.yaml OUT            # SD3: FSDP full fine-tune + resume + LoRA, and DDP
    python fsdp_cpu_run.py CONFIG.yaml OUT video      # one FSDP LoRA iteration only (a video family)
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from safetensors.torch import save_file

from diffusion_rl.config import load_config
from diffusion_rl.trainer import Trainer


class CpuFSDP2(Accelerator):
    """accelerate's FSDP2 preparation (`fsdp2_prepare_model` + `fsdp2_switch_optimizer_parameters`), on CPU."""

    def __init__(self) -> None:
        from accelerate.utils import FullyShardedDataParallelPlugin

        super().__init__()
        # what an FSDP launch config with TRANSFORMER_BASED_WRAP gives accelerate (the state is shared with the DDP
        # accelerator of this process, whose distributed type is MULTI_CPU, so its prepare never reads it)
        self.state.fsdp_plugin = FullyShardedDataParallelPlugin(fsdp_version=2,
                                                                auto_wrap_policy="transformer_based_wrap")

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[Any, Any]:
        from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy, get_module_children_bottom_up
        from torch.distributed.fsdp import FSDPModule, fully_shard

        names = {id(p): n for n, p in model.named_parameters()}
        groups = [[names[id(p)] for p in g["params"]] for g in optimizer.param_groups]
        plugin = self.state.fsdp_plugin
        plugin.set_auto_wrap_policy(model)  # as fsdp2_prepare_model: _no_split_modules unless names were given
        policy = fsdp2_prepare_auto_wrap_policy(plugin, model)
        for module in get_module_children_bottom_up(model)[:-1]:  # accelerate's loop: blocks first, root last
            if policy is not None and policy(module) and not isinstance(module, FSDPModule):
                fully_shard(module)
        fully_shard(model)
        new = dict(model.named_parameters())
        for g, group_names in zip(optimizer.param_groups, groups, strict=True):
            g["params"] = [new[n] for n in group_names]
        return model, optimizer

    @contextlib.contextmanager
    def no_sync(self, model: Any) -> Iterator[None]:
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float = 2) -> torch.Tensor:
        return torch.nn.utils.clip_grad_norm_(list(parameters), max_norm, norm_type=norm_type).full_tensor()

    def unwrap_model(self, model: Any, *args: Any, **kwargs: Any) -> Any:
        return model  # fully_shard changes the module in place


@torch.no_grad()
def sample(pipe: Any) -> torch.Tensor:
    """The pipeline's own sampler with fixed noise, as a user of the export calls it (the test calls it too)."""
    pipe.set_progress_bar_config(disable=True)
    return pipe(["a red circle", "a blue square"], num_inference_steps=2, guidance_scale=2.0, height=16, width=16,
                max_sequence_length=8, output_type="pt", generator=torch.Generator().manual_seed(7)).images


def fsdp_units(model: torch.nn.Module) -> list[str]:
    """The class names of the model's FSDP units (fully_shard renames a class FSDP<Class>), root first."""
    from torch.distributed.fsdp import FSDPModule

    return [type(m).__name__.removeprefix("FSDP") for m in model.modules() if isinstance(m, FSDPModule)]


def main(config: str, out: str, mode: str = "all") -> None:
    acc_fsdp, acc_ddp = CpuFSDP2(), Accelerator()
    assert acc_ddp.num_processes == 2, "launch with torchrun --nproc_per_node 2 and ACCELERATE_USE_CPU=1"
    runs = {  # name: (accelerator, iterations, overrides)
        "fsdp_straight": (acc_fsdp, 2, []),
        "fsdp_resumed": (acc_fsdp, 1, []),
        "ddp": (acc_ddp, 2, []),
        "fsdp_lora": (acc_fsdp, 1, ["model.lora=true"]),
    }
    if mode == "video":
        runs = {"fsdp_lora": runs["fsdp_lora"]}
    for name, (acc, iterations, extra) in runs.items():
        cfg = load_config(config, [f"log.output_dir={out}/{name}", f"train.iterations={iterations}", *extra])
        trainer = Trainer(cfg, accelerator=acc)
        assert trainer.policy.sharded == (acc is acc_fsdp)
        if acc is acc_fsdp and acc.is_main_process:
            Path(out, name).mkdir(parents=True, exist_ok=True)
            Path(out, name, "fsdp_units.json").write_text(json.dumps(fsdp_units(trainer.policy.model)))
        trainer.fit()
        if mode == "video":
            acc.wait_for_everyone()
            return
        if name in ("fsdp_straight", "fsdp_lora"):  # every process runs the sharded forward passes
            with trainer.policy.averaged():
                images = sample(trainer.adapter.pipeline)
            if acc.is_main_process:
                save_file({"images": images.contiguous()}, str(Path(out) / name / "trained_samples.safetensors"))
        acc.wait_for_everyone()
    ckpt = Path(out) / "fsdp_resumed" / "checkpoints" / "iter_000001"
    cfg = load_config(config, [f"log.output_dir={out}/fsdp_resumed", "train.iterations=2", f"train.resume_from={ckpt}"])
    trainer = Trainer(cfg, accelerator=acc_fsdp)
    assert trainer.iteration == 1
    trainer.fit()
    acc_fsdp.wait_for_everyone()


if __name__ == "__main__":
    main(*sys.argv[1:])
