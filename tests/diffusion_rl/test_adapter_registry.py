"""The adapter table (diffusion_rl.adapters): pipeline class -> (family, adapter), register_adapter, old import paths."""

from __future__ import annotations

import pytest

import diffusion_rl.adapters as adapters
from diffusion_rl.adapters import (
    ADAPTERS,
    DEFAULT_LORA_TARGETS,
    PIPELINE_ADAPTERS,
    VIDEO_FAMILIES,
    adapter_class_for,
    prompt_list,
    register_adapter,
)
from diffusion_rl.adapters.sd import SDAdapter
from diffusion_rl.adapters.wan import WanAdapter
from mmreward.errors import ConfigError


@pytest.fixture
def registry():
    """The table's state before the test, put back in place after it (other modules hold these very objects)."""
    saved = (dict(PIPELINE_ADAPTERS), dict(ADAPTERS), {k: list(v) for k, v in DEFAULT_LORA_TARGETS.items()},
             list(VIDEO_FAMILIES))
    yield
    for live, old in zip((PIPELINE_ADAPTERS, ADAPTERS, DEFAULT_LORA_TARGETS), saved[:3]):
        live.clear()
        live.update(old)
    VIDEO_FAMILIES[:] = saved[3]


def test_every_family_has_its_adapter_lora_targets_and_modality():
    assert set(DEFAULT_LORA_TARGETS) == set(ADAPTERS)
    for name, (family, cls) in PIPELINE_ADAPTERS.items():
        assert cls.family == family and ADAPTERS[family] is cls, name
    assert sorted(VIDEO_FAMILIES) == sorted(f for f, c in ADAPTERS.items() if c.modality == "video")
    assert {"wan", "hunyuan_video", "cogvideox", "ltx"} <= set(VIDEO_FAMILIES)
    assert "sd" not in VIDEO_FAMILIES and "flux" not in VIDEO_FAMILIES


def test_no_two_builtin_pipeline_classes_are_related_by_inheritance():
    # the lookup walks the MRO; a diffusers class deriving from another registered one would change its family
    import diffusers

    builtin = ["StableDiffusionPipeline", "StableDiffusionXLPipeline", "StableDiffusion3Pipeline", "FluxPipeline",
               "FluxKontextPipeline", "QwenImageEditPipeline", "WanPipeline", "HunyuanVideoPipeline",
               "CogVideoXPipeline", "LTXPipeline"]
    for name in builtin:
        cls = getattr(diffusers, name)
        assert adapter_class_for(cls) == PIPELINE_ADAPTERS[name], name
        others = [c.__name__ for c in cls.__mro__[1:] if c.__name__ in builtin]
        assert not others, (name, others)


def test_a_subclass_resolves_to_its_parents_adapter_and_a_registered_subclass_to_its_own(registry):
    import diffusers

    class Wrapped(diffusers.WanPipeline):  # a ReNO-style wrapper: not registered, finds WanPipeline's adapter
        pass

    class Custom(diffusers.StableDiffusionPipeline):
        pass

    class CustomAdapter(SDAdapter):
        family = "custom_sd"

    assert adapter_class_for(Wrapped) == ("wan", WanAdapter)
    assert adapter_class_for(Custom) == ("sd", SDAdapter)
    register_adapter("Custom", "custom_sd", CustomAdapter, ["to_q", "to_v"])
    # registered last, yet found before StableDiffusionPipeline: the most derived class wins
    assert adapter_class_for(Custom) == ("custom_sd", CustomAdapter)
    assert adapter_class_for(diffusers.StableDiffusionPipeline) == ("sd", SDAdapter)
    assert DEFAULT_LORA_TARGETS["custom_sd"] == ["to_q", "to_v"] and ADAPTERS["custom_sd"] is CustomAdapter


def test_make_adapter_and_pipeline_family_find_a_registered_adapter(registry, tiny_pipeline_dir):
    from diffusion_rl.pipelines import load_pipeline, make_adapter, pipeline_family

    pipe = load_pipeline(tiny_pipeline_dir("sd"))

    class MySD(type(pipe)):
        pass

    class MyAdapter(SDAdapter):
        family = "my_sd"

    pipe.__class__ = MySD
    assert type(make_adapter(pipe, 32, 32)) is SDAdapter  # before registration: the parent's adapter
    register_adapter("MySD", "my_sd", MyAdapter, ["to_q"])
    assert pipeline_family(pipe) == "my_sd"
    adapter = make_adapter(pipe, 32, 32)
    assert type(adapter) is MyAdapter and adapter.family == "my_sd"


def test_a_registered_video_adapter_joins_video_families_everywhere(registry):
    from diffusion_rl.inference import noise_to_image
    from diffusion_rl.pipelines import VIDEO_FAMILIES as from_pipelines

    class MyWan(WanAdapter):
        family = "my_wan"

    register_adapter("MyWanPipeline", "my_wan", MyWan, ["to_q"])
    assert "my_wan" in VIDEO_FAMILIES and "my_wan" in from_pipelines and "my_wan" in noise_to_image.VIDEO_FAMILIES


@pytest.mark.parametrize("args, match", [
    (("Not a name", "sd", SDAdapter, ["to_q"]), "class name"),
    (("MyPipeline", "sd", object, ["to_q"]), "PipelineAdapter subclass"),
    (("MyPipeline", "other", SDAdapter, ["to_q"]), "differs from SDAdapter.family"),
    (("MyPipeline", "sd", SDAdapter, []), "lora_targets"),
    (("MyPipeline", "sd", SDAdapter, ["to_q", ""]), "lora_targets"),
])
def test_bad_registrations_are_typed_errors_that_change_nothing(registry, args, match):
    before = dict(PIPELINE_ADAPTERS)
    with pytest.raises(ConfigError, match=match):
        register_adapter(*args)
    assert PIPELINE_ADAPTERS == before


def test_unsupported_pipeline_error_lists_the_table_and_the_guide():
    class NotAPipeline:
        pass

    with pytest.raises(ConfigError, match="NotAPipeline is not supported.*FluxPipeline.*adding_a_model"):
        adapter_class_for(NotAPipeline())


def test_old_import_paths_give_the_same_objects():
    from diffusion_rl import adapter_base, pipelines, video_adapters
    from diffusion_rl.adapters import base, cogvideox, flux_kontext, ltx, qwen_image_edit

    assert pipelines.SDAdapter is SDAdapter and pipelines.WanAdapter is WanAdapter
    assert pipelines.FluxKontextAdapter is flux_kontext.FluxKontextAdapter
    assert pipelines.QwenImageEditAdapter is qwen_image_edit.QwenImageEditAdapter
    assert video_adapters.LTXAdapter is ltx.LTXAdapter and video_adapters.CogVideoXAdapter is cogvideox.CogVideoXAdapter
    assert video_adapters.VIDEO_ADAPTERS == {"cogvideox": cogvideox.CogVideoXAdapter, "ltx": ltx.LTXAdapter}
    assert adapter_base._flow_schedule is base.flow_schedule and adapter_base._prompt_list is base.prompt_list
    assert adapter_base.PipelineAdapter is adapters.PipelineAdapter is pipelines.PipelineAdapter
    assert pipelines.DEFAULT_LORA_TARGETS is DEFAULT_LORA_TARGETS and pipelines.ADAPTERS is ADAPTERS


def test_prompt_list_takes_one_prompt_as_one_item():
    assert prompt_list("a cat") == ["a cat"]
    assert prompt_list(("a", "b")) == ["a", "b"]
