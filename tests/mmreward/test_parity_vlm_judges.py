"""UnifiedReward and UnifiedReward-Think against their originals' inference code, on a tiny random Qwen2.5-VL
checkpoint written in the official layout and loaded through our real loaders.

The references are transcribed from CodeGoat24/UnifiedReward @ ff6f520 (never through mmreward's code; qwen_vl_utils'
`fetch_image` is the shared transcription in tests/_helpers/vlm_parity.py):
- UnifiedReward-Think/inference_qwen/image_generation/qwen_infer_cot_image_generation.py (Think, pairwise);
- inference_qwen/image_generation/qwen_pair_rank_image_generation.py (UnifiedReward, pairwise);
- inference_qwen/UnifiedReward-2.0-inference/point_score_ACS_image_generation.py (UnifiedReward-2.0, pointwise:
  the same messages, sent to its vLLM server; here run in-process as the other scripts run).
Each builds the user turn (images first, then the text), `processor.apply_chat_template(..., add_generation_prompt=
True)`, qwen_vl_utils' `process_vision_info` (`fetch_image`: to RGB, smart_resize with 4..16384 patches of 28x28,
Pillow's default bicubic resize), the processor call, then greedy `model.generate`. We compare what reaches
`generate` (token ids exactly, pixel values) and the generated tokens. The random model writes no verdict, so the
parsed score is compared on canned answers.

Transparent images lose their alpha in every one of these paths (the RGBA cases check it, and that compositing on
white instead would not pass): the README @ ff6f520 (since 4d1015a) installs `qwen-vl-utils[decord]==0.0.8` for the
in-process Qwen2.5-VL scripts, whose `fetch_image` is `image_obj.convert("RGB")` (read from the PyPI wheel; 0.0.9 and
later composite RGBA on white in `to_rgb`); the pointwise 2.0 script's `_encode_image` calls `img.convert("RGB")`
before its JPEG for the vLLM server (whose environment gets qwen-vl-utils 0.0.14, on an image with no alpha left).
"""

from __future__ import annotations

import pytest
import torch

import mmreward
from tests._helpers.parity_record import record_parity
from tests._helpers.tolerances import assert_close_scaled
from tests._helpers.vlm_parity import fetch_image, smooth_images, smooth_rgba, spy_on_generate

pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")

pytestmark = pytest.mark.parity

UR = "CodeGoat24/UnifiedReward@ff6f520"
CASES = ("RGB", "grayscale", "odd size", "RGBA (alpha 0-255)")
# the tiny random model never stops by itself: both sides generate this many tokens (the originals allow
# 512 to 4096; the limits themselves are checked in tests/mmreward/test_judge_fidelity.py)
GEN_TOKENS = 24

