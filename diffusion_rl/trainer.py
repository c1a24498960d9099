"""The training loop, top to bottom: prompts -> rollout -> rewards -> advantages -> loss -> optimizer step.

`Trainer.train_iteration` is one iteration, the same stages by name for every algorithm (each method's stages:
`algorithms/base.py`); `Trainer.fit` runs them with evaluation, logging and checkpoints:

    prompts     sample_assignment.py  which prompt slots an iteration draws, which process owns them (`inputs`)
    rollout     rollout.py        trajectories with log-probs (pipelines.py: adapters; seeding.py: noise): the
                                  default rollout stage (`sde_rollout`); ODE samples, pairs of a dataset: algorithms/
    rewards     rewards.py        the run's rewards, loaded once, scored chunk by chunk as the rollout runs
    advantages  algorithms/       GRPO, Pref-GRPO, DDPO: rewards in, advantages out; NFT, ranked methods: theirs
    loss        losses.py         PPO-clip, KL to the reference (GRPO-Guard's ratio: algorithms/grpo_guard.py): the
                                  default update stage (`ppo_update`); the other methods' losses: algorithms/
    step        policy.py         LoRA/full weights, optimizer, EMA, gradient clipping
    around it   evaluation.py, reporting.py, checkpointing.py, export.py, accelerator.py, hacking_guard.py

A W-process run with the same global batch equals a 1-process run (see `diffusion_rl.sample_assignment`), and a
resumed run equals an uninterrupted one bit for bit: every random draw is counter-based (`seeding.py`).
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

from diffusion_rl import (
    branching,
    checkpointing,
    context_parallel,
    hacking_guard,
    memory_settings,
    reporting,
    run_folder,
    sample_assignment,
    selection,
)
from diffusion_rl.accelerator import make_accelerator
from diffusion_rl.algorithms import make_algorithm
from diffusion_rl.algorithms.base import Inputs, Rollouts, Run, Timings
from diffusion_rl.algorithms.grpo_guard import guard_policy_loss, uses_ratio_norm
from diffusion_rl.config import RunConfig, save_config
from diffusion_rl.evaluation import check_sharded_evaluation, evaluate
from diffusion_rl.kernels import Kernel
from diffusion_rl.losses import gaussian_kl, ppo_clip_loss
from diffusion_rl.pipelines import PromptEmbeds, adapter_for_config, check_reward_modalities, run_pipeline
from diffusion_rl.policy import Policy
from diffusion_rl.ratio_probe import Probe
from diffusion_rl.rewards import RolloutScorer, load_run_rewards
from diffusion_rl.rollout import RolloutBatch, SamplingOptions, Trajectory, rollout, step_log_prob
from diffusion_rl.truncation_notice import TruncationNotice
from mmreward.errors import ConfigError


class Trainer:
    """Builds a run from its config (accelerator, rewards, pipeline, algorithm, policy), then trains it."""

    def __init__(self, cfg: RunConfig, *, accelerator: Any = None, pipeline: Any = None, algorithm: Any = None) -> None:
        self.cfg = cfg
        self.accelerator = acc = accelerator or make_accelerator(cfg)
        # everything a user can get wrong in the config is checked before the (slow) pipeline load
        context_parallel.check_training(cfg, acc)
        self.cp_degree = context_parallel.degree(cfg.model.context_parallel)  # processes that split each clip
        sample_assignment.check_divisible(cfg.sample, cfg.train, acc.num_processes, self.cp_degree)
        self.data_rank = sample_assignment.DataRank.of(acc, self.cp_degree)  # a CP group owns the same samples
        self.train_prompts = cfg.prompts.load("train")
        if not self.train_prompts:
            raise ConfigError("prompts.train is empty: give a list of prompts or a text file with one per line")
        self.eval_prompts = cfg.prompts.load("eval")
        # one run per folder: a new run never mixes with an earlier one's metrics and checkpoints (run_folder)
        resuming = cfg.train.resume_from is not None
        self.out_dir = run_folder.choose_output_dir(
            Path(cfg.log.output_dir), resuming=resuming, overwrite=cfg.log.overwrite and acc.is_main_process,
            new_run_suffix=cfg.log.new_run_suffix)
        acc.wait_for_everyone()
        run_folder.check_not_locked(self.out_dir)
        resume = (checkpointing.find_resume(cfg.train.resume_from, self.out_dir, run_folder.read_run_id(self.out_dir),
                                            iterations=cfg.train.iterations) if resuming else None)
        self.run_id = (resume[1].get("run_id") if resume else None) or run_folder.new_run_id()
        self.resumed_from = str(resume[0]) if resume else None
        self.rewards = load_run_rewards(cfg, acc.device)
        # scores each rollout chunk as it is generated; reward.overlap: in a background thread (rewards.py)
        self.scorer = RolloutScorer(lambda: self.rewards.train, self.train_prompts, overlap=cfg.reward.overlap)
        pipeline = run_pipeline(cfg.model, acc.device, pipeline)
        self.adapter = adapter_for_config(pipeline, cfg.model)
        check_reward_modalities(self.adapter, self.rewards.by_name(), self.train_prompts, self.eval_prompts)
        self.kernel = Kernel(cfg.sample.kernel, cfg.sample.noise_level, cfg.sample.log_prob_reduction)
        self.algorithm = algorithm or make_algorithm(cfg, self.rewards.train, self.rewards.pairwise)
        self.policy = Policy(cfg, self.adapter, acc)
        self.trainable, self.ema = self.policy.trainable, self.policy.ema
        check_sharded_evaluation(cfg, len(self.eval_prompts), self.policy.sharded, acc.num_processes)
        self.probe = Probe(cfg.train)
        self.guard = hacking_guard.HackingGuard(cfg, len(self.eval_prompts), self.out_dir, hacking_guard.GuardActions(
            save=self.save_checkpoint, restore=self.restore_weights, say=acc.print))
        self._embed_cache: dict[str, PromptEmbeds] = {}
        self._truncation = TruncationNotice()  # one line per run, not one diffusers warning per prompt
        self.iteration = 0
        self.history: list[dict[str, Any]] = []
        self.last_images: torch.Tensor | None = None  # the last iteration's samples, for the grids
        if resume is not None:
            self._restore(*resume)
            if acc.is_main_process:
                reporting.rewrite_metrics(self.out_dir, [{"run_id": self.run_id, **m} for m in self.history])
                print(f"diffusion-rl: resuming run {self.run_id} from {resume[0]} at iteration {self.iteration} "
                      f"of {cfg.train.iterations}", file=sys.stderr)

    def embeds_for(self, prompts: list[str]) -> PromptEmbeds:
        """Prompt embeddings, computed once per distinct prompt and cached (the text encoders are frozen).

        Each prompt is encoded on its own: a batched encoder's output depends in the last bits on the
        other rows of its batch, which would make a prompt's embedding depend on the iteration it was
        first seen in, and a resumed run (empty cache) differ from an uninterrupted one."""
        with self._truncation.collect():
            for p in dict.fromkeys(prompts):
                if p not in self._embed_cache:
                    self._embed_cache[p] = self.adapter.encode([p])
        return PromptEmbeds.cat([self._embed_cache[p] for p in prompts])

    # ------------------------------------------------------------------------------------------
    # one iteration
    # ------------------------------------------------------------------------------------------
    def local_prompts(self, it: int) -> tuple[list[str], list[str], torch.Tensor, torch.Tensor]:
        """(the prompt of every slot, this process's sample prompts, their slots, their sample ids)."""
        cfg = self.cfg
        n = cfg.sample.prompts_per_iteration
        slot_prompts = sample_assignment.prompts_for_iteration(self.train_prompts, n, cfg.train.seed, it)
        slots, sample_ids = sample_assignment.local_samples(n, cfg.sample.group_size, self.data_rank.rank,
                                                            self.data_rank.world)
        return slot_prompts, [slot_prompts[s] for s in slots.tolist()], slots, sample_ids

    def inputs(self, it: int) -> Inputs:
        """The prompt stage: this process's prompts, slots, sample ids and prompt embeddings of iteration `it`."""
        slot_prompts, prompts, slots, sample_ids = self.local_prompts(it)
        return Inputs(it, prompts, self.embeds_for(prompts), slots, sample_ids, slot_prompts)

    def collect(self, it: int) -> tuple[RolloutBatch, sample_assignment.CanonicalOrder]:
        """Sample this process's trajectories of iteration `it` with the current policy and score them."""
        samples = self.sde_rollout(self.inputs(it))
        return samples.batch, samples.order

    @torch.no_grad()
    def sde_rollout(self, inputs: Inputs) -> Rollouts:
        """The default rollout stage (`Run.collect`): trajectories with log-probs, scored chunk by chunk."""
        cfg, acc, it = self.cfg, self.accelerator, inputs.it
        prompts, slots, sample_ids, embeds = inputs.prompts, inputs.slots, inputs.sample_ids, inputs.embeds
        sde = sample_assignment.sde_steps(cfg.sample, cfg.train.seed, it)
        model = self.policy.model.eval()  # the prepared model: under FSDP only it can gather the sharded weights
        options = SamplingOptions.for_run(cfg.sample, self.adapter, self.kernel, seed=cfg.train.seed, epoch=it,
                                          sde_steps=sde, store_means=uses_ratio_norm(cfg))
        sample = branching.branched_rollout if cfg.sample.branching else rollout
        parts, scoring = [], self.scorer.begin()
        for start in range(0, len(slots), cfg.sample.batch_size):
            sl = slice(start, start + cfg.sample.batch_size)
            with acc.autocast(), scoring.cancel_on_error():
                parts.append(sample(self.adapter, embeds.index(sl), slots[sl], sample_ids[sl], options, model=model))
            scoring.submit(prompts[sl], parts[-1].images)  # scored now, or (overlap) while the next chunk rolls out
        traj = Trajectory.cat(parts)
        rewards = scoring.result(acc.device)
        order = sample_assignment.CanonicalOrder(acc, slots, sample_ids, cfg.sample.group_size, self.cp_degree)
        train_steps = sample_assignment.select_train_steps(cfg.train, it, traj.sde_mask, slots, sample_ids)
        w = branching.step_weights(cfg.sample, cfg.ppo.noise_aware_weight, self.adapter, self.kernel, traj.schedule)
        batch = RolloutBatch(traj, prompts, slots.to(acc.device), rewards, train_steps, inputs.slot_prompts,
                             step_weights=w)
        return Rollouts(batch=batch, order=order, reward_blocking_s=self.scorer.last_blocking_s)

    def ppo_update(self, samples: Rollouts) -> dict[str, float]:
        """The default update stage (`Run.ppo_update`): DanceGRPO's best/worst-k selection, then `update`."""
        trained = selection.select_best_worst(samples.batch, samples.order, self.cfg.ppo.best_worst_k)
        return self.update(trained)  # loss -> optimizer step, per minibatch

    def update(self, batch: RolloutBatch) -> dict[str, float]:
        """The PPO update: `num_inner_epochs` passes over `num_minibatches` minibatches of whole groups."""
        tc = self.cfg.train
        per = len(batch.slots) // tc.num_minibatches  # samples of whole groups (all of a group's size, or 2k)
        metrics: dict[str, list[float]] = {}
        for inner in range(tc.num_inner_epochs):
            for m in range(tc.num_minibatches):
                idx = torch.arange(m * per, (m + 1) * per)
                for key, val in self.minibatch_step(batch, idx, probe=(inner == 0 and m == 0)).items():
                    metrics.setdefault(key, []).append(val)
        return {k: sum(v) / len(v) for k, v in metrics.items()}

    def minibatch_step(self, batch: RolloutBatch, idx: torch.Tensor, probe: bool) -> dict[str, float]:
        """One optimizer step on the samples `idx`: the loss of each trained step, accumulated over micro-batches."""
        cfg, acc, policy = self.cfg, self.accelerator, self.policy
        tc, traj, flow = cfg.train, batch.traj, self.adapter.is_flow
        k = batch.train_steps.shape[1]
        chunks = list(torch.split(idx, tc.micro_batch_size))
        n_backward = len(chunks) * k
        stats: dict[str, list[float]] = {"loss": [], "policy_loss": [], "clip_fraction": [], "approx_kl": [], "kl": []}
        policy.model.train()
        count = 0
        for chunk in chunks:
            adv = batch.advantages[chunk.to(batch.advantages.device)]
            emb = traj.embeds.index(chunk)
            for s in range(k):
                steps = batch.train_steps[chunk, s]
                x, x_next = memory_settings.step_pair(traj.latents, chunk, steps, acc.device)  # from CPU if offloaded
                old = traj.log_probs[chunk, steps].to(acc.device)
                count += 1
                # gradients are averaged over processes once, on the last backward of the minibatch
                with contextlib.nullcontext() if count == n_backward else acc.no_sync(policy.model):
                    with acc.autocast():
                        res = step_log_prob(self.adapter, policy.model, x, x_next, steps, traj.schedule, emb,
                                            cfg.sample.guidance_scale, self.kernel)
                    dt = (traj.schedule.b[steps] - traj.schedule.a[steps]).to(acc.device, torch.float32)
                    if probe and count == 1:
                        for key, val in self.probe.check(res.log_prob - old).items():
                            stats.setdefault(key, []).append(val)
                    if uses_ratio_norm(cfg):  # GRPO-Guard's RatioNorm and 1 / dt step weight (algorithms/grpo_guard.py)
                        old_mean = traj.means[chunk, steps].to(acc.device)
                        pl, loss = guard_policy_loss(res.log_prob, old, res.mean, old_mean, res.std,
                                                     batch.weighted(adv, steps), dt, tc.clip_range, reweight=flow)
                    else:
                        pl = ppo_clip_loss(res.log_prob, old, batch.weighted(adv, steps), tc.clip_range)
                        loss = pl.loss
                    if tc.kl_beta > 0:
                        ref_mean = policy.reference_mean(self.adapter, x, x_next, steps, traj.schedule, emb,
                                                         cfg.sample.guidance_scale, self.kernel)
                        kl = gaussian_kl(res.mean, ref_mean, res.std, mode=cfg.ppo.kl_mode,
                                         dt=dt if flow else torch.ones_like(dt)).mean()
                        loss = loss + tc.kl_beta * kl
                        stats["kl"].append(float(kl.detach()))
                    acc.backward(loss / n_backward)
                stats["loss"].append(float(loss.detach()))
                stats["policy_loss"].append(float(pl.loss.detach()))
                stats["clip_fraction"].append(float(pl.clip_fraction))
                stats["approx_kl"].append(float(pl.approx_kl))
        grad_norm = policy.step()
        out = {f"train/{key}": sum(v) / len(v) for key, v in stats.items() if v}
        if grad_norm is not None:
            out["train/grad_norm"] = grad_norm
        return out

    @property
    def run(self) -> Run:
        """What an algorithm's stages may use of this run (never the trainer itself)."""
        return Run(policy=self.policy, adapter=self.adapter, kernel=self.kernel, accelerator=self.accelerator,
                   scorer=self.scorer, collect=self.sde_rollout, ppo_update=self.ppo_update)

    def train_iteration(self, it: int) -> dict[str, float]:
        """Prompts, rollout and rewards, advantages, loss and optimizer step of iteration `it`; returns its
        metrics. Every algorithm has these stages (`diffusion_rl.algorithms.base`)."""
        algorithm, run = self.algorithm, self.run
        inputs = self.inputs(it)  # prompts
        t0 = time.perf_counter()
        samples = algorithm.rollout(run, inputs)  # rollout -> rewards (scored chunk by chunk)
        t1 = time.perf_counter()
        samples.advantages, metrics = algorithm.advantages(samples)  # advantages
        metrics.update(algorithm.update(samples, run))  # loss -> optimizer step
        t2 = time.perf_counter()
        metrics.update(algorithm.report(samples, Timings(rollout_s=t1 - t0, update_s=t2 - t1)))  # rewards, timings
        self.last_images = samples.images
        return metrics

    # ------------------------------------------------------------------------------------------
    # the run: evaluation, logging, checkpoints
    # ------------------------------------------------------------------------------------------
    def fit(self) -> list[dict[str, Any]]:
        """Train for `train.iterations`, with evaluation, grids, curves and checkpoints; returns the metric history."""
        main = self.accelerator.is_main_process
        if main:
            run_folder.acquire_lock(self.out_dir)
        try:
            return self._fit()
        finally:
            if main:
                run_folder.release_lock(self.out_dir)

    def _fit(self) -> list[dict[str, Any]]:
        cfg, main = self.cfg, self.accelerator.is_main_process
        if main:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            save_config(cfg, self.out_dir / "config.yaml")
            run_folder.write_run_file(self.out_dir, self.run_id, self.resumed_from)
        reporting.open_trackers(self.accelerator, cfg, self.out_dir)
        if self.iteration == 0 and self.eval_prompts and cfg.log.eval_at_start:
            self.log({"iteration": 0, **self.evaluate("_start")})
        iters = self.guard.until_stopped(range(self.iteration, cfg.train.iterations))  # stop/rollback end it early
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
            if cfg.log.grid_every and self.iteration % cfg.log.grid_every == 0 and main:
                grid = reporting.save_grid(self.last_images[: cfg.log.max_grid_images], self.out_dir / "grids" /
                                           f"train_{self.iteration:06d}.png", ncol=cfg.sample.group_size)
                reporting.log_image(self.accelerator, "train/samples", grid, self.iteration)
            self.log({"iteration": self.iteration, **metrics})
            if hasattr(iters, "set_postfix"):
                iters.set_postfix({k.split("/")[-1]: round(v, 4) for k, v in metrics.items()
                                   if reporting.is_reward_metric(k)})
            if cfg.log.save_every and self.iteration % cfg.log.save_every == 0:
                self.save_checkpoint()
        if self.eval_prompts and last_eval != self.iteration and cfg.train.iterations > 0:
            try:
                final = self.evaluate("_end")
            except BaseException:  # the trained weights outlive a failing final evaluation (resume re-runs it)
                self.save_checkpoint()
                raise
            self.log({"iteration": self.iteration, **final})
        elif self.eval_prompts and main and (self.out_dir / "eval_grid.png").exists():
            shutil.copy(self.out_dir / "eval_grid.png", self.out_dir / "eval_grid_end.png")
        self.save_checkpoint()
        self.export()
        if main:
            reporting.plot_curves(self.history, self.out_dir / "reward_curve.png")
            reporting.close_trackers(self.accelerator)
        return self.history

    def evaluate(self, tag: str = "") -> dict[str, float]:
        out = evaluate(self.cfg, self.policy, self.adapter, self.kernel, self.eval_prompts, self.rewards.eval,
                       self.embeds_for, self.out_dir / f"eval_grid{tag}.png")
        reporting.log_image(self.accelerator, "eval/samples", self.out_dir / f"eval_grid{tag}.png", self.iteration)
        return self.guard.observe(out, self.iteration, self.history)  # gold, diversity, the hacking alarm

    def log(self, metrics: dict[str, Any]) -> None:
        self.history.append(metrics)
        if self.accelerator.is_main_process:
            reporting.append_metrics(self.out_dir, {"run_id": self.run_id, **metrics})
            self.accelerator.log({k: v for k, v in metrics.items() if k != "iteration"}, step=metrics["iteration"])

    def checkpoint_state(self) -> dict[str, Any]:
        state = checkpointing.training_state(self.policy, self.algorithm, self.iteration, self.history,
                                             self.cfg.to_dict())
        return {**state, "run_id": self.run_id}

    def save_checkpoint(self, path: str | Path | None = None) -> Path:
        """Write the training state to `path` (default checkpoints/iter_NNNNNN) atomically."""
        default_root = self.out_dir / "checkpoints"
        path = Path(path or default_root / f"iter_{self.iteration:06d}")
        state = self.checkpoint_state()
        if self.accelerator.is_main_process:
            if path.parent == default_root and default_root.is_dir():
                checkpointing.remove_stale_temporaries(default_root)
            checkpointing.write_checkpoint(state, path)
        self.accelerator.wait_for_everyone()
        return path

    def restore_weights(self, path: Path) -> None:
        """Load a checkpoint's weights, optimizer and EMA into the run (every process reads it); the iteration
        count and history go on (the hacking guard's rollback)."""
        self.accelerator.wait_for_everyone()
        checkpointing.restore(path, checkpointing.read_checkpoint(path), self.policy, self.algorithm)

    def _restore(self, path: Path, state: dict[str, Any]) -> None:
        """Continue from a checkpoint (`checkpointing.find_resume`); nothing is unpickled: safetensors and JSON."""
        checkpointing.restore(path, state, self.policy, self.algorithm)
        self.iteration, self.history = state["iteration"], list(state["history"])

    def export(self, path: str | Path | None = None) -> Path:
        """Save the trained model for inference to `path` (default final/): a LoRA folder for
        `pipe.load_lora_weights`, or a full pipeline folder for `DiffusionPipeline.from_pretrained`."""
        path = Path(path or self.out_dir / "final")
        if self.accelerator.is_main_process or self.policy.sharded:  # sharded weights are gathered by all
            self.policy.export(path, self.adapter, self.cfg.model.lora)
        return path


def train(cfg: RunConfig) -> Trainer:
    """Build the run `cfg` describes and train it; the trainer holds the history, weights and output folder."""
    trainer = Trainer(cfg)
    trainer.fit()
    return trainer
