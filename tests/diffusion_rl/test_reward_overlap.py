"""reward.overlap: rollout chunk k is scored in a background thread while chunk k+1 is generated, and the run
is the synchronous run bit for bit (the tiny ShapesWorld SD3 generator, shapes-eval, 2 GRPO iterations)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
GENERATOR = ROOT / "assets" / "shapesworld" / "generator"
pytestmark = pytest.mark.skipif(not (GENERATOR / "model_index.json").is_file(),
                                reason="assets/shapesworld/generator is not built")

# 4 samples per iteration in 2 rollout chunks of 2, so there is a chunk to overlap with
SMALL = ["train.iterations=2", "sample.prompts_per_iteration=2", "sample.group_size=2", "sample.batch_size=2",
         "train.micro_batch_size=4", "sample.num_steps=2", "sample.sde_window=[0, 1]", "train.num_minibatches=1",
         "log.progress=false", "log.eval_every=0", "prompts.eval=null", "log.save_every=0"]


def _trainer(out: Path, *extra: str):
    from diffusion_rl.config import load_config
    from diffusion_rl.trainer import Trainer

    return Trainer(load_config(ROOT / "configs" / "shapes_grpo.yaml", [*SMALL, f"log.output_dir={out}", *extra]))


class _Timeline:
    """Wraps a reward: records (thread, start, end) of each call and sleeps so that the calls are long."""

    def __init__(self, reward, sleep_s: float) -> None:
        self.reward, self.sleep_s, self.calls = reward, sleep_s, []
        self.accepts_metadata = getattr(reward, "accepts_metadata", False)

    def score(self, prompts, media, **kw):
        t0 = time.perf_counter()
        time.sleep(self.sleep_s)
        out = self.reward.score(prompts, media, **kw)
        self.calls.append((threading.current_thread().name, t0, time.perf_counter(), len(prompts)))
        return out


def _run(trainer, iterations: int = 2) -> list[dict]:
    return [trainer.train_iteration(it) for it in range(iterations)]


def test_overlapped_run_equals_the_synchronous_run_bit_for_bit(tmp_path):
    sync, over = _trainer(tmp_path / "sync"), _trainer(tmp_path / "over", "reward.overlap=true")
    assert not sync.scorer.overlap and over.scorer.overlap
    timeline = _Timeline(over.rewards.train["shapes-eval"], sleep_s=0.05)
    over.rewards.train["shapes-eval"] = timeline  # the scorer reads the same dict
    before = {n: p.detach().clone() for n, p in sync.policy.model.named_parameters()}
    m_sync, m_over = _run(sync), _run(over)
    for a, b in zip(m_sync, m_over):
        assert a["reward/shapes-eval"] == b["reward/shapes-eval"] and a["adv/abs_mean"] == b["adv/abs_mean"]
        assert 0 < a["time/reward_blocking_s"] < a["time/rollout_s"]
    params_sync = dict(sync.policy.model.named_parameters())
    for name, p in over.policy.model.named_parameters():
        assert torch.equal(p, params_sync[name]), name
    # the weights moved (equality of two untouched models would prove nothing)
    assert any(not torch.equal(p, params_sync[n]) for n, p in before.items())
    # scored in the background thread, two chunks of 2 per iteration, in order
    assert [c[0].startswith("reward-overlap") for c in timeline.calls] == [True] * 4
    assert [c[3] for c in timeline.calls] == [2, 2, 2, 2]


def test_scoring_of_chunk_k_runs_while_chunk_k_plus_1_is_generated(tmp_path, monkeypatch):
    import diffusion_rl.trainer as trainer_mod

    spans = []
    real = trainer_mod.rollout

    def timed_rollout(*args, **kwargs):
        t0 = time.perf_counter()
        # a chunk's generation made >= 0.1 s long: the overlap (chunk 0 scored while chunk 1 is generated) is then
        # far longer than a thread's wake-up on a loaded machine; at its bare ~30 ms, the two timing assertions
        # below had ~30 ms of slack against two thread hand-offs (GIL switch interval 5 ms, plus scheduling)
        time.sleep(0.1)
        out = real(*args, **kwargs)
        spans.append((t0, time.perf_counter()))
        return out

    monkeypatch.setattr(trainer_mod, "rollout", timed_rollout)
    over = _trainer(tmp_path / "over", "reward.overlap=true", "train.iterations=1")
    # a reward slower than the chunk's generation, so that the overlap cannot be an accident of timing
    rollout_s = _measure_rollout(over)
    timeline = _Timeline(over.rewards.train["shapes-eval"], sleep_s=max(0.2, 2 * rollout_s))
    over.rewards.train["shapes-eval"] = timeline
    spans.clear()
    over.collect(0)
    (g0, g1), (s0, s1) = spans, timeline.calls
    assert s0[1] < g1[1] and g1[0] < s0[2], "chunk 0 was not scored while chunk 1 was generated"
    assert s0[1] >= g0[1] and s1[1] >= g1[1]  # a chunk is scored after it exists
    # the trainer was held up for less than the scoring took (time/reward_blocking_s)
    assert 0 < over.scorer.last_blocking_s < (s0[2] - s0[1]) + (s1[2] - s1[1])


def _measure_rollout(trainer) -> float:
    t0 = time.perf_counter()
    trainer.collect(0)
    return (time.perf_counter() - t0) / 2


def test_a_failing_reward_fails_the_iteration_with_its_own_error(tmp_path):
    from mmreward.errors import RewardValueError

    over = _trainer(tmp_path / "over", "reward.overlap=true")

    class Failing:
        accepts_metadata = False

        def score(self, prompts, media, **kw):
            raise RewardValueError("reward gave NaN")

    over.rewards.train["shapes-eval"] = Failing()
    with pytest.raises(RewardValueError, match="reward gave NaN"):
        over.collect(0)
    # the scorer is usable again: the next iteration scores normally
    over.rewards.train["shapes-eval"] = over.rewards.eval["shapes-eval"]
    batch, _ = over.collect(0)
    assert batch.rewards["shapes-eval"].shape == (4,)


@pytest.mark.slow
def test_reward_overlap_benchmark_reports_a_consistent_ratio(tmp_path):
    import json

    from benchmarks import reward_overlap

    out = tmp_path / "r.json"
    assert reward_overlap.main(["--iterations", "1", "--chunks", "2", "--chunk-size", "2", "--group-size", "2",
                                "--num-steps", "2", "--sleep-s", "0.3", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["weights_equal"] and r["rewards_equal"]
    assert r["ratio_overlap_over_sync"] == pytest.approx(r["iteration_s_overlap"] / r["iteration_s_sync"], rel=1e-12)
    # the synchronous trainer waits for both chunks' sleeps, the overlapped one for less
    assert r["reward_blocking_s_sync"] >= 2 * 0.3
    assert r["reward_blocking_s_overlap"] < r["reward_blocking_s_sync"]
