"""The dtype a pipeline adapter casts states to is the denoiser's compute dtype, not that of whichever parameter
comes first: diffusers keeps some modules in fp32 (`_keep_in_fp32_modules`; Wan's `scale_shift_table` is the
transformer's first parameter), and a bf16 Wan loaded through the real loader failed its first rollout step on
the GPU ("Input type (float) and bias type (c10::BFloat16)", benchmarks/gpu_scale.py on an H200)."""

from __future__ import annotations

import torch

from diffusion_rl.kernels import Kernel
from diffusion_rl.pipelines import load_pipeline, make_adapter
from diffusion_rl.rollout import rollout


def test_bf16_wan_rollout_casts_states_to_the_compute_dtype(tmp_path):
    from mmreward.testing.tiny_models import save_tiny_pipeline

    folder = save_tiny_pipeline("wan", tmp_path / "wan")
    pipe = load_pipeline(str(folder), torch.bfloat16, "cpu")
    model = pipe.transformer
    first = next(model.parameters())
    # the premise: the first parameter is one diffusers kept in fp32, the rest is bf16
    assert first.dtype == torch.float32
    assert model.patch_embedding.weight.dtype == torch.bfloat16
    adapter = make_adapter(pipe, 32, 32, 16, num_frames=5)
    assert adapter.model_dtype == torch.bfloat16
    emb = adapter.encode(["a red circle moving left"])
    out = rollout(adapter, emb, [0], [0], num_steps=2, guidance_scale=4.0, kernel=Kernel("flow_sde", 0.7),
                  decode=False)
    assert out.latents.shape[:2] == (1, 3) and torch.isfinite(out.latents.float()).all()
