"""Every registered generator family passes the adapter conformance suite (tests/_helpers/adapter_conformance.py) on its tiny
pipeline built from config and saved in the diffusers layout. A class per family gives only its builder, the
pipeline's own call keywords, its geometry and tolerances. A behaviour a family fails is marked with
`adapter_conformance.known_failure` (xfail strict, with the measured reason); today every family passes every
behaviour. Family-specific checks that need a trained LoRA read the class's shared `grpo_run` (no extra training)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from mmreward.testing.tiny_models import save_tiny_pipeline
from tests._helpers.adapter_conformance import AdapterConformance
from tests._helpers.qwen_edit_area import small_source_areas


def _euler_at_flow_shift(pipe: Any) -> Any:
    """Wan pipelines ship UniPC; the adapter samples with flow-matching Euler at the same flow_shift (so the SDE
    kernels apply), so the reference sampler takes that scheduler too."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    pipe.scheduler = FlowMatchEulerDiscreteScheduler(shift=pipe.scheduler.config.flow_shift)
    return pipe


# -- images, UNet + DDIM ----------------------------------------------------------------------------------------
class TestSD(AdapterConformance):
    family = "sd"
    max_sequence_length = None
    resume = True
    session_pipeline = "sd"  # the same save_tiny_pipeline("sd") folder, built once per session

    def build(self, folder: Path) -> None:
        save_tiny_pipeline("sd", folder)


class TestSDXL(AdapterConformance):
    family = "sdxl"
    max_sequence_length = None
    session_pipeline = "sdxl"  # the same save_tiny_pipeline("sdxl") folder, built once per session

    def build(self, folder: Path) -> None:
        save_tiny_pipeline("sdxl", folder)


# -- images, flow matching --------------------------------------------------------------------------------------
class TestSD3(AdapterConformance):
    family = "sd3"
    # resume: SD3's runs resume bit-exact in the algorithm tests (test_algorithm_grpo_guard.py, test_algorithm_dpo.py,
    # test_algorithm_crd.py, ... on the same tiny SD3), so the conformance subset skips it (suite time)
    # the tiny SD3 has one block, the last, whose context_pre_only attention has no to_add_out (SD3's other blocks do)
    tiny_absent_lora_targets = ("to_add_out",)
    session_pipeline = "sd3"  # the same save_tiny_pipeline("sd3") folder, built once per session

    def build(self, folder: Path) -> None:
        save_tiny_pipeline("sd3", folder)


class TestFlux(AdapterConformance):
    family = "flux"
    guidance_scale = 1.0  # the tiny FLUX has no guidance embedding: 1.0 is the pipeline's un-guided sampling
    session_pipeline = "flux"  # the same save_tiny_pipeline("flux") folder, built once per session

    def build(self, folder: Path) -> None:
        save_tiny_pipeline("flux", folder)


class TestFluxKontext(AdapterConformance):
    family = "flux_kontext"
    guidance_scale = 2.5  # no guidance embedding: true CFG with the empty negative prompt
    resume = True

    def build(self, folder: Path) -> None:
        from mmreward.testing.tiny_models import build_tiny_edit_pipeline
        from mmreward.testing.tokenizers import build_clip_tokenizer

        tok = folder.parent / "clip_tokenizer"
        build_clip_tokenizer(tok)
        build_tiny_edit_pipeline("flux_kontext", tok, seed=0).save_pretrained(str(folder))

    def pipeline_sample(self, pipe, prompts, x0, output_type, guidance_scale):
        from mmreward.edit import load_source_image

        sources = torch.stack([load_source_image(p.source) for p in prompts])
        true_cfg = {"negative_prompt": [""] * len(prompts), "true_cfg_scale": guidance_scale} if guidance_scale > 1 else {}
        return pipe(image=sources, prompt=[str(p) for p in prompts], num_inference_steps=self.steps,
                    height=self.height, width=self.width, max_area=self.height * self.width, _auto_resize=False,
                    max_sequence_length=self.max_sequence_length, latents=x0.clone(), output_type=output_type,
                    **true_cfg).images


