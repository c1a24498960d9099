"""CRD, Centered Reward Distillation (arXiv 2603.14128, "Diffusion Reinforcement Learning via Centered Reward
Distillation"): regress the policy's implicit reward onto the external reward, both centred within a prompt's group.

Each iteration samples `group_size` images per prompt with a slowly moving "sampling" copy of the weights
(deterministic ODE), scores them and normalises the rewards within each group into advantages A, mapped to
u = clip(A / (2 A_max) + 1/2, 0, 1) with A clipped to [-A_max, A_max] (`advantage.clip_max`). Every sample x_0 is
re-noised at a `timestep_fraction` of the schedule steps, x_t = (1 - s) x_0 + s eps, and its implicit reward is the
improvement of the policy's flow-matching error over that of an "old" copy of the weights,

    r_theta_i = -mean[ (v_theta - v*)^2 / w_theta_i - (v_old - v*)^2 / w_old_i ],   v* = eps - x_0        (`implicit_reward`)

(w = mean |v - v*| per sample, no gradient, at least 1e-5: the adaptive weighting; 1 when `crd.adaptive_logp` is
off). Both rewards are centred within the group, R_c = u - sum_j p_j u_j and R_theta_c = r_theta - sum_j p_j r_theta_j
(the second mean held constant), with p uniform (`crd.weight_temp` < 0), softmax(u / T) and softmax(-u / T) for
the two directions of the dual centring (T > 0), or hard selection (T = 0: as the reference writes it, the masks
u > 0 and u < 0 of the [0, 1]-normalised u, so every sample but the worst and uniform weights). The loss
matches them,

    L = A_max / beta * mean (beta R_theta_c - R_c)^2                                               (`crd_loss`, 'mse')

(or the BCE of logits beta R_theta_c against sigmoid(R_c)), plus the velocity KL to the reference, evaluated with
CFG `crd.kl_cfg`: kl_beta mean_i c_i ||v_theta - v_ref||^2, c_i = m + u_i (1 - m), m = 1e-4 / kl_beta, when
`crd.reward_adaptive_kl` is on (c_i = 1 otherwise) (`crd_kl`). After every iteration the old and the sampling
copies move towards the trained weights, copy <- d copy + (1 - d) theta, with d = min(d0 + slope (step - start),
end) from optimizer step `start` on (d0 before it) (`decay`): `crd.old_decay` and `crd.sampling_decay`, each
[start, d0, slope, end].

Reference read: X-GenGroup/Flow-Factory@396dd6e src/flow_factory/trainers/crd.py (`compute_decay`,
`_compute_crd_loss`, the implicit reward, advantage normalisation, loss scale adv_clip_max / crd_beta and the
reward-adaptive KL of `optimize`) and examples/crd/lora/sd3_5/default.yaml (the paper's Table 3 OCR setting: beta 1,
mse, old decay 0-0.25-0.005-0.999, sampling decay 75-0.0-0.0075-0.999, KL 0.1 at CFG 4.5, reward-adaptive KL,
adv clip 5, 10 steps at guidance 1, group 24, 48 prompts, 2 optimizer steps per iteration, lr 3e-4, LoRA r32 / a64).

What we simplify: the centring is within each prompt's group (the reference centres over the gathered
micro-batch, which its sampler fills with samples of one prompt); the trained steps are a counter-based random
`timestep_fraction` of the sampling schedule's steps per sample with fresh noise (the reference draws 20 discrete
times from the noisiest 99%); the copies are parameter tensors swapped in for their forwards (the reference keeps
extra LoRA adapters), so FSDP runs are refused; a training forward holds whole groups; flow models only. Both
copies are checkpointed (`tensor_state`, safetensors), so a resumed run is exact.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F

from diffusion_rl.algorithms.dgpo import group_chunks, group_minibatches
from diffusion_rl.algorithms.dpo import RankedSamplesMethod, reference_velocity
from diffusion_rl.algorithms.nft import FORWARD_NOISE_STEP, optimality_probability
from diffusion_rl.pipelines import PipelineAdapter, PromptEmbeds
from diffusion_rl.policy import Policy
from diffusion_rl.seeding import counter_noise, noise_key
from mmreward.errors import CheckpointError, ConfigError

CRD_STEP_DRAW = -9  # the last counter of the seed of CRD's trained steps
COPIES = ("old", "sampling")


# ----------------------------------------------------------------------------------------------
# the paper's formulas (pure)
# ----------------------------------------------------------------------------------------------
def decay(step: int, schedule: Sequence[float]) -> float:
    """d at optimizer step `step` of a [start, d0, slope, end] schedule: d0 before `start`, then
    min(d0 + slope (step - start), end)."""
    start, d0, slope, end = schedule
    if step < start:
        return float(d0)
    return float(min(d0 + (step - start) * slope, end))


def implicit_reward(v: torch.Tensor, v_old: torch.Tensor, target: torch.Tensor, *, adaptive: bool) -> torch.Tensor:
    """r_theta (B,): minus the change of the (adaptively weighted) squared velocity error from the old copy."""
    dims = tuple(range(1, v.dim()))
    v_old = v_old.detach()
    if adaptive:
        with torch.no_grad():
            w = (v.double() - target.double()).abs().mean(dim=dims, keepdim=True).clamp(min=1e-5)
            w_old = (v_old.double() - target.double()).abs().mean(dim=dims, keepdim=True).clamp(min=1e-5)
        r = -((v - target) ** 2 / w - (v_old - target) ** 2 / w_old)
    else:
        r = -((v - target) ** 2 - (v_old - target) ** 2)
    return r.mean(dim=dims)  # fp64 with the adaptive weights, as the reference (the weights are fp64)


def _centre(values: torch.Tensor, p: torch.Tensor, groups: torch.Tensor, n: int) -> torch.Tensor:
    """sum_{j in g} p_j values_j for each row's group g."""
    return torch.zeros(n, dtype=values.dtype, device=values.device).index_add(0, groups, p * values)[groups]


