"""Where weights come from: source strings, hub files (cache-first, never a hidden download), strict loading.

Source strings accepted by `mmreward.load`:
  "clipscore"                 a registered name (its default checkpoint)
  "clipscore:openai-l14"      a registered name with a tag
  "hf-hub:org/repo[@rev]"     a Hugging Face hub repository
  "local-dir:/path" or a path a local file or folder in the model's official format
  "pkg.module:Class"          an importable Reward subclass. Naming one imports `pkg.module` (which
                              runs its top-level code, as transformers' trust_remote_code does); the
                              attribute is checked to be a Reward subclass before anything is called.

Every weights file is read without unpickling (safetensors, or torch.load(weights_only=True)) and every
model is loaded strictly: missing, unexpected or wrong-shaped keys are a CheckpointError naming them.
"""

from __future__ import annotations

import importlib
import os
import pickle
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from mmreward.errors import CheckpointError, UnknownRewardError
from mmreward.pickle_files import load_torch_file, refusal_error
from mmreward.safe_parse import load_json

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
        check_hub_id(repo)
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


def import_object(path: str, accept: Callable[[Any], bool], expected: str) -> Any:
    """'pkg.module:attr' -> the attribute, only if `accept(attribute)`; nothing is called here.

    Importing the module runs its top-level code: a source string naming a module is code, so callers
    must only pass strings a user chose to trust (like transformers' trust_remote_code). The check
    stops a config from reaching arbitrary callables (`subprocess:run`, `os:system`) with its options.
    """
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr.isidentifier() or not all(
        part.isidentifier() for part in module_name.split(".")
    ):
        raise UnknownRewardError(f"'{path}' is not of the form 'pkg.module:Name' naming {expected}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UnknownRewardError(f"cannot import module '{module_name}' from source '{path}': {exc}") from exc
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise UnknownRewardError(f"module '{module_name}' has no attribute '{attr}' (source '{path}')") from None
    if not accept(obj):
        desc = f"the class {obj.__qualname__}" if isinstance(obj, type) else f"a {type(obj).__name__}"
        raise UnknownRewardError(
            f"'{path}' is {desc}, not {expected}; refusing to call it. "
            "Only registered names or your own classes of the expected type can be named in configs."
        )
    return obj


def read_json(path: str | os.PathLike, what: str = "JSON file") -> dict[str, Any]:
    """A JSON object from a checkpoint file, or a CheckpointError naming the file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CheckpointError(f"{what} not found: {p}") from None
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{what} {p} is not valid JSON ({exc}); re-download or re-save it") from None
    # duplicate keys and deep nesting refused (safe_parse), as a CheckpointError naming the file
    data = load_json(text, source=f"{what} {p}", error=CheckpointError)
    if not isinstance(data, dict):
        raise CheckpointError(f"{what} {p} must hold a JSON object, got {type(data).__name__}")
    return data


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
    check_hub_id(ckpt)
    return _resolve_hub_files(ckpt, filenames, optional, revision)


def check_hub_id(repo: str) -> None:
    """A CheckpointError (not huggingface_hub's HFValidationError) for a string that cannot be a hub repo id."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo)
    except HFValidationError as exc:
        raise CheckpointError(f"checkpoint '{repo}' is neither an existing file or folder nor a valid hub id "
                              f"'org/repo': {exc}") from None


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
    if p.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            sd = load_file(str(p), device="cpu")
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own types for corrupt headers
            raise CheckpointError(f"cannot read weights file {p} (corrupt or truncated?): {exc}") from exc
    else:
        sd = load_torch_file(p)  # weights_only: a pickle holding objects is refused, with how to convert it
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
    partial: bool = False,
) -> None:
    """load_state_dict(strict=True) with an error that lists the missing and unexpected keys and shapes.

    `ignore`: file keys to drop (legacy buffers). `partial=True` is for files that overlay a subset of an
    already-loaded model (non-LoRA deltas): keys the file lacks stay as they are, but every key it has
    must exist in the model with the same shape.
    """
    sd = dict(state_dict)
    if strip_prefix:
        sd = {k[len(strip_prefix) :] if k.startswith(strip_prefix) else k: v for k, v in sd.items()}
    ignored = set(ignore)
    sd = {k: v for k, v in sd.items() if k not in ignored}
    own = module.state_dict()
    missing = [] if partial else sorted(set(own) - set(sd) - ignored)
    unexpected = sorted(set(sd) - set(own))
    mismatched = sorted(
        k for k in set(own) & set(sd)
        if not isinstance(sd[k], torch.Tensor) or tuple(own[k].shape) != tuple(sd[k].shape)
    )
    if missing or unexpected or mismatched:
        raise key_mismatch_error(source, type(module).__name__, missing, unexpected, [
            f"{k}: file {_shape(sd[k])} vs model {tuple(own[k].shape)}" for k in mismatched
        ])
    check_dtype_kinds(source, {k: sd[k].dtype for k in set(own) & set(sd)}, own)
    try:
        module.load_state_dict(sd, strict=not (ignored or partial))
    except RuntimeError as exc:  # e.g. a dtype that cannot be copied; the keys themselves matched
        raise CheckpointError(f"weights from {source} cannot be loaded into {type(module).__name__}: {exc}") from exc


def _is_float(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point or dtype.is_complex


def check_dtype_kinds(source: str, file_dtypes: Mapping[str, torch.dtype], own: Mapping[str, torch.Tensor]) -> None:
    """Refuse integer or bool tensors for floating-point parameters: load_state_dict would cast them silently
    (int32 weights truncate every value, and change a reward's scores). Integer buffers (position ids,
    counters) and float-to-float casts (fp16 files into fp32 models) are fine."""
    wrong = sorted(k for k, dt in file_dtypes.items() if k in own and _is_float(own[k].dtype) and not _is_float(dt))
    if wrong:
        shown = ", ".join(f"{k} ({file_dtypes[k]}, model {own[k].dtype})" for k in wrong[:5])
        more = f" and {len(wrong) - 5} more" if len(wrong) > 5 else ""
        raise CheckpointError(
            f"weights from {source} hold integer or bool tensors where the model has floating-point parameters: "
            f"{shown}{more}. The file is corrupt or was converted wrongly; re-export it with float weights")


_SAFETENSORS_DTYPES = {"BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16,
                       "I32": torch.int32, "I64": torch.int64}


def _check_folder_dtypes(folder: Path, model: Any) -> None:
    """check_dtype_kinds for the safetensors files of a from_pretrained folder, from their headers only."""
    from safetensors import safe_open

    own = model.state_dict() if hasattr(model, "state_dict") else {}
    for file in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt") as f:
                ints = {k: _SAFETENSORS_DTYPES[f.get_slice(k).get_dtype()] for k in f.keys()
                        if f.get_slice(k).get_dtype() in _SAFETENSORS_DTYPES}
        except Exception:  # noqa: BLE001 - from_pretrained has already read the file; nothing to add here
            continue
        prefix = getattr(model, "base_model_prefix", "")
        # files of a base model saved without (or with) the head class's prefix name the same parameters
        named = {**{f"{prefix}.{k}": v for k, v in ints.items() if prefix}, **ints}
        check_dtype_kinds(str(file), named, own)


def _shape(value: Any) -> Any:
    return tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__


def key_mismatch_error(
    source: str, model: str, missing: Sequence[str], unexpected: Sequence[str], mismatched: Sequence[str]
) -> CheckpointError:
    """The one message for a checkpoint whose keys do not match the model: counts and examples of each kind."""
    parts = []
    if missing:
        parts.append(f"{len(missing)} missing keys (e.g. {list(missing)[:5]})")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected keys (e.g. {list(unexpected)[:5]})")
    if mismatched:
        parts.append(f"{len(mismatched)} shape mismatches (e.g. {', '.join(list(mismatched)[:3])})")
    return CheckpointError(
        f"weights from {source} do not match {model}: " + "; ".join(parts)
        + ". Is this the right checkpoint for this reward? Loading is strict: a reward with missing or "
        "extra weights would silently score with random parameters."
    )


def load_files(fn: Callable[[str], Any], source: str | os.PathLike, what: str) -> Any:
    """fn(source) for tokenizers and processors: a corrupt or incomplete file is a CheckpointError naming it."""
    src = os.fspath(source)
    try:
        return fn(src)
    except Exception as exc:  # noqa: BLE001 - tokenizers/json/sentencepiece raise many types for bad files
        raise CheckpointError(f"cannot load the {what} from {src}: {type(exc).__name__}: {exc}") from exc


def load_pretrained(
    cls: Any,
    source: str | os.PathLike,
    *,
    ignore_unexpected: Iterable[str] = (),
    **kwargs: Any,
) -> Any:
    """`cls.from_pretrained(source)` for transformers/diffusers classes, strictly.

    transformers only warns about missing or unexpected keys and initialises the missing ones at
    random; here any of them is a CheckpointError that names the keys. A corrupt config.json or
    weights file is a CheckpointError naming the file.
    """
    src = os.fspath(source)
    config = Path(os.path.expanduser(src)) / "config.json"
    if config.is_file():
        read_json(config, "model config")
    try:
        model, info = cls.from_pretrained(src, output_loading_info=True, **kwargs)
    except RuntimeError as exc:
        if "ignore_mismatched_sizes" not in str(exc):
            raise CheckpointError(f"cannot load {getattr(cls, '__name__', cls)} from {src}: {exc}") from exc
        # the exception does not name the keys: load once more, tolerating them, to report them
        try:
            _, info = cls.from_pretrained(src, output_loading_info=True, ignore_mismatched_sizes=True, **kwargs)
        except Exception:  # noqa: BLE001 - the first error is the one to report
            info = {}
        mismatched = [str(m[0]) if isinstance(m, tuple) else str(m) for m in info.get("mismatched_keys", [])]
        raise key_mismatch_error(src, getattr(cls, "__name__", str(cls)), [], [], mismatched or ["(see log)"]) from exc
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - corrupt or unreadable files raise SafetensorError, ValueError, ...
        if isinstance(exc, OSError) and not Path(os.path.expanduser(src)).is_dir():
            raise  # not a local folder: a hub or path problem, which the caller explains with its own fix
        if _refused_pickle(exc):  # a .bin holding objects: say how to convert it, never torch's advice
            files = sorted(Path(os.path.expanduser(src)).glob("**/*.bin")) or [Path(src)]
            raise refusal_error(files[0], exc) from None
        raise CheckpointError(
            f"cannot load {getattr(cls, '__name__', cls)} from {src}: {type(exc).__name__}: {exc}. "
            "Is the folder complete and are its files intact (config.json, model.safetensors)?"
        ) from exc
    folder = Path(os.path.expanduser(src)) / kwargs.get("subfolder", "")
    if folder.is_dir():
        _check_folder_dtypes(folder, model)
    ignored = set(ignore_unexpected)
    missing = sorted(info.get("missing_keys", []))
    unexpected = sorted(k for k in info.get("unexpected_keys", []) if k not in ignored)
    mismatched = [str(m) for m in info.get("mismatched_keys", [])]
    if missing or unexpected or mismatched:
        raise key_mismatch_error(src, type(model).__name__, missing, unexpected, mismatched)
    return model


def _refused_pickle(exc: BaseException | None) -> bool:
    """Whether `exc` (or what it wraps) is torch's weights_only refusal of a pickle holding objects."""
    while exc is not None:
        if isinstance(exc, pickle.UnpicklingError) or "Weights only load failed" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def resolve_device(device: str | torch.device | None) -> torch.device:
    from mmreward.devices import check_device

    return check_device(device)


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