class TestQwenImageEdit(AdapterConformance):
    family = "qwen_image_edit"
    height = width = 32
    max_sequence_length = 256
    guidance_scale = 2.5

    @pytest.fixture(scope="class", autouse=True)
    def _small_source_areas(self):
        """The whole class (the GRPO run too) at 1/64 of the released source areas, for the pipeline and the adapter
        alike (tests/_helpers/qwen_edit_area.py): a 1024x1024 VAE encoding per source and call made these the
        slowest classes of the suite. The released areas: the slow params of tests/diffusion_rl/test_edit_rollout.py
        and test_adapter_qwen_image_edit_plus.py."""
        with small_source_areas():
            yield

    def build(self, folder: Path) -> None:
        from mmreward.testing.tiny_models import build_tiny_edit_pipeline

        build_tiny_edit_pipeline("qwen_image_edit", None, seed=0).save_pretrained(str(folder))

    def pipeline_sample(self, pipe, prompts, x0, output_type, guidance_scale):
        """Given our (padded, masked) prompt embeddings: the pipeline's own encoding pads shorter, which moves the
        masked attention's rounding by 1.5e-4 of the latent scale (measured: 4.7e-4 abs on a 3.2 scale; tests/diffusion_rl/test_edit_rollout.py checks the
        embeddings themselves against encode_prompt)."""
        from PIL import Image

        from diffusion_rl.pipelines import make_adapter

        images = [Image.open(p.source).convert("RGB") for p in prompts]
        if getattr(self, "_embeds", None) is None:  # one encoding for the "latent" and "pt" calls of a test
            self._embeds = make_adapter(pipe, self.height, self.width, self.max_sequence_length).encode(prompts)
        t = self._embeds.tensors
        given = ({"negative_prompt_embeds": t["negative_prompt_embeds"],
                  "negative_prompt_embeds_mask": t["negative_prompt_embeds_mask"], "true_cfg_scale": guidance_scale}
                 if guidance_scale > 1 else {})
        return pipe(prompt_embeds=t["prompt_embeds"], prompt_embeds_mask=t["prompt_embeds_mask"], image=images,
                    latents=x0.clone(), num_inference_steps=self.steps, height=self.height, width=self.width,
                    output_type=output_type, **given).images


class TestQwenImageEditPlus(TestQwenImageEdit):
    """QwenImageEditPlusPipeline (Qwen-Image-Edit-2509/2511): one source image per record here (the multi-image case
    is in tests/diffusion_rl/test_adapter_qwen_image_edit_plus.py); the pipeline samples one prompt per call."""

    family = "qwen_image_edit_plus"

    def build(self, folder: Path) -> None:
        from mmreward.testing.tiny_qwen_image_edit_plus import save_tiny_qwen_image_edit_plus_pipeline

        save_tiny_qwen_image_edit_plus_pipeline(folder, seed=0)

    def pipeline_sample(self, pipe, prompts, x0, output_type, guidance_scale):
        from PIL import Image

        from diffusion_rl.pipelines import make_adapter

        if getattr(self, "_embeds", None) is None:
            self._embeds = make_adapter(pipe, self.height, self.width, self.max_sequence_length).encode(prompts)
        t = self._embeds.tensors
        out = []
        for i, p in enumerate(prompts):
            row = {k: v[i:i + 1] for k, v in t.items()}
            given = ({"negative_prompt_embeds": row["negative_prompt_embeds"],
                      "negative_prompt_embeds_mask": row["negative_prompt_embeds_mask"]} if guidance_scale > 1 else {})
            out.append(pipe(prompt_embeds=row["prompt_embeds"], prompt_embeds_mask=row["prompt_embeds_mask"],
                            image=[Image.open(p.source).convert("RGB")], latents=x0[i:i + 1].clone(),
                            num_inference_steps=self.steps, height=self.height, width=self.width,
                            true_cfg_scale=guidance_scale, output_type=output_type, **given).images)
        return torch.cat(out)


