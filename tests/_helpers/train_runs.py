"""Run by `accelerate launch -m tests._helpers.train_runs A.yaml B.yaml ...` (tests/_helpers/two_process.py):
`diffusion-rl train --config` for each config in turn, in the one launched process group, so that several
2-process == 1-process checks pay for one launch (the launcher, and each process's torch/diffusers import)."""

from __future__ import annotations

import sys

from diffusion_rl.cli import main

if __name__ == "__main__":
    for config in sys.argv[1:]:
        rc = main(["train", "--config", config])
        if rc:
            sys.exit(rc)
