"""The Reward contract: one base class, two output types.

A reward maps a batch of (prompt, image | video) pairs to a (B,) float tensor. Subclasses implement
`_score` on media that `mmreward.media` already turned into float tensors in [0, 1]; the base class
does the checking, device placement, micro-batching, inference mode and NaN policing once for all.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch

from mmreward import media as media_io
from mmreward.devices import check_device
from mmreward.errors import RewardInputError, RewardValueError
from mmreward.functional.aggregation import bradley_terry_prob

Prompts = str | Sequence[str] | None


@dataclass
class RewardOutput:
    """Scores of a batch: `scores` has shape (B,); `details` holds per-dimension (B,) tensors."""

    scores: torch.Tensor
    details: dict[str, torch.Tensor] = field(default_factory=dict)
    rationales: list[str] | None = None

    def __len__(self) -> int:
        return int(self.scores.shape[0])

    @staticmethod
    def concat(parts: Sequence[RewardOutput]) -> RewardOutput:
        scores = torch.cat([p.scores for p in parts])
        keys = parts[0].details.keys()
        details = {k: torch.cat([p.details[k] for p in parts]) for k in keys}
        rationales = None
        if any(p.rationales is not None for p in parts):
            rationales = [r for p in parts for r in (p.rationales or [""] * len(p))]
        return RewardOutput(scores, details, rationales)

    def detach(self) -> RewardOutput:
        """A copy whose tensors are ordinary (not inference-mode) tensors without autograd history."""
        return RewardOutput(
            self.scores.detach().clone(),
            {k: v.detach().clone() for k, v in self.details.items()},
            self.rationales,
        )


@dataclass
class PairwiseOutput:
    """`prob_a[i]` is P(media_a[i] is better than media_b[i] for prompts[i])."""

    prob_a: torch.Tensor
    score_a: torch.Tensor | None = None
    score_b: torch.Tensor | None = None
    details: dict[str, torch.Tensor] = field(default_factory=dict)
    rationales: list[str] | None = None

    @property
    def prob_b(self) -> torch.Tensor:
        return 1.0 - self.prob_a


def _check_encodable(prompt: str, where: str) -> None:
    """Tokenizers and HTTP judges need UTF-8; a lone surrogate (e.g. from a bad decode) cannot be encoded."""
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RewardInputError(
            f"prompts: {where} contains a lone surrogate {prompt[exc.start]!r} at character {exc.start}, which is "
            "not valid Unicode text; decode the source with errors='replace' or remove the character"
        ) from None


def normalize_prompts(prompts: Prompts, batch_size: int, required: bool = True) -> list[str]:
    """One prompt per item: a single string is broadcast, a list must match the batch exactly."""
    if prompts is None:
        if required:
            raise RewardInputError(
                "prompts: this reward needs a prompt per item, got None. Pass a string or a list of strings."
            )
        return [""] * batch_size
    if isinstance(prompts, str):
        _check_encodable(prompts, "the prompt")
        return [prompts] * batch_size
    if not isinstance(prompts, Sequence):
        raise RewardInputError(f"prompts: expected a string or a list of strings, got {type(prompts).__name__}")
    prompts = list(prompts)
    bad = [i for i, p in enumerate(prompts) if not isinstance(p, str)]
    if bad:
        raise RewardInputError(
            f"prompts: expected strings, got {type(prompts[bad[0]]).__name__} at index {bad[0]}"
        )
    if len(prompts) != batch_size:
        raise RewardInputError(
            f"prompts and media must have the same length: got {len(prompts)} prompts for {batch_size} "
            "media items. Pass one prompt per item, or a single string to use for all."
        )
    for i, p in enumerate(prompts):
        _check_encodable(p, f"prompt {i}")
    return prompts


_HALF_DTYPES = (torch.float16, torch.bfloat16)


def _inputs_to_fp32(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Forward pre-hook of a `keep_fp32` submodule: bf16/fp16 activations from the rest enter it as fp32."""

    def cast(v: Any) -> Any:
        return v.float() if isinstance(v, torch.Tensor) and v.dtype in _HALF_DTYPES else v

    return tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}


