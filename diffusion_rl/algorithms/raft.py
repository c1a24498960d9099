"""RAFT (Dong et al., 2023, arXiv 2304.06767): reward-ranked fine-tuning, i.e. iterative best-of-N then
supervised fine-tuning on the winners.

Each iteration samples `group_size` images per prompt with the current policy (deterministic ODE), keeps
the `raft.top_k` of each group with the highest reward (`top_k_per_group`, ranked by the group-normalised
advantage so several rewards combine as in GRPO), and fine-tunes on them with the ordinary forward-process
loss of the model: on a flow model the flow-matching loss

    L = mean over winners of ||v_theta(x_t, t) - (eps - x_0)||^2,   x_t = (1 - s) x_0 + s eps

at a random schedule step s with fresh noise eps (`raft_loss`). No likelihoods, no ratio, no reference.
`train.num_inner_epochs` passes go over the winners, each with a new (t, eps) per winner.

Reference read: OptimalScale/LMFlow@613bba0 experimental/RAFT-diffusion/SD256-RAFT.ipynb with its
train_text_to_image_lora.py (SD 1.5 at 256 px, 10 images per prompt, the best of each prompt, then the
top 8 prompts by that best score; LoRA, lr 9e-6, batch 8, 10 passes (80 steps) per round, max grad norm 1,
constant schedule). Differences: the k best of *every* group are kept (the reference keeps the best of each
prompt, then only the top-k prompts across the batch); flow-matching (velocity) models only; the step is
drawn from the sampling schedule's `sample.num_steps` sigmas (the SD reference draws t in [0, 1000)); the
training forwards use `sample.guidance_scale` as DiffusionNFT here does (guidance 1 trains the conditional
prediction the reference trains).
"""

from __future__ import annotations

import contextlib

import torch

from diffusion_rl.algorithms.dpo import RankedSamplesMethod, flow_matching_error, forward_draw
from diffusion_rl.pipelines import PipelineAdapter, PromptEmbeds
from diffusion_rl.policy import Policy


def top_k_per_group(scores: torch.Tensor, groups: torch.Tensor, k: int) -> torch.Tensor:
    """Rows of the k highest scores of each group (ties: the earlier row first), groups in ascending order,
    each group's rows best first."""
    keep = []
    for g in torch.unique(groups).tolist():
        rows = torch.nonzero(groups == g).flatten()
        # a stable sort of -score keeps the earlier row first among equal scores
        order = torch.sort(-scores[rows].double(), stable=True).indices[:k]
        keep.append(rows[order])
    return torch.cat(keep) if keep else torch.zeros(0, dtype=torch.long)


def raft_loss(v: torch.Tensor, x0: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """The supervised flow-matching loss on winners x_0: mean over them of ||v - (eps - x_0)||^2 (a scalar)."""
    return flow_matching_error(v, x0, eps).mean()


class RAFT(RankedSamplesMethod):
    """Reward-ranked fine-tuning (see the module docstring): ranked samples, then `train_on_samples`."""

    name = "raft"

    needs_reference = False

    def train_on_samples(self, it: int, policy: Policy, adapter: PipelineAdapter, embeds: PromptEmbeds,
                         slots: torch.Tensor, sample_ids: torch.Tensor, x0_all: torch.Tensor, adv: torch.Tensor
                         ) -> dict[str, float]:
        """Keep each group's top k, then supervised steps on them."""
        winners = top_k_per_group(adv, slots.cpu(), self.cfg.raft.top_k)
        metrics = self._train(it, policy, adapter, embeds, slots, sample_ids, x0_all, winners)
        acc = policy.accelerator  # over all processes
        metrics["raft/winners"] = float(acc.gather(torch.tensor([len(winners)], device=acc.device)).sum())
        return metrics

    def _train(self, it: int, policy: Policy, adapter: PipelineAdapter, embeds: PromptEmbeds, slots: torch.Tensor,
               sample_ids: torch.Tensor, x0_all: torch.Tensor, winners: torch.Tensor) -> dict[str, float]:
        cfg, acc, tc = self.cfg, policy.accelerator, self.cfg.train
        gs = cfg.sample.guidance_scale
        losses, grad_norms = [], []
        model = policy.model
        for epoch in range(tc.num_inner_epochs):
            # minibatches hold whole groups (k winners each), so every process steps equally often
            for mb in torch.tensor_split(winners, tc.num_minibatches):
                chunks = [c for c in torch.split(mb, tc.micro_batch_size) if len(c)]
                model.train()
                for c_i, rows in enumerate(chunks):
                    draws = [forward_draw(adapter, cfg.sample.num_steps, tc.seed, it, int(slots[r]),
                                          int(sample_ids[r]), acc.device, draw=epoch) for r in rows.tolist()]
                    sigma = torch.stack([d[0] for d in draws])
                    t = torch.stack([d[1] for d in draws])
                    eps = torch.stack([d[2] for d in draws])
                    x0 = x0_all[rows].to(acc.device)
                    view = (-1,) + (1,) * (x0.dim() - 1)
                    x_t = (1.0 - sigma.view(view)) * x0 + sigma.view(view) * eps
                    with contextlib.nullcontext() if c_i == len(chunks) - 1 else acc.no_sync(model):
                        with acc.autocast():
                            v = adapter.predict(model, x_t, t, embeds.index(rows), gs).float()
                        loss = raft_loss(v, x0, eps)
                        acc.backward(loss * len(rows) / len(mb))  # the mean over the minibatch's winners
                    losses.append(float(loss.detach()))
                gn = policy.step()
                if gn is not None:
                    grad_norms.append(gn)
        out = {"train/loss": sum(losses) / len(losses)} if losses else {}
        if grad_norms:
            out["train/grad_norm"] = sum(grad_norms) / len(grad_norms)
        return out
