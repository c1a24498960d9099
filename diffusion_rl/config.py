"""Run configuration: nested dataclasses with a help string per field, validated in `__post_init__`.

Sections: model, sample, reward, advantage, train (the loop, optimizer and keys several methods share), one section
per method (ppo, draft, nft, dpo, prdp, raft, awm, dgpo, crd, refl; each names the algorithms that read it, and a
key the run's train.algorithm does not read is an error), guard (the reward-hacking monitor), prompts and log.

Precedence: dataclass defaults < the algorithm preset named by `preset` < the YAML file < command-line
overrides (`section.field=value`, values parsed as YAML). Unknown keys are errors that list the valid ones.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Union

import yaml

from diffusion_rl.presets import PRESETS
from mmreward.errors import ConfigError
from mmreward.safe_parse import safe_yaml

if typing.TYPE_CHECKING:
    from mmreward.prompt_sources import PromptList


def _f(default, help: str, *, required: bool = False, readers: tuple[str, ...] | None = None, **kw):
    """A config field with its help string; `required` fields have no usable default (help-keys says so); `readers`
    narrows the algorithms that read a key of a method section (the section's READERS otherwise)."""
    meta: dict[str, Any] = {"help": help, "required": required}
    if readers is not None:
        meta["readers"] = readers
    if isinstance(default, (list, dict)):
        return field(default_factory=functools.partial(type(default), default), metadata=meta, **kw)
    return field(default=default, metadata=meta, **kw)


def _describe(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is list:
        plural = {int: "whole numbers", float: "finite numbers", str: "strings"}
        return f"a list of {plural.get(args[0], _describe(args[0]))}" if args else "a list"
    if origin is dict or tp is dict:
        return "a mapping"
    return {int: "a whole number", float: "a finite number", str: "a string", bool: "true or false"}.get(tp, str(tp))


def _check_type(name: str, tp: Any, value: Any) -> Any:
    """`value` as the annotated type `tp`, or a ConfigError naming the field, the expected type and the fix.

    Strict where a silent conversion would change the run: a count given as a float (8.5, or 1e9 from the
    command line) is refused rather than truncated, numbers must be finite, and true/false is not a number.
    Strings holding numbers are accepted for numeric fields because YAML 1.1 reads 1e-4 as a string.
    """
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return _check_type(name, options[0], value)
        for option in options:
            try:
                return _check_type(name, option, value)
            except ConfigError:
                continue
        raise ConfigError(f"{name} must be {' or '.join(_describe(a) for a in options)}, got {value!r}")
    if value is None:
        raise ConfigError(f"{name} must be {_describe(tp)}, got null (an empty value)")
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{name} must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, str):
            try:
                value = int(value.strip())
            except ValueError:
                raise ConfigError(f"{name} must be a whole number, got {value!r}") from None
        if isinstance(value, float):
            hint = f"; write {int(value)}" if math.isfinite(value) and value.is_integer() else ""
            raise ConfigError(f"{name} counts something, so it must be a whole number, got the float {value!r}{hint}")
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name} must be a whole number, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):
            try:
                value = float(value.strip())
            except ValueError:
                raise ConfigError(f"{name} must be a number, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{name} must be a number, got {value!r}")
        if not math.isfinite(value):
            raise ConfigError(f"{name} must be a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{name} must be a string, got the {type(value).__name__} {value!r}; put it in quotes")
        return value
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{name} must be {_describe(tp)}, got {value!r}")
        return [_check_type(f"{name}[{i}]", args[0], v) for i, v in enumerate(value)] if args else list(value)
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{name} must be a mapping (key: value), got {value!r}")
        if not args:
            return dict(value)
        return {_check_type(f"{name} key", args[0], k): _check_type(f"{name}.{k}", args[1], v) for k, v in value.items()}
    return value


@functools.cache
def _hints(cls: Any) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _validate_types(obj: Any, section: str) -> None:
    """Coerce every field of a config dataclass to its annotation (in place), or raise a ConfigError."""
    hints = _hints(obj.__class__)
    for f in dataclasses.fields(obj):
        setattr(obj, f.name, _check_type(f"{section}.{f.name}", hints[f.name], getattr(obj, f.name)))


def _choice(name: str, value: Any, options: Sequence[Any]) -> None:
    if value not in options:
        raise ConfigError(f"{name} must be one of {list(options)}, got {value!r}")


def _positive(name: str, value: float | None, allow_zero: bool = False) -> None:
    if value is not None and (value < 0 or (value == 0 and not allow_zero)):
        raise ConfigError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value}")


def _unit(name: str, value: float) -> None:
    if not 0 <= value < 1:
        raise ConfigError(f"{name} must be in [0, 1), got {value}")