THINK_PAIR = (
    "Given a caption and two images generated based on this caption, please analyze in detail the two provided images. "
    "Evaluate them on various dimensions such as semantic consistency (how closely the image content aligns with the "
    "caption), aesthetics (composition, color usage, artistic expression), authenticity (realism and attention to "
    "detail), and any other factors you deem relevant. For each evaluation dimension, provide a score between 1-10 for "
    "both images (e.g., Image 1: 8/10, Image 2: 6/10) and provide a concise rationale for the score. Calculate the "
    "total score for each image by summing all dimension scores. Use a chain-of-thought process to detail your "
    "reasoning steps, and enclose all your detailed reasoning within <think> and </think> tags. Then, in the <answer> "
    "tag, output exactly one of the following strings: 'Image 1 is better' or 'Image 2 is better' based on the total "
    "scores. No additional text is allowed in the <answer> section.\n\nExample output format:\n<think>\n1. Semantic "
    "consistency: Image 1 (9/10) - ...; Image 2 (7/10) - ...\n2. Aesthetics: Image 2 (8/10) - ...; Image 1 (8/10) - "
    "...\n3. Authenticity: Image 1 (8/10) - ...; Image 2 (5/10) - ...\n[Additional dimensions if any]: Image 2 (8/10) "
    "- ...; Image 1 (6/10) - ...\nTotal score:\nImage 1: 9+8+8+6=31\nImage 2: 7+8+5+8=28\n</think>\n<answer>Image 1 "
    "is better</answer>\n**Note: In the example above, scores and the final answer are placeholders meant only to "
    "demonstrate the format. Your actual evaluation should be based on the quality of two given images.**\n\nYour task "
    "is provided as follows:\nText Caption: [{prompt}]"
)
UR_PAIR = (
    "You are given a text caption and two generated images based on that caption. Your task is to evaluate and compare "
    "these images based on two key criteria:\n1. Alignment with the Caption: Assess how well each image aligns with the "
    "provided caption. Consider the accuracy of depicted objects, their relationships, and attributes as described in "
    "the caption.\n2. Overall Image Quality: Examine the visual quality of each image, including clarity, detail "
    "preservation, color accuracy, and overall aesthetic appeal.\nCompare both images using the above criteria and "
    "select the one that better aligns with the caption while exhibiting superior visual quality.\nProvide a clear "
    "conclusion such as \"Image 1 is better.\", \"Image 2 is better.\" and \"Both images are equally good.\"\nYour task "
    "is provided as follows:\nText Caption: [{prompt}]"
)
UR_ACS = (
    "You are presented with a generated image and its associated text caption. "
    "Your task is to analyze the image across multiple dimensions in relation to the caption. Specifically:\n"
    "Provide overall assessments for the image along the following axes (each rated from 1 to 5):\n"
    "- Alignment Score: How well the image matches the caption in terms of content.\n"
    "- Coherence Score: How logically consistent the image is (absence of visual glitches, object distortions, etc.).\n"
    "- Style Score: How aesthetically appealing the image looks, regardless of caption accuracy.\n\n"
    "Output your evaluation using the format below:\n\n"
    "Alignment Score (1-5): X\n"
    "Coherence Score (1-5): Y\n"
    "Style Score (1-5): Z\n\n"
    "Your task is provided as follows:\n"
    "Text Caption: [{prompt}]"
)


# ------------------------------------------------------------------------------------------------
# the scripts, transcribed
# ------------------------------------------------------------------------------------------------
def _original_inputs(folder, images, text, *, rgba_on_white):
    """The scripts' messages, chat template, process_vision_info and processor call. rgba_on_white=False:
    qwen-vl-utils 0.0.8's convert("RGB"), the README's pin; True: the later releases' `to_rgb`."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(folder)
    messages = [{"role": "user", "content": [*({"type": "image", "image": im} for im in images),
                                             {"type": "text", "text": text}]}]
    chat = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    fetched = [fetch_image(im, rgba_on_white=rgba_on_white) for im in images]
    return processor(text=[chat], images=fetched, videos=None, padding=True, return_tensors="pt")


def _original_generate(folder, images, text, max_new_tokens):
    """The in-process scripts' body (qwen-vl-utils 0.0.8: alpha dropped), then greedy generate."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(folder, torch_dtype="auto").eval()
    inputs = _original_inputs(folder, images, text, rgba_on_white=False)
    with torch.no_grad():
        generated = model.generate(**inputs, max_new_tokens=max_new_tokens)
    return inputs, generated[0, inputs["input_ids"].shape[1]:]


def _on_white_differs(folder, images, text, ours):
    """With an RGBA image among `images`, the other convention (RGBA pasted on white, qwen-vl-utils >= 0.0.9)
    gives pixels far from ours: the RGBA case can tell the two apart."""
    assert any(im.mode == "RGBA" for im in images)
    other = _original_inputs(folder, images, text, rgba_on_white=True)["pixel_values"]
    assert (other - ours).abs().max() > 0.5


# ------------------------------------------------------------------------------------------------
# fixtures
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def qwen25(tmp_path_factory):
    from mmreward.testing.qwen_vl import build_tiny_qwen_vl

    path = tmp_path_factory.mktemp("ur_qwen25")
    # the real Qwen2.5-VL processor's bounds: its own resize leaves qwen_vl_utils' sizes alone
    build_tiny_qwen_vl(path, variant="qwen2_5_vl", seed=11, max_pixels=16384 * 28 * 28)
    return path


