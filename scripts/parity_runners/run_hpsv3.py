"""Run the `hpsv3` package (pip hpsv3==1.0.0, transformers 4.45.2) on a tiny checkpoint; print its scores as JSON.

Executed by scripts/parity_packages.py with the package's own virtual environment's python; imports nothing
from mmreward. Argument: a JSON spec {"checkpoint", "base_445", "images", "prompts"}. The package's inference
path as a user calls it: `HPSv3RewardInferencer(config, checkpoint, device).reward(paths, prompts)`, with the
package's own HPSv3_7B.yaml changed only where a CPU run without the hub needs it (base model folder, fp32).
"""

import json
import sys
import tempfile
from pathlib import Path

import torch
import yaml


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    import hpsv3
    import transformers
    from hpsv3.inference import _MODEL_CONFIG_PATH, HPSv3RewardInferencer

    cfg = yaml.safe_load((Path(_MODEL_CONFIG_PATH) / "HPSv3_7B.yaml").read_text())
    # the published config trains in bf16 with flash attention and deepspeed; a CPU parity run needs fp32/sdpa
    cfg.update(model_name_or_path=spec["base_445"], bf16=False, torch_dtype="float32", disable_flash_attn2=True,
               gradient_checkpointing=False, report_to="none", output_dir=tempfile.mkdtemp(), deepspeed=None)
    cfg_path = Path(tempfile.mkdtemp()) / "HPSv3_tiny.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    inferencer = HPSv3RewardInferencer(str(cfg_path), spec["checkpoint"], device="cpu")
    with torch.no_grad():
        logits = inferencer.reward(spec["images"], spec["prompts"])  # (B, 2): mu, sigma
    print(json.dumps({"scores": logits.float().tolist(),
                      "versions": {"hpsv3": getattr(hpsv3, "__version__", "1.0.0"),
                                   "transformers": transformers.__version__, "torch": torch.__version__}}))


if __name__ == "__main__":
    main()
