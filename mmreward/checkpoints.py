"""Where weights come from: source strings, hub files (cache-first, never a hidden download), strict loading.

Source strings accepted by `mmreward.load`:
  "clipscore"                 a registered name (its default checkpoint)
  "clipscore:openai-l14"      a registered name with a tag
  "hf-hub:org/repo[@rev]"     a Hugging Face hub repository
  "local-dir:/path" or a path a local file or folder in the model's official format
  "pkg.module:Class"          any importable Reward subclass
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from mmreward.errors import CheckpointError

HUB_PREFIX = "hf-hub:"
LOCAL_PREFIX = "local-dir:"


@dataclass(frozen=True)
class Source:
    kind: Literal["name", "hub", "local", "class"]
    value: str
    tag: str | None = None
    revision: str | None = None


def parse_source(source: str | os.PathLike, known_names: Iterable[str] = ()) -> Source:
    if isinstance(source, os.PathLike):
        return Source("local", os.fspath(source))
    if not isinstance(source, str) or not source.strip():
        raise CheckpointError(f"source: expected a non-empty string or path, got {source!r}")
    s = source.strip()
    if s.startswith(HUB_PREFIX):
        repo, _, rev = s[len(HUB_PREFIX) :].partition("@")
        if repo.count("/") != 1:
            raise CheckpointError(f"source: hub ids look like 'hf-hub:org/repo', got {s!r}")
        return Source("hub", repo, revision=rev or None)
    if s.startswith(LOCAL_PREFIX):
        return Source("local", s[len(LOCAL_PREFIX) :])
    known = set(known_names)
    if s in known:
        return Source("name", s)
    head, sep, tail = s.partition(":")
    if sep and head in known:
        return Source("name", head, tag=tail)
    if os.path.exists(s) or s.startswith(("/", "./", "../", "~")):
        return Source("local", os.path.expanduser(s))
    if sep and head.replace(".", "").replace("_", "").isalnum() and tail.isidentifier():
        return Source("class", s)
    return Source("name", head if sep else s, tag=tail if sep else None)


def import_object(path: str):
    """'pkg.module:attr' -> the attribute."""
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CheckpointError(f"cannot import module '{module_name}' from source '{path}': {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError as exc:
        raise CheckpointError(f"module '{module_name}' has no attribute '{attr}' (source '{path}')") from exc


def hub_is_offline() -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return True
    try:
        from huggingface_hub import constants

        return bool(constants.HF_HUB_OFFLINE)
    except ImportError:
        return True


def _missing_files_error(repo: str, missing: Sequence[str], reason: str) -> CheckpointError:
    files = " ".join(missing)
    return CheckpointError(
        f"checkpoint '{repo}' needs the files [{', '.join(missing)}], which are {reason}. "
        f"Either download them on a connected machine (`hf download {repo} {files}`) and copy the "
        "Hugging Face cache here, or put them in one folder and pass checkpoint='/path/to/folder'."
    )


def resolve_files(
    checkpoint: str | os.PathLike,
    filenames: Sequence[str],
    *,
    optional: Sequence[str] = (),
    revision: str | None = None,
) -> dict[str, Path]:
    """Local paths of the named files of a checkpoint (a local folder, a local file, or a hub repo id).

    A local file stands for the first required filename. Hub files come from the local cache first;
    they are downloaded only when the hub is online, and a missing file offline is a CheckpointError
    that lists exactly what is needed.
    """
    ckpt = os.fspath(checkpoint)
    from mmreward.synthetic.assets import resolve_asset

    ckpt = resolve_asset(ckpt)  # 'mmreward-assets:shapesworld/pref': the shipped folder, wherever installed
    if ckpt.startswith(LOCAL_PREFIX):
        ckpt = ckpt[len(LOCAL_PREFIX) :]
    if ckpt.startswith(HUB_PREFIX):
        ckpt, _, rev = ckpt[len(HUB_PREFIX) :].partition("@")
        revision = revision or rev or None
    path = Path(os.path.expanduser(ckpt))
    if path.is_file():
        if not filenames:
            return {}
        return {filenames[0]: path}
    if path.is_dir():
        found: dict[str, Path] = {}
        missing = []
        for name in list(filenames) + list(optional):
            p = path / name
            if p.exists():
                found[name] = p
            elif name in filenames:
                missing.append(name)
        if missing:
            present = sorted(x.name for x in path.iterdir())[:20]
            raise CheckpointError(
                f"checkpoint folder {path} is missing {missing}; it holds {present}. "
                f"Put the official files {list(filenames)} in it."
            )
        return found
    if ckpt.startswith(("/", "./", "../")) or ckpt.count("/") != 1:
        raise CheckpointError(
            f"checkpoint '{ckpt}' is neither an existing file or folder nor a hub id 'org/repo'"
        )
    return _resolve_hub_files(ckpt, filenames, optional, revision)


def _resolve_hub_files(
    repo: str, filenames: Sequence[str], optional: Sequence[str], revision: str | None
) -> dict[str, Path]:
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError
    except ImportError as exc:  # pragma: no cover - huggingface_hub is a core dependency
        raise CheckpointError("huggingface_hub is required to resolve hub checkpoints") from exc
    offline = hub_is_offline()
    found: dict[str, Path] = {}
    missing: list[str] = []
    for name in list(filenames) + list(optional):
        try:
            found[name] = Path(hf_hub_download(repo, name, revision=revision, local_files_only=True))
            continue
        except (LocalEntryNotFoundError, EntryNotFoundError, FileNotFoundError, OSError):
            pass
        if not offline:
            try:
                found[name] = Path(hf_hub_download(repo, name, revision=revision))
                continue
            except Exception:  # noqa: BLE001 - any network or 404 failure means "not available"
                pass
        if name in filenames:
            missing.append(name)
    if missing:
        reason = "not in the local Hugging Face cache and the hub is offline (HF_HUB_OFFLINE=1)" if offline else (
            "neither cached nor downloadable (no network, or the repo/file does not exist)"
        )
        raise _missing_files_error(repo, missing, reason)
    return found


def load_state_dict(path: str | os.PathLike, key: str | None = None) -> dict[str, torch.Tensor]:
    """Read .safetensors, or .pt/.pth/.bin with weights_only loading onto the CPU (files saved on CUDA work).

    `key` unwraps containers such as {'state_dict': ...}; None unwraps 'state_dict' when it is the
    only sensible content.
    """
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"weights file not found: {p}")
    try:
        if p.suffix == ".safetensors":
            from safetensors.torch import load_file

            sd = load_file(str(p), device="cpu")
        else:
            sd = torch.load(str(p), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - corrupt files raise many types
        raise CheckpointError(f"cannot read weights file {p}: {exc}") from exc
    if key is not None:
        if not isinstance(sd, Mapping) or key not in sd:
            keys = list(sd)[:10] if isinstance(sd, Mapping) else type(sd).__name__
            raise CheckpointError(f"weights file {p} has no '{key}' entry; top-level keys: {keys}")
        sd = sd[key]
    elif isinstance(sd, Mapping) and "state_dict" in sd and isinstance(sd["state_dict"], Mapping):
        sd = sd["state_dict"]
    if not isinstance(sd, Mapping):
        raise CheckpointError(f"weights file {p} does not hold a state dict (got {type(sd).__name__})")
    return dict(sd)


def load_strict(
    module: torch.nn.Module,
    state_dict: Mapping[str, torch.Tensor],
    source: str,
    *,
    strip_prefix: str | None = None,
    ignore: Iterable[str] = (),
) -> None:
    """load_state_dict(strict=True) with an error that lists the missing and unexpected keys and shapes."""
    sd = dict(state_dict)
    if strip_prefix:
        sd = {k[len(strip_prefix) :] if k.startswith(strip_prefix) else k: v for k, v in sd.items()}
    ignored = set(ignore)
    sd = {k: v for k, v in sd.items() if k not in ignored}
    own = module.state_dict()
    missing = sorted(set(own) - set(sd) - ignored)
    unexpected = sorted(set(sd) - set(own))
    mismatched = sorted(k for k in set(own) & set(sd) if tuple(own[k].shape) != tuple(sd[k].shape))
    if missing or unexpected or mismatched:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing keys (e.g. {missing[:5]})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected keys (e.g. {unexpected[:5]})")
        if mismatched:
            parts.append(
                f"{len(mismatched)} shape mismatches (e.g. "
                + ", ".join(f"{k}: file {tuple(sd[k].shape)} vs model {tuple(own[k].shape)}" for k in mismatched[:3])
                + ")"
            )
        raise CheckpointError(
            f"weights from {source} do not match {type(module).__name__}: " + "; ".join(parts)
            + ". Is this the right checkpoint for this reward?"
        )
    module.load_state_dict(sd, strict=not ignored)


def resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise CheckpointError(f"device '{device}' requested but CUDA is not available here; use device='cpu'")
    return dev


_DTYPES = {
    "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
}


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype:
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return _DTYPES[str(dtype).lower()]
    except KeyError:
        raise CheckpointError(f"dtype: expected one of {sorted(_DTYPES)}, got {dtype!r}") from None