def _images():
    # RGB 64x96 (resized to 56x84... by Pillow), grayscale (mode "L"), odd 61x93, RGBA 60x90 with alpha 0..255
    return (*smooth_images(seed=3), smooth_rgba(seed=7))


def _check(family, judge_calls, reference, what):
    (kwargs, ours_new), (ref_inputs, ref_new) = judge_calls, reference
    assert kwargs["input_ids"].tolist() == ref_inputs["input_ids"].tolist(), f"{what}: prompt tokens differ"
    assert kwargs["image_grid_thw"].tolist() == ref_inputs["image_grid_thw"].tolist()
    assert not kwargs.get("do_sample", False)
    record_parity(family, original=f"{UR} {what}", how="transcribed", actual=kwargs["pixel_values"],
                  expected=ref_inputs["pixel_values"], cases=CASES,
                  not_checked="the verdict of real weights (random weights write no verdict: parsing checked on "
                  "canned answers)")
    assert_close_scaled(kwargs["pixel_values"], ref_inputs["pixel_values"], rel=1e-5)
    assert ours_new.tolist()[0][: len(ref_new)] == ref_new.tolist()[: ours_new.shape[1]], f"{what}: generations differ"


@pytest.mark.parametrize("pair", [(0, 1), (2, 0), (3, 0)])
def test_unifiedreward_think_pairwise_is_qwen_infer_cot(qwen25, pair):
    images = _images()
    first, second = images[pair[0]], images[pair[1]]
    judge = mmreward.load("unifiedreward-think", checkpoint=str(qwen25), debias=False, max_new_tokens=GEN_TOKENS)
    calls = spy_on_generate(judge)
    judge.compare(["a red fox in the snow"], [first], [second])
    text = THINK_PAIR.replace("{prompt}", "a red fox in the snow")
    ref = _original_generate(qwen25, [first, second], text, GEN_TOKENS)
    _check("unifiedreward-think", calls[0], ref,
           "UnifiedReward-Think/inference_qwen/image_generation/qwen_infer_cot_image_generation.py")
    if first.mode == "RGBA":
        _on_white_differs(qwen25, [first, second], text, calls[0][0]["pixel_values"])


@pytest.mark.parametrize("pair", [(2, 1), (1, 3)])
def test_unifiedreward_pairwise_is_qwen_pair_rank(qwen25, pair):
    first, second = (_images()[i] for i in pair)
    judge = mmreward.load("unifiedreward", checkpoint=str(qwen25), debias=False, max_new_tokens=GEN_TOKENS)
    calls = spy_on_generate(judge)
    judge.compare(["two cats"], [first], [second])
    text = UR_PAIR.replace("{prompt}", "two cats")
    ref = _original_generate(qwen25, [first, second], text, GEN_TOKENS)
    _check("unifiedreward", calls[0], ref, "inference_qwen/image_generation/qwen_pair_rank_image_generation.py")
    if second.mode == "RGBA":
        _on_white_differs(qwen25, [first, second], text, calls[0][0]["pixel_values"])


@pytest.mark.parametrize("index", [0, 1, 2, 3])
def test_unifiedreward_pointwise_is_point_score_acs(qwen25, index):
    image = _images()[index]
    judge = mmreward.load("unifiedreward", checkpoint=str(qwen25), max_new_tokens=GEN_TOKENS)
    calls = spy_on_generate(judge)
    judge.score(["a lighthouse at dusk"], [image])
    text = UR_ACS.replace("{prompt}", "a lighthouse at dusk")
    # `_encode_image`: img.convert("RGB") (alpha dropped) before the JPEG the script sends
    ref = _original_generate(qwen25, [image.convert("RGB")], text, GEN_TOKENS)
    _check("unifiedreward", calls[0], ref,
           "inference_qwen/UnifiedReward-2.0-inference/point_score_ACS_image_generation.py (in-process; the "
           "script's JPEG q95 round trip to its vLLM server not reproduced)")
    if image.mode == "RGBA":
        _on_white_differs(qwen25, [image], text, calls[0][0]["pixel_values"])
