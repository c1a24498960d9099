"""Run by `accelerate launch -m tests._helpers.train_runs A.yaml B.yaml ... [--then MODULE ARG ...]`
(tests/_helpers/two_process.py): `diffusion-rl train --config` for each config in turn, then `MODULE.main(*ARGS)`
(a test runner such as tests/_helpers/hacking_guard_dist_run.py), in the one launched process group, so that
several 2-process checks pay for one launch (the launcher, and each process's torch/diffusers import)."""

from __future__ import annotations

import importlib
import sys

from diffusion_rl.cli import main

if __name__ == "__main__":
    args = sys.argv[1:]
    then = args.index("--then") if "--then" in args else len(args)
    for config in args[:then]:
        rc = main(["train", "--config", config])
        if rc:
            sys.exit(rc)
    if then < len(args):  # last: such a runner may patch modules for its own run
        importlib.import_module(args[then + 1]).main(*args[then + 2:])
