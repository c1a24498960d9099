"""Fixtures shared by the diffusion_rl inference and DRaFT tests (imported by name into each test module)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # tiny models on a shared 2-core machine: one intra-op thread is several times faster than two
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def sd_generator(tiny_pipeline_dir):
    from diffusion_rl.inference import NoiseToImage

    return NoiseToImage.from_pretrained(tiny_pipeline_dir("sd"), height=16, width=16)


@pytest.fixture(scope="module")
def mock_objective():
    from diffusion_rl.inference import RewardObjective

    return RewardObjective.load({"mock": 1.0})
