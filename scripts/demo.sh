#!/usr/bin/env bash
# Install mmreward into .venv and run the main demo: score the shipped sample images, then a short reward
# fine-tuning run (GRPO with the exact ShapesEval reward) of the tiny ShapesWorld text-to-image generator.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh diffusion  # the demo trains the generator: diffusers, peft, matplotlib
export HF_HUB_OFFLINE=1
echo "== mmreward list"
.venv/bin/mmreward list
echo "== mmreward score --reward jpeg-compressibility assets/samples"
.venv/bin/mmreward score --reward jpeg-compressibility assets/samples --out demo-scores.jsonl --no-progress
cat demo-scores.jsonl
echo "== mmreward compare --reward shapesworld-pref --prompt 'a red circle' (red circle vs blue sky; the shipped preference model)"
.venv/bin/mmreward compare --reward shapesworld-pref --prompt "a red circle" --no-progress assets/samples/red_circle.png assets/samples/flat_sky.png
echo "== diffusion-rl train: 3 GRPO iterations on the ShapesWorld generator (full run: configs/shapes_grpo.yaml)"
.venv/bin/diffusion-rl train --config configs/shapes_grpo.yaml train.iterations=3 \
  prompts.eval_samples_per_prompt=4 log.output_dir=runs/demo log.overwrite=true log.progress=false
echo "== reward curve and before/after grids in runs/demo/"
