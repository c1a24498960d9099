"""Gymnasium wrappers that render frames and reward them with a VLM reward, in batches.

Three ways in, all keeping the environment's own reward in `info["env_reward"]` and the raw VLM
reward in `info["vlm_reward"]`, and never merging truncation into termination:

- `VLMRewardWrapper`: one env; renders after every step, before any reset, so the last frame of
  an episode is the true last state (VLM-RM's code scored the post-reset frame instead).
- `VLMRewardVectorWrapper`: a gymnasium vector env in NEXT_STEP autoreset mode; the sub-env frames
  of one step are scored as one batch. The step that performs a sub-env's reset is not a
  transition: its VLM reward is 0 and `info["autoreset"]` marks it.
- `FrameInInfo` + `SB3VLMRewardVecEnv`: for stable-baselines3, whose VecEnvs reset finished envs
  inside `step`; each env copies its rendered frame into `info["frame"]` before that reset, and the
  VecEnv wrapper scores all frames of the step in one batch (on- and off-policy algorithms alike).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from mmreward.errors import ConfigError, require
from vlm_rm.reward_shaping import RewardPostprocess

gym = require("gymnasium", "rl", "vlm_rm.envs")


def score_frames(reward: Any, frames: list[np.ndarray] | np.ndarray) -> np.ndarray:
    """Score a batch of HxWx3 uint8 frames with one reward call; returns float64 (N,)."""
    batch = torch.from_numpy(np.ascontiguousarray(np.stack(list(frames)))).permute(0, 3, 1, 2)
    return reward.score(None, batch).scores.double().cpu().numpy()


def _check_render_mode(env: Any) -> None:
    if getattr(env, "render_mode", None) != "rgb_array":
        raise ConfigError(
            f"env: VLM rewards score rendered frames, so the env needs render_mode='rgb_array'; got "
            f"{getattr(env, 'render_mode', None)!r}. Create it with gym.make(..., render_mode='rgb_array')"
        )


class FrameInInfo(gym.Wrapper):
    """Adds the frame rendered right after each step (before any reset) as `info['frame']`."""

    def __init__(self, env: Any) -> None:
        _check_render_mode(env)
        super().__init__(env)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        info = dict(info)
        info["frame"] = self.env.render()
        return obs, reward, terminated, truncated, info


class VLMRewardWrapper(gym.Wrapper):
    """Single env: reward = postprocess(VLM reward of the rendered frame, env reward)."""

    def __init__(self, env: Any, reward: Any, postprocess: RewardPostprocess | None = None) -> None:
        _check_render_mode(env)
        super().__init__(env)
        self.vlm_reward = reward
        self.postprocess = postprocess or RewardPostprocess()

    def step(self, action):
        obs, env_reward, terminated, truncated, info = self.env.step(action)
        r_vlm = score_frames(self.vlm_reward, [self.env.render()])
        info = dict(info)
        info["env_reward"] = float(env_reward)
        info["vlm_reward"] = float(r_vlm[0])
        reward = float(self.postprocess(r_vlm, np.array([env_reward]))[0])
        return obs, reward, terminated, truncated, info


class VLMRewardVectorWrapper(gym.vector.VectorWrapper):
    """Gymnasium vector env (NEXT_STEP or disabled autoreset): one batched reward call per step."""

    def __init__(self, env: Any, reward: Any, postprocess: RewardPostprocess | None = None) -> None:
        super().__init__(env)
        mode = env.metadata.get("autoreset_mode", gym.vector.AutoresetMode.NEXT_STEP)
        if mode == gym.vector.AutoresetMode.SAME_STEP:
            raise ConfigError(
                "env: autoreset_mode SAME_STEP resets sub-envs inside step(), so their last frames are lost; "
                "create the vector env with autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP"
            )
        if getattr(env, "render_mode", None) != "rgb_array":
            raise ConfigError(f"env: needs render_mode='rgb_array', got {getattr(env, 'render_mode', None)!r}")
        self.vlm_reward = reward
        self.postprocess = postprocess or RewardPostprocess()
        self._done = np.zeros(env.num_envs, dtype=bool)

    def reset(self, **kwargs):
        self._done[:] = False
        return self.env.reset(**kwargs)

    def step(self, actions):
        obs, env_reward, terminated, truncated, info = self.env.step(actions)
        frames = self.env.render()
        r_vlm = score_frames(self.vlm_reward, frames)
        resetting = self._done.copy()
        r_vlm = np.where(resetting, 0.0, r_vlm)
        reward = np.zeros(len(r_vlm))
        live = ~resetting  # reset steps are not transitions: keep them out of running statistics too
        if live.any():
            reward[live] = self.postprocess(r_vlm[live], np.asarray(env_reward, dtype=np.float64)[live])
        self._done = np.logical_or(terminated, truncated)
        info = dict(info)
        info["env_reward"] = np.asarray(env_reward, dtype=np.float64)
        info["vlm_reward"] = r_vlm
        info["autoreset"] = resetting
        return obs, reward, terminated, truncated, info


def SB3VLMRewardVecEnv(venv: Any, reward: Any, postprocess: RewardPostprocess | None = None):  # noqa: N802
    """Wrap a stable-baselines3 VecEnv whose sub-envs are wrapped in `FrameInInfo`."""
    vec_env = require("stable_baselines3.common.vec_env", "rl", "SB3VLMRewardVecEnv")

    class _Wrapper(vec_env.VecEnvWrapper):
        def __init__(self) -> None:
            super().__init__(venv)
            self.vlm_reward = reward
            self.postprocess = postprocess or RewardPostprocess()

        def reset(self):
            return self.venv.reset()

        def step_wait(self):
            obs, env_reward, dones, infos = self.venv.step_wait()
            if any("frame" not in i for i in infos):
                raise ConfigError("SB3VLMRewardVecEnv: wrap every sub-env in vlm_rm.envs.FrameInInfo before vectorising")
            r_vlm = score_frames(self.vlm_reward, [i.pop("frame") for i in infos])
            for i, info in enumerate(infos):
                info["env_reward"] = float(env_reward[i])
                info["vlm_reward"] = float(r_vlm[i])
            return obs, self.postprocess(r_vlm, env_reward).astype(np.float32), dones, infos

    return _Wrapper()
