"""PRDP, Proximal Reward Difference Prediction (Deng et al., CVPR 2024, arXiv 2402.08714, "PRDP: Proximal Reward
Difference Prediction for Large-Scale Reward Finetuning of Diffusion Models").

The KL-regularised objective max E[r(x_0, c)] - beta KL(pi_theta || pi_ref) has the optimum
pi*(x|c) = pi_ref(x|c) exp(r(x_0, c) / beta) / Z(c); for two denoising trajectories x^a, x^b of one prompt the
partition function cancels, so the model is trained to *predict the reward difference* of a pair from its
trajectories' log-likelihood ratios (the paper's Eqs. 10-14, the RDP objective):

    r_hat_theta(x, c) = sum_t r_hat_theta,t,   r_hat_theta,t = log pi_theta(x_{t-1} | x_t, c) - log pi_ref(x_{t-1} | x_t, c)
    l_theta(x^a, x^b, c) = ( r_hat_theta(x^a, c) - r_hat_theta(x^b, c) - (r(x^a_0, c) - r(x^b_0, c)) / beta )^2

Online (Sec. 3.2, Algorithm 1): each iteration samples B trajectories per prompt with the current policy
(pi_theta_old), scores them, and averages l over all B (B - 1) / 2 pairs of every prompt. Proximal updates (Sec. 3.3,
Eqs. 16-21): every step's r_hat_theta,t is clipped to within eps of the old policy's,

    r_hat^clip_theta,t = clip(r_hat_theta,t, r_hat_theta_old,t - eps, r_hat_theta_old,t + eps),  r_hat^clip = sum_t r_hat^clip_t

and the loss of a pair is max(l_theta, l^clip_theta) (Eq. 18), as PPO does (`rdp_loss`). Here beta is
`prdp.beta` and eps `train.clip_range`; the rollouts are the trainer's SDE/DDIM rollouts with log-probs (as
GRPO/DDPO), the reward r the run's weighted reward sum, pi_ref the model without its LoRA, or for full fine-tuning
the frozen copy that `train.kl_reference: copy` with `train.kl_beta > 0` keeps (kl_beta adds no term: beta is the
KL weight, as online DPO does it).

The loss is a square of a sum over steps, so its gradient is not a sum of per-step losses. It is computed exactly
with one step's activations at a time: a no-grad pass gives every r_hat_theta,t of a minibatch, autograd of `rdp_loss`
on those values gives dl/dr_hat_theta,t, and a second pass backpropagates sum_t dl/dr_hat_t * log pi_theta,t step by
step (the reference term is a constant).

Reference read: the paper (CVPR 2024 open-access text: Eqs. 7-21, Algorithm 1, Sec. 4.1); no code was released.
What we simplify: the preset trains a LoRA against the LoRA-free model (the paper fine-tunes the full UNet against
a frozen copy, which the config above gives);
the sums over t run over the trained SDE steps (`train.timestep_fraction`, `sample.sde_window`; the preset trains all
of them, as the paper does); the step-level clip range, learning rate and gradient steps per epoch K are in the
paper's appendix, which we did not have: the preset takes DDPO's (clip 1e-4, lr 3e-4, K = 2), the baseline the paper
matches them against.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from diffusion_rl import memory_settings
from diffusion_rl.algorithms.base import PolicyGradient, Rollouts, Run
from diffusion_rl.config import RunConfig
from diffusion_rl.kernels import Kernel
from diffusion_rl.pipelines import PipelineAdapter
from diffusion_rl.policy import Policy
from diffusion_rl.rollout import RolloutBatch, step_log_prob
from mmreward.errors import ConfigError


# ----------------------------------------------------------------------------------------------
# the paper's formulas (pure)
# ----------------------------------------------------------------------------------------------
def all_pairs(groups: torch.Tensor) -> torch.Tensor:
    """(P, 2) rows (a, b), a < b, of every pair of samples of the same group (prompt), groups in ascending order."""
    pairs = []
    for g in torch.unique(groups).tolist():
        rows = torch.nonzero(groups == g).flatten()
        pairs.append(torch.combinations(rows, 2))
    return torch.cat(pairs) if pairs else torch.zeros(0, 2, dtype=torch.long)


def rdp_loss(r_hat_t: torch.Tensor, r_hat_old_t: torch.Tensor, reward: torch.Tensor, pairs: torch.Tensor,
             beta: float, eps: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PRDP's loss: the mean over `pairs` of max(l, l^clip) (Eq. 18), and detached statistics.

    r_hat_t (N, K): per-step log pi_theta / pi_ref of each sample's K trained steps (Eq. 19); r_hat_old_t (N, K) the
    same for the sampling policy theta_old; reward (N,); pairs (P, 2) sample rows of one prompt each."""
    a, b = pairs[:, 0], pairs[:, 1]
    target = (reward[a] - reward[b]) / beta  # Delta r / beta (Eqs. 12-13)
    r_hat = r_hat_t.sum(dim=1)  # Eq. 10
    r_hat_clip = (r_hat_old_t + (r_hat_t - r_hat_old_t).clamp(-eps, eps)).sum(dim=1)  # Eqs. 20-21
    l_theta = (r_hat[a] - r_hat[b] - target) ** 2  # Eq. 14
    l_clip = (r_hat_clip[a] - r_hat_clip[b] - target) ** 2  # Eq. 17
    loss = torch.maximum(l_theta, l_clip).mean()  # Eq. 18
    with torch.no_grad():
        stats = {"clip_fraction": ((r_hat_t - r_hat_old_t).abs() > eps).float().mean(),
                 "clipped_pairs": (l_clip > l_theta).float().mean(), "target_abs": target.abs().mean(),
                 "prediction_abs": (r_hat[a] - r_hat[b]).abs().mean()}
    return loss, stats