@dataclass
class ModelConfig:
    pretrained: str = _f("", "diffusers pipeline folder or hub id (SD 1.x/2.x, SDXL, SD3/3.5, FLUX); in a YAML file a "
                         "folder is relative to the file", required=True)
    dtype: str = _f("float32", "dtype of the frozen weights: float32, bfloat16 or float16")
    height: int | None = _f(None, "image height (default: the model's native size)")
    width: int | None = _f(None, "image width (default: the model's native size)")
    max_sequence_length: int | None = _f(None, "T5 sequence length for SD3/FLUX (default: the pipeline's)")
    lora: bool = _f(True, "train a LoRA adapter (peft) instead of every weight of the denoiser")
    lora_rank: int = _f(32, "LoRA rank")
    lora_alpha: int = _f(64, "LoRA alpha")
    lora_targets: list[str] | None = _f(None, "module names to adapt (default: the attention projections)")
    lora_init: str = _f("gaussian", "LoRA initialisation: 'gaussian' (A ~ N(0, 1/r), B = 0) or 'default' (PEFT's "
                        "init_lora_weights=True: Kaiming-uniform A, B = 0; Pref-GRPO's train_flux.py)")
    gradient_checkpointing: bool | None = _f(None, "recompute the denoiser's activations in backward to save memory "
                                             "(same gradients, ~1 more forward per backward); None = auto: on for "
                                             "video pipelines, off for image ones")
    attention: str = _f("auto", "attention backend of every pipeline model: auto (xformers on CUDA when it works, "
                        "else sdpa), sdpa, xformers, flash or math")
    num_frames: int | None = _f(None, "video pipelines: frames per clip, num_frames - 1 a multiple of the VAE's "
                                "temporal factor (4 for Wan and HunyuanVideo: 9, 13, ..., 81); default: the pipeline's "
                                "(81 for Wan, 129 for HunyuanVideo); an error for image pipelines")
    fps: float | None = _f(None, "video pipelines: the frame rate the clips are saved at, which rewards that sample "
                           "by time read (VideoReward: 2 frames per second); default: the pipeline's (Wan 16, "
                           "HunyuanVideo 24); an error for image pipelines")
    lora_experts: str = _f("both", "Wan 2.2 A14B (two experts): which expert is trained, 'both', 'high' (the "
                           "high-noise transformer) or 'low' (transformer_2); ignored by one-expert models")
    guidance_scale_2: float | None = _f(None, "Wan 2.2 A14B: CFG scale of the low-noise expert (the pipeline's "
                                        "guidance_scale_2; default: sample.guidance_scale)")
    cfg_normalization: float | None = _f(None, "Z-Image: the pipeline's cfg_normalization (renormalise the guided "
                                         "prediction to this multiple of the conditional norm; None: off)")
    cfg_truncation: float | None = _f(None, "Z-Image: the pipeline's cfg_truncation (no CFG once this fraction of "
                                      "the steps is done; None: off)")
    # LTX-2 (LTX2Pipeline's guidance arguments of the same names; None: the adapter's, which is plain CFG)
    audio_guidance_scale: float | None = _f(None, "LTX-2: CFG scale of the audio stream (default: sample.guidance_scale)")
    guidance_rescale: float | None = _f(None, "LTX-2: rescale of the guided x0 towards the conditional one, in [0, 1] "
                                        "(video; default 0)")
    audio_guidance_rescale: float | None = _f(None, "LTX-2: the audio stream's guidance_rescale (default: the video's)")
    stg_scale: float | None = _f(None, "LTX-2: spatio-temporal guidance scale (video; default 0: off); needs "
                                 "spatio_temporal_guidance_blocks and a transformer with perturbed_attn")
    audio_stg_scale: float | None = _f(None, "LTX-2: the audio stream's stg_scale (default: the video's)")
    modality_scale: float | None = _f(None, "LTX-2: modality-isolation guidance scale (video; default 1: off)")
    audio_modality_scale: float | None = _f(None, "LTX-2: the audio stream's modality_scale (default: the video's)")
    spatio_temporal_guidance_blocks: list[int] | None = _f(None, "LTX-2: transformer blocks whose self-attention STG "
                                                           "skips (the pipeline's default [28])")
    context_parallel: dict[str, int] | None = _f(None, "video pipelines: split each clip's tokens over the processes "
                                                 "with diffusers' context parallelism, {ulysses_degree: N} or "
                                                 "{ring_degree: N} (product = the group size; processes = groups x "
                                                 "product; ring needs GPUs); "
                                                 "rollouts, evaluation and training (grpo, grpo_guard, pref_grpo, "
                                                 "ddpo, nft), see docs/context_parallel.md")

    def __post_init__(self) -> None:
        _validate_types(self, "model")
        _choice("model.lora_experts", self.lora_experts, ["both", "high", "low"])
        for name in ("guidance_scale_2", "cfg_normalization", "cfg_truncation", "audio_guidance_scale",
                     "guidance_rescale", "audio_guidance_rescale", "stg_scale", "audio_stg_scale", "modality_scale",
                     "audio_modality_scale"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"model.{name} must be a finite number >= 0 (or null), got {value}")
        _choice("model.dtype", self.dtype, ["float32", "bfloat16", "float16"])
        _choice("model.attention", self.attention, ["auto", "sdpa", "xformers", "flash", "math"])
        _choice("model.lora_init", self.lora_init, ["gaussian", "default"])
        _positive("model.lora_rank", self.lora_rank)
        _positive("model.lora_alpha", self.lora_alpha)
        _positive("model.height", self.height)
        _positive("model.width", self.width)
        _positive("model.max_sequence_length", self.max_sequence_length)
        _positive("model.num_frames", self.num_frames)
        _positive("model.fps", self.fps)
        from diffusion_rl.context_parallel import parse_settings

        self.context_parallel = parse_settings(self.context_parallel)


@dataclass
class SampleConfig:
    num_steps: int = _f(10, "denoising steps of each rollout")
    guidance_scale: float = _f(4.5, "CFG scale in rollouts and training forward passes (1 = off; FLUX-dev: embedded guidance)")
    kernel: str = _f("flow_sde", "transition kernel: flow_sde, dance_sde, cps, cps_gaussian (flow models) or ddim (UNet)")
    noise_level: float = _f(0.7, "a for flow_sde/cps, eta for dance_sde/ddim")
    log_prob_reduction: str = _f("mean", "reduce per-element log-densities by 'mean' (references; clip ranges transfer) or 'sum'")
    sde_window: list[int] | None = _f(None, "[start, end) of the steps sampled with the SDE; ODE elsewhere (None: all)")
    sde_window_size: int | None = _f(None, "if set, a random window of this many SDE steps inside sde_window each iteration (Flow-GRPO-Fast/MixGRPO)")
    share_initial_noise: bool = _f(False, "all samples of a prompt start from the same x_T (DanceGRPO init_same_noise)")
    antithetic_noise: bool = _f(False, "mirrored SDE noise: samples 2k and 2k+1 of a group take opposite noise at every "
                                "SDE step (needs share_initial_noise and an even group_size); noise that does not "
                                "change the reward then cancels in the policy gradient")
    prompts_per_iteration: int = _f(4, "prompts (groups) per iteration, over all processes")
    group_size: int = _f(8, "samples per prompt")
    batch_size: int = _f(8, "rollout micro-batch per process")
    eval_num_steps: int | None = _f(None, "ODE steps for evaluation (default: num_steps)")
    eval_guidance_scale: float | None = _f(None, "CFG scale for evaluation (default: guidance_scale)")
    sde_window_shift_every: int | None = _f(None, "if set, the sde_window_size window slides instead of jumping at random: "
                                            "it moves by sde_window_stride steps every this many iterations and wraps "
                                            "around inside sde_window (MixGRPO's progressive window)")
    sde_window_stride: int = _f(1, "steps the sliding window moves at each shift (MixGRPO prog_overlap_step)")
    ode_solver: str = _f("euler", "deterministic flow solver where no SDE step is taken: 'euler' or 'dpm2' "
                         "(DPM-Solver++ 2M; nft rollouts, MixGRPO's ODE steps after the SDE window)")
    decode_chunk_size: int | None = _f(None, "samples the VAE decodes at once in rollouts, evaluation and DRaFT (same "
                                       "values, less memory); None = auto: 1 clip for video pipelines, the whole "
                                       "batch for images")
    offload_trajectory: bool | None = _f(None, "keep each rollout's per-step latents, log-probs and decoded samples "
                                         "in CPU memory, moving back only the trained steps in the update (same "
                                         "update, less device memory); None = auto: on for video pipelines, off "
                                         "for images")
    branching: bool = _f(False, "TempFlow-GRPO trajectory branching: each group's ODE prefix from its shared x_T runs once, "
                         "the branches split at the iteration's one SDE step (sde_window_size: 1) and follow the ODE "
                         "to the end; needs share_initial_noise: true")

    def __post_init__(self) -> None:
        _validate_types(self, "sample")
        _positive("sample.num_steps", self.num_steps)
        _choice("sample.kernel", self.kernel, ["flow_sde", "dance_sde", "cps", "cps_gaussian", "ddim", "ode"])
        _positive("sample.noise_level", self.noise_level, allow_zero=True)
        _choice("sample.log_prob_reduction", self.log_prob_reduction, ["mean", "sum"])
        _positive("sample.prompts_per_iteration", self.prompts_per_iteration)
        _positive("sample.group_size", self.group_size)
        _positive("sample.batch_size", self.batch_size)
        _positive("sample.guidance_scale", self.guidance_scale, allow_zero=True)
        _positive("sample.eval_num_steps", self.eval_num_steps)
        _positive("sample.eval_guidance_scale", self.eval_guidance_scale, allow_zero=True)
        _choice("sample.ode_solver", self.ode_solver, ["euler", "dpm2"])
        _positive("sample.sde_window_shift_every", self.sde_window_shift_every)
        _positive("sample.sde_window_stride", self.sde_window_stride, allow_zero=True)
        if self.sde_window_shift_every is not None and self.sde_window_size is None:
            raise ConfigError("sample.sde_window_shift_every slides a window of sample.sde_window_size steps: set "
                              "sde_window_size too (MixGRPO: 4)")
        _positive("sample.decode_chunk_size", self.decode_chunk_size)
        if self.sde_window is not None:
            if len(self.sde_window) != 2 or not 0 <= self.sde_window[0] < self.sde_window[1] <= self.num_steps:
                raise ConfigError(
                    f"sample.sde_window must be [start, end) with 0 <= start < end <= num_steps ({self.num_steps}), "
                    f"got {self.sde_window}"
                )
        if self.sde_window_size is not None:
            lo, hi = self.sde_window or (0, self.num_steps)
            if not 1 <= self.sde_window_size <= hi - lo:
                raise ConfigError(f"sample.sde_window_size must be in [1, {hi - lo}], got {self.sde_window_size}")
        if self.antithetic_noise and (not self.share_initial_noise or self.group_size % 2 or self.branching):
            raise ConfigError("sample.antithetic_noise pairs samples 2k and 2k+1 of a group from one x_T: set "
                              f"sample.share_initial_noise: true (got {self.share_initial_noise}), an even "
                              f"sample.group_size (got {self.group_size}) and branching: false")
        if self.branching and (not self.share_initial_noise or self.sde_window_size != 1):
            raise ConfigError("sample.branching grows a group's branches from one x_T at one step per iteration: set "
                              f"sample.share_initial_noise: true (got {self.share_initial_noise}) and "
                              f"sample.sde_window_size: 1 (got {self.sde_window_size})")