def _slot_tensor(module: torch.nn.Module, key: str) -> torch.Tensor:
    """The parameter or buffer `key` of `module` (an fp32 slot always names one of them)."""
    t: torch.Tensor | None = module._parameters.get(key)
    t = module._buffers.get(key) if t is None else t
    if t is None:
        raise KeyError(f"{type(module).__name__} has no parameter or buffer {key!r}")
    return t


class Reward(torch.nn.Module):
    """Base class of every reward.

    Subclasses set the class attributes and implement `_score(prompts, media)` where `media` is a
    float tensor in [0, 1] of shape (B, 3, H, W) (or (B, T, 3, H, W) for video), or a list of
    per-item tensors when the items differ in size (transparent RGBA images arrive as 4-channel items
    when `image_alpha` is not "drop_first"). `_score` must be batched and differentiable when
    `differentiable` is True: the base class keeps the graph only when the input requires grad.
    """

    name: ClassVar[str] = "reward"
    higher_is_better: ClassVar[bool] = True
    modalities: ClassVar[tuple[str, ...]] = ("image",)
    differentiable: ClassVar[bool] = False
    requires_prompt: ClassVar[bool] = True
    may_return_nan: ClassVar[bool] = False
    # True when `_score` takes `metadata=`: one dict per item saying what its prompt asks for (a GenEval
    # metadata row), so the reward need not parse that back out of the prompt text.
    accepts_metadata: ClassVar[bool] = False
    # True when `compare` already controls position bias (asks both orders itself): group win rates then
    # ask each pair once instead of paying for the swap twice. A subclass may make it a property.
    compare_debiased: bool = False
    compare_temperature: float = 1.0
    # The attention backend this reward's models run ('sdpa', 'xformers', 'flash', 'math'), set by
    # `mmreward.attention` when the reward is loaded; None when nothing in it runs attention.
    attention_backend: str | None = None
    # Submodules or parameters (dotted paths from the reward) that stay float32 when the reward is cast
    # to bf16/fp16, where the originals keep fp32 on GPU: logit scales (exp of a bf16 ln(100) is off by
    # 1-2%), final heads whose outputs are the scores, thresholded detectors. A kept submodule casts its
    # bf16/fp16 inputs to fp32 itself; `dtype` (the compute dtype inputs are cast to) ignores them.
    keep_fp32: ClassVar[tuple[str, ...]] = ()
    # Video rewards whose card samples by time (VideoReward: 2 frames per second) set `card_fps`; a clip
    # tensor carries no frame rate, so `clip_fps` (what the generator or caller says it made, see
    # `set_clip_fps` and `score(fps=...)`) is needed to turn one into frame indices.
    card_fps: float | None = None
    card_fps_sampling: str = "uniform"  # how `mmreward.media.sample_frame_indices` turns the rate into frames
    clip_fps: float | None = None
    # Video rewards that keep `num_frames` uniform frames of each clip (round(linspace(0, T-1, n)), see
    # `mmreward.media.uniform_clip_indices`) set a `num_frames` attribute; a video file then decodes only
    # those frames. No class default: `hasattr(reward, "num_frames")` says a reward samples by count.

    def __init__(self, *, micro_batch_size: int = 32) -> None:
        super().__init__()
        if isinstance(micro_batch_size, bool) or not isinstance(micro_batch_size, int) or micro_batch_size < 1:
            raise RewardInputError(f"micro_batch_size must be an int >= 1, got {micro_batch_size!r}")
        self.micro_batch_size = micro_batch_size

    # -- to implement -------------------------------------------------------------------------
    def _score(self, prompts: list[str], media: torch.Tensor | list[torch.Tensor]) -> RewardOutput:
        raise NotImplementedError

    # -- public API ---------------------------------------------------------------------------
    def to(self, *args: Any, **kwargs: Any) -> Reward:
        """nn.Module.to, with the device checked first so that a bad one is a DeviceError, not a torch crash."""
        if kwargs.get("device") is not None:
            kwargs["device"] = check_device(kwargs["device"])
        elif args and args[0] is not None and not isinstance(args[0], (torch.dtype, torch.Tensor)):
            args = (check_device(args[0]), *args[1:])
        return super().to(*args, **kwargs)

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> Reward:
        # Every cast (.to, .half, .bfloat16) goes through _apply. The fp32 islands get their values from
        # before the cast back: a round trip through bf16 would already have rounded them.
        slots = self._fp32_slots()
        before = {(id(m), k): _slot_tensor(m, k).data for m, k in slots}
        super()._apply(fn, recurse)
        for m, k in slots:
            t, old = m._parameters.get(k, m._buffers.get(k)), before[(id(m), k)]
            if t is None or t.dtype not in _HALF_DTYPES or old.dtype != torch.float32:
                continue
            value = old.detach().to(device=t.device)
            if k in m._parameters:
                t.data = value
                if t.grad is not None:
                    t.grad.data = t.grad.data.float()
            else:
                m._buffers[k] = value
        for target in self._fp32_targets():
            if isinstance(target, torch.nn.Module) and not getattr(target, "_mmreward_fp32_inputs", False):
                target.register_forward_pre_hook(_inputs_to_fp32, with_kwargs=True)
                setattr(target, "_mmreward_fp32_inputs", True)  # noqa: B010 - a flag on a torch Module
        return self

    def _fp32_targets(self) -> list[tuple[torch.nn.Module, str] | torch.nn.Module]:
        """What `keep_fp32` names: submodules, or (owner, name) of a parameter or buffer; paths this
        instance lacks (e.g. an optional head) are skipped."""
        out: list[tuple[torch.nn.Module, str] | torch.nn.Module] = []
        for path in self.keep_fp32:
            owner_path, _, attr = path.rpartition(".")
            try:
                owner = self.get_submodule(owner_path)
            except AttributeError:
                continue
            target = getattr(owner, attr, None)
            if isinstance(target, torch.nn.Module):
                out.append(target)
            elif isinstance(target, torch.Tensor):
                out.append((owner, attr))
        return out

    def _fp32_slots(self) -> list[tuple[torch.nn.Module, str]]:
        """(module, name) of every parameter and buffer kept in fp32."""
        out: list[tuple[torch.nn.Module, str]] = []
        for target in self._fp32_targets():
            if isinstance(target, tuple):
                out.append(target)
                continue
            for m in target.modules():
                out.extend((m, k) for k, t in [*m._parameters.items(), *m._buffers.items()] if t is not None)
        return out

    @property
    def device(self) -> torch.device:
        for t in self.parameters():
            return t.device
        for b in self.buffers():
            return b.device
        return torch.device("cpu")

    @property
    def dtype(self) -> torch.dtype:
        """The compute dtype: that of the first floating parameter outside `keep_fp32`."""
        kept = {id(m._parameters.get(k)) for m, k in self._fp32_slots()}
        for t in self.parameters():
            if t.is_floating_point() and id(t) not in kept:
                return t.dtype
        return torch.float32

    @property
    def image_alpha(self) -> str:
        """Where the original recipe drops an RGBA image's alpha (an `ImagePreprocess.alpha` convention).

        Rewards with a preprocessing card return the card's; anything but "drop_first" makes `prepare`
        keep alpha (4 channels for transparent images) so that the card can apply it."""
        return "drop_first"

    @property
    def media_alpha(self) -> Literal["drop", "keep", "keep_rgba"]:
        """The `alpha` to ask `mmreward.media.to_batch` for when loading media for this reward: "keep_rgba" for
        "white_background_if_rgba" (qwen_vl_utils' `to_rgb`: only PIL mode "RGBA" keeps alpha, LA and palette
        transparency are dropped), "drop" for "drop_first", else "keep"."""
        if self.image_alpha == "white_background_if_rgba":
            return "keep_rgba"
        return "drop" if self.image_alpha == "drop_first" else "keep"

    def prepare(self, media: Any, value_range: tuple[float, float] | None = None, *, fps: float | None = None):
        """Convert any accepted media into this reward's tensor convention and device, in float32 at least.

        A bf16/fp16 reward still gets float32 media: preprocessing (resize, mean/std) runs in fp32 as on the
        originals, and each family casts the preprocessed pixels to its compute dtype. A reward with a
        `card_fps` keeps the frames its card samples: files at their own rate, clip tensors at `fps`
        (default `clip_fps`; without either a tensor keeps every frame)."""
        modality: Any = self.modalities[0] if len(self.modalities) == 1 else "auto"
        batch = media_io.to_batch(media, modality=modality, value_range=value_range, device=self.device,
                                  alpha=self.media_alpha, **self.video_load_options(fps))
        dtype = torch.promote_types(self.dtype, torch.float32)
        if isinstance(batch, torch.Tensor):
            return batch.to(dtype)
        return [t.to(dtype) for t in batch]

    def video_load_options(self, fps: float | None = None) -> dict[str, Any]:
        """The `mmreward.media.to_batch` options that keep the frames this reward's card samples.

        By time (`card_fps`): files at their own rate, clip tensors at `fps` (default `clip_fps`). By count
        (`num_frames`): files decode only the card's uniform frames (the reward's own rule, so its later
        subsampling keeps them all), instead of every frame of a clip that may hold thousands."""
        if "video" not in self.modalities:
            return {}
        if self.card_fps is not None:
            if fps is not None and (isinstance(fps, bool) or not isinstance(fps, (int, float)) or not fps > 0):
                raise RewardInputError(f"fps must be a number > 0 (the clips' frame rate), got {fps!r}")
            return {"fps": self.card_fps, "source_fps": fps if fps is not None else self.clip_fps,
                    "sampling": self.card_fps_sampling}
        n = getattr(self, "num_frames", None)
        if isinstance(n, int) and not isinstance(n, bool) and n >= 1:
            def uniform(total: int, rate: float | None) -> list[int]:
                return media_io.uniform_clip_indices(total, n).tolist()

            return {"frame_indices": uniform}
        return {}

    def score(
        self,
        prompts: Prompts,
        media: Any,
        *,
        value_range: tuple[float, float] | None = None,
        metadata: Sequence[Mapping[str, Any]] | None = None,
        fps: float | None = None,
    ) -> RewardOutput:
        """Score a batch. `media`: paths, PIL images, numpy arrays or tensors (see `mmreward.media`).

        `metadata`: one dict per item for rewards with `accepts_metadata` (see
        `mmreward.prompt_sources.score_with_metadata`, which passes it only to those).
        `fps`: the frame rate of video tensors in `media` (default: `clip_fps`); a reward whose card samples
        by time (`card_fps`) keeps the frames its card asks for, whatever the clip's length."""
        batch = self.prepare(media, value_range, fps=fps)
        n = len(batch)
        if n == 0:
            raise RewardInputError("media: got an empty batch; pass at least one image or video")
        prompt_list = normalize_prompts(prompts, n, required=self.requires_prompt)
        meta_list = self._check_metadata(metadata, n)
        wants_grad = media_io.requires_grad(batch)
        if wants_grad and not self.differentiable:
            raise RewardInputError(
                f"media requires grad but reward '{self.name}' is not differentiable; "
                "detach the input or choose a differentiable reward (see `mmreward list`)"
            )
        with nullcontext() if wants_grad else torch.inference_mode():
            parts = []
            for start in range(0, n, self.micro_batch_size):
                stop = min(start + self.micro_batch_size, n)
                if meta_list is None:
                    part = self._score(prompt_list[start:stop], batch[start:stop])
                else:
                    # only rewards with accepts_metadata get here (_check_metadata), and their _score takes it
                    part = self._score(prompt_list[start:stop], batch[start:stop],  # type: ignore[call-arg]
                                       metadata=meta_list[start:stop])
                self._check_output(part, stop - start)
                parts.append(part)
            out = RewardOutput.concat(parts) if len(parts) > 1 else parts[0]
            out.scores = out.scores.float()
        # Inference-mode tensors cannot enter autograd later (e.g. advantages * log-probs): copy out.
        out = out if wants_grad else out.detach()
        self._check_finite(out)
        return out

    def set_clip_fps(self, fps: float | None) -> None:
        """Say at which frame rate the clips this reward (and every reward inside it) will get were made."""
        if fps is not None and (isinstance(fps, bool) or not isinstance(fps, (int, float)) or not fps > 0):
            raise RewardInputError(f"fps must be a number > 0 (or None), got {fps!r}")
        for module in self.modules():
            if isinstance(module, Reward):
                module.clip_fps = None if fps is None else float(fps)

    def compare(
        self,
        prompts: Prompts,
        media_a: Any,
        media_b: Any,
        *,
        value_range: tuple[float, float] | None = None,
    ) -> PairwiseOutput:
        """P(a better than b) per pair. Default: Bradley-Terry on score differences / `compare_temperature`."""
        a = self.prepare(media_a, value_range)
        b = self.prepare(media_b, value_range)
        if len(a) != len(b):
            raise RewardInputError(
                f"media_a and media_b must have the same length: got {len(a)} and {len(b)} items"
            )
        if len(a) == 0:
            raise RewardInputError("media_a: got an empty batch; pass at least one pair")
        prompt_list = normalize_prompts(prompts, len(a), required=self.requires_prompt)
        both = self.score(prompt_list + prompt_list, media_io.concat_batches(a, b))
        sa, sb = both.scores[: len(a)], both.scores[len(a) :]
        prob = bradley_terry_prob(sa, sb, self.compare_temperature, self.higher_is_better)
        return PairwiseOutput(prob_a=prob, score_a=sa, score_b=sb)

    def forward(self, prompts: Prompts, media: Any) -> torch.Tensor:
        return self.score(prompts, media).scores

    # -- checks -------------------------------------------------------------------------------
    def _check_metadata(self, metadata: Sequence[Mapping[str, Any]] | None, n: int) -> list[dict[str, Any]] | None:
        if metadata is None:
            return None
        if not self.accepts_metadata:
            raise RewardInputError(
                f"metadata: reward '{self.name}' does not read per-prompt metadata (accepts_metadata is False); "
                "drop it, or call mmreward.prompt_sources.score_with_metadata, which passes it only where it is read"
            )
        if isinstance(metadata, (str, Mapping)) or not isinstance(metadata, Sequence):
            raise RewardInputError(f"metadata: expected a list with one dict per item, got {type(metadata).__name__}")
        if len(metadata) != n:
            raise RewardInputError(f"metadata: got {len(metadata)} dicts for {n} media items; pass one per item")
        bad = [i for i, m in enumerate(metadata) if not isinstance(m, Mapping)]
        if bad:
            raise RewardInputError(f"metadata: expected dicts, got {type(metadata[bad[0]]).__name__} at index {bad[0]}")
        return [dict(m) for m in metadata]

    def _check_output(self, out: RewardOutput, n: int) -> None:
        if not isinstance(out, RewardOutput):
            raise TypeError(f"{type(self).__name__}._score must return RewardOutput, got {type(out).__name__}")
        if out.scores.shape != (n,):
            raise RuntimeError(
                f"{type(self).__name__}._score returned scores of shape {tuple(out.scores.shape)}, "
                f"expected ({n},)"
            )

    def _check_finite(self, out: RewardOutput) -> None:
        if self.may_return_nan:
            return
        bad = (~torch.isfinite(out.scores)).nonzero().flatten().tolist()
        if bad:
            raise RewardValueError(
                f"reward '{self.name}' produced non-finite scores at batch indices {bad[:10]}"
                f"{' ...' if len(bad) > 10 else ''}; check those inputs (blank or corrupt media?) "
                "and the checkpoint's dtype (fp16 overflow?)"
            )

    def extra_repr(self) -> str:
        return (
            f"name={self.name!r}, modalities={self.modalities}, differentiable={self.differentiable}, "
            f"higher_is_better={self.higher_is_better}"
        )


