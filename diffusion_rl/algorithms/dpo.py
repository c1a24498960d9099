"""Diffusion-DPO (Wallace et al., 2023, arXiv 2311.12908), online: preference pairs ranked by a reward.

For a pair (x_w preferred, x_l) of one prompt, noised at the same step with the same noise, the loss is

    L = -log sigmoid( -beta/2 * [ (||e_w - e_theta(x_w,t)||^2 - ||e_l - e_theta(x_l,t)||^2)
                                  - (||e_w - e_ref(x_w,t)||^2  - ||e_l - e_ref(x_l,t)||^2) ] )

with || ||^2 the mean over the latent's elements, e the prediction target and e_ref the frozen reference
(`dpo_loss`). On a flow model the target is the velocity eps - x_0 at x_t = (1 - s) x_0 + s eps (the form
Flow-Factory and verl-omni use); the epsilon form is the same formula with target eps.

Reference read: SalesforceAIResearch/DiffusionDPO@5233e75 train.py (loss at lines 1122-1145: the per-sample
MSE mean over dims [1, 2, 3], scale_term = -0.5 * beta_dpo, loss = -logsigmoid(scale_term * (model_diff -
ref_diff)).mean(); timesteps and noise shared by the two images of a pair; beta_dpo 5000; launchers/sd15.sh),
and its online flow-matching form in X-GenGroup/Flow-Factory@5f6cda1 src/flow_factory/trainers/rl/dpo.py
(velocity target noise - x_0, the best and the worst advantage of each group as the pair, beta 2000 by default,
logit-normal timesteps).

Online, as this file does it: every iteration samples `group_size` images per prompt with the current policy
(deterministic ODE, no likelihoods), scores them, and pairs the best with the worst of each group (ranked
by the group-normalised advantage, so several rewards combine as in GRPO; a group whose best and worst tie
is trained at weight 0). The reference is the base model with its LoRA adapters disabled (or the frozen copy of
`train.kl_reference: copy`). Each pair is trained at one schedule step drawn at random (counter-based),
with one noise shared by its two images; `train.micro_batch_size` counts pairs (2 images each per forward).

Simplifications: flow-matching (velocity) models only; the step is drawn from the sampling schedule's
`sample.num_steps` sigmas (the reference draws t uniformly in [0, 1000)); the training forwards use
`sample.guidance_scale` as DiffusionNFT here does (the reference trains the conditional prediction: set
guidance_scale 1 for that).

Offline, as the paper trains (`OfflineDiffusionDPO`, chosen when `dpo.pairs` names a pair source): the pairs
come from a dataset of (prompt, chosen image, rejected image): the layouts `mmreward train-pref` reads (JSONL,
parquet, a datasets folder or hf:org/name; Pick-a-Pic's caption/jpg_0/jpg_1/label_0 included), ties dropped as
train.py drops them. Each iteration reads `sample.prompts_per_iteration` pairs from a per-epoch shuffle of the
dataset (counter-based: a resumed run reads the same rows), resizes and centre-crops each image to the model's
size, encodes it with the pipeline's VAE (posterior mode, shifted and scaled as the pipeline decodes: SD3 and
FLUX), one micro-batch at a time as `train_dpo_pairs` (the same loss and steps as online) reaches it. Simplifications: no random flips or
crops, the VAE's mode rather than a posterior sample, SD3/FLUX pipelines only (the others' latent normalisations
are not inverted here), images not cached between iterations.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from diffusion_rl.algorithms.base import Algorithm, Inputs, Run, Samples, Timings, gathered_reward_metrics
from diffusion_rl.algorithms.grpo import grpo_advantages
from diffusion_rl.algorithms.nft import FORWARD_NOISE_STEP, sample_ode
from diffusion_rl.config import RunConfig
from diffusion_rl.pipelines import PipelineAdapter, PromptEmbeds
from diffusion_rl.policy import Policy
from diffusion_rl.sample_assignment import CanonicalOrder
from diffusion_rl.seeding import counter_noise, noise_key
from mmreward.errors import ConfigError, RewardInputError
from mmreward.prompt_sources import score_with_metadata

FORWARD_STEP_DRAW = -7  # the last counter of the seed of a forward-process training step (dpo, raft)


# ----------------------------------------------------------------------------------------------
# the paper's formulas (pure)
# ----------------------------------------------------------------------------------------------
def dpo_loss(err_w: torch.Tensor, err_l: torch.Tensor, ref_err_w: torch.Tensor, ref_err_l: torch.Tensor,
             beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-pair Diffusion-DPO loss (P,) and its implicit accuracy (P,) (1 where the policy already prefers
    the winner more than the reference does), from per-sample squared errors (P,) of the policy and reference."""
    inside = -0.5 * beta * ((err_w - err_l) - (ref_err_w - ref_err_l).detach())
    return -F.logsigmoid(inside), (inside > 0).float()


