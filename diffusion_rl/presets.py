"""The papers' published defaults, one preset per method variant (`preset: flow_grpo` in a config).

A preset is data: nested config sections that `diffusion_rl.config.from_dict` merges under the user's
values. Each block names the paper and the script its numbers come from; the methods themselves live in
`diffusion_rl.algorithms`.
"""

from __future__ import annotations

from typing import Any

GRPO_PRESETS: dict[str, dict[str, Any]] = {
    # Flow-GRPO on SD3.5-Medium (config/grpo.py: pickscore_sd3 / geneval_sd3 and base.py)
    "flow_grpo": {
        "train": {"algorithm": "grpo", "learning_rate": 3e-4, "clip_range": 1e-4, "timestep_fraction": 0.99,
                  "timestep_selection": "first", "kl_beta": 0.04, "kl_reference": "adapter",
                  "num_minibatches": 2, "weight_decay": 1e-4, "max_grad_norm": 1.0, "ema": True, "ema_decay": 0.9,
                  "ema_update_every": 8},
        "ppo": {"kl_mode": "flow_grpo"},
        "sample": {"num_steps": 10, "eval_num_steps": 40, "guidance_scale": 4.5, "kernel": "flow_sde",
                   "noise_level": 0.7, "group_size": 24, "prompts_per_iteration": 48},
        "advantage": {"std_scope": "global", "unbiased": False, "eps": 1e-4, "clip_max": 5.0},
        "model": {"lora": True, "lora_rank": 32, "lora_alpha": 64, "height": 512, "width": 512},
    },
    # Flow-GRPO-Fast without CFG (geneval_sd3_fast_nocfg): CPS on a random 3-step window in the first half
    "flow_grpo_fast": {
        "train": {"algorithm": "grpo", "learning_rate": 3e-4, "clip_range": 1e-5, "timestep_fraction": 1.0,
                  "kl_beta": 0.0, "num_minibatches": 2, "ema": True},
        "sample": {"num_steps": 10, "eval_num_steps": 40, "guidance_scale": 1.0, "kernel": "cps", "noise_level": 0.8,
                   "sde_window": [0, 5], "sde_window_size": 3, "group_size": 24, "prompts_per_iteration": 48},
        "advantage": {"std_scope": "global", "unbiased": False, "eps": 1e-4, "clip_max": 5.0},
        "model": {"lora": True, "lora_rank": 32, "lora_alpha": 64},
    },
    # MixGRPO on FLUX.1-dev (Tencent-Hunyuan/MixGRPO scripts/finetune/finetune_flux_grpo_MixGRPO.sh): Flow-SDE
    # (eta 0.7) on a 4-step window that slides by one step every 25 iterations through steps [0, 23) of 25 and
    # rolls back; Euler ODE elsewhere; every window step trained; lr 1e-5, clip 1e-4, 12 per group from one x_T
    "mixgrpo": {
        "train": {"algorithm": "grpo", "learning_rate": 1e-5, "clip_range": 1e-4, "timestep_fraction": 1.0,
                  "timestep_selection": "first", "kl_beta": 0.0, "max_grad_norm": 1.0, "weight_decay": 1e-4},
        "sample": {"num_steps": 25, "guidance_scale": 3.5, "kernel": "flow_sde", "noise_level": 0.7,
                   "sde_window": [0, 23], "sde_window_size": 4, "sde_window_shift_every": 25, "sde_window_stride": 1,
                   "ode_solver": "euler", "group_size": 12, "share_initial_noise": True, "prompts_per_iteration": 32},
        "advantage": {"std_scope": "group", "unbiased": True, "eps": 1e-8, "clip_max": 5.0},
        "model": {"lora": False, "height": 720, "width": 720},
    },
    # MixGRPO-Flash (finetune_flux_grpo_MixGRPO_Flash.sh): the same with DPM-Solver++ 2M on the ODE steps after
    # the window, shifted every 20 iterations (the reference also compresses those steps to 40%: not done here)
    "mixgrpo_flash": {
        "train": {"algorithm": "grpo", "learning_rate": 1e-5, "clip_range": 1e-4, "timestep_fraction": 1.0,
                  "timestep_selection": "first", "kl_beta": 0.0, "max_grad_norm": 1.0, "weight_decay": 1e-4},
        "sample": {"num_steps": 25, "guidance_scale": 3.5, "kernel": "flow_sde", "noise_level": 0.7,
                   "sde_window": [0, 23], "sde_window_size": 4, "sde_window_shift_every": 20, "sde_window_stride": 1,
                   "ode_solver": "dpm2", "group_size": 12, "share_initial_noise": True, "prompts_per_iteration": 32},
        "advantage": {"std_scope": "group", "unbiased": True, "eps": 1e-8, "clip_max": 5.0},
        "model": {"lora": False, "height": 720, "width": 720},
    },
    # DanceGRPO on FLUX.1-dev (finetune_flux_grpo scripts): full fine-tuning, eta 0.3, 60% of the steps at random
    "dance_grpo": {
        "train": {"algorithm": "grpo", "learning_rate": 1e-5, "clip_range": 1e-4, "timestep_fraction": 0.6,
                  "timestep_selection": "random", "kl_beta": 0.0, "max_grad_norm": 0.01, "weight_decay": 1e-4},
        "sample": {"num_steps": 16, "guidance_scale": 3.5, "kernel": "dance_sde", "noise_level": 0.3,
                   "group_size": 12, "share_initial_noise": True, "prompts_per_iteration": 4},
        "advantage": {"std_scope": "group", "unbiased": True, "eps": 1e-8, "clip_max": 5.0},
        "model": {"lora": False, "height": 720, "width": 720},
    },
    # DanceGRPO on HunyuanVideo (scripts/finetune/finetune_hunyuan_grpo.sh + fastvideo/train_grpo_hunyuan.py):
    # 16 steps, eta 0.25, 24 videos per prompt from one shared x_T, 60% of the steps at random, the 4 best and
    # 4 worst of each group trained (--bestofn 8), VideoAlign VQ (vq_coef 1, mq_coef 0) normalised per reward
    # then weighted, embedded guidance 6 (6018 / 1000), 480x480, full fine-tuning with gradient checkpointing,
    # one prompt per GPU on 32 GPUs, rollouts and training one video at a time. Not expressed here: 53 frames
    # (set the frame count where the model config takes it), the schedule shift 5 (the pipeline's scheduler
    # decides), and the step before last not being trained (their [:, :-1]). The reward is the user's choice.
    "dance_grpo_video": {
        "train": {"algorithm": "grpo", "learning_rate": 1e-5, "clip_range": 1e-4, "timestep_fraction": 0.6,
                  "timestep_selection": "random", "kl_beta": 0.0, "max_grad_norm": 1.0, "weight_decay": 1e-4,
                  "micro_batch_size": 1},
        "ppo": {"best_worst_k": 4},
        "sample": {"num_steps": 16, "guidance_scale": 6.0, "kernel": "dance_sde", "noise_level": 0.25,
                   "group_size": 24, "share_initial_noise": True, "prompts_per_iteration": 32, "batch_size": 1},
        "advantage": {"std_scope": "group", "unbiased": True, "eps": 1e-8, "clip_max": 5.0},
        "reward": {"aggregation": "advantage"},
        "model": {"lora": False, "height": 480, "width": 480, "gradient_checkpointing": True},
    },
    # TempFlow-GRPO on SD3.5-Medium (Shredded-Pork/TempFlow-GRPO scripts/train_sd3_pr.py, config/dgx.py
    # geneval_sd3_pr, on Flow-GRPO's base.py): 10 steps, Flow-SDE a = 0.7, branches of one x_T (seed group) at one
    # step of 0..8 per iteration, cycling (the reference branches at every one of them each iteration, K = 6 per
    # step), each branch trained at its branching step with the noise-aware weight; KL 0.004 in its exact form
    # (their step std includes sqrt(dt)), group-std advantages (global_std False), 2 optimizer steps per iteration
    "tempflow_grpo": {
        "train": {"algorithm": "grpo", "learning_rate": 3e-4, "clip_range": 1e-4, "timestep_fraction": 1.0,
                  "kl_beta": 0.004, "kl_reference": "adapter", "num_minibatches": 2,
                  "weight_decay": 1e-4, "max_grad_norm": 1.0, "ema": True, "ema_decay": 0.9, "ema_update_every": 8},
        "ppo": {"kl_mode": "exact", "noise_aware_weight": True},
        "sample": {"num_steps": 10, "eval_num_steps": 40, "guidance_scale": 4.5, "kernel": "flow_sde",
                   "noise_level": 0.7, "sde_window": [0, 9], "sde_window_size": 1, "sde_window_shift_every": 1,
                   "sde_window_stride": 1, "branching": True, "share_initial_noise": True, "group_size": 6,
                   "prompts_per_iteration": 32},
        "advantage": {"std_scope": "group", "unbiased": False, "eps": 1e-4, "clip_max": 5.0},
        "model": {"lora": True, "lora_rank": 32, "lora_alpha": 64, "height": 512, "width": 512},
    },
}

