"""diffusers' `HunyuanVideo15Pipeline` and `HunyuanVideo15ImageToVideoPipeline` (HunyuanVideo 1.5, e.g.
hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_t2v): flow matching on 5-D video latents (B, C, T', H', W')
with T' = (T - 1) / 4 + 1 and H' = H / 16 for the released VAE (the factors are read from the pipeline). What
differs from HunyuanVideo 1.0 (`hunyuan_video.py`):

- two text encoders through the pipeline's own helpers: Qwen2.5-VL's third-to-last hidden states under the
  pipeline's system prompt (the template's first `prompt_template_encode_start_idx` tokens cropped off) with its
  attention mask, and ByT5 on the quoted glyph text of each prompt (zeros and an all-zero mask when a prompt quotes
  nothing), both as `encode_prompt` returns them;
- real classifier-free guidance (not guidance-distilled): the pipeline's `ClassifierFreeGuidance` guider runs the
  empty prompt as the unconditional branch and combines uncond + s (cond - uncond); its `guidance_rescale` and
  `use_original_formulation` are followed here, a step window (`start`/`stop` other than 0/1) is refused;
- the denoiser's input is the noise latents concatenated with the condition latents and a one-channel mask along
  channels (in_channels = 2 C + 1), zeros for text-to-video, and `image_embeds` zeros of (729, image_embed_dim),
  which the transformer reads as "no image";
- the schedule is the pipeline's: FlowMatchEulerDiscreteScheduler (shift 7 in the released T2V checkpoints) at
  sigmas linspace(1, 0, N + 1)[:-1], so the ODE rollout is exactly HunyuanVideo15Pipeline's sampling;
- decoding divides by the VAE's `scaling_factor` and decodes one clip at a time: the VAE's causal mid-block
  attention in diffusers 0.42 builds a (B, L, L) mask against (B, 1, L, L) queries and fails for B > 1.

Image-to-video (`HunyuanVideo15I2VAdapter`) fills the condition latents, the mask and `image_embeds` from each edit
record's source image, the first frame (see the class).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from diffusion_rl.adapters.base import PromptEmbeds, Schedule, VideoAdapter, flow_schedule, prompt_list
from diffusion_rl.adapters.registry import register_adapter
from mmreward.errors import ConfigError

HV15_DEFAULT_FRAMES = 121  # HunyuanVideo15Pipeline.__call__'s default
# the attention projections of the dual-stream blocks (video: to_q/k/v, to_out.0; text: add_*_proj, to_add_out) and
# of the token refiner's self-attention (to_q/k/v, to_out.0 inside context_embedder)
HV15_LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"]


class HunyuanVideo15Adapter(VideoAdapter):
    """diffusers' HunyuanVideo15Pipeline: flow matching with true CFG on 5-D video latents."""

    family = "hunyuan_video15"
    block_classes = ("HunyuanVideo15TransformerBlock",)
    is_flow = True
    fps = 24.0  # 121-frame (~5 s) clips at 24 fps, the model card's rate; set adapter.fps / model.fps otherwise

    def __init__(self, pipeline, height: int | None = None, width: int | None = None,
                 max_sequence_length: int | None = None, num_frames: int | None = None) -> None:
        if getattr(pipeline, "transformer", None) is None or getattr(pipeline, "vae", None) is None:
            raise ConfigError(f"{type(pipeline).__name__}: a transformer and a VAE are needed for reward fine-tuning")
        if height is None and width is None:
            # the pipeline's default: the bucket of its target size closest to 16:9 (width:height)
            aspect_w, aspect_h = pipeline.default_aspect_ratio
            height, width = pipeline.video_processor.calculate_default_height_width(
                aspect_h, aspect_w, pipeline.target_size)
        elif height is None or width is None:
            raise ConfigError(f"{type(pipeline).__name__}: give both height and width or neither, "
                              f"got height={height}, width={width}")
        spatial = int(pipeline.vae_scale_factor_spatial)
        self._init_video(pipeline, height, width, num_frames or HV15_DEFAULT_FRAMES, max_sequence_length,
                         spatial=spatial, temporal=int(pipeline.vae_scale_factor_temporal),
                         multiple=spatial * int(pipeline.transformer.config.patch_size))
        self._check_pipeline()

    def _check_pipeline(self) -> None:
        if self.pipeline.transformer.config.get("use_meanflow", False):
            raise ConfigError(f"{type(self.pipeline).__name__}: a MeanFlow transformer (use_meanflow, the step-distilled "
                              "and super-resolution checkpoints) also takes the next timestep; not supported yet")
        guider = getattr(self.pipeline, "guider", None)
        if guider is None:
            return
        start, stop = float(getattr(guider, "_start", 0.0)), float(getattr(guider, "_stop", 1.0))
        if (start, stop) != (0.0, 1.0):
            raise ConfigError(f"{type(self.pipeline).__name__}: its guider applies CFG only between {start} and {stop} "
                              "of the steps; rollouts guide every step, so set the guider's start=0.0, stop=1.0")

    # -- geometry -----------------------------------------------------------------------------
    def latent_shape(self) -> tuple[int, ...]:
        return (int(self.pipeline.vae.config.latent_channels), self.latent_frames, self.height // self._spatial,
                self.width // self._spatial)

    # -- conditioning -------------------------------------------------------------------------
    @torch.no_grad()
    def encode(self, prompts: Sequence[str]) -> PromptEmbeds:
        pipe, prompts = self.pipeline, prompt_list(prompts)
        # the pipeline's own Qwen2.5-VL helper; max_sequence_length (tokens after the template) replaces its
        # tokenizer_max_length (1000) when given, as the other adapters' max_sequence_length does
        pe, mask = pipe._get_mllm_prompt_embeds(
            text_encoder=pipe.text_encoder, tokenizer=pipe.tokenizer, prompt=prompts, device=self.device,
            tokenizer_max_length=int(self.max_sequence_length or pipe.tokenizer_max_length),
            system_message=pipe.system_message, crop_start=pipe.prompt_template_encode_start_idx,
        )
        pe, mask, pe_2, mask_2 = pipe.encode_prompt(prompt=prompts, device=self.device, dtype=self.model_dtype,
                                                    batch_size=len(prompts), prompt_embeds=pe, prompt_embeds_mask=mask)
        return PromptEmbeds({"prompt_embeds": pe, "prompt_embeds_mask": mask, "prompt_embeds_2": pe_2,
                             "prompt_embeds_mask_2": mask_2})

    def schedule(self, num_steps: int) -> Schedule:
        sched = self.pipeline.scheduler
        sched.set_timesteps(sigmas=np.linspace(1.0, 0.0, num_steps + 1)[:-1])  # what the pipeline passes
        return flow_schedule(sched)

    # -- denoiser -----------------------------------------------------------------------------
    def _condition(self, x: torch.Tensor, embeds: PromptEmbeds) -> tuple[torch.Tensor, torch.Tensor]:
        """(condition latents, mask) concatenated after the noise latents: zeros for text-to-video."""
        b, c, f, h, w = x.shape
        return x.new_zeros(b, c, f, h, w), x.new_zeros(b, 1, f, h, w)

    def _image_embeds(self, x: torch.Tensor, embeds: PromptEmbeds) -> torch.Tensor:
        """SigLIP tokens of the first frame; all zeros (the transformer's "no image") for text-to-video."""
        pipe = self.pipeline
        return x.new_zeros(x.shape[0], pipe.vision_num_semantic_tokens, pipe.vision_states_dim)

    def _forward(self, model, x, t, embeds, guidance_scale):
        cond, mask = self._condition(x, embeds)
        tensors = {k: v.to(x.dtype) for k, v in embeds.tensors.items() if k.startswith("prompt_embeds")}
        return model(
            hidden_states=torch.cat([x, cond.to(x.dtype), mask.to(x.dtype)], dim=1), timestep=t.to(x.dtype),
            encoder_hidden_states=tensors["prompt_embeds"], encoder_attention_mask=tensors["prompt_embeds_mask"],
            encoder_hidden_states_2=tensors["prompt_embeds_2"], encoder_attention_mask_2=tensors["prompt_embeds_mask_2"],
            image_embeds=self._image_embeds(x, embeds).to(x.dtype), return_dict=False,
        )[0]

    def _negative_like(self, embeds: PromptEmbeds) -> PromptEmbeds:
        """The unconditional branch's conditioning: the empty prompt (the pipeline's default negative prompt)."""
        return self.negative().expand(len(embeds))

    def predict(self, model: torch.nn.Module, x: torch.Tensor, t: torch.Tensor, embeds: PromptEmbeds,
                guidance_scale: float) -> torch.Tensor:
        """The denoiser's velocity with CFG as the pipeline's ClassifierFreeGuidance combines it."""
        x = x.to(self.model_dtype)
        if not self.uses_cfg(guidance_scale):
            return self._forward(model, x, t, embeds, guidance_scale).float()
        guider = getattr(self.pipeline, "guider", None)
        rescale = float(getattr(guider, "guidance_rescale", 0.0) or 0.0)
        original = bool(getattr(guider, "use_original_formulation", False))
        both = PromptEmbeds.cat([self._negative_like(embeds), embeds])
        uncond, cond = self._forward(model, torch.cat([x, x]), torch.cat([t, t]), both, guidance_scale).float().chunk(2)
        pred = (cond if original else uncond) + guidance_scale * (cond - uncond)
        if rescale > 0.0:
            from diffusers.guiders.guider_utils import rescale_noise_cfg

            pred = rescale_noise_cfg(pred, cond, rescale)
        return pred

    # -- decoding -----------------------------------------------------------------------------
    def _decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        vae = self.pipeline.vae
        z = latents / vae.config.scaling_factor
        # one clip per VAE call (see the module docstring: the batched causal attention mask is broken upstream)
        video = torch.cat([vae.decode(z[i:i + 1], return_dict=False)[0] for i in range(z.shape[0])])
        return video.permute(0, 2, 1, 3, 4)  # (B, 3, T, H, W) in [-1, 1] -> (B, T, 3, H, W)


register_adapter("HunyuanVideo15Pipeline", "hunyuan_video15", HunyuanVideo15Adapter, HV15_LORA_TARGETS)


class HunyuanVideo15I2VAdapter(HunyuanVideo15Adapter):
    """diffusers' HunyuanVideo15ImageToVideoPipeline. Prompts are edit records; each row's source image is the first
    frame, resized and centre-cropped to the run's height x width with the pipeline's own `resize(..., "crop")` (the
    pipeline picks the size from the image's aspect ratio; a batch needs one size, so the run's height/width rule).
    The condition follows the pipeline: the frame's VAE latents (argmax, times scaling_factor) on latent frame 0 and
    zeros after it, a mask of ones on frame 0, and SigLIP's last hidden states as `image_embeds`; the unconditional
    branch sees the same frame with the empty prompt."""

    family = "hunyuan_video15_i2v"
    is_edit = True

    @torch.no_grad()
    def encode(self, prompts: Sequence[str]) -> PromptEmbeds:
        from mmreward.edit import EditPrompt, load_source_image

        prompts = prompt_list(prompts)
        plain = [p for p in prompts if not isinstance(p, EditPrompt)]
        if plain:
            raise ConfigError(
                f"prompt {plain[0]!r} has no source image, but a {self.family} pipeline animates a first frame: give "
                "edit records ({\"source_image\": PATH, \"instruction\": ...} rows, see mmreward.edit) as prompts"
            )
        text = HunyuanVideo15Adapter.encode(self, [str(p) for p in prompts])
        rows = PromptEmbeds.cat([self.encode_first_frame(load_source_image(p.source)) for p in prompts])
        return PromptEmbeds({**text.tensors, **rows.tensors})

    @torch.no_grad()
    def encode_first_frame(self, image: torch.Tensor) -> PromptEmbeds:
        """One row of the image condition from a (3, H, W) image in [0, 1]: `cond_latents` (1, C, T', H', W') and
        `image_embeds` (1, N, image_embed_dim). The image goes in as the 8-bit PIL image a user hands the pipeline."""
        from PIL import Image

        pipe = self.pipeline
        pixels8 = (image.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).cpu().numpy()
        frame = pipe.video_processor.resize(Image.fromarray(pixels8), height=self.height, width=self.width,
                                            resize_mode="crop")
        latents = pipe._get_image_latents(vae=pipe.vae, image_processor=pipe.video_processor, image=frame,
                                          height=self.height, width=self.width, device=self.device)
        cond = torch.zeros(1, latents.shape[1], self.latent_frames, *latents.shape[3:], dtype=latents.dtype,
                           device=latents.device)
        cond[:, :, :1] = latents  # the first latent frame; black (zero) latents after it, as the pipeline does
        image_embeds = pipe.encode_image(image=frame, batch_size=1, device=self.device, dtype=self.model_dtype)
        return PromptEmbeds({"cond_latents": cond, "image_embeds": image_embeds})

    def negative(self) -> PromptEmbeds:
        if self._negative is None:
            self._negative = HunyuanVideo15Adapter.encode(self, [""])  # text only: the frame comes with each row
        return self._negative

    def _negative_like(self, embeds: PromptEmbeds) -> PromptEmbeds:
        image = {k: v for k, v in embeds.tensors.items() if not k.startswith("prompt_embeds")}
        return PromptEmbeds({**self.negative().expand(len(embeds)).tensors, **image})

    def _condition(self, x: torch.Tensor, embeds: PromptEmbeds) -> tuple[torch.Tensor, torch.Tensor]:
        mask = x.new_zeros(x.shape[0], 1, *x.shape[2:])
        mask[:, :, 0] = 1.0
        return embeds.tensors["cond_latents"], mask

    def _image_embeds(self, x: torch.Tensor, embeds: PromptEmbeds) -> torch.Tensor:
        return embeds.tensors["image_embeds"]


register_adapter("HunyuanVideo15ImageToVideoPipeline", "hunyuan_video15_i2v", HunyuanVideo15I2VAdapter,
                 HV15_LORA_TARGETS)
