"""Training checkpoints: safetensors for tensors, JSON for the rest, so resuming never unpickles code.

A checkpoint is a folder written atomically (a hidden temporary folder renamed into place once complete,
`trainer_state.json` last), so a run killed mid-save leaves the previous checkpoint as the latest.
`training_state` / `restore` move the state between a `Policy` (model, optimizer, EMA), the algorithm
and the run's counters and this layout.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch

from diffusion_rl.policy import Policy
from mmreward.errors import CheckpointError, ConfigError

CHECKPOINT_FORMAT = 2  # 1: one pickled trainer_state.pt; 2: safetensors + trainer_state.json
STATE_FILE = "trainer_state.json"  # written last: its presence marks a complete folder
_TEMPORARY = re.compile(r"^\..+\.(tmp|old)-\d+$")


def training_state(policy: Policy, algorithm: Any, iteration: int, history: list[dict[str, Any]],
                   config: dict[str, Any]) -> dict[str, Any]:
    """Everything a resumed run needs, in memory (tensors on CPU); `write_checkpoint` stores it."""
    algo_state = algorithm.state_dict() if hasattr(algorithm, "state_dict") else None
    names = {id(p): n for n, p in policy.unwrapped.named_parameters()}
    return {
        "iteration": iteration, "optimizer_steps": policy.steps,
        "params": {names[id(p)]: p.detach().cpu().clone() for p in policy.trainable},
        "optimizer": policy.optimizer.state_dict(),
        "ema": None if policy.ema is None else policy.ema.state_dict(),
        "algorithm": algo_state, "history": history, "config": config,
    }


def restore(path: Path, state: dict[str, Any], policy: Policy, algorithm: Any) -> None:
    """Load a checkpoint's parameters, optimizer, EMA and algorithm state into a freshly built run, after
    checking that it was saved from the same model and LoRA configuration."""
    params = dict(policy.unwrapped.named_parameters())
    missing = [n for n in state["params"] if n not in params]
    if missing:
        raise ConfigError(f"checkpoint {path} has parameters this model lacks (different LoRA config?): {missing[:3]}")
    trained = {id(p) for p in policy.trainable}
    absent = [n for n, p in params.items() if id(p) in trained and n not in state["params"]]
    if absent:
        raise ConfigError(f"checkpoint {path} lacks trained parameters of this model (different LoRA config?): "
                          f"{absent[:3]}")
    for n, v in state["params"].items():
        if tuple(v.shape) != tuple(params[n].shape):
            raise ConfigError(f"checkpoint {path}: parameter {n} has shape {tuple(v.shape)}, this model's is "
                              f"{tuple(params[n].shape)} (different model or model.lora_rank?)")
    with torch.no_grad():
        for n, v in state["params"].items():
            params[n].copy_(v.to(params[n].device, params[n].dtype))
    try:
        policy.optimizer.load_state_dict(state["optimizer"])
    except (ValueError, KeyError) as exc:
        raise CheckpointError(f"checkpoint {path}: the optimizer state does not fit this model ({exc})") from None
    if policy.ema is not None and state["ema"] is not None:
        policy.ema.load_state_dict(state["ema"])
    if state.get("algorithm") is not None and hasattr(algorithm, "load_state_dict"):
        algorithm.load_state_dict(state["algorithm"])
    policy.steps = state["optimizer_steps"]


def find_resume(value: str, out_dir: Path) -> tuple[Path, dict[str, Any]]:
    """The checkpoint to resume from and its state; 'latest' skips incomplete checkpoints with a warning."""
    if value != "latest":
        path = Path(value)
        if not path.is_dir():
            raise CheckpointError(f"train.resume_from: {value!r} is not a folder; give a checkpoint folder such "
                                  f"as {out_dir / 'checkpoints' / 'iter_000010'}, or 'latest'")
        return path, read_checkpoint(path)
    root = out_dir / "checkpoints"
    found = sorted((d for d in root.glob("iter_*") if re.fullmatch(r"iter_\d+", d.name) and d.is_dir()),
                   key=lambda d: int(d.name[5:]))
    for path in reversed(found):
        try:
            return path, read_checkpoint(path)
        except CheckpointError as exc:
            warnings.warn(f"train.resume_from='latest': skipping {path}, which is incomplete or corrupt ({exc})",
                          stacklevel=2)
    raise ConfigError(f"train.resume_from='latest' but {root} holds no complete checkpoint; "
                      "unset train.resume_from to start a new run")


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_stale_temporaries(root: Path) -> None:
    """Folders left by a save that was killed before its rename."""
    for d in root.iterdir():
        if d.is_dir() and _TEMPORARY.match(d.name):
            shutil.rmtree(d, ignore_errors=True)


def write_checkpoint(state: dict[str, Any], path: str | Path) -> Path:
    """Write `training_state(...)` to the folder `path` atomically (temporary folder, then rename):
    params/optimizer/ema tensors as safetensors, everything else in trainer_state.json."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    opt = state["optimizer"]
    opt_tensors: dict[str, torch.Tensor] = {}
    opt_scalars: dict[str, dict[str, Any]] = {}
    for idx, per_param in opt["state"].items():
        for key, val in per_param.items():
            if isinstance(val, torch.Tensor):
                opt_tensors[f"{idx}.{key}"] = val.detach().cpu().contiguous()
            else:
                opt_scalars.setdefault(str(idx), {})[key] = val
    tensors = {"params": {n: v.detach().cpu().contiguous() for n, v in state["params"].items()},
               "optimizer": opt_tensors}
    ema = state.get("ema")
    if ema is not None:
        tensors["ema"] = {f"shadow.{i}": t.detach().cpu().contiguous() for i, t in enumerate(ema["shadow"])}
    meta: dict[str, Any] = {
        "format": CHECKPOINT_FORMAT, "iteration": state["iteration"], "optimizer_steps": state["optimizer_steps"],
        "history": state["history"], "algorithm": state.get("algorithm"), "config": state.get("config"),
        "optimizer": {"param_groups": opt["param_groups"], "scalars": opt_scalars},
        "ema": None if ema is None else {"num_updates": ema["num_updates"], "size": len(ema["shadow"])},
        "files": {},
    }
    for name, group in tensors.items():
        file = tmp / f"{name}.safetensors"
        save_file(group, str(file))
        _fsync(file)
        meta["files"][file.name] = file.stat().st_size
    (tmp / STATE_FILE).write_text(json.dumps(meta))
    _fsync(tmp / STATE_FILE)
    if path.exists():  # re-saving an iteration (e.g. the final save after a periodic one)
        old = path.parent / f".{path.name}.old-{os.getpid()}"
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, path)
    _fsync(path.parent)
    return path


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """The state written by `write_checkpoint` (or a legacy trainer_state.pt, read with weights_only=True),
    in `training_state`'s layout. Raises CheckpointError for a missing, incomplete or corrupt folder."""
    from safetensors.torch import load_file

    path = Path(path)
    meta_file = path / STATE_FILE
    if not meta_file.is_file():
        if (path / "trainer_state.pt").is_file():
            return _read_legacy_checkpoint(path / "trainer_state.pt")
        raise CheckpointError(f"{path} has no {STATE_FILE}: not a trainer checkpoint, or one whose save was "
                              "interrupted; resume from an earlier checkpoint folder")
    try:
        meta = json.loads(meta_file.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(f"{meta_file} is not readable JSON ({exc}); the checkpoint is corrupt") from None
    if not isinstance(meta, dict) or meta.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{meta_file}: unknown checkpoint format {meta.get('format') if isinstance(meta, dict) else meta!r}, "
                              f"expected {CHECKPOINT_FORMAT}")
    for key, kind in (("iteration", int), ("optimizer_steps", int), ("history", list), ("files", dict),
                      ("optimizer", dict)):
        if not isinstance(meta.get(key), kind):
            raise CheckpointError(f"{meta_file}: '{key}' is missing or not a {kind.__name__}; the checkpoint is corrupt")
    tensors: dict[str, dict[str, torch.Tensor]] = {}
    for file, size in meta["files"].items():
        f = path / file
        if not f.is_file() or f.stat().st_size != size:
            have = f.stat().st_size if f.is_file() else "no file"
            raise CheckpointError(f"{f}: expected {size} bytes, found {have}; the checkpoint is incomplete")
        try:
            tensors[file.removesuffix(".safetensors")] = load_file(str(f))
        except Exception as exc:  # safetensors raises its own error type for a corrupt header
            raise CheckpointError(f"{f} is not a readable safetensors file ({exc})") from None
    if "params" not in tensors or "optimizer" not in tensors:
        raise CheckpointError(f"{meta_file} lists no params or optimizer file; the checkpoint is corrupt")
    opt_state: dict[int, dict[str, Any]] = {}
    for key, val in tensors["optimizer"].items():
        idx, name = key.split(".", 1)
        opt_state.setdefault(int(idx), {})[name] = val
    for idx, scalars in meta["optimizer"].get("scalars", {}).items():
        opt_state.setdefault(int(idx), {}).update(scalars)
    groups = [{k: tuple(v) if k == "betas" else v for k, v in g.items()} for g in meta["optimizer"]["param_groups"]]
    ema = None
    if meta.get("ema") is not None:
        if "ema" not in tensors:
            raise CheckpointError(f"{meta_file} records an EMA but lists no ema file; the checkpoint is corrupt")
        ema = {"shadow": [tensors["ema"][f"shadow.{i}"] for i in range(meta["ema"]["size"])],
               "num_updates": meta["ema"]["num_updates"]}
    return {"iteration": meta["iteration"], "optimizer_steps": meta["optimizer_steps"], "params": tensors["params"],
            "optimizer": {"state": opt_state, "param_groups": groups}, "ema": ema,
            "algorithm": meta.get("algorithm"), "history": meta["history"], "config": meta.get("config")}


def _read_legacy_checkpoint(file: Path) -> dict[str, Any]:
    """Checkpoints of format 1 (one torch.save file): tensors and plain containers only, so weights_only works."""
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # a truncated or 0-byte file raises EOFError, RuntimeError or an unpickling error
        raise CheckpointError(f"{file} cannot be read ({type(exc).__name__}: {exc}); the checkpoint is incomplete "
                              "or corrupt") from None
    required = ("iteration", "optimizer_steps", "params", "optimizer", "history")
    if not isinstance(state, dict) or any(k not in state for k in required):
        raise CheckpointError(f"{file} lacks {list(required)}; it is not a trainer checkpoint")
    return {"ema": None, "algorithm": None, "config": None, **state}