GRPO_GUARD_PRESETS: dict[str, dict[str, Any]] = {
    # GRPO-Guard (arXiv 2510.22319) on Flow-GRPO's SD3.5-Medium setup (the flow_grpo preset above: the paper builds on
    # Flow-GRPO and keeps its sampling, advantages, KL and optimiser), with RatioNorm and the 1 / dt step weight, and
    # the clip range of verl-project/verl-omni@16910a6 docs/algo/grpo_guard.md (2e-6: the normalised log-ratio is
    # ~sigma_t sqrt(dt) times smaller than Flow-GRPO's, whose clip is 1e-4)
    "grpo_guard": {
        "train": {"algorithm": "grpo_guard", "learning_rate": 3e-4, "clip_range": 2e-6, "timestep_fraction": 0.99,
                  "timestep_selection": "first", "kl_beta": 0.04, "kl_reference": "adapter",
                  "num_minibatches": 2, "weight_decay": 1e-4, "max_grad_norm": 1.0, "ema": True, "ema_decay": 0.9,
                  "ema_update_every": 8},
        "ppo": {"kl_mode": "flow_grpo"},
        "sample": {"num_steps": 10, "eval_num_steps": 40, "guidance_scale": 4.5, "kernel": "flow_sde",
                   "noise_level": 0.7, "group_size": 24, "prompts_per_iteration": 48},
        "advantage": {"std_scope": "global", "unbiased": False, "eps": 1e-4, "clip_max": 5.0},
        "model": {"lora": True, "lora_rank": 32, "lora_alpha": 64, "height": 512, "width": 512},
    },
}

