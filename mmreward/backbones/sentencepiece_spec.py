"""The normaliser settings of a sentencepiece `tokenizer.model`, read without the sentencepiece package.

A fast `tokenizer.json` converted from a sentencepiece model keeps only part of sentencepiece's normaliser: InternLM2's
converter (OpenGVLab/InternVL@2410d1dbf208f0e799459aff9376e5747dbf41a2 internvl_chat/internvl/model/internlm2/
tokenization_internlm2_fast.py, `InternLM2Converter.normalizer`) writes `Prepend("▁")` when the model adds a dummy
prefix, then `Replace(" ", "▁")`; it drops the model's character map (e.g. NFKC) and its removal of extra whitespace.
Where the model does either, the fast tokenizer gives other ids than the slow sentencepiece one on some texts, so a
loader that uses tokenizer.json checks these settings when the folder also ships tokenizer.model.

The file is a protobuf `ModelProto` (sentencepiece's src/sentencepiece_model.proto): field 3 is the `NormalizerSpec`
(1 name, 2 precompiled_charsmap, 3 add_dummy_prefix, 4 remove_extra_whitespaces, 5 escape_whitespaces; the three
booleans default to true when absent). Only the wire format is parsed here: no code from the file runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from mmreward.errors import CheckpointError

_MAX_BYTES = 64 << 20  # real sentencepiece models are a few MB


@dataclass(frozen=True)
class NormalizerSpec:
    name: str = ""
    has_charsmap: bool = False
    add_dummy_prefix: bool = True
    remove_extra_whitespaces: bool = True
    escape_whitespaces: bool = True


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise ValueError("truncated varint")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def _fields(buf: bytes):
    """(field number, wire type, value) of one protobuf message: ints for varints, bytes for the rest."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 1 or wire == 5:
            size = 8 if wire == 1 else 4
            value, i = buf[i:i + size], i + size
        elif wire == 2:
            size, i = _varint(buf, i)
            value, i = buf[i:i + size], i + size
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if i > len(buf):
            raise ValueError("truncated field")
        yield number, wire, value


def parse_normalizer_spec(model: bytes) -> NormalizerSpec:
    """The NormalizerSpec of a serialized sentencepiece ModelProto (the last field 3 wins, as protobuf merges)."""
    spec: dict = {}
    for number, wire, value in _fields(model):
        if number != 3 or wire != 2:
            continue
        for n, w, v in _fields(value):
            if n == 1 and w == 2:
                spec["name"] = v.decode("utf-8")
            elif n == 2 and w == 2:
                spec["has_charsmap"] = len(v) > 0
            elif n in (3, 4, 5) and w == 0:
                spec[("add_dummy_prefix", "remove_extra_whitespaces", "escape_whitespaces")[n - 3]] = bool(v)
    return NormalizerSpec(**spec)


def read_normalizer_spec(path: str | os.PathLike) -> NormalizerSpec:
    """The NormalizerSpec of a sentencepiece model file; a file that is not one is a CheckpointError naming it."""
    p = Path(path)
    if p.stat().st_size > _MAX_BYTES:
        raise CheckpointError(f"{p} is {p.stat().st_size} bytes, too large for a sentencepiece model")
    try:
        return parse_normalizer_spec(p.read_bytes())
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{p} is not a readable sentencepiece model: {exc}") from exc
