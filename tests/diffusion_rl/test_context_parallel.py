"""Context parallelism (diffusion_rl/context_parallel.py): `model.context_parallel: {ulysses_degree: 2}` over 2 CPU
processes (gloo) gives the one-process rollout of the tiny Wan pipeline; bad settings, one-process launches and
training under it are typed errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from diffusion_rl.config import ModelConfig
from mmreward.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("value, match", [
    ({"ulysses": 2}, "unknown keys"),
    ({"ulysses_degree": 0}, "whole number >= 1"),
    ({"ring_degree": 1}, "ulysses_degree or ring_degree > 1"),
])
def test_bad_settings_are_config_errors(value, match):
    with pytest.raises(ConfigError, match=match):
        ModelConfig(pretrained="x", context_parallel=value)
    assert ModelConfig(pretrained="x", context_parallel={"ring_degree": 2}).context_parallel == {
        "ulysses_degree": 1, "ring_degree": 2}


def test_one_process_launch_and_training_are_config_errors():
    from diffusion_rl.config import from_dict
    from diffusion_rl.context_parallel import enable_context_parallel
    from diffusion_rl.policy import Policy

    with pytest.raises(ConfigError, match="torchrun --nproc_per_node 2"):
        enable_context_parallel(object(), {"ulysses_degree": 2, "ring_degree": 1})
    cfg = from_dict({"model": {"pretrained": "x", "context_parallel": {"ulysses_degree": 2}},
                     "reward": {"rewards": {"mock": 1.0}}})
    with pytest.raises(ConfigError, match="rollouts only so far"):
        Policy(cfg, None, None)


# two processes start, load and sample a tiny Wan clip: 97 s measured on the 2 shared cores, so slow; the typed
# errors above run by default
@pytest.mark.slow
def test_two_process_ulysses_rollout_equals_the_one_process_rollout(tiny_pipeline_dir, tmp_path):
    """The 2-process rollout with the clip's 12 tokens split 6 + 6 (checked in the run) equals the one-process
    rollout from the same counter-based noise: measured bit-exact on CPU (Ulysses moves whole heads, so each head's
    attention is the same computation); the tolerance, 1e-5 of the latents' scale, leaves room for other kernels."""
    from safetensors.torch import load_file

    from diffusion_rl.pipelines import adapter_for_config, run_pipeline
    from tests._helpers.context_parallel_run import sample, settings
    from tests._helpers.tolerances import assert_close_scaled

    pipe_dir = str(tiny_pipeline_dir("wan"))
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    torchrun = Path(sys.executable).parent / "torchrun"
    proc = subprocess.run([str(torchrun), "--nproc_per_node", "2", "--master_port", "29557",
                           str(REPO / "tests" / "_helpers" / "context_parallel_run.py"), pipe_dir, str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    cp = load_file(str(tmp_path / "cp.safetensors"))
    cfg = settings(pipe_dir)
    one = sample(adapter_for_config(run_pipeline(cfg, "cpu"), cfg))
    assert (one.log_probs[:, :2] != 0).all()  # SDE steps with log-probs, so they are compared too
    assert_close_scaled(cp["latents"], one.latents, rel=1e-5)
    assert_close_scaled(cp["log_probs"].double(), one.log_probs.double(), rel=1e-5)
    torch.testing.assert_close(cp["images"], one.images, atol=1e-5, rtol=0)