class TestQwenImage(AdapterConformance):
    family = "qwen_image"
    height = width = 32
    max_sequence_length = None

    def build(self, folder: Path) -> None:
        from mmreward.testing.tiny_qwen_image import save_tiny_qwen_image_pipeline

        save_tiny_qwen_image_pipeline(folder, seed=0)

    def pipeline_sample(self, pipe, prompts, x0, output_type, guidance_scale):
        true_cfg = {"negative_prompt": [" "] * len(prompts), "true_cfg_scale": guidance_scale}
        return pipe(prompt=list(prompts), latents=x0.clone(), num_inference_steps=self.steps, height=self.height,
                    width=self.width, output_type=output_type, **true_cfg).images

    def test_export_wraps_every_joint_attention_projection(self, grpo_run):
        """Family-specific (moved from tests/diffusion_rl/test_adapter_qwen_image.py): the exported LoRA sits on exactly the
        eight joint-attention projections (image and text streams) of the transformer's block."""
        from diffusers import QwenImagePipeline

        layers = QwenImagePipeline.lora_state_dict(str(grpo_run["out"] / "final"))
        layers = layers[0] if isinstance(layers, tuple) else layers
        wrapped = {k.split(".lora_A")[0] for k in layers if "lora_A" in k}
        assert wrapped == {f"transformer.transformer_blocks.0.attn.{m}" for m in
                           ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out")}



class TestQwenImage21(AdapterConformance):
    """QwenImage21Pipeline (Qwen-Image-2.1): one prompt per pipeline call (the adapter runs each prompt length
    unpadded, which is what a one-prompt call does), the uncached forward (use_kv_cache=False); the RGBA decode is
    compared after compositing the pipeline's RGBA over white here (rgb * a + 1 - a)."""

    family = "qwen_image21"
    height = width = 64  # 4x4 latent tokens at the VAE's 16x
    max_sequence_length = None

    def build(self, folder: Path) -> None:
        from mmreward.testing.tiny_qwen_image21 import save_tiny_qwen_image21_pipeline

        save_tiny_qwen_image21_pipeline(folder, seed=0)

    def pipeline_sample(self, pipe, prompts, x0, output_type, guidance_scale):
        cfg = {"negative_prompt": " ", "true_cfg_scale": guidance_scale} if guidance_scale > 1 else {}
        out = torch.cat([pipe(prompt=str(p), latents=x0[i:i + 1].clone(), num_inference_steps=self.steps,
                              height=self.height, width=self.width, use_kv_cache=False, output_type=output_type,
                              **cfg).images for i, p in enumerate(prompts)])
        if output_type == "latent":
            return out
        return out[:, :3] * out[:, 3:] + (1 - out[:, 3:])

class TestZImage(AdapterConformance):
    family = "z_image"
    max_sequence_length = 32

    def build(self, folder: Path) -> None:
        from mmreward.testing.tiny_z_image import save_tiny_z_image_pipeline

        save_tiny_z_image_pipeline(folder, seed=0)


class _Flux2(AdapterConformance):
    height = width = 32
    max_sequence_length = 48
    kind = "dev"

    def build(self, folder: Path) -> None:
        from mmreward.testing.tiny_flux2 import save_tiny_flux2

        save_tiny_flux2(folder, self.kind, seed=0)

    def pipeline_latents(self, x: torch.Tensor) -> torch.Tensor:
        # packed tokens (B, h*w, C) -> the (B, C, h, w) latents Flux2Pipeline(latents=...) packs itself
        return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], self.height // 4, self.width // 4)

    def output_latents(self, x: torch.Tensor) -> torch.Tensor:
        return x  # its "latent" output is the packed tokens


class TestFlux2(_Flux2):
    family = "flux2"


class TestFlux2Klein(_Flux2):
    family = "flux2_klein"
    kind = "klein"

    def output_latents(self, x: torch.Tensor) -> None:
        return None  # Flux2KleinPipeline's "latent" output is un-patchified (B, C/4, 2h, 2w): compare decoded images


