"""The OCR reward's matching rule (Flow-GRPO): normalised edit distance between read and target text.

reward = 1 - min(Levenshtein(read, target), len(target)) / len(target), both lowercased with spaces
removed; Flow-GRPO counts a target found verbatim inside the read text as distance 0 (extra text
around it is not penalised), which `substring_is_match` keeps as the default.
"""

from __future__ import annotations

import re

from mmreward.errors import RewardInputError

_QUOTED = re.compile(r'"([^"]*)"|“([^”]*)”')


def levenshtein(a: str, b: str) -> int:
    """Edit distance with unit insertions, deletions and substitutions (two-row dynamic programme)."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, start=1):
        current = [i]
        for j, cb in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def normalize_text(text: str) -> str:
    """Lowercase and drop all whitespace, as the OCR reward compares text."""
    return "".join(text.lower().split())


def quoted_target(prompt: str, *, fallback: str = "error") -> str:
    """The text the prompt asks to render: its first double-quoted span ("..." or “...”).

    fallback="error" raises when the prompt has no quoted span; "prompt" uses the whole prompt (as
    some video OCR rewards do).
    """
    match = _QUOTED.search(prompt)
    if match:
        return match.group(1) if match.group(1) is not None else match.group(2)
    if fallback == "prompt":
        return prompt
    raise RewardInputError(
        f"prompts: the OCR reward reads its target text from a double-quoted span, but the prompt {prompt!r} "
        "has none. Quote the text to render (e.g. 'a sign that says \"OPEN\"'), pass targets=[...] "
        "explicitly, or load the reward with target_fallback='prompt' to use the whole prompt."
    )


def ocr_match_score(read: str, target: str, *, substring_is_match: bool = True) -> float:
    """1 - min(d, len(target)) / len(target) on normalised text; 1.0 for an empty target read as empty."""
    r, t = normalize_text(read), normalize_text(target)
    if not t:
        return 1.0 if not r else 0.0
    dist = 0 if substring_is_match and t in r else levenshtein(r, t)
    return 1.0 - min(dist, len(t)) / len(t)


# -- Flow-GRPO's exact rule (yifan123/flow_grpo flow_grpo/ocr.py, OcrScorer.__call__) ---------------------
def flow_grpo_target(prompt: str) -> str:
    """`prompt.split('"')[1]`: the text after the first ASCII double quote, up to the next one (or the end).

    The original raises IndexError on a prompt without a quote and divides by zero on an empty target; both
    are a RewardInputError here."""
    parts = prompt.split('"')
    if len(parts) < 2:
        raise RewardInputError(
            f"prompts: Flow-GRPO's OCR reward takes its target from the first ASCII double-quoted span, but the "
            f"prompt {prompt!r} has no '\"'. Quote the text to render (e.g. 'a sign that says \"OPEN\"')."
        )
    if not parts[1].replace(" ", ""):
        raise RewardInputError(f"prompts: the quoted target of {prompt!r} is empty (Flow-GRPO divides by zero here)")
    return parts[1]


def flow_grpo_match_score(read: str, target: str) -> float:
    """Flow-GRPO's reward: spaces (only ' ') removed and lowercased, distance 0 when the target is contained in
    the read text, else Levenshtein; 1 - min(d, len(target)) / len(target)."""
    r, t = read.replace(" ", "").lower(), target.replace(" ", "").lower()
    if not t:
        raise RewardInputError(f"the OCR target {target!r} is empty after removing spaces")
    dist = 0 if t in r else levenshtein(r, t)
    return 1.0 - min(dist, len(t)) / len(t)
