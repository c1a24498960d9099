"""Shared core of the trainer adapters: turn (text, media) pairs into reward values.

Per-sample failures (an unreadable or truncated image, a reward error on that item, a NaN score)
cost only that sample: it gets the adapter's `failure_value`, the reason is logged as a warning
and counted in `failure_counts` (keyed by reason). Usage errors (mismatched lengths, a bad scale,
a template naming an unknown field) are typed errors raised at construction or call.
"""

from __future__ import annotations

import logging
import math
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mmreward.errors import ConfigError, MediaError, MMRewardError

logger = logging.getLogger(__name__)

TEXT_MODES = ("completion", "prompt+completion", "prompt")
TEMPLATE_FIELDS = ("prompt", "completion")
# errors charged to the one sample that raised them: our typed errors, and OSError, which PIL raises
# for corrupt or truncated image data; anything else (a bug, CUDA out of memory) still stops the run
ITEM_ERRORS: tuple[type[BaseException], ...] = (MMRewardError, OSError)
# how many samples got the failure value since the process started, per reason
failure_counts: Counter[str] = Counter()


@dataclass(frozen=True)
class ItemFailure:
    """Stands in for a sample's medium when preparing it failed; the sample gets the failure value."""

    reason: str


def record_failure(kind: str, index: int, reason: str) -> None:
    failure_counts[kind] += 1
    logger.warning("reward sample %d gets the failure value (%s: %s)", index, kind, reason)


def finite_number(value: Any, name: str, where: str) -> float:
    """`value` as a finite float, or a ConfigError naming the option (NaN would poison every reward)."""
    if isinstance(value, bool):
        raise ConfigError(f"{where}: {name} must be a number, got {value!r}")
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: {name} must be a number, got {value!r}") from None
    if not math.isfinite(out):
        raise ConfigError(f"{where}: {name} must be finite, got {value!r}")
    return out


def check_failure_value(value: Any, where: str, allow_none: bool) -> float | None:
    """A failure value the trainer tolerates: None or a float (NaN allowed) for trl, a finite float otherwise."""
    if value is None and allow_none:
        return None
    if allow_none:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: failure_value must be None or a number, got {value!r}")
        return float(value)
    return finite_number(value, "failure_value", where + " (the trainer needs a finite number for every sample)")


def check_template(template: str | None) -> None:
    """A template may use only {prompt} and {completion}; anything else is a ConfigError now, not a KeyError later."""
    if template is None:
        return
    if not isinstance(template, str):
        raise ConfigError(f"template: expected a string with {{prompt}} and/or {{completion}}, got {type(template).__name__}")
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as exc:
        raise ConfigError(f"template {template!r} is not a format string ({exc}); write braces as {{{{ and }}}}") from None
    bad = [f for f in fields if f not in TEMPLATE_FIELDS]
    if bad:
        raise ConfigError(f"template {template!r} names {bad}; it may use only {{prompt}} and {{completion}} "
                          "(write a literal brace as {{ or }})")