PREF_GRPO_PRESETS: dict[str, dict[str, Any]] = {
    # Pref-GRPO (CodeGoat24/Pref-GRPO@3e787f6 scripts/_common_finetune.sh, fastvideo/train_flux.py,
    # fastvideo/rewards/unifiedreward_think.py): each pair of a group judged once, the earlier sample as Image 1
    # (itertools.combinations); PEFT's default LoRA init (init_lora_weights=True)
    "pref_grpo": {
        "train": {"algorithm": "pref_grpo", "learning_rate": 1e-5, "clip_range": 1e-4, "timestep_fraction": 0.6,
                  "timestep_selection": "random", "kl_beta": 0.0, "max_grad_norm": 1.0,
                  "weight_decay": 1e-4},
        "ppo": {"ratio_norm": True},
        "sample": {"num_steps": 25, "guidance_scale": 3.5, "kernel": "flow_sde", "noise_level": 0.7, "group_size": 8,
                   "share_initial_noise": True, "prompts_per_iteration": 4},
        "advantage": {"std_scope": "group", "unbiased": True, "eps": 1e-8, "clip_max": 5.0},
        "model": {"lora": True, "lora_rank": 64, "lora_alpha": 128, "lora_init": "default"},
        "reward": {"both_orders": False, "win_mode": "hard"},
    },
}

DDPO_PRESETS: dict[str, dict[str, Any]] = {
    "ddpo": {
        "train": {"algorithm": "ddpo", "learning_rate": 3e-4, "clip_range": 1e-4, "timestep_fraction": 1.0,
                  "kl_beta": 0.0, "max_grad_norm": 1.0, "weight_decay": 1e-4, "num_minibatches": 2},
        "sample": {"num_steps": 50, "guidance_scale": 5.0, "kernel": "ddim", "noise_level": 1.0,
                   "group_size": 1, "prompts_per_iteration": 256},
        "advantage": {"per_prompt_tracking": True, "buffer_size": 16, "min_count": 16, "eps": 1e-6,
                      "unbiased": False, "clip_max": 5.0},
        "model": {"lora": True, "lora_rank": 4, "lora_alpha": 4},
    },
}

