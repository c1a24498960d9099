"""The trainer: rollout -> score -> advantages -> PPO update, on accelerate.

Data layout (what makes a 2-process run equal a 1-process run with the same global batch):
- iteration `it` draws `prompts_per_iteration` prompt *slots* with a generator seeded by (seed, it);
  process r owns slots r, r + W, r + 2W, ... and all `group_size` samples of each, so groups are never
  split and Pref-GRPO's pairs never cross processes;
- the noise of sample i of slot p at step t is keyed by (seed, it, p, i, t) (`rollout.counter_noise`);
- rewards are gathered and put in canonical (slot, sample) order before normalisation;
- minibatch m holds local groups [m L/M, (m+1) L/M), whose union over processes is global slots
  [m P/M, (m+1) P/M); each process averages its loss and DDP averages the gradients.

Extension point for other methods (e.g. DRaFT in `algorithms/draft.py`): the trainer sets up the
accelerator, pipeline adapter, LoRA/full model, optimizer, EMA, rewards, logging and checkpoints; an
algorithm object needs only `advantages(trainer, batch)` for the shared PPO update, or may replace
the whole iteration by defining `iteration(trainer, it) -> dict` of metrics.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import re
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from diffusion_rl.config import RunConfig, save_config
from diffusion_rl.kernels import Kernel
from diffusion_rl.losses import gaussian_kl, normalized_log_ratio, ppo_clip_loss
from diffusion_rl.rollout import (
    PromptEmbeds,
    Trajectory,
    load_pipeline,
    make_adapter,
    noise_key,
    rollout,
    step_log_prob,
)
from mmreward.attention import apply_to_pipeline
from mmreward.errors import CheckpointError, ConfigError

CHECKPOINT_FORMAT = 2  # 1: one pickled trainer_state.pt; 2: safetensors + trainer_state.json

DEFAULT_LORA_TARGETS = {
    "sd": ["to_q", "to_k", "to_v", "to_out.0"],
    "sdxl": ["to_q", "to_k", "to_v", "to_out.0"],
    "sd3": ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"],
    "flux": ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"],
}
EVAL_EPOCH = 1_000_003  # the noise counter of evaluation samples: fixed, so every evaluation sees the same x_T


class ProbeError(RuntimeError):
    """The training path does not reproduce the rollout's log-probs: the update would be off-policy."""


@dataclass
class RolloutBatch:
    """One iteration's local samples."""

    traj: Trajectory
    prompts: list[str]  # (N,) the prompt of each sample
    slots: torch.Tensor  # (N,) long: the prompt slot (= group id)
    rewards: dict[str, torch.Tensor]  # name -> (N,)
    train_steps: torch.Tensor  # (N, k) long: the steps trained for each sample
    advantages: torch.Tensor | None = None

    @property
    def images(self) -> torch.Tensor:
        return self.traj.images


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
    def swapped(self):
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