@dataclass
class RewardSpec:
    """What the registry knows about a reward without importing it: data, plus a loader to resolve on load.

    `loader` is a "module:function" string, which `mmreward.registry.resolve_loader` imports only when the
    reward is loaded (so listing rewards imports no model code), or, for rewards registered from user code,
    the callable itself.
    """

    name: str
    loader: str | Callable[..., Reward]
    description: str
    modalities: tuple[str, ...] = ("image",)
    differentiable: bool = False
    higher_is_better: bool = True
    default_checkpoint: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    requires: tuple[str, ...] = ()  # importable modules the loader needs
    extra: str | None = None  # the pip extra that installs them
    install_hint: str | None = None  # the exact install command, when an extra cannot express it
    score_range: str = ""  # the score's scale, documented for users
    preprocess: str = ""  # the reference preprocessing, in words
    needs_weights: bool = True
    # options that build a tiny random-weight instance for the conformance suite and demos
    tiny_options: dict[str, Any] = field(default_factory=dict)
    # the options a downloaded folder's mmreward.json may set, each with the kind of value it takes
    # ("value", "reward", "path", "nested"; see mmreward.registry.CARD_KINDS). Anything else in a card is
    # refused: a card must not choose endpoints, keys, code or files outside its folder.
    card_options: dict[str, str] = field(default_factory=dict)

    def missing_requirements(self) -> list[str]:
        return [m for m in self.requires if importlib.util.find_spec(m) is None]

    def install_command(self) -> str:
        return self.install_hint or f"pip install 'mmreward[{self.extra or 'all'}]'"


