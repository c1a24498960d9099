"""The reward-hacking monitor's rollback under data parallelism: 2 CPU processes (gloo, DDP) launched with
torchrun run tests/_helpers/hacking_guard_dist_run.py, a tiny DRaFT run whose scripted gold reward falls while the training
reward rises, and the processes must agree on everything the monitor does.

The default suite runs this check in the 2-process launch of
test_diffusion_rl_train.py::test_two_process_data_parallel_equals_one_process (`accelerate launch`, which runs the
same runner after its training configs, then calls check_stopped_together and check_best_gold_weights on its
output): a launch of its own costs the launcher and each process's torch/diffusers import again. The torchrun
launch here, with its hang guard, is `slow`."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from diffusion_rl.checkpointing import read_checkpoint
from diffusion_rl.export import LORA_WEIGHT_NAME

REPO = Path(__file__).resolve().parents[2]
ALARM, BEST = 3, 1  # hacking_guard_dist_run.py's scripts: the alarm at iteration 3, gold best at iteration 1


def _cfg(pipe: Path, out: Path) -> dict:
    return {
        "model": {"pretrained": str(pipe), "height": 16, "width": 16, "lora_rank": 4, "lora_alpha": 4},
        "sample": {"num_steps": 2, "guidance_scale": 1.0, "kernel": "ode", "noise_level": 0.0, "group_size": 2,
                   "prompts_per_iteration": 2, "batch_size": 4},
        "reward": {"rewards": {"dist-proxy": 1.0}},
        "train": {"algorithm": "draft", "iterations": 6, "learning_rate": 3e-2, "micro_batch_size": 2},
        "guard": {"mode": "rollback", "window": 3, "tolerance": 0.02},
        "prompts": {"train": ["a red circle"], "eval": ["a blue square"], "eval_samples_per_prompt": 2},
        "log": {"output_dir": str(out), "progress": False, "grid_every": 0, "eval_every": 1, "eval_at_start": False,
                "gold_rewards": ["dist-gold"]},
    }


def write_guard_config(root: Path, pipe: Path) -> Path:
    """The runner's config, its run written to root/run (the runner writes its records to root)."""
    path = root / "run.yaml"
    path.write_text(yaml.safe_dump(_cfg(pipe, root / "run")))
    return path


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory, tiny_pipeline_dir) -> Path:
    root = tmp_path_factory.mktemp("guard_dist")
    path = write_guard_config(root, tiny_pipeline_dir("sd3"))
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}
    # --standalone: a free rendezvous port, so parallel test runs on one machine do not collide; the timeout
    # turns a hang (one process waiting in a collective the other never enters) into a failure (the run takes
    # ~20 s). torchrun starts its workers in sessions of their own, so on a hang they are stopped by their pids
    # (the runner writes them), and the output goes to a file that an orphaned worker cannot keep open for us.
    log = root / "launch.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                                 str(REPO / "tests" / "_helpers" / "hacking_guard_dist_run.py"), str(path), str(root)],
                                env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            proc.wait(timeout=240)
        except subprocess.TimeoutExpired:
            for pid_file in root.glob("pid*"):
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid_file.read_text()), signal.SIGKILL)
            proc.kill()
            proc.wait()
            pytest.fail(f"the 2-process run hung (a process left in a collective?): {log.read_text()[-4000:]}")
    assert proc.returncode == 0, log.read_text()[-4000:]
    return root


def _records(root: Path) -> list[dict]:
    return [json.loads((root / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.slow
def test_both_processes_stop_at_the_alarm_and_roll_back_together(two_process_run):
    check_stopped_together(two_process_run)


@pytest.mark.slow
def test_both_processes_end_with_the_best_by_gold_weights_and_export_them(two_process_run):
    check_best_gold_weights(two_process_run)


def check_stopped_together(two_process_run: Path) -> None:
    ranks = _records(two_process_run)
    for rec in ranks:
        assert rec["iteration"] == ALARM and rec["stopped"] is True
        assert rec["alarms"] == [ALARM] and rec["rolled_back_to"] == [BEST]
    # the best-by-gold checkpoint is written once, by the main process only; then the run's last checkpoint
    assert ranks[0]["writes"] == ["best_gold", f"iter_{ALARM:06d}"]
    assert ranks[1]["writes"] == []
    ckpts = two_process_run / "run" / "checkpoints"
    # atomic writes leave no temporary folders behind
    assert sorted(p.name for p in ckpts.iterdir()) == ["best_gold", f"iter_{ALARM:06d}"]
    assert read_checkpoint(ckpts / "best_gold")["iteration"] == BEST


def check_best_gold_weights(root: Path) -> None:
    best = read_checkpoint(root / "run" / "checkpoints" / "best_gold")["params"]
    finals = [load_file(str(root / f"rank{r}_final.safetensors")) for r in range(2)]
    befores = [load_file(str(root / f"rank{r}_before.safetensors")) for r in range(2)]
    assert best.keys() == finals[0].keys() == finals[1].keys() and len(best) > 0
    for n, v in best.items():
        assert torch.equal(finals[0][n], v) and torch.equal(finals[1][n], v), n
        assert torch.equal(befores[0][n], befores[1][n]), n  # DDP kept the processes in step until the alarm
    # the rollback undid real training: two DRaFT steps moved the weights away from the best-by-gold ones
    assert any(not torch.equal(befores[0][n], v) for n, v in best.items())
    last = read_checkpoint(root / "run" / "checkpoints" / f"iter_{ALARM:06d}")["params"]
    assert all(torch.equal(last[n], v) for n, v in best.items())
    # final/ (diffusers' LoRA format: 'transformer.' + peft's name without the adapter name) holds those weights
    exported = load_file(str(root / "run" / "final" / LORA_WEIGHT_NAME))
    assert len(exported) == len(best)
    for n, v in best.items():
        assert torch.equal(exported["transformer." + n.replace(".default", "")].to(v.dtype), v), n