@dataclass
class RewardConfig:
    rewards: dict[str, float] = _f({}, "reward name (mmreward.load, see `mmreward list`) -> weight; required",
                                   required=True)
    options: dict[str, dict] = _f({}, "reward name -> options for mmreward.load (checkpoint, weights, ...)")
    aggregation: str = _f("reward", "combine rewards before ('reward') or after ('advantage') normalisation")
    eval_rewards: list[str] | None = _f(None, "rewards reported on held-out prompts (default: the training rewards)")
    pairwise: str | None = _f(None, "Pref-GRPO: the reward whose `compare` judges pairs (default: the first reward)")
    both_orders: bool = _f(True, "Pref-GRPO: judge every pair in both positions to cancel position bias")
    win_mode: str = _f("hard", "Pref-GRPO: 'hard' wins (1/0/0.5) or 'soft' probabilities")
    overlap: bool = _f(False, "score each rollout chunk in a background thread while the next one is generated "
                              "(same scores as without; see docs/remote_rewards.md)")
    remote: dict[str, dict] = _f({}, "reward name -> where it runs instead of in the trainer: {url: http://HOST:PORT "
                                     "(mmreward serve), token_env, timeout_s, retries} or a local pool {replicas, "
                                     "devices, engine: process|ray, num_gpus, runtime_env} (see docs/remote_rewards.md)")

    def __post_init__(self) -> None:
        _validate_types(self, "reward")
        if self.remote:
            from diffusion_rl.remote_specs import parse_remote_specs

            parse_remote_specs(self.remote, used=set(self.rewards) | set(self.eval_rewards or []) | {self.pairwise})
        if not self.rewards:
            # no silent default: a run on a placeholder reward looks like a run and learns nothing
            raise ConfigError(
                "reward.rewards is not set: name the reward(s) to train on with their weights, e.g. "
                "`reward: {rewards: {pickscore: 1.0}}` in the YAML or reward.rewards='{pickscore: 1.0}' on the "
                "command line (`mmreward list` shows the names)"
            )
        _choice("reward.aggregation", self.aggregation, ["reward", "advantage"])
        _choice("reward.win_mode", self.win_mode, ["hard", "soft"])
        unknown = set(self.options) - set(self.rewards) - set(self.eval_rewards or []) - {self.pairwise}
        if unknown:
            raise ConfigError(
                f"reward.options names rewards that are not used: {sorted(unknown)} (used: "
                f"{sorted(set(self.rewards) | set(self.eval_rewards or []))}). If you replaced reward.rewards on the "
                "command line, clear or replace the options too, e.g. reward.options='{}' or "
                f"reward.options='{{{next(iter(self.rewards))}: {{...}}}}'"
            )


@dataclass
class AdvantageConfig:
    std_scope: str = _f("group", "divide by the std of the 'group', the 'global' batch, or 'none'")
    unbiased: bool = _f(False, "unbiased (n-1) std (DanceGRPO) instead of the population std (Flow-GRPO, DDPO)")
    eps: float = _f(1e-4, "added to the std")
    clip_max: float | None = _f(5.0, "clip advantages to [-clip_max, clip_max]")
    per_prompt_tracking: bool = _f(False, "DDPO: normalise by each prompt's running buffer of rewards")
    buffer_size: int = _f(16, "DDPO stat tracking buffer per prompt")
    min_count: int = _f(16, "DDPO: use batch statistics until a prompt has this many rewards")

    def __post_init__(self) -> None:
        _validate_types(self, "advantage")
        _choice("advantage.std_scope", self.std_scope, ["group", "global", "none"])
        _positive("advantage.eps", self.eps, allow_zero=True)
        _positive("advantage.clip_max", self.clip_max)
        _positive("advantage.buffer_size", self.buffer_size)
        _positive("advantage.min_count", self.min_count)


