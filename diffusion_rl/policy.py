"""The trained denoiser: LoRA or full weights, the optimizer, the EMA and the frozen reference.

Both update rules (the PPO update in `diffusion_rl.trainer`, reward backpropagation in
`diffusion_rl.algorithms.draft`) end in the same `Policy.step`.
"""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path
from typing import Any

import torch

from diffusion_rl import memory_settings
from diffusion_rl.accelerator import name_fsdp_blocks
from diffusion_rl.config import RunConfig
from diffusion_rl.context_parallel import check_training, degree
from diffusion_rl.ema import EMA
from diffusion_rl.kernels import Kernel
from diffusion_rl.pipelines import DEFAULT_LORA_TARGETS, PipelineAdapter, PromptEmbeds, Schedule
from diffusion_rl.rollout import step_log_prob
from mmreward.errors import ConfigError


class Policy:
    """`model` is the accelerate-wrapped denoiser; `trainable` its trained parameters (fp32 even when the frozen
    weights are half precision, so optimiser state and updates keep full precision); `steps` counts updates."""

    def __init__(self, cfg: RunConfig, adapter: PipelineAdapter, accelerator: Any) -> None:
        self.accelerator = accelerator
        check_training(cfg, accelerator)
        # under context parallelism each process's gradient is its sequence shard's share (diffusion_rl/
        # context_parallel.py): `step` multiplies DDP's mean over all processes by the degree, which makes each
        # group's shares a sum (the whole clip's gradient) and leaves the mean over the data-parallel groups
        self.cp_degree = degree(cfg.model.context_parallel)
        model = adapter.denoiser
        self.ref_model = None
        if cfg.train.kl_beta > 0 and cfg.train.kl_reference == "copy":
            self.ref_model = copy.deepcopy(model).requires_grad_(False).eval()
        # None = auto: on for video pipelines (their activations are frames x pixels), off for images
        if memory_settings.gradient_checkpointing(cfg.model.gradient_checkpointing, adapter):
            model.enable_gradient_checkpointing()
        if cfg.model.lora:
            from mmreward.errors import DIFFUSION_EXTRA, require

            LoraConfig = require("peft", DIFFUSION_EXTRA, "model.lora").LoraConfig

            torch.manual_seed(cfg.train.seed)  # LoRA's random init must not depend on the process or run
            targets = cfg.model.lora_targets or DEFAULT_LORA_TARGETS[adapter.family]
            model.requires_grad_(False)
            model.add_adapter(LoraConfig(r=cfg.model.lora_rank, lora_alpha=cfg.model.lora_alpha,
                                         init_lora_weights=True if cfg.model.lora_init == "default" else "gaussian",
                                         target_modules=targets))
        else:
            model.requires_grad_(True)
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ConfigError(f"no trainable parameters: model.lora_targets {cfg.model.lora_targets} matched no module")
        for p in params:
            p.data = p.data.float()
        tc = cfg.train
        optimizer = torch.optim.AdamW(params, lr=tc.learning_rate, betas=(tc.adam_beta1, tc.adam_beta2),
                                      weight_decay=tc.weight_decay, eps=tc.adam_eps)
        name_fsdp_blocks(accelerator, adapter.block_classes)  # FSDP2 shards block by block (accelerator.py)
        self.model, self.optimizer = accelerator.prepare(model, optimizer)
        # FSDP replaces the parameters while preparing (sharded DTensors) and points the optimizer at the new
        # ones, so everything that touches parameters (clipping, EMA, checkpoints) takes them from the
        # prepared optimizer, never from the list built above
        self.trainable: list[torch.nn.Parameter] = [p for g in self.optimizer.param_groups for p in g["params"]]
        self.ema = EMA(self.trainable, tc.ema_decay, tc.ema_update_every) if tc.ema else None
        self.max_grad_norm = tc.max_grad_norm
        self.steps = 0

    @property
    def unwrapped(self) -> torch.nn.Module:
        """The model without its DDP wrapper (for names and adapters); under FSDP2 the sharded model itself."""
        return self.accelerator.unwrap_model(self.model)

    @property
    def sharded(self) -> bool:
        """Whether the trained parameters are sharded over processes (FSDP): every process must then run the
        same forward passes, and states are gathered before saving."""
        from torch.distributed.tensor import DTensor

        return any(isinstance(p, DTensor) for p in self.trainable)

    def step(self) -> float | None:
        """Clip, apply and clear the accumulated gradients, then update the EMA; returns the gradient norm
        before clipping (None when clipping is off). Under context parallelism the (DDP-averaged) gradients are
        first multiplied by the degree."""
        grad_norm = None
        if self.cp_degree > 1:  # the mean of the group's shard shares -> their sum, the whole clip's gradient
            torch._foreach_mul_([p.grad for p in self.trainable if p.grad is not None], float(self.cp_degree))
        if self.max_grad_norm is not None:
            norm = self.accelerator.clip_grad_norm_(self.trainable, self.max_grad_norm)
            grad_norm = None if norm is None else float(norm)  # DeepSpeed clips itself and may report no norm
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        if self.ema is not None:
            self.ema.step(self.steps)
        return grad_norm

    def averaged(self) -> contextlib.AbstractContextManager:
        """Inside the block the model holds the EMA weights, when an EMA is kept (evaluation, export)."""
        return self.ema.swapped() if self.ema is not None else contextlib.nullcontext()

    @torch.no_grad()
    def reference_mean(self, adapter: PipelineAdapter, x: torch.Tensor, x_next: torch.Tensor, steps: torch.Tensor,
                       schedule: Schedule, embeds: PromptEmbeds, guidance_scale: float, kernel: Kernel) -> torch.Tensor:
        """The reference policy's transition mean (for the KL term): the frozen copy, or the LoRA model with
        its adapters switched off."""
        if self.ref_model is not None:
            return step_log_prob(adapter, self.ref_model, x, x_next, steps, schedule, embeds, guidance_scale, kernel).mean
        model = self.unwrapped
        model.disable_adapters()
        try:
            return step_log_prob(adapter, model, x, x_next, steps, schedule, embeds, guidance_scale, kernel).mean
        finally:
            model.enable_adapters()

    def export(self, path: Path, adapter: PipelineAdapter, lora: bool) -> Path:
        """Save the trained model (the EMA weights, if kept) for inference in diffusers: the LoRA adapter with
        its alpha and targets (`pipe.load_lora_weights(path)`), or the whole pipeline with the trained denoiser
        (`DiffusionPipeline.from_pretrained(path)`); see `diffusion_rl.export`. Wan 2.2's two experts give one
        LoRA folder per trained expert (`path/transformer`, `path/transformer_2`: load the second with
        `load_into_transformer_2=True`), or a pipeline folder with each expert in its own component."""
        from diffusion_rl.export import export_lora, export_pipeline, export_sharded_pipeline

        model, main = self.unwrapped, self.accelerator.is_main_process
        with self.averaged():
            if lora:  # under FSDP every process gathers the adapter's shards; the main process writes
                return export_lora(adapter.pipeline, model, adapter.denoiser_attr, adapter.family, path, main)
            if self.sharded:  # FSDP: gathered (a collective) into a plain copy, then the same pipeline folder
                return export_sharded_pipeline(adapter.pipeline, self.model, adapter.denoiser_attr, path, main)
            return export_pipeline(adapter.pipeline, model, adapter.denoiser_attr, path)