def best_worst_pairs(scores: torch.Tensor, groups: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(winner rows, loser rows, valid): one pair per group, in ascending group order: the row of its highest
    and of its lowest score (the first one on ties). A group whose scores are all equal has no preference:
    its pair is kept with valid 0 (weight 0), so every process trains the same number of pairs."""
    wins, losses, valid = [], [], []
    for g in torch.unique(groups).tolist():
        rows = torch.nonzero(groups == g).flatten()
        s = scores[rows]
        wins.append(int(rows[int(torch.argmax(s))]))
        losses.append(int(rows[int(torch.argmin(s))]))
        valid.append(float(s.max() > s.min()))
    return torch.tensor(wins, dtype=torch.long), torch.tensor(losses, dtype=torch.long), torch.tensor(valid)


def flow_matching_error(v: torch.Tensor, x0: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """Per-sample ||v - (eps - x_0)||^2, the mean over the non-batch dimensions (B,)."""
    return ((v - (eps - x0)) ** 2).mean(dim=tuple(range(1, x0.dim())))


# ----------------------------------------------------------------------------------------------
# shared by the online forward-process methods (dpo, raft): sample, score, rank; draw t and eps
# ----------------------------------------------------------------------------------------------
def check_flow_lora(name: str, adapter: PipelineAdapter, policy: Policy, *, needs_reference: bool) -> None:
    if not adapter.is_flow:
        raise ConfigError(f"train.algorithm '{name}' trains a flow model's velocity on the forward process: use an "
                          f"SD3, FLUX or other flow pipeline (this one is {adapter.family})")
    if needs_reference and policy.ref_model is None and not hasattr(policy.unwrapped, "disable_adapters"):
        raise ConfigError(f"train.algorithm '{name}' needs a frozen reference: set model.lora=true (the reference is "
                          "the model with its adapters disabled) or train.kl_reference=copy with train.kl_beta > 0")


@dataclass(eq=False)
class RankedSamples(Samples):
    """The current policy's clean ODE samples of every group, their images and rewards, and the order that gathers
    them from every process; `advantages` holds the ranking (group-normalised advantages, on the CPU)."""

    inputs: Inputs
    x0: torch.Tensor  # (N, ...) clean latents
    scores: dict[str, torch.Tensor]  # name -> (N,) this process's rewards
    order: CanonicalOrder
    images: torch.Tensor | None = None  # decoded, on the CPU


def sample_and_score(cfg: RunConfig, rewards: dict[str, Any], metadata: Any, it: int, policy: Policy,
                     adapter: PipelineAdapter, prompts: list[str], embeds: PromptEmbeds, slots: torch.Tensor,
                     sample_ids: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor], CanonicalOrder]:
    """(x_0 latents, decoded images, this process's rewards, the canonical order): ODE samples of the current
    policy, scored (each process holds whole groups)."""
    acc = policy.accelerator
    model, n = policy.unwrapped, len(prompts)
    x0_parts = []
    model.eval()
    with acc.autocast():
        for idx in torch.split(torch.arange(n), cfg.sample.batch_size):
            x0_parts.append(sample_ode(
                adapter, model, embeds.index(idx), slots[idx].tolist(), sample_ids[idx].tolist(),
                num_steps=cfg.sample.num_steps, guidance_scale=cfg.sample.guidance_scale,
                solver=cfg.sample.ode_solver, seed=cfg.train.seed, epoch=it,
                share_initial_noise=cfg.sample.share_initial_noise))
    x0_all = torch.cat(x0_parts).float()
    images = torch.cat([adapter.decode(x0_all[i]) for i in torch.split(torch.arange(n), cfg.sample.batch_size)])
    scores = {name: score_with_metadata(r, prompts, images, metadata).scores.float().to(acc.device)
              for name, r in rewards.items()}
    return x0_all, images, scores, CanonicalOrder(acc, slots, sample_ids, cfg.sample.group_size)


def rank(cfg: RunConfig, scores: dict[str, torch.Tensor], slots: torch.Tensor, order: CanonicalOrder
         ) -> tuple[torch.Tensor, dict[str, float]]:
    """(this process's advantages on the CPU, reward metrics): the rewards group-normalised over all processes
    (as GRPO combines several rewards), and each reward's mean and std over all processes."""
    adv_all, metrics = grpo_advantages({k: order.gather(v) for k, v in scores.items()}, order.gather(slots),
                                       cfg.reward.rewards, cfg.advantage, cfg.reward.aggregation)
    metrics.update(gathered_reward_metrics(scores, order))
    return order.local(adv_all).cpu(), metrics


def forward_draw(adapter: PipelineAdapter, num_steps: int, seed: int, it: int, slot: int, sample_id: int,
                 device: torch.device, draw: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sigma, timestep, eps) of one forward-noising: a schedule step uniform over `num_steps` and its noise,
    both counter-based on (seed, iteration, slot, sample, draw), so they do not depend on batching or processes
    (`draw` numbers repeated noisings of one sample, e.g. RAFT's inner epochs)."""
    gen = torch.Generator().manual_seed(noise_key(seed, it, slot, sample_id, draw, FORWARD_STEP_DRAW))
    j = int(torch.randint(0, num_steps, (1,), generator=gen))
    schedule = adapter.schedule(num_steps)
    step = FORWARD_NOISE_STEP + draw * num_steps + j  # distinct from the rollout's steps (< 10000)
    eps = counter_noise(adapter.latent_shape(), seed, it, [slot], [sample_id], step, device)[0]
    return schedule.a[j].to(device, torch.float32), schedule.timesteps[j].to(device), eps.float()


@torch.no_grad()
def reference_velocity(policy: Policy, adapter: PipelineAdapter, x_t: torch.Tensor, t: torch.Tensor,
                       emb: PromptEmbeds, guidance_scale: float) -> torch.Tensor:
    """The frozen reference's velocity: the frozen copy when there is one, else the model without its LoRA."""
    with policy.accelerator.autocast():
        if policy.ref_model is not None:
            return adapter.predict(policy.ref_model, x_t, t, emb, guidance_scale).float()
        model = policy.unwrapped
        model.disable_adapters()
        try:
            return adapter.predict(model, x_t, t, emb, guidance_scale).float()
        finally:
            model.enable_adapters()


# ----------------------------------------------------------------------------------------------
# the method
# ----------------------------------------------------------------------------------------------
class RankedSamplesMethod(Algorithm[RankedSamples]):
    """What DPO, RAFT, AWM, DGPO and CRD share: the run's rewards and prompt metadata, and the stages: the rollout
    checks the model, samples every group with the current policy (ODE) and scores it (`sample_and_score`), the
    advantage stage ranks it (`rank`), and the update hands the clean latents and advantages to the method's
    `train_on_samples`."""

    def __init__(self, cfg: RunConfig, rewards: dict[str, Any]) -> None:
        self.cfg, self.rewards = cfg, rewards
        self.metadata = cfg.prompts.load("train")  # metadata-aware rewards look prompts up here

    def rollout(self, run: Run, inputs: Inputs) -> RankedSamples:
        """Sample and score every group with the sampling weights (ODE: the run's kernel is not used; the loss is
        on the forward process)."""
        policy, adapter = run.policy, run.adapter
        self.prepare(policy)
        with self.sampling_weights(policy):
            check_flow_lora(self.name, adapter, policy, needs_reference=self.needs_reference)
            x0_all, images, scores, order = sample_and_score(
                self.cfg, self.rewards, self.metadata, inputs.it, policy, adapter, inputs.prompts, inputs.embeds,
                inputs.slots, inputs.sample_ids)
        return RankedSamples(inputs=inputs, x0=x0_all, scores=scores, order=order, images=images.detach().cpu())

    def advantages(self, samples: RankedSamples) -> tuple[torch.Tensor, dict[str, float]]:
        """The group-normalised advantages the method ranks by, and the reward metrics over all processes."""
        return rank(self.cfg, samples.scores, samples.inputs.slots, samples.order)

    def update(self, samples: RankedSamples, run: Run) -> dict[str, float]:
        """The method's optimizer steps (`train_on_samples`)."""
        assert samples.advantages is not None
        i = samples.inputs
        return self.train_on_samples(i.it, run.policy, run.adapter, i.embeds, i.slots, i.sample_ids, samples.x0,
                                     samples.advantages)

    @property
    def needs_reference(self) -> bool:
        """Whether the loss reads the frozen reference model (LoRA runs then check it can be switched off)."""
        return self.cfg.train.kl_beta > 0

    def prepare(self, policy: Policy) -> None:
        """Checks and state the method needs before its first sample (CRD: its weight copies)."""

    def sampling_weights(self, policy: Policy) -> contextlib.AbstractContextManager:
        """The weights the groups are sampled with: the current policy's (CRD: its sampling copy)."""
        return contextlib.nullcontext()

    def train_on_samples(self, it: int, policy: Policy, adapter: PipelineAdapter, embeds: PromptEmbeds,
                         slots: torch.Tensor, sample_ids: torch.Tensor, x0_all: torch.Tensor, adv: torch.Tensor
                         ) -> dict[str, float]:
        """The method's optimizer steps on this iteration's samples and their group-normalised advantages."""
        raise NotImplementedError


PairLoader = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor, PromptEmbeds]]


def train_dpo_pairs(cfg: RunConfig, it: int, policy: Policy, adapter: PipelineAdapter, num_pairs: int,
                    load: PairLoader, draw_slots: torch.Tensor, valid: torch.Tensor) -> dict[str, float]:
    """`train.num_minibatches` optimizer steps of the Diffusion-DPO loss on this process's pairs, online or offline.

    `load(rows)` gives pairs `rows`' winner and loser latents (clean, model latent space) and their prompt's
    embeddings, one micro-batch at a time (offline, the images are read and encoded only then); both images of pair
    p are noised at one schedule step with one noise, drawn counter-based from (seed, it, draw_slots[p]); `valid`
    (P,) weights each pair's loss (0: a tie, no preference)."""
    acc, tc = policy.accelerator, cfg.train
    gs = cfg.sample.guidance_scale
    stats: dict[str, list[float]] = {"loss": [], "implicit_acc": [], "model_diff": [], "ref_diff": []}
    grad_norms = []
    model = policy.model
    for mb in torch.tensor_split(torch.arange(num_pairs), tc.num_minibatches):
        chunks = [c for c in torch.split(mb, tc.micro_batch_size) if len(c)]
        model.train()
        for c_i, chunk in enumerate(chunks):
            x0_w, x0_l, emb_w = load(chunk)
            draws = [forward_draw(adapter, cfg.sample.num_steps, tc.seed, it, int(draw_slots[r]), 0, acc.device)
                     for r in chunk.tolist()]  # one (t, eps) per pair, shared by its two images
            sigma = torch.stack([d[0] for d in draws]).repeat(2)
            t = torch.stack([d[1] for d in draws]).repeat(2)
            eps = torch.stack([d[2] for d in draws]).repeat(2, *([1] * (x0_w.dim() - 1)))
            x0 = torch.cat([x0_w, x0_l]).to(acc.device)  # winners first, then their losers
            view = (-1,) + (1,) * (x0.dim() - 1)
            x_t = (1.0 - sigma.view(view)) * x0 + sigma.view(view) * eps
            emb = PromptEmbeds.cat([emb_w, emb_w])
            ref_err = flow_matching_error(reference_velocity(policy, adapter, x_t, t, emb, gs), x0, eps)
            with contextlib.nullcontext() if c_i == len(chunks) - 1 else acc.no_sync(model):
                with acc.autocast():
                    v = adapter.predict(model, x_t, t, emb, gs).float()
                err = flow_matching_error(v, x0, eps)
                p = len(chunk)
                loss, implicit_acc = dpo_loss(err[:p], err[p:], ref_err[:p], ref_err[p:], cfg.dpo.beta)
                acc.backward((loss * valid[chunk].to(loss.device)).sum() / len(mb))
            stats["loss"].append(float(loss.detach().mean()))
            stats["implicit_acc"].append(float(implicit_acc.mean()))
            stats["model_diff"].append(float((err[:p] - err[p:]).detach().mean()))
            stats["ref_diff"].append(float((ref_err[:p] - ref_err[p:]).mean()))
        gn = policy.step()
        if gn is not None:
            grad_norms.append(gn)
    out = {f"train/{key}": sum(v) / len(v) for key, v in stats.items() if v}
    if grad_norms:
        out["train/grad_norm"] = sum(grad_norms) / len(grad_norms)
    return out


class DiffusionDPO(RankedSamplesMethod):
    """Online Diffusion-DPO (see the module docstring): ranked samples, best-worst pairs, the DPO loss."""

    name = "dpo"

    needs_reference = True

    def train_on_samples(self, it: int, policy: Policy, adapter: PipelineAdapter, embeds: PromptEmbeds,
                         slots: torch.Tensor, sample_ids: torch.Tensor, x0_all: torch.Tensor, adv: torch.Tensor
                         ) -> dict[str, float]:
        """Pair each group's best with its worst, then `num_minibatches` optimizer steps of the DPO loss."""
        win, lose, valid = best_worst_pairs(adv, slots.cpu())
        metrics = train_dpo_pairs(self.cfg, it, policy, adapter, len(win),
                                  lambda c: (x0_all[win[c]], x0_all[lose[c]], embeds.index(win[c])), slots[win], valid)
        acc = policy.accelerator  # pairs with a preference, over all processes
        metrics["dpo/pairs"] = float(acc.gather(valid.sum().view(1).to(acc.device)).sum())
        return metrics


# ----------------------------------------------------------------------------------------------
# offline: preference pairs from a dataset
# ----------------------------------------------------------------------------------------------
PAIR_ORDER_DRAW = -8  # the last counter of the seed of an epoch's shuffle of the pair dataset


def load_preference_pairs(source: str) -> tuple[list[str], list[Any], list[Any], int]:
    """(prompts, chosen images, rejected images, ties dropped) of a preference-pair dataset.

    `source` is what `mmreward train-pref --data` reads (mmreward.train.preference.read_pairs: a .jsonl of
    {prompt, chosen, rejected}, {prompt, image_a, image_b, label} or Pick-a-Pic's {caption, jpg_0, jpg_1,
    label_0} rows, a datasets save_to_disk folder or hf:org/name[:split]) or a .parquet file with those
    columns. Label 0 swaps a row's images; ties (label 0.5) carry no preference and are dropped, as
    DiffusionDPO's train.py drops Pick-a-Pic's ties."""
    from mmreward.hf_datasets import HUB_PREFIX
    from mmreward.train.preference import read_pairs

    if not source.startswith(HUB_PREFIX) and not Path(source).exists():
        raise ConfigError(f"dpo.pairs: {source} does not exist; give a .jsonl or .parquet of (prompt, chosen, "
                          f"rejected) pairs, a datasets save_to_disk folder or {HUB_PREFIX}org/name[:split]")
    pairs = read_pairs(source)
    decided = [p for p in pairs if p["label"] != 0.5]
    if not decided:
        raise RewardInputError(f"dpo.pairs: all {len(pairs)} pairs of {source} are ties (label 0.5); "
                               "Diffusion-DPO needs pairs with a preferred image")
    chosen = [p["image_a"] if p["label"] == 1.0 else p["image_b"] for p in decided]
    rejected = [p["image_b"] if p["label"] == 1.0 else p["image_a"] for p in decided]
    return [p["prompt"] for p in decided], chosen, rejected, len(pairs) - len(decided)


def pair_indices(num_pairs: int, count: int, seed: int, it: int) -> torch.Tensor:
    """The dataset rows of iteration `it`'s `count` pair slots: consecutive positions of a stream of epochs,
    each a fresh shuffle of all `num_pairs` rows keyed by (seed, epoch), so every pair is seen once per epoch and
    a resumed run reads the same rows as an uninterrupted one."""
    positions = torch.arange(it * count, (it + 1) * count)
    out = torch.empty(count, dtype=torch.long)
    for epoch in torch.unique(positions // num_pairs).tolist():
        perm = torch.randperm(num_pairs, generator=torch.Generator().manual_seed(noise_key(seed, epoch, PAIR_ORDER_DRAW)))
        here = positions // num_pairs == epoch
        out[here] = perm[positions[here] % num_pairs]
    return out


def fit_image(image: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """(3, H, W) in [0, 1] -> (3, height, width): resize so the image covers the target, then center-crop
    (DiffusionDPO's Resize + CenterCrop, bilinear with antialiasing)."""
    h, w = image.shape[-2:]
    scale = max(height / h, width / w)
    size = (max(height, round(h * scale)), max(width, round(w * scale)))
    resized = F.interpolate(image[None].float(), size=size, mode="bilinear", antialias=True, align_corners=False)[0]
    top, left = (size[0] - height) // 2, (size[1] - width) // 2
    return resized[:, top:top + height, left:left + width].clamp(0, 1)


@torch.no_grad()
def encode_images(adapter: PipelineAdapter, images: torch.Tensor) -> torch.Tensor:
    """Clean latents (B, *adapter.latent_shape()) of images (B, 3, H, W) in [0, 1] at the adapter's size: the
    inverse of the adapter's decode. The VAE posterior's mode (diffusers' img2img `retrieve_latents(...,
    sample_mode="argmax")`), shifted and scaled as SD3/FLUX pipelines do; FLUX latents are packed into 2x2 patches."""
    if adapter.family not in ("sd3", "flux"):
        raise ConfigError(f"offline Diffusion-DPO encodes the dataset's images with the VAE of an SD3 or FLUX pipeline; "
                          f"this one is {adapter.family}: use online DPO (unset dpo.pairs) or an SD3/FLUX model")
    vae = adapter.pipeline.vae
    pixels = (images * 2.0 - 1.0).to(adapter.device, vae.dtype)
    z = vae.encode(pixels).latent_dist.mode().float()
    z = (z - (vae.config.shift_factor or 0.0)) * vae.config.scaling_factor
    if adapter.family == "flux":
        b, c, h, w = z.shape
        z = adapter.pipeline._pack_latents(z, b, c, h, w)
    return z


@dataclass(eq=False)
class DatasetPairs(Samples):
    """This process's share of an iteration's pairs of the dataset, not yet read: `update` reads and encodes them
    one micro-batch at a time; `images` then holds the first micro-batch's chosen images."""

    it: int
    slots: torch.Tensor  # (P,) this process's pair slots of the iteration
    rows: torch.Tensor  # (P,) their dataset rows


class OfflineDiffusionDPO(Algorithm[DatasetPairs]):
    """Offline Diffusion-DPO on a preference-pair dataset (`dpo.pairs`; see the module docstring): the rollout stage
    picks the iteration's pairs, the update reads them and runs the DPO loss steps."""

    name = "dpo"

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.prompts, self.chosen, self.rejected, self.ties = load_preference_pairs(cfg.dpo.pairs)

    def _pixels(self, refs: list[Any], height: int, width: int) -> torch.Tensor:
        from mmreward.hf_datasets import decode_image
        from mmreward.media import load_image

        return torch.stack([fit_image(load_image(decode_image(r, None, "dpo.pairs")), height, width)
                            for r in refs])

    def rollout(self, run: Run, inputs: Inputs) -> DatasetPairs:
        """This process's share of the iteration's pairs (not read yet). The trainer's prompts are not used: the
        dataset brings its own."""
        check_flow_lora(self.name, run.adapter, run.policy, needs_reference=True)
        acc, n = run.accelerator, self.cfg.sample.prompts_per_iteration
        rows = pair_indices(len(self.prompts), n, self.cfg.train.seed, inputs.it)
        local = torch.arange(acc.process_index, n, acc.num_processes)  # this process's pair slots
        return DatasetPairs(it=inputs.it, slots=local, rows=rows[local])

    def update(self, samples: DatasetPairs, run: Run) -> dict[str, float]:
        """The DPO steps on the pairs, each read and encoded one micro-batch at a time as the steps reach it."""
        policy, adapter, acc, n = run.policy, run.adapter, run.accelerator, self.cfg.sample.prompts_per_iteration
        it, local, mine = samples.it, samples.slots, samples.rows
        shown: list[torch.Tensor] = []  # the first micro-batch's chosen images, for the run's grids

        def load(chunk: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, PromptEmbeds]:
            ids = mine[chunk].tolist()
            chosen = self._pixels([self.chosen[i] for i in ids], adapter.height, adapter.width)
            rejected = self._pixels([self.rejected[i] for i in ids], adapter.height, adapter.width)
            if not shown:  # (not every image of an iteration: 2048 pairs of pixels would not fit in memory)
                shown.append(chosen)
            with acc.autocast():
                x0_w, x0_l = encode_images(adapter, chosen), encode_images(adapter, rejected)
            # one prompt at a time, as the trainer encodes: an embedding does not depend on its batch
            return x0_w, x0_l, PromptEmbeds.cat([adapter.encode([self.prompts[i]]) for i in ids])

        metrics = train_dpo_pairs(self.cfg, it, policy, adapter, len(mine), load, local, torch.ones(len(mine)))
        metrics.update({"dpo/pairs": float(n), "dpo/dataset_pairs": float(len(self.prompts)),
                        "dpo/epoch": float((it + 1) * n / len(self.prompts))})
        samples.images = torch.cat(shown)
        return metrics

    def report(self, samples: DatasetPairs, timings: Timings) -> dict[str, float]:
        """One timing: picking, reading, encoding and training on the pairs."""
        return {"time/update_s": timings.rollout_s + timings.update_s}
