"""Attention backend selection: the logic on every device type, and the CPU path on a real diffusers model."""

from __future__ import annotations

import pytest

from mmreward import attention
from mmreward.errors import ConfigError


def test_auto_prefers_xformers_only_where_it_works(monkeypatch):
    monkeypatch.setattr(attention, "xformers_works", lambda device_type: device_type == "cuda")
    assert attention.select_attention_backend("auto", "cuda") == "xformers"
    assert attention.select_attention_backend("auto", "cpu") == "sdpa"
    monkeypatch.setattr(attention, "xformers_works", lambda device_type: False)
    assert attention.select_attention_backend("auto", "cuda") == "sdpa"


def test_explicit_unavailable_choice_is_an_error(monkeypatch):
    with pytest.raises(ConfigError, match="needs a CUDA device"):
        attention.select_attention_backend("xformers", "cpu")
    monkeypatch.setattr(attention, "xformers_installed", lambda: False)
    with pytest.raises(ConfigError, match=r"mmreward\[xformers\]"):
        attention.select_attention_backend("xformers", "cuda")
    monkeypatch.setattr(attention, "xformers_installed", lambda: True)
    monkeypatch.setattr(attention, "xformers_works", lambda device_type: False)
    with pytest.raises(ConfigError, match="fails on this GPU"):
        attention.select_attention_backend("xformers", "cuda")
    with pytest.raises(ConfigError, match="must be one of"):
        attention.select_attention_backend("flash9", "cpu")
    assert attention.select_attention_backend("eager", "cpu") == "math"  # transformers' name of the math path


def test_real_probe_is_false_on_cpu():
    assert attention.xformers_works("cpu") is False
    assert attention.transformers_attn_implementation("sdpa") == "sdpa"


def test_apply_to_diffusers_unet_sets_processors():
    from diffusers import UNet2DConditionModel

    unet = UNet2DConditionModel(
        block_out_channels=(8, 16), layers_per_block=1, sample_size=8, in_channels=4, out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=8, attention_head_dim=4, norm_num_groups=4,
    )
    attention.apply_to_diffusers(unet, "eager")
    assert {type(p).__name__ for p in unet.attn_processors.values()} == {"AttnProcessor"}
    attention.apply_to_diffusers(unet, "sdpa")
    assert {type(p).__name__ for p in unet.attn_processors.values()} == {"AttnProcessor2_0"}
