"""Wan 2.2 A14B two-expert text-to-video (WanPipeline + transformer_2 + boundary_ratio) and Wan image-to-video
(WanImageToVideoPipeline) through `diffusion_rl.adapters.wan22`, on tiny pipelines built from config with random
weights (`mmreward.testing.tiny_wan22`). The reference is diffusers==0.42.1's own pipelines (pipeline_wan.py,
pipeline_wan_i2v.py) run with a FlowMatchEulerDiscreteScheduler at the official flow_shift."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from diffusion_rl.adapters.wan import WanAdapter
from diffusion_rl.adapters.wan22 import Wan22Adapter, WanExperts, WanI2VAdapter
from diffusion_rl.kernels import Kernel
from diffusion_rl.rollout import rollout, step_log_prob
from mmreward.edit import EditPrompt
from mmreward.errors import ConfigError
from tests._helpers.tolerances import assert_close_scaled

H = W = 32
FRAMES = 9  # (9 - 1) / 4 + 1 = 3 latent frames
MSL = 16
PROMPTS = ["a red circle moving left", "a blue square moving up"]
STEPS = 4  # Euler shift 3 timesteps 1000, 857.7, 602.2, 8.9: step 0 on the high-noise expert, 1-3 on the low one


def _euler(pipe):
    from diffusers import FlowMatchEulerDiscreteScheduler

    pipe.scheduler = FlowMatchEulerDiscreteScheduler(shift=pipe.scheduler.config.flow_shift)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module")
def t2v():
    from mmreward.testing.tiny_wan22 import build_tiny_wan22

    return _euler(build_tiny_wan22("t2v"))


@pytest.fixture(scope="module")
def first_frame(tmp_path_factory):
    from PIL import Image

    path = tmp_path_factory.mktemp("wan22_frames") / "frame.png"
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(path)  # resized to 32x32 by the pipeline
    return Image.open(path).convert("RGB"), [EditPrompt(p, path) for p in PROMPTS]


def test_experts_and_boundary_follow_the_pipeline(t2v):
    adapter = Wan22Adapter(t2v, H, W, MSL, FRAMES)
    assert isinstance(adapter, Wan22Adapter) and isinstance(adapter.denoiser, WanExperts)
    assert adapter.denoiser.high is t2v.transformer and adapter.denoiser.low is t2v.transformer_2
    assert adapter.boundary_timestep == 875.0  # boundary_ratio 0.875 x num_train_timesteps 1000
    sched = adapter.schedule(STEPS)
    assert adapter.expert_of(sched.timesteps).tolist() == [True, False, False, False]
    # WanPipeline's registered adapter hands a two-expert pipeline over, so make_adapter and the trainer get it
    from diffusion_rl.pipelines import make_adapter

    assert type(make_adapter(t2v, H, W, MSL, FRAMES)) is Wan22Adapter
    # a one-transformer WanPipeline gets the plain Wan adapter, as before
    from diffusers import WanPipeline

    one = WanPipeline(tokenizer=t2v.tokenizer, text_encoder=t2v.text_encoder, vae=t2v.vae, scheduler=t2v.scheduler,
                      transformer=t2v.transformer)
    plain = Wan22Adapter(one, H, W, MSL, FRAMES)
    assert type(plain) is WanAdapter and plain.denoiser is t2v.transformer


@pytest.mark.parity
@pytest.mark.parametrize("scale_2", [2.5])  # None (one scale on both experts): the adapter conformance suite
def test_ode_rollout_equals_two_expert_wan_pipeline(t2v, scale_2):
    from tests._helpers.parity_record import record_parity

    adapter = Wan22Adapter(t2v, H, W, MSL, FRAMES, guidance_scale_2=scale_2)
    traj = rollout(adapter, adapter.encode(PROMPTS), [0, 1], [0, 0], num_steps=STEPS, guidance_scale=4.0,
                   kernel=Kernel("ode", 0.0))
    kw = {"num_inference_steps": STEPS, "guidance_scale": 4.0, "guidance_scale_2": scale_2, "height": H, "width": W,
          "num_frames": FRAMES, "max_sequence_length": MSL, "latents": traj.latents[:, 0].clone()}
    ref = t2v(PROMPTS, output_type="latent", **kw).frames
    record_parity("wan22_t2v", original="diffusers==0.42.1 WanPipeline (transformer_2, boundary_ratio)",
                  how="package", actual=traj.latents[:, -1], expected=ref, cases=(f"video, guidance_scale_2={scale_2}",))
    assert_close_scaled(traj.latents[:, -1], ref, rel=1e-5)
    video = t2v(PROMPTS, output_type="pt", **kw).frames  # (B, T, 3, H, W) in [0, 1]
    assert traj.images.shape == video.shape == (2, FRAMES, 3, H, W)
    assert_close_scaled(traj.images, video, rel=1e-5)
    # the low-noise expert matters: running every step on the high one gives another video
    adapter.boundary_ratio = 0.001
    only_high = rollout(adapter, adapter.encode(PROMPTS), [0, 1], [0, 0], num_steps=STEPS, guidance_scale=4.0,
                        kernel=Kernel("ode", 0.0), decode=False)
    assert (only_high.latents[:, -1] - ref).abs().max() > 1e-3


def _independent_cfg(pipe, expert, x, t, pe, neg, scale):
    """The pipeline's denoising step transcribed (diffusers==0.42.1 pipeline_wan.py __call__): the expert's
    conditional and unconditional passes, then noise_uncond + scale (noise_pred - noise_uncond)."""
    model = pipe.transformer if expert == "high" else pipe.transformer_2
    ts = t.expand(x.shape[0])
    cond = model(hidden_states=x, timestep=ts, encoder_hidden_states=pe, return_dict=False)[0]
    uncond = model(hidden_states=x, timestep=ts, encoder_hidden_states=neg.expand(x.shape[0], -1, -1),
                   return_dict=False)[0]
    return uncond + scale * (cond - uncond)


def test_sde_log_probs_are_gaussian_densities_of_each_steps_expert(t2v):
    adapter = Wan22Adapter(t2v, H, W, MSL, FRAMES, guidance_scale_2=2.0)
    emb = adapter.encode(PROMPTS)
    pe, neg = emb.tensors["prompt_embeds"], adapter.negative().tensors["prompt_embeds"]
    traj = rollout(adapter, emb, [0, 1], [0, 1], num_steps=STEPS, guidance_scale=4.0, kernel=Kernel("flow_sde", 0.7),
                   sde_steps=[0, 1, 2], decode=False)
    sigmas = traj.schedule.a.tolist() + [float(traj.schedule.b[-1])]
    with torch.no_grad():
        for j in range(3):
            x, t = traj.latents[:, j], traj.schedule.timesteps[j]
            expert, scale = ("high", 4.0) if float(t) >= 875.0 else ("low", 2.0)
            v = _independent_cfg(t2v, expert, x, t, pe, neg, scale).double()
            # Flow-GRPO's sde_step_with_logprob (yifan123/flow_grpo@54809b5 flow_grpo/diffusers_patch/sd3_sde_with_logprob.py)
            sigma, sigma_next = sigmas[j], sigmas[j + 1]
            dt = sigma_next - sigma
            std_t = 0.7 * math.sqrt(sigma / (1 - (sigmas[1] if sigma == 1 else sigma)))
            mean = x.double() * (1 + std_t**2 / (2 * sigma) * dt) + v * (1 + std_t**2 * (1 - sigma) / (2 * sigma)) * dt
            density = torch.distributions.Normal(mean, std_t * math.sqrt(-dt)).log_prob(traj.latents[:, j + 1].double())
            assert_close_scaled(traj.log_probs[:, j].double(), density.mean(dim=(1, 2, 3, 4)), rel=1e-4)
    assert (traj.log_probs[:, 3] == 0).all()
    # the training path with one batch spanning both experts (sample 0 at step 0: high, sample 1 at step 1: low)
    res = step_log_prob(adapter, adapter.denoiser, traj.latents[[0, 1], [0, 1]], traj.latents[[0, 1], [1, 2]],
                        torch.tensor([0, 1]), traj.schedule, emb, 4.0, Kernel("flow_sde", 0.7))
    assert_close_scaled(res.log_prob, torch.stack([traj.log_probs[0, 0], traj.log_probs[1, 1]]), rel=1e-5)


@pytest.mark.parity
@pytest.mark.parametrize("kind", ["i2v", "i2v_clip"])
def test_ode_rollout_equals_wan_image_to_video_pipeline(kind, first_frame):
    from mmreward.testing.tiny_wan22 import build_tiny_wan22
    from tests._helpers.parity_record import record_parity

    pipe = _euler(build_tiny_wan22(kind))
    image, prompts = first_frame
    adapter = WanI2VAdapter(pipe, H, W, MSL, FRAMES)
    assert adapter.latent_shape() == (16, 3, H // 8, W // 8)  # noise only; the mask and the condition are added
    assert isinstance(adapter.denoiser, WanExperts) == (kind == "i2v")
    emb = adapter.encode(prompts)
    assert ("image_embeds" in emb.tensors) == (kind == "i2v_clip")
    traj = rollout(adapter, emb, [0, 1], [0, 0], num_steps=STEPS, guidance_scale=4.0, kernel=Kernel("ode", 0.0))
    kw = {"num_inference_steps": STEPS, "guidance_scale": 4.0, "height": H, "width": W, "num_frames": FRAMES,
          "max_sequence_length": MSL}
    ref = torch.cat([pipe(image=image, prompt=p, output_type="latent", latents=traj.latents[i:i + 1, 0].clone(),
                          **kw).frames for i, p in enumerate(PROMPTS)])
    record_parity(f"wan_{kind}", original="diffusers==0.42.1 WanImageToVideoPipeline", how="package",
                  actual=traj.latents[:, -1], expected=ref, cases=("video, first frame 48x40 -> 32x32",))
    assert_close_scaled(traj.latents[:, -1], ref, rel=1e-5)


@pytest.fixture(scope="module")
def t2v_dir(tmp_path_factory):
    from mmreward.testing.tiny_wan22 import save_tiny_wan22

    return str(save_tiny_wan22("t2v", tmp_path_factory.mktemp("wan22") / "t2v"))


def _run_cfg(pipe_dir: str, out, lora_targets=None) -> dict:
    return {
        "model": {"pretrained": pipe_dir, "height": H, "width": W, "lora_rank": 4, "lora_alpha": 4,
                  "max_sequence_length": MSL, "num_frames": FRAMES, "lora_targets": lora_targets},
        # 4 steps: step 0 runs the high-noise expert, 1-3 the low one; timestep_fraction 1 trains all of them
        "sample": {"num_steps": STEPS, "guidance_scale": 2.0, "kernel": "flow_sde", "noise_level": 0.7,
                   "prompts_per_iteration": 2, "group_size": 2, "batch_size": 4},
        "train": {"algorithm": "grpo", "iterations": 1, "learning_rate": 1e-2, "probe": "error",
                  "timestep_fraction": 1.0},
        "advantage": {"min_count": 2},
        "reward": {"rewards": {"mock": 1.0}},
        "prompts": {"train": PROMPTS},
        "log": {"output_dir": str(out), "eval_every": 0, "grid_every": 0, "progress": False},
    }


@pytest.mark.parametrize("lora_experts", ["high", "low"])
def test_lora_on_one_expert_trains_only_that_expert(t2v_dir, tmp_path, lora_experts):
    from diffusion_rl.accelerator import make_accelerator
    from diffusion_rl.config import from_dict
    from diffusion_rl.pipelines import load_pipeline
    from diffusion_rl.policy import Policy

    cfg = from_dict(_run_cfg(t2v_dir, tmp_path, lora_targets=["to_q", "to_v"]))
    adapter = Wan22Adapter(load_pipeline(t2v_dir), H, W, MSL, FRAMES)
    adapter.lora_experts = lora_experts  # as a config key would set it, before the policy is built
    policy = Policy(cfg, adapter, make_accelerator(cfg))
    names = {id(p): n for n, p in adapter.denoiser.named_parameters()}
    trained = [names[id(p)] for p in policy.trainable]
    assert trained and {n.split(".")[0] for n in trained} == {lora_experts}
    assert all(n.endswith(("to_q.lora_A.default.weight", "to_q.lora_B.default.weight", "to_v.lora_A.default.weight",
                           "to_v.lora_B.default.weight")) for n in trained)
    other = adapter.denoiser.low if lora_experts == "high" else adapter.denoiser.high
    assert not any("lora_" in n for n, _ in other.named_parameters())


def test_bad_geometry_and_options_are_config_errors(t2v, first_frame):
    with pytest.raises(ConfigError, match=r"num_frames - 1 must be a multiple of 4 \(e.g. 9 or 13\)"):
        Wan22Adapter(t2v, H, W, MSL, num_frames=10)
    with pytest.raises(ConfigError, match="multiples of 16"):
        Wan22Adapter(t2v, 40, W, MSL, FRAMES)
    with pytest.raises(ConfigError, match="lora_experts must be one of"):
        Wan22Adapter(t2v, H, W, MSL, FRAMES, lora_experts="middle")
    with pytest.raises(ConfigError, match="lora_experts must be one of"):
        Wan22Adapter(t2v, H, W, MSL, FRAMES).lora_experts = "all"
    from mmreward.testing.tiny_wan22 import build_tiny_wan22

    i2v = build_tiny_wan22("i2v")
    with pytest.raises(ConfigError, match="multiples of 16"):
        WanI2VAdapter(i2v, H, 24, MSL, FRAMES)
    with pytest.raises(ConfigError, match="num_frames - 1 must be a multiple of 4"):
        WanI2VAdapter(i2v, H, W, MSL, num_frames=8)
    with pytest.raises(ConfigError, match="has no source image"):  # image-to-video needs a first frame per prompt
        WanI2VAdapter(i2v, H, W, MSL, FRAMES).encode(PROMPTS)
    i2v.register_to_config(expand_timesteps=True)
    with pytest.raises(ConfigError, match="expand_timesteps"):
        WanI2VAdapter(i2v, H, W, MSL, FRAMES)


def test_config_keys_reach_the_two_expert_adapter(t2v_dir, tmp_path, tiny_pipeline_dir):
    """model.lora_experts / model.guidance_scale_2 set the adapter before the policy; elsewhere they are errors."""
    from diffusion_rl.config import from_dict
    from diffusion_rl.trainer import Trainer

    raw = _run_cfg(t2v_dir, tmp_path / "a", lora_targets=["to_q", "to_v"])
    raw["model"].update(lora_experts="low", guidance_scale_2=1.5)
    trainer = Trainer(from_dict(raw))
    assert trainer.adapter.lora_experts == "low" and trainer.adapter.guidance_scale_2 == 1.5
    names = {id(p): n for n, p in trainer.adapter.denoiser.named_parameters()}
    assert {names[id(p)].split(".")[0] for p in trainer.trainable} == {"low"}
    other = _run_cfg(str(tiny_pipeline_dir("sd3")), tmp_path / "b")
    other["model"].update(lora_experts="high", num_frames=None, max_sequence_length=8)
    with pytest.raises(ConfigError, match=r"model.lora_experts='high' is for Wan 2.2 A14B"):
        Trainer(from_dict(other))
    with pytest.raises(ConfigError, match="lora_experts"):
        from_dict({**raw, "model": {**raw["model"], "lora_experts": "middle"}})


@pytest.mark.parametrize("lora_experts", ["high", "low"])  # "both": the adapter conformance suite (TestWan22)
def test_lora_export_per_expert_reloads_into_a_fresh_pipeline_as_the_trained_policy(t2v_dir, tmp_path, lora_experts):
    """After one GRPO iteration, the export loaded the way diffusers documents two-expert Wan 2.2 LoRAs
    (WanLoraLoaderMixin.load_lora_weights, `load_into_transformer_2=True` for the low-noise expert) into a fresh
    WanPipeline gives the trained policy's ODE rollout. lora_alpha != rank, so the scaling must come from the
    files' metadata."""
    from diffusion_rl.config import from_dict
    from diffusion_rl.pipelines import load_pipeline
    from diffusion_rl.trainer import Trainer

    raw = _run_cfg(t2v_dir, tmp_path)
    raw["model"].update(lora_experts=lora_experts, lora_alpha=8)
    trainer = Trainer(from_dict(raw))
    trainer.train_iteration(0)
    final = trainer.export()
    written = {"both": ["transformer", "transformer_2"], "high": ["transformer"], "low": ["transformer_2"]}
    assert sorted(p.name for p in final.iterdir()) == written[lora_experts]
    adapter = trainer.adapter
    with torch.no_grad():
        traj = rollout(adapter, adapter.encode(PROMPTS), [0, 1], [0, 0], num_steps=STEPS, guidance_scale=4.0,
                       kernel=Kernel("ode", 0.0), decode=False)
    kw = {"num_inference_steps": STEPS, "guidance_scale": 4.0, "height": H, "width": W, "num_frames": FRAMES,
          "max_sequence_length": MSL, "output_type": "latent"}

    def sample(pipe):
        return pipe(PROMPTS, latents=traj.latents[:, 0].clone(), **kw).frames

    loaded = _euler(load_pipeline(t2v_dir))
    for attr in written[lora_experts]:
        loaded.load_lora_weights(str(final / attr), load_into_transformer_2=attr == "transformer_2")
    assert ("lora_A" in str(loaded.transformer)) == (lora_experts != "low")
    assert ("lora_A" in str(loaded.transformer_2)) == (lora_experts != "high")
    trained, base = traj.latents[:, -1], sample(_euler(load_pipeline(t2v_dir)))
    assert float((base - trained).abs().max()) > 1e-3, "training did not move the rollout; the round trip proves nothing"
    assert_close_scaled(sample(loaded), trained, rel=1e-5)
    # the folder holds no top-level file: a plain load_lora_weights(final) cannot put one expert's update in the other
    with pytest.raises((OSError, EnvironmentError, ValueError)):
        _euler(load_pipeline(t2v_dir)).load_lora_weights(str(final))


