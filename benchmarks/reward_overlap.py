"""GRPO iteration time with the reward scored synchronously vs overlapped with the rollout (reward.overlap),
measured in one run on the tiny ShapesWorld generator with a slow reward.

The reward is `mmreward.testing.slow:SleepingReward` around shapes-eval: shapes-eval's scores after a sleep
per call, a stand-in for a judge on another GPU or server (its time is spent outside the interpreter). The
rollout is `--chunks` chunks of `--chunk-size` samples; with overlap, chunk k is scored while chunk k+1 is
generated, so at best all but the last chunk's reward time hides behind the rollout:

    sync    ~ N (G + S) + U          overlapped ~ N max(G, S) + min(G, S) + U

(G, S: generation and scoring time of a chunk, U: the update). Both runs train side by side (iterations
interleaved, so a busy machine slows both alike), and must end with the same weights bit for bit.

    python benchmarks/reward_overlap.py                     # sleep = the measured generation time of a chunk
    python benchmarks/reward_overlap.py --sleep-s 0.5 --iterations 5 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):  # run as a script: the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

ROOT = Path(__file__).resolve().parents[1]
SLOW = "mmreward.testing.slow:SleepingReward"


def _trainer(out: Path, args: argparse.Namespace, overlap: bool, sleep_s: float):
    from diffusion_rl.config import load_config
    from diffusion_rl.trainer import Trainer

    n = args.chunks * args.chunk_size
    options = {SLOW: {"inner": "shapes-eval", "inner_options": {"mode": "soft"}, "sleep_s": sleep_s}}
    overrides = [f"reward.rewards={json.dumps({SLOW: 1.0})}", f"reward.options={json.dumps(options)}",
                 f"reward.overlap={str(overlap).lower()}", f"train.iterations={args.iterations + 1}",
                 f"sample.prompts_per_iteration={n // args.group_size}", f"sample.group_size={args.group_size}",
                 f"sample.batch_size={args.chunk_size}", f"train.micro_batch_size={n}", "train.num_minibatches=1",
                 f"sample.num_steps={args.num_steps}", f"sample.sde_window=[0, {max(1, args.num_steps // 2)}]",
                 "log.progress=false", "log.eval_every=0", "prompts.eval=null", "log.save_every=0",
                 f"log.output_dir={out}"]
    return Trainer(load_config(ROOT / "configs" / "shapes_grpo.yaml", overrides))


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="reward_overlap_"))
    sync = _trainer(tmp / "sync", args, overlap=False, sleep_s=0.0)
    over = _trainer(tmp / "over", args, overlap=True, sleep_s=0.0)
    # iteration 0 warms both up (lazy kernels, caches) and, without sleeping, measures the rollout
    sync.train_iteration(0)
    over.train_iteration(0)
    t0 = time.perf_counter()
    sync.collect(0)
    gen_chunk_s = (time.perf_counter() - t0) / args.chunks
    sleep_s = gen_chunk_s if args.sleep_s == "auto" else float(args.sleep_s)
    for t in (sync, over):
        t.rewards.train[SLOW].sleep_s = sleep_s
    times: dict[str, list[float]] = {"sync": [], "overlap": []}
    rewards: dict[str, list[float]] = {"sync": [], "overlap": []}
    blocking: dict[str, list[float]] = {"sync": [], "overlap": []}
    for it in range(1, args.iterations + 1):
        for name, trainer in (("sync", sync), ("overlap", over)):
            t0 = time.perf_counter()
            metrics = trainer.train_iteration(it)
            times[name].append(time.perf_counter() - t0)
            rewards[name].append(metrics[f"reward/{SLOW}"])
            blocking[name].append(metrics["time/reward_blocking_s"])
    same = all(torch.equal(a, b) for a, b in zip(sync.policy.model.parameters(), over.policy.model.parameters()))
    s, o = statistics.median(times["sync"]), statistics.median(times["overlap"])
    reward_s = args.chunks * sleep_s
    return {"chunks": args.chunks, "chunk_size": args.chunk_size, "num_steps": args.num_steps,
            "generation_s_per_chunk": gen_chunk_s, "reward_sleep_s_per_chunk": sleep_s,
            "iteration_s_sync": s, "iteration_s_overlap": o, "ratio_overlap_over_sync": o / s,
            # from what the trainer measured itself waiting for (wall-time differences are noisier on a busy host)
            "reward_time_hidden_fraction": 1 - statistics.median(blocking["overlap"]) / statistics.median(blocking["sync"]),
            "iteration_s_saved_over_reward_s": (s - o) / reward_s if reward_s > 0 else 0.0,
            "best_possible_hidden_fraction": (args.chunks - 1) / args.chunks if sleep_s <= gen_chunk_s else None,
            "reward_blocking_s_sync": statistics.median(blocking["sync"]),
            "reward_blocking_s_overlap": statistics.median(blocking["overlap"]),
            "iterations": args.iterations, "times_sync": times["sync"], "times_overlap": times["overlap"],
            "rewards_equal": rewards["sync"] == rewards["overlap"], "weights_equal": same,
            "torch_threads": torch.get_num_threads()}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=5, help="timed iterations per mode (after one warm-up)")
    p.add_argument("--chunks", type=int, default=4, help="rollout chunks per iteration")
    p.add_argument("--chunk-size", type=int, default=4, help="samples per chunk (sample.batch_size)")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--num-steps", type=int, default=4)
    p.add_argument("--sleep-s", default="auto", help="reward sleep per chunk in seconds, or 'auto' (= generation)")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--json", type=Path, default=None)
    return p


def main_args(argv: Sequence[str]) -> argparse.Namespace:
    """The parsed options of `argv` (defaults for []), checked."""
    p = _parser()
    args = p.parse_args(argv)
    if (args.chunks * args.chunk_size) % args.group_size:
        p.error("--chunks x --chunk-size must be a multiple of --group-size")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = main_args(sys.argv[1:] if argv is None else argv)
    r = run(args)
    print(f"rollout: {r['chunks']} chunks x {r['chunk_size']} samples, {r['num_steps']} steps; generation "
          f"{r['generation_s_per_chunk']:.3f} s/chunk, reward {r['reward_sleep_s_per_chunk']:.3f} s/chunk")
    print(f"iteration (median of {r['iterations']}): synchronous {r['iteration_s_sync']:.3f} s, overlapped "
          f"{r['iteration_s_overlap']:.3f} s; ratio overlapped/synchronous = {r['ratio_overlap_over_sync']:.3f}")
    best = r["best_possible_hidden_fraction"]
    print(f"reward time hidden behind the rollout (1 - overlapped / synchronous reward_blocking_s): "
          f"{r['reward_time_hidden_fraction']:.0%}"
          + (f" (at best {best:.0%} with {r['chunks']} chunks)" if best is not None else ""))
    print(f"trainer held up by the reward (time/reward_blocking_s): synchronous {r['reward_blocking_s_sync']:.3f} s, "
          f"overlapped {r['reward_blocking_s_overlap']:.3f} s")
    print(f"same rewards: {r['rewards_equal']}; same weights bit for bit: {r['weights_equal']}")
    if args.json:
        args.json.write_text(json.dumps(r, indent=2))
    return 0 if r["weights_equal"] and r["rewards_equal"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
