"""The online reward-hacking monitor: held-out "gold" rewards on the evaluation samples, and an alarm when the
training reward rises while a gold reward falls.

At every evaluation the trainer already samples the held-out prompts with fixed noise; the monitor reuses those
images (no extra sampling):

    gold/<name>          each reward of `log.gold_rewards` (any registry reward, e.g. the exact checker
                         `shapes-eval`), mean and standard error over the evaluation samples
    guard/train_reward   the training objective on the same images: sum_i w_i * mean r_i (reward.rewards)
    diversity            mean pairwise RMS pixel distance between the samples of one prompt, averaged over the
                         pairs of all prompts (0: every prompt collapsed to one image; images in [0, 1])
    hacking_alarm        1.0 at an evaluation where the rule below fires, else 0.0

The rule (`guard.window` W, `guard.tolerance`, `guard.min_rise`): over the last W
evaluations fit a least-squares line to the training reward and to each gold reward against the iteration, and
take the fitted change across the window, slope * (last iteration - first iteration). The alarm fires when the
training reward's fitted change exceeds `guard.min_rise` while some gold reward's fitted change is below
`-guard.tolerance`. A fitted line over W points is less sensitive to one noisy evaluation than a difference of
two, and the tolerance is in the gold reward's own units (for an accuracy, about 1-2 standard errors of the
evaluation).

What an alarm does (`guard.mode`): `warn` logs a line and the metric; `stop` also ends training after
this iteration (the final checkpoint and export are written as usual); `rollback` also restores the best-by-gold
checkpoint (weights, optimizer and EMA) and stops, so the final checkpoint and `final/` export hold the model
with the best gold score seen. We stop rather than continue at a lower learning rate: the reward that was
hacked is still the objective, and continuing would find the same exploit again, only later.
While the monitor is on, the best-by-gold checkpoint (the first gold reward) is kept at
`checkpoints/best_gold`, written atomically like every checkpoint. Everything the rule needs is read back from
the run's metric history, so a resumed run alarms exactly where an uninterrupted one does.

Under data parallelism every process takes the same decision from the same numbers, with no extra collective:
`evaluate` gathers the scores of all processes before the monitor sees them, and the history is the same on
every process (logged by all, restored from one checkpoint on resume). Saving the best-by-gold checkpoint is
a collective (every process gathers, the main process writes), and on a rollback every process loads it, so
all of them stop at the alarm's iteration holding the same weights (tests/diffusion_rl/test_hacking_guard_distributed.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mmreward.errors import ConfigError

GUARD_MODES = ("off", "warn", "stop", "rollback")
BEST_CHECKPOINT = "best_gold"
DIVERSITY_KEY = "_diversity"  # evaluate() reports it as eval/_diversity; the monitor logs it as `diversity`


def fitted_change(xs: Sequence[float], ys: Sequence[float]) -> float:
    """slope * (xs[-1] - xs[0]) of the least-squares line through (xs, ys): the change over the window that the
    trend explains. 0 for fewer than two points or no spread in xs."""
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return 0.0
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return slope * (xs[-1] - xs[0])


def falling_gold(iterations: Sequence[float], train_reward: Sequence[float], gold: Mapping[str, Sequence[float]],
                 window: int, tolerance: float, min_rise: float = 0.0) -> list[str]:
    """The gold rewards whose trend falls by more than `tolerance` over the last `window` evaluations while the
    training reward's trend rises by more than `min_rise`; empty (no alarm) with fewer than `window` evaluations."""
    if len(iterations) < window:
        return []
    xs = list(iterations)[-window:]
    if fitted_change(xs, list(train_reward)[-window:]) <= min_rise:
        return []
    return [name for name, ys in gold.items() if fitted_change(xs, list(ys)[-window:]) < -tolerance]


def pairwise_distances(images: torch.Tensor, groups: Sequence[int]) -> list[float]:
    """RMS pixel distance sqrt(mean((x_i - x_j)^2)) of every pair i < j of images in the same group.

    Pixel distance needs no model and reads the same for images and video frames at any resolution (a
    CLIP-embedding distance would depend on which CLIP). Under data parallelism each process passes the
    samples it drew, so the logged mean is over the pairs each process holds: an unbiased estimate of the
    mean over all pairs, since evaluation samples are dealt to processes regardless of their content."""
    flat = images.detach().float().flatten(1)
    ids = torch.as_tensor(list(groups))
    out: list[float] = []
    for g in ids.unique().tolist():
        x = flat[ids == g]
        if len(x) < 2:
            continue
        d2 = torch.cdist(x.double(), x.double()).square() / x.shape[1]
        i, j = torch.triu_indices(len(x), len(x), offset=1)
        out += d2[i, j].clamp_min(0).sqrt().tolist()
    return out


