"""The offline test kit builds real pipeline classes and tokenizers that the real loaders read back."""

from __future__ import annotations

import pytest
import torch


def test_clip_tokenizer_matches_open_clip(clip_tokenizer_dir):
    import open_clip
    from transformers import CLIPTokenizer

    ours = CLIPTokenizer.from_pretrained(str(clip_tokenizer_dir))
    ref = open_clip.get_tokenizer("ViT-B-32")
    texts = ["a red circle left of a blue square", "Two CATS, on a mat!", "photo of 3 dogs"]
    ref_ids = ref(texts)
    for i, text in enumerate(texts):
        ids = ours(text)["input_ids"]
        assert ids == ref_ids[i][: len(ids)].tolist()
        assert int(ref_ids[i][len(ids):].abs().sum()) == 0  # open_clip pads with 0 after the end token


@pytest.mark.parametrize("kind", ["sd", "sdxl", "sd3", "flux"])
def test_tiny_pipeline_round_trip(kind, tiny_pipeline_dir):
    from diffusers import DiffusionPipeline

    expected = {"sd": "StableDiffusionPipeline", "sdxl": "StableDiffusionXLPipeline", "sd3": "StableDiffusion3Pipeline", "flux": "FluxPipeline"}[kind]
    pipe = DiffusionPipeline.from_pretrained(str(tiny_pipeline_dir(kind)))
    assert type(pipe).__name__ == expected
    gen = torch.Generator().manual_seed(0)
    img = pipe("a red circle", num_inference_steps=2, height=32, width=32, output_type="pt", generator=gen).images
    assert img.shape == (1, 3, 32, 32)
    assert 0.0 <= float(img.min()) and float(img.max()) <= 1.0
    gen = torch.Generator().manual_seed(0)
    again = pipe("a red circle", num_inference_steps=2, height=32, width=32, output_type="pt", generator=gen).images
    torch.testing.assert_close(img, again)  # seeded sampling is deterministic
