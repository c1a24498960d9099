"""Which samples an iteration draws and which process owns them, so that a W-process run with the same
global batch equals a 1-process run.

- iteration `it` draws `prompts_per_iteration` prompt *slots* with a generator seeded by (seed, it);
  process r owns slots r, r + W, r + 2W, ... and all `group_size` samples of each, so groups are never
  split and Pref-GRPO's pairs never cross processes;
- rewards are gathered and put in canonical (slot, sample) order before normalisation (`CanonicalOrder`);
- minibatch m holds local groups [m L/M, (m+1) L/M), whose union over processes is global slots
  [m P/M, (m+1) P/M); each process averages its loss and DDP averages the gradients.

Under context parallelism (`model.context_parallel`, diffusion_rl/context_parallel.py) the `degree` processes of
a group split each clip's tokens, so they must all hold the *same* samples: "process r of W" above is then the
data rank `process_index // degree` of `num_processes // degree` data-parallel groups (`DataRank`), and a
gather keeps one copy of each group's samples (its leader's, `CanonicalOrder`, `one_copy_per_group`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from diffusion_rl.config import SampleConfig, TrainConfig
from diffusion_rl.seeding import noise_key
from mmreward.errors import ConfigError

# the last counter of each draw, so no two kinds of draw share a seed
PROMPT_DRAW, TRAIN_STEP_DRAW, SDE_WINDOW_DRAW = -2, -3, -4


@dataclass(frozen=True)
class DataRank:
    """This process's place among the data-parallel groups: `rank` of `world`. Without context parallelism
    (`cp_degree` 1) that is the process index of the number of processes; with it, the `cp_degree` consecutive
    processes of a group (a row of `context_parallel.device_mesh`, sequence dimensions last) share one data rank, and the
    first of them is its `leader`, the one whose copy of the group's results a gather keeps."""

    rank: int
    world: int
    cp_degree: int = 1
    leader: bool = True

    @classmethod
    def of(cls, accelerator: Any, cp_degree: int = 1) -> DataRank:
        if cp_degree < 1 or accelerator.num_processes % cp_degree:
            raise ConfigError(f"{accelerator.num_processes} processes cannot form context-parallel groups of "
                              f"{cp_degree}: launch a multiple of {cp_degree} processes")
        index = accelerator.process_index
        return cls(index // cp_degree, accelerator.num_processes // cp_degree, cp_degree, index % cp_degree == 0)

    @property
    def items(self) -> slice:
        """This data rank's share of a list split round-robin (the evaluation's samples)."""
        return slice(self.rank, None, self.world)


def one_copy_per_group(gathered: torch.Tensor, num_processes: int, cp_degree: int) -> torch.Tensor:
    """Of an all-gather of `num_processes` equal chunks in rank order, the chunks of each context-parallel group's
    leader (ranks 0, cp_degree, 2 cp_degree, ...): the others are copies of the same samples."""
    if cp_degree == 1:
        return gathered
    if len(gathered) % num_processes:
        raise ValueError(f"an all-gather of {len(gathered)} rows is not {num_processes} equal chunks")
    chunks = gathered.reshape(num_processes, len(gathered) // num_processes, *gathered.shape[1:])
    return chunks[::cp_degree].flatten(0, 1)


def check_divisible(sample: SampleConfig, train: TrainConfig, num_processes: int, cp_degree: int = 1) -> None:
    """Every data-parallel group (a process, or a context-parallel group of `cp_degree` processes) holds whole
    groups, and every minibatch whole groups."""
    if num_processes % cp_degree:
        raise ConfigError(f"{num_processes} processes cannot form context-parallel groups of {cp_degree} "
                          f"(model.context_parallel): launch a multiple of {cp_degree} processes")
    data_world = num_processes // cp_degree
    holders = (f"data-parallel groups ({data_world}: {num_processes} processes / context-parallel degree "
               f"{cp_degree})" if cp_degree > 1 else f"processes ({num_processes})")
    if sample.prompts_per_iteration % data_world:
        raise ConfigError(
            f"sample.prompts_per_iteration ({sample.prompts_per_iteration}) must be divisible by the number "
            f"of {holders} so that every process holds whole groups"
        )
    local_groups = sample.prompts_per_iteration // data_world
    if local_groups % train.num_minibatches:
        raise ConfigError(
            f"each process holds {local_groups} groups, not divisible by train.num_minibatches "
            f"({train.num_minibatches})"
        )


def prompts_for_iteration(train_prompts: list[str], count: int, seed: int, it: int) -> list[str]:
    """The prompt of each of the iteration's `count` slots: shuffled passes over the prompt list."""
    gen = torch.Generator().manual_seed(noise_key(seed, it, PROMPT_DRAW))
    n = len(train_prompts)
    order = torch.cat([torch.randperm(n, generator=gen) for _ in range(math.ceil(count / n))])[:count]
    return [train_prompts[i] for i in order.tolist()]


def local_samples(count: int, group_size: int, data_rank: int, data_world: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(slots, sample_ids) of this data rank's samples (`DataRank`), (N,) each, grouped by slot."""
    slots = torch.tensor(list(range(data_rank, count, data_world))).repeat_interleave(group_size)
    return slots, torch.arange(group_size).repeat(len(slots) // group_size)


def sde_steps(sample: SampleConfig, seed: int, it: int) -> list[int] | None:
    """The steps sampled with the SDE kernel (None: all): a fixed window, or a random sub-window per iteration."""
    if sample.sde_window is None and sample.sde_window_size is None:
        return None
    lo, hi = sample.sde_window or (0, sample.num_steps)
    if sample.sde_window_size is None:
        return list(range(lo, hi))
    if sample.sde_window_shift_every is not None:
        # MixGRPO's progressive window: shift by `stride` every `shift_every` iterations, shrinking at the end
        # of the range and rolling back to its start (the reference's roll_back, without its empty window)
        start = lo + (it // sample.sde_window_shift_every) * sample.sde_window_stride % (hi - lo)
        return list(range(start, min(start + sample.sde_window_size, hi)))
    gen = torch.Generator().manual_seed(noise_key(seed, it, SDE_WINDOW_DRAW))
    start = lo + int(torch.randint(0, hi - lo - sample.sde_window_size + 1, (1,), generator=gen))
    return list(range(start, start + sample.sde_window_size))


def select_train_steps(train: TrainConfig, it: int, mask: torch.Tensor, slots: torch.Tensor,
                       sample_ids: torch.Tensor) -> torch.Tensor:
    """(N, k) long: the SDE steps trained for each sample, the first k or k at random per sample."""
    sde = mask.nonzero().flatten()
    k = max(1, int(len(sde) * train.timestep_fraction))
    if train.timestep_selection == "first":
        return sde[:k].expand(len(slots), k).clone()
    rows = []
    gen = torch.Generator()
    for p, i in zip(slots.tolist(), sample_ids.tolist()):
        gen.manual_seed(noise_key(train.seed, it, p, i, TRAIN_STEP_DRAW))
        rows.append(sde[torch.randperm(len(sde), generator=gen)[:k]])
    return torch.stack(rows)


class CanonicalOrder:
    """Moves per-sample tensors between this process's order and the canonical (slot, sample) order of all
    processes' samples. Constructing it is a collective operation (every process must call it). Under context
    parallelism (`cp_degree` > 1) the processes of a group hold the same samples; only the group leader's rows
    are kept, so every sample appears once."""

    def __init__(self, accelerator: Any, slots: torch.Tensor, sample_ids: torch.Tensor, group_size: int,
                 cp_degree: int = 1) -> None:
        self.accelerator, self.cp_degree = accelerator, cp_degree
        self.local_keys = (slots * group_size + sample_ids).to(accelerator.device)
        self.all_keys = self._one_copy(accelerator.gather(self.local_keys))

    def _one_copy(self, gathered: torch.Tensor) -> torch.Tensor:
        return one_copy_per_group(gathered, self.accelerator.num_processes, self.cp_degree)

    def gather(self, local: torch.Tensor) -> torch.Tensor:
        """All processes' values of a per-sample tensor, in canonical order."""
        gathered = self._one_copy(self.accelerator.gather(local.to(self.accelerator.device).contiguous()))
        out = torch.empty_like(gathered)
        out[self.all_keys] = gathered
        return out

    def local(self, canonical: torch.Tensor) -> torch.Tensor:
        """This process's rows of a canonical-order tensor."""
        return canonical.to(self.accelerator.device)[self.local_keys]