PRDP_PRESETS: dict[str, dict[str, Any]] = {
    # PRDP's small-scale setup (Deng et al., CVPR 2024, Sec. 4.1 and 4.4): DDPM sampling with 50 steps (DDIM eta 1)
    # at CFG 5, 32 prompts x 16 images per epoch, every pair of a prompt, 100 epochs, beta 10; here LoRA (the paper
    # fine-tunes the full UNet). The stepwise clip, learning rate and gradient steps per epoch are in the paper's
    # appendix, which we did not have: DDPO's (clip 1e-4, lr 3e-4, 2 gradient steps), the baseline the paper matches
    "prdp": {
        "prdp": {"beta": 10.0},
        "train": {"algorithm": "prdp", "clip_range": 1e-4, "learning_rate": 3e-4,
                  "timestep_fraction": 1.0, "kl_beta": 0.0, "num_minibatches": 1, "num_inner_epochs": 2,
                  "max_grad_norm": 1.0, "weight_decay": 1e-4, "iterations": 100},
        "sample": {"num_steps": 50, "guidance_scale": 5.0, "kernel": "ddim", "noise_level": 1.0, "group_size": 16,
                   "prompts_per_iteration": 32},
        "model": {"lora": True, "lora_rank": 4, "lora_alpha": 4},
    },
}

DRAFT_PRESETS: dict[str, dict[str, Any]] = {
    "draft": {
        "train": {"algorithm": "draft", "learning_rate": 1e-4, "max_grad_norm": 1.0, "weight_decay": 1e-4},
        "draft": {"backprop_steps": 1, "backprop_strategy": "fixed"},
        "sample": {"num_steps": 50, "guidance_scale": 7.5, "kernel": "ddim", "noise_level": 0.0, "group_size": 1,
                   "prompts_per_iteration": 8},
        "model": {"lora": True, "lora_rank": 8, "lora_alpha": 8, "gradient_checkpointing": True},
    },
    "alignprop": {
        "train": {"algorithm": "draft", "learning_rate": 1e-3, "max_grad_norm": 1.0, "weight_decay": 1e-4},
        "draft": {"backprop_steps": 50, "backprop_strategy": "uniform"},
        "sample": {"num_steps": 50, "guidance_scale": 5.0, "kernel": "ddim", "noise_level": 1.0, "group_size": 1,
                   "prompts_per_iteration": 8},
        "model": {"lora": True, "lora_rank": 4, "lora_alpha": 4, "gradient_checkpointing": True},
    },
    # ReFL (THUDM/ImageReward@1beb4e4 ImageReward/ReFL.py): 40 DDPM steps (here DDIM eta 1), the grad step drawn
    # from 30..39, no CFG, loss relu(2 - r) * 1e-3, lr 1e-5, AdamW weight decay 1e-2, grad norm 1, full UNet
    # fine-tuning, 2 prompts per device x 4 accumulation steps
    "refl": {
        "train": {"algorithm": "refl", "learning_rate": 1e-5, "weight_decay": 1e-2, "max_grad_norm": 1.0,
                  "micro_batch_size": 2},
        "refl": {"step_range": [0.75, 1.0], "loss": "relu", "margin": 2.0, "scale": 1e-3},
        "sample": {"num_steps": 40, "guidance_scale": 1.0, "kernel": "ddim", "noise_level": 1.0, "group_size": 1,
                   "prompts_per_iteration": 8},
        "model": {"lora": False},
    },
}

NFT_PRESETS: dict[str, dict[str, Any]] = {
    # DiffusionNFT on SD3.5-Medium (NVlabs/DiffusionNFT config/nft.py _get_config + base.py, train_nft_sd3.py):
    # CFG-free DPM-Solver++ 2M rollouts of 10 steps, 9 of them trained, beta 1, old policy decay type 1,
    # advantages clipped at 5 and mapped to r, KL 1e-4 to the LoRA-free model, EMA 0.9 every step
    "diffusion_nft": {
        "train": {"algorithm": "nft", "learning_rate": 3e-4, "timestep_fraction": 0.99, "kl_beta": 1e-4,
                  "kl_reference": "adapter", "num_minibatches": 1, "weight_decay": 1e-4, "max_grad_norm": 1.0,
                  "ema": True, "ema_decay": 0.9, "ema_update_every": 1},
        "nft": {"beta": 1.0, "adaptive_weight": True, "old_decay": [0.0, 0.001, 0.5]},
        "sample": {"num_steps": 10, "eval_num_steps": 40, "guidance_scale": 1.0, "kernel": "ode", "noise_level": 0.0,
                   "ode_solver": "dpm2", "group_size": 24, "prompts_per_iteration": 48},
        "advantage": {"std_scope": "global", "unbiased": False, "eps": 1e-4, "clip_max": 5.0},
        "model": {"lora": True, "lora_rank": 32, "lora_alpha": 64, "height": 512, "width": 512},
    },
}

