"""AWM, Advantage Weighted Matching (Xue et al., 2025, arXiv 2509.25050, "Advantage Weighted Matching: Aligning
RL with Pretraining in Diffusion Models"): the pretraining flow-matching loss, weighted per sample by its
group-normalised advantage.

Each iteration samples `group_size` images per prompt with the current policy (deterministic ODE), scores them
and normalises the rewards within each group into advantages A (`diffusion_rl.advantages`, as GRPO). Every
sample x_0 is then re-noised at a random schedule step s with fresh noise eps, x_t = (1 - s) x_0 + s eps, and
its flow-matching "log-likelihood" is log p = -||v_theta(x_t, t) - (eps - x_0)||^2 (mean over elements). The
loss is a PPO-clipped advantage weighting of that likelihood (`awm_loss`):

    r = exp(log p_theta - log p_old),  A' = clip(A, -awm.adv_clip, awm.adv_clip)
    L = mean_i max(-A'_i r_i, -A'_i clip(r_i, 1 - clip_range, 1 + clip_range)) + kl_beta mean ||v - v_ref||^2

At r = 1 (the first pass: log p_old is the current model's own value) the gradient is that of
mean_i A'_i ||v_theta - (eps_i - x0_i)||^2, the advantage-weighted matching loss of the paper.

Reference read: X-GenGroup/Flow-Factory@a0b2bc5 src/flow_factory/trainers/awm.py (`compute_weighted_log_prob`,
`optimize`) and examples/awm/lora/sd3_5/default.yaml (lr 3e-4, LoRA r32/a64, 14 ODE steps, guidance 1, group
16, adv_clip_range 1, clip_range 1, kl_beta 1e-4 in velocity space, grad norm 1). What we simplify: only the
'Uniform' weighting of the matching error (the reference also offers t, t**2, huber and the preset's 'ghuber');
one training step s per sample and inner epoch, drawn uniformly from the sampling schedule's `sample.num_steps`
sigmas (the reference trains 6 discrete steps per sample, time-shifted); the old log-likelihood is the current
model's just before each micro-batch's update (the reference's per-batch precompute), with no EMA sampling
policy and no EMA-KL term; flow-matching (velocity) models only; training forwards use `sample.guidance_scale`.
"""

from __future__ import annotations

import contextlib

import torch

from diffusion_rl.algorithms.dpo import (
    RankedSamplesMethod,
    flow_matching_error,
    forward_draw,
    reference_velocity,
)
from diffusion_rl.pipelines import PipelineAdapter, PromptEmbeds
from diffusion_rl.policy import Policy


def awm_loss(v: torch.Tensor, x0: torch.Tensor, eps: torch.Tensor, advantages: torch.Tensor,
             old_log_prob: torch.Tensor, clip_range: float, adv_clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(scalar loss, per-sample ratio r) of AWM's clipped advantage-weighted matching (module docstring)."""
    log_prob = -flow_matching_error(v.double(), x0.double(), eps.double())  # fp64 as the reference: r is exp of a difference
    adv = advantages.double().clamp(-adv_clip, adv_clip)
    ratio = torch.exp(log_prob - old_log_prob.double())
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_range, 1.0 + clip_range)
    return torch.maximum(unclipped, clipped).mean().float(), ratio.detach().float()


class AWM(RankedSamplesMethod):
    """Advantage Weighted Matching (see the module docstring): ranked samples, then `train_on_samples`."""

    name = "awm"

    def train_on_samples(self, it: int, policy: Policy, adapter: PipelineAdapter, embeds: PromptEmbeds,
                         slots: torch.Tensor, sample_ids: torch.Tensor, x0_all: torch.Tensor, adv: torch.Tensor
                         ) -> dict[str, float]:
        """Advantage-weighted flow-matching steps on every sample."""
        cfg, acc, tc = self.cfg, policy.accelerator, self.cfg.train
        gs = cfg.sample.guidance_scale
        stats: dict[str, list[float]] = {"loss": [], "ratio": [], "kl": []}
        grad_norms = []
        model = policy.model
        rows_all = torch.arange(len(x0_all))
        for epoch in range(tc.num_inner_epochs):
            # minibatches hold whole groups, so every process steps equally often
            for mb in torch.tensor_split(rows_all, tc.num_minibatches):
                chunks = [c for c in torch.split(mb, tc.micro_batch_size) if len(c)]
                for c_i, rows in enumerate(chunks):
                    draws = [forward_draw(adapter, cfg.sample.num_steps, tc.seed, it, int(slots[r]),
                                          int(sample_ids[r]), acc.device, draw=epoch) for r in rows.tolist()]
                    sigma = torch.stack([d[0] for d in draws])
                    t = torch.stack([d[1] for d in draws])
                    eps = torch.stack([d[2] for d in draws])
                    x0 = x0_all[rows].to(acc.device)
                    view = (-1,) + (1,) * (x0.dim() - 1)
                    x_t = (1.0 - sigma.view(view)) * x0 + sigma.view(view) * eps
                    emb = embeds.index(rows)
                    model.eval()
                    with torch.no_grad(), acc.autocast():  # log p_old: the policy before this update
                        v_old = adapter.predict(policy.unwrapped, x_t, t, emb, gs).float()
                    old_log_prob = -flow_matching_error(v_old.double(), x0.double(), eps.double())
                    v_ref = reference_velocity(policy, adapter, x_t, t, emb, gs) if tc.kl_beta > 0 else None
                    model.train()
                    with contextlib.nullcontext() if c_i == len(chunks) - 1 else acc.no_sync(model):
                        with acc.autocast():
                            v = adapter.predict(model, x_t, t, emb, gs).float()
                        loss, ratio = awm_loss(v, x0, eps, adv[rows].to(acc.device), old_log_prob,
                                               tc.clip_range, self.cfg.awm.adv_clip)
                        if v_ref is not None:
                            kl = ((v - v_ref) ** 2).mean()  # the reference's velocity-space KL
                            loss = loss + tc.kl_beta * kl
                            stats["kl"].append(float(kl.detach()))
                        acc.backward(loss * len(rows) / len(mb))  # the mean over the minibatch's samples
                    stats["loss"].append(float(loss.detach()))
                    stats["ratio"].append(float(ratio.mean()))
                gn = policy.step()
                if gn is not None:
                    grad_norms.append(gn)
        out = {"train/loss" if k == "loss" else f"awm/{k}": sum(v) / len(v) for k, v in stats.items() if v}
        if grad_norms:
            out["train/grad_norm"] = sum(grad_norms) / len(grad_norms)
        return out
