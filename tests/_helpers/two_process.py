"""The 2-process CPU run the algorithm tests compare with one process: `accelerate launch` with gloo."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
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


FOUR_PROMPTS = ["a red circle", "a blue square", "a green triangle", "a yellow star"]


def one_and_two_process_runs(cfg: dict, out: Path) -> tuple[Any, dict[str, Any]]:
    """One iteration of `cfg` (a config dict writing to `out`/dp2, tiny SD3) on 2 processes, then on one process
    into `out`/dp1; returns (the one-process Trainer, the 2-process run's checkpoint). 4 prompts per iteration, so
    each process holds whole groups."""
    import yaml

    from diffusion_rl.checkpointing import read_checkpoint
    from diffusion_rl.config import from_dict
    from diffusion_rl.trainer import Trainer

    cfg["sample"]["prompts_per_iteration"] = 4
    cfg["prompts"]["train"] = list(FOUR_PROMPTS)
    path = out / "dp.yaml"
    path.write_text(yaml.safe_dump(cfg))
    launch_two_processes(path)
    one = Trainer(from_dict({**cfg, "log": {**cfg["log"], "output_dir": str(out / "dp1")}}))
    one.fit()
    return one, read_checkpoint(out / "dp2" / "sd3" / "checkpoints" / "iter_000001")


def assert_two_processes_match_one(one: Any, two: dict[str, Any], learning_rate: float) -> None:
    """The same mock reward, gradient norm (measured before the step) and weights (Adam's step to 1% of the lr:
    Adam amplifies float noise on coordinates whose gradient is near its eps) as one process."""
    h1, h2 = one.history[0], two["history"][0]
    assert h2["reward/mock"] == pytest.approx(h1["reward/mock"], rel=1e-6, abs=1e-6)
    assert h2["train/grad_norm"] == pytest.approx(h1["train/grad_norm"], rel=1e-4)
    assert_trained_params_match(one, two["params"], atol=1e-2 * learning_rate)
