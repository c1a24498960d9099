"""One attention choice for every model we build or load: reward families, diffusers pipelines, the trainer.

Choices (the `attention=` load option, the `model.attention` config key, the `--attention` CLI flags):

- `auto`: xformers' memory-efficient attention on CUDA when xformers is installed and a probe call works,
  otherwise PyTorch's scaled_dot_product_attention (SDPA), which runs everywhere.
- `sdpa`: PyTorch SDPA (it picks its fused kernel itself).
- `xformers`: `xformers.ops.memory_efficient_attention` (CUDA, `pip install 'mmreward[xformers]'`).
- `flash`: FlashAttention-2 (CUDA, fp16/bf16, the flash-attn package).
- `math`: the explicit softmax(QK^T)V reference path (HF "eager", diffusers `AttnProcessor`, SDPA pinned
  to its math kernel elsewhere); slow, for checking the fused paths. `eager` is accepted as its alias.

An explicit choice that cannot work here raises a ConfigError instead of silently falling back.

`apply_attention(model, choice)` configures every attention-running module under `model`, by mechanism:
transformers models get `set_attn_implementation` (xformers through a function registered in transformers'
AttentionInterface that calls `attend`); diffusers models get attention processors
(`set_attn_processor`, `enable_xformers_memory_efficient_attention`, `set_attention_backend`);
`torch.nn.MultiheadAttention` (open_clip) and our own modules (ImageReward's BLIP) run `attend`.
`attention_backends(model)` reports, per attention module, which backend it runs.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from contextlib import nullcontext
from functools import lru_cache
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from mmreward.errors import ConfigError

Backend = Literal["auto", "sdpa", "xformers", "flash", "math", "eager"]
CHOICES = ("auto", "sdpa", "xformers", "flash", "math")
BACKENDS = (*CHOICES, "eager")  # "eager": the transformers name of the math path
RESOLVED = ("sdpa", "xformers", "flash", "math")
logger = logging.getLogger(__name__)

# transformers attn_implementation per resolved backend ("mmreward_xformers" is registered on first use)
_HF_IMPL = {"sdpa": "sdpa", "math": "eager", "flash": "flash_attention_2", "xformers": "mmreward_xformers"}
_HF_BACKEND = {v: k for k, v in _HF_IMPL.items()}


# ----------------------------------------------------------------------------------------------
# selection
# ----------------------------------------------------------------------------------------------
def xformers_installed() -> bool:
    return importlib.util.find_spec("xformers") is not None


def flash_attn_installed() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


@lru_cache(maxsize=8)
def xformers_works(device_type: str) -> bool:
    """True when xformers is installed and a tiny memory-efficient attention call runs on this device."""
    if device_type != "cuda" or not torch.cuda.is_available() or not xformers_installed():
        return False
    try:
        import xformers.ops as xops

        q = torch.randn(1, 4, 1, 8, device="cuda", dtype=torch.float16)
        xops.memory_efficient_attention(q, q, q)
        return True
    except Exception as exc:  # noqa: BLE001 - a broken build raises anything from ImportError to CUDA errors
        logger.warning("xformers is installed but does not work here (%s); using PyTorch SDPA", exc)
        return False


@lru_cache(maxsize=8)
def flash_attn_works(device_type: str) -> bool:
    """True when flash-attn is installed and a tiny fp16 call runs on this device (it needs Ampere or newer)."""
    if device_type != "cuda" or not torch.cuda.is_available() or not flash_attn_installed():
        return False
    try:
        from flash_attn import flash_attn_func

        q = torch.randn(1, 4, 1, 64, device="cuda", dtype=torch.float16)
        flash_attn_func(q, q, q)
        return True
    except Exception as exc:  # noqa: BLE001 - as above
        logger.warning("flash-attn is installed but does not work here (%s)", exc)
        return False


def check_choice(requested: Any, what: str = "attention") -> str:
    """The choice as a canonical name ('eager' -> 'math'); anything else is a ConfigError."""
    if requested not in BACKENDS:
        raise ConfigError(f"{what} must be one of {list(CHOICES)}, got {requested!r}")
    return "math" if requested == "eager" else requested


def select_attention_backend(
    requested: Backend = "auto", device: torch.device | str = "cpu", dtype: torch.dtype | None = None
) -> str:
    """Resolve a requested choice to one that works on `device`: 'xformers', 'flash', 'sdpa' or 'math'."""
    requested = check_choice(requested)
    device_type = torch.device(device).type
    if requested == "auto":
        return "xformers" if xformers_works(device_type) else "sdpa"
    if requested in ("xformers", "flash"):
        if device_type != "cuda":
            raise ConfigError(
                f"attention='{requested}' needs a CUDA device, but the model is on '{device_type}'; "
                "use attention='auto' or 'sdpa'"
            )
    if requested == "xformers":
        if not xformers_installed():
            raise ConfigError("attention='xformers' but xformers is not installed: pip install 'mmreward[xformers]'")
        if not xformers_works(device_type):
            raise ConfigError("attention='xformers' but xformers fails on this GPU; use attention='sdpa'")
    if requested == "flash":
        if dtype is not None and dtype not in (torch.float16, torch.bfloat16):
            raise ConfigError(
                f"attention='flash' needs float16 or bfloat16 weights, got {dtype}; load with dtype='bfloat16' "
                "or use attention='sdpa'"
            )
        if not flash_attn_installed():
            raise ConfigError("attention='flash' but flash-attn is not installed: pip install flash-attn "
                              "--no-build-isolation (or use attention='sdpa')")
        if not flash_attn_works(device_type):
            raise ConfigError("attention='flash' but flash-attn fails on this GPU (it needs Ampere or newer); "
                              "use attention='sdpa'")
    return requested


def transformers_attn_implementation(backend: str) -> str:
    """The transformers `attn_implementation` that runs a resolved backend."""
    backend = check_choice(backend)
    if backend == "xformers":
        _register_transformers_xformers()
    return _HF_IMPL[backend]


# ----------------------------------------------------------------------------------------------
# the one attention function of our own modules
# ----------------------------------------------------------------------------------------------
def _sdpa_kernels(backend: str):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if backend == "math":
        return sdpa_kernel([SDPBackend.MATH])
    if backend == "flash":
        # masked calls: flash kernels take no mask, the memory-efficient one does
        return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION])
    if backend == "xformers":
        # only for modules that call SDPA themselves (see _DIRECT_SDPA): PyTorch's memory-efficient kernel is
        # xformers' own (cutlass) kernel, the closest a direct SDPA call can get
        return sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION])
    return nullcontext()


# Modules that call torch's scaled_dot_product_attention in their own forward (no processor to swap): the choice
# reaches them by pinning SDPA's kernel around that forward. Wan's VAE mid-block attention is one.
_DIRECT_SDPA = ("WanAttentionBlock",)


def _scope_direct_sdpa(module: nn.Module, backend: str) -> None:
    cls = type(module)
    if not getattr(cls, "_mmreward_scoped", False):
        inner_forward = cls.forward

        def forward(self, *args, **kwargs):
            with _sdpa_kernels(self.attn_backend):
                return inner_forward(self, *args, **kwargs)

        # a subclass of the same name, so parameters, state-dict keys and isinstance checks are unchanged
        module.__class__ = type(cls.__name__, (cls,), {"forward": forward, "_mmreward_scoped": True,
                                                       "attn_backend": "sdpa"})
    module.attn_backend = backend


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    backend: str = "sdpa",
    *,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    """softmax(q k^T * scale + mask) v for (B, H, L, D) tensors, by the resolved `backend`.

    `attn_mask` follows SDPA: boolean (True = attend) or additive, broadcastable to (B, H, Lq, Lk)."""
    if backend == "xformers":
        import xformers.ops as xops

        bias = None
        if attn_mask is not None:
            bias = attn_mask if attn_mask.dtype != torch.bool else torch.zeros(
                attn_mask.shape, dtype=q.dtype, device=q.device).masked_fill(~attn_mask, float("-inf"))
            # xformers wants a dense (B, H, Lq, Lk) bias
            bias = bias.to(q.dtype).expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        elif is_causal:
            bias = xops.LowerTriangularMask()
        out = xops.memory_efficient_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_bias=bias, p=dropout_p, scale=scale)
        return out.transpose(1, 2)
    if backend == "flash" and attn_mask is None:
        from flash_attn import flash_attn_func

        out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), dropout_p=dropout_p,
                              softmax_scale=scale, causal=is_causal)
        return out.transpose(1, 2)
    if backend not in RESOLVED:
        raise ConfigError(f"unknown resolved attention backend {backend!r}; expected one of {list(RESOLVED)}")
    with _sdpa_kernels(backend):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                                              is_causal=is_causal, scale=scale)


def _hf_xformers_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                           is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract (q/k/v (B, H, L, D) -> (B, L, H, D)) over `attend`."""
    groups = query.shape[1] // key.shape[1]
    if groups > 1:  # grouped-query attention: one key/value head per group of query heads
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    if is_causal is None:
        is_causal = getattr(module, "is_causal", False)
    # as transformers' SDPA path: an explicit mask already holds causality; one query token needs none
    is_causal = bool(is_causal) and attention_mask is None and query.shape[2] > 1
    out = attend(query, key, value, attention_mask, "xformers", dropout_p=dropout if module.training else 0.0,
                 is_causal=is_causal, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


@lru_cache(maxsize=1)
def _register_transformers_xformers() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register("mmreward_xformers", _hf_xformers_attention)
    AttentionMaskInterface.register("mmreward_xformers", sdpa_mask)  # same mask convention as SDPA


class DispatchMultiheadAttention(nn.MultiheadAttention):
    """`nn.MultiheadAttention` (open_clip's towers) whose attention runs `attend` with `attn_backend`.

    Installed by swapping the class of an existing module, so parameters and state-dict keys are unchanged."""

    attn_backend: str = "sdpa"

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        if need_weights or not self._qkv_same_embed_dim or self.bias_k is not None or self.add_zero_attn:
            # attention weights asked for, or a layout open_clip does not use: torch's own (explicit) path
            return super().forward(query, key, value, key_padding_mask, need_weights, attn_mask,
                                   average_attn_weights, is_causal)
        if not self.batch_first:
            query, key, value = (x.transpose(0, 1) for x in (query, key, value))
        b, lq, e = query.shape
        lk, h = key.shape[1], self.num_heads
        w_q, w_k, w_v = self.in_proj_weight.chunk(3)
        b_q, b_k, b_v = self.in_proj_bias.chunk(3) if self.in_proj_bias is not None else (None, None, None)

        def heads(x: torch.Tensor, n: int) -> torch.Tensor:
            return x.view(b, n, h, e // h).transpose(1, 2)

        q, k, v = heads(F.linear(query, w_q, b_q), lq), heads(F.linear(key, w_k, b_k), lk), heads(
            F.linear(value, w_v, b_v), lk)
        mask = _merge_masks(attn_mask, key_padding_mask, b, h, lq, lk, q.dtype)
        out = attend(q, k, v, mask, self.attn_backend, dropout_p=self.dropout if self.training else 0.0,
                     is_causal=is_causal and mask is None)
        out = self.out_proj(out.transpose(1, 2).reshape(b, lq, e))
        return (out if self.batch_first else out.transpose(0, 1)), None


def _merge_masks(attn_mask, key_padding_mask, b, h, lq, lk, dtype) -> torch.Tensor | None:
    """nn.MultiheadAttention's masks (True = masked out, or additive) as one additive (B, H, Lq, Lk) mask."""
    def additive(m: torch.Tensor) -> torch.Tensor:
        if m.dtype == torch.bool:
            return torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill(m, float("-inf"))
        return m.to(dtype)

    mask = None
    if attn_mask is not None:
        mask = additive(attn_mask)
        mask = mask.view(1, 1, lq, lk) if mask.dim() == 2 else mask.view(b, h, lq, lk)
    if key_padding_mask is not None:
        pad = additive(key_padding_mask).view(b, 1, 1, lk)
        mask = pad if mask is None else mask + pad
    return mask


# ----------------------------------------------------------------------------------------------
# configuring models
# ----------------------------------------------------------------------------------------------
class KernelScopedProcessor:
    """A diffusers SDPA processor run with SDPA pinned to one kernel family (math or flash).

    For processors that call `F.scaled_dot_product_attention` directly and have no math/flash sibling
    (SD3's JointAttnProcessor2_0); `inner` does the work, this only scopes the kernel choice."""

    def __init__(self, inner: Any, backend: str) -> None:
        self.inner, self.backend = inner, backend

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, *args,
                 image_rotary_emb=None, **kwargs):
        # diffusers' Attention passes only the keyword arguments the processor's signature names, so CogVideoX's
        # rotary embeddings must be named here to reach the inner processor
        if image_rotary_emb is not None:
            kwargs["image_rotary_emb"] = image_rotary_emb
        with _sdpa_kernels(self.backend):
            return self.inner(attn, hidden_states, encoder_hidden_states, attention_mask, *args, **kwargs)


_CLASSIC = {"AttnProcessor": "math", "AttnProcessor2_0": "sdpa", "XFormersAttnProcessor": "xformers"}
_JOINT = {"JointAttnProcessor2_0": "sdpa", "XFormersJointAttnProcessor": "xformers",
          # CogVideoX's joint text+video attention also calls SDPA itself (math/flash: scoped like SD3's)
          "CogVideoXAttnProcessor2_0": "sdpa", "FusedCogVideoXAttnProcessor2_0": "sdpa"}
_DISPATCH_NAME = {"sdpa": "native", "math": "_native_math", "flash": "flash", "xformers": "xformers"}
# models whose classic attention modules get 4-D boolean masks that the legacy math AttnProcessor cannot take
# (HunyuanVideo's token refiner): their "math" is SDPA pinned to the math kernel, the same computation
_SDPA_MASK_MODELS = {"HunyuanVideoTransformer3DModel"}


def _processor_backend(proc: Any) -> str:
    """Which backend a diffusers attention processor runs ('unknown:<class>' when we cannot tell)."""
    if isinstance(proc, KernelScopedProcessor):
        return proc.backend
    name = type(proc).__name__
    if name in _CLASSIC:
        return _CLASSIC[name]
    if name in _JOINT:
        return _JOINT[name]
    if hasattr(proc, "_attention_backend"):
        from diffusers.models.attention_dispatch import _AttentionBackendRegistry

        chosen = proc._attention_backend or _AttentionBackendRegistry.get_active_backend()[0]
        value = getattr(chosen, "value", chosen)
        return {v: k for k, v in _DISPATCH_NAME.items()}.get(value, f"unknown:{value}")
    return f"unknown:{name}"


def apply_to_diffusers(model: nn.Module, backend: str) -> None:
    """Set every attention processor of a diffusers model (UNet, transformer, VAE) to `backend`."""
    backend = check_choice(backend)
    if backend not in RESOLVED:
        raise ConfigError(f"apply_to_diffusers needs a resolved backend {list(RESOLVED)}, got {backend!r}")
    if backend == "xformers":
        # diffusers' own switch covers classic, joint (SD3) and dispatcher (FLUX) processors
        model.enable_xformers_memory_efficient_attention()
        return
    from diffusers.models.attention import AttentionModuleMixin
    from diffusers.models.attention_processor import Attention, AttnProcessor, AttnProcessor2_0

    for module in model.modules():
        if not isinstance(module, (Attention, AttentionModuleMixin)) or module.processor is None:
            continue
        proc = module.processor
        inner = proc.inner if isinstance(proc, KernelScopedProcessor) else proc
        name = type(inner).__name__
        if hasattr(inner, "_attention_backend") and name not in _CLASSIC and name not in _JOINT:
            if hasattr(module, "set_attention_backend"):
                module.set_attention_backend(_DISPATCH_NAME[backend])  # per module: no global default changed
            else:  # a legacy `Attention` with a dispatcher processor (HunyuanVideo): what that method does
                from diffusers.models.attention_dispatch import AttentionBackendName

                inner._attention_backend = AttentionBackendName(_DISPATCH_NAME[backend])
            continue
        if name in _CLASSIC:
            inner = AttnProcessor2_0()
            if backend == "math" and type(model).__name__ not in _SDPA_MASK_MODELS:
                module.set_processor(AttnProcessor())
                continue
        elif name == "XFormersJointAttnProcessor":
            from diffusers.models.attention_processor import JointAttnProcessor2_0

            inner = JointAttnProcessor2_0()
        elif name not in _JOINT:
            raise ConfigError(
                f"attention: the diffusers processor {name} of {type(model).__name__} has no '{backend}' "
                "variant mmreward knows; use attention='sdpa' or open an issue naming the model"
            )
        module.set_processor(inner if backend == "sdpa" else KernelScopedProcessor(inner, backend))


def _is_hf_model(module: nn.Module) -> bool:
    try:
        from transformers import PreTrainedModel
    except ImportError:
        return False
    return isinstance(module, PreTrainedModel)


def _is_diffusers_model(module: nn.Module) -> bool:
    try:
        from diffusers import ModelMixin
    except ImportError:
        return False
    return isinstance(module, ModelMixin)


def _outermost(root: nn.Module, pred) -> list[tuple[str, nn.Module]]:
    """(name, module) for modules matching `pred` that are not inside another match."""
    found: list[tuple[str, nn.Module]] = []
    for name, module in root.named_modules():
        if pred(module) and not any(name.startswith(p + ".") or p == "" for p, _ in found):
            found.append((name, module))
    return found


def apply_attention(model: nn.Module, backend: str) -> str:
    """Configure every attention-running module under `model` for the resolved `backend`; return it.

    Resolve the user's choice first with `select_attention_backend` (it needs the device and dtype)."""
    backend = check_choice(backend)
    if backend not in RESOLVED:
        raise ConfigError(f"apply_attention needs a resolved backend {list(RESOLVED)}, got {backend!r}; "
                          "call select_attention_backend first")
    for name, hf in _outermost(model, _is_hf_model):
        impl = transformers_attn_implementation(backend)
        try:
            hf.set_attn_implementation(impl)
        except (ValueError, ImportError) as exc:
            raise ConfigError(f"attention='{backend}': {type(hf).__name__} ({name or 'the model'}) cannot use "
                              f"attn_implementation={impl!r} ({str(exc).splitlines()[0]}); use attention='sdpa'") from exc
    for _, dm in _outermost(model, _is_diffusers_model):
        apply_to_diffusers(dm, backend)
    try:
        from open_clip.transformer import Attention as OpenClipAttention
    except ImportError:  # open_clip is optional
        OpenClipAttention = ()  # noqa: N806 - an empty isinstance tuple
    for name, module in model.named_modules():
        if isinstance(module, nn.MultiheadAttention):
            if type(module) is nn.MultiheadAttention:
                module.__class__ = DispatchMultiheadAttention
            module.attn_backend = backend
        elif OpenClipAttention and isinstance(module, OpenClipAttention):
            if backend not in ("sdpa", "math"):
                raise ConfigError(f"attention='{backend}': open_clip's custom Attention ({name}) only has SDPA and "
                                  "explicit paths; use attention='sdpa'")
            module.use_fsdpa = backend == "sdpa"
        elif type(module).__name__ in _DIRECT_SDPA:
            _scope_direct_sdpa(module, backend)
        elif hasattr(type(module), "attn_backend"):
            module.attn_backend = backend
    _record(model)
    return backend


def _record(model: nn.Module) -> None:
    """Store the summary on every Reward in the tree, so that each (nested ones included) reports it."""
    from mmreward.types import Reward

    for module in model.modules():
        if isinstance(module, Reward):
            module.attention_backend = summarize(attention_backends(module))


def attention_backends(model: nn.Module) -> dict[str, str]:
    """{module path: backend it runs} for every attention-running module under `model`.

    Attention modules: diffusers attention modules (by processor), transformers attention layers (by their
    config's attn_implementation), nn.MultiheadAttention (plain ones run torch's SDPA and ignore any choice:
    'unconfigured'), open_clip's Attention, and modules with an `attn_backend` (ours)."""
    out: dict[str, str] = {}
    # a model holding a diffusers or open_clip module has imported that library: only then are its attention
    # types looked up (importing them for a JPEG-size reward cost ~3 s of diffusers + open_clip start-up)
    diffusers_types: tuple[type, ...] = ()
    if "diffusers" in sys.modules:
        try:
            from diffusers.models.attention import AttentionModuleMixin
            from diffusers.models.attention_processor import Attention as DiffusersAttention
            diffusers_types = (DiffusersAttention, AttentionModuleMixin)
        except ImportError:
            pass
    OpenClipAttention: Any = ()  # noqa: N806 - an empty isinstance tuple unless open_clip is in use
    if "open_clip" in sys.modules:
        try:
            from open_clip.transformer import Attention as OpenClipAttention
        except ImportError:
            pass
    for name, module in model.named_modules():
        if diffusers_types and isinstance(module, diffusers_types):
            out[name] = _processor_backend(module.processor)
        elif isinstance(module, DispatchMultiheadAttention):
            out[name] = module.attn_backend
        elif isinstance(module, nn.MultiheadAttention):
            out[name] = "unconfigured"
        elif OpenClipAttention and isinstance(module, OpenClipAttention):
            out[name] = "sdpa" if module.use_fsdpa else "math"
        elif hasattr(type(module), "attn_backend"):
            out[name] = module.attn_backend
        elif type(module).__name__ in _DIRECT_SDPA:
            out[name] = "unconfigured"  # calls SDPA itself and runs whatever kernel torch picks
        elif type(module).__name__.endswith("Attention") and hasattr(getattr(module, "config", None),
                                                                     "_attn_implementation"):
            impl = module.config._attn_implementation
            out[name] = _HF_BACKEND.get(impl, f"unknown:{impl}")
    return out


def summarize(report: dict[str, str]) -> str | None:
    """The one backend of a report, None when nothing runs attention, 'mixed(a,b)' otherwise."""
    kinds = sorted(set(report.values()))
    if not kinds:
        return None
    return kinds[0] if len(kinds) == 1 else f"mixed({','.join(kinds)})"


def configure(model: nn.Module, choice: str = "auto", device: torch.device | str | None = None,
              dtype: torch.dtype | None = None) -> str | None:
    """Resolve `choice` for the model's device/dtype (taken from its parameters when not given) and apply it.

    Returns the backend, or None when nothing under `model` runs attention (the choice is then only checked:
    'xformers' for a JPEG-size reward on CPU is not an error, there is nothing for it to run)."""
    choice = check_choice(choice)
    if not attention_backends(model):
        _record(model)
        return None
    params = next(iter(model.parameters()), None)
    device = device if device is not None else (params.device if params is not None else "cpu")
    dtype = dtype if dtype is not None else (params.dtype if params is not None else None)
    return apply_attention(model, select_attention_backend(choice, device, dtype))


def apply_to_pipeline(pipe: Any, choice: str = "auto", device: torch.device | str | None = None) -> str:
    """Configure every model component of a diffusers pipeline (denoiser, VAE, text encoders); return the backend."""
    modules = {k: v for k, v in pipe.components.items() if isinstance(v, nn.Module)}
    denoiser = modules.get("transformer", modules.get("unet"))
    ref = denoiser if denoiser is not None else next(iter(modules.values()), None)
    params = next(iter(ref.parameters()), None) if ref is not None else None
    device = device if device is not None else (params.device if params is not None else "cpu")
    dtype = params.dtype if params is not None else None
    backend = select_attention_backend(check_choice(choice), device, dtype)
    for module in modules.values():
        apply_attention(module, backend)
    return backend


def pipeline_attention_backends(pipe: Any) -> dict[str, str]:
    """`attention_backends` over every model component of a pipeline, keyed 'component.path'."""
    return {f"{k}.{n}" if n else k: b for k, v in pipe.components.items() if isinstance(v, nn.Module)
            for n, b in attention_backends(v).items()}
