"""The rewards a run trains on and evaluates with, loaded from `reward.*` of the config, and `RolloutScorer`,
which scores a rollout chunk by chunk, in the trainer's thread or (reward.overlap) in a background thread."""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from diffusion_rl.config import RunConfig
from diffusion_rl.reward_loading import load_reward


@dataclass
class RunRewards:
    train: dict[str, Any]  # name -> Reward, weighted by reward.rewards
    eval: dict[str, Any]  # name -> Reward scored on the held-out prompts
    pairwise: Any | None  # Pref-GRPO's judge

    def by_name(self) -> dict[str, Any]:
        """Every reward of the run, each role under its name (the judge as 'pairwise')."""
        return {**self.train, **self.eval, "pairwise": self.pairwise}


def load_run_rewards(cfg: RunConfig, device: Any) -> RunRewards:
    """Each distinct reward is loaded once, however many roles it plays."""
    from diffusion_rl.hacking_guard import check_gold_rewards

    check_gold_rewards(cfg)  # an unknown gold reward is named as such before anything loads
    remote: dict[str, Any] = {}
    if cfg.reward.remote:  # rewards on their own processes or machines (diffusion_rl.remote_rewards)
        from diffusion_rl.remote_rewards import connect_remote_rewards

        remote = connect_remote_rewards(cfg.reward, cfg.model.attention)

    def get(name: str) -> Any:
        return remote[name] if name in remote else load_reward(name, cfg.reward, device, cfg.model.attention)

    train = {name: get(name) for name in cfg.reward.rewards}
    eval_names = cfg.reward.eval_rewards or list(cfg.reward.rewards)
    if cfg.log.gold_rewards:  # the hacking monitor scores gold and training rewards on the evaluation samples
        eval_names = list(dict.fromkeys([*eval_names, *cfg.reward.rewards, *cfg.log.gold_rewards]))
    evals = {n: train.get(n) or get(n) for n in eval_names}
    pairwise = None
    if cfg.train.algorithm == "pref_grpo":
        name = cfg.reward.pairwise or next(iter(cfg.reward.rewards))
        pairwise = train.get(name) or get(name)
    return RunRewards(train, evals, pairwise)


class RolloutScorer:
    """Scores a rollout chunk by chunk: `begin()` opens an iteration's round, `submit` each chunk as it is
    generated, `result` returns every reward's scores in sample order.

    Scores do not depend on the schedule: every reward is called on the same chunks (the rollout's
    `sample.batch_size` chunks), in the same order, from one thread at a time, with or without `overlap`.
    With `overlap` the calls run in one background thread on CPU copies of the images, so scoring chunk k
    hides behind generating chunk k+1 (a reward on its own process or GPU, or one that releases the GIL,
    runs in parallel with the rollout). Nothing can be hidden across iterations: GRPO's update needs the
    advantages, hence every reward, of its own iteration's samples before the next rollout starts.
    """

    def __init__(self, rewards: Mapping[str, Any] | Callable[[], Mapping[str, Any]], metadata: Any = None, *,
                 overlap: bool = False) -> None:
        # a callable is read at every chunk: the trainer passes its current rewards (a user may swap them)
        self._rewards, self.metadata, self.overlap = rewards, metadata, overlap
        self._pool: ThreadPoolExecutor | None = None
        # seconds the last round held the trainer up: all of the scoring when synchronous, only the wait for
        # what the rollout did not hide when overlapped (the trainer logs it as time/reward_blocking_s)
        self.last_blocking_s = 0.0

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:  # one worker: the rewards see the chunks in order, never two at once
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reward-overlap")
            weakref.finalize(self, self._pool.shutdown, wait=False, cancel_futures=True)
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    @property
    def rewards(self) -> Mapping[str, Any]:
        return self._rewards() if callable(self._rewards) else self._rewards

    def begin(self) -> ScoringRound:
        return ScoringRound(self)

    def score_chunk(self, prompts: Sequence[str], images: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every reward's float32 scores of one chunk, on the CPU (the same call from either thread)."""
        from mmreward.prompt_sources import score_with_metadata

        rewards = self.rewards
        with torch.no_grad(), _side_stream(images, rewards.values()):
            return {name: score_with_metadata(r, list(prompts), images, self.metadata).scores.float().cpu()
                    for name, r in rewards.items()}


class ScoringRound:
    """One iteration's chunks: futures resolved in submission order by `result`."""

    def __init__(self, scorer: RolloutScorer) -> None:
        self.scorer = scorer
        self.futures: list[Future] = []
        self.blocking_s = 0.0

    def submit(self, prompts: Sequence[str], images: torch.Tensor) -> None:
        scorer = self.scorer
        if not scorer.overlap:
            t0 = time.perf_counter()
            fut: Future = Future()
            fut.set_result(scorer.score_chunk(prompts, images))
            self.futures.append(fut)
            self.blocking_s += time.perf_counter() - t0
            return
        for earlier in self.futures:  # a reward that already failed stops the rollout now, not at its end
            if earlier.done() and earlier.exception() is not None:
                self.cancel()
                raise earlier.exception()
        # a copy the rollout cannot touch any more (the pixels, not a view into the trajectory's buffer)
        copy = images.detach().to("cpu", copy=True)
        self.futures.append(scorer._executor().submit(scorer.score_chunk, list(prompts), copy))

    def result(self, device: Any) -> dict[str, torch.Tensor]:
        """name -> (N,) float32 scores of every submitted chunk, in order, on `device`."""
        t0 = time.perf_counter()
        try:
            parts = [f.result() for f in self.futures]
        except BaseException:
            self.cancel()
            raise
        if self.scorer.overlap:
            self.blocking_s += time.perf_counter() - t0
        self.scorer.last_blocking_s = self.blocking_s
        names = parts[0].keys() if parts else self.scorer.rewards.keys()
        return {n: torch.cat([p[n] for p in parts]).to(device) for n in names}

    @contextlib.contextmanager
    def cancel_on_error(self):
        """Around a rollout chunk: when it fails, the chunks queued for scoring are dropped first."""
        try:
            yield
        except BaseException:
            self.cancel()
            raise

    def cancel(self) -> None:
        """Drop the chunks not yet started and wait for the running one (the rewards are not thread-safe)."""
        for f in self.futures:
            f.cancel()
        for f in self.futures:
            if not f.cancelled():
                with contextlib.suppress(BaseException):
                    f.result()


def _side_stream(images: torch.Tensor, rewards: Any) -> contextlib.AbstractContextManager:
    """In the background thread, a reward on a CUDA device runs on its own stream, not behind the rollout's
    kernels on the default stream; its CPU scores are synchronised before they are returned."""
    import threading

    if threading.current_thread() is threading.main_thread() or not torch.cuda.is_available():
        return contextlib.nullcontext()
    for r in rewards:
        dev = getattr(r, "device", None)
        if isinstance(dev, torch.device) and dev.type == "cuda":
            return torch.cuda.stream(torch.cuda.Stream(dev))
    return contextlib.nullcontext()