def _group_softmax(logits: torch.Tensor, groups: torch.Tensor, n: int) -> torch.Tensor:
    """softmax of `logits` within each group (logits may hold -inf; a group of -inf only is uniform)."""
    out = torch.empty_like(logits)
    for g in range(n):
        rows = groups == g
        lg = logits[rows]
        out[rows] = torch.softmax(lg, 0) if torch.isfinite(lg).any() else torch.full_like(lg, 1.0 / len(lg))
    return out


def crd_loss(r_theta: torch.Tensor, u: torch.Tensor, groups: torch.Tensor, beta: float, weight_temp: float,
             loss_type: str, adv_clip: float) -> torch.Tensor:
    """The scaled CRD loss A_max / beta * (centred-reward matching), centring within each group (module docstring)."""
    n = int(groups.max()) + 1
    u = u.to(r_theta.dtype)

    def match(p: torch.Tensor) -> torch.Tensor:
        rc = u - _centre(u, p, groups, n)
        rtc = r_theta - _centre(r_theta.detach(), p, groups, n)
        if loss_type == "bce":
            return F.binary_cross_entropy_with_logits(beta * rtc, torch.sigmoid(rc.detach()))
        return ((beta * rtc - rc) ** 2).mean()

    if weight_temp < 0:  # uniform weights: the plain group mean
        sizes = torch.zeros(n, dtype=u.dtype, device=u.device).index_add(0, groups, torch.ones_like(u))
        core = match(1.0 / sizes[groups])
    else:
        neg_inf = torch.full_like(u, -math.inf)
        if weight_temp == 0:  # hard selection, as the reference masks it: u > 0 and u < 0 (u is in [0, 1])
            p_plus = _group_softmax(torch.where(u > 0, u, neg_inf), groups, n)
            p_minus = _group_softmax(torch.where(u < 0, u, neg_inf), groups, n)
        else:
            p_plus = _group_softmax(u / weight_temp, groups, n)
            p_minus = _group_softmax(-u / weight_temp, groups, n)
        core = 0.5 * match(p_plus) + 0.5 * match(p_minus)
    return core * adv_clip / max(beta, 1e-8)


