"""Prompts with per-prompt metadata, from lists, text files, JSONL files and Hugging Face datasets.

Accepted sources (`load_prompts`):
  - a list of prompts, or of {"prompt": ..., <metadata>} dicts;
  - a text file, one prompt per line (blank lines skipped);
  - a .jsonl file of {"prompt": ..., <metadata>} rows, e.g. GenEval's evaluation_metadata.jsonl
    ({"tag", "include": [{"class", "count", "color"?, "position"?}], "prompt"});
  - edit records {"source_image": PATH, "instruction": ..., <metadata>} (JSONL rows or list items; PATH
    relative to the JSONL file): each becomes an `mmreward.edit.EditPrompt` whose metadata carries the
    resolved "source_image", which the edit rewards read (see `mmreward.edit`);
  - a Hugging Face dataset (see `mmreward.hf_datasets`): a save_to_disk folder, "hf:org/name[:split]", or
    {"dataset": ..., "split": ..., "column": "prompt"}; the other columns of a row are its metadata;
  - published data fetched at first use: {"url": ..., "sha256" | "git_blob_sha1": ...}, a pinned file (text or
    .jsonl, by the URL's suffix) downloaded into a cache and checked (see `mmreward.published_data`).

Metadata reaches the rewards that read it (`Reward.accepts_metadata`, e.g. geneval, which then takes
the clauses from the row instead of parsing the prompt) through `score_with_metadata`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mmreward.errors import ConfigError
from mmreward.safe_parse import load_json
from mmreward.text_checks import check_text  # noqa: F401 - also imported from here by callers
from mmreward.types import Reward, RewardOutput

PromptSource = str | Sequence[str | Mapping[str, Any]] | Mapping[str, Any] | None
PROMPT_COLUMNS = ("prompt", "caption", "text")  # tried in order when a dataset source names no column
_AMBIGUOUS = object()


class PromptList(list):
    """A list of prompts (usable wherever a list of strings is) that also carries one metadata dict each."""

    def __init__(self, prompts: Sequence[str] = (), metadata: Sequence[Mapping[str, Any]] | None = None) -> None:
        super().__init__(prompts)
        meta = [dict(m) for m in metadata] if metadata is not None else [{} for _ in prompts]
        if len(meta) != len(self):
            raise ValueError(f"PromptList: {len(self)} prompts but {len(meta)} metadata dicts")
        self.metadata: list[dict[str, Any]] = meta
        self._by_text: dict[str, Any] = {}
        for p, m in zip(self, meta):
            seen = self._by_text.get(p, m)
            self._by_text[p] = m if seen == m else _AMBIGUOUS

    @property
    def has_metadata(self) -> bool:
        return any(self.metadata)

    def metadata_for(self, prompts: Sequence[str]) -> list[dict[str, Any]] | None:
        """The metadata of each prompt, looked up by text; None when this list carries none."""
        if not self.has_metadata:
            return None
        out = []
        for p in prompts:
            m = self._by_text.get(p)
            if m is None:
                raise ConfigError(f"prompt {p!r} is not in this prompt list, so it has no metadata")
            if m is _AMBIGUOUS:
                raise ConfigError(f"prompt {p!r} appears more than once with different metadata; the trainer "
                                  "identifies prompts by their text, so make each prompt's text unique")
            out.append(m)
        return out


def read_utf8(path: Path, where: str) -> str:
    """A prompt file's text; bytes that are not UTF-8 are a ConfigError naming the line, not a UnicodeDecodeError."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(f"{where}: {path} line {line} is not UTF-8 text ({exc.reason} at byte {exc.start}); "
                          "re-save the file as UTF-8") from None


def _row(value: Any, where: str, base_dir: Path | None = None) -> tuple[str, dict[str, Any]]:
    from mmreward.edit import edit_row, is_edit_row

    if is_edit_row(value):  # an image edit: the instruction bound to its source image
        return edit_row(value, where, base_dir)
    if isinstance(value, str):
        return check_text(value, where), {}
    if isinstance(value, Mapping) and isinstance(value.get("prompt"), str):
        return check_text(value["prompt"], where), {k: v for k, v in value.items() if k != "prompt"}
    raise ConfigError(f"{where}: expected a prompt string or a {{\"prompt\": str, ...}} row, got {value!r}")


