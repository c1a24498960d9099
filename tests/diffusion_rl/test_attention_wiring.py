"""One attention choice everywhere: every reward family and every pipeline kind runs the chosen backend.

CPU only (no GPU, no xformers here): `sdpa` and `math` are exercised for real; `xformers`/`flash` must be
typed errors on CPU. "No path ignores the choice" is checked by walking every module of each loaded model
and requiring each attention-like module (class name containing "Attention", or nn.MultiheadAttention) to be
reported as running the choice, itself or through the attention layer it contains.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import mmreward
from mmreward import attention
from mmreward.edit import SCORED_WITH_SOURCES
from mmreward.errors import ConfigError
from mmreward.testing.conformance import PROMPTS, sample_media

# Families whose tiny instance runs attention. Listed by hand so that a family that silently stops
# exposing its attention modules (the choice would not reach them) fails the enumeration test.
ATTENTION_FAMILIES = {
    "aesthetic", "clipscore", "editreward", "editscore", "geneval", "hpsv2", "hpsv2.1", "hpsv3", "imagereward", "paco-reward", "pickscore",
    "preference-head", "r1-reward", "realgen-detectors", "realism-classifier", "shapesworld-aesthetic", "shapesworld-pref",
    "skywork-vl-reward",
    "unifiedreward", "unifiedreward-think", "univfd", "videoalign", "videoscore2", "visual-prm", "vqascore",
}
# relative tolerance of sdpa vs the explicit math path in fp32 (different summation order only)
RTOL = 1e-4


def _ignored(model: nn.Module, report: dict[str, str], prefix: str = "") -> list[str]:
    """Attention-like modules that are neither reported nor contain a reported attention layer."""
    keys = set(report)
    bad = []
    for name, module in model.named_modules():
        if not (isinstance(module, nn.MultiheadAttention) or "Attention" in type(module).__name__):
            continue
        full = f"{prefix}{name}" if name else prefix.rstrip(".")
        if full not in keys and not any(k.startswith(full + ".") for k in keys):
            bad.append(f"{full} ({type(module).__name__})")
    return bad


def _load(name: str, choice: str):
    spec = mmreward.get_spec(name)
    missing = spec.missing_requirements()
    if missing:
        pytest.skip(f"{name} needs {missing}")
    return mmreward.load(name, weights="random", device="cpu", attention=choice, **spec.tiny_options)


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    finite = torch.isfinite(a)
    assert torch.equal(finite, torch.isfinite(b))
    scale = a[finite].abs().max().clamp_min(1e-6) if finite.any() else torch.tensor(1.0)
    torch.testing.assert_close(b[finite], a[finite], rtol=RTOL, atol=RTOL * float(scale))


@pytest.mark.parametrize("name", mmreward.list_rewards())
def test_every_family_runs_the_chosen_backend_and_sdpa_matches_math(name):
    reward = _load(name, "sdpa")
    report = attention.attention_backends(reward)
    if name not in ATTENTION_FAMILIES:
        assert report == {} and reward.attention_backend is None
        return
    assert report, f"{name}: no attention module found, so the attention choice cannot reach it"
    assert set(report.values()) == {"sdpa"}, report
    assert reward.attention_backend == "sdpa"
    assert _ignored(reward, report) == []
    if name in SCORED_WITH_SOURCES:
        return  # scoring needs source images (tests/mmreward/test_edit_rewards.py)

    media = sample_media(reward, batch=2, size=64)
    prompts = PROMPTS[:2]
    torch.manual_seed(0)
    with_sdpa = reward.score(prompts, media).scores
    assert attention.apply_attention(reward, "math") == "math"
    report = attention.attention_backends(reward)
    assert set(report.values()) == {"math"} and reward.attention_backend == "math"
    assert _ignored(reward, report) == []
    torch.manual_seed(0)
    _close(with_sdpa, reward.score(prompts, media).scores)


@pytest.mark.parametrize("name", ["clipscore", "hpsv2", "imagereward", "vqascore"])  # HF, open_clip, own, Qwen-VL
@pytest.mark.parametrize("choice", ["xformers", "flash"])
def test_gpu_only_choices_on_cpu_are_config_errors(name, choice):
    with pytest.raises(ConfigError, match="needs a CUDA device"):
        _load(name, choice)


def test_choice_is_checked_and_attention_free_families_accept_any():
    with pytest.raises(ConfigError, match="must be one of"):
        mmreward.load("mock", attention="fast")
    # nothing to run xformers on: not an error, and the reward says it runs no attention
    assert mmreward.load("mock", attention="xformers").attention_backend is None
    assert _load("clipscore", "eager").attention_backend == "math"  # transformers' name of the math path


# -- diffusers pipelines ------------------------------------------------------------------------------
def _generate(pipe) -> torch.Tensor:
    kwargs = {"max_sequence_length": 16} if type(pipe).__name__ in ("FluxPipeline", "StableDiffusion3Pipeline") else {}
    if type(pipe).__name__ in ("WanPipeline", "HunyuanVideoPipeline"):
        return pipe("a red circle", num_inference_steps=2, guidance_scale=2.0, output_type="pt", height=32, width=32,
                    num_frames=5, generator=torch.Generator().manual_seed(0)).frames
    if type(pipe).__name__ in ("CogVideoXPipeline", "LTXPipeline"):
        size = 32 if type(pipe).__name__ == "CogVideoXPipeline" else 64
        return pipe("a red circle", num_inference_steps=2, guidance_scale=2.0, output_type="pt", height=size,
                    width=size, num_frames=9, max_sequence_length=16, generator=torch.Generator().manual_seed(0)).frames
    return pipe("a red circle", num_inference_steps=2, guidance_scale=2.0, output_type="pt",
                generator=torch.Generator().manual_seed(0), **kwargs).images


@pytest.mark.parametrize("kind", ["sd", "sdxl", "sd3", "flux", "wan", "hunyuan_video", "cogvideox", "ltx"])
def test_every_pipeline_kind_runs_the_chosen_backend_and_sdpa_matches_math(kind, clip_tokenizer_dir):
    from mmreward.testing.tiny_models import build_tiny_pipeline

    pipe = build_tiny_pipeline(kind, clip_tokenizer_dir)
    pipe.set_progress_bar_config(disable=True)
    for module in pipe.components.values():  # built from configs: T5 would otherwise run dropout
        if isinstance(module, nn.Module):
            module.eval()
    outputs = {}
    for choice in ("sdpa", "math"):
        assert attention.apply_to_pipeline(pipe, choice) == choice
        report = attention.pipeline_attention_backends(pipe)
        assert set(report.values()) == {choice}, report
        # denoiser, VAE and every text encoder run attention, and none of their attention modules is missed
        components = {k for k, v in pipe.components.items() if isinstance(v, nn.Module)}
        if kind in ("cogvideox", "ltx"):  # their VAEs are convolution-only: no attention to configure
            components.discard("vae")
        assert {k.split(".")[0] for k in report} == components
        for comp in components:
            assert _ignored(pipe.components[comp], report, prefix=f"{comp}.") == []
        outputs[choice] = _generate(pipe)
    torch.testing.assert_close(outputs["math"], outputs["sdpa"], rtol=RTOL, atol=RTOL * float(outputs["sdpa"].abs().max()))
    with pytest.raises(ConfigError, match="needs a CUDA device"):
        attention.apply_to_pipeline(pipe, "xformers")


def test_pipeline_loaders_take_the_choice(tiny_pipeline_dir):
    from diffusion_rl.inference.noise_to_image import NoiseToImage
    from diffusion_rl.pipelines import load_pipeline

    pipe = load_pipeline(str(tiny_pipeline_dir("sd")), attention="math")
    assert set(attention.pipeline_attention_backends(pipe).values()) == {"math"}
    gen = NoiseToImage.from_pretrained(tiny_pipeline_dir("flux"), attention="math")
    assert set(attention.pipeline_attention_backends(gen.pipe).values()) == {"math"}
    with pytest.raises(ConfigError, match="model.attention"):
        load_pipeline(str(tiny_pipeline_dir("sd")), attention="fast")


def test_config_key_and_cli_flag():
    from diffusion_rl.config import ModelConfig
    from diffusion_rl.inference import cli

    assert ModelConfig(attention="math").attention == "math"
    with pytest.raises(ConfigError, match="model.attention"):
        ModelConfig(attention="fast")
    import argparse

    parser = argparse.ArgumentParser()
    cli.add_subcommands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["best-of-n", "--pipeline", "x", "--prompt", "p", "--reward", "mock",
                              "--attention", "math"])
    assert args.attention == "math"


def test_cli_xformers_on_cpu_is_one_line_exit_2(tiny_pipeline_dir, capsys):
    import argparse

    from diffusion_rl.inference import cli

    parser = argparse.ArgumentParser()
    cli.add_subcommands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["best-of-n", "--pipeline", str(tiny_pipeline_dir("sd")), "--prompt", "p",
                              "--reward", "clipscore", "--reward-weights", "random", "--device", "cpu",
                              "--attention", "xformers", "--output", "/nonexistent/unused"])
    assert cli.run(args) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "needs a CUDA device" in err


# -- the attention function and the MultiheadAttention swap ---------------------------------------------
def _explicit(q, k, v, mask=None):
    """softmax(q k^T / sqrt(d) + mask) v, written out."""
    w = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if mask is not None:
        w = w.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else w + mask
    return w.softmax(-1) @ v


@pytest.mark.parametrize("backend", ["sdpa", "math"])
def test_attend_matches_the_explicit_formula(backend):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 8, generator=g) for _ in range(3))
    keep = torch.rand(2, 1, 1, 5, generator=g) > 0.3
    keep[..., 0] = True
    additive = torch.randn(2, 1, 5, 5, generator=g)
    for mask in (None, keep, additive):
        ref = _explicit(q, k, v, mask)
        torch.testing.assert_close(attention.attend(q, k, v, mask, backend), ref, rtol=RTOL, atol=RTOL * float(ref.abs().max()))
    with pytest.raises(ConfigError, match="unknown resolved"):
        attention.attend(q, k, v, None, "auto")


@pytest.mark.parametrize("batch_first", [True, False])
def test_swapped_multihead_attention_matches_torch(batch_first):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 4, batch_first=batch_first).eval()
    x = torch.randn(2, 6, 16) if batch_first else torch.randn(6, 2, 16)
    causal = torch.ones(6, 6, dtype=torch.bool).triu(1)  # True = masked out, as nn.MultiheadAttention takes it
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, -2:] = True
    with torch.no_grad():
        ref = mha(x, x, x, need_weights=False, attn_mask=causal, key_padding_mask=pad)[0]
    state = {k: v.clone() for k, v in mha.state_dict().items()}
    attention.apply_attention(nn.Sequential(mha), "math")
    assert type(mha) is attention.DispatchMultiheadAttention and mha.attn_backend == "math"
    assert mha.state_dict().keys() == state.keys()  # checkpoints still load
    with torch.no_grad():
        out = mha(x, x, x, need_weights=False, attn_mask=causal, key_padding_mask=pad)[0]
    torch.testing.assert_close(out, ref, rtol=RTOL, atol=RTOL * float(ref.abs().max()))