# -- videos -----------------------------------------------------------------------------------------------------
class _Video(AdapterConformance):
    height = width = 32
    num_frames = 9  # (9 - 1) / 4 + 1 = 3 latent frames
    max_sequence_length = 16
    images_atol = 1e-5


class TestWan(_Video):
    family = "wan"
    resume = True

    def build(self, folder: Path) -> None:
        save_tiny_pipeline("wan", folder)

    def prepare_pipeline(self, pipe):
        return _euler_at_flow_shift(pipe)


def _changed_experts(grpo_run: dict) -> set[str]:
    """The experts ("high", "low") whose LoRA the GRPO iteration moved."""
    trainer = grpo_run["trainer"]
    names = {id(p): n for n, p in trainer.adapter.denoiser.named_parameters()}
    return {names[id(p)].split(".")[0] for a, p in zip(grpo_run["before"], trainer.trainable)
            if not torch.equal(a, p.detach())}


def _load_expert_loras(pipe: Any, final: Path) -> None:
    """Two experts export one LoRA folder each (final/transformer, final/transformer_2); diffusers' Wan LoRA loader
    puts the second into transformer_2 with load_into_transformer_2=True."""
    pipe.load_lora_weights(str(final / "transformer"))
    pipe.load_lora_weights(str(final / "transformer_2"), load_into_transformer_2=True)


class TestWan22(_Video):
    """Wan 2.2 A14B text-to-video: WanPipeline with transformer_2 (two experts switched at the boundary)."""

    family = "wan"
    resume = True  # two experts' LoRA and optimizer state in one checkpoint

    def build(self, folder: Path) -> None:
        from mmreward.testing.tiny_wan22 import save_tiny_wan22

        save_tiny_wan22("t2v", folder, seed=0)

    def prepare_pipeline(self, pipe):
        return _euler_at_flow_shift(pipe)

    def load_lora(self, pipe, final):
        _load_expert_loras(pipe, final)

    def test_lora_trains_both_experts_and_exports_one_folder_each(self, grpo_run):
        """Family-specific (moved from tests/diffusion_rl/test_adapter_wan22.py): LoRA only, on both experts, both moved; the
        export is one diffusers LoRA folder per expert under the loader's `transformer.` prefix."""
        from diffusers import WanPipeline

        trainer = grpo_run["trainer"]
        names = {id(p): n for n, p in trainer.adapter.denoiser.named_parameters()}
        trained = [names[id(p)] for p in trainer.trainable]
        assert trained and all("lora_" in n for n in trained)
        assert {n.split(".")[0] for n in trained} == {"high", "low"} == _changed_experts(grpo_run)
        final = grpo_run["out"] / "final"
        assert sorted(p.name for p in final.iterdir()) == ["transformer", "transformer_2"]
        for attr in ("transformer", "transformer_2"):
            layers = WanPipeline.lora_state_dict(str(final / attr))
            assert layers and all(k.startswith("transformer.blocks.") for k in layers)


class TestWanI2V(_Video):
    family = "wan_i2v"
    source_size = (48, 40)  # resized to 32x32 by the pipeline

    def build(self, folder: Path) -> None:
        from mmreward.testing.tiny_wan22 import save_tiny_wan22

        save_tiny_wan22("i2v", folder, seed=0)

    def prepare_pipeline(self, pipe):
        return _euler_at_flow_shift(pipe)

    def load_lora(self, pipe, final):
        _load_expert_loras(pipe, final)

    def pipeline_sample(self, pipe, prompts, x0, output_type, guidance_scale):
        from PIL import Image

        # the pipeline takes one first frame for the whole batch: one call per sample
        kw = {"num_inference_steps": self.steps, "guidance_scale": guidance_scale, "height": self.height,
              "width": self.width, **self.pipeline_kwargs()}
        return torch.cat([pipe(image=Image.open(p.source).convert("RGB"), prompt=str(p), output_type=output_type,
                               latents=x0[i:i + 1].clone(), **kw).frames for i, p in enumerate(prompts)])

    def test_first_frame_run_trains_both_experts(self, grpo_run):
        """Family-specific (moved from tests/diffusion_rl/test_adapter_wan22.py): the jsonl first-frame run moves both experts."""
        assert _changed_experts(grpo_run) == {"high", "low"}