# ----------------------------------------------------------------------------------------------
# the method
# ----------------------------------------------------------------------------------------------
@contextlib.contextmanager
def reference_model(policy: Policy) -> Iterator[torch.nn.Module]:
    """pi_ref: the frozen copy when the run keeps one, else the model with its LoRA adapters switched off."""
    if policy.ref_model is not None:
        yield policy.ref_model
        return
    model = policy.unwrapped
    if not hasattr(model, "disable_adapters"):
        raise ConfigError("train.algorithm 'prdp' regresses log-likelihood ratios to a reference policy: set "
                          "model.lora: true (the model without its LoRA) or train.kl_reference: copy with "
                          "train.kl_beta > 0 (a frozen copy)")
    model.disable_adapters()
    try:
        yield model
    finally:
        model.enable_adapters()


class PRDP(PolicyGradient):
    """Proximal Reward Difference Prediction (see the module docstring): the trainer's rollouts (the default
    rollout stage), no advantages, and `update` in place of the PPO update."""

    name = "prdp"

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg

    def combined_reward(self, batch: RolloutBatch) -> torch.Tensor:
        """r: the run's rewards weighted and summed (the paper's multi-reward setup), this process's samples."""
        return sum(w * batch.rewards[name].float() for name, w in self.cfg.reward.rewards.items())

    @torch.no_grad()
    def _log_probs(self, model: torch.nn.Module, policy: Policy, adapter: PipelineAdapter, kernel: Kernel,
                   batch: RolloutBatch, rows: torch.Tensor) -> torch.Tensor:
        """(len(rows), K) log-probs of the trained steps of samples `rows` under `model`, without grad."""
        acc, traj, k = policy.accelerator, batch.traj, batch.train_steps.shape[1]
        out = []
        for chunk in torch.split(rows, self.cfg.train.micro_batch_size):
            emb, cols = traj.embeds.index(chunk), []
            for s in range(k):
                steps = batch.train_steps[chunk, s]
                x, x_next = memory_settings.step_pair(traj.latents, chunk, steps, acc.device)
                with acc.autocast():
                    cols.append(step_log_prob(adapter, model, x, x_next, steps, traj.schedule, emb,
                                              self.cfg.sample.guidance_scale, kernel).log_prob.float())
            out.append(torch.stack(cols, dim=1))
        return torch.cat(out)

    def update(self, samples: Rollouts, run: Run) -> dict[str, float]:
        """`num_inner_epochs` passes of `num_minibatches` optimizer steps (whole groups each) on the RDP loss."""
        batch, order, policy, adapter, kernel = samples.batch, samples.order, run.policy, run.adapter, run.kernel
        cfg, tc, acc = self.cfg, self.cfg.train, policy.accelerator
        traj, n, k = batch.traj, len(batch.slots), batch.train_steps.shape[1]
        reward = self.combined_reward(batch).to(acc.device)
        everyone = torch.arange(n)
        with reference_model(policy) as ref:  # frozen: once per iteration
            ref_lp = self._log_probs(ref, policy, adapter, kernel, batch, everyone)
        old_lp = torch.stack([traj.log_probs[everyone, batch.train_steps[:, s]] for s in range(k)], 1).to(acc.device)
        r_hat_old_t = old_lp.float() - ref_lp
        slots = batch.slots.cpu()
        per = n // tc.num_minibatches
        stats: dict[str, list[float]] = {}
        grad_norms = []
        model = policy.model
        for inner in range(tc.num_inner_epochs):
            for m in range(tc.num_minibatches):
                rows = torch.arange(m * per, (m + 1) * per)
                model.train()
                # pass 1, no grad: every r_hat_theta,t of the minibatch, and dl / dr_hat_theta,t
                r_hat_t = (self._log_probs(model, policy, adapter, kernel, batch, rows) - ref_lp[rows]).requires_grad_()
                pairs = all_pairs(slots[rows])
                loss, st = rdp_loss(r_hat_t, r_hat_old_t[rows], reward[rows], pairs, cfg.prdp.beta, tc.clip_range)
                (weights,) = torch.autograd.grad(loss, r_hat_t)
                if inner == 0 and m == 0:  # theta = theta_old: the recomputed ratios must be 1 (as the probe checks)
                    stats.setdefault("max_abs_log_ratio_start", []).append(
                        float((r_hat_t.detach() - r_hat_old_t[rows]).abs().max()))
                # pass 2: backpropagate sum_t dl/dr_hat_t * log pi_theta,t one step at a time (pi_ref is constant)
                chunks = list(torch.split(rows, tc.micro_batch_size))
                n_backward, count = len(chunks) * k, 0
                for chunk in chunks:
                    emb, local = traj.embeds.index(chunk), chunk - m * per
                    for s in range(k):
                        steps = batch.train_steps[chunk, s]
                        x, x_next = memory_settings.step_pair(traj.latents, chunk, steps, acc.device)
                        count += 1
                        with contextlib.nullcontext() if count == n_backward else acc.no_sync(model):
                            with acc.autocast():
                                lp = step_log_prob(adapter, model, x, x_next, steps, traj.schedule, emb,
                                                   cfg.sample.guidance_scale, kernel).log_prob.float()
                            acc.backward((weights[local, s].detach() * lp).sum())
                stats.setdefault("loss", []).append(float(loss.detach()))
                for key, val in st.items():
                    stats.setdefault(key, []).append(float(val))
                gn = policy.step()
                if gn is not None:
                    grad_norms.append(gn)
        out = {"train/loss" if key == "loss" else f"prdp/{key}": sum(v) / len(v) for key, v in stats.items()}
        if grad_norms:
            out["train/grad_norm"] = sum(grad_norms) / len(grad_norms)
        out["reward/combined"] = float(order.gather(reward).mean())
        return out
