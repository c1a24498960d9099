"""Memory for video (issue 17): chunked VAE decoding, gradient checkpointing on by default for video pipelines,
and rollout trajectories stored in CPU memory; each must leave the values (decodes, gradients, updates) unchanged,
and image pipelines must keep today's behaviour. CPU only here: on a CPU run "offloading" moves nothing, so the
device placement itself is checked by the CUDA test, skipped without a GPU."""

from __future__ import annotations

import pytest
import torch

from diffusion_rl.algorithms.draft import sample_with_truncated_backprop
from diffusion_rl.kernels import Kernel
from diffusion_rl.pipelines import decode_chunked, make_adapter
from diffusion_rl.rollout import rollout
from mmreward.errors import ConfigError
from tests._helpers.tolerances import assert_close_scaled

H = W = 32
FRAMES = 9  # 3 latent frames
MSL = 16
PROMPTS = ["a red circle moving left", "a blue square moving up"]


@pytest.fixture(scope="module")
def pipes(tmp_path_factory):
    from mmreward.testing.tiny_models import build_clip_tokenizer, build_tiny_pipeline

    tok = tmp_path_factory.mktemp("vmem_tok")
    build_clip_tokenizer(tok)
    out = {}
    for kind in ("wan", "sd3"):
        pipe = build_tiny_pipeline(kind, tok)
        pipe.set_progress_bar_config(disable=True)
        pipe.transformer.requires_grad_(False)
        out[kind] = pipe
    # gradients through a VAE decode carry float32 summation-order noise of ~5e-5 of their largest entry whatever
    # the batch layout (measured against float64: whole-batch 6.0e-6, chunked 4.3e-6 of a 0.155 maximum), so the
    # gradient tests decode in float64, where chunked and whole-batch decoding agree to 1e-15
    wan64 = build_tiny_pipeline("wan", tok)
    wan64.set_progress_bar_config(disable=True)
    wan64.transformer.requires_grad_(False)
    wan64.vae.to(torch.float64)
    out["wan64"] = wan64
    return out


def _adapter(pipes, kind):
    if kind in ("wan", "wan64"):
        return make_adapter(pipes[kind], H, W, MSL, num_frames=FRAMES)
    return make_adapter(pipes["sd3"], 16, 16, 8)


def _spy_decode_batches(adapter, monkeypatch) -> list[int]:
    """Record the batch size of every VAE decode the adapter runs."""
    sizes: list[int] = []
    original = adapter._decode_latents

    def spy(latents):
        sizes.append(int(latents.shape[0]))
        return original(latents)

    monkeypatch.setattr(adapter, "_decode_latents", spy)
    return sizes


# ----------------------------------------------------------------------------------------------
# 1. chunked decoding
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["wan", "sd3"])
def test_chunked_decode_equals_whole_batch_decode(pipes, kind, monkeypatch):
    adapter = _adapter(pipes, kind)
    z = torch.randn(3, *adapter.latent_shape(), generator=torch.Generator().manual_seed(0))
    whole = adapter.decode(z)
    sizes = _spy_decode_batches(adapter, monkeypatch)
    for chunk, expected_sizes in ((1, [1, 1, 1]), (2, [2, 1]), (5, [3])):
        sizes.clear()
        out = decode_chunked(adapter, z, chunk)
        assert sizes == expected_sizes
        # per-sample convolutions: a sample's decode does not depend on its batch neighbours up to float
        # summation order (measured on [0, 1] pixels: at most 3.9e-7 for Wan, 8.3e-7 for SD3, i.e. a few ulps)
        assert_close_scaled(out, whole, rel=5e-6, scale=1.0)
    sizes.clear()
    decode_chunked(adapter, z)  # auto: one clip at a time for video, the whole batch for images
    assert sizes == ([1, 1, 1] if kind == "wan" else [3])
    with pytest.raises(ConfigError, match="decode_chunk_size must be a whole number >= 1"):
        decode_chunked(adapter, z, 0)


