"""Checks of a training checkpoint before anything of it is used: resume never trusts the file.

`check_meta` and `check_tensors` look at a checkpoint on its own (types, ranges, finite numbers, every
optimizer moment against its parameter) and run inside `read_checkpoint`, so `resume_from=latest` skips a bad
checkpoint with a warning and falls back to the one before. `check_against_run` compares it with the freshly
built run (the same parameters, optimizer groups and settings) before `restore` changes anything.

Every problem is a CheckpointError naming the file and the field, e.g. `optimizer.param_groups[0].lr`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from mmreward.errors import CheckpointError

TENSOR_FILES = ("params", "optimizer", "ema", "algorithm")  # the safetensors files a checkpoint may list
_NUMERIC_GROUP_KEYS = {"lr": (0.0, None), "initial_lr": (0.0, None), "eps": (0.0, None),
                       "weight_decay": (0.0, None)}


def _bad(where: Path, field: str, problem: str) -> CheckpointError:
    return CheckpointError(f"{where}: '{field}' {problem}; the checkpoint is corrupt or was edited by hand")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)  # JSON true is a bool, and bool is an int in Python


def _is_real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _int(where: Path, field: str, v: Any, low: int = 0, high: int | None = None) -> int:
    if not _is_int(v):
        raise _bad(where, field, f"must be an integer, got {v!r}")
    if v < low or (high is not None and v > high):
        raise _bad(where, field, f"must be in [{low}, {'inf' if high is None else high}], got {v}")
    return v


def _real(where: Path, field: str, v: Any, low: float | None = None, high: float | None = None,
          open_high: bool = False) -> float:
    if not _is_real(v):
        raise _bad(where, field, f"must be a finite number, got {v!r}")
    if (low is not None and v < low) or (high is not None and (v >= high if open_high else v > high)):
        raise _bad(where, field, f"is out of range ({v})")
    return float(v)


def check_meta(meta: Mapping[str, Any], where: Path) -> None:
    """trainer_state.json on its own: every field's type and range (format already checked)."""
    iteration = _int(where, "iteration", meta.get("iteration"))
    _int(where, "optimizer_steps", meta.get("optimizer_steps"))
    run_id = meta.get("run_id")
    if run_id is not None and not isinstance(run_id, str):
        raise _bad(where, "run_id", f"must be a string, got {run_id!r}")
    history = meta.get("history")
    if not isinstance(history, list):
        raise _bad(where, "history", "must be a list of metric records")
    for i, rec in enumerate(history):
        if not isinstance(rec, dict):
            raise _bad(where, f"history[{i}]", f"must be an object, got {type(rec).__name__}")
        _int(where, f"history[{i}].iteration", rec.get("iteration"), 0, iteration)
    for key in ("config", "algorithm"):
        if meta.get(key) is not None and not isinstance(meta[key], dict):
            raise _bad(where, key, f"must be an object, got {type(meta[key]).__name__}")
    files = meta.get("files")
    if not isinstance(files, dict):
        raise _bad(where, "files", "must be an object of file name -> size")
    allowed = {f"{n}.safetensors" for n in TENSOR_FILES}
    for name, size in files.items():
        if name not in allowed:  # also keeps a path such as '../x' from being opened
            raise _bad(where, f"files.{name}", f"is not one of {sorted(allowed)}")
        _int(where, f"files.{name}", size)
    ema = meta.get("ema")
    if ema is not None:
        if not isinstance(ema, dict):
            raise _bad(where, "ema", "must be an object or null")
        _int(where, "ema.num_updates", ema.get("num_updates"))
        _int(where, "ema.size", ema.get("size"))
    _check_optimizer_meta(meta.get("optimizer"), where, name_keyed=meta.get("format") != 2)
    _check_algorithm(meta.get("algorithm"), where)