@dataclass
class TrainConfig:
    algorithm: str = _f("grpo", "grpo, grpo_guard (GRPO-Guard: RatioNorm + 1 / dt step weights), pref_grpo, ddpo, "
                         "draft (reward backprop: DRaFT-K / AlignProp), nft (DiffusionNFT), dpo (Diffusion-DPO: "
                         "online, or offline on dpo.pairs), raft (reward-ranked fine-tuning), awm "
                         "(advantage-weighted matching), prdp (proximal reward difference prediction), dgpo "
                         "(group DPO), crd (centred reward distillation) or refl (ReFL: reward on a one-step x0 "
                         "prediction at a random late step); the method's own keys are in its section (ppo, draft, "
                         "nft, dpo, prdp, raft, awm, dgpo, crd, refl)")
    iterations: int = _f(100, "rollout + update iterations")
    learning_rate: float = _f(3e-4, "AdamW learning rate")
    adam_beta1: float = _f(0.9, "AdamW beta1")
    adam_beta2: float = _f(0.999, "AdamW beta2")
    weight_decay: float = _f(1e-4, "AdamW weight decay")
    adam_eps: float = _f(1e-8, "AdamW epsilon")
    max_grad_norm: float | None = _f(1.0, "gradient clipping norm (None: off)")
    # read by several methods: the ratio clip of grpo/grpo_guard/pref_grpo/ddpo, prdp's stepwise clip, awm's ratio
    # clip and dgpo's stop-gradient clip
    clip_range: float = _f(1e-4, "PPO clip range on the per-step ratio")
    # the trained steps: SDE steps of grpo/grpo_guard/pref_grpo/ddpo/prdp rollouts, schedule steps of nft/dgpo/crd
    timestep_fraction: float = _f(1.0, "fraction of the SDE steps trained per sample (at least one)")
    timestep_selection: str = _f("first", "which SDE steps: the 'first' ones in order (Flow-GRPO) or 'random' per sample (DanceGRPO)")
    num_minibatches: int = _f(1, "optimizer steps per pass over an iteration's samples (split by whole groups)")
    num_inner_epochs: int = _f(1, "passes over each iteration's samples")
    micro_batch_size: int = _f(8, "training forward batch per process")
    # the reference model: the KL term of grpo/pref_grpo/ddpo/nft/awm/dgpo/crd, the frozen copy dpo and prdp compare with
    kl_beta: float = _f(0.0, "weight of the KL to the reference policy")
    kl_reference: str = _f("adapter", "reference policy: 'adapter' (LoRA disabled) or 'copy' (frozen copy)")
    ema: bool = _f(False, "keep an EMA of the trained weights, used for evaluation and export")
    ema_decay: float = _f(0.9, "EMA decay (Flow-GRPO: 0.9 every 8 steps)")
    ema_update_every: int = _f(8, "optimizer steps between EMA updates")
    mixed_precision: str | None = _f(None, "mixed precision: no, bf16 or fp16; unset: what `accelerate launch "
                                     "--mixed_precision` / the accelerate config says (a value here wins)")
    seed: int = _f(42, "seed of the counter-based noise and prompt order")
    probe: str = _f("warn", "before each update check that recomputed log-probs equal the rollout's: warn, error or off")
    probe_tolerance: float = _f(1e-4, "max |log ratio| allowed by the probe at ratio 1")
    resume_from: str | None = _f(None, "checkpoint folder to resume from (relative to the current directory, like "
                                 "log.output_dir), or 'latest' in log.output_dir")

    def __post_init__(self) -> None:
        _validate_types(self, "train")
        _choice("train.algorithm", self.algorithm, ALGORITHMS)
        _positive("train.iterations", self.iterations, allow_zero=True)
        _positive("train.learning_rate", self.learning_rate)
        _positive("train.clip_range", self.clip_range)
        _unit("train.adam_beta1", self.adam_beta1)
        _unit("train.adam_beta2", self.adam_beta2)
        _positive("train.weight_decay", self.weight_decay, allow_zero=True)
        _positive("train.adam_eps", self.adam_eps, allow_zero=True)
        _positive("train.max_grad_norm", self.max_grad_norm)
        _positive("train.probe_tolerance", self.probe_tolerance)
        _positive("train.ema_update_every", self.ema_update_every)
        if self.resume_from is not None and not self.resume_from.strip():
            raise ConfigError("train.resume_from is empty: give a checkpoint folder, 'latest', or leave it unset")
        if not 0 < self.timestep_fraction <= 1:
            raise ConfigError(f"train.timestep_fraction must be in (0, 1], got {self.timestep_fraction}")
        _choice("train.timestep_selection", self.timestep_selection, ["first", "random"])
        _positive("train.num_minibatches", self.num_minibatches)
        _positive("train.num_inner_epochs", self.num_inner_epochs)
        _positive("train.micro_batch_size", self.micro_batch_size)
        _positive("train.kl_beta", self.kl_beta, allow_zero=True)
        _choice("train.kl_reference", self.kl_reference, ["adapter", "copy"])
        _choice("train.mixed_precision", self.mixed_precision, [None, "no", "bf16", "fp16"])
        _choice("train.probe", self.probe, ["warn", "error", "off"])
        if not 0 <= self.ema_decay < 1:
            raise ConfigError(f"train.ema_decay must be in [0, 1), got {self.ema_decay}")


ALGORITHMS = ("grpo", "grpo_guard", "pref_grpo", "ddpo", "draft", "nft", "dpo", "raft", "refl", "awm", "dgpo", "crd",
              "prdp")


# -- per-method sections -------------------------------------------------------------------------
# Each method section names the algorithms that read it (READERS; a field may narrow it with `readers`). Setting
# a key the run's train.algorithm does not read is a ConfigError (RunConfig, from_dict), so one rule replaces the
# per-key "applies to X, not Y" checks.
@dataclass
class PPOConfig:
    """The PPO update on the rollouts' SDE/DDIM likelihoods."""

    READERS: ClassVar[tuple[str, ...]] = ("grpo", "grpo_guard", "pref_grpo", "ddpo")
    kl_mode: str = _f("exact", "'exact' Gaussian KL or Flow-GRPO's |dt|-scaled 'flow_grpo' form")
    ratio_norm: bool = _f(False, "GRPO-Guard's ratio normalisation and 1 / dt step weight in the PPO loss of grpo, "
                          "pref_grpo or ddpo (Pref-GRPO --rationorm); always on for grpo_guard")
    best_worst_k: int = _f(0, "grpo/grpo_guard/pref_grpo: train only the k highest- and k lowest-advantage samples of "
                           "each group (DanceGRPO's video --bestofn 2k); 0: every sample",
                           readers=("grpo", "grpo_guard", "pref_grpo"))
    noise_aware_weight: bool = _f(False, "TempFlow-GRPO's noise-aware weighting, the policy loss of each step times its "
                                  "transition std (sigma_t sqrt(dt)) normalised to mean 1 over the steps of "
                                  "sample.sde_window")

    def __post_init__(self) -> None:
        _validate_types(self, "ppo")
        _choice("ppo.kl_mode", self.kl_mode, ["exact", "flow_grpo"])
        _positive("ppo.best_worst_k", self.best_worst_k, allow_zero=True)


@dataclass
class DraftConfig:
    """Reward backprop through the last sampling steps (DRaFT-K / AlignProp)."""

    READERS: ClassVar[tuple[str, ...]] = ("draft",)
    backprop_steps: int = _f(1, "backpropagate the reward through the last K sampling steps (DRaFT-K)")
    backprop_strategy: str = _f("fixed", "'fixed' K (DRaFT) or K uniform in [1, backprop_steps] per iteration (AlignProp)")

    def __post_init__(self) -> None:
        _validate_types(self, "draft")
        _positive("draft.backprop_steps", self.backprop_steps)
        _choice("draft.backprop_strategy", self.backprop_strategy, ["fixed", "uniform"])


@dataclass
class NFTConfig:
    """DiffusionNFT."""

    READERS: ClassVar[tuple[str, ...]] = ("nft",)
    beta: float = _f(1.0, "strength beta of the implicit policies v+- = v_old +- beta (v_theta - v_old)")
    adaptive_weight: bool = _f(True, "divide each sample's x0 error by its mean absolute value (the paper's weighting)")
    old_decay: list[float] = _f([0.0, 0.001, 0.5], "[flat, rate, cap] of the old policy's soft update "
                                "old <- d old + (1 - d) theta, d = min(rate * (step - flat), cap), 0 before flat")

    def __post_init__(self) -> None:
        _validate_types(self, "nft")
        _positive("nft.beta", self.beta)
        if len(self.old_decay) != 3 or min(self.old_decay) < 0 or self.old_decay[2] >= 1:
            raise ConfigError(f"nft.old_decay must be [flat >= 0, rate >= 0, 0 <= cap < 1], got {self.old_decay}")