FORWARD_PRESETS: dict[str, dict[str, Any]] = {
    # Diffusion-DPO (SalesforceAIResearch/DiffusionDPO@5233e75 train.py + launchers/sd15.sh): beta_dpo 5000,
    # lr 1e-8 scaled by the effective batch 2048 (--scale_lr: 2.048e-5), AdamW weight decay 1e-2, grad norm 1;
    # here online (the best and worst of each group of the current policy) with the LoRA-free model as reference
    "diffusion_dpo": {
        "train": {"algorithm": "dpo", "learning_rate": 2.048e-5, "weight_decay": 1e-2,
                  "max_grad_norm": 1.0, "kl_beta": 0.0, "num_minibatches": 1},
        "dpo": {"beta": 5000.0},
        "sample": {"num_steps": 10, "kernel": "ode", "noise_level": 0.0, "ode_solver": "euler", "group_size": 8,
                   "prompts_per_iteration": 16},
        "model": {"lora": True, "lora_rank": 32, "lora_alpha": 64},
    },
    # offline Diffusion-DPO as the paper trains it (SalesforceAIResearch/DiffusionDPO@dff8e10 launchers/sd15.sh,
    # train.py): Pick-a-Pic v2 pairs (ties dropped), 2048 pairs per optimizer step, 2000 steps, beta_dpo 5000, lr
    # 1e-8 x 2048 (--scale_lr), AdamW weight decay 1e-2, grad norm 1, the conditional prediction trained (no CFG);
    # the pair source is the user's: dpo.pairs. Not expressed: the 500-step warmup, random flips, full
    # fine-tuning with a frozen UNet copy (here LoRA, the reference being the LoRA-free model)
    "diffusion_dpo_offline": {
        "train": {"algorithm": "dpo", "learning_rate": 2.048e-5, "weight_decay": 1e-2,
                  "max_grad_norm": 1.0, "kl_beta": 0.0, "num_minibatches": 1, "iterations": 2000},
        "dpo": {"beta": 5000.0},
        "sample": {"kernel": "ode", "noise_level": 0.0, "guidance_scale": 1.0, "prompts_per_iteration": 2048},
        "model": {"lora": True, "lora_rank": 32, "lora_alpha": 64},
    },
    # RAFT on diffusion (OptimalScale/LMFlow@613bba0 experimental/RAFT-diffusion/SD256-RAFT.ipynb): 10 images
    # per prompt, the best kept, lr 9e-6, LoRA (diffusers' rank 4), 10 passes over the winners, grad norm 1
    "raft": {
        "raft": {"top_k": 1},
        "train": {"algorithm": "raft", "learning_rate": 9e-6, "num_inner_epochs": 10,
                  "max_grad_norm": 1.0, "kl_beta": 0.0, "num_minibatches": 1},
        "sample": {"num_steps": 10, "kernel": "ode", "noise_level": 0.0, "ode_solver": "dpm2", "group_size": 10,
                   "prompts_per_iteration": 10},
        "model": {"lora": True, "lora_rank": 4, "lora_alpha": 4},
    },
    # AWM (X-GenGroup/Flow-Factory@a0b2bc5 examples/awm/lora/sd3_5/default.yaml): 14 ODE steps at guidance 1,
    # group 16, 48 prompts, advantages clipped to [-1, 1], ratio clip 1, velocity KL 1e-4 to the LoRA-free
    # model, lr 3e-4, weight decay 1e-4, grad norm 1, LoRA r32 / alpha 64
    "awm": {
        "awm": {"adv_clip": 1.0},
        "train": {"algorithm": "awm", "clip_range": 1.0, "kl_beta": 1e-4,
                  "kl_reference": "adapter", "learning_rate": 3e-4, "weight_decay": 1e-4, "max_grad_norm": 1.0,
                  "num_inner_epochs": 1, "num_minibatches": 1},
        "sample": {"num_steps": 14, "kernel": "ode", "noise_level": 0.0, "ode_solver": "euler", "group_size": 16,
                   "prompts_per_iteration": 48, "guidance_scale": 1.0},
        "model": {"lora": True, "lora_rank": 32, "lora_alpha": 64},
    },
}