def _check_optimizer_meta(opt: Any, where: Path, *, name_keyed: bool) -> None:
    if not isinstance(opt, dict):
        raise _bad(where, "optimizer", "must be an object")
    groups = opt.get("param_groups")
    if not isinstance(groups, list) or not groups:
        raise _bad(where, "optimizer.param_groups", "must be a non-empty list")
    for i, g in enumerate(groups):
        field = f"optimizer.param_groups[{i}]"
        if not isinstance(g, dict):
            raise _bad(where, field, "must be an object")
        params = g.get("params")
        ok = (lambda p: isinstance(p, str)) if name_keyed else _is_int
        if not isinstance(params, list) or not all(ok(p) for p in params):
            raise _bad(where, f"{field}.params", f"must be a list of parameter {'names' if name_keyed else 'indices'}")
        if "lr" not in g:
            raise _bad(where, f"{field}.lr", "is missing")
        for key, (low, high) in _NUMERIC_GROUP_KEYS.items():
            if key in g:
                _real(where, f"{field}.{key}", g[key], low, high)
        if "betas" in g:
            b = g["betas"]
            if not isinstance(b, list) or len(b) != 2:
                raise _bad(where, f"{field}.betas", f"must be a list of two numbers, got {b!r}")
            for j, v in enumerate(b):
                _real(where, f"{field}.betas[{j}]", v, 0.0, 1.0, open_high=True)
    scalars = opt.get("scalars", {})
    if not isinstance(scalars, dict):
        raise _bad(where, "optimizer.scalars", "must be an object")
    for param, values in scalars.items():
        if not isinstance(values, dict):
            raise _bad(where, f"optimizer.scalars.{param}", "must be an object")
        for key, v in values.items():
            _real(where, f"optimizer.scalars.{param}.{key}", v, 0.0)


def _check_algorithm(algo: Any, where: Path) -> None:
    """The algorithms' JSON state: DDPO's per-prompt reward buffers are the only one."""
    if not isinstance(algo, dict) or algo.get("tracker") is None:
        return
    t = algo["tracker"]
    if not isinstance(t, dict):
        raise _bad(where, "algorithm.tracker", "must be an object")
    size = _int(where, "algorithm.tracker.buffer_size", t.get("buffer_size"), 1)
    _int(where, "algorithm.tracker.min_count", t.get("min_count"), 1)
    _real(where, "algorithm.tracker.eps", t.get("eps"), 0.0)
    buffers = t.get("buffers")
    if not isinstance(buffers, dict):
        raise _bad(where, "algorithm.tracker.buffers", "must be an object of prompt -> rewards")
    for prompt, values in buffers.items():
        field = f"algorithm.tracker.buffers[{prompt[:40]!r}]"
        if not isinstance(values, list) or len(values) > size:
            raise _bad(where, field, f"must be a list of at most {size} rewards")
        for v in values:
            _real(where, field, v)


_MOMENT_FIELDS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer")


def check_tensors(state: Mapping[str, Any], where: Path) -> None:
    """The tensors against each other: parameters floating and finite; every optimizer entry for a known
    parameter, each moment of its parameter's shape, finite (second moments >= 0); the groups naming each
    parameter once; EMA shadows one per trained parameter, of its shape."""
    params: Mapping[str, torch.Tensor] = state["params"]
    for n, v in params.items():
        if not (v.is_floating_point() and bool(torch.isfinite(v).all())):
            raise _bad(where, f"params.{n}", f"must be finite floating-point values (dtype {v.dtype})")
    groups = state["optimizer"]["param_groups"]
    order = [p for g in groups for p in g["params"]]
    if len(set(order)) != len(order):
        raise _bad(where, "optimizer.param_groups", "name a parameter more than once")
    if all(isinstance(p, str) for p in order):
        unknown = [p for p in order if p not in params]
        if unknown or len(order) != len(params):
            raise _bad(where, "optimizer.param_groups", f"do not name the checkpoint's parameters "
                                                         f"(unknown: {unknown[:3]}, {len(order)} vs {len(params)})")
        shape_of = {p: tuple(params[p].shape) for p in order}
    else:  # format 2: indices into the trained parameters, in order; the names come from the live run
        if sorted(order) != list(range(len(params))):
            raise _bad(where, "optimizer.param_groups", f"must number the {len(params)} parameters 0..{len(params) - 1}")
        shape_of = {}
    for key, per_param in state["optimizer"]["state"].items():
        if key not in order:
            raise _bad(where, f"optimizer.state.{key}", "is for a parameter the checkpoint does not train")
        for name, v in per_param.items():
            field = f"optimizer.state.{key}.{name}"
            if not isinstance(v, torch.Tensor):
                continue  # JSON scalars, checked with the metadata
            if not (v.is_floating_point() and bool(torch.isfinite(v).all())):
                raise _bad(where, field, f"must be finite floating-point values (dtype {v.dtype})")
            if name == "step":
                if v.numel() != 1 or float(v) < 0:
                    raise _bad(where, field, "must be one count >= 0")
            elif name in _MOMENT_FIELDS:
                if key in shape_of and tuple(v.shape) != shape_of[key]:
                    raise _bad(where, field, f"has shape {tuple(v.shape)}, its parameter {tuple(shape_of[key])}")
                if name.endswith("_sq") and bool((v < 0).any()):
                    raise _bad(where, field, "holds negative second moments")
            else:
                raise _bad(where, field, f"is not an optimizer field this trainer writes ({', '.join(_MOMENT_FIELDS)}, "
                                         "step)")
    ema = state.get("ema")
    if ema is not None:
        shadow = ema["shadow"]
        if len(shadow) != len(order):
            raise _bad(where, "ema.size", f"is {len(shadow)}, the checkpoint trains {len(order)} parameters")
        for i, (s, p) in enumerate(zip(shadow, order, strict=True)):
            if not (s.is_floating_point() and bool(torch.isfinite(s).all())):
                raise _bad(where, f"ema.shadow.{i}", "must be finite floating-point values")
            if p in shape_of and tuple(s.shape) != shape_of[p]:
                raise _bad(where, f"ema.shadow.{i}", f"has shape {tuple(s.shape)}, its parameter {shape_of[p]}")


