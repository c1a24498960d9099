"""Run the `image-reward` package (pip image-reward==1.5) on a tiny-text checkpoint; print its scores as JSON.

Executed by scripts/parity_packages.py with the package's own venv's python; imports nothing from mmreward.
Argument: a JSON spec {"checkpoint", "med_config", "images", "prompts", "env"}. The user's path:
`ImageReward.load(path, device, med_config=...)` then `model.score(prompt, image_path)` per image.
The package tokenises with `BertTokenizer.from_pretrained('bert-base-uncased')`: spec["env"] points HF_HOME
at a hub cache holding the checkpoint's own vocabulary under that name (offline, no download).
"""

import json
import os
import sys
import types
from pathlib import Path


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    os.environ.update(spec.get("env", {}))
    import torch

    # ImageReward/__init__.py also imports ReFL.py, its fine-tuning script, whose 2023 diffusers/datasets/
    # accelerate imports have nothing to do with scoring: an empty module stands in for it
    sys.modules["ImageReward.ReFL"] = types.ModuleType("ImageReward.ReFL")
    import ImageReward as RM
    import transformers

    model = RM.load(spec["checkpoint"], device="cpu", med_config=spec["med_config"])
    # load() uses strict=False: say what the file did not set, so a silently random tensor cannot pass
    file_keys = set(torch.load(spec["checkpoint"], map_location="cpu", weights_only=True))
    model_keys = set(model.state_dict())
    with torch.no_grad():
        scores = [model.score(p, path) for p, path in zip(spec["prompts"], spec["images"])]
    print(json.dumps({"scores": scores, "missing_keys": sorted(model_keys - file_keys),
                      "unexpected_keys": sorted(file_keys - model_keys),
                      "versions": {"image-reward": "1.5", "transformers": transformers.__version__,
                                   "torch": torch.__version__}}))


if __name__ == "__main__":
    main()