GROUP_PREFERENCE_PRESETS: dict[str, dict[str, Any]] = {
    # DGPO (X-GenGroup/Flow-Factory@5f6cda1 examples/dgpo/lora/sd3_5/default.yaml, the port of Luo-Yihong/DGPO
    # config/dgpo.py pickscore_sd3_4gpu): beta 10, 4 shared steps of the noisiest 60% of 10, shared group noise,
    # DSM clip 0.05, adv clip 5, velocity KL 1e-3, group 24, 24 prompts, global-std advantages, guidance 4.5,
    # one optimizer step per iteration, lr 3e-4, weight decay 1e-4, grad norm 1, LoRA r64 / a128
    "dgpo": {
        "dgpo": {"beta": 10.0, "timesteps": 4},
        "train": {"algorithm": "dgpo", "timestep_fraction": 0.6,
                  "clip_range": 0.05, "kl_beta": 1e-3, "kl_reference": "adapter", "learning_rate": 3e-4,
                  "weight_decay": 1e-4, "max_grad_norm": 1.0, "num_inner_epochs": 1, "num_minibatches": 1},
        "sample": {"num_steps": 10, "eval_num_steps": 14, "kernel": "ode", "noise_level": 0.0, "ode_solver": "euler",
                   "group_size": 24, "prompts_per_iteration": 24, "guidance_scale": 4.5},
        "advantage": {"std_scope": "global", "unbiased": False, "clip_max": 5.0},
        "model": {"lora": True, "lora_rank": 64, "lora_alpha": 128},
    },
    # CRD (X-GenGroup/Flow-Factory@5f6cda1 examples/crd/lora/sd3_5/default.yaml, the paper's Table 3 OCR setting):
    # beta 1, mse, uniform centring, adaptive logp, old decay 0-0.25-0.005-0.999, sampling decay
    # 75-0.0-0.0075-0.999, KL 0.1 to the reference at CFG 4.5 (reward-adaptive), adv clip 5, global-std
    # advantages, 10 steps at guidance 1, group 24, 48 prompts, 2 optimizer steps per iteration, lr 3e-4, weight
    # decay 1e-4, grad norm 1, LoRA r32 / a64; the noisiest 99% of the steps trained
    "crd": {
        "crd": {"beta": 1.0, "loss": "mse", "weight_temp": -1.0, "adaptive_logp": True,
                "old_decay": [0.0, 0.25, 0.005, 0.999], "sampling_decay": [75.0, 0.0, 0.0075, 0.999], "kl_cfg": 4.5,
                "reward_adaptive_kl": True},
        "train": {"algorithm": "crd", "kl_beta": 0.1, "kl_reference": "adapter", "timestep_fraction": 0.99, "learning_rate": 3e-4,
                  "weight_decay": 1e-4, "max_grad_norm": 1.0, "num_inner_epochs": 1, "num_minibatches": 2},
        "sample": {"num_steps": 10, "eval_num_steps": 40, "kernel": "ode", "noise_level": 0.0, "ode_solver": "euler",
                   "group_size": 24, "prompts_per_iteration": 48, "guidance_scale": 1.0},
        "advantage": {"std_scope": "global", "unbiased": False, "clip_max": 5.0},
        "model": {"lora": True, "lora_rank": 32, "lora_alpha": 64},
    },
}

PRESETS: dict[str, dict[str, Any]] = {**GRPO_PRESETS, **GRPO_GUARD_PRESETS, **PREF_GRPO_PRESETS, **DDPO_PRESETS,
                                      **PRDP_PRESETS, **DRAFT_PRESETS, **NFT_PRESETS, **FORWARD_PRESETS,
                                      **GROUP_PREFERENCE_PRESETS}