def check_iterations(state: Mapping[str, Any], where: Path, iterations: int | None) -> None:
    """A run resumes only from a checkpoint it has not passed: iteration <= train.iterations."""
    if iterations is not None and state["iteration"] > iterations:
        raise CheckpointError(f"{where}: 'iteration' is {state['iteration']}, beyond this run's train.iterations="
                              f"{iterations}; raise train.iterations or resume from an earlier checkpoint")


def check_against_run(state: Mapping[str, Any], where: Path, names: list[str],
                      live_groups: list[dict[str, Any]]) -> None:
    """The checkpoint against the run being resumed: the optimizer's groups name the same parameters in the
    same order, with the same setting names and values of the same kinds."""
    groups = state["optimizer"]["param_groups"]
    if len(groups) != len(live_groups):
        raise _bad(where, "optimizer.param_groups", f"has {len(groups)} groups, this run's optimizer "
                                                    f"{len(live_groups)}")
    flat = [p for g in groups for p in g["params"]]
    as_names = [names[p] if isinstance(p, int) and 0 <= p < len(names) else p for p in flat]
    if as_names != names:
        raise _bad(where, "optimizer.param_groups", "do not list this run's trained parameters in its order "
                                                    "(different model or LoRA config?)")
    for i, (g, live) in enumerate(zip(groups, live_groups, strict=True)):
        keys, live_keys = set(g) - {"params"}, set(live) - {"params"}
        if keys - live_keys:  # settings a newer torch added are fine missing: torch fills in their defaults
            raise _bad(where, f"optimizer.param_groups[{i}]", f"has settings {sorted(keys - live_keys)} that this "
                                                              "run's optimizer does not know")
        for key in sorted(keys):
            v, ref = g[key], live[key]
            field = f"optimizer.param_groups[{i}].{key}"
            if isinstance(ref, bool) or ref is None:
                if not (v is None or isinstance(v, bool)):
                    raise _bad(where, field, f"must be true, false or null, got {v!r}")
            elif isinstance(ref, (int, float)):
                _real(where, field, v)
            elif isinstance(ref, (tuple, list)):
                if not isinstance(v, (tuple, list)) or len(v) != len(ref) or not all(_is_real(x) for x in v):
                    raise _bad(where, field, f"must be {len(ref)} finite numbers, got {v!r}")
            elif isinstance(ref, torch.Tensor):  # a tensor lr (capturable optimizers): a finite number
                _real(where, field, v)
            elif type(v) is not type(ref):
                raise _bad(where, field, f"must be a {type(ref).__name__}, got {v!r}")
