"""The one place that reads PyTorch pickle files (.pt/.pth/.bin), always with `torch.load(weights_only=True)`.

A file that needs more than tensors and plain containers is refused. PyTorch's own message for that advises
re-running `torch.load` with weights_only disabled, which would run whatever code the file holds; we never
pass that advice on. Instead the error says what the file is and how to convert it to safetensors once, in
an environment the user trusts.
"""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path
from typing import Any

import torch

from mmreward.errors import CheckpointError

# 'GLOBAL argparse.Namespace was not an allowed global' (torch >= 2.4), 'unsupported GLOBAL posix.system whose
# module posix is blocked' (torch >= 2.6): either names the object the pickle would import
_GLOBAL = re.compile(r"GLOBAL\s+([A-Za-z_][\w.]*)")
# the part of torch's messages we must never echo (its "retry with weights_only disabled" advice)
_TORCH_ADVICE = re.compile(r"weights_only|Weights only load failed|add_safe_globals|safe_globals", re.IGNORECASE)


def conversion_snippet(path: str | os.PathLike) -> str:
    """Two lines that turn a trusted pickle checkpoint into a safetensors file (tensors only)."""
    src = str(path)
    dst = str(Path(src).with_suffix(".safetensors"))
    return (f"    import torch, safetensors.torch as st; sd = torch.load({src!r}, map_location='cpu', weights_only=False)\n"
            "    sd = sd.get('state_dict', sd); "  # training checkpoints (mmdet, lightning) nest the weights
            f"st.save_file({{k: v.contiguous() for k, v in sd.items() if isinstance(v, torch.Tensor)}}, {dst!r})")


def refusal_error(path: str | os.PathLike, exc: BaseException | None = None) -> CheckpointError:
    """The CheckpointError for a pickle that holds more than tensors: what it is and how to convert it."""
    found = _GLOBAL.search(str(exc)) if exc is not None else None
    what = f"it would import the Python object {found.group(1)}" if found else "it holds pickled Python objects"
    return CheckpointError(
        f"refused to load {path}: {what}, and mmreward never unpickles objects (they can run code). If you "
        "trust the file, convert it to safetensors once, in a separate environment you trust, then pass the "
        f".safetensors file instead:\n{conversion_snippet(path)}")


def _describe(exc: BaseException) -> str:
    """The exception in one line, without any of torch's weights_only advice."""
    text = " ".join(str(exc).split())
    return type(exc).__name__ if not text or _TORCH_ADVICE.search(text) else f"{type(exc).__name__}: {text[:200]}"


def load_torch_file(path: str | os.PathLike, *, what: str = "weights file") -> Any:
    """`torch.load(path, weights_only=True)` onto the CPU; a refused pickle or an unreadable file is a
    CheckpointError naming the file (refusals with the safetensors conversion, never torch's advice)."""
    try:
        return torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        # torch raises UnpicklingError both for refused objects ("Weights only load failed") and for bytes that
        # are not a pickle at all ("invalid load key")
        if _GLOBAL.search(str(exc)):  # a well-formed pickle that would import an object
            raise refusal_error(path, exc) from None
        # an opcode the weights-only unpickler does not accept: random bytes, or a plain pickle of objects
        op = re.search(r"Unsupported operand \d+|invalid load key[^\n]*", str(exc))
        raise CheckpointError(
            f"cannot read {what} {path}: it is corrupt or not a PyTorch weights file"
            f"{f' ({op.group(0).strip()})' if op else ''}. If it is a pickle you trust, convert it to safetensors "
            f"once, in a separate environment you trust, and pass that file instead:\n{conversion_snippet(path)}"
        ) from None
    except Exception as exc:  # noqa: BLE001 - truncated or foreign files raise EOFError, RuntimeError, KeyError ...
        raise CheckpointError(f"cannot read {what} {path}: corrupt, truncated or not a PyTorch file "
                              f"({_describe(exc)})") from None