class TestHunyuanVideo(_Video):
    family = "hunyuan_video"

    def build(self, folder: Path) -> None:
        save_tiny_pipeline("hunyuan_video", folder)


class TestCogVideoX(_Video):
    family = "cogvideox"

    def build(self, folder: Path) -> None:
        save_tiny_pipeline("cogvideox", folder)

    def prepare_pipeline(self, pipe):
        from diffusers import CogVideoXDDIMScheduler

        pipe.scheduler = CogVideoXDDIMScheduler.from_config(pipe.scheduler.config)
        return pipe

    def pipeline_latents(self, x: torch.Tensor) -> torch.Tensor:
        return x.permute(0, 2, 1, 3, 4).contiguous()  # the pipeline's (B, T', C, H', W')


class TestLTX(_Video):
    family = "ltx"
    height = width = 64
    num_frames = 17  # 3 latent frames

    def build(self, folder: Path) -> None:
        save_tiny_pipeline("ltx", folder)

    def pipeline_latents(self, x: torch.Tensor) -> torch.Tensor:
        from diffusers import LTXPipeline

        return LTXPipeline._pack_latents(x)  # the pipeline takes and returns packed (B, T' H' W', C) tokens


class _HunyuanVideo15(_Video):
    height = width = 16  # the tiny VAE's spatial factor is 4
    num_frames = 5  # temporal factor 2: 3 latent frames
    max_sequence_length = 24
    guidance_scale = 6.0
    kind = "t2v"

    def build(self, folder: Path) -> None:
        from mmreward.testing.tiny_hunyuan_video15 import save_tiny_hunyuan_video15

        save_tiny_hunyuan_video15(folder, seed=0, kind=self.kind)

    def prepare_pipeline(self, pipe):
        from diffusers.guiders import ClassifierFreeGuidance

        # the pipeline guides through its guider and reads tokenizer_max_length; the adapter takes both as settings
        pipe.guider = ClassifierFreeGuidance(guidance_scale=self.guidance_scale)
        pipe.tokenizer_max_length = self.max_sequence_length
        return pipe

    def load_lora(self, pipe, final):
        # diffusers 0.42 gives the HunyuanVideo 1.5 pipelines no load_lora_weights (no LoRA loader mixin): the
        # export is the transformer's PEFT adapter file, loaded with the model's own load_lora_adapter
        pipe.transformer.load_lora_adapter(str(final), prefix=None, adapter_name="default",
                                           weight_name="pytorch_lora_weights.safetensors")

    def pipeline_sample(self, pipe, prompts, x0, output_type, guidance_scale):
        from PIL import Image

        # one clip per call: the pipeline's VAE decode fails for batch > 1 (diffusers 0.42 causal-attention mask),
        # and the image-to-video pipeline takes one first frame per call
        out = []
        for i, p in enumerate(prompts):
            image = {"image": Image.open(p.source).convert("RGB")} if self.is_edit else {}
            kw = {} if self.is_edit else {"height": self.height, "width": self.width}
            out.append(pipe(prompt=str(p), latents=x0[i:i + 1].clone(), num_inference_steps=self.steps,
                            num_frames=self.num_frames, output_type=output_type, **kw, **image).frames)
        return torch.cat(out)


class TestHunyuanVideo15(_HunyuanVideo15):
    family = "hunyuan_video15"

    def test_lora_wraps_the_blocks_and_the_token_refiner_only(self, grpo_run):
        """Family-specific (moved from tests/diffusion_rl/test_adapter_hunyuan_video15.py): only LoRA weights train, on the
        dual-stream blocks' and the token refiner's (context_embedder) attention, and the blocks' moved."""
        trainer = grpo_run["trainer"]
        names = {id(p): n for n, p in trainer.adapter.denoiser.named_parameters()}
        trained = [names[id(p)] for p in trainer.trainable]
        assert trained and all("lora_" in n for n in trained)
        assert {n.split(".")[0] for n in trained} == {"transformer_blocks", "context_embedder"}
        changed = [names[id(p)] for a, p in zip(grpo_run["before"], trainer.trainable) if not torch.equal(a, p.detach())]
        assert any(n.startswith("transformer_blocks.") for n in changed)