def _read_jsonl(path: Path, where: str) -> PromptList:
    prompts, metadata = [], []
    for lineno, line in enumerate(read_utf8(path, where).splitlines(), 1):
        if not line.strip():
            continue
        # duplicate keys, deep nesting: refused in one line, never a RecursionError (mmreward.safe_parse)
        row = load_json(line, source=f"{where}: {path}:{lineno}", error=ConfigError)
        prompt, meta = _row(row, f"{where}: {path}:{lineno}", path.parent)
        prompts.append(prompt)
        metadata.append(meta)
    return PromptList(prompts, metadata)


def _read_dataset(source, where: str) -> PromptList:
    from mmreward.hf_datasets import load_rows

    rows = load_rows(source, where)
    names = list(rows.column_names)
    column = source.column or next((c for c in PROMPT_COLUMNS if c in names), None)
    if column not in names:
        wanted = repr(source.column) if source.column else f"one of {list(PROMPT_COLUMNS)}"
        raise ConfigError(f"{where}: {source.describe()} has the columns {names}, not {wanted}; "
                          "name the prompt column with {dataset: ..., column: NAME}")
    prompts, metadata = [], []
    for i, row in enumerate(rows):
        if not isinstance(row[column], str):
            raise ConfigError(f"{where}: row {i} of {source.describe()}: column {column!r} must hold strings, "
                              f"got {type(row[column]).__name__}")
        prompts.append(row[column])
        metadata.append({k: v for k, v in row.items() if k != column})
    return PromptList(prompts, metadata)


def _read_file(path: Path, where: str) -> PromptList:
    """A .jsonl file of {"prompt", <metadata>} rows, or a text file with one prompt per line."""
    if path.suffix == ".jsonl":
        return _read_jsonl(path, where)
    return PromptList([line.strip() for line in read_utf8(path, where).splitlines() if line.strip()])


def describe_remote(source: PromptSource, where: str) -> str | None:
    """For a url source: how it resolves offline (cached, or fetched at the first run), never downloading;
    a malformed reference is a ConfigError. None for every other kind of source (load it to check it)."""
    from mmreward import published_data

    if not published_data.is_remote(source):
        return None
    remote = published_data.parse_remote(source, where)
    return published_data.describe(remote)


def load_prompts(source: PromptSource, where: str = "prompts") -> PromptList:
    """The prompts (and metadata) `source` names; `where` prefixes every error (e.g. "prompts.train")."""
    from mmreward.hf_datasets import parse_source

    if source is None:
        return PromptList()
    if isinstance(source, Mapping):
        from mmreward import published_data

        if published_data.is_remote(source):
            path = published_data.fetch(published_data.parse_remote(source, where), where)
            prompts = _read_file(path, where)
            if not prompts:
                raise ConfigError(f"{where}: {source['url']} holds no prompts")
            return prompts
        return _read_dataset(parse_source(source, where), where)
    if isinstance(source, str):
        dataset = parse_source(source, where)
        if dataset is not None:
            return _read_dataset(dataset, where)
        path = Path(source)
        if not path.is_file():
            raise ConfigError(
                f"{where}: {source!r} is not a file; pass a list of prompts, a text file (one per line), a .jsonl "
                "file of {\"prompt\": ...} rows, a save_to_disk folder, hf:org/name[:split] or {url, sha256}"
            )
        return _read_file(path, where)
    if isinstance(source, Sequence):
        rows = [_row(v, f"{where}[{i}]") for i, v in enumerate(source)]
        return PromptList([p for p, _ in rows], [m for _, m in rows])
    raise ConfigError(f"{where}: expected a list, a file, a dataset folder or a dataset mapping, got {source!r}")


def score_with_metadata(
    reward: Reward,
    prompts: Sequence[str],
    media: Any,
    metadata: PromptList | Sequence[Mapping[str, Any]] | None = None,
) -> RewardOutput:
    """`reward.score(prompts, media)`, passing per-prompt metadata to the rewards that read it.

    `metadata` is one dict per item, or the PromptList the prompts came from (looked up by text).
    Rewards without `accepts_metadata` are scored as before, so a run can mix them freely.
    """
    if isinstance(metadata, PromptList):
        metadata = metadata.metadata_for(prompts) if getattr(reward, "accepts_metadata", False) else None
    if metadata is None or not getattr(reward, "accepts_metadata", False):
        return reward.score(prompts, media)
    return reward.score(prompts, media, metadata=metadata)
