"""diffusers' LTX2Pipeline (LTX-2: a video with its audio track, denoised jointly by one transformer).

The RL state. LTX2VideoTransformer3DModel denoises video latents and audio latents together: each stream
attends to the other at every block, so the audio state at step j is an input of the video velocity at step j
and vice versa. A trajectory therefore has to carry both, or the training path could not recompute the
rollout's prediction. The adapter's state is one flat vector per sample, (B, N_video + N_audio):

- the video part: the normalised video latents in (C, T', H', W') order (what LTX2Pipeline packs into tokens);
- the audio part: the normalised audio latents as the pipeline keeps them, packed tokens (L, C_audio * M).

The kernels (ODE, Flow-SDE, Dance-SDE, CPS) act on the whole vector, so the SDE explores audio as well as
frames, and each step's log-prob is the Gaussian density of the joint transition, averaged over every element
(video and audio) -- the policy is LTX-2's joint distribution, which is the only one whose per-step density the
transformer defines. `split_latents` returns the two parts. `decode` returns the video (B, T, 3, H, W) in
[0, 1] (what the rewards score); the audio is not scored: `decode_audio(traj.latents[:, -1])` gives the
vocoder's waveform (B, channels, samples) at `audio_sample_rate` for a reward that asks for it (the trajectory
keeps the final audio latents, so nothing is decoded that no reward reads).

As LTX2Pipeline.__call__ (diffusers 0.42.1) samples:
- prompts: Gemma hidden states of every layer, stacked and flattened (`encode_prompt`, left padding, 1024
  tokens by default), then the pipeline's `connectors` turn them into the video and the audio caption streams
  and their attention mask;
- schedule: FlowMatchEulerDiscreteScheduler with sigmas linspace(1, 1/N, N) and `mu` from the packed video
  sequence length (base 1024 -> 0.95, max 4096 -> 2.05 by default), one schedule for both streams;
- the transformer gets `timestep = sigma = t`, the rotary coordinates of the video grid at the conditioning
  frame rate and of the audio frames, and `use_cross_timestep` (the pipeline's default True);
- guidance in x0 space, per stream, as the pipeline's denoising loop adds its terms: x0 = x - sigma v of the
  conditional pass, plus the CFG delta (g - 1)(x0_c - x0_u) (a [negative, positive] batch, when either stream's
  scale is > 1), plus the spatio-temporal guidance (STG) delta s (x0_c - x0_stg) from one more conditional pass
  whose self-attention is skipped at the blocks `spatio_temporal_guidance_blocks` (the transformer's own
  perturbation: those blocks' video and audio self-attention output their value projection; run when either
  stream's stg scale is > 0), plus the modality-isolation delta (m - 1)(x0_c - x0_iso) from a conditional pass
  with the audio<->video cross-attention off (run when either stream's modality scale is > 1), then the optional
  rescale of the sum towards x0_c (`guidance_rescale`, `audio_guidance_rescale`) and back to a velocity.
  `guidance_scale` is the video CFG scale; `audio_guidance_scale`, `audio_stg_scale`, `audio_modality_scale`,
  `audio_guidance_rescale` (None: the video value) the audio's, `stg_scale` and `modality_scale` the video's, as
  the pipeline's arguments of those names. One difference: the pipeline defaults an audio value with
  `audio or video`, so an audio 0 there means the video value; here 0 means 0. The adapter's defaults (stg 0,
  modality 1, rescale 0) are plain CFG; LTX2Pipeline's own call defaults are stg 1 at block 28, modality 3,
  rescale 0.7. STG needs a transformer built with `perturbed_attn=True` (its config): without it diffusers'
  blocks ignore the perturbation, the STG pass equals the conditional one, and a stg scale is a ConfigError
  rather than a silent extra forward;
- decoding denormalises the video latents with the VAE's mean/std/scaling factor (timestep-conditioned
  decoders get `decode_timestep` and fixed-seed noise, as the LTX adapter), the audio latents with the audio
  VAE's mean/std, unpacks them to (B, C, L, M) mel latents, and runs the audio VAE and the vocoder.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from diffusion_rl.adapters.base import PromptEmbeds, Schedule, VideoAdapter, flow_schedule, prompt_list
from diffusion_rl.adapters.registry import register_adapter
from mmreward.errors import ConfigError

LTX2_DEFAULT_HEIGHT, LTX2_DEFAULT_WIDTH, LTX2_DEFAULT_FRAMES, LTX2_DEFAULT_FRAME_RATE = 512, 768, 121, 24.0
LTX2_MAX_SEQUENCE_LENGTH = 1024  # LTX2Pipeline.__call__'s default
# every attention of the transformer: video self/cross (attn1, attn2), audio self/cross (audio_attn1/2) and the
# audio<->video cross-modal attentions all name their projections to_q/to_k/to_v/to_out.0
LTX2_LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]
# LTX2Pipeline.__call__'s guidance arguments the adapter takes (`configure_guidance`); the run config's model section
# has a key of each name (diffusion_rl.config.ModelConfig), None = the adapter's value
LTX2_GUIDANCE_KEYS = ("audio_guidance_scale", "guidance_rescale", "audio_guidance_rescale", "stg_scale",
                      "audio_stg_scale", "modality_scale", "audio_modality_scale", "spatio_temporal_guidance_blocks")


class LTX2Adapter(VideoAdapter):
    """diffusers' LTX2Pipeline: joint video + audio flow matching (see the module docstring for the state)."""

    family = "ltx2"
    block_classes = ("LTX2VideoTransformerBlock",)
    is_flow = True

    def __init__(self, pipeline, height: int | None = None, width: int | None = None,
                 max_sequence_length: int | None = None, num_frames: int | None = None,
                 frame_rate: float = LTX2_DEFAULT_FRAME_RATE, audio_guidance_scale: float | None = None,
                 guidance_rescale: float = 0.0, audio_guidance_rescale: float | None = None,
                 use_cross_timestep: bool = True, decode_timestep: float = 0.0,
                 decode_noise_scale: float | None = None, stg_scale: float = 0.0, audio_stg_scale: float | None = None,
                 modality_scale: float = 1.0, audio_modality_scale: float | None = None,
                 spatio_temporal_guidance_blocks: Sequence[int] | None = None) -> None:
        spatial = int(pipeline.vae_spatial_compression_ratio)
        temporal = int(pipeline.vae_temporal_compression_ratio)
        patch, patch_t = int(pipeline.transformer_spatial_patch_size), int(pipeline.transformer_temporal_patch_size)
        if patch_t != 1:
            raise ConfigError(f"LTX2Pipeline with a temporal patch size {patch_t} is not supported (LTX-2 uses 1)")
        self._init_video(pipeline, height or LTX2_DEFAULT_HEIGHT, width or LTX2_DEFAULT_WIDTH,
                         num_frames or LTX2_DEFAULT_FRAMES, max_sequence_length, spatial, temporal, spatial * patch)
        self._patch, self._patch_t = patch, patch_t
        self.frame_rate = LTX2_DEFAULT_FRAME_RATE
        self.fps = frame_rate  # checked by the setter
        self.audio_guidance_scale: float | None = None
        self.guidance_rescale, self.audio_guidance_rescale = 0.0, None
        self.stg_scale, self.audio_stg_scale, self.modality_scale, self.audio_modality_scale = 0.0, None, 1.0, None
        self.spatio_temporal_guidance_blocks: list[int] | None = None
        self.configure_guidance(audio_guidance_scale=audio_guidance_scale, guidance_rescale=guidance_rescale,
                                audio_guidance_rescale=audio_guidance_rescale, stg_scale=stg_scale,
                                audio_stg_scale=audio_stg_scale, modality_scale=modality_scale,
                                audio_modality_scale=audio_modality_scale,
                                spatio_temporal_guidance_blocks=spatio_temporal_guidance_blocks)
        self.use_cross_timestep = bool(use_cross_timestep)
        self.decode_timestep = float(decode_timestep)
        self.decode_noise_scale = float(decode_timestep if decode_noise_scale is None else decode_noise_scale)
        self._sigma_of: dict[float, float] = {}

    def configure_guidance(self, **settings) -> None:
        """Set LTX2Pipeline's guidance arguments (LTX2_GUIDANCE_KEYS; an audio value of None follows the video
        one), checked together: a ConfigError names a bad value and how to fix it, and nothing is changed then."""
        unknown = sorted(set(settings) - set(LTX2_GUIDANCE_KEYS))
        if unknown:
            raise ConfigError(f"LTX-2 guidance settings {unknown} do not exist; the settings are {list(LTX2_GUIDANCE_KEYS)}")
        new = {k: getattr(self, k) for k in LTX2_GUIDANCE_KEYS}
        new.update(settings)
        for name in LTX2_GUIDANCE_KEYS[:-1]:
            value = new[name]
            if value is None:
                if name in ("guidance_rescale", "stg_scale", "modality_scale"):
                    raise ConfigError(f"{name} must be a number (the video stream's), got None")
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ConfigError(f"{name} must be a finite number >= 0 (LTX2Pipeline's argument of that name), "
                                  f"got {value!r}")
            if "rescale" in name and value > 1:
                raise ConfigError(f"{name} must be in [0, 1] (LTX2Pipeline's rescale factor phi), got {value}")
            new[name] = float(value)
        blocks = new["spatio_temporal_guidance_blocks"]
        n_blocks = len(self.denoiser.transformer_blocks)
        if blocks is not None:
            if isinstance(blocks, (str, int)) or not all(isinstance(b, int) and not isinstance(b, bool)
                                                          for b in blocks):
                raise ConfigError(f"spatio_temporal_guidance_blocks must be a list of transformer block indices "
                                  f"such as [28], got {blocks!r}")
            blocks = sorted(set(int(b) for b in blocks))
            if blocks and (blocks[0] < 0 or blocks[-1] >= n_blocks):
                raise ConfigError(f"spatio_temporal_guidance_blocks {blocks}: this transformer has blocks 0.."
                                  f"{n_blocks - 1}")
            new["spatio_temporal_guidance_blocks"] = blocks or None
        stg = [new["stg_scale"], new["audio_stg_scale"] if new["audio_stg_scale"] is not None else new["stg_scale"]]
        if max(stg) > 0:
            if not new["spatio_temporal_guidance_blocks"]:
                raise ConfigError(f"stg_scale/audio_stg_scale {stg} > 0 need spatio_temporal_guidance_blocks (the "
                                  "blocks whose self-attention STG skips, e.g. [28]); set them or set the scales to 0")
            if not any(getattr(b, "perturbed_attn", False) for b in self.denoiser.transformer_blocks):
                raise ConfigError(f"stg_scale/audio_stg_scale {stg} > 0, but this LTX-2 transformer is built with "
                                  "perturbed_attn=False, so its blocks ignore the STG perturbation and the extra pass "
                                  "would change nothing; set stg_scale and audio_stg_scale to 0")
        for name, value in new.items():
            setattr(self, name, value)

    def _audio(self, name: str) -> float:
        """The audio stream's value of a guidance setting (its audio_ key, or the video's when that is None)."""
        value = getattr(self, "audio_" + name)
        return float(getattr(self, name) if value is None else value)

    # -- geometry -----------------------------------------------------------------------------
    @property
    def fps(self) -> float:  # the playback rate: the audio's length and the video's rotary positions follow it
        return self.frame_rate

    @fps.setter
    def fps(self, value: float) -> None:
        if not value or float(value) <= 0:
            raise ConfigError(f"frame_rate must be > 0 (frames per second, LTX2Pipeline's default 24), got {value}")
        self.frame_rate = float(value)

    @property
    def audio_sample_rate(self) -> int:
        """Samples per second of `decode_audio`'s waveform (the vocoder's output rate)."""
        return int(self.pipeline.vocoder.config.output_sampling_rate)

    def video_shape(self) -> tuple[int, int, int, int]:
        """(C, T', H', W') of the video latents, as LTX2Pipeline.prepare_latents draws them."""
        return (int(self.denoiser.config.in_channels), self.latent_frames, self.height // self._spatial,
                self.width // self._spatial)

    def audio_frames(self) -> int:
        """The audio latent length L for the clip's duration, as LTX2Pipeline.__call__ computes it."""
        pipe = self.pipeline
        per_second = pipe.audio_sampling_rate / pipe.audio_hop_length / float(pipe.audio_vae_temporal_compression_ratio)
        return round(self.num_frames / self.frame_rate * per_second)

    def audio_shape(self) -> tuple[int, int]:
        """(L, C_audio * M'): the packed audio tokens the transformer takes (M' latent mel bins)."""
        cfg = self.pipeline.audio_vae.config
        mel = int(cfg.mel_bins) // int(self.pipeline.audio_vae_mel_compression_ratio)
        return (self.audio_frames(), int(cfg.latent_channels) * mel)

    def latent_shape(self) -> tuple[int, ...]:
        return (int(np.prod(self.video_shape())) + int(np.prod(self.audio_shape())),)

    def split_latents(self, latents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The state (B, N) as (video (B, C, T', H', W'), packed audio (B, L, C_audio * M')), both normalised."""
        n_video = int(np.prod(self.video_shape()))
        if latents.ndim != 2 or latents.shape[1] != self.latent_shape()[0]:
            raise ConfigError(f"latents: expected LTX-2 states (B, {self.latent_shape()[0]}) (video then audio), "
                              f"got shape {tuple(latents.shape)}")
        b = latents.shape[0]
        return latents[:, :n_video].reshape(b, *self.video_shape()), latents[:, n_video:].reshape(b, *self.audio_shape())

    def join_latents(self, video: torch.Tensor, audio: torch.Tensor) -> torch.Tensor:
        """The inverse of `split_latents`."""
        return torch.cat([video.flatten(1), audio.flatten(1)], dim=1)

    # -- conditioning and schedule ------------------------------------------------------------
    @torch.no_grad()
    def encode(self, prompts: Sequence[str]) -> PromptEmbeds:
        pipe = self.pipeline
        pe, mask, _, _ = pipe.encode_prompt(
            prompt=prompt_list(prompts), do_classifier_free_guidance=False, device=self.device,
            max_sequence_length=self.max_sequence_length or LTX2_MAX_SEQUENCE_LENGTH,
        )
        side = getattr(getattr(pipe, "tokenizer", None), "padding_side", "left")
        video, audio, conn_mask = pipe.connectors(pe, mask, padding_side=side)
        return PromptEmbeds({"video_embeds": video, "audio_embeds": audio, "attention_mask": conn_mask})

    def schedule(self, num_steps: int) -> Schedule:
        from diffusers import FlowMatchEulerDiscreteScheduler
        from diffusers.pipelines.ltx2.pipeline_ltx2 import calculate_shift

        sched = self.pipeline.scheduler
        if not isinstance(sched, FlowMatchEulerDiscreteScheduler):
            sched = FlowMatchEulerDiscreteScheduler.from_config(sched.config)
        c, f, h, w = self.video_shape()
        seq_len = (f // self._patch_t) * (h // self._patch) * (w // self._patch)
        cfg = sched.config
        mu = calculate_shift(seq_len, cfg.get("base_image_seq_len", 1024), cfg.get("max_image_seq_len", 4096),
                             cfg.get("base_shift", 0.95), cfg.get("max_shift", 2.05))
        sched.set_timesteps(sigmas=np.linspace(1.0, 1 / num_steps, num_steps), mu=mu)
        schedule = flow_schedule(sched)
        # the pipeline converts between velocity and x0 with the scheduler's sigma of the step, not t / 1000
        self._sigma_of = {float(t): float(s) for t, s in zip(schedule.timesteps.tolist(), schedule.a.tolist())}
        return schedule

    def _sigmas(self, t: torch.Tensor) -> torch.Tensor:
        n_train = float(self.pipeline.scheduler.config.get("num_train_timesteps", 1000))
        vals = [self._sigma_of.get(float(v), float(v) / n_train) for v in t.detach().float().cpu().tolist()]
        return torch.tensor(vals, dtype=torch.float32, device=t.device)

    # -- denoiser -----------------------------------------------------------------------------
    def uses_cfg(self, guidance_scale: float) -> bool:
        audio = guidance_scale if self.audio_guidance_scale is None else self.audio_guidance_scale
        return guidance_scale > 1.0 or audio > 1.0  # LTX2Pipeline.do_classifier_free_guidance

    def _forward(self, model, x, t, embeds, guidance_scale, isolate_modalities: bool = False,
                 stg_blocks: list[int] | None = None):
        """(video velocity tokens (B, S_v, C), audio velocity tokens (B, L, D_a)) at states x (B, N); with
        `stg_blocks` those blocks skip self-attention (STG), with `isolate_modalities` the audio<->video
        cross-attention is off, as LTX2Pipeline's extra guidance passes call the transformer."""
        from diffusers.pipelines.ltx2.utils import conditioning_frame_rate

        video, audio = self.split_latents(x)
        _, _, frames, h, w = video.shape
        f, hh, ww = frames // self._patch_t, h // self._patch, w // self._patch
        packed = self.pipeline._pack_latents(video, self._patch, self._patch_t)
        n, fps, dev = x.shape[0], conditioning_frame_rate(self.frame_rate, 1.0), x.device
        video_coords = model.rope.prepare_video_coords(n, f, hh, ww, dev, fps=fps)
        audio_coords = model.audio_rope.prepare_audio_coords(n, audio.shape[1], dev)
        tensors = embeds.tensors
        return model(
            hidden_states=packed, audio_hidden_states=audio, encoder_hidden_states=tensors["video_embeds"],
            audio_encoder_hidden_states=tensors["audio_embeds"], timestep=t, sigma=t,
            encoder_attention_mask=tensors["attention_mask"], audio_encoder_attention_mask=tensors["attention_mask"],
            num_frames=f, height=hh, width=ww, fps=fps, audio_num_frames=audio.shape[1], video_coords=video_coords,
            audio_coords=audio_coords, isolate_modalities=isolate_modalities,
            spatio_temporal_guidance_blocks=stg_blocks, perturbation_mask=None,
            use_cross_timestep=self.use_cross_timestep, return_dict=False,
        )

    def predict(self, model: torch.nn.Module, x: torch.Tensor, t: torch.Tensor, embeds: PromptEmbeds,
                guidance_scale: float) -> torch.Tensor:
        """The joint velocity (B, N) at states x, with LTX2Pipeline's per-stream x0-space guidance terms (CFG,
        STG, modality isolation, then the rescale; see the module docstring)."""
        from diffusers.pipelines.ltx2.pipeline_ltx2 import rescale_noise_cfg

        x_in = x.to(self.model_dtype)
        cfg = self.uses_cfg(guidance_scale)
        stg = max(self.stg_scale, self._audio("stg_scale")) > 0.0  # LTX2Pipeline.do_spatio_temporal_guidance
        iso = max(self.modality_scale, self._audio("modality_scale")) > 1.0  # .do_modality_isolation_guidance
        if not (cfg or stg or iso):
            v_video, v_audio = self._forward(model, x_in, t, embeds, guidance_scale)
            return self._join_velocity(v_video.float(), v_audio.float())
        video, audio = self.split_latents(x.float())
        states = (self.pipeline._pack_latents(video, self._patch, self._patch_t), audio)
        sigma = self._sigmas(t).view(-1, 1, 1)

        def x0(preds) -> tuple[torch.Tensor, torch.Tensor]:
            return tuple(state - pred.float() * sigma for state, pred in zip(states, preds))

        if cfg:
            neg = self.negative().expand(len(embeds))
            both = self._forward(model, torch.cat([x_in, x_in]), torch.cat([t, t]), PromptEmbeds.cat([neg, embeds]),
                                 guidance_scale)
            uncond, cond = x0([p.chunk(2)[0] for p in both]), x0([p.chunk(2)[1] for p in both])
        else:
            cond = x0(self._forward(model, x_in, t, embeds, guidance_scale))
        g_audio = guidance_scale if self.audio_guidance_scale is None else float(self.audio_guidance_scale)
        scales = {"cfg": (guidance_scale - 1, g_audio - 1), "stg": (self.stg_scale, self._audio("stg_scale")),
                  "iso": (self.modality_scale - 1, self._audio("modality_scale") - 1)}
        guided = list(cond)
        for term, on in (("cfg", cfg), ("stg", stg), ("iso", iso)):
            if not on:
                continue
            if term == "cfg":
                other = uncond
            elif term == "stg":
                other = x0(self._forward(model, x_in, t, embeds, guidance_scale,
                                         stg_blocks=self.spatio_temporal_guidance_blocks))
            else:
                other = x0(self._forward(model, x_in, t, embeds, guidance_scale, isolate_modalities=True))
            # the pipeline's "delta" form, terms added in its order (cfg, stg, modality)
            guided = [g + s * (c - o) for g, s, c, o in zip(guided, scales[term], cond, other)]
        out = []
        for state, x0_g, x0_c, r in zip(states, guided, cond, (self.guidance_rescale, self._audio("guidance_rescale"))):
            if r > 0:
                x0_g = rescale_noise_cfg(x0_g, x0_c, guidance_rescale=r)
            out.append((state - x0_g) / sigma)
        return self._join_velocity(*out)

    def _join_velocity(self, v_video: torch.Tensor, v_audio: torch.Tensor) -> torch.Tensor:
        _, f, h, w = self.video_shape()
        video = self.pipeline._unpack_latents(v_video, f // self._patch_t, h // self._patch, w // self._patch,
                                              self._patch, self._patch_t)
        return self.join_latents(video, v_audio)

    # -- decoding -----------------------------------------------------------------------------
    def default_decode_chunk_size(self, batch: int) -> int:
        # with decode noise, LTX2Pipeline draws it once over the whole batch; chunks would each draw it again
        if self.decode_noise_scale and self.pipeline.vae.config.timestep_conditioning:
            return max(1, int(batch))
        return super().default_decode_chunk_size(batch)

    def decode(self, latents: torch.Tensor, *, keep_graph: bool = False) -> torch.Tensor:
        """Videos (B, T, 3, H, W) in [0, 1], fp32, from states (B, N) (the audio part is left: `decode_audio`)."""
        video, _ = self.split_latents(latents)
        with torch.set_grad_enabled(keep_graph and torch.is_grad_enabled()):
            frames = self._decode_latents(video.to(self.pipeline.vae.dtype))
            return (frames.float() / 2 + 0.5).clamp(0, 1)

    def _decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        vae = self.pipeline.vae
        timestep = None
        if vae.config.timestep_conditioning:
            n = latents.shape[0]
            timestep = torch.full((n,), self.decode_timestep, device=latents.device, dtype=latents.dtype)
            if self.decode_noise_scale:
                # fixed-seed noise, so a sample decodes the same way every time it is scored
                gen = torch.Generator("cpu").manual_seed(0)
                noise = torch.randn(latents.shape, generator=gen, dtype=torch.float32).to(latents.device, latents.dtype)
                latents = (1 - self.decode_noise_scale) * latents + self.decode_noise_scale * noise
        latents = self.pipeline._denormalize_latents(latents, vae.latents_mean, vae.latents_std,
                                                     vae.config.scaling_factor)
        video = vae.decode(latents.to(vae.dtype), timestep, return_dict=False)[0]  # (B, 3, T, H, W) in [-1, 1]
        return video.permute(0, 2, 1, 3, 4)

    def audio_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """The audio part of states (B, N) as the audio VAE takes it: denormalised mel latents (B, C, L, M')."""
        _, audio = self.split_latents(latents)
        avae = self.pipeline.audio_vae
        audio = self.pipeline._denormalize_audio_latents(audio.float(), avae.latents_mean, avae.latents_std)
        mel = int(avae.config.mel_bins) // int(self.pipeline.audio_vae_mel_compression_ratio)
        return self.pipeline._unpack_audio_latents(audio, audio.shape[1], num_mel_bins=mel)

    @torch.no_grad()
    def decode_audio(self, latents: torch.Tensor) -> torch.Tensor:
        """The waveform (B, channels, samples) of states (B, N): audio VAE -> mel spectrogram -> vocoder, as
        LTX2Pipeline decodes its audio track (samples at `audio_sample_rate`)."""
        avae = self.pipeline.audio_vae
        mel = avae.decode(self.audio_latents(latents).to(avae.dtype), return_dict=False)[0]
        return self.pipeline.vocoder(mel).float()


register_adapter("LTX2Pipeline", "ltx2", LTX2Adapter, LTX2_LORA_TARGETS)
