#!/usr/bin/env bash
# benchmarks/gpu_scale.py --geometry real on a lent GPU machine inside one time budget (docs/results/gpu_scale.md).
# Usage: benchmarks/gpu_scale_device.sh OUT_DIR [TOTAL_SECONDS]   (default 540)
# Two processes, each writing its JSON after every family, so a time limit keeps what finished:
#   1. the rewards (fast) then the image pipelines: hpsv2 pickscore imagereward vqascore sd3 sdxl flux
#      (defaults: batch 4, 512 px, 10 steps, 3 repeats; the cost model runs on sd3);
#   2. wan21 at 81 x 480 x 832 with 4 steps and 1 repeat (10 steps and 3 repeats would not fit the budget).
set -u
out=${1:?usage: gpu_scale_device.sh OUT_DIR [TOTAL_SECONDS]}
total=${2:-540}
t0=$(date +%s)
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, diffusers, transformers, open_clip; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'diffusers', diffusers.__version__, 'transformers', transformers.__version__, 'open_clip', open_clip.__version__)"
  date -u +%Y-%m-%dT%H:%M:%SZ; } > "$out/env.txt" 2>&1
cat "$out/env.txt"
left() { echo $(( total - ($(date +%s) - t0) )); }
first=$(( $(left) - 210 ))  # keep about 210 s for Wan
timeout -k 5 "$first" python3 benchmarks/gpu_scale.py --geometry real --device cuda \
  --families hpsv2 pickscore imagereward vqascore sd3 sdxl flux --json "$out/gpu_scale_image.json" > "$out/image.log" 2>&1
echo "image families: exit $? after $(( $(date +%s) - t0 )) s"
timeout -k 5 "$(left)" python3 benchmarks/gpu_scale.py --geometry real --device cuda --families wan21 --steps 4 \
  --repeats 1 --json "$out/gpu_scale_wan21.json" > "$out/wan21.log" 2>&1
echo "wan21: exit $? after $(( $(date +%s) - t0 )) s"
grep -v "it/s\]" "$out/image.log" | tail -40
grep -v "it/s\]" "$out/wan21.log" | tail -25
