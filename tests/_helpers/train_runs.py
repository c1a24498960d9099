"""Run by `accelerate launch -m tests._helpers.train_runs A.yaml B.yaml ... [--then MODULE ARG ...]...`
(tests/_helpers/two_process.py): `diffusion-rl train --config` for each config in turn, then each `MODULE.main(*ARGS)`
(test runners such as tests/_helpers/hacking_guard_dist_run.py), in the one launched process group, so that
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
    # then the runners, in order (each `--then MODULE ARG ...`): last, since a runner may patch modules for its run
    runners: list[list[str]] = []
    for arg in args[then:]:
        if arg == "--then":
            runners.append([])
        else:
            runners[-1].append(arg)
    for module, *runner_args in runners:
        importlib.import_module(module).main(*runner_args)
