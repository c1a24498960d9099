"""Which output of a synthetic-image detector means "real": read from its label map, or stated by the user.

Published detectors name their classes freely ({0: 'artificial', 1: 'human'}, {0: 'REAL', 1: 'FAKE'},
{0: 'real', 1: 'sd', 2: 'midjourney'}, ...). A label is real-like or fake-like by its words; the map
is resolved only when that is unambiguous (exactly one real-like label, or a two-class / single-logit
head with exactly one fake-like label), otherwise the user must say which label is real.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from mmreward.errors import ConfigError

REAL_WORDS = frozenset({"real", "human", "natural", "nature", "authentic", "genuine", "camera", "photograph"})
FAKE_WORDS = frozenset({
    "fake", "ai", "aigc", "artificial", "generated", "synthetic", "deepfake", "gan", "diffusion", "machine",
    "computer", "midjourney", "dalle", "sd", "sdxl", "manipulated", "forged", "forgery",
})  # fmt: skip
NEGATIONS = frozenset({"not", "non", "no"})


def label_kind(label: str) -> str | None:
    """'real', 'fake' or None (no hint, or hints both ways) for one class name."""
    words = set(re.findall(r"[a-z0-9]+", label.lower()))
    real, fake = bool(words & REAL_WORDS), bool(words & FAKE_WORDS)
    if real and words & NEGATIONS:  # "not real", "non-human"
        real, fake = False, True
    if real == fake:
        return None
    return "real" if real else "fake"


@dataclass(frozen=True)
class RealOutput:
    """P(real) is probability `index` of the head's activation, or 1 minus it when `negate` (a fake-class logit)."""

    index: int
    negate: bool = False


def _lookup(labels: list[str], value: int | str, arg: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(f"{arg} must be a class index or label name, got {type(value).__name__}")
    if isinstance(value, int) or value.strip().isdigit():
        idx = int(value)
        if not 0 <= idx < len(labels):
            raise ConfigError(f"{arg}={value!r} is out of range: the head has {len(labels)} classes {labels}")
        return idx
    folded = [lab.lower() for lab in labels]
    if value.lower() not in folded:
        raise ConfigError(f"{arg}={value!r} is not a label of this detector; its labels are {labels}")
    return folded.index(value.lower())


def resolve_real_output(
    id2label: Mapping[int, str], *, real_label: int | str | None = None, fake_label: int | str | None = None
) -> RealOutput:
    """The output that gives P(real), from `real_label` / `fake_label` when given, else from the label names."""
    by_index = {int(k): str(v) for k, v in id2label.items()}  # config.json stores the keys as strings
    labels = [by_index[i] for i in sorted(by_index)]
    n = len(labels)
    if n == 0:
        raise ConfigError("the detector's config has an empty id2label; pass a checkpoint with a classification head")
    if real_label is not None and fake_label is not None:
        raise ConfigError("pass either real_label or fake_label, not both")
    if real_label is not None:
        return RealOutput(_lookup(labels, real_label, "real_label"))
    if fake_label is not None:
        if n > 2:
            raise ConfigError(
                f"fake_label only defines 'real' for a two-class or single-logit head; this one has {n} classes "
                f"{labels}: pass real_label=<the real class> instead"
            )
        idx = _lookup(labels, fake_label, "fake_label")
        return RealOutput(idx, negate=True) if n == 1 else RealOutput(1 - idx)
    kinds = [label_kind(lab) for lab in labels]
    reals = [i for i, k in enumerate(kinds) if k == "real"]
    fakes = [i for i, k in enumerate(kinds) if k == "fake"]
    if len(reals) == 1:
        return RealOutput(reals[0])
    if not reals and len(fakes) == 1 and n <= 2:
        return RealOutput(fakes[0], negate=True) if n == 1 else RealOutput(1 - fakes[0])
    raise ConfigError(
        f"cannot tell which class of the detector means 'real' from its label map {dict(enumerate(labels))} "
        f"(real-like: {[labels[i] for i in reals]}, fake-like: {[labels[i] for i in fakes]}). "
        "Pass real_label=<index or name> (or fake_label=... for a two-class or single-logit head)."
    )
