"""DGPO, Direct Group Preference Optimization (Luo et al., 2025, arXiv 2510.08425, "Reinforcing Diffusion Models
by Direct Group Preference Optimization"): a DPO-style loss over the groups of a prompt, on the forward process.

Each iteration samples `group_size` images per prompt with the current policy (deterministic ODE), scores them and
normalises the rewards within each group into advantages A (clipped to `advantage.clip_max`). The samples are then
re-noised at `dgpo.timesteps` schedule steps s shared by the whole batch, with one noise eps per group (the same for
every sample of a prompt and every trained step), x_t = (1 - s) x_0 + s eps. With the denoising-score-matching
errors of the policy and of the frozen reference,

    l_i = ||v_theta(x_t, t) - (eps - x_0)||^2,     l_ref_i = ||v_ref(x_t, t) - (eps - x_0)||^2     (means over elements)

the group preference of group g (its samples i, size G) is the Bradley-Terry likelihood of the advantage-weighted
positive part over the negative part, which is the DPO loss

    L_g = -log sigmoid( -beta / G * sum_{i in g} A_i (l_i - l_ref_i) )                              (`dgpo_group_loss`)

Its gradient is sigmoid(z_g) * beta / G * sum_i A_i grad l_i with z_g = beta / G * sum_i A_i (l_i - l_ref_i), so
the reference trains the surrogate mean_i w_g(i) A_i l_i with the group weight w_g = sigmoid(z_g) held constant
(`dgpo_loss`; the same gradient up to the positive factor G / (beta B)). A PPO-style clip stops the gradient of
l_i once the policy has moved far from the one that sampled (ratio r_i = exp(l_old_i - l_i)): for A_i > 0 when
r_i > 1 + clip_range, for A_i < 0 when r_i < 1 - clip_range. An optional velocity KL, kl_beta mean ||v - v_ref||^2.

Reference read: X-GenGroup/Flow-Factory@90cfd1c src/flow_factory/trainers/dgpo.py (`_compute_group_dgpo_loss`:
per_sample_term = A * beta_dpo * (dsm - ref_dsm) / group_size, scatter-added per group and all-reduced, loss =
mean(sigmoid(group_sum).detach() * A * dsm); the asymmetric DSM clip of `optimize`; timesteps shared by the batch,
noise shared per group) and its later form X-GenGroup/Flow-Factory@b30dc00 src/flow_factory/trainers/rl/dgpo.py
(the same loss; the group noise timestep-invariant within an inner epoch; whole groups per global micro-batch), and
examples/dgpo/lora/sd3_5/default.yaml (the official `pickscore_sd3_4gpu` preset of Luo-Yihong/DGPO: beta 10, 4 of
the noisiest 60% of 10 steps, clip 0.05, adv clip 5, KL 1e-3, group 24, lr 3e-4, LoRA r64 / a128, guidance 4.5).

What we simplify: the old policy of the clip is the policy at the start of the iteration (the reference's
behaviour before `switch_ema_ref` = 200 steps; after that it samples and clips with an EMA); the trained steps are
drawn from the sampling schedule's `sample.num_steps` sigmas (the noisiest `timestep_fraction` of them), counter-
based; a training forward holds whole groups (max(1, micro_batch_size // group_size) of them), so each group's
weight is exact without a collective; flow-matching (velocity) models only. The training forwards are conditional
(guidance 1) as in the later reference (rl/dgpo.py; the earlier dgpo.py passed the sampling CFG scale).
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F

from diffusion_rl.algorithms.dpo import RankedSamplesMethod, flow_matching_error, reference_velocity
from diffusion_rl.pipelines import PipelineAdapter, PromptEmbeds
from diffusion_rl.policy import Policy
from diffusion_rl.seeding import counter_noise, noise_key

DGPO_STEP_DRAW = -8  # the last counter of the seed of DGPO's shared training steps
DGPO_NOISE_STEP = 30_000  # the step counter of DGPO's per-group forward noise (+ inner epoch)


# ----------------------------------------------------------------------------------------------
# the paper's formulas (pure)
# ----------------------------------------------------------------------------------------------
def dgpo_group_loss(err: torch.Tensor, ref_err: torch.Tensor, advantages: torch.Tensor, groups: torch.Tensor,
                    beta: float, group_size: int) -> torch.Tensor:
    """The paper's per-group loss L_g = -log sigmoid(-beta / G sum_{i in g} A_i (l_i - l_ref_i)), (num groups,);
    `groups` holds each row's group index in 0..num_groups-1."""
    n = int(groups.max()) + 1
    z = torch.zeros(n, dtype=err.dtype, device=err.device).index_add(
        0, groups, advantages * beta * (err - ref_err.detach()) / group_size)
    return -F.logsigmoid(-z)


