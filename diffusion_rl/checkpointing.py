"""Training checkpoints: safetensors for tensors, JSON for the rest, so resuming never unpickles code.

A checkpoint is a folder written atomically (a hidden temporary folder renamed into place once complete,
`trainer_state.json` last), so a run killed mid-save leaves the previous checkpoint as the latest.
`training_state` / `restore` move the state between a `Policy` (model, optimizer, EMA), the algorithm
and the run's counters and this layout.

Why not `accelerator.save_state` / `load_state` (checked in accelerate 1.15): objects registered with
`register_for_checkpointing` (our EMA, DDPO's stat trackers) are written with pickle and read back with
`torch.load` with weights_only disabled, which runs whatever code a checkpoint holds; and under FSDP the model goes
to a pickled `.bin` or to torch.distributed.checkpoint shards whose metadata is a pickle. Instead the
states are gathered with torch's `torch.distributed.checkpoint.state_dict` API, which gives the same full,
name-keyed state for a plain, DDP or FSDP model, so a checkpoint saved by an FSDP run resumes under DDP or
one process and the other way round. Our sampling noise is counter-based (`seeding.py`), so no RNG
state is needed for an exact resume.
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

from diffusion_rl import checkpoint_validation as checks
from diffusion_rl.policy import Policy
from mmreward.errors import CheckpointError, ConfigError
from mmreward.pickle_files import load_torch_file
from mmreward.safe_parse import safe_json

CHECKPOINT_FORMAT = 3  # 1: one pickled trainer_state.pt; 2: safetensors + JSON, optimizer by index; 3: by name
READABLE_FORMATS = (2, 3)
STATE_FILE = "trainer_state.json"  # written last: its presence marks a complete folder
_TEMPORARY = re.compile(r"^\..+\.(tmp|old)-\d+$")


def _options(strict: bool = True) -> Any:
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # cpu_offload gathers onto rank 0 only (the only one that writes); without a process group there is no rank
    distributed = dist.is_available() and dist.is_initialized()
    return StateDictOptions(full_state_dict=True, cpu_offload=distributed, strict=strict)


def _inner_optimizer(policy: Policy) -> torch.optim.Optimizer:
    return getattr(policy.optimizer, "optimizer", policy.optimizer)  # accelerate's AcceleratedOptimizer wraps it


def _full(t: torch.Tensor) -> torch.Tensor:
    """A sharded (DTensor) tensor gathered whole; a collective, so every process calls it."""
    from torch.distributed.tensor import DTensor

    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().cpu().clone()


def trained_names(policy: Policy) -> list[str]:
    """The names of the trained parameters, in the optimizer's order."""
    names = {id(p): n for n, p in policy.unwrapped.named_parameters()}
    return [names[id(p)] for p in policy.trainable]


def _optimizer_state(policy: Policy) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(policy.model, _inner_optimizer(policy), options=_options())


def _fresh_optimizer_state(policy: Policy) -> dict[str, Any]:
    """The state of an optimizer that has not stepped yet, by parameter name. torch's get_optimizer_state_dict
    would first initialise it with a zero-lr step, which leaves Adam's step count at 1 and so changes every later
    update of the run: saving at iteration 0 (the best-by-gold checkpoint of the hacking monitor) must not."""
    names = {id(p): n for n, p in policy.unwrapped.named_parameters()}
    return {"state": {}, "param_groups": [{**{k: v for k, v in g.items() if k != "params"},
                                           "params": [names[id(p)] for p in g["params"]]}
                                          for g in _inner_optimizer(policy).param_groups]}


