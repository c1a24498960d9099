"""Image-editing prompts: an instruction plus the source image it applies to.

An *edit record* is a row {"source_image": PATH, "instruction": TEXT, <metadata>} (a JSONL line, or a dict in
a config's prompt list); PATH is relative to the JSONL file (to the working directory for inline rows). A
multi-image edit (QwenImageEditPlusPipeline) gives {"source_images": [PATH, ...]} instead: its EditPrompt's
`sources` holds every path in order and `source` the first, which is what the metadata's "source_image" and the
edit rewards see; the metadata's "source_images" lists them all.
`mmreward.prompt_sources.load_prompts` turns each record into an `EditPrompt`: a string equal in text to the
instruction, so rewards and logs see the instruction, that also carries its source image. Two records with
the same instruction on different sources are different prompts (equality and hashing include the source),
so the trainer's per-prompt caches (prompt embeddings, which for an edit pipeline include the source
image's latents) and the metadata lookup by prompt keep them apart.

Rewards receive the source image in the metadata: every edit record's metadata holds "source_image" (the
resolved path); `source_images` turns a batch of metadata dicts into (B, 3, H, W) tensors for the edit
rewards (`editreward`, `editscore`, `shapes-edit-eval`), which also accept tensors there when called
directly.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import torch

from mmreward.errors import ConfigError, RewardInputError

SOURCE_KEY = "source_image"
SOURCES_KEY = "source_images"  # a multi-image edit record: a list of paths (the first is the primary source)
# the registered rewards that score an edit against its source (metadata required); the generic test suites,
# which score media alone, drive them with the sources bound (tests/mmreward/test_edit_rewards.py)
SCORED_WITH_SOURCES = frozenset({"editreward", "editscore", "shapes-edit-eval"})
EDIT_FAMILIES = frozenset({"flux_kontext", "qwen_image_edit", "qwen_image_edit_plus"})  # diffusion_rl's instruction-editing pipelines
INSTRUCTION_KEYS = ("instruction", "prompt")  # the text of an edit record, under one of these names


class EditPrompt(str):
    """An edit instruction (the string's text) bound to its source image (`source`, a path); a multi-image edit
    also carries the others: `sources` is every path in order, `source` the first."""

    source: str
    sources: tuple[str, ...]

    def __new__(cls, instruction: str, source: str | os.PathLike,
                sources: Sequence[str | os.PathLike] | None = None) -> EditPrompt:
        obj = super().__new__(cls, instruction)
        obj.source = os.fspath(source)
        obj.sources = tuple(os.fspath(s) for s in sources) if sources else (obj.source,)
        if obj.sources[0] != obj.source:
            raise ValueError(f"EditPrompt: sources[0] must be the source {obj.source!r}, got {obj.sources[0]!r}")
        return obj

    @property
    def instruction(self) -> str:
        return str.__str__(self)

    def __eq__(self, other: object) -> bool:
        # an edit prompt is its (instruction, source) pair: equal text on another source is another prompt
        if isinstance(other, EditPrompt):
            return str.__eq__(self, other) and self.sources == other.sources
        return False

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        # one source hashes as before (caches keyed on single-source prompts are unchanged)
        return hash((str.__str__(self), self.source) if len(self.sources) == 1 else (str.__str__(self), self.sources))

    def __repr__(self) -> str:
        if len(self.sources) > 1:
            return f"EditPrompt({str.__repr__(self)}, sources={list(self.sources)!r})"
        return f"EditPrompt({str.__repr__(self)}, source={self.source!r})"

    def __reduce__(self):  # copies keep the sources (plain str pickling would drop them)
        return (EditPrompt, (str.__str__(self), self.source, self.sources))


def is_edit_row(value: Any) -> bool:
    return isinstance(value, Mapping) and (SOURCE_KEY in value or SOURCES_KEY in value)


def _resolve_source(src: Any, key: str, where: str, base_dir: Path | None) -> Path:
    if not isinstance(src, str) or not src.strip():
        raise ConfigError(f"{where}: {key} must be a path string (relative to the JSONL file), got {src!r}")
    path = Path(src).expanduser()
    if not path.is_absolute():
        path = (base_dir or Path.cwd()) / path
    path = path.resolve()
    if not path.is_file():
        raise ConfigError(f"{where}: {key} {src!r} does not exist (looked for {str(path)!r}); paths are "
                          "relative to the JSONL file that names them")
    return path


def edit_row(value: Mapping[str, Any], where: str, base_dir: Path | None) -> tuple[EditPrompt, dict[str, Any]]:
    """(the EditPrompt, its metadata with the resolved source path) of an edit record; ConfigError if malformed."""
    named = [k for k in INSTRUCTION_KEYS if k in value]
    if len(named) != 1 or not isinstance(value[named[0]], str) or not value[named[0]].strip():
        raise ConfigError(
            f"{where}: an edit record needs its instruction as a non-empty string under exactly one of "
            f"{list(INSTRUCTION_KEYS)}, e.g. {{\"source_image\": \"scenes/0.png\", \"instruction\": \"make the circle "
            f"blue\"}}; got keys {sorted(value)}"
        )
    from mmreward.text_checks import check_text

    check_text(value[named[0]], f"{where}: the instruction")  # refused at read, not at the first scoring
    if SOURCES_KEY in value:
        srcs = value[SOURCES_KEY]
        if SOURCE_KEY in value:
            raise ConfigError(f"{where}: give either source_image (one path) or source_images (a list of paths), "
                              "not both")
        if not isinstance(srcs, (list, tuple)) or not srcs:
            raise ConfigError(f"{where}: source_images must be a non-empty list of path strings (relative to the "
                              f"JSONL file), got {srcs!r}")
        paths = [_resolve_source(s, f"source_images[{i}]", where, base_dir) for i, s in enumerate(srcs)]
    else:
        paths = [_resolve_source(value[SOURCE_KEY], SOURCE_KEY, where, base_dir)]
    meta = {k: v for k, v in value.items() if k not in INSTRUCTION_KEYS}
    meta[SOURCE_KEY] = str(paths[0])
    if SOURCES_KEY in value:
        meta[SOURCES_KEY] = [str(p) for p in paths]
    return EditPrompt(value[named[0]], paths[0], paths), meta


@lru_cache(maxsize=256)
def _read_source(path: str, mtime_ns: int, alpha: Literal["drop", "keep", "keep_rgba"] = "drop") -> torch.Tensor:
    from mmreward.media import read_image

    return read_image(path, alpha=alpha)


def load_source_image(source: Any, alpha: Literal["drop", "keep", "keep_rgba"] = "drop") -> torch.Tensor:
    """(3, H, W) float in [0, 1] from a path (cached by path and modification time) or an image tensor.

    `alpha`: as `mmreward.media.load_image`; "keep" or "keep_rgba" (a reward's `media_alpha`) returns a
    transparent RGBA source as (4, H, W) for rewards whose original composites it itself."""
    if isinstance(source, torch.Tensor):
        from mmreward.media import load_image

        return load_image(source, alpha=alpha)
    if isinstance(source, (str, os.PathLike)):
        p = Path(source)
        if not p.is_file():
            raise RewardInputError(f"source_image: {str(p)!r} does not exist")
        return _read_source(str(p), p.stat().st_mtime_ns, alpha).clone()
    raise RewardInputError(f"source_image: expected a path or a (3, H, W) tensor, got {type(source).__name__}")


def source_image_list(metadata: Sequence[Mapping[str, Any]] | None, n: int, reward: str,
                      alpha: Literal["drop", "keep", "keep_rgba"] = "drop") -> list[torch.Tensor]:
    """Each item's source image, (3, H, W) in [0, 1] at its own size, from per-item metadata
    ({"source_image": path or tensor}); an edit reward called without it is told how to pass it.
    `alpha`: see `load_source_image`."""
    if metadata is None or len(metadata) != n or any(SOURCE_KEY not in m for m in metadata):
        raise RewardInputError(
            f"{reward} scores image edits and needs each item's source image: pass metadata=[{{'source_image': "
            "path or (3, H, W) tensor}, ...] (one per item), or train on edit records ({\"source_image\", "
            "\"instruction\"} rows), whose metadata carries it"
        )
    return [load_source_image(m[SOURCE_KEY], alpha) for m in metadata]


def source_images(metadata: Sequence[Mapping[str, Any]] | None, n: int, reward: str,
                  size: tuple[int, int] | None = None) -> torch.Tensor:
    """(n, 3, H, W) source images (see `source_image_list`); `size` resizes them (bilinear, antialiased) to
    the edited images' size where they differ."""
    out = []
    for img in source_image_list(metadata, n, reward):
        if size is not None and tuple(img.shape[-2:]) != tuple(size):
            img = torch.nn.functional.interpolate(img[None].float(), size=size, mode="bilinear", antialias=True,
                                                  align_corners=False)[0].clamp(0, 1)
        out.append(img)
    if len({tuple(x.shape) for x in out}) != 1:
        raise RewardInputError(f"{reward}: the source images have different sizes {[tuple(x.shape) for x in out]}; "
                               "pass size= or resize them to one size")
    return torch.stack(out)


def check_edit_run(family: str | None, prompts: Mapping[str, Sequence[str]], rewards: Sequence[str]) -> None:
    """ConfigError, before any sampling, when an editing pipeline (`family`) gets prompts without a source image,
    or a reward that scores edits against their source (SCORED_WITH_SOURCES) runs on such prompts.
    `prompts`: role ("train", "eval") -> prompt list."""
    for role, plist in prompts.items():
        plain = [i for i, p in enumerate(plist) if not isinstance(p, EditPrompt)]
        if not plain:
            continue
        first = plist[plain[0]]
        how = ("give edit records: JSONL rows {\"source_image\": PATH, \"instruction\": ...} (PATH relative to "
               "the file), see mmreward.edit")
        if family in EDIT_FAMILIES:
            raise ConfigError(f"prompts.{role}[{plain[0]}] = {first!r} has no source image, but a {family} pipeline "
                              f"edits images; {how}")
        wanting = sorted(set(rewards) & SCORED_WITH_SOURCES)
        if wanting:
            raise ConfigError(f"reward(s) {wanting} score edits against their source image, but prompts.{role}"
                              f"[{plain[0]}] = {first!r} has none; {how}, with an editing pipeline "
                              f"({', '.join(sorted(EDIT_FAMILIES))})")