@dataclass
class DPOConfig:
    """Diffusion-DPO, online on ranked samples or offline on a pair dataset."""

    READERS: ClassVar[tuple[str, ...]] = ("dpo",)
    beta: float = _f(5000.0, "temperature beta of the Diffusion-DPO loss -log sigmoid(-beta/2 (model diff - ref diff))")
    pairs: str | None = _f(None, "train offline on the preference pairs of this source instead of online ranked "
                           "samples: a .jsonl or .parquet of {prompt, chosen, rejected} (or the `mmreward "
                           "train-pref` layouts {prompt, image_a, image_b, label} and Pick-a-Pic's {caption, jpg_0, "
                           "jpg_1, label_0}), a datasets save_to_disk folder or hf:org/name[:split]; "
                           "sample.prompts_per_iteration pairs per iteration; None: online")

    def __post_init__(self) -> None:
        _validate_types(self, "dpo")
        _positive("dpo.beta", self.beta)


@dataclass
class PRDPConfig:
    """Proximal reward difference prediction (PRDP)."""

    READERS: ClassVar[tuple[str, ...]] = ("prdp",)
    beta: float = _f(10.0, "beta, the KL weight of the RL objective PRDP solves: the model regresses each "
                     "pair's reward difference / beta from its log-likelihood ratios (its stepwise clip eps is "
                     "train.clip_range)")

    def __post_init__(self) -> None:
        _validate_types(self, "prdp")
        _positive("prdp.beta", self.beta)


@dataclass
class RAFTConfig:
    """Reward-ranked fine-tuning (RAFT)."""

    READERS: ClassVar[tuple[str, ...]] = ("raft",)
    top_k: int = _f(1, "samples of each group kept (the k highest rewards) and fine-tuned on")

    def __post_init__(self) -> None:
        _validate_types(self, "raft")
        _positive("raft.top_k", self.top_k)


@dataclass
class AWMConfig:
    """Advantage-weighted matching (AWM)."""

    READERS: ClassVar[tuple[str, ...]] = ("awm",)
    adv_clip: float = _f(1.0, "advantages are clipped to [-adv_clip, adv_clip] (Flow-Factory adv_clip_range)")

    def __post_init__(self) -> None:
        _validate_types(self, "awm")
        _positive("awm.adv_clip", self.adv_clip)


@dataclass
class DGPOConfig:
    """Group DPO (DGPO)."""

    READERS: ClassVar[tuple[str, ...]] = ("dgpo",)
    timesteps: int = _f(4, "schedule steps trained per iteration, shared by every sample, drawn from the "
                        "noisiest train.timestep_fraction of sample.num_steps")
    beta: float = _f(5000.0, "beta of the group loss -log sigmoid(-beta/G sum_i A_i (l_i - l_ref_i)) (the default is "
                     "dpo.beta's; the dgpo preset: 10)")

    def __post_init__(self) -> None:
        _validate_types(self, "dgpo")
        _positive("dgpo.timesteps", self.timesteps)
        _positive("dgpo.beta", self.beta)


@dataclass
class CRDConfig:
    """Centred reward distillation (CRD)."""

    READERS: ClassVar[tuple[str, ...]] = ("crd",)
    beta: float = _f(1.0, "beta of the centred reward matching (beta R_theta_c - R_c)^2")
    loss: str = _f("mse", "'mse' or 'bce' matching of the centred implicit and external rewards")
    weight_temp: float = _f(-1.0, "centring weights: < 0 the group mean, > 0 dual softmax(+-u / T), 0 hard")
    adaptive_logp: bool = _f(True, "divide each squared velocity error by its mean absolute value")
    old_decay: list[float] = _f([0.0, 0.25, 0.005, 0.999], "[start, d0, slope, end] of the old copy's soft "
                                "update copy <- d copy + (1 - d) theta, d = min(d0 + slope (step - start), end)")
    sampling_decay: list[float] = _f([75.0, 0.0, 0.0075, 0.999], "[start, d0, slope, end] of the sampling "
                                     "copy's soft update (as old_decay)")
    kl_cfg: float = _f(4.5, "CFG scale of the reference velocity in the KL term")
    reward_adaptive_kl: bool = _f(True, "scale each sample's KL by 1e-4 / kl_beta + u (1 - 1e-4 / kl_beta)")

    def __post_init__(self) -> None:
        _validate_types(self, "crd")
        _positive("crd.beta", self.beta)
        _choice("crd.loss", self.loss, ["mse", "bce"])
        for key in ("old_decay", "sampling_decay"):
            sched = getattr(self, key)
            if len(sched) != 4 or sched[0] < 0 or not all(0 <= v <= 1 for v in (sched[1], sched[3])) or sched[2] < 0:
                raise ConfigError(f"crd.{key} must be [start >= 0, d0 in [0, 1], slope >= 0, end in [0, 1]], "
                                  f"got {sched}")


@dataclass
class ReFLConfig:
    """ReFL and Direct-Align: the reward on a one-step x0 prediction."""

    READERS: ClassVar[tuple[str, ...]] = ("refl",)
    step_range: list[float] = _f([0.75, 1.0], "the step with grad is drawn uniformly from the step indices "
                                 "[floor(lo T), ceil(hi T) - 1] of the T sampling steps (ReFL.py: 30..39 of 40)")
    loss: str = _f("relu", "phi of the loss lambda phi(margin - reward): 'relu' (ReFL.py) or 'identity'")
    margin: float = _f(2.0, "the margin of relu(margin - reward) (ReFL.py: 2)")
    scale: float = _f(1e-3, "lambda, the loss scale (ReFL.py --grad_scale 1e-3)")
    mode: str = _f("refl", "'refl' (x0 from the sampler's state at the drawn step) or 'direct_align' (SRPO: "
                   "re-noise the sampled image with its own initial noise to that step, one step with grad, "
                   "recover x0 analytically; flow models only)")

    def __post_init__(self) -> None:
        _validate_types(self, "refl")
        _choice("refl.loss", self.loss, ["relu", "identity"])
        _choice("refl.mode", self.mode, ["refl", "direct_align"])
        _positive("refl.scale", self.scale)
        lo_hi = self.step_range
        if len(lo_hi) != 2 or not 0 <= lo_hi[0] < lo_hi[1] <= 1:
            raise ConfigError(f"refl.step_range must be [lo, hi] with 0 <= lo < hi <= 1, got {lo_hi}")


@dataclass
class GuardConfig:
    """The reward-hacking monitor (diffusion_rl.hacking_guard), for every algorithm."""

    mode: str = _f("off", "reward-hacking monitor (needs log.gold_rewards): 'warn' logs an alarm when the training "
                   "reward's trend rises while a gold reward's falls; 'stop' also ends training; 'rollback' "
                   "also restores the best-by-gold checkpoint, then stops (diffusion_rl.hacking_guard)")
    window: int = _f(3, "the trends are least-squares lines over this many latest evaluations (>= 2)")
    tolerance: float = _f(0.02, "alarm when a gold reward's fitted change over the window is "
                          "below minus this (in the gold reward's units; ~1-2 SE of the evaluation)")
    min_rise: float = _f(0.0, "... and the training reward's fitted change over the window "
                         "exceeds this (in its units)")

    def __post_init__(self) -> None:
        _validate_types(self, "guard")
        _choice("guard.mode", self.mode, ["off", "warn", "stop", "rollback"])
        if self.window < 2:
            raise ConfigError(f"guard.window must be >= 2 (a trend needs two evaluations), got {self.window}")
        _positive("guard.tolerance", self.tolerance, allow_zero=True)
        _positive("guard.min_rise", self.min_rise, allow_zero=True)


