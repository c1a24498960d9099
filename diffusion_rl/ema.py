"""Exponential moving average of the trained parameters."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


class EMA:
    """Exponential moving average of the trained parameters (Flow-GRPO's: decay warm-up
    min(decay, (1 + n) / (10 + n)), updated every `every` optimizer steps)."""

    def __init__(self, params: list[torch.nn.Parameter], decay: float, every: int) -> None:
        self.params = params
        self.decay, self.every = decay, every
        self.shadow = [p.detach().clone().float() for p in params]
        self.num_updates = 0

    @torch.no_grad()
    def step(self, optimizer_step: int) -> None:
        if optimizer_step % self.every:
            return
        d = min(self.decay, (1 + self.num_updates) / (10 + self.num_updates))
        for s, p in zip(self.shadow, self.params):
            s.mul_(d).add_(p.detach().float(), alpha=1 - d)
        self.num_updates += 1

    @contextlib.contextmanager
    def swapped(self) -> Iterator[None]:
        """Use the EMA weights inside the block."""
        backup = [p.detach().clone() for p in self.params]
        with torch.no_grad():
            for p, s in zip(self.params, self.shadow):
                p.copy_(s.to(p.dtype))
        try:
            yield
        finally:
            with torch.no_grad():
                for p, b in zip(self.params, backup):
                    p.copy_(b)

    def state_dict(self) -> dict:
        return {"shadow": self.shadow, "num_updates": self.num_updates}

    def load_state_dict(self, state: dict) -> None:
        self.shadow = [s.clone() for s in state["shadow"]]
        self.num_updates = state["num_updates"]
