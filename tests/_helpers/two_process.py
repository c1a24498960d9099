"""The 2-process CPU run the algorithm tests compare with one process: `accelerate launch` with gloo."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]


def launch_two_processes(config: Path | Sequence[Path], *, timeout: int = 600, port: int | None = None,
                         num_processes: int = 2, then: Sequence[Sequence[str]] = ()) -> None:
    """`diffusion-rl train --config config` on 2 CPU processes (gloo), or `num_processes`; fails the test with the
    run's stderr. Several configs run one after the other in one launch, then each runner of `then`, (module,
    args...) whose main(*args) is called (tests/_helpers/train_runs.py).

    `accelerate launch` through its module: the same parser and launch_command, without the accelerate CLI
    loading its other subcommands first (about half the launcher's start-up)."""
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    if isinstance(config, (str, Path)) and not then:
        command = ["-m", "diffusion_rl", "train", "--config", str(config)]
    else:
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
        configs = [config] if isinstance(config, (str, Path)) else config
        command = ["-m", "tests._helpers.train_runs", *map(str, configs),
                   *(arg for runner in then for arg in ("--then", *runner))]
    proc = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu",
                           "--num_processes", str(num_processes), "--num_machines", "1",
                           "--mixed_precision", "no", "--dynamo_backend", "no",
                           *(["--main_process_port", str(port)] if port is not None else []), *command],
                          env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]


def assert_trained_params_match(one: Any, params: dict[str, torch.Tensor], atol: float) -> None:
    """Every trainable parameter of the one-process trainer `one` equals the checkpoint's `params` within atol."""
    names = {id(p): n for n, p in one.policy.unwrapped.named_parameters()}
    for p in one.trainable:
        torch.testing.assert_close(p.detach().cpu(), params[names[id(p)]], rtol=0, atol=atol)