# section -> its class; method sections are the ones with READERS
METHOD_SECTIONS: dict[str, Any] = {
    "ppo": PPOConfig, "draft": DraftConfig, "nft": NFTConfig, "dpo": DPOConfig, "prdp": PRDPConfig,
    "raft": RAFTConfig, "awm": AWMConfig, "dgpo": DGPOConfig, "crd": CRDConfig, "refl": ReFLConfig,
}

# the flat train keys of earlier versions -> where they are now (a config that still uses one fails clearly)
MOVED_TRAIN_KEYS = {
    "kl_mode": "ppo.kl_mode", "ratio_norm": "ppo.ratio_norm", "best_worst_k": "ppo.best_worst_k",
    "noise_aware_weight": "ppo.noise_aware_weight", "backprop_steps": "draft.backprop_steps",
    "backprop_strategy": "draft.backprop_strategy", "nft_beta": "nft.beta", "nft_adaptive_weight": "nft.adaptive_weight",
    "nft_old_decay": "nft.old_decay", "dpo_beta": "dpo.beta (dgpo.beta for train.algorithm: dgpo)",
    "dpo_pairs": "dpo.pairs", "prdp_beta": "prdp.beta", "raft_top_k": "raft.top_k", "awm_adv_clip": "awm.adv_clip",
    "dgpo_timesteps": "dgpo.timesteps", **{f"crd_{k}": f"crd.{k}" for k in (
        "beta", "loss", "weight_temp", "adaptive_logp", "old_decay", "sampling_decay", "kl_cfg", "reward_adaptive_kl")},
    **{f"refl_{k}": f"refl.{k}" for k in ("step_range", "loss", "margin", "scale", "mode")},
    "hacking_guard": "guard.mode", "hacking_window": "guard.window", "hacking_tolerance": "guard.tolerance",
    "hacking_min_rise": "guard.min_rise",
}


def _field_readers(section: str, name: str) -> tuple[str, ...] | None:
    """The algorithms that read `section.name`; None where every algorithm does (a shared section)."""
    cls = METHOD_SECTIONS.get(section)
    if cls is None:
        return None
    meta = {f.name: f.metadata for f in dataclasses.fields(cls)}
    return meta[name].get("readers", cls.READERS)


def _check_read(section: str, keys: Sequence[str], algorithm: str) -> None:
    """The one rule of the method sections: every key given must be read by `algorithm`."""
    for name in keys:
        readers = _field_readers(section, name)
        if readers is not None and algorithm not in readers:
            who = ", ".join(readers[:-1]) + f" and {readers[-1]}" if len(readers) > 1 else readers[0]
            raise ConfigError(f"{section}.{name} is read by {who}, not by train.algorithm {algorithm}: remove it "
                              f"(or the whole '{section}' section) or set train.algorithm to "
                              f"{'one of them' if len(readers) > 1 else readers[0]}")


def _non_default(section: Any) -> list[str]:
    """The fields of a section set away from their defaults."""
    out = []
    for f in dataclasses.fields(section):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc,operator]
        if getattr(section, f.name) != default:
            out.append(f.name)
    return out


@dataclass
class PromptsConfig:
    train: list[str | dict[str, Any]] | str | dict[str, Any] = _f(
        ["a red square", "a blue circle"],
        "training prompts: a list, a text file (one per line), a .jsonl of {prompt, <metadata>} rows (GenEval's "
        "evaluation_metadata.jsonl), a datasets save_to_disk folder, hf:org/name[:split] or "
        "{dataset, split, column} (see mmreward.prompt_sources); in a YAML file, paths are relative to the file",
    )
    eval: list[str | dict[str, Any]] | str | dict[str, Any] | None = _f(
        None, "held-out prompts: any source prompts.train accepts (None: no evaluation)"
    )
    eval_samples_per_prompt: int = _f(1, "evaluation images per held-out prompt")

    def __post_init__(self) -> None:
        _validate_types(self, "prompts")
        _positive("prompts.eval_samples_per_prompt", self.eval_samples_per_prompt)

    def load(self, which: str) -> PromptList:
        """The prompts of `which` ("train" or "eval"), a list that also carries each prompt's metadata."""
        from mmreward.prompt_sources import load_prompts  # imports torch: not at config-parsing time

        return load_prompts(getattr(self, which), f"prompts.{which}")


# accelerate's tracker names (accelerate.utils.LoggerType), listed here so a config is checked without importing it
TRACKERS = ("tensorboard", "wandb", "comet_ml", "aim", "mlflow", "clearml", "dvclive", "swanlab", "trackio")


@dataclass
class LogConfig:
    output_dir: str = _f("runs/diffusion_rl", "where metrics.jsonl, grids, curves and checkpoints go (relative to the "
                         "current directory, also in a YAML file: outputs go where you run)")
    overwrite: bool = _f(False, "start a new run in a log.output_dir that holds an earlier run, removing that "
                         "run's files (metrics, checkpoints, grids, final/); without it such a folder is refused")
    new_run_suffix: bool = _f(False, "start a new run in the first free '<output_dir>-N' when log.output_dir "
                              "holds an earlier run")
    eval_every: int = _f(10, "iterations between evaluations (0: only at the start and end)")
    eval_at_start: bool = _f(True, "evaluate before training (the baseline; deterministic, so it can be skipped on reruns)")
    save_every: int = _f(0, "iterations between checkpoints (0: only at the end)")
    grid_every: int = _f(10, "iterations between PNG grids of training samples (0: never)")
    max_grid_images: int = _f(16, "images per grid")
    trackers: list[str] = _f([], "accelerate trackers to log to, e.g. [tensorboard, wandb] (extra: mmreward[tracking])")
    project: str = _f("diffusion_rl", "tracker project name (W&B project; TensorBoard folder under output_dir)")
    run_name: str | None = _f(None, "tracker run name (default: the tracker's own)")
    tags: list[str] = _f([], "tracker run tags (W&B)")
    tensorboard: bool = _f(False, "shorthand for adding 'tensorboard' to log.trackers")
    wandb: bool = _f(False, "shorthand for adding 'wandb' to log.trackers")
    progress: bool = _f(True, "show progress bars")
    gold_rewards: list[str] = _f([], "held-out 'gold' rewards (registry names, e.g. [shapes-eval]) scored on the evaluation "
                                 "samples at every evaluation and logged as gold/<name>, with per-prompt sample "
                                 "diversity; guard.mode watches them")

    def __post_init__(self) -> None:
        _validate_types(self, "log")
        if not self.output_dir.strip():
            raise ConfigError("log.output_dir is empty: give a folder for metrics, grids and checkpoints")
        if self.overwrite and self.new_run_suffix:
            raise ConfigError("log.overwrite and log.new_run_suffix both set: choose one")
        for name in ("eval_every", "save_every", "grid_every"):
            _positive(f"log.{name}", getattr(self, name), allow_zero=True)
        _positive("log.max_grid_images", self.max_grid_images)
        for name in self.trackers:
            _choice("log.trackers[]", name, TRACKERS)
        if not self.project.strip():
            raise ConfigError("log.project is empty: give the tracker project name, e.g. diffusion_rl")
        if any(not g.strip() for g in self.gold_rewards):
            raise ConfigError("log.gold_rewards holds an empty name; list registry reward names, e.g. [shapes-eval]")

    def all_trackers(self) -> list[str]:
        """log.trackers plus the tensorboard/wandb shorthands, each once."""
        extra = [n for n, on in (("tensorboard", self.tensorboard), ("wandb", self.wandb)) if on]
        return list(dict.fromkeys([*self.trackers, *extra]))