class Trainer:
    def __init__(self, cfg: RunConfig, *, accelerator=None, pipeline=None, algorithm=None) -> None:
        from accelerate import Accelerator

        self.cfg = cfg
        self.accelerator = accelerator or Accelerator(mixed_precision=cfg.train.mixed_precision)
        acc = self.accelerator
        if cfg.sample.prompts_per_iteration % acc.num_processes:
            raise ConfigError(
                f"sample.prompts_per_iteration ({cfg.sample.prompts_per_iteration}) must be divisible by the number "
                f"of processes ({acc.num_processes}) so that every process holds whole groups"
            )
        local_groups = cfg.sample.prompts_per_iteration // acc.num_processes
        if local_groups % cfg.train.num_minibatches:
            raise ConfigError(
                f"each process holds {local_groups} groups, not divisible by train.num_minibatches "
                f"({cfg.train.num_minibatches})"
            )
        # everything a user can get wrong in the config is checked before the (slow) pipeline load
        self.train_prompts = cfg.prompts.load("train")
        if not self.train_prompts:
            raise ConfigError("prompts.train is empty: give a list of prompts or a text file with one per line")
        self.eval_prompts = cfg.prompts.load("eval")
        self.out_dir = Path(cfg.log.output_dir)
        resume = self._find_resume(cfg.train.resume_from) if cfg.train.resume_from else None
        self._setup_rewards()
        if pipeline is None:
            if not cfg.model.pretrained.strip():
                raise ConfigError("model.pretrained is empty: set it to a diffusers pipeline folder or hub id")
            pipeline = load_pipeline(cfg.model.pretrained, getattr(torch, cfg.model.dtype), acc.device,
                                     attention=cfg.model.attention)
        else:  # a pipeline passed in runs the configured attention too
            apply_to_pipeline(pipeline, cfg.model.attention)
        pipeline.set_progress_bar_config(disable=True)
        self.pipeline = pipeline
        self.adapter = make_adapter(pipeline, cfg.model.height, cfg.model.width, cfg.model.max_sequence_length)
        self.kernel = Kernel(cfg.sample.kernel, cfg.sample.noise_level, cfg.sample.log_prob_reduction)
        if algorithm is None:
            from diffusion_rl.algorithms import ALGORITHMS

            algorithm = ALGORITHMS[cfg.train.algorithm]()
        self.algorithm = algorithm
        self._setup_model()
        self._embed_cache: dict[str, PromptEmbeds] = {}
        self.iteration = 0
        self.optimizer_steps = 0
        self.history: list[dict[str, Any]] = []
        self.iteration_prompts: list[str] = []
        self._probed = False
        self._trackers: list[Any] = []
        if resume is not None:
            self._apply_state(*resume)
            self._rewrite_metrics()

    # ------------------------------------------------------------------------------------------
    # setup
    # ------------------------------------------------------------------------------------------
    def _setup_model(self) -> None:
        cfg, acc = self.cfg, self.accelerator
        model = self.adapter.denoiser
        self.ref_model = None
        if cfg.train.kl_beta > 0 and cfg.train.kl_reference == "copy":
            self.ref_model = copy.deepcopy(model).requires_grad_(False).eval()
        if cfg.model.gradient_checkpointing:
            model.enable_gradient_checkpointing()
        if cfg.model.lora:
            from mmreward.errors import DIFFUSION_EXTRA, require

            LoraConfig = require("peft", DIFFUSION_EXTRA, "model.lora").LoraConfig

            torch.manual_seed(cfg.train.seed)  # LoRA's random init must not depend on the process or run
            targets = cfg.model.lora_targets or DEFAULT_LORA_TARGETS[self.adapter.family]
            model.requires_grad_(False)
            model.add_adapter(LoraConfig(r=cfg.model.lora_rank, lora_alpha=cfg.model.lora_alpha,
                                         init_lora_weights="gaussian", target_modules=targets))
        else:
            model.requires_grad_(True)
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ConfigError(f"no trainable parameters: model.lora_targets {cfg.model.lora_targets} matched no module")
        for p in params:  # optimiser state and updates in fp32 even when the frozen weights are half precision
            p.data = p.data.float()
        self.trainable = params
        optimizer = torch.optim.AdamW(params, lr=cfg.train.learning_rate, betas=(cfg.train.adam_beta1, cfg.train.adam_beta2),
                                      weight_decay=cfg.train.weight_decay, eps=cfg.train.adam_eps)
        self.model, self.optimizer = acc.prepare(model, optimizer)
        self.ema = EMA(params, cfg.train.ema_decay, cfg.train.ema_update_every) if cfg.train.ema else None

    @property
    def unwrapped(self) -> torch.nn.Module:
        return self.accelerator.unwrap_model(self.model)

    def _load_reward(self, name: str):
        import mmreward

        # one attention choice for the run: the rewards follow model.attention unless their options say otherwise
        options = self.cfg.reward.options.get(name, {})
        try:
            return mmreward.load(name, device=self.accelerator.device,
                                 **{"attention": self.cfg.model.attention, **options})
        except TypeError as exc:
            from mmreward.errors import UnknownOptionError

            if not isinstance(exc, UnknownOptionError) and "keyword argument" not in str(exc):
                raise
            # a loader that does not take one of reward.options: a config error, not a crash
            raise ConfigError(f"reward.options.{name} = {options}: {exc}; remove the option or check its "
                              f"spelling in the reward's documentation") from None

    def _setup_rewards(self) -> None:
        cfg = self.cfg
        self.rewards = {name: self._load_reward(name) for name in cfg.reward.rewards}
        eval_names = cfg.reward.eval_rewards or list(cfg.reward.rewards)
        self.eval_rewards = {n: self.rewards.get(n) or self._load_reward(n) for n in eval_names}
        self.pairwise_reward = None
        if cfg.train.algorithm == "pref_grpo":
            name = cfg.reward.pairwise or next(iter(cfg.reward.rewards))
            self.pairwise_reward = self.rewards.get(name) or self._load_reward(name)

    def embeds_for(self, prompts: list[str]) -> PromptEmbeds:
        """Prompt embeddings, computed once per distinct prompt and cached (the text encoders are frozen).

        Each prompt is encoded on its own: a batched encoder's output depends in the last bits on the
        other rows of its batch, which would make a prompt's embedding depend on the iteration it was
        first seen in, and a resumed run (empty cache) differ from an uninterrupted one."""
        for p in dict.fromkeys(prompts):
            if p not in self._embed_cache:
                self._embed_cache[p] = self.adapter.encode([p])
        return PromptEmbeds.cat([self._embed_cache[p] for p in prompts])

    # ------------------------------------------------------------------------------------------
    # data layout
    # ------------------------------------------------------------------------------------------
    def prompts_for_iteration(self, it: int) -> list[str]:
        gen = torch.Generator().manual_seed(noise_key(self.cfg.train.seed, it, -2))
        n, p = len(self.train_prompts), self.cfg.sample.prompts_per_iteration
        order = torch.cat([torch.randperm(n, generator=gen) for _ in range(math.ceil(p / n))])[:p]
        return [self.train_prompts[i] for i in order.tolist()]

    def local_slots(self) -> list[int]:
        acc = self.accelerator
        return list(range(acc.process_index, self.cfg.sample.prompts_per_iteration, acc.num_processes))

    def sde_steps(self, it: int) -> list[int] | None:
        s = self.cfg.sample
        if s.sde_window is None and s.sde_window_size is None:
            return None
        lo, hi = s.sde_window or (0, s.num_steps)
        if s.sde_window_size is None:
            return list(range(lo, hi))
        gen = torch.Generator().manual_seed(noise_key(self.cfg.train.seed, it, -4))
        start = lo + int(torch.randint(0, hi - lo - s.sde_window_size + 1, (1,), generator=gen))
        return list(range(start, start + s.sde_window_size))

    def select_train_steps(self, it: int, mask: torch.Tensor, slots: torch.Tensor, sample_ids: torch.Tensor) -> torch.Tensor:
        sde = mask.nonzero().flatten()
        k = max(1, int(len(sde) * self.cfg.train.timestep_fraction))
        if self.cfg.train.timestep_selection == "first":
            return sde[:k].expand(len(slots), k).clone()
        rows = []
        gen = torch.Generator()
        for p, i in zip(slots.tolist(), sample_ids.tolist()):
            gen.manual_seed(noise_key(self.cfg.train.seed, it, p, i, -3))
            rows.append(sde[torch.randperm(len(sde), generator=gen)[:k]])
        return torch.stack(rows)

    def _keys(self, slots: torch.Tensor, sample_ids: torch.Tensor) -> torch.Tensor:
        return slots * self.cfg.sample.group_size + sample_ids

    def gather_canonical(self, local: torch.Tensor) -> torch.Tensor:
        """All processes' values of a per-sample tensor, in canonical (slot, sample) order."""
        gathered = self.accelerator.gather(local.to(self.accelerator.device).contiguous())
        out = torch.empty_like(gathered)
        out[self._all_keys] = gathered
        return out

    def local_part(self, canonical: torch.Tensor) -> torch.Tensor:
        return canonical.to(self.accelerator.device)[self._local_keys]

    # ------------------------------------------------------------------------------------------
    # one iteration
    # ------------------------------------------------------------------------------------------
    @torch.no_grad()
    def collect(self, it: int) -> RolloutBatch:
        cfg, acc = self.cfg, self.accelerator
        g = cfg.sample.group_size
        self.iteration_prompts = self.prompts_for_iteration(it)
        slots = torch.tensor(self.local_slots()).repeat_interleave(g)
        sample_ids = torch.arange(g).repeat(len(slots) // g)
        prompts = [self.iteration_prompts[s] for s in slots.tolist()]
        embeds = self.embeds_for(prompts)
        sde = self.sde_steps(it)
        parts = []
        model = self.unwrapped.eval()
        for start in range(0, len(slots), cfg.sample.batch_size):
            sl = slice(start, start + cfg.sample.batch_size)
            with acc.autocast():
                parts.append(rollout(
                    self.adapter, embeds.index(sl), slots[sl], sample_ids[sl], num_steps=cfg.sample.num_steps,
                    guidance_scale=cfg.sample.guidance_scale, kernel=self.kernel, sde_steps=sde, seed=cfg.train.seed,
                    epoch=it, share_initial_noise=cfg.sample.share_initial_noise, model=model,
                    store_means=cfg.train.ratio_norm,
                ))
        traj = Trajectory.cat(parts)
        rewards = {name: r.score(prompts, traj.images).scores.float().to(acc.device) for name, r in self.rewards.items()}
        self._local_keys = self._keys(slots, sample_ids).to(acc.device)
        self._all_keys = acc.gather(self._local_keys)
        train_steps = self.select_train_steps(it, traj.sde_mask, slots, sample_ids)
        return RolloutBatch(traj, prompts, slots.to(acc.device), rewards, train_steps)

    def _reference_mean(self, x, x_next, steps, schedule, embeds) -> torch.Tensor:
        cfg = self.cfg
        with torch.no_grad():
            if self.ref_model is not None:
                return step_log_prob(self.adapter, self.ref_model, x, x_next, steps, schedule, embeds,
                                     cfg.sample.guidance_scale, self.kernel).mean
            model = self.unwrapped
            model.disable_adapters()
            try:
                return step_log_prob(self.adapter, model, x, x_next, steps, schedule, embeds,
                                     cfg.sample.guidance_scale, self.kernel).mean
            finally:
                model.enable_adapters()

    def _check_probe(self, log_ratio: torch.Tensor) -> dict[str, float]:
        cfg = self.cfg.train
        floor = float(log_ratio.detach().abs().max())
        if cfg.probe != "off" and not self._probed:
            self._probed = True
            if floor > cfg.probe_tolerance:
                msg = (f"correctness probe: recomputed log-probs differ from the rollout's by up to {floor:.3g} "
                       f"(tolerance {cfg.probe_tolerance:g}) before any update, so the first PPO ratio is not 1. "
                       "Check that training uses the rollout's guidance scale, dtype and kernel.")
                if cfg.probe == "error":
                    raise ProbeError(msg)
                warnings.warn(msg, stacklevel=2)
            elif floor > 0.1 * cfg.clip_range:
                warnings.warn(f"correctness probe: the numerical noise floor of the log-ratio ({floor:.3g}) is "
                              f"above 10% of the clip range ({cfg.clip_range:g}); use fp32 or a larger clip range",
                              stacklevel=2)
        return {"probe/max_abs_log_ratio": floor}

    def _minibatch_step(self, batch: RolloutBatch, idx: torch.Tensor, probe: bool) -> dict[str, float]:
        cfg, acc = self.cfg, self.accelerator
        tc = cfg.train
        traj = batch.traj
        k = batch.train_steps.shape[1]
        chunks = list(torch.split(idx, tc.micro_batch_size))
        n_backward = len(chunks) * k
        stats: dict[str, list[float]] = {"loss": [], "policy_loss": [], "clip_fraction": [], "approx_kl": [], "kl": []}
        self.model.train()
        count = 0
        for chunk in chunks:
            adv = batch.advantages[chunk.to(batch.advantages.device)]
            emb = traj.embeds.index(chunk)
            rows = torch.arange(len(chunk))
            for s in range(k):
                steps = batch.train_steps[chunk, s]
                x = traj.latents[chunk][rows, steps]
                x_next = traj.latents[chunk][rows, steps + 1]
                old = traj.log_probs[chunk][rows, steps].to(acc.device)
                count += 1
                sync = count == n_backward
                ctx = contextlib.nullcontext() if sync else acc.no_sync(self.model)
                with ctx:
                    with acc.autocast():
                        res = step_log_prob(self.adapter, self.model, x, x_next, steps, traj.schedule, emb,
                                            cfg.sample.guidance_scale, self.kernel)
                    log_ratio = None
                    dt = (traj.schedule.b[steps] - traj.schedule.a[steps]).to(acc.device, torch.float32)
                    if tc.ratio_norm:
                        log_ratio = normalized_log_ratio(res.log_prob, old, res.mean, traj.means[chunk][rows, steps].to(acc.device), res.std)
                    if probe and count == 1:
                        for key, val in self._check_probe(res.log_prob - old).items():
                            stats.setdefault(key, []).append(val)
                    pl = ppo_clip_loss(res.log_prob, old, adv, tc.clip_range, log_ratio=log_ratio)
                    loss = pl.loss
                    if tc.ratio_norm and self.adapter.is_flow:
                        loss = loss / dt.abs().mean()  # Pref-GRPO's rationorm rescales by 1 / |dt|
                    if tc.kl_beta > 0:
                        ref_mean = self._reference_mean(x, x_next, steps, traj.schedule, emb)
                        kl = gaussian_kl(res.mean, ref_mean, res.std, mode=tc.kl_mode,
                                         dt=dt if self.adapter.is_flow else torch.ones_like(dt)).mean()
                        loss = loss + tc.kl_beta * kl
                        stats["kl"].append(float(kl.detach()))
                    acc.backward(loss / n_backward)
                stats["loss"].append(float(loss.detach()))
                stats["policy_loss"].append(float(pl.loss.detach()))
                stats["clip_fraction"].append(float(pl.clip_fraction))
                stats["approx_kl"].append(float(pl.approx_kl))
        grad_norm = None
        if tc.max_grad_norm is not None:
            grad_norm = acc.clip_grad_norm_(self.trainable, tc.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.optimizer_steps += 1
        if self.ema is not None:
            self.ema.step(self.optimizer_steps)
        out = {f"train/{k}": sum(v) / len(v) for k, v in stats.items() if v}
        if grad_norm is not None:
            out["train/grad_norm"] = float(grad_norm)
        return out

    def update(self, batch: RolloutBatch) -> dict[str, float]:
        tc = self.cfg.train
        g = self.cfg.sample.group_size
        n_groups = len(batch.slots) // g
        per = n_groups // tc.num_minibatches
        metrics: dict[str, list[float]] = {}
        for inner in range(tc.num_inner_epochs):
            for m in range(tc.num_minibatches):
                idx = torch.arange(m * per * g, (m + 1) * per * g)
                for key, val in self._minibatch_step(batch, idx, probe=(inner == 0 and m == 0)).items():
                    metrics.setdefault(key, []).append(val)
        return {k: sum(v) / len(v) for k, v in metrics.items()}

    def train_iteration(self, it: int) -> dict[str, float]:
        """Rollout, rewards, advantages and the PPO update of iteration `it`; returns its metrics."""
        if hasattr(self.algorithm, "iteration"):
            return self.algorithm.iteration(self, it)
        t0 = time.perf_counter()
        batch = self.collect(it)
        t1 = time.perf_counter()
        batch.advantages, metrics = self.algorithm.advantages(self, batch)
        metrics.update(self.update(batch))
        t2 = time.perf_counter()
        for name, r in batch.rewards.items():
            all_r = self.gather_canonical(r)
            metrics[f"reward/{name}"] = float(all_r.mean())
            metrics[f"reward/{name}_std"] = float(all_r.std()) if len(all_r) > 1 else 0.0
        metrics["adv/abs_mean"] = float(batch.advantages.abs().mean())
        metrics.update({"time/rollout_s": t1 - t0, "time/update_s": t2 - t1})
        self._last_batch = batch
        return metrics

    # ------------------------------------------------------------------------------------------
    # evaluation, logging, checkpoints
    # ------------------------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, tag: str = "") -> dict[str, float]:
        """Deterministic (ODE / DDIM eta=0) samples of the held-out prompts, scored by the eval rewards.
        Returns the mean and standard error of each reward; saves a grid on the main process."""
        if not self.eval_prompts:
            return {}
        cfg, acc = self.cfg, self.accelerator
        n = cfg.prompts.eval_samples_per_prompt
        items = [(p, i) for p in range(len(self.eval_prompts)) for i in range(n)]
        mine = items[acc.process_index :: acc.num_processes]
        model = self.unwrapped.eval()
        ctx = self.ema.swapped() if self.ema is not None else contextlib.nullcontext()
        scores: dict[str, list[float]] = {name: [] for name in self.eval_rewards}
        images_all = []
        with ctx:
            for start in range(0, len(mine), cfg.sample.batch_size):
                part = mine[start : start + cfg.sample.batch_size]
                prompts = [self.eval_prompts[p] for p, _ in part]
                with acc.autocast():
                    traj = rollout(self.adapter, self.embeds_for(prompts), [p for p, _ in part], [i for _, i in part],
                                   num_steps=cfg.sample.eval_num_steps or cfg.sample.num_steps,
                                   guidance_scale=cfg.sample.eval_guidance_scale or cfg.sample.guidance_scale,
                                   kernel=self.kernel.deterministic(), seed=cfg.train.seed, epoch=EVAL_EPOCH, model=model)
                for name, r in self.eval_rewards.items():
                    res = r.score(prompts, traj.images)
                    scores[name] += res.scores.float().cpu().tolist()
                    for key, val in res.details.items():  # e.g. ShapesEval's strict and partial accuracies
                        if val.ndim == 1 and len(val) == len(prompts):
                            scores.setdefault(f"{name}/{key}", []).extend(val.float().cpu().tolist())
                images_all.append(traj.images.cpu())
        from accelerate.utils import gather_object

        out = {}
        for name, vals in scores.items():
            allv = torch.tensor(gather_object(vals) if acc.num_processes > 1 else vals, dtype=torch.float64)
            allv = allv[~torch.isnan(allv)]  # a detail may not apply to every prompt (NaN)
            if len(allv) == 0:
                continue
            out[f"eval/{name}"] = float(allv.mean())
            out[f"eval/{name}_se"] = float(allv.std() / math.sqrt(len(allv))) if len(allv) > 1 else 0.0
        if acc.is_main_process and images_all:
            from diffusion_rl.reporting import save_grid

            save_grid(torch.cat(images_all)[: cfg.log.max_grid_images], self.out_dir / f"eval_grid{tag}.png",
                      ncol=min(8, max(1, n)) if n > 1 else 8)
        return out

    def log(self, metrics: dict[str, Any]) -> None:
        self.history.append(metrics)
        if not self.accelerator.is_main_process:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with open(self.out_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(metrics) + "\n")
        for tracker in self._trackers:
            tracker(metrics)

    def _init_trackers(self) -> None:
        cfg = self.cfg.log
        if not self.accelerator.is_main_process:
            return
        if cfg.tensorboard:
            from mmreward.errors import require

            require("tensorboard", "tracking", "log.tensorboard")
            from torch.utils.tensorboard import SummaryWriter

            writer = SummaryWriter(str(self.out_dir / "tensorboard"))
            self._trackers.append(lambda m: [writer.add_scalar(k, v, m["iteration"]) for k, v in m.items()
                                             if isinstance(v, (int, float))])
        if cfg.wandb:
            from mmreward.errors import require

            wandb = require("wandb", "tracking", "log.wandb")
            run = wandb.init(project="diffusion_rl", config=self.cfg.to_dict(), dir=str(self.out_dir))
            self._trackers.append(lambda m: run.log(m, step=m["iteration"]))

    def checkpoint_state(self) -> dict[str, Any]:
        algo_state = self.algorithm.state_dict() if hasattr(self.algorithm, "state_dict") else None
        names = {id(p): n for n, p in self.unwrapped.named_parameters()}
        return {
            "iteration": self.iteration, "optimizer_steps": self.optimizer_steps,
            "params": {names[id(p)]: p.detach().cpu().clone() for p in self.trainable},
            "optimizer": self.optimizer.state_dict(),
            "ema": None if self.ema is None else self.ema.state_dict(),
            "algorithm": algo_state, "history": self.history, "config": self.cfg.to_dict(),
        }

    def save_checkpoint(self, path: str | Path | None = None) -> Path:
        """Write the training state to `path` atomically: into a hidden temporary folder next to it, renamed
        into place once complete, so a run killed mid-save leaves the previous checkpoint as the latest."""
        default_root = self.out_dir / "checkpoints"
        path = Path(path or default_root / f"iter_{self.iteration:06d}")
        state = self.checkpoint_state()
        if self.accelerator.is_main_process:
            if path.parent == default_root and default_root.is_dir():
                _remove_stale_temporaries(default_root)
            write_checkpoint(state, path)
        self.accelerator.wait_for_everyone()
        return path

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore the state saved by `save_checkpoint` (nothing is unpickled: safetensors and JSON)."""
        self._apply_state(Path(path), read_checkpoint(path))

    def _apply_state(self, path: Path, state: dict[str, Any]) -> None:
        params = dict(self.unwrapped.named_parameters())
        missing = [n for n in state["params"] if n not in params]
        if missing:
            raise ConfigError(f"checkpoint {path} has parameters this model lacks (different LoRA config?): {missing[:3]}")
        trained = {id(p) for p in self.trainable}
        absent = [n for n, p in params.items() if id(p) in trained and n not in state["params"]]
        if absent:
            raise ConfigError(f"checkpoint {path} lacks trained parameters of this model (different LoRA config?): "
                              f"{absent[:3]}")
        for n, v in state["params"].items():
            if tuple(v.shape) != tuple(params[n].shape):
                raise ConfigError(f"checkpoint {path}: parameter {n} has shape {tuple(v.shape)}, this model's is "
                                  f"{tuple(params[n].shape)} (different model or model.lora_rank?)")
        with torch.no_grad():
            for n, v in state["params"].items():
                params[n].copy_(v.to(params[n].device, params[n].dtype))
        try:
            self.optimizer.load_state_dict(state["optimizer"])
        except (ValueError, KeyError) as exc:
            raise CheckpointError(f"checkpoint {path}: the optimizer state does not fit this model ({exc})") from None
        if self.ema is not None and state["ema"] is not None:
            self.ema.load_state_dict(state["ema"])
        if state.get("algorithm") is not None and hasattr(self.algorithm, "load_state_dict"):
            self.algorithm.load_state_dict(state["algorithm"])
        self.iteration = state["iteration"]
        self.optimizer_steps = state["optimizer_steps"]
        self.history = list(state["history"])

    def _rewrite_metrics(self) -> None:
        """On resume, metrics.jsonl holds exactly the checkpoint's history: lines logged after the checkpoint
        by the interrupted run would otherwise appear twice once those iterations are rerun."""
        if not self.accelerator.is_main_process:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        target = self.out_dir / "metrics.jsonl"
        tmp = target.with_name(f".metrics.jsonl.tmp-{os.getpid()}")
        tmp.write_text("".join(json.dumps(m) + "\n" for m in self.history))
        os.replace(tmp, target)

    def _find_resume(self, value: str) -> tuple[Path, dict[str, Any]]:
        """The checkpoint to resume from and its state; 'latest' skips incomplete checkpoints with a warning."""
        if value != "latest":
            path = Path(value)
            if not path.is_dir():
                raise CheckpointError(f"train.resume_from: {value!r} is not a folder; give a checkpoint folder such "
                                      f"as {self.out_dir / 'checkpoints' / 'iter_000010'}, or 'latest'")
            return path, read_checkpoint(path)
        root = self.out_dir / "checkpoints"
        found = sorted((d for d in root.glob("iter_*") if re.fullmatch(r"iter_\d+", d.name) and d.is_dir()),
                       key=lambda d: int(d.name[5:]))
        for path in reversed(found):
            try:
                return path, read_checkpoint(path)
            except CheckpointError as exc:
                warnings.warn(f"train.resume_from='latest': skipping {path}, which is incomplete or corrupt ({exc})",
                              stacklevel=2)
        raise ConfigError(f"train.resume_from='latest' but {root} holds no complete checkpoint; "
                          "unset train.resume_from to start a new run")

    def export(self, path: str | Path | None = None) -> Path:
        """Save the trained weights for inference: LoRA in diffusers' format, or the full denoiser (EMA if kept)."""
        path = Path(path or self.out_dir / "final")
        if not self.accelerator.is_main_process:
            return path
        model = self.unwrapped
        ctx = self.ema.swapped() if self.ema is not None else contextlib.nullcontext()
        with ctx:
            if self.cfg.model.lora:
                from peft.utils import get_peft_model_state_dict
                from safetensors.torch import save_file

                path.mkdir(parents=True, exist_ok=True)
                sd = get_peft_model_state_dict(model)
                prefix = "unet" if self.adapter.family in ("sd", "sdxl") else "transformer"
                save_file({f"{prefix}.{k}": v.contiguous() for k, v in sd.items()},
                          str(path / "pytorch_lora_weights.safetensors"))
            else:
                model.save_pretrained(str(path / self.adapter._denoiser_attr))
        return path

    def fit(self) -> list[dict[str, Any]]:
        """Train for `train.iterations`, with evaluation, grids, curves and checkpoints; returns the metric history."""
        cfg = self.cfg
        if self.accelerator.is_main_process:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            save_config(cfg, self.out_dir / "config.yaml")
        self._init_trackers()
        if self.iteration == 0 and self.eval_prompts and cfg.log.eval_at_start:
            self.log({"iteration": 0, **self.evaluate("_start")})
        iters = range(self.iteration, cfg.train.iterations)
        if cfg.log.progress and self.accelerator.is_local_main_process:
            from tqdm.auto import tqdm

            iters = tqdm(iters, desc=f"{cfg.train.algorithm}", initial=self.iteration, total=cfg.train.iterations)
        last_eval = 0
        for it in iters:
            metrics = self.train_iteration(it)
            self.iteration = it + 1
            if cfg.log.eval_every and self.iteration % cfg.log.eval_every == 0 and self.eval_prompts:
                metrics.update(self.evaluate())
                last_eval = self.iteration
            if cfg.log.grid_every and self.iteration % cfg.log.grid_every == 0 and self.accelerator.is_main_process:
                from diffusion_rl.reporting import save_grid

                save_grid(self._last_batch.images[: cfg.log.max_grid_images],
                          self.out_dir / "grids" / f"train_{self.iteration:06d}.png", ncol=cfg.sample.group_size)
            self.log({"iteration": self.iteration, **metrics})
            if hasattr(iters, "set_postfix"):
                iters.set_postfix({k.split("/")[-1]: round(v, 4) for k, v in metrics.items() if k.startswith("reward/")
                                   and not k.endswith("_std")})
            if cfg.log.save_every and self.iteration % cfg.log.save_every == 0:
                self.save_checkpoint()
        if self.eval_prompts and last_eval != self.iteration and cfg.train.iterations > 0:
            self.log({"iteration": self.iteration, **self.evaluate("_end")})
        elif self.eval_prompts and self.accelerator.is_main_process:
            import shutil

            src = self.out_dir / "eval_grid.png"
            if src.exists():
                shutil.copy(src, self.out_dir / "eval_grid_end.png")
        self.save_checkpoint()
        self.export()
        if self.accelerator.is_main_process:
            from diffusion_rl.reporting import plot_curves

            plot_curves(self.history, self.out_dir / "reward_curve.png")
        return self.history


# ----------------------------------------------------------------------------------------------
# checkpoint files: safetensors for tensors, JSON for the rest, so resuming never unpickles code
# ----------------------------------------------------------------------------------------------
STATE_FILE = "trainer_state.json"  # written last: its presence marks a complete folder
_TEMPORARY = re.compile(r"^\..+\.(tmp|old)-\d+$")


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_stale_temporaries(root: Path) -> None:
    """Folders left by a save that was killed before its rename."""
    for d in root.iterdir():
        if d.is_dir() and _TEMPORARY.match(d.name):
            shutil.rmtree(d, ignore_errors=True)


def write_checkpoint(state: dict[str, Any], path: str | Path) -> Path:
    """Write `Trainer.checkpoint_state()` to the folder `path` atomically (temporary folder, then rename):
    params/optimizer/ema tensors as safetensors, everything else in trainer_state.json."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    opt = state["optimizer"]
    opt_tensors: dict[str, torch.Tensor] = {}
    opt_scalars: dict[str, dict[str, Any]] = {}
    for idx, per_param in opt["state"].items():
        for key, val in per_param.items():
            if isinstance(val, torch.Tensor):
                opt_tensors[f"{idx}.{key}"] = val.detach().cpu().contiguous()
            else:
                opt_scalars.setdefault(str(idx), {})[key] = val
    tensors = {"params": {n: v.detach().cpu().contiguous() for n, v in state["params"].items()},
               "optimizer": opt_tensors}
    ema = state.get("ema")
    if ema is not None:
        tensors["ema"] = {f"shadow.{i}": t.detach().cpu().contiguous() for i, t in enumerate(ema["shadow"])}
    meta: dict[str, Any] = {
        "format": CHECKPOINT_FORMAT, "iteration": state["iteration"], "optimizer_steps": state["optimizer_steps"],
        "history": state["history"], "algorithm": state.get("algorithm"), "config": state.get("config"),
        "optimizer": {"param_groups": opt["param_groups"], "scalars": opt_scalars},
        "ema": None if ema is None else {"num_updates": ema["num_updates"], "size": len(ema["shadow"])},
        "files": {},
    }
    for name, group in tensors.items():
        file = tmp / f"{name}.safetensors"
        save_file(group, str(file))
        _fsync(file)
        meta["files"][file.name] = file.stat().st_size
    (tmp / STATE_FILE).write_text(json.dumps(meta))
    _fsync(tmp / STATE_FILE)
    if path.exists():  # re-saving an iteration (e.g. the final save after a periodic one)
        old = path.parent / f".{path.name}.old-{os.getpid()}"
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, path)
    _fsync(path.parent)
    return path


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """The state written by `write_checkpoint` (or a legacy trainer_state.pt, read with weights_only=True),
    in `Trainer.checkpoint_state()`'s layout. Raises CheckpointError for a missing, incomplete or corrupt folder."""
    from safetensors.torch import load_file

    path = Path(path)
    meta_file = path / STATE_FILE
    if not meta_file.is_file():
        if (path / "trainer_state.pt").is_file():
            return _read_legacy_checkpoint(path / "trainer_state.pt")
        raise CheckpointError(f"{path} has no {STATE_FILE}: not a trainer checkpoint, or one whose save was "
                              "interrupted; resume from an earlier checkpoint folder")
    try:
        meta = json.loads(meta_file.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(f"{meta_file} is not readable JSON ({exc}); the checkpoint is corrupt") from None
    if not isinstance(meta, dict) or meta.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{meta_file}: unknown checkpoint format {meta.get('format') if isinstance(meta, dict) else meta!r}, "
                              f"expected {CHECKPOINT_FORMAT}")
    for key, kind in (("iteration", int), ("optimizer_steps", int), ("history", list), ("files", dict),
                      ("optimizer", dict)):
        if not isinstance(meta.get(key), kind):
            raise CheckpointError(f"{meta_file}: '{key}' is missing or not a {kind.__name__}; the checkpoint is corrupt")
    tensors: dict[str, dict[str, torch.Tensor]] = {}
    for file, size in meta["files"].items():
        f = path / file
        if not f.is_file() or f.stat().st_size != size:
            have = f.stat().st_size if f.is_file() else "no file"
            raise CheckpointError(f"{f}: expected {size} bytes, found {have}; the checkpoint is incomplete")
        try:
            tensors[file.removesuffix(".safetensors")] = load_file(str(f))
        except Exception as exc:  # safetensors raises its own error type for a corrupt header
            raise CheckpointError(f"{f} is not a readable safetensors file ({exc})") from None
    if "params" not in tensors or "optimizer" not in tensors:
        raise CheckpointError(f"{meta_file} lists no params or optimizer file; the checkpoint is corrupt")
    opt_state: dict[int, dict[str, Any]] = {}
    for key, val in tensors["optimizer"].items():
        idx, name = key.split(".", 1)
        opt_state.setdefault(int(idx), {})[name] = val
    for idx, scalars in meta["optimizer"].get("scalars", {}).items():
        opt_state.setdefault(int(idx), {}).update(scalars)
    groups = [{k: tuple(v) if k == "betas" else v for k, v in g.items()} for g in meta["optimizer"]["param_groups"]]
    ema = None
    if meta.get("ema") is not None:
        if "ema" not in tensors:
            raise CheckpointError(f"{meta_file} records an EMA but lists no ema file; the checkpoint is corrupt")
        ema = {"shadow": [tensors["ema"][f"shadow.{i}"] for i in range(meta["ema"]["size"])],
               "num_updates": meta["ema"]["num_updates"]}
    return {"iteration": meta["iteration"], "optimizer_steps": meta["optimizer_steps"], "params": tensors["params"],
            "optimizer": {"state": opt_state, "param_groups": groups}, "ema": ema,
            "algorithm": meta.get("algorithm"), "history": meta["history"], "config": meta.get("config")}


def _read_legacy_checkpoint(file: Path) -> dict[str, Any]:
    """Checkpoints of format 1 (one torch.save file): tensors and plain containers only, so weights_only works."""
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # a truncated or 0-byte file raises EOFError, RuntimeError or an unpickling error
        raise CheckpointError(f"{file} cannot be read ({type(exc).__name__}: {exc}); the checkpoint is incomplete "
                              "or corrupt") from None
    required = ("iteration", "optimizer_steps", "params", "optimizer", "history")
    if not isinstance(state, dict) or any(k not in state for k in required):
        raise CheckpointError(f"{file} lacks {list(required)}; it is not a trainer checkpoint")
    return {"ema": None, "algorithm": None, "config": None, **state}
