"""Run torchmetrics' CLIPScore (pip torchmetrics==1.9.0) on a tiny transformers CLIP folder; print JSON scores.

Executed by scripts/parity_packages.py with the package's own venv's python; imports nothing from mmreward.
Argument: a JSON spec {"checkpoint", "images", "prompts"}. torchmetrics takes uint8 (3, H, W) tensors: each
image file is opened with Pillow and converted to RGB, then scored alone (`metric(image, prompt)`), which gives
that image's 100 * max(cos, 0).
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    import torchmetrics
    import transformers
    from torchmetrics.multimodal.clip_score import CLIPScore

    metric = CLIPScore(model_name_or_path=spec["checkpoint"])
    scores = []
    for path, prompt in zip(spec["images"], spec["prompts"]):
        arr = np.asarray(Image.open(path).convert("RGB"))
        metric.reset()
        scores.append(float(metric(torch.from_numpy(arr).permute(2, 0, 1).contiguous(), prompt)))
    print(json.dumps({"scores": scores, "versions": {"torchmetrics": torchmetrics.__version__,
                                                     "transformers": transformers.__version__,
                                                     "torch": torch.__version__}}))


if __name__ == "__main__":
    main()