def response_texts(values: Any, n: int, name: str, allow_none: bool) -> list[Any]:
    """One text per item for `score_responses`: a string is broadcast, a list must match the batch."""
    if values is None:
        if allow_none:
            return [None] * n
        raise RewardInputError(f"{name}: this reward needs one string per item, got None")
    if isinstance(values, str):
        _check_encodable(values, f"the {name[:-1]}")
        return [values] * n
    if not isinstance(values, Sequence):
        raise RewardInputError(f"{name}: expected a string or a list of strings, got {type(values).__name__}")
    values = list(values)
    if len(values) != n:
        raise RewardInputError(f"{name} and media must have the same length: got {len(values)} {name} for {n} "
                               "media items; pass one per item")
    for i, v in enumerate(values):
        if v is None and allow_none:
            continue
        if not isinstance(v, str):
            raise RewardInputError(f"{name}: expected strings, got {type(v).__name__} at index {i}")
        _check_encodable(v, f"{name[:-1]} {i}")
    return values


class ResponseReward(Reward):
    """A reward for a policy's RESPONSE to a question about media (MLLM RL): (media, question, response).

    The contract is `score_responses(questions, media, responses, references=None) -> RewardOutput`:
    `questions` is what the policy was asked (a string per item, "" when there was none), `responses`
    what it answered, `references` an optional ground-truth answer per item (None where unknown).
    Subclasses implement `_score_responses` on media already turned into tensors. `score(texts, media)`
    keeps the plain Reward contract: each text is a response to no question (e.g. a caption of the
    image), so the response rewards still compose, compare and serve like any other reward.
    Trainer adapters (vlm_rm.adapters) detect `score_responses` and pass the prompt, completion and
    dataset answer to it separately instead of concatenating them into one prompt.
    """

    def _score_responses(
        self, questions: list[str], media: torch.Tensor | list[torch.Tensor], responses: list[str],
        references: list[str | None],
    ) -> RewardOutput:
        raise NotImplementedError

    def _score(self, prompts: list[str], media: torch.Tensor | list[torch.Tensor]) -> RewardOutput:
        return self._score_responses([""] * len(prompts), media, prompts, [None] * len(prompts))

    def score_responses(
        self,
        questions: Prompts,
        media: Any,
        responses: str | Sequence[str],
        references: str | Sequence[str | None] | None = None,
        *,
        value_range: tuple[float, float] | None = None,
    ) -> RewardOutput:
        """Score each response to its question about its medium (against its reference, where given)."""
        batch = self.prepare(media, value_range)
        n = len(batch)
        if n == 0:
            raise RewardInputError("media: got an empty batch; pass at least one image or video")
        question_list = [q or "" for q in response_texts(questions, n, "questions", allow_none=True)]
        response_list = response_texts(responses, n, "responses", allow_none=False)
        reference_list = response_texts(references, n, "references", allow_none=True)
        if media_io.requires_grad(batch) and not self.differentiable:
            raise RewardInputError(
                f"media requires grad but reward '{self.name}' is not differentiable; detach the input"
            )
        with torch.inference_mode():
            parts = []
            for start in range(0, n, self.micro_batch_size):
                stop = min(start + self.micro_batch_size, n)
                part = self._score_responses(question_list[start:stop], batch[start:stop],
                                             response_list[start:stop], reference_list[start:stop])
                self._check_output(part, stop - start)
                parts.append(part)
            out = RewardOutput.concat(parts) if len(parts) > 1 else parts[0]
            out.scores = out.scores.float()
        out = out.detach()
        self._check_finite(out)
        return out


def scores_responses(reward: Any) -> bool:
    """True when `reward` follows the response contract (has `score_responses`), e.g. a ResponseReward."""
    return callable(getattr(reward, "score_responses", None))
