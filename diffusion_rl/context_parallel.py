"""Context (sequence) parallelism for the video transformers, through diffusers' own `ContextParallelConfig` and
`ModelMixin.enable_parallelism` (diffusers 0.42.1, experimental there): every process of the group holds the
whole transformer and the same batch, each transformer block sees 1/degree of the token sequence, and attention
exchanges the rest (Ulysses: all-to-all over heads; ring: key/value blocks passed around). A clip whose
activations do not fit one device then fits `degree` of them.

Configured by `model.context_parallel: {ulysses_degree: N}` (or `ring_degree`; their product is the group size,
the degree) and applied to the adapter's transformer(s) when the run builds its adapter
(`diffusion_rl.pipelines.adapter_for_config`), so every rollout forward pass is split. The number of processes is
any multiple of the degree: groups x degree processes form a (groups, ring, ulysses) device mesh (`device_mesh`)
handed to diffusers as `ContextParallelConfig(mesh=...)`; processes g x degree ... (g + 1) x degree - 1 are group g
(8 processes with ulysses_degree 4: {0..3} and {4..7}), and the groups are data parallel to each other. See
docs/context_parallel.md for the launch lines and what is measured.

What runs where (measured in this repository, tests/diffusion_rl/test_context_parallel.py):
- Ulysses on CPU with gloo (2 processes, tiny Wan): the rollout equals the one-process rollout bit for bit. diffusers
  computes the group's device as `rank % torch.accelerator.device_count()`, which divides by zero on a host
  without an accelerator (diffusers/models/modeling_utils.py `_resolve_parallel_config`, 0.42.1); on CPU this module
  supplies a device count of 1 for that one call, which names device "cpu" and changes nothing else.
- Ring on CPU: refused. diffusers' ring attention merges blocks by their log-sum-exp, which the native (SDPA)
  backend does not return ("Native attention does not support return_lse=True"): it needs a flash or sage
  attention backend, i.e. GPUs.
- Training (`diffusion-rl train`) under Ulysses, for the methods in `TRAINABLE` (GRPO, GRPO-Guard,
  Pref-GRPO, DDPO, DiffusionNFT); the others are refused with a typed error (`check_training`). Three things make
  a CP run's update equal the one-process update on the same samples:
  1. the processes of a group own the same samples: the sample assignment runs over data ranks
     `process_index // degree` of `num_processes // degree` (`sample_assignment.DataRank`), the mesh's rows, so
     each group is one data-parallel rank;
  2. gathers keep one copy of each group's samples (the leader's: `sample_assignment.CanonicalOrder`, the
     evaluation scores);
  3. each process's parameter gradient is only its sequence shard's share (measured on the tiny Wan: the two
     shares sum to the one-process gradient; diffusers gathers the output for every process and the backward
     of that gather keeps the process's own slice), and DDP averages over all processes (its default group, not
     the mesh): `Policy.step` multiplies the averaged gradient by the degree before clipping. With G groups of
     d processes that is d / (G d) x (sum over groups of the sum of each group's d shares) = the mean over groups
     of each group's whole-clip gradient, the data-parallel mean of a one-process-per-rank run, so the update
     equals the one-process update on the same global samples (tests/diffusion_rl/test_context_parallel.py: the
     trained LoRA equals the one-process run's, with 1 group of 2 processes and with 2 groups of 2).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from mmreward.errors import ConfigError

KEYS = ("ulysses_degree", "ring_degree")
# the device mesh's dimensions: data-parallel groups, then diffusers' two sequence dimensions ("ring", "ulysses" are
# the names ContextParallelConfig.setup indexes; the data dimension's name is ours, nothing in diffusers reads it)
MESH_DIMS = ("dp", "ring", "ulysses")
# the methods whose training under context parallelism is tested against one process, each end to end
# (tests/diffusion_rl/test_context_parallel.py); the others count, gather or select per process in code not
# checked with a group's duplicated samples (DPO pair counts, RAFT winners, DRaFT's reward gather, ...): refused
TRAINABLE = ("grpo", "grpo_guard", "pref_grpo", "ddpo", "nft")


def parse_settings(value: dict[str, Any] | None) -> dict[str, int] | None:
    """`model.context_parallel` checked: known keys, whole degrees >= 1, a group of at least 2 processes."""
    if value is None:
        return None
    unknown = sorted(set(value) - set(KEYS))
    if unknown:
        raise ConfigError(f"model.context_parallel has unknown keys {unknown}: use {list(KEYS)}, e.g. "
                          "{ulysses_degree: 2}")
    out = {}
    for key in KEYS:
        degree = value.get(key, 1)
        if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
            raise ConfigError(f"model.context_parallel.{key} must be a whole number >= 1, got {degree!r}")
        out[key] = degree
    if out["ulysses_degree"] * out["ring_degree"] < 2:
        raise ConfigError("model.context_parallel needs ulysses_degree or ring_degree > 1 (the processes that split "
                          "each clip's tokens); leave model.context_parallel unset for none")
    return out


def degree(settings: dict[str, int] | None) -> int:
    """The number of processes that split each clip (1 without context parallelism)."""
    return 1 if settings is None else settings["ulysses_degree"] * settings["ring_degree"]


def check_training(cfg: Any, accelerator: Any = None) -> None:
    """A typed ConfigError when `cfg` (a RunConfig; config.py imports this module, so the type is not named here)
    trains under context parallelism in a way this repository does not support:
    a method outside `TRAINABLE`, or DeepSpeed (its engine owns the gradients that `Policy.step` rescales)."""
    if cfg.model.context_parallel is None:
        return
    if cfg.train.algorithm not in TRAINABLE:
        raise ConfigError(f"train.algorithm {cfg.train.algorithm!r} is not supported under "
                          f"model.context_parallel; supported: {', '.join(TRAINABLE)} (see docs/context_parallel.md), or leave "
                          "model.context_parallel unset")
    if accelerator is not None and str(getattr(accelerator, "distributed_type", "")).endswith("DEEPSPEED"):
        raise ConfigError("model.context_parallel does not train under DeepSpeed (its engine owns the gradients, "
                          "which each context-parallel process holds only a share of): launch with DDP or FSDP")


@contextlib.contextmanager
def _cpu_device_index() -> Iterator[None]:
    """diffusers 0.42.1 picks the group's device as rank % torch.accelerator.device_count(), a division by zero
    without an accelerator: report one device (index 0 of "cpu") while it does so, only on such a host."""
    if torch.accelerator.device_count() > 0:
        yield
        return
    original = torch.accelerator.device_count
    torch.accelerator.device_count = lambda: 1
    try:
        yield
    finally:
        torch.accelerator.device_count = original


def _transformers(adapter: Any) -> list[Any]:
    """The diffusers models the adapter samples with (Wan 2.2: both experts)."""
    from diffusers.models.modeling_utils import ModelMixin

    denoiser = adapter.denoiser
    if isinstance(denoiser, ModelMixin):
        return [denoiser]
    return [m for m in denoiser.children() if isinstance(m, ModelMixin)]


def device_mesh(settings: dict[str, int], world_size: int, device_type: str) -> Any:
    """The (data, ring, ulysses) device mesh of `world_size` processes, dimensions named `MESH_DIMS`, that diffusers
    takes as `ContextParallelConfig(mesh=...)`: it splits the sequence over the sub-mesh `mesh["ring", "ulysses"]`
    and runs the all-to-all / ring exchanges on `mesh["ulysses"]` / `mesh["ring"]` process groups
    (diffusers/models/_modeling_parallel.py `ContextParallelConfig.setup`, 0.42.1), so every context-parallel
    group is one row of the mesh. Row-major: group g is processes g x degree ... (g + 1) x degree - 1, the
    processes `sample_assignment.DataRank` gives data rank g. A collective call: every process makes it."""
    from torch.distributed.device_mesh import init_device_mesh

    size = degree(settings)
    if world_size % size:
        raise ConfigError(f"{world_size} processes cannot form context-parallel groups of {size}")
    shape = (world_size // size, settings["ring_degree"], settings["ulysses_degree"])
    return init_device_mesh(device_type, shape, mesh_dim_names=MESH_DIMS)


def enable_context_parallel(adapter: Any, settings: dict[str, int] | None) -> None:
    """Split every forward pass of the adapter's video transformer(s) over this process's context-parallel group
    (a row of `device_mesh`, see the module docstring); a typed ConfigError when the run cannot (one process, a
    number of processes that is not a multiple of the degree, an image family, a transformer without diffusers'
    context-parallel plan, ring attention on CPU). A collective call: every process makes it."""
    if settings is None:
        return
    import torch.distributed as dist

    size = degree(settings)
    if not (dist.is_available() and dist.is_initialized()):
        raise ConfigError(f"model.context_parallel splits each clip over {size} processes, but this is one "
                          f"process: launch with `torchrun --nproc_per_node {size}` (or accelerate launch "
                          f"--num_processes {size}), see docs/context_parallel.md")
    world = dist.get_world_size()
    if world % size:
        raise ConfigError(f"model.context_parallel's groups ({size} processes each: ulysses "
                          f"{settings['ulysses_degree']} x ring {settings['ring_degree']}) cannot divide {world} "
                          f"processes: launch a multiple of {size} (groups x {size}), see docs/context_parallel.md")
    if adapter.modality != "video":
        raise ConfigError(f"model.context_parallel is for video transformers; a {adapter.family} pipeline makes "
                          "images: leave model.context_parallel unset")
    on_cpu = adapter.device.type == "cpu"
    if settings["ring_degree"] > 1 and on_cpu:
        raise ConfigError("model.context_parallel.ring_degree needs GPUs: diffusers' ring attention merges blocks by "
                          "their log-sum-exp, which CPU (native SDPA) attention does not return; use "
                          "ulysses_degree on CPU, or a flash/sage attention backend on GPUs")
    models = _transformers(adapter)
    missing = [type(m).__name__ for m in models if getattr(m, "_cp_plan", None) is None]
    if not models or missing:
        raise ConfigError(f"model.context_parallel: {missing or type(adapter.denoiser).__name__} has no "
                          f"context-parallel plan in diffusers (no `_cp_plan`), so a {adapter.family} pipeline "
                          "cannot split its sequence; leave model.context_parallel unset")
    from diffusers import ContextParallelConfig

    mesh = device_mesh(settings, world, adapter.device.type)  # one mesh (one set of process groups) for all experts
    for model in models:
        config = ContextParallelConfig(**settings, mesh=mesh)
        with _cpu_device_index() if on_cpu else contextlib.nullcontext():
            model.enable_parallelism(config=config)