def crd_kl(v: torch.Tensor, v_ref: torch.Tensor, u: torch.Tensor, kl_beta: float, *, reward_adaptive: bool
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """(kl_beta-weighted KL term, per-sample ||v - v_ref||^2) with the reward-adaptive coefficients."""
    kl = ((v - v_ref.detach()) ** 2).mean(dim=tuple(range(1, v.dim())))
    if reward_adaptive:
        m = 1e-4 / max(kl_beta, 1e-8)
        return kl_beta * ((m + u.to(kl.dtype) * (1.0 - m)) * kl).mean(), kl
    return kl_beta * kl.mean(), kl


# ----------------------------------------------------------------------------------------------
# the method
# ----------------------------------------------------------------------------------------------
class CRD(RankedSamplesMethod):
    """Centered Reward Distillation (see the module docstring): ranked samples, then `train_on_samples`."""

    name = "crd"

    def __init__(self, cfg, rewards) -> None:  # noqa: ANN001 - as RankedSamplesMethod
        super().__init__(cfg, rewards)
        self.copies: dict[str, list[torch.Tensor]] | None = None

    @contextlib.contextmanager
    def weights(self, policy: Policy, which: str) -> Iterator[None]:
        """Inside the block the model holds the `which` copy's weights."""
        assert self.copies is not None
        for p, o in zip(policy.trainable, self.copies[which], strict=True):
            p.data, o.data = o.data, p.data
        try:
            yield
        finally:
            for p, o in zip(policy.trainable, self.copies[which], strict=True):
                p.data, o.data = o.data, p.data

    def tensor_state(self) -> dict[str, torch.Tensor] | None:
        """The old and sampling copies for the checkpoint (None before the first iteration creates them)."""
        if self.copies is None:
            return None
        return {f"{c}.{i}": o.detach().cpu().contiguous() for c in COPIES for i, o in enumerate(self.copies[c])}

    def load_tensor_state(self, tensors: dict[str, torch.Tensor], policy: Policy) -> None:
        """Restore the copies saved by `tensor_state`, one tensor per trained parameter each."""
        keys = {c: [f"{c}.{i}" for i in range(len(policy.trainable))] for c in COPIES}
        if sorted(tensors) != sorted(k for c in COPIES for k in keys[c]) or any(
                tuple(tensors[k].shape) != tuple(p.shape) for c in COPIES
                for k, p in zip(keys[c], policy.trainable, strict=True)):
            raise CheckpointError(f"the checkpoint's crd copies ({len(tensors)} tensors) do not fit this model's "
                                  f"2 x {len(policy.trainable)} trained parameters (different LoRA config?)")
        self.copies = {c: [tensors[k].to(p.device, p.dtype).clone() for k, p in zip(keys[c], policy.trainable,
                                                                                    strict=True)] for c in COPIES}

    @torch.no_grad()
    def update_copies(self, policy: Policy) -> dict[str, float]:
        cc, out = self.cfg.crd, {}
        for c, schedule in (("old", cc.old_decay), ("sampling", cc.sampling_decay)):
            d = decay(policy.steps, schedule)
            for p, o in zip(policy.trainable, self.copies[c], strict=True):
                o.mul_(d).add_(p.detach(), alpha=1.0 - d)
            out[f"crd/{c}_decay"] = d
        return out

    def train_steps(self, it: int, slots: torch.Tensor, sample_ids: torch.Tensor, num_steps: int) -> torch.Tensor:
        """(N, k): each sample's trained schedule steps, a counter-based random `timestep_fraction` of them."""
        k = max(1, int(num_steps * self.cfg.train.timestep_fraction))
        rows, gen = [], torch.Generator()
        for p, i in zip(slots.tolist(), sample_ids.tolist()):
            gen.manual_seed(noise_key(self.cfg.train.seed, it, p, i, CRD_STEP_DRAW))
            rows.append(torch.randperm(num_steps, generator=gen)[:k])
        return torch.stack(rows)

    def prepare(self, policy: Policy) -> None:
        if policy.sharded:
            raise ConfigError("train.algorithm 'crd' swaps in copies of the trained weights, which FSDP-sharded "
                              "parameters do not allow: run it with DDP (or one process)")
        if self.copies is None:
            self.copies = {c: [p.detach().clone() for p in policy.trainable] for c in COPIES}

    def sampling_weights(self, policy: Policy) -> contextlib.AbstractContextManager:
        return self.weights(policy, "sampling")

    def train_on_samples(self, it: int, policy: Policy, adapter: PipelineAdapter, embeds: PromptEmbeds,
                         slots: torch.Tensor, sample_ids: torch.Tensor, x0_all: torch.Tensor, adv: torch.Tensor
                         ) -> dict[str, float]:
        """CRD steps, then move both copies towards the trained weights."""
        metrics = self._train(it, policy, adapter, embeds, slots.cpu(), sample_ids.cpu(), x0_all, adv)
        metrics.update(self.update_copies(policy))
        return metrics

    def _train(self, it: int, policy: Policy, adapter: PipelineAdapter, embeds: PromptEmbeds, slots: torch.Tensor,
               sample_ids: torch.Tensor, x0_all: torch.Tensor, adv: torch.Tensor) -> dict[str, float]:
        cfg, acc, tc, cc = self.cfg, policy.accelerator, self.cfg.train, self.cfg.crd
        gs = cfg.sample.guidance_scale
        clip_max = cfg.advantage.clip_max if cfg.advantage.clip_max is not None else 1.0
        u_all = optimality_probability(adv, clip_max)  # the reference's advantages normalised to [0, 1]
        schedule = adapter.schedule(cfg.sample.num_steps)
        shape = adapter.latent_shape()
        stats: dict[str, list[float]] = {"loss": [], "policy_loss": [], "kl": [], "r_theta": []}
        grad_norms = []
        model, unwrapped = policy.model, policy.unwrapped
        for epoch in range(tc.num_inner_epochs):
            steps = self.train_steps(it + 7919 * epoch, slots, sample_ids, cfg.sample.num_steps)
            k = steps.shape[1]
            for mb in group_minibatches(slots, tc.num_minibatches):
                chunks = group_chunks(slots, mb, tc.micro_batch_size, cfg.sample.group_size)
                n_backward, count = len(chunks) * k, 0
                for rows, groups in chunks:
                    emb = embeds.index(rows)
                    x0 = x0_all[rows].to(acc.device)
                    u = u_all[rows].to(acc.device)
                    groups = groups.to(acc.device)
                    view = (-1,) + (1,) * (x0.dim() - 1)
                    for s_i in range(k):
                        j = steps[rows, s_i]
                        sigma = schedule.a[j].to(acc.device, torch.float32)
                        t = schedule.timesteps[j].to(acc.device)
                        eps = torch.stack([counter_noise(shape, tc.seed, it, [int(p)], [int(i)],
                                                         FORWARD_NOISE_STEP + epoch * cfg.sample.num_steps + int(jj),
                                                         acc.device)[0]
                                           for p, i, jj in zip(slots[rows].tolist(), sample_ids[rows].tolist(),
                                                               j.tolist())]).float()
                        x_t = (1.0 - sigma.view(view)) * x0 + sigma.view(view) * eps
                        target = eps - x0
                        model.eval()
                        with torch.no_grad(), self.weights(policy, "old"), acc.autocast():
                            v_old = adapter.predict(unwrapped, x_t, t, emb, gs).float()
                        v_ref = (reference_velocity(policy, adapter, x_t, t, emb, cc.kl_cfg)
                                 if tc.kl_beta > 0 else None)
                        model.train()
                        count += 1
                        with contextlib.nullcontext() if count == n_backward else acc.no_sync(model):
                            with acc.autocast():
                                v = adapter.predict(model, x_t, t, emb, gs).float()
                            r_theta = implicit_reward(v, v_old, target, adaptive=cc.adaptive_logp)
                            pl = crd_loss(r_theta, u, groups, cc.beta, cc.weight_temp, cc.loss, clip_max)
                            loss = pl
                            if v_ref is not None:
                                kl_term, kl = crd_kl(v, v_ref, u, tc.kl_beta, reward_adaptive=cc.reward_adaptive_kl)
                                loss = loss + kl_term
                                stats["kl"].append(float(kl.detach().mean()))
                            # the mean over the minibatch's samples and the trained steps
                            acc.backward(loss * len(rows) / len(mb) / k)
                        stats["loss"].append(float(loss.detach()))
                        stats["policy_loss"].append(float(pl.detach()))
                        stats["r_theta"].append(float(r_theta.detach().mean()))
                gn = policy.step()
                if gn is not None:
                    grad_norms.append(gn)
        out = {f"train/{k}" if k in ("loss", "policy_loss") else f"crd/{k}": sum(v) / len(v)
               for k, v in stats.items() if v}
        if grad_norms:
            out["train/grad_norm"] = sum(grad_norms) / len(grad_norms)
        return out