def test_full_fine_tune_export_writes_each_expert_to_its_component(t2v_dir, tmp_path):
    """model.lora=false: the exported pipeline folder holds the trained high expert as `transformer` and the trained
    low expert as `transformer_2`, loadable with DiffusionPipeline.from_pretrained."""
    from diffusers import DiffusionPipeline, WanTransformer3DModel

    from diffusion_rl.config import from_dict
    from diffusion_rl.trainer import Trainer

    raw = _run_cfg(t2v_dir, tmp_path)
    raw["model"]["lora"] = False
    trainer = Trainer(from_dict(raw))
    experts = trainer.adapter.denoiser
    with torch.no_grad():  # stand-ins for trained weights, different per expert
        experts.high.proj_out.weight.add_(1.0)
        experts.low.proj_out.weight.sub_(1.0)
    loaded = DiffusionPipeline.from_pretrained(str(trainer.export()))
    assert type(loaded.transformer) is WanTransformer3DModel and type(loaded.transformer_2) is WanTransformer3DModel
    assert loaded.config.boundary_ratio == 0.875
    assert torch.equal(loaded.transformer.proj_out.weight, experts.high.proj_out.weight.detach())
    assert torch.equal(loaded.transformer_2.proj_out.weight, experts.low.proj_out.weight.detach())
    assert trainer.adapter.pipeline.transformer is experts.high  # the pipeline's components are put back
