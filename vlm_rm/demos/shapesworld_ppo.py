"""ShapesWorld VLM-RM demo: PPO trained only on a CLIP reward reaches a goal caption, on a CPU.

Steps: (1) how well the VLM reward tracks the true task over a grid of states, for alpha in
{0, 0.5, 1} (Pearson correlation with true success and with a graded truth, and the AUC of the
reward for telling success states from the others); (2) success rate of a uniformly random policy;
(3) PPO (stable-baselines3) on the VLM reward through `FrameInInfo` + `SB3VLMRewardVecEnv`, stopped
at a wall-clock limit; (4) success rate of the trained policy. Success is always judged from the
true state at the end of an episode. Results (with the machine load) go to a JSON file.

Tasks: `edit` (default) changes colour, shape and count of a scene until it matches the goal caption
(vlm_rm.shapes_edit_env); `region` moves one shape into a named region (vlm_rm.shapes_env), which
the ShapesWorld CLIP cannot reward because it does not know positions; use `--clip
assets/shapesworld/clip-regions` (fine-tuned on quadrant captions) for the region task.

    python -m vlm_rm.demos.shapesworld_ppo --clip assets/shapesworld/clip --out shapesworld_ppo.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_CLIP = "assets/shapesworld/clip"
DEFAULT_GOAL = "two purple squares"
ALPHAS = (0.0, 0.5, 1.0)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m vlm_rm.demos.shapesworld_ppo", description=__doc__.split("\n\n")[0])
    p.add_argument("--clip", default=DEFAULT_CLIP, help="CLIP checkpoint folder (transformers or open_clip layout)")
    p.add_argument("--random-clip", action="store_true", help="tiny random-weight CLIP (smoke tests only)")
    p.add_argument("--task", choices=("edit", "region"), default="edit")
    p.add_argument("--goal", default=DEFAULT_GOAL, help="edit task: goal caption of one coloured kind of object")
    p.add_argument("--shape", default="circle", help="region task: the moved shape")
    p.add_argument("--color", default="red", help="region task: its colour")
    p.add_argument("--region", default="top left", help="region task: the goal region")
    p.add_argument("--baseline", default=None,
                   help="baseline prompt defining d = g - b (default: 'a shape' for edit, 'a <color> <shape>' for region)")
    p.add_argument("--alpha", type=float, default=0.0, help="projection strength used for training")
    p.add_argument("--max-steps", type=int, default=12, help="edit task: episode length")
    p.add_argument("--timesteps", type=int, default=30000)
    p.add_argument("--time-limit", type=float, default=420.0, help="stop PPO after this many seconds")
    p.add_argument("--n-envs", type=int, default=8)
    p.add_argument("--grid", type=int, default=9, help="region task: grid side for the reward correlation")
    p.add_argument("--eval-episodes", type=int, default=500, help="episodes to evaluate the trained policy")
    p.add_argument("--random-episodes", type=int, default=4000, help="episodes to evaluate the random policy")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads; 1 on a shared CPU (2 threads under load measured 10-20x slower)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="shapesworld_ppo.json")
    return p


def load_reward(args: argparse.Namespace, goal: str, baseline: str):
    from vlm_rm.clip_reward import VLMRMReward, clip_embedder

    if args.random_clip:
        from mmreward.models.clip_score import TINY_CLIP_CONFIG

        embedder = clip_embedder("clipscore", weights="random", config=TINY_CLIP_CONFIG, resize_backend="torch")
    else:
        if not Path(args.clip).exists():
            raise SystemExit(f"--clip: no CLIP checkpoint at {args.clip}; build it with "
                             "`python -m mmreward.synthetic.build.build_assets --only clip` or copy it there")
        embedder = clip_embedder("clipscore", checkpoint=args.clip, resize_backend="torch")
    return VLMRMReward(embedder, goal, baseline, alpha=0.0)


def make_env_factory(args: argparse.Namespace) -> Callable[[], Any]:
    if args.task == "edit":
        from vlm_rm.shapes_edit_env import ShapesEditEnv

        return lambda: ShapesEditEnv(args.goal, max_steps=args.max_steps)
    from vlm_rm.shapes_env import ShapesWorldEnv

    return lambda: ShapesWorldEnv(args.shape, args.color, args.region)


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(a, b)[0, 1]) if a.std() > 0 and b.std() > 0 else float("nan")


def auc(scores: np.ndarray, positive: np.ndarray) -> float:
    """P(score of a success state > score of a failure state), ties counting one half."""
    pos, neg = scores[positive == 1], scores[positive == 0]
    if len(pos) == 0 or len(neg) == 0:
        return float("nan")
    diff = pos[:, None] - neg[None, :]
    return float((diff > 0).mean() + 0.5 * (diff == 0).mean())


def reward_correlations(env: Any, reward: Any, grid: int) -> dict[str, Any]:
    from vlm_rm.envs import score_frames

    frames, success, graded = env.truth_grid(grid)
    out: dict[str, Any] = {"states": len(frames), "success_states": int(success.sum())}
    for alpha in ALPHAS:
        reward.alpha = alpha
        r = score_frames(reward, frames)
        out[str(alpha)] = {
            "pearson_vs_success": pearson(r, success),
            "pearson_vs_graded": pearson(r, graded),
            "auc_success": auc(r, success),
            "mean_success": float(r[success == 1].mean()) if success.any() else float("nan"),
            "mean_failure": float(r[success == 0].mean()) if (success == 0).any() else float("nan"),
        }
    return out


def evaluate(env: Any, policy: Callable[[np.ndarray], int], episodes: int, seed: int) -> dict[str, float]:
    """Success rate (from the true state at the last step) with its binomial standard error."""
    wins = 0
    for ep in range(episodes):
        obs, info = env.reset(seed=seed + ep)
        done = False
        while not done:
            obs, _, terminated, truncated, info = env.step(policy(obs))
            done = terminated or truncated
        wins += int(info["success"])
    p = wins / episodes
    return {"success": p, "se": math.sqrt(p * (1 - p) / episodes), "episodes": episodes}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import DummyVecEnv

    from vlm_rm.envs import FrameInInfo, SB3VLMRewardVecEnv
    from vlm_rm.reward_shaping import RewardPostprocess

    torch.set_num_threads(args.threads)
    t0 = time.time()
    load_start = os.getloadavg()
    make_env = make_env_factory(args)
    env = make_env()
    baseline = args.baseline or ("a shape" if args.task == "edit" else f"a {args.color} {args.shape}")
    reward = load_reward(args, env.goal_prompt, baseline)
    result: dict[str, Any] = {
        "task": args.task, "goal": env.goal_prompt, "baseline": baseline, "train_alpha": args.alpha,
        "clip": "random tiny" if args.random_clip else str(args.clip), "torch_threads": args.threads,
        "cpu_count": os.cpu_count(), "correlations": reward_correlations(env, reward, args.grid),
    }
    reward.alpha = args.alpha
    rng = np.random.default_rng(args.seed)
    n_actions = int(env.action_space.n)
    result["random"] = evaluate(env, lambda _: int(rng.integers(n_actions)), args.random_episodes, 10_000)

    venv = SB3VLMRewardVecEnv(DummyVecEnv([lambda: FrameInInfo(make_env()) for _ in range(args.n_envs)]),
                              reward, RewardPostprocess(standardize=True))
    deadline = time.time() + args.time_limit

    class StopAtDeadline(BaseCallback):
        def _on_step(self) -> bool:
            return time.time() < deadline

    model = PPO("MlpPolicy", venv, n_steps=64, batch_size=128, n_epochs=6, learning_rate=1e-3, gamma=0.9,
                ent_coef=0.01, seed=args.seed, device="cpu", verbose=0)
    t1 = time.time()
    model.learn(total_timesteps=args.timesteps, callback=StopAtDeadline())
    result["ppo_timesteps"] = int(model.num_timesteps)
    result["train_seconds"] = round(time.time() - t1, 1)
    result["ppo"] = evaluate(env, lambda o: int(model.predict(o, deterministic=True)[0]), args.eval_episodes, 20_000)
    result["ratio_vs_random"] = result["ppo"]["success"] / max(result["random"]["success"], 1e-9)
    result["total_seconds"] = round(time.time() - t0, 1)
    result["load_average_1min"] = {"start": round(load_start[0], 2), "end": round(os.getloadavg()[0], 2)}
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