def training_state(policy: Policy, algorithm: Any, iteration: int, history: list[dict[str, Any]],
                   config: dict[str, Any]) -> dict[str, Any]:
    """Everything a resumed run needs, in memory (tensors on CPU). A collective under FSDP: every process
    calls it, and the gathered tensors are complete on the main process, which `write_checkpoint`s them."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    algo_state = algorithm.state_dict() if hasattr(algorithm, "state_dict") else None
    names = trained_names(policy)
    full = get_model_state_dict(policy.model, options=_options())
    ema = None
    if policy.ema is not None:
        ema = {"shadow": [_full(t) for t in policy.ema.shadow], "num_updates": policy.ema.num_updates}
    return {
        "iteration": iteration, "optimizer_steps": policy.steps,
        "params": {n: full[n].detach().cpu().clone() for n in names if n in full},
        "optimizer": _optimizer_state(policy) if _inner_optimizer(policy).state else _fresh_optimizer_state(policy),
        "ema": ema, "algorithm": algo_state, "history": history, "config": config,
        # tensors an algorithm keeps besides the policy (DiffusionNFT's old policy), as safetensors
        "algorithm_tensors": algorithm.tensor_state() if hasattr(algorithm, "tensor_state") else None,
    }


def restore(path: Path, state: dict[str, Any], policy: Policy, algorithm: Any) -> None:
    """Load a checkpoint's parameters, optimizer, EMA and algorithm state into a freshly built (prepared) run,
    after checking that it was saved from the same model and LoRA configuration. Every process loads the
    full state; torch's `set_*_state_dict` keeps each process's shard of it under FSDP."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict
    from torch.distributed.tensor import DTensor, distribute_tensor

    params = dict(policy.unwrapped.named_parameters())
    missing = [n for n in state["params"] if n not in params]
    if missing:
        raise ConfigError(f"checkpoint {path} has parameters this model lacks (different LoRA config?): {missing[:3]}")
    names = trained_names(policy)
    absent = [n for n in names if n not in state["params"]]
    if absent:
        raise ConfigError(f"checkpoint {path} lacks trained parameters of this model (different LoRA config?): "
                          f"{absent[:3]}")
    for n, v in state["params"].items():
        if tuple(v.shape) != tuple(params[n].shape):
            raise ConfigError(f"checkpoint {path}: parameter {n} has shape {tuple(v.shape)}, this model's is "
                              f"{tuple(params[n].shape)} (different model or model.lora_rank?)")
    # the optimizer's groups and settings against this run's, before anything of the run is changed
    checks.check_against_run(state, path, names, _inner_optimizer(policy).param_groups)
    set_model_state_dict(policy.model, {n: v.to(params[n].dtype) for n, v in state["params"].items()},
                         options=_options(strict=False))
    opt = state["optimizer"]
    if any(isinstance(k, int) for k in opt["state"]):  # format 2 numbered the parameters in optimizer order
        opt = {"state": {names[k]: v for k, v in opt["state"].items()},
               "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in opt["param_groups"]]}
    if not opt["state"]:  # saved before the first step: a fresh optimizer, as in the run that saved it
        _inner_optimizer(policy).state.clear()
    else:
        try:
            set_optimizer_state_dict(policy.model, _inner_optimizer(policy), opt, options=_options())
        except (ValueError, KeyError, IndexError, RuntimeError) as exc:
            raise CheckpointError(f"checkpoint {path}: the optimizer state does not fit this model ({exc})") from None
    if policy.ema is not None and state["ema"] is not None:
        shadow = []
        for p, s in zip(policy.trainable, state["ema"]["shadow"], strict=True):
            s = s.to(p.device, torch.float32)
            shadow.append(distribute_tensor(s, p.device_mesh, p.placements) if isinstance(p, DTensor) else s)
        policy.ema.load_state_dict({"shadow": shadow, "num_updates": state["ema"]["num_updates"]})
    if state.get("algorithm") is not None and hasattr(algorithm, "load_state_dict"):
        algorithm.load_state_dict(state["algorithm"])
    if state.get("algorithm_tensors") is not None and hasattr(algorithm, "load_tensor_state"):
        algorithm.load_tensor_state(state["algorithm_tensors"], policy)
    policy.steps = state["optimizer_steps"]


def find_resume(value: str, out_dir: Path, run_id: str | None = None, *,
                iterations: int | None = None) -> tuple[Path, dict[str, Any]]:
    """The checkpoint to resume from and its state; 'latest' skips incomplete or invalid checkpoints with a
    warning, and, given the folder's `run_id` (run.json), checkpoints of another run: 'latest' is the latest of
    this run. Given `iterations` (train.iterations), a checkpoint beyond it is invalid for this run."""
    if value != "latest":
        path = Path(value)
        if not path.is_dir():
            raise CheckpointError(f"train.resume_from: {value!r} is not a folder; give a checkpoint folder such "
                                  f"as {out_dir / 'checkpoints' / 'iter_000010'}, or 'latest'")
        state = read_checkpoint(path)
        checks.check_iterations(state, path, iterations)
        return path, state
    root = out_dir / "checkpoints"
    found = sorted((d for d in root.glob("iter_*") if re.fullmatch(r"iter_\d+", d.name) and d.is_dir()),
                   key=lambda d: int(d.name[5:]))
    for path in reversed(found):
        try:
            state = read_checkpoint(path)
        except CheckpointError as exc:
            warnings.warn(f"train.resume_from='latest': skipping {path}, which is incomplete or corrupt ({exc})",
                          stacklevel=2)
            continue
        if run_id is not None and state.get("run_id") not in (None, run_id):
            warnings.warn(f"train.resume_from='latest': skipping {path}, saved by another run ({state['run_id']}, "
                          f"this folder's run is {run_id})", stacklevel=2)
            continue
        try:
            checks.check_iterations(state, path, iterations)
        except CheckpointError as exc:
            warnings.warn(f"train.resume_from='latest': skipping {path} ({exc})", stacklevel=2)
            continue
        return path, state
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
    if state.get("algorithm_tensors"):
        tensors["algorithm"] = {k: v.detach().cpu().contiguous() for k, v in state["algorithm_tensors"].items()}
    meta: dict[str, Any] = {
        "format": CHECKPOINT_FORMAT, "iteration": state["iteration"], "optimizer_steps": state["optimizer_steps"],
        "history": state["history"], "algorithm": state.get("algorithm"), "config": state.get("config"),
        "run_id": state.get("run_id"),
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
        meta = safe_json(meta_file.read_bytes())  # duplicate keys and deep nesting refused
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(f"{meta_file} is not readable JSON ({exc}); the checkpoint is corrupt") from None
    if not isinstance(meta, dict) or meta.get("format") not in READABLE_FORMATS:
        raise CheckpointError(f"{meta_file}: unknown checkpoint format {meta.get('format') if isinstance(meta, dict) else meta!r}, "
                              f"expected one of {list(READABLE_FORMATS)}")
    checks.check_meta(meta, meta_file)  # types (a JSON true is no iteration), ranges, finite numbers
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
    # format 3 keys the optimizer state by parameter name (names hold dots; the state fields do not), format 2
    # by the parameter's index
    key_of = int if meta["format"] == 2 else str
    opt_state: dict[int | str, dict[str, Any]] = {}
    try:
        for key, val in tensors["optimizer"].items():
            param, name = key.rsplit(".", 1)
            opt_state.setdefault(key_of(param), {})[name] = val
        for param, scalars in meta["optimizer"].get("scalars", {}).items():
            opt_state.setdefault(key_of(param), {}).update(scalars)
    except ValueError:  # a key without a field name, or a format-2 index that is not a number
        raise CheckpointError(f"{path / 'optimizer.safetensors'}: optimizer state key {key!r} is not "
                              "'parameter.field'; the checkpoint is corrupt") from None
    groups = [{k: tuple(v) if k == "betas" else v for k, v in g.items()} for g in meta["optimizer"]["param_groups"]]
    ema = None
    if meta.get("ema") is not None:
        keys = [f"shadow.{i}" for i in range(meta["ema"]["size"])]
        if sorted(tensors.get("ema", {})) != sorted(keys):
            raise CheckpointError(f"{meta_file} records an EMA of {len(keys)} tensors but the ema file holds "
                                  f"{len(tensors.get('ema', {}))}; the checkpoint is corrupt")
        ema = {"shadow": [tensors["ema"][k] for k in keys], "num_updates": meta["ema"]["num_updates"]}
    state = {"iteration": meta["iteration"], "optimizer_steps": meta["optimizer_steps"], "params": tensors["params"],
             "optimizer": {"state": opt_state, "param_groups": groups}, "ema": ema,
             "algorithm": meta.get("algorithm"), "history": meta["history"], "config": meta.get("config"),
             "algorithm_tensors": tensors.get("algorithm"), "run_id": meta.get("run_id")}
    checks.check_tensors(state, path)  # every moment of its parameter's shape, finite, for a known parameter
    return state


def _read_legacy_checkpoint(file: Path) -> dict[str, Any]:
    """Checkpoints of format 1 (one torch.save file): tensors and plain containers only, so weights_only works."""
    try:  # weights_only: a truncated file or one holding pickled objects is refused, never unpickled
        state = load_torch_file(file, what="trainer checkpoint")
    except CheckpointError as exc:
        raise CheckpointError(f"{file} cannot be read: {exc}") from None
    required = ("iteration", "optimizer_steps", "params", "optimizer", "history")
    if not isinstance(state, dict) or any(k not in state for k in required):
        raise CheckpointError(f"{file} lacks {list(required)}; it is not a trainer checkpoint")
    opt = state["optimizer"]
    if not (isinstance(opt, dict) and isinstance(opt.get("state"), dict) and isinstance(opt.get("param_groups"), list)
            and isinstance(state["params"], dict) and all(isinstance(g, dict) for g in opt["param_groups"])):
        raise CheckpointError(f"{file}: 'optimizer' or 'params' has the wrong layout; it is not a trainer checkpoint")
    # the same checks as the JSON format (betas as JSON would hold them)
    checks.check_meta({"format": 2, "iteration": state["iteration"], "optimizer_steps": state["optimizer_steps"],
                       "history": state["history"], "files": {},
                       "optimizer": {"param_groups": [{**g, "betas": list(g["betas"])} if isinstance(
                           g.get("betas"), tuple) else g for g in opt["param_groups"]]}}, file)
    state = {"ema": None, "algorithm": None, "config": None, "algorithm_tensors": None, **state, "run_id": None}
    checks.check_tensors(state, file)
    return state
