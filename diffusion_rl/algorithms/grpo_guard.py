"""GRPO-Guard (Wang et al., 2025, arXiv 2510.22319, "GRPO-Guard: Mitigating Implicit Over-Optimization in Flow
Matching via Regulated Clipping"): Flow-GRPO with a regulated importance ratio.

The per-step ratio r_t = p_theta(x_{t-1} | x_t) / p_old(x_{t-1} | x_t) of two Gaussians with the same std
sigma_t sqrt(dt) and means mu_theta, mu_old has, over the rollout's noise, a mean shift of its log of
-||Delta mu_t||^2 / (2 sigma_t^2 dt) and a spread proportional to 1 / (sigma_t sqrt(dt)); both differ from step to
step, so one clip range is too wide at some steps and too narrow at others, and the ratio sits left of 1 (the
"implicit over-optimisation" the paper measures). GRPO-Guard changes two things of Flow-GRPO's PPO loss:

  RatioNorm (the paper's Eq. 8), `ratio_norm`:
      log r_hat_t = sigma_t sqrt(dt) * ( log r_t + ||Delta mu_t||^2 / (2 sigma_t^2 dt) ),  Delta mu_t = mu_theta - mu_old
  which equals mean(Delta mu_t * eps) for the rollout's noise eps (x_{t-1} = mu_old + sigma_t sqrt(dt) eps): centred
  at 0 and with a spread that no longer depends on the step's sigma_t sqrt(dt); it is clipped as usual:
      L_t = mean_i max(-A_i r_hat_t,i, -A_i clip(r_hat_t,i, 1 - eps, 1 + eps))
  gradient reweighting across timesteps (the paper's Eq. 12), `grad_reweight`:
      L_t <- delta_t L_t,  delta_t = 1 / dt
  since mu_theta moves by dt times the velocity, the gradient of log r_hat_t with respect to the velocity scales
  with dt; delta_t gives every step's gradient one magnitude, so that no band of timesteps dominates the update.

||.||^2 is the mean over the latent's elements, matching log-probs reduced by their mean
(`sample.log_prob_reduction: mean`). The advantages are GRPO's (`diffusion_rl.algorithms.grpo`). The trainer's
PPO update calls `guard_policy_loss` for `train.algorithm: grpo_guard`, and for any policy-gradient method with
`ppo.ratio_norm: true` (Pref-GRPO's `--rationorm` is this normalisation).

References read: verl-project/verl-omni@073521e verl_omni/trainer/diffusion/diffusion_algos.py (`GRPOGuardLoss.
compute_loss`: ratio_mean_bias = mean||mu - mu_old||^2 / (2 scale^2), scale = sqrt_dt * std_dev_t, ratio =
exp((log_ratio + bias) * scale), loss = mean(max(...)) / sqrt_dt^2) with docs/algo/grpo_guard.md@16910a6 (the
example's clip ratio 2e-6), and X-GenGroup/Flow-Factory@a0b2bc5 src/flow_factory/trainers/grpo.py
(`GRPOGuardTrainer.optimize`: the same normalised ratio, without the 1 / dt weight).

What we simplify: the step weight of a micro-batch whose samples train different steps (train.timestep_selection:
random) is 1 / mean |dt| over the micro-batch (verl-omni trains one step per batch, where the two agree; the
per-sample sigma_t sqrt(dt) of RatioNorm is exact); only the Flow-GRPO form delta = 1 / dt of the reweighting (the
paper's DanceGRPO form beta / dt, beta = 1 + eta^2 (1 - t) / (2 t), is not implemented); on a DDIM (UNet) kernel
only RatioNorm applies (dt is not a flow step there).
"""

from __future__ import annotations

import torch

from diffusion_rl.algorithms.grpo import GRPO
from diffusion_rl.config import RunConfig
from diffusion_rl.losses import PolicyLossOutput, normalized_log_ratio, ppo_clip_loss


def uses_ratio_norm(cfg: RunConfig) -> bool:
    """Whether the run's PPO loss is GRPO-Guard's: the grpo_guard method, or RatioNorm asked for by name."""
    return cfg.train.algorithm == "grpo_guard" or cfg.ppo.ratio_norm


def ratio_norm(log_prob: torch.Tensor, old_log_prob: torch.Tensor, mu_theta: torch.Tensor, mu_old: torch.Tensor,
               std: torch.Tensor) -> torch.Tensor:
    """log r_hat_t (B,) of Eq. 8 from the per-sample log-probs (B,), the transition means (B, ...) of the current
    and the rollout policy, and the transition std sigma_t sqrt(dt) (a scalar or per sample)."""
    return normalized_log_ratio(log_prob, old_log_prob, mu_theta, mu_old, std)


def grad_reweight(loss_t: torch.Tensor, dt: torch.Tensor) -> torch.Tensor:
    """delta_t L_t of Eq. 12, delta_t = 1 / dt for the micro-batch's steps (dt per sample; their mean |dt| when
    they differ)."""
    return loss_t / dt.abs().mean()


def guard_policy_loss(log_prob: torch.Tensor, old_log_prob: torch.Tensor, mu_theta: torch.Tensor,
                      mu_old: torch.Tensor, std: torch.Tensor, advantages: torch.Tensor, dt: torch.Tensor,
                      clip_range: float, *, reweight: bool) -> tuple[PolicyLossOutput, torch.Tensor]:
    """(the clipped loss on the normalised ratio, that loss times delta_t): GRPO-Guard's loss of one step.
    `reweight` is False where dt is no flow step (DDIM)."""
    pl = ppo_clip_loss(log_prob, old_log_prob, advantages, clip_range,
                       log_ratio=ratio_norm(log_prob, old_log_prob, mu_theta, mu_old, std))
    return pl, grad_reweight(pl.loss, dt) if reweight else pl.loss


class GRPOGuard(GRPO):
    """GRPO's group-relative advantages; the trainer's PPO update then takes GRPO-Guard's loss (`uses_ratio_norm`)."""

    name = "grpo_guard"