def dgpo_loss(err: torch.Tensor, ref_err: torch.Tensor, old_err: torch.Tensor, advantages: torch.Tensor,
              groups: torch.Tensor, beta: float, group_size: int, clip_range: float
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(scalar surrogate loss, per-row group weight sigmoid(z_g), per-row clipped mask) of the module docstring,
    from the per-row errors l (with grad), l_ref and l_old (constants), advantages A and group indices."""
    ratio = torch.exp(old_err.detach() - err.detach())
    clipped = torch.where(advantages > 0, ratio > 1.0 + clip_range, ratio < 1.0 - clip_range)
    dsm = torch.where(clipped, err.detach(), err)
    n = int(groups.max()) + 1
    z = torch.zeros(n, dtype=err.dtype, device=err.device).index_add(
        0, groups, advantages * beta * (err.detach() - ref_err.detach()) / group_size)
    weight = torch.sigmoid(z)[groups]
    return (weight * advantages * dsm).mean(), weight, clipped.float()


# ----------------------------------------------------------------------------------------------
# shared with CRD: forwards that hold whole groups
# ----------------------------------------------------------------------------------------------
def group_chunks(slots: torch.Tensor, rows: torch.Tensor, micro_batch_size: int, group_size: int
                 ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Split `rows` (whole groups, grouped by `slots`) into forwards of max(1, micro_batch_size // group_size)
    groups: a list of (rows, group index of each row in 0..k-1), groups in ascending slot order."""
    per = max(1, micro_batch_size // group_size)
    s = slots[rows]
    uniq = torch.unique(s)
    out = []
    for part in torch.split(uniq, per):
        members = [rows[s == g] for g in part.tolist()]
        out.append((torch.cat(members), torch.cat([torch.full((len(m),), k, dtype=torch.long)
                                                    for k, m in enumerate(members)])))
    return out


def group_minibatches(slots: torch.Tensor, num_minibatches: int) -> list[torch.Tensor]:
    """The rows of each minibatch: whole groups (ascending slot order) split into `num_minibatches` parts."""
    uniq = torch.unique(slots)
    return [torch.cat([torch.nonzero(slots == g).flatten() for g in part.tolist()])
            for part in torch.tensor_split(uniq, num_minibatches) if len(part)]


class DGPO(RankedSamplesMethod):
    """Direct Group Preference Optimization (see the module docstring): ranked samples, then `train_on_samples`."""

    name = "dgpo"

    def train_steps(self, it: int, epoch: int, num_steps: int) -> torch.Tensor:
        """The schedule steps trained this iteration and inner epoch, shared by every sample and process:
        `dgpo.timesteps` distinct ones among the noisiest ceil(timestep_fraction * num_steps)."""
        tc = self.cfg.train
        pool = max(1, min(num_steps, math.ceil(tc.timestep_fraction * num_steps - 1e-9)))
        gen = torch.Generator().manual_seed(noise_key(tc.seed, it, epoch, DGPO_STEP_DRAW))
        return torch.randperm(pool, generator=gen)[: min(self.cfg.dgpo.timesteps, pool)].sort().values

    needs_reference = True

    def train_on_samples(self, it: int, policy: Policy, adapter: PipelineAdapter, embeds: PromptEmbeds,
                         slots: torch.Tensor, sample_ids: torch.Tensor, x0_all: torch.Tensor, adv: torch.Tensor
                         ) -> dict[str, float]:
        """DGPO steps on every group."""
        del sample_ids  # the draws are per group (slot)
        return self._train(it, policy, adapter, embeds, slots.cpu(), x0_all, adv)

    def _train(self, it: int, policy: Policy, adapter: PipelineAdapter, embeds: PromptEmbeds, slots: torch.Tensor,
               x0_all: torch.Tensor, adv_all: torch.Tensor) -> dict[str, float]:
        cfg, acc, tc = self.cfg, policy.accelerator, self.cfg.train
        # the policy, old and reference velocities are the conditional ones (guidance 1), whatever CFG sampled the
        # images: X-GenGroup/Flow-Factory@b30dc00 rl/dgpo.py `_forward_velocities` (guidance_scale=1.0; kl_cfg 1)
        gs, g_size = 1.0, cfg.sample.group_size
        clip_max = cfg.advantage.clip_max if cfg.advantage.clip_max is not None else math.inf
        adv_all = adv_all.clamp(-clip_max, clip_max)
        schedule = adapter.schedule(cfg.sample.num_steps)
        shape = adapter.latent_shape()
        stats: dict[str, list[float]] = {"loss": [], "weight": [], "clip_fraction": [], "kl": [], "dsm": []}
        grad_norms = []
        model = policy.model
        for epoch in range(tc.num_inner_epochs):
            steps = self.train_steps(it, epoch, cfg.sample.num_steps)
            # one noise per group for every trained step of this inner epoch (the reference's shared noise)
            eps_of = {g: counter_noise(shape, tc.seed, it, [g], [0], DGPO_NOISE_STEP + epoch, acc.device)[0].float()
                      for g in torch.unique(slots).tolist()}
            minibatches = group_minibatches(slots, tc.num_minibatches)
            plan = [group_chunks(slots, mb, tc.micro_batch_size, g_size) for mb in minibatches]

            def noised(rows: torch.Tensor, j: int, eps_of: dict[int, torch.Tensor] = eps_of
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
                x0 = x0_all[rows].to(acc.device)
                eps = torch.stack([eps_of[int(g)] for g in slots[rows].tolist()])
                sigma = schedule.a[j].to(acc.device, torch.float32)
                t = schedule.timesteps[j].to(acc.device).expand(len(rows))
                return x0, eps, (1.0 - sigma) * x0 + sigma * eps, t

            # the old policy of the clip: the weights before this inner epoch's first update. With one optimizer
            # step per epoch every forward is on-policy (ratio 1), so its errors are the policy's own.
            old_err: dict[tuple[int, int, int], torch.Tensor] = {}
            if len(minibatches) > 1:
                model.eval()
                with torch.no_grad(), acc.autocast():
                    for m_i, chunks in enumerate(plan):
                        for c_i, (rows, _) in enumerate(chunks):
                            for j in steps.tolist():
                                x0, eps, x_t, t = noised(rows, j)
                                v_old = adapter.predict(policy.unwrapped, x_t, t, embeds.index(rows), gs).float()
                                old_err[m_i, c_i, j] = flow_matching_error(v_old, x0, eps)
            for m_i, (mb, chunks) in enumerate(zip(minibatches, plan, strict=True)):
                n_backward, count = len(chunks) * len(steps), 0
                for c_i, (rows, groups) in enumerate(chunks):
                    emb = embeds.index(rows)
                    adv = adv_all[rows].to(acc.device).float()
                    for j in steps.tolist():
                        x0, eps, x_t, t = noised(rows, j)
                        v_ref = reference_velocity(policy, adapter, x_t, t, emb, gs)
                        ref_err = flow_matching_error(v_ref, x0, eps)
                        model.train()
                        count += 1
                        with contextlib.nullcontext() if count == n_backward else acc.no_sync(model):
                            with acc.autocast():
                                v = adapter.predict(model, x_t, t, emb, gs).float()
                            err = flow_matching_error(v, x0, eps)
                            old = old_err.get((m_i, c_i, j), err.detach())
                            loss, weight, clipped = dgpo_loss(err, ref_err, old, adv, groups.to(acc.device),
                                                              self.cfg.dgpo.beta, g_size, tc.clip_range)
                            if tc.kl_beta > 0:
                                kl = ((v - v_ref) ** 2).mean()  # the reference's velocity-space KL
                                loss = loss + tc.kl_beta * kl
                                stats["kl"].append(float(kl.detach()))
                            # the mean over the minibatch's samples and the trained steps
                            acc.backward(loss * len(rows) / len(mb) / len(steps))
                        stats["loss"].append(float(loss.detach()))
                        stats["weight"].append(float(weight.mean()))
                        stats["clip_fraction"].append(float(clipped.mean()))
                        stats["dsm"].append(float(err.detach().mean()))
                gn = policy.step()
                if gn is not None:
                    grad_norms.append(gn)
        out = {"train/loss" if k == "loss" else f"dgpo/{k}": sum(v) / len(v) for k, v in stats.items() if v}
        if grad_norms:
            out["train/grad_norm"] = sum(grad_norms) / len(grad_norms)
        return out
