"""Shared fixtures. The whole suite is offline: nothing may reach a model hub."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

if os.environ.get("PYTEST_XDIST_WORKER"):  # one thread per worker: the workers already use every core
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _threads():
    # code under test may set torch's thread count (trainers, demos); a leaked count slows every later test of
    # the worker (2 threads per worker on 2 cores measured 2-3x slower), so each test gets the worker's count back
    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _reward_registry():
    # tests register rewards ("test-card-*", guards' probes); left in the process-wide registry they leak into
    # whichever test file xdist runs next in the same worker (test_bf16's family census counted them), so each test
    # gets the registry back as it found it
    from mmreward import registry

    before = registry.specs()  # loads the built-ins first, so restoring never drops them
    yield
    if registry.specs() != before:
        registry._REGISTRY.clear()
        registry._REGISTRY.update(before)


@pytest.fixture(scope="session")
def clip_tokenizer_dir(tmp_path_factory):
    """A folder with the real CLIP BPE tokenizer (built from open_clip's shipped vocab) in HF format."""
    from mmreward.testing.tokenizers import build_clip_tokenizer

    path = tmp_path_factory.mktemp("clip_tokenizer")
    build_clip_tokenizer(path)
    return path


@pytest.fixture(scope="session")
def tiny_pipeline_dir(tmp_path_factory):
    """Factory: tiny_pipeline_dir("sd" | "sdxl" | "sd3" | "flux") -> folder of a tiny pipeline saved in diffusers format.

    Built once per session and kind; treat the folder as read-only.
    """
    from mmreward.testing.tiny_models import save_tiny_pipeline

    root = tmp_path_factory.mktemp("tiny_pipelines")
    cache = {}

    def get(kind: str):
        if kind not in cache:
            cache[kind] = save_tiny_pipeline(kind, root / kind)
        return cache[kind]

    return get


@pytest.fixture(scope="session")
def tiny_clip_dir(tmp_path_factory):
    """A tiny transformers CLIPModel folder (224 px, patch 32) with the real CLIP tokenizer and image processor."""
    from mmreward.testing.tiny_models import save_tiny_transformers_clip

    return save_tiny_transformers_clip(tmp_path_factory.mktemp("tiny_clip") / "clip")