@dataclass
class RunConfig:
    preset: str | None = _f(None, "algorithm preset with the paper's defaults: flow_grpo, flow_grpo_fast, dance_grpo, dance_grpo_video, pref_grpo, ddpo")
    model: ModelConfig = field(default_factory=ModelConfig)
    sample: SampleConfig = field(default_factory=SampleConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    draft: DraftConfig = field(default_factory=DraftConfig)
    nft: NFTConfig = field(default_factory=NFTConfig)
    dpo: DPOConfig = field(default_factory=DPOConfig)
    prdp: PRDPConfig = field(default_factory=PRDPConfig)
    raft: RAFTConfig = field(default_factory=RAFTConfig)
    awm: AWMConfig = field(default_factory=AWMConfig)
    dgpo: DGPOConfig = field(default_factory=DGPOConfig)
    crd: CRDConfig = field(default_factory=CRDConfig)
    refl: ReFLConfig = field(default_factory=ReFLConfig)
    guard: GuardConfig = field(default_factory=GuardConfig)
    prompts: PromptsConfig = field(default_factory=PromptsConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def __post_init__(self) -> None:
        self.preset = _check_type("preset", str | None, self.preset)
        for f in dataclasses.fields(self):
            section = getattr(self, f.name)
            if f.name != "preset" and not isinstance(section, _SECTION_CLASSES[f.name]):
                raise ConfigError(f"config section '{f.name}' must be a {_SECTION_CLASSES[f.name].__name__}, "
                                  f"got {type(section).__name__}")
        algo = self.train.algorithm
        # a method section set away from its defaults for an algorithm that does not read it (from_dict also
        # refuses keys given at their default values)
        for name in METHOD_SECTIONS:
            _check_read(name, _non_default(getattr(self, name)), algo)
        offline_dpo = algo == "dpo" and self.dpo.pairs is not None  # pairs from a dataset: no groups
        grouped = ("grpo", "grpo_guard", "prdp", "pref_grpo", "nft", "dpo", "raft", "awm", "dgpo", "crd")
        if algo in grouped and self.sample.group_size < 2 and not offline_dpo:
            raise ConfigError(
                f"sample.group_size must be at least 2 for {algo} (advantages compare samples of a prompt), "
                f"got {self.sample.group_size}"
            )
        # reward backprop (draft) needs no sampling randomness: ODE and DDIM eta=0 are its usual samplers
        if self.sample.kernel == "ode" and algo not in _FORWARD_PROCESS:
            raise ConfigError("sample.kernel 'ode' has no randomness to learn from; pick flow_sde, dance_sde, cps or ddim")
        if self.sample.antithetic_noise and algo in _FORWARD_PROCESS:
            raise ConfigError(f"sample.antithetic_noise mirrors the SDE noise of likelihood rollouts (grpo, pref_grpo, "
                              f"ddpo); {algo} samples without it: remove the key")
        if self.sample.kernel == "ddim" and self.sample.noise_level == 0 and algo not in ("draft", "refl"):
            raise ConfigError("sample.noise_level (eta) must be > 0 for DDIM rollouts, e.g. 1.0 as in DDPO")
        if self.train.num_minibatches > self.sample.prompts_per_iteration:
            raise ConfigError(
                f"train.num_minibatches ({self.train.num_minibatches}) cannot exceed sample.prompts_per_iteration "
                f"({self.sample.prompts_per_iteration}): minibatches hold whole groups"
            )
        if self.sample.prompts_per_iteration % self.train.num_minibatches:
            raise ConfigError(
                f"sample.prompts_per_iteration ({self.sample.prompts_per_iteration}) must be divisible by "
                f"train.num_minibatches ({self.train.num_minibatches})"
            )
        if self.guard.mode != "off" and not self.log.gold_rewards:
            raise ConfigError(f"guard.mode={self.guard.mode!r} needs gold rewards to watch: set "
                              "log.gold_rewards, e.g. [shapes-eval], or guard.mode=off")
        if self.guard.mode != "off" and self.log.eval_every == 0:
            raise ConfigError("guard.mode watches the periodic evaluations, but log.eval_every is 0; set "
                              "log.eval_every to the iterations between evaluations, e.g. 5")
        if self.train.kl_reference == "adapter" and self.train.kl_beta > 0 and not self.model.lora:
            raise ConfigError("train.kl_reference='adapter' needs model.lora=true; use kl_reference='copy' for full fine-tuning")
        frozen_copy = self.train.kl_reference == "copy" and self.train.kl_beta > 0  # the copy dpo/prdp compare with
        if algo == "prdp" and not (self.model.lora or frozen_copy):
            raise ConfigError("train.algorithm prdp regresses reward differences from log-likelihood ratios to a "
                              "reference (its KL weight is prdp.beta): set model.lora: true (the reference is "
                              "the LoRA-free model) or, for full fine-tuning, train.kl_reference: copy with "
                              "train.kl_beta > 0 (which only keeps the frozen copy) (got lora "
                              f"{self.model.lora}, kl_reference {self.train.kl_reference}, kl_beta {self.train.kl_beta})")
        if self.sample.branching and algo in _FORWARD_PROCESS:
            raise ConfigError(f"sample.branching shapes the SDE rollouts of grpo, pref_grpo and ddpo; {algo} samples "
                              "without them: set it to false")
        if algo == "raft" and self.raft.top_k >= self.sample.group_size:
            raise ConfigError(f"raft.top_k ({self.raft.top_k}) must be below sample.group_size "
                              f"({self.sample.group_size}): keeping every sample ranks nothing")
        if 2 * self.ppo.best_worst_k > self.sample.group_size:
            raise ConfigError(f"ppo.best_worst_k ({self.ppo.best_worst_k}) keeps 2k = {2 * self.ppo.best_worst_k} "
                              f"samples of each group, more than sample.group_size ({self.sample.group_size}); "
                              f"lower it to at most {self.sample.group_size // 2} or 0 (off)")

    # -- dict round trip ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Every section except the method sections train.algorithm does not read (from_dict would refuse them)."""
        algo = self.train.algorithm
        return {k: v for k, v in dataclasses.asdict(self).items()
                if k not in METHOD_SECTIONS or algo in METHOD_SECTIONS[k].READERS}


# methods that sample without SDE likelihoods (any ODE solver) in their own rollout stage
_FORWARD_PROCESS = ("draft", "nft", "dpo", "raft", "refl", "awm", "dgpo", "crd")

_SECTION_CLASSES: dict[str, type] = {
    "model": ModelConfig, "sample": SampleConfig, "reward": RewardConfig, "advantage": AdvantageConfig,
    "train": TrainConfig, **METHOD_SECTIONS, "guard": GuardConfig, "prompts": PromptsConfig, "log": LogConfig,
}


def _merge(base: dict, update: Mapping) -> dict:
    out = dict(base)
    for k, v in update.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict) and k not in ("rewards", "options"):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def from_dict(data: Mapping[str, Any]) -> RunConfig:
    """Build a RunConfig from nested dicts (preset applied first), with errors naming unknown keys."""
    data = dict(data)
    given = data  # the user's sections, before the preset: every method key in them must be read
    preset = _check_type("preset", str | None, data.get("preset"))
    if preset is not None:
        if preset not in PRESETS:
            raise ConfigError(f"preset {preset!r} is unknown; choose one of {sorted(PRESETS)}")
        data = _merge(PRESETS[preset], data)
    unknown = set(data) - set(_SECTION_CLASSES) - {"preset"}
    if unknown:
        raise ConfigError(f"unknown config sections {sorted(unknown)}; valid: preset, {', '.join(_SECTION_CLASSES)}")
    checked = {}
    for name, cls in _SECTION_CLASSES.items():
        values = data.get(name) or {}
        if not isinstance(values, Mapping):
            raise ConfigError(f"config section '{name}' must be a mapping, got {type(values).__name__}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        bad = set(values) - set(fields)
        moved = sorted(bad & set(MOVED_TRAIN_KEYS)) if name == "train" else []
        if moved:
            where = MOVED_TRAIN_KEYS[moved[0]]
            new_section, new_key = where.split()[0].split(".")
            raise ConfigError(f"train.{moved[0]} moved to {where}: write `{new_section}: {{{new_key}: ...}}` in the "
                              f"YAML or {new_section}.{new_key}=... on the command line (`diffusion-rl config "
                              "--help-keys` lists every key)")
        if bad:
            raise ConfigError(f"unknown keys in '{name}': {sorted(bad)}; valid keys: {sorted(fields)}")
        checked[name] = values
    # the reward section last: a missing reward.rewards is reported after any mistake in the other sections
    order = [n for n in _SECTION_CLASSES if n != "reward"] + ["reward"]
    sections = {name: _SECTION_CLASSES[name](**checked[name]) for name in order}
    cfg = RunConfig(preset=preset, **sections)
    for name in METHOD_SECTIONS:
        _check_read(name, list(given.get(name) or ()), cfg.train.algorithm)
    return cfg


_YAML11_FLOAT_STRING = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{getattr(exc, 'problem', None) or type(exc).__name__}{where}"


def parse_overrides(overrides: Sequence[str]) -> dict[str, Any]:
    """['train.learning_rate=1e-4', 'sample.sde_window=[0, 4]'] -> nested dict (values parsed as YAML)."""
    out: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like section.key=value, e.g. train.learning_rate=1e-4")
        key, value = item.split("=", 1)
        parts = key.strip().split(".")
        if not all(parts):
            raise ConfigError(f"override {item!r}: the key must look like section.key, e.g. train.learning_rate")
        node = out
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r} sets a key inside {p!r}, which another override set to a value")
        try:
            parsed = safe_yaml(value)
        except yaml.YAMLError as exc:
            raise ConfigError(f"override {item!r}: the value is not valid YAML ({_yaml_problem(exc)}); "
                              "quote strings with spaces or brackets") from None
        if isinstance(parsed, str) and _YAML11_FLOAT_STRING.fullmatch(value.strip()):
            parsed = float(parsed)  # YAML 1.1 leaves 1e-4 a string; 'nan', 'inf' and names stay strings
        node[parts[-1]] = parsed
    return out


# reward options that name files or folders (checkpoints), resolved like the other inputs of a YAML file
_PATH_OPTION = re.compile(r"(checkpoint|path|dir|file)$|_(path|dir|file)$")


def _relative_to(base: Path, value: str, *, must_exist: bool) -> str:
    """`value` resolved against the YAML file's folder `base` when it is a relative path.

    Explicit relative paths ("./x", "../x") always resolve against `base`. A bare "a/b" is also a valid hub id
    ("org/name"), so it resolves against `base` only where that path exists (`must_exist`), and otherwise
    stays as written for the hub loader. Absolute paths, "~" and prefixed sources ("hf-hub:", "name:tag")
    are left alone."""
    if not value or Path(value).is_absolute() or value.startswith("~"):
        return value
    explicit = value.startswith(("./", "../")) or value in (".", "..")
    candidate = base / value
    if explicit or not must_exist or candidate.exists():
        return str(candidate.resolve())
    return value


def resolve_yaml_paths(data: dict[str, Any], base: Path) -> dict[str, Any]:
    """The inputs named in a YAML file, resolved against the file's folder `base` (a copy of `data`).

    Inputs: model.pretrained, prompts.train / prompts.eval and dpo.pairs when they are file names, and reward
    options that name a checkpoint or file. Outputs (log.output_dir, and train.resume_from, which points into an
    earlier run's output_dir) stay relative to the current directory, as do values given on the command line.
    Values of the wrong type are left for the dataclasses to report."""
    data = {k: dict(v) if isinstance(v, Mapping) else v for k, v in data.items()}
    model = data.get("model")
    if isinstance(model, dict) and isinstance(model.get("pretrained"), str):
        model["pretrained"] = _relative_to(base, model["pretrained"].strip(), must_exist=True)
    prompts = data.get("prompts")
    if isinstance(prompts, dict):
        for key in ("train", "eval"):
            # a string is a file (a list holds the prompts), unless it names a hub dataset
            if isinstance(prompts.get(key), str) and not prompts[key].startswith("hf:"):
                prompts[key] = _relative_to(base, prompts[key], must_exist=False)
    dpo = data.get("dpo")
    if isinstance(dpo, dict) and isinstance(dpo.get("pairs"), str) and not dpo["pairs"].startswith("hf:"):
        dpo["pairs"] = _relative_to(base, dpo["pairs"], must_exist=False)  # an input file, like prompts
    reward = data.get("reward")
    if isinstance(reward, dict) and isinstance(reward.get("options"), Mapping):
        options = {}
        for name, opts in reward["options"].items():
            if isinstance(opts, Mapping):
                opts = dict(opts)
                for key, value in opts.items():
                    if isinstance(key, str) and _PATH_OPTION.search(key) and isinstance(value, str):
                        prefix = "local-dir:" if value.startswith("local-dir:") else ""
                        resolved = _relative_to(base, value[len(prefix):], must_exist=not prefix)
                        opts[key] = prefix + resolved
            options[name] = opts
        reward["options"] = options
    return data


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> RunConfig:
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} does not exist")
        try:
            data = safe_yaml(p.read_text())  # bounded depth and aliases, no duplicate keys
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {str(p)!r} is not valid YAML: {_yaml_problem(exc)}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"config file {str(p)!r} cannot be read as text: {exc}") from None
        if data is None:
            raise ConfigError(f"config file {str(p)!r} is empty; it needs at least model.pretrained "
                              "(see `diffusion-rl config` for every key)")
        if not isinstance(data, dict):
            raise ConfigError(f"config file {str(p)!r}: the top level must be a mapping of sections "
                              f"(model, sample, ...), got {type(data).__name__}")
        data = resolve_yaml_paths(data, p.resolve().parent)
    return from_dict(_merge(data, parse_overrides(overrides)))


def save_config(cfg: RunConfig, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