@pytest.mark.parametrize(("kind", "rel"), [("wan64", 1e-12), ("sd3", 1e-5)])
def test_keep_graph_chunked_decode_gives_the_same_latent_gradients(pipes, kind, rel, monkeypatch):
    adapter = _adapter(pipes, kind)
    z0 = torch.randn(3, *adapter.latent_shape(), generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    weights = torch.rand(adapter.decode(z0).shape, generator=torch.Generator().manual_seed(3))
    sizes = _spy_decode_batches(adapter, monkeypatch)
    grads = []
    for chunk in (3, 1):
        z = z0.clone().requires_grad_(True)
        (decode_chunked(adapter, z, chunk, keep_graph=True) * weights).sum().backward()
        grads.append(z.grad)
    assert sizes == [3, 1, 1, 1]  # one whole-batch decode, then three one-sample chunks in one graph
    assert grads[0].abs().max() > 0
    assert_close_scaled(grads[1], grads[0], rel=rel)


def test_rollout_decodes_video_one_clip_at_a_time_and_images_whole(pipes, monkeypatch):
    for kind, default_sizes in (("wan", [1, 1]), ("sd3", [2])):
        adapter = _adapter(pipes, kind)
        emb = adapter.encode(PROMPTS)
        sizes = _spy_decode_batches(adapter, monkeypatch)
        kw = {"num_steps": 2, "guidance_scale": 2.0, "kernel": Kernel("flow_sde", 0.7)}
        auto = rollout(adapter, emb, [0, 1], [0, 0], **kw)
        assert sizes == default_sizes
        sizes.clear()
        whole = rollout(adapter, emb, [0, 1], [0, 0], decode_chunk_size=2, **kw)
        assert sizes == [2]
        assert torch.equal(auto.latents, whole.latents)
        assert_close_scaled(auto.images, whole.images, rel=5e-6, scale=1.0)  # as in the decode test above


def test_draft_chunked_decode_gives_the_same_model_gradients(pipes, monkeypatch):
    """DRaFT's keep_graph path: the reward gradient reaches the denoiser the same through chunked decodes."""
    adapter = _adapter(pipes, "wan64")
    model = adapter.denoiser
    params = [p for n, p in model.named_parameters() if "attn1.to_q" in n]
    emb = adapter.encode(PROMPTS)
    sizes = _spy_decode_batches(adapter, monkeypatch)
    grads = []
    try:
        for p in params:
            p.requires_grad_(True)
        for chunk in (2, 1):
            model.zero_grad(set_to_none=True)
            videos = sample_with_truncated_backprop(
                adapter, model, emb, [0, 1], [0, 1], num_steps=2, guidance_scale=1.0, kernel=Kernel("ode", 0.0),
                backprop_steps=1, seed=0, epoch=0, decode_chunk_size=chunk)
            videos[:, :, 0].mean().backward()  # a red-channel "reward"
            grads.append([p.grad.clone() for p in params])
    finally:
        model.requires_grad_(False)
        model.zero_grad(set_to_none=True)
    assert sizes == [2, 1, 1]
    assert max(float(g.abs().max()) for g in grads[0]) > 0
    for g1, g2 in zip(grads[1], grads[0]):
        assert_close_scaled(g1, g2, rel=1e-5)


# ----------------------------------------------------------------------------------------------
# config keys
# ----------------------------------------------------------------------------------------------
def test_memory_keys_are_typed_and_documented():
    from diffusion_rl.config import ModelConfig, SampleConfig
    from diffusion_rl.config_check import config_keys

    keys = {k.key: k for k in config_keys()}
    for key in ("sample.decode_chunk_size", "sample.offload_trajectory", "model.gradient_checkpointing"):
        assert keys[key].default == "None" and "auto" in keys[key].help and "video" in keys[key].help
    with pytest.raises(ConfigError, match="sample.decode_chunk_size must be > 0, got 0"):
        SampleConfig(decode_chunk_size=0)
    with pytest.raises(ConfigError, match="sample.decode_chunk_size counts something"):
        SampleConfig(decode_chunk_size=1.5)
    with pytest.raises(ConfigError, match="sample.offload_trajectory must be true or false"):
        SampleConfig(offload_trajectory="yes")
    with pytest.raises(ConfigError, match="model.gradient_checkpointing must be true or false"):
        ModelConfig(pretrained="x", gradient_checkpointing=1)


# ----------------------------------------------------------------------------------------------
# 2 and 3: gradient checkpointing and trajectory offloading in training
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pipe_dirs(tiny_pipeline_dir):
    """The session's tiny Wan and SD3 pipeline (conftest.tiny_pipeline_dir: built once per worker, shared read-only)."""
    return {k: str(tiny_pipeline_dir(k)) for k in ("wan", "sd3")}


def _cfg(pipe_dirs, kind: str, out, model: dict | None = None, sample: dict | None = None):
    from diffusion_rl.config import from_dict

    video = kind == "wan"
    return from_dict({
        "model": {"pretrained": pipe_dirs[kind], "height": H if video else 16, "width": W if video else 16,
                  "lora_rank": 4, "lora_alpha": 4, "max_sequence_length": MSL if video else 8,
                  "num_frames": FRAMES if video else None, **(model or {})},
        "sample": {"num_steps": 2, "guidance_scale": 2.0, "kernel": "flow_sde", "noise_level": 0.7,
                   "prompts_per_iteration": 2, "group_size": 2, "batch_size": 2, **(sample or {})},
        "train": {"algorithm": "grpo", "iterations": 1, "learning_rate": 1e-2, "probe": "error",
                  "timestep_fraction": 1.0, "kl_beta": 0.01, "micro_batch_size": 2},
        "ppo": {"ratio_norm": True},
        "advantage": {"min_count": 2},
        "reward": {"rewards": {"mock": 1.0}},
        "prompts": {"train": PROMPTS},
        "log": {"output_dir": str(out), "eval_every": 0, "grid_every": 0, "progress": False},
    })


def _iteration_grads(trainer) -> tuple[list[torch.Tensor], dict]:
    """One GRPO iteration; the accumulated gradients of the trained parameters just before the optimizer step."""
    grads: list[torch.Tensor] = []
    step = trainer.policy.step

    def recording_step():
        grads.extend(p.grad.detach().clone() for p in trainer.trainable)
        return step()

    trainer.policy.step = recording_step
    return grads, trainer.train_iteration(0)


def test_gradient_checkpointing_is_on_by_default_for_video_with_the_same_gradients(pipe_dirs, tmp_path):
    from diffusion_rl.trainer import Trainer

    auto = Trainer(_cfg(pipe_dirs, "wan", tmp_path / "auto"))
    off = Trainer(_cfg(pipe_dirs, "wan", tmp_path / "off", model={"gradient_checkpointing": False}))
    assert auto.policy.unwrapped.is_gradient_checkpointing
    assert not off.policy.unwrapped.is_gradient_checkpointing
    g_auto, _ = _iteration_grads(auto)
    g_off, _ = _iteration_grads(off)
    assert len(g_auto) == len(g_off) > 0 and max(float(g.abs().max()) for g in g_off) > 0
    # recomputation runs the same ops on the same inputs: equal up to float32 reordering (measured: bit-equal)
    for a, b in zip(g_auto, g_off):
        assert_close_scaled(a, b, rel=1e-5, scale=max(float(b.abs().max()), 1e-12))


def test_image_pipelines_keep_todays_memory_behaviour(pipe_dirs, tmp_path):
    from diffusion_rl import memory_settings
    from diffusion_rl.trainer import Trainer

    trainer = Trainer(_cfg(pipe_dirs, "sd3", tmp_path))
    assert not trainer.policy.unwrapped.is_gradient_checkpointing
    assert memory_settings.rollout_kwargs(trainer.cfg.sample, trainer.adapter) == {"decode_chunk_size": None, "offload": False}
    assert trainer.adapter.default_decode_chunk_size(7) == 7
    forced = Trainer(_cfg(pipe_dirs, "sd3", tmp_path / "on", model={"gradient_checkpointing": True}))
    assert forced.policy.unwrapped.is_gradient_checkpointing


def test_offloaded_trajectory_gives_a_bit_identical_update(pipe_dirs, tmp_path):
    from diffusion_rl import memory_settings
    from diffusion_rl.trainer import Trainer

    runs = {}
    for offload in (True, False):
        trainer = Trainer(_cfg(pipe_dirs, "wan", tmp_path / str(offload), sample={"offload_trajectory": offload}))
        assert memory_settings.rollout_kwargs(trainer.cfg.sample, trainer.adapter)["offload"] is offload
        batch, _ = trainer.collect(0)
        for t in (batch.traj.latents, batch.traj.log_probs, batch.traj.means, batch.traj.images):
            assert t.device.type == "cpu"
        before = [p.detach().clone() for p in trainer.trainable]
        trainer.train_iteration(0)
        runs[offload] = [p.detach().clone() for p in trainer.trainable]
        assert any(not torch.equal(a, b) for a, b in zip(before, runs[offload]))
    auto = Trainer(_cfg(pipe_dirs, "wan", tmp_path / "auto"))
    assert memory_settings.rollout_kwargs(auto.cfg.sample, auto.adapter)["offload"] is True  # auto: on for video
    for a, b in zip(runs[True], runs[False]):
        assert torch.equal(a, b)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: on CPU nothing moves")
def test_offloaded_trajectory_lives_on_cpu_while_the_model_is_on_cuda(pipe_dirs, tmp_path):
    from diffusion_rl.trainer import Trainer

    runs = {}
    for offload in (True, False):
        trainer = Trainer(_cfg(pipe_dirs, "wan", tmp_path / str(offload), sample={"offload_trajectory": offload}))
        assert trainer.adapter.device.type == "cuda"
        batch, _ = trainer.collect(0)
        where = {t.device.type for t in (batch.traj.latents, batch.traj.log_probs, batch.traj.means, batch.traj.images)}
        assert where == ({"cpu"} if offload else {"cuda"})
        trainer.train_iteration(0)
        runs[offload] = [p.detach().cpu() for p in trainer.trainable]
    for a, b in zip(runs[True], runs[False]):
        assert torch.equal(a, b)
