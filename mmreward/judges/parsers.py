"""Parsers for generative judges' text. A verdict that cannot be read is NaN with a flag, never 0.5 or 0.

Accepted shapes (case-insensitive, last match wins so a restated answer overrides the reasoning):
- pairwise: '<answer>Image 1 is better</answer>', 'Video 2 is better', 'Final answer: Image 2', a bare
  '1'/'2' inside answer tags, 'tie'/'equal' (0.5, a real verdict), 'Yes'/'No' for consistency judges;
- pointwise: 'Final Score: 7.5', '<answer>4</answer>', per-dimension lines such as
  'Alignment Score (1-5): 4' or 'visual quality: 3.5'.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

NAN = float("nan")

_ANSWER_TAG = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.IGNORECASE | re.DOTALL)
_BETTER = re.compile(r"\b(image|video|response|candidate)\s*([12])\s+is\s+(?:the\s+)?better\b", re.IGNORECASE)
_FINAL_CHOICE = re.compile(r"final\s+(?:answer|verdict|choice)\s*[:：]?\s*(?:image|video)?\s*([12])\b", re.IGNORECASE)
_TIE = re.compile(r"\b(tie|equal(?:ly good)?|both are equally|no preference)\b", re.IGNORECASE)
_NUMBER = r"([-+]?\d+(?:\.\d+)?)"
_FINAL_SCORE = re.compile(r"final\s+score\s*[:：]?\s*" + _NUMBER, re.IGNORECASE)


@dataclass
class Parsed:
    value: float
    ok: bool
    reason: str = ""
    values: dict[str, float] = field(default_factory=dict)
    positions: dict[str, int] = field(default_factory=dict)  # character offset of each value read


def parse_pairwise(text: str) -> Parsed:
    """1.0 if the first candidate is better, 0.0 if the second, 0.5 for a stated tie, NaN otherwise."""
    if not isinstance(text, str) or not text.strip():
        return Parsed(NAN, False, "empty output")
    tags = _ANSWER_TAG.findall(text)
    scopes = [tags[-1]] if tags else [text]
    for scope in scopes:
        hits = _BETTER.findall(scope)
        if hits:
            return Parsed(1.0 if hits[-1][1] == "1" else 0.0, True)
        hits = _FINAL_CHOICE.findall(scope)
        if hits:
            return Parsed(1.0 if hits[-1] == "1" else 0.0, True)
        if tags and scope.strip() in ("1", "2"):
            return Parsed(1.0 if scope.strip() == "1" else 0.0, True)
        if _TIE.search(scope):
            return Parsed(0.5, True)
    return Parsed(NAN, False, "no verdict found")


def parse_yes_no(text: str) -> Parsed:
    """1.0 for an answer starting with yes, 0.0 for no (answer tags respected), NaN otherwise."""
    if not isinstance(text, str) or not text.strip():
        return Parsed(NAN, False, "empty output")
    tags = _ANSWER_TAG.findall(text)
    scope = (tags[-1] if tags else text).strip().lower()
    m = re.match(r"^\W*(yes|no)\b", scope)
    if m:
        return Parsed(1.0 if m.group(1) == "yes" else 0.0, True)
    return Parsed(NAN, False, "no yes/no answer found")


def parse_score(text: str, low: float, high: float) -> Parsed:
    """One number: 'Final Score: x', else the number inside the last answer tag. Out of range is NaN."""
    if not isinstance(text, str) or not text.strip():
        return Parsed(NAN, False, "empty output")
    hits = _FINAL_SCORE.findall(text)
    if not hits:
        tags = _ANSWER_TAG.findall(text)
        if tags:
            hits = re.findall(r"^\s*" + _NUMBER + r"\s*(?:/\s*\d+)?\s*$", tags[-1])
    if not hits:
        return Parsed(NAN, False, "no score found")
    value = float(hits[-1])
    if not low <= value <= high:
        return Parsed(NAN, False, f"score {value} outside [{low}, {high}]")
    return Parsed(value, True)


def parse_dimensions(text: str, labels: Sequence[str], low: float, high: float) -> Parsed:
    """Per-dimension lines 'Label ...: x'. The value is the mean of the dimensions; NaN if any is missing
    or out of range (the per-dimension values that were read are kept in `values`)."""
    values: dict[str, float] = {}
    positions: dict[str, int] = {}
    problems = []
    if not isinstance(text, str):
        text = ""
    for label in labels:
        pattern = re.compile(re.escape(label) + r"[^\n:：]*[:：]\s*" + _NUMBER, re.IGNORECASE)
        hits = list(pattern.finditer(text))
        if not hits:
            values[label] = NAN
            problems.append(f"'{label}' missing")
            continue
        positions[label] = hits[-1].start(1)
        v = float(hits[-1].group(1))
        if not low <= v <= high:
            values[label] = NAN
            problems.append(f"'{label}'={v} outside [{low}, {high}]")
            continue
        values[label] = v
    if problems:
        return Parsed(NAN, False, "; ".join(problems), values, positions)
    return Parsed(sum(values.values()) / len(values), True, "", values, positions)
