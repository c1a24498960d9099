"""A run on a model with a short token limit prints one truncation line, not one per prompt (issue 28 item 12)."""

from __future__ import annotations

import logging

import pytest

from diffusion_rl.config import from_dict
from diffusion_rl.trainer import Trainer


@pytest.fixture(scope="module")
def sd3(tiny_pipeline_dir):
    """The session's tiny SD3 pipeline (conftest.tiny_pipeline_dir: built once per worker, shared read-only)."""
    return str(tiny_pipeline_dir("sd3"))


def test_truncations_are_reported_once_per_run(sd3, tmp_path, capfd):
    prompts = [f"a red circle above a blue square number {i} with many more words" for i in range(5)]
    cfg = from_dict({
        "model": {"pretrained": sd3, "height": 16, "width": 16, "lora_rank": 4, "lora_alpha": 4,
                  "max_sequence_length": 4},
        "sample": {"num_steps": 2, "kernel": "flow_sde", "noise_level": 0.7, "prompts_per_iteration": 2,
                   "group_size": 2, "batch_size": 4},
        "train": {"algorithm": "grpo", "iterations": 1, "probe": "off"},
        "reward": {"rewards": {"mock": 1.0}},
        "prompts": {"train": prompts},
        "log": {"output_dir": str(tmp_path / "run"), "progress": False},
    })
    trainer = Trainer(cfg)

    class Shown(logging.Handler):  # what reaches the user: records that pass the handlers' filters
        messages: list[str] = []

        def emit(self, record):
            self.messages.append(record.getMessage())

    shown = Shown()
    from diffusers.utils import logging as d_logging

    level = d_logging.get_verbosity()
    d_logging.set_verbosity_warning()  # diffusers' default; an earlier test in this process may have lowered it
    logging.getLogger("diffusers").addHandler(shown)
    try:
        capfd.readouterr()
        trainer.embeds_for(prompts[:3])
        trainer.embeds_for(prompts)
        err = capfd.readouterr().err
        assert trainer._truncation.count >= 5  # every prompt was truncated (T5 at 4 tokens)
        assert not [m for m in shown.messages if "was truncated" in m]
        assert err.count("note: prompts are truncated") == 1, err
        # without the notice, diffusers shows one warning per prompt: what the run used to print
        for p in prompts[:3]:
            trainer.adapter.encode([p + " again"])
        assert len([m for m in shown.messages if "was truncated" in m]) >= 3
    finally:
        logging.getLogger("diffusers").removeHandler(shown)
        d_logging.set_verbosity(level)