class TestHunyuanVideo15I2V(_HunyuanVideo15):
    family = "hunyuan_video15_i2v"
    kind = "i2v"
    guidance_scale = 5.0
    source_size = (20, 20)  # the pipeline crops it to its 16x16 bucket

    def prepare_pipeline(self, pipe):
        pipe = super().prepare_pipeline(pipe)
        assert pipe.video_processor.calculate_default_height_width(20, 20, 16) == (self.height, self.width)
        return pipe


class TestLTX2(_Video):
    family = "ltx2"
    num_frames = 9  # the tiny VAE compresses time by 2: 5 latent frames
    guidance_scale = 3.0

    def build(self, folder: Path) -> None:
        from mmreward.testing.tiny_ltx2 import save_tiny_ltx2_pipeline

        save_tiny_ltx2_pipeline(folder, seed=0)

    def output_latents(self, x):
        return None  # the flat video+audio state; the decoded video is compared (the audio in test_adapter_ltx2.py)

    def test_lora_wraps_the_video_audio_and_cross_modal_attention(self, grpo_run):
        """Family-specific (moved from tests/diffusion_rl/test_adapter_ltx2.py): LoRA on the video, audio and both cross-modal
        attentions of the blocks (the joint state's log-prob trains all of them)."""
        names = [n for n, p in grpo_run["trainer"].adapter.denoiser.named_parameters() if p.requires_grad]
        for block in ("attn1", "audio_attn1", "audio_to_video_attn", "video_to_audio_attn"):
            assert any(f".{block}.to_q.lora_A" in n for n in names), block

    def pipeline_sample(self, pipe, prompts, x0, output_type, guidance_scale):
        from diffusion_rl.pipelines import make_adapter

        adapter = make_adapter(pipe, self.height, self.width, self.max_sequence_length, num_frames=self.num_frames)
        video0, _ = adapter.split_latents(x0)
        vae = pipe.vae
        # the pipeline normalises the 5-D video latents it is given and packs + normalises the audio latents
        video_in = pipe._denormalize_latents(video0, vae.latents_mean, vae.latents_std, vae.config.scaling_factor)
        out = pipe(prompt=[str(p) for p in prompts], negative_prompt=[""] * len(prompts), latents=video_in.clone(),
                   audio_latents=adapter.audio_latents(x0).clone(), num_inference_steps=self.steps,
                   height=self.height, width=self.width, num_frames=self.num_frames, frame_rate=adapter.fps,
                   guidance_scale=guidance_scale, audio_guidance_scale=adapter.audio_guidance_scale,
                   guidance_rescale=adapter.guidance_rescale, audio_guidance_rescale=adapter.audio_guidance_rescale,
                   stg_scale=0.0, audio_stg_scale=0.0, modality_scale=1.0, audio_modality_scale=1.0,
                   spatio_temporal_guidance_blocks=None, max_sequence_length=self.max_sequence_length,
                   output_type=output_type)
        return out.frames


CONFORMANCE_CLASSES = [v for v in list(globals().values())
                       if isinstance(v, type) and issubclass(v, AdapterConformance) and v.__name__.startswith("Test")]


def test_every_registered_family_has_a_conformance_class():
    """A new adapter without a conformance subclass here fails this test."""
    from diffusion_rl.adapters import ADAPTERS

    covered = {cls.family for cls in CONFORMANCE_CLASSES}
    missing = sorted(set(ADAPTERS) - covered)
    assert not missing, f"add a conformance class to tests/diffusion_rl/test_adapter_conformance.py for: {missing}"

