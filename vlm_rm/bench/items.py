"""Benchmark items and the readers that turn local copies of published files into them.

Every benchmark is a list of `BenchItem`s: an id that keys the resumable run, the candidates to
score (each a text prompt for the reward plus a media reference) and the human label. Media
references are file paths relative to the data root; images stored inline (Hugging Face parquet
image columns hold {"bytes", "path"}) are written once into a cache folder and referenced there.
"""

from __future__ import annotations

import csv
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmreward.errors import ConfigError, MissingExtraError
from mmreward.safe_parse import load_json


@dataclass(frozen=True)
class Candidate:
    """One thing the reward scores: `prompt` is the text the reward receives, `media` a file path."""

    prompt: str
    media: str


@dataclass
class BenchItem:
    id: str
    candidates: list[Candidate]
    label: Any
    category: str = "all"
    split: str = "test"
    meta: dict[str, Any] = field(default_factory=dict)


def read_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Rows of a .json (a list, or {"data": [...]}), .jsonl, .csv/.tsv or .parquet file, in file order."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"data: no file at {p}; point --data to the benchmark's annotation file")
    suffix = p.suffix.lower()
    if suffix == ".jsonl":
        with p.open(encoding="utf-8") as f:
            # duplicate keys and deep nesting refused, a bad line named (safe_parse)
            return [load_json(line, source=f"{p} line {i}", error=ConfigError)
                    for i, line in enumerate(f, 1) if line.strip()]
    if suffix == ".json":
        data = load_json(p.read_text(encoding="utf-8"), source=str(p), error=ConfigError)
        if isinstance(data, dict):
            lists = [v for v in data.values() if isinstance(v, list)]
            if len(lists) != 1:
                raise ConfigError(f"{p}: expected a JSON list of records or an object holding one list, got keys {list(data)[:5]}")
            data = lists[0]
        if not isinstance(data, list):
            raise ConfigError(f"{p}: expected a JSON list of records, got {type(data).__name__}")
        return data
    if suffix in (".csv", ".tsv"):
        with p.open(encoding="utf-8", newline="") as f:
            return list(csv.DictReader(f, delimiter="\t" if suffix == ".tsv" else ","))
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise MissingExtraError("reading .parquet benchmark files needs pyarrow: pip install pyarrow") from exc
        return pq.read_table(p).to_pylist()
    raise ConfigError(f"data: unsupported file type {suffix!r} for {p}; use .json, .jsonl, .csv, .tsv or .parquet")


def require_columns(rows: list[dict[str, Any]], columns: tuple[str, ...], benchmark: str, path: str) -> None:
    if not rows:
        raise ConfigError(f"{benchmark}: {path} holds no records")
    missing = [c for c in columns if c not in rows[0]]
    if missing:
        raise ConfigError(
            f"{benchmark}: {path} lacks the columns {missing} of the published schema; "
            f"its first record has {sorted(rows[0])[:20]}"
        )


class MediaResolver:
    """Turns a media field (relative path, absolute path, or inline image dict/bytes) into a file path."""

    def __init__(self, root: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> None:
        self.root = Path(root)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else self.root / ".vlm_rm_media"

    def __call__(self, value: Any, what: str) -> str:
        if isinstance(value, dict):
            if value.get("bytes"):
                return self._write(value["bytes"], value.get("path") or "")
            value = value.get("path")
        if isinstance(value, (bytes, bytearray)):
            return self._write(bytes(value), "")
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{what}: expected a media path or an inline image, got {type(value).__name__}")
        p = Path(value)
        return str(p if p.is_absolute() else self.root / p)

    def _write(self, data: bytes, name: str) -> str:
        suffix = Path(name).suffix or ".png"
        digest = hashlib.sha1(data).hexdigest()[:20]
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        out = self.cache_dir / f"{digest}{suffix}"
        if not out.exists():
            out.write_bytes(data)
        return str(out)


def parent_dir(path: str | os.PathLike) -> str:
    """The folder a benchmark's relative media paths are resolved against by default."""
    return str(Path(path).parent)
