"""Hugging Face `datasets` as a data source: `save_to_disk` folders, hub ids and builder ids, offline-safe.

A source is named one of three ways:
  - a folder written by `Dataset.save_to_disk` / `DatasetDict.save_to_disk`;
  - "hf:org/name" or "hf:org/name:split", a `load_dataset` id (the hub cache is used first: with
    HF_HUB_OFFLINE=1 nothing is downloaded, and a dataset missing from the cache is a CheckpointError
    that says what to download);
  - a mapping {"dataset": id or folder, "split": ..., "name": config, "data_files": ..., "column": ...},
    which also reaches builders such as {"dataset": "json", "data_files": "prompts.jsonl"}.

`datasets` is an optional dependency (`pip install 'mmreward[datasets]'`), imported only here and
only when a dataset source is used.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmreward.errors import CheckpointError, ConfigError, RewardInputError, require

DATASETS_EXTRA = "datasets"
HUB_PREFIX = "hf:"
SOURCE_KEYS = ("dataset", "split", "name", "data_files", "column")


@dataclass(frozen=True)
class DatasetSource:
    """Where rows come from. `column` is for callers that read one column (prompts)."""

    dataset: str
    split: str | None = None
    name: str | None = None
    data_files: Any = None
    column: str | None = None

    def describe(self) -> str:
        return self.dataset + (f" (split {self.split!r})" if self.split else "")


def is_dataset_folder(path: str | Path) -> bool:
    """A folder written by `save_to_disk` (a Dataset has state.json, a DatasetDict dataset_dict.json)."""
    p = Path(path)
    return p.is_dir() and ((p / "state.json").is_file() or (p / "dataset_dict.json").is_file())


def parse_source(value: str | Mapping[str, Any], where: str) -> DatasetSource | None:
    """The dataset source `value` names, or None when it names something else (a file, a plain folder)."""
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - set(SOURCE_KEYS))
        if unknown or not isinstance(value.get("dataset"), str) or not value["dataset"].strip():
            raise ConfigError(
                f"{where}: a dataset source is a mapping with a non-empty 'dataset' (hub id, builder or "
                f"save_to_disk folder) and optional {list(SOURCE_KEYS[1:])}; got {dict(value)!r}"
            )
        for key in ("split", "name", "column"):
            if value.get(key) is not None and not isinstance(value[key], str):
                raise ConfigError(f"{where}.{key} must be a string, got {value[key]!r}")
        dataset = value["dataset"].strip()
        dataset = dataset[len(HUB_PREFIX):] if dataset.startswith(HUB_PREFIX) else dataset
        return DatasetSource(dataset, value.get("split"), value.get("name"), value.get("data_files"), value.get("column"))
    if value.startswith(HUB_PREFIX):
        dataset, _, split = value[len(HUB_PREFIX):].partition(":")
        if not dataset.strip():
            raise ConfigError(f"{where}: {value!r} names no dataset; write hf:org/name or hf:org/name:split")
        return DatasetSource(dataset.strip(), split.strip() or None)
    if is_dataset_folder(value):
        return DatasetSource(value)
    return None


def load_rows(source: DatasetSource, where: str):
    """The `datasets.Dataset` a source names (one split), or a typed error naming the fix."""
    datasets = require("datasets", DATASETS_EXTRA, f"{where} from a Hugging Face dataset")
    if is_dataset_folder(source.dataset):
        loaded = datasets.load_from_disk(source.dataset)
    elif Path(source.dataset).is_dir() and source.data_files is None:
        raise ConfigError(
            f"{where}: {source.dataset} is a folder but not one written by save_to_disk (no state.json or "
            "dataset_dict.json); save it with Dataset.save_to_disk, or name a builder such as "
            "{dataset: json, data_files: ...}"
        )
    else:
        try:
            loaded = datasets.load_dataset(source.dataset, source.name, split=source.split or "train",
                                           data_files=source.data_files)
        except (OSError, ConnectionError) as exc:  # ConnectionError is an OSError; named for the reader
            raise CheckpointError(
                f"{where}: cannot load the dataset {source.describe()}: {exc}. Offline, download it first on a "
                f"connected machine (python -c \"import datasets; datasets.load_dataset('{source.dataset}')\" "
                "fills the cache; set HF_DATASETS_CACHE to the same folder here), or save it with "
                "save_to_disk and pass that folder"
            ) from exc
        except ValueError as exc:  # an unknown split or config
            raise ConfigError(f"{where}: cannot load the dataset {source.describe()}: {exc}") from exc
    if isinstance(loaded, datasets.DatasetDict):
        splits = list(loaded)
        split = source.split or ("train" if "train" in loaded else splits[0] if len(splits) == 1 else None)
        if split not in loaded:
            raise ConfigError(f"{where}: {source.dataset} has the splits {splits}; choose one with "
                              f"'split' (or hf:{source.dataset}:SPLIT)")
        loaded = loaded[split]
    elif source.split and is_dataset_folder(source.dataset):
        raise ConfigError(f"{where}: {source.dataset} is a single saved Dataset, which has no splits; drop 'split'")
    return loaded


def decode_image(value: Any, root: Path | None, where: str) -> Any:
    """A dataset cell holding an image, as something `mmreward.media` reads: a PIL image or a path.

    `datasets.Image()` columns arrive decoded (PIL) or, with `decode=False`, as {"bytes", "path"};
    Pick-a-Pic's jpg_0/jpg_1 are raw bytes; JSONL rows hold paths, relative to `root`.
    """
    from PIL import Image

    if isinstance(value, Image.Image):
        return value
    if isinstance(value, Mapping):
        if value.get("bytes"):
            value = value["bytes"]
        elif value.get("path"):
            value = value["path"]
    if isinstance(value, (bytes, bytearray)):
        try:
            img = Image.open(io.BytesIO(value))
            img.load()
        except OSError as exc:
            raise RewardInputError(f"{where}: the image bytes do not decode: {exc}") from exc
        return img
    if isinstance(value, (str, Path)):
        path = Path(value)
        return str(path if path.is_absolute() or root is None else root / path)
    raise RewardInputError(
        f"{where}: expected an image (a datasets Image() value, image bytes or a path), got {type(value).__name__}"
    )
