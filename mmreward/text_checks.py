"""Checks on user text shared by prompt files and edit records (a module below both, so neither imports the other)."""

from __future__ import annotations

from mmreward.errors import ConfigError


def check_text(text: str, where: str) -> str:
    """A prompt that can be encoded (tokenizers, HTTP judges need UTF-8): a lone surrogate is refused at read."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigError(f"{where}: the text holds a lone surrogate {text[exc.start]!r} at character {exc.start}, "
                          "which is not valid Unicode; fix the record (e.g. a pair of \\ud83d\\ude00 escapes, "
                          "not one)") from None
    return text