def message_text(value: Any) -> str:
    """Plain text of a completion/prompt: a string, or chat messages whose text parts are joined."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        content = value.get("content", "")
        if isinstance(content, str):
            return content
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type", "text") == "text")
    if isinstance(value, Sequence):
        return "\n".join(message_text(m) for m in value if not (isinstance(m, dict) and m.get("role") == "system"))
    raise ConfigError(f"expected a string or chat messages, got {type(value).__name__}")


def first_image(value: Any) -> Any:
    """A dataset image cell (PIL image, path, HF {'bytes','path'} dict, array, or a list of these) -> one medium.

    Inline bytes are decoded here, completely (`load()`), so corrupt or truncated data is this
    sample's MediaError rather than a failure of the whole batch later.
    """
    if isinstance(value, (list, tuple)):
        return first_image(value[0]) if value else None
    if isinstance(value, dict) and ("bytes" in value or "path" in value):
        if value.get("bytes"):
            import io

            from PIL import Image

            try:
                image = Image.open(io.BytesIO(value["bytes"]))
                image.load()
            except (OSError, ValueError, SyntaxError) as exc:  # PIL raises SyntaxError for some broken headers
                raise MediaError(f"inline image bytes cannot be decoded ({type(exc).__name__}: {exc})") from exc
            return image
        return value.get("path")
    return value


def prepare_media(values: Sequence[Any]) -> list[Any]:
    """first_image per sample; a sample whose cell cannot be decoded becomes an ItemFailure."""
    out: list[Any] = []
    for value in values:
        try:
            out.append(first_image(value))
        except MediaError as exc:
            out.append(ItemFailure(str(exc)))
    return out


def score_pairs(
    reward: Any,
    texts: Sequence[str],
    media: Sequence[Any],
    *,
    scale: float = 1.0,
    shift: float = 0.0,
    batch_size: int | None = None,
    failure_value: float | None = None,
    questions: Sequence[str] | None = None,
    references: Sequence[str | None] | None = None,
) -> list[float | None]:
    """scale * reward(text_i, media_i) + shift for each pair.

    A response reward (one with `score_responses`, e.g. mmreward.types.ResponseReward) gets the texts as
    responses, each with its question ("" where none is given) and reference answer (None where none is).

    None where the medium is None (no medium: the reward does not apply); `failure_value` where
    the medium is an ItemFailure, scoring that item fails, or the score is not finite. Items are
    scored in batches; a failing batch is retried item by item so one bad image costs only its item.
    """
    return [v for v, _ in score_pairs_detailed(reward, texts, media, scale=scale, shift=shift,
                                               batch_size=batch_size, failure_value=failure_value,
                                               questions=questions, references=references)]


def score_pairs_detailed(
    reward: Any,
    texts: Sequence[str],
    media: Sequence[Any],
    *,
    scale: float = 1.0,
    shift: float = 0.0,
    batch_size: int | None = None,
    failure_value: float | None = None,
    questions: Sequence[str] | None = None,
    references: Sequence[str | None] | None = None,
) -> list[tuple[float | None, dict[str, float]]]:
    """score_pairs, plus each item's per-dimension `details` (raw, unscaled; empty for a failed item)."""
    from mmreward.errors import RewardInputError
    from mmreward.types import scores_responses

    if len(texts) != len(media):
        raise RewardInputError(f"got {len(texts)} texts but {len(media)} media; pass one medium (or None) per text")
    for name, values in (("questions", questions), ("references", references)):
        if values is not None and len(values) != len(texts):
            raise RewardInputError(f"got {len(values)} {name} for {len(texts)} responses; pass one per response")
    questions = [""] * len(texts) if questions is None else list(questions)
    references = [None] * len(texts) if references is None else list(references)
    if scores_responses(reward):
        def call(idx: list[int]) -> Any:  # the response contract: question, medium, response, reference
            return reward.score_responses([questions[i] for i in idx], [media[i] for i in idx],
                                          [texts[i] for i in idx], [references[i] for i in idx])
    else:
        def call(idx: list[int]) -> Any:
            return reward.score([texts[i] for i in idx], [media[i] for i in idx])
    out: list[tuple[float | None, dict[str, float]]] = [(None, {})] * len(texts)
    for i, m in enumerate(media):
        if isinstance(m, ItemFailure):
            record_failure("unreadable media", i, m.reason)
            out[i] = (failure_value, {})
    todo = [i for i, m in enumerate(media) if m is not None and not isinstance(m, ItemFailure)]
    step = batch_size or max(len(todo), 1)
    for start in range(0, len(todo), step):
        idx = todo[start : start + step]
        scored: list[tuple[float, dict[str, float]] | None]
        try:
            scored = _rows(call(idx))
        except ITEM_ERRORS as exc:
            logger.warning("reward batch failed (%s); scoring its %d items one by one", exc, len(idx))
            scored = []
            for i in idx:
                try:
                    scored.append(_rows(call([i]))[0])
                except ITEM_ERRORS as item_exc:
                    record_failure("reward error", i, f"{type(item_exc).__name__}: {item_exc}")
                    scored.append(None)
        for i, row in zip(idx, scored):
            if row is None:
                out[i] = (failure_value, {})
            elif not math.isfinite(row[0]):
                record_failure("non-finite score", i, f"the reward returned {row[0]}")
                out[i] = (failure_value, {})
            else:
                out[i] = (float(scale * row[0] + shift), row[1])
    return out


def _rows(output: Any) -> list[tuple[float, dict[str, float]]]:
    """A RewardOutput as one (score, {detail: value}) row per item; details that are not (B,) are skipped."""
    scores = [float(s) for s in output.scores.reshape(-1).tolist()]
    details: dict[str, list[float]] = {}
    for key, value in (getattr(output, "details", None) or {}).items():
        if hasattr(value, "reshape") and value.numel() == len(scores):
            details[key] = [float(v) for v in value.reshape(-1).tolist()]
    return [(s, {k: v[i] for k, v in details.items()}) for i, s in enumerate(scores)]


def response_fields(*fields: Any) -> tuple[str, str | None]:
    """(question, reference answer) of a sample for a response reward, from the first of `fields` (dicts or
    JSON strings such as a media reference) that has them: "question"/"problem", "answer"/"ground_truth".
    A plain string field is the reference itself (verl's and EasyR1's ground_truth)."""
    import json

    from vlm_rm.adapters.media_refs import MEDIA_KEY, parse_media_ref

    question, reference = "", None
    for value in fields:
        if isinstance(value, str) and value.strip().startswith("{") and MEDIA_KEY in value:
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                pass
        if isinstance(value, dict):
            question = question or next((str(value[k]) for k in ("question", "problem") if value.get(k)), "")
            if reference is None:
                reference = next((str(value[k]) for k in ("answer", "ground_truth") if value.get(k) is not None), None)
        elif isinstance(value, str) and reference is None and parse_media_ref(value) is None:
            reference = value
    return question, reference


def compose_text(mode: str, prompt: Any, completion: Any, template: str | None) -> str:
    if mode not in TEXT_MODES:
        raise ConfigError(f"text: expected one of {TEXT_MODES}, got {mode!r}")
    p = message_text(prompt) if prompt is not None else ""
    c = message_text(completion) if completion is not None else ""
    if template is not None:
        return template.format(prompt=p, completion=c)
    return {"completion": c, "prompt": p, "prompt+completion": f"{p}\n{c}".strip()}[mode]