def check_gold_rewards(cfg: Any) -> None:
    """An UnknownRewardError that names `log.gold_rewards` for a gold reward the registry does not know."""
    from mmreward import registry
    from mmreward.checkpoints import parse_source
    from mmreward.errors import UnknownRewardError

    for name in cfg.log.gold_rewards:
        src = parse_source(name, registry.specs())
        if src.kind != "name":  # a folder, hub id or class: resolved (and checked) when it is loaded
            continue
        try:
            registry.get_spec(src.value)
        except UnknownRewardError as exc:
            raise UnknownRewardError(f"log.gold_rewards: {exc}") from None


@dataclass(frozen=True)
class GuardActions:
    """What the guard may do to the run, given by the trainer (the guard never sees the trainer)."""

    save: Callable[[Path], Any]  # write the training state to a checkpoint folder (every process calls it)
    restore: Callable[[Path], None]  # load a checkpoint's weights, optimizer and EMA into the run (every process)
    say: Callable[[str], None] = print  # one line to the user (the main process's)


class HackingGuard:
    """Adds gold/*, guard/train_reward and hacking_alarm to an evaluation's metrics and acts on an alarm."""

    def __init__(self, cfg: Any, n_eval_prompts: int, out_dir: Path | None = None,
                 actions: GuardActions | None = None) -> None:
        if cfg.log.gold_rewards and n_eval_prompts == 0:
            raise ConfigError(f"log.gold_rewards {cfg.log.gold_rewards} are scored on the evaluation samples, but "
                              "prompts.eval is empty; give held-out prompts or leave log.gold_rewards empty")
        self.cfg = cfg
        self.gold = list(cfg.log.gold_rewards)
        self.mode = cfg.guard.mode
        self.stopped = False  # set on an alarm in 'stop' / 'rollback' mode: the trainer ends the run
        self.out_dir, self.actions = out_dir, actions
        if self.mode != "off" and self.gold and (out_dir is None or actions is None):
            raise ConfigError(f"guard.mode={self.mode!r} keeps and restores the best-by-gold checkpoint: "
                              "the guard needs the run's output folder and actions")

    @property
    def active(self) -> bool:
        return bool(self.gold)

    def until_stopped(self, iterations: Iterable[int]) -> Iterator[int]:
        """`iterations` until an alarm in 'stop' or 'rollback' mode: the iteration that raised it is the last."""
        for it in iterations:
            if self.stopped:
                return
            yield it

    def observe(self, out: dict[str, float], iteration: int, history: Sequence[dict[str, Any]]) -> dict[str, float]:
        """`out` (one evaluation's metrics at `iteration`, after the logged `history`) with the monitor's
        metrics; may save the best-by-gold checkpoint, and on an alarm warn, stop or roll back."""
        if not self.active or not out:
            return out
        for suffix in ("", "_se"):
            if f"eval/{DIVERSITY_KEY}{suffix}" in out:
                out[f"diversity{suffix}"] = out.pop(f"eval/{DIVERSITY_KEY}{suffix}")
        for name in self.gold:
            if f"eval/{name}" in out:
                out[f"gold/{name}"] = out[f"eval/{name}"]
                out[f"gold/{name}_se"] = out.get(f"eval/{name}_se", 0.0)
        weights = self.cfg.reward.rewards
        if all(f"eval/{n}" in out for n in weights):
            out["guard/train_reward"] = sum(w * out[f"eval/{n}"] for n, w in weights.items())
        if self.mode == "off":
            return out
        assert self.actions is not None and self.out_dir is not None  # checked in __init__
        past = [h for h in history if "guard/train_reward" in h]
        points = [*past, {"iteration": iteration, **out}]
        first = f"gold/{self.gold[0]}"
        best = max((h for h in past if first in h), key=lambda h: h[first], default=None)
        if first in out and (best is None or out[first] > best[first]):
            self.actions.save(self.best_path(self.out_dir))
            best = points[-1]
        if best is not None:
            out["guard/best_iteration"] = float(best["iteration"])
        gold = {g: [h.get(f"gold/{g}", math.nan) for h in points] for g in self.gold}
        falling = falling_gold([h["iteration"] for h in points], [h.get("guard/train_reward", math.nan) for h in points],
                               gold, self.cfg.guard.window, self.cfg.guard.tolerance,
                               self.cfg.guard.min_rise)
        out["hacking_alarm"] = float(bool(falling))
        if not falling:
            return out
        self.actions.say(
            f"reward-hacking alarm at iteration {iteration}: the training reward rose over the last "
            f"{self.cfg.guard.window} evaluations while {', '.join(falling)} fell by more than "
            f"{self.cfg.guard.tolerance:g} ({self.mode})")
        if self.mode in ("stop", "rollback"):
            self.stopped = True
        if self.mode == "rollback" and best is not None:
            self.actions.restore(self.best_path(self.out_dir))
            out["guard/rolled_back_to"] = float(best["iteration"])
        return out

    @staticmethod
    def best_path(out_dir: Path) -> Path:
        return Path(out_dir) / "checkpoints" / BEST_CHECKPOINT
