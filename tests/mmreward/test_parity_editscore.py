"""EditScore against its original inference code, on a tiny random Qwen2.5-VL checkpoint with a random LoRA
adapter, both written in the official formats and loaded through our real loader.

The reference is transcribed from VectorSpaceLab/EditScore (never through mmreward's code; qwen_vl_utils'
`fetch_image` is the shared transcription in tests/_helpers/vlm_parity.py):
- editscore/__init__.py @ 35ddc1a `EditScore.evaluate` (the README's entry point): SC prompt = context, two-image
  edit rule and SC rule with '10' -> score_range, '<instruction>' filled; SC request = [source, edited] + SC prompt,
  PQ request = [edited] + PQ prompt; SC = min(SC scores) / (range / 10), PQ likewise, overall = sqrt(SC * PQ);
- editscore/mllm_tools/qwen25vl.py @ 389008c `Qwen25VL` (backbone 'qwen25vl'): `PeftModel.from_pretrained(...)
  .merge_and_unload()`, the hand-written chat template ('<img1>: <|vision_start|><|image_pad|><|vision_end|>'...
  after Qwen's default system turn), qwen_vl_utils' `process_vision_info` (`fetch_image`: `to_rgb`, which pastes
  an RGBA image on white, smart_resize with 4..16384 patches of 28x28, Pillow's default bicubic), the processor
  call, then `set_seed(seed)` and `generate(do_sample=True, temperature=0.7, top_p=0.9, top_k=20)`,
  seed = 42 + pass, set again before each of the SC and PQ calls; decoded with skip_special_tokens, stripped.
The random model writes no JSON verdict, so the score itself is compared on canned answers run through both
combinations (the official `min / (range / 10)`, `sqrt` transcribed here; our parser on the official answer shape).

Which qwen-vl-utils: EditScore's pyproject.toml @ 35ddc1a requires `qwen-vl-utils` unpinned (@ 389008c nothing
lists it), and its README hands `Image.open` PNGs to `evaluate` as they are. Every release since 0.0.9 (PyPI wheels
0.0.9 to 0.0.14 read) composites RGBA on white in `to_rgb`; 0.0.8 and older `convert("RGB")`, which no install of
EditScore (Sep 2025 on) picks. So the reference composites (`rgba_on_white=True`), and the RGBA pair checks that
dropping alpha instead would not pass.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

import mmreward
from tests._helpers.parity_record import record_parity
from tests._helpers.tolerances import assert_close_scaled
from tests._helpers.vlm_parity import (
    alpha_mode_images,
    as_transformers4_sees,
    fetch_image,
    smooth_images,
    smooth_rgba,
    spy_on_generate,
)

pytest.importorskip("transformers")
pytest.importorskip("peft")
Image = pytest.importorskip("PIL.Image")

pytestmark = pytest.mark.parity

ES = "VectorSpaceLab/EditScore@35ddc1a (editscore/__init__.py) + @389008c (mllm_tools/qwen25vl.py)"
CASES = ("RGB", "grayscale", "odd size", "RGBA (alpha 0-255) source and edited",
         "LA (grey + alpha) source, P (a transparent index) edited")
GEN_TOKENS = 12  # the tiny random model never stops; both sides generate this many (the original allows 512)
SEED = 42  # EditScore's default seed



# ------------------------------------------------------------------------------------------------
# EditScore's Qwen25VL, transcribed (qwen_vl_utils' fetch_image: tests/_helpers/vlm_parity.py)
# ------------------------------------------------------------------------------------------------
def _apply_chat_template(prompt, num_images):
    template = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
    template += "".join([f"<img{i}>: <|vision_start|><|image_pad|><|vision_end|>" for i in range(1, num_images + 1)])
    return template + f"{prompt}<|im_end|>\n<|im_start|>assistant\n"


def _set_seed(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class _Qwen25VL:
    """editscore/mllm_tools/qwen25vl.py `Qwen25VL` (float32 on CPU instead of bf16 on CUDA)."""

    def __init__(self, base, lora, temperature=0.7):
        from peft import PeftModel
        from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration

        model = Qwen2_5_VLForConditionalGeneration.from_pretrained(base, dtype=torch.float32)
        self.model = PeftModel.from_pretrained(model, lora).merge_and_unload().eval()
        self.processor = AutoProcessor.from_pretrained(base)
        self.temperature = temperature

    def prepare_input(self, images, text_prompt, rgba_on_white=True):
        """rgba_on_white: qwen_vl_utils' `to_rgb` (the releases EditScore installs); False: the alternative
        (alpha dropped), only to show that the RGBA inputs tell the two apart. The fetched images reach the
        processor as transformers 4.x takes them (`as_transformers4_sees`)."""
        images = images if isinstance(images, list) else [images]
        text = _apply_chat_template(text_prompt, num_images=len(images))
        fetched = [as_transformers4_sees(fetch_image(im, rgba_on_white=rgba_on_white)) for im in images]
        return self.processor(text=[text], images=fetched, videos=None, padding=True, return_tensors="pt")

    def inference(self, inputs, seed):
        _set_seed(seed)
        with torch.no_grad():
            out = self.model.generate(**inputs, max_new_tokens=GEN_TOKENS, do_sample=True,
                                      temperature=self.temperature, top_p=0.9, top_k=20)
        new = out[:, inputs["input_ids"].shape[1]:]
        text = self.processor.batch_decode(new, skip_special_tokens=True, clean_up_tokenization_spaces=False)[0]
        return new[0], text.strip()


def _official_combine(sc_scores, pq_scores, score_range=25):
    """EditScore.evaluate's arithmetic for one pass."""
    sc = min(sc_scores) / (score_range / 10)
    pq = min(pq_scores) / (score_range / 10)
    return {"prompt_following": sc_scores[0] / (score_range / 10), "consistency": sc_scores[1] / (score_range / 10),
            "perceptual_quality": pq, "overall": math.sqrt(sc * pq)}


# ------------------------------------------------------------------------------------------------
# fixtures
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText

    from mmreward.testing.qwen_vl import build_tiny_qwen_vl

    root = tmp_path_factory.mktemp("es_parity")
    # the real Qwen2.5-VL processor's bounds: its own resize leaves qwen_vl_utils' sizes alone
    build_tiny_qwen_vl(root / "base", variant="qwen2_5_vl", seed=5, max_pixels=16384 * 28 * 28)
    base = AutoModelForImageTextToText.from_pretrained(root / "base").eval()
    torch.manual_seed(9)
    lora = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "qkv"],
                                           init_lora_weights=False))
    lora.save_pretrained(str(root / "lora"))
    return root / "base", root / "lora"


def _images(tmp_path):
    """RGB, grayscale, odd-size RGB, two partly transparent RGBA PNGs (60x90, 45x70), then LA and a palette image
    with a transparent index (45x60 each; to_rgb converts them without compositing)."""
    paths = []
    images = (*smooth_images(seed=4), smooth_rgba(seed=5), smooth_rgba(seed=6, height=45, width=70),
              *alpha_mode_images(seed=7))
    for name, im in zip(("rgb", "gray", "odd", "rgba", "rgba_small", "la", "palette"), images):
        paths.append(tmp_path / f"{name}.png")
        im.save(paths[-1])
    return paths


@pytest.mark.parametrize("pair", [(0, 2), (1, 0), (3, 4), (5, 6)])
def test_editscore_requests_and_sampling_are_the_originals(model_dirs, tmp_path, pair):
    base, lora = model_dirs
    paths = _images(tmp_path)
    source, edited = paths[pair[0]], paths[pair[1]]
    instruction = "make the sky purple"
    judge = mmreward.load("editscore", checkpoint=str(lora), base_model=str(base), max_new_tokens=GEN_TOKENS)
    calls = spy_on_generate(judge)
    out = judge.score([instruction], [Image.open(edited)], metadata=[{"source_image": str(source)}])

    ref = _Qwen25VL(str(base), str(lora))
    from mmreward.models.edit_rewards import editscore_prompts

    sc_prompt, pq_prompt = editscore_prompts(25)
    # (the prompt texts themselves are checked against vie_prompts in tests/mmreward/test_edit_rewards.py)
    sc_in = ref.prepare_input([Image.open(source), Image.open(edited)], sc_prompt.replace("<instruction>", instruction))
    pq_in = ref.prepare_input(Image.open(edited), pq_prompt)
    sc_new, sc_text = ref.inference(sc_in, seed=SEED)
    pq_new, pq_text = ref.inference(pq_in, seed=SEED)

    assert len(calls) == 2
    for (kwargs, ours_new), ref_in, ref_new, what in ((calls[0], sc_in, sc_new, "SC"), (calls[1], pq_in, pq_new, "PQ")):
        assert kwargs["input_ids"].tolist() == ref_in["input_ids"].tolist(), f"{what}: prompt tokens differ"
        assert kwargs["image_grid_thw"].tolist() == ref_in["image_grid_thw"].tolist()
        record_parity("editscore", original=f"{ES} {what} request pixels", how="transcribed",
                      actual=kwargs["pixel_values"], expected=ref_in["pixel_values"], cases=CASES,
                      not_checked="bf16 on CUDA (both sides run float32 on CPU); the verdict of real weights "
                      "(random weights write no JSON: the score arithmetic is checked on canned answers)")
        assert_close_scaled(kwargs["pixel_values"], ref_in["pixel_values"], rel=1e-6)
        assert ours_new[0].tolist() == ref_new.tolist(), f"{what}: sampled generations differ"
    if pair == (3, 4):  # the RGBA inputs separate the conventions: alpha dropped would be far off
        dropped = ref.prepare_input([Image.open(source), Image.open(edited)], "x", rgba_on_white=False)
        assert (dropped["pixel_values"] - sc_in["pixel_values"]).abs().max() > 0.5
    if pair == (5, 6):  # LA and P: compositing them on white (as RGBA images) would be far off
        on_white = ref.prepare_input([Image.open(source).convert("RGBA"), Image.open(edited).convert("RGBA")], "x")
        assert (on_white["pixel_values"] - sc_in["pixel_values"]).abs().max() > 0.5
    assert out.rationales[0] == f"SC: {sc_text}\n\nPQ: {pq_text}", (repr(out.rationales[0]), repr(sc_text), repr(pq_text))


def _mllm_output_to_dict(input_string):
    """editscore/utils.py @ 35ddc1a `mllm_output_to_dict` (give_up_parsing=False), up to its last resort
    (`robust_json_fix`, not transcribed: None here)."""
    import json
    import re

    delimiter = "||V^=^V||"
    if input_string.count(delimiter) == 2:
        start_index = input_string.find(delimiter) + len(delimiter)
        end_index = input_string.rfind(delimiter)
    else:
        start_index = input_string.find("{")
        end_index = input_string.rfind("}") + 1
        if start_index == -1 or end_index == 0:
            start_index = input_string.find("[")
            end_index = input_string.rfind("]") + 1
            if re.match(r"^\[\d+, ?\d+\]$", input_string[start_index:end_index]):
                scores = json.loads(input_string[start_index:end_index])
                input_string = json.dumps({"score": scores, "reasoning": "list"})
            else:
                try:
                    ok = 0 <= int(input_string) <= 10
                except ValueError:
                    ok = False
                if not ok:
                    return False
                input_string = json.dumps({"score": [int(input_string)], "reasoning": "number"})
            start_index, end_index = 0, len(input_string)
    json_str = input_string[start_index:end_index].strip().replace("\n", "")
    json_str = json_str.replace("\u201c", '"').replace("\u201d", '"').replace("\u2018", "'").replace("\u2019", "'")
    try:
        data = json.loads(json_str)
    except json.JSONDecodeError:
        return None
    if not isinstance(data["score"], list):
        data["score"] = [data["score"]]
    return data


CANNED = [
    '{\n"reasoning" : "The sky is purple; the rest is kept.",\n"score" : [20, 15]\n}',
    'Here is my evaluation.\n{"reasoning": "Sharp, natural lighting.", "score": [24, 22]}',
    '||V^=^V||\n{\n"score" : [3, 25],\n"reasoning" : "Half done."\n}\n||V^=^V||',
    '[6, 0]',
    '7',
    '{"reasoning": "one number", "score": 18}',
    '{\u201creasoning\u201d: \u201ccurly quotes\u201d, \u201cscore\u201d: [12, 9]}',
]


@pytest.mark.parametrize("text", CANNED)
def test_editscore_parser_reads_what_the_official_parser_reads(text):
    from mmreward.models.edit_rewards import parse_editscore_output

    ref = _mllm_output_to_dict(text)
    assert ref, "the canned answer must be one the official parser reads"
    assert parse_editscore_output(text) == [float(v) for v in ref["score"]]


@pytest.mark.parametrize("sc_scores, pq_scores", [([20, 15], [24, 22]), ([3, 25], [10, 7]), ([25, 25], [0, 12])])
def test_editscore_scores_canned_answers_as_the_original(sc_scores, pq_scores):
    class Canned:
        name = "canned"

        def __init__(self, texts):
            self.texts = texts

        def generate(self, requests, *, n=1, temperature=0.0, seed=0, **kwargs):
            return [[self.texts.pop(0)] for _ in requests]

    sc_text = CANNED[0].replace("[20, 15]", str(sc_scores))
    pq_text = CANNED[1].replace("[24, 22]", str(pq_scores))
    from mmreward.models.edit_rewards import EditScore

    judge = EditScore(Canned([sc_text, pq_text]))
    out = judge.score(["make the sky purple"], torch.rand(1, 3, 28, 28),
                      metadata=[{"source_image": torch.rand(3, 28, 28)}])
    ref = _official_combine(sc_scores, pq_scores)
    got = {"prompt_following": out.details["prompt_following"], "consistency": out.details["consistency"],
           "perceptual_quality": out.details["perceptual_quality"], "overall": out.scores}
    actual = torch.tensor([float(got[k][0]) for k in ref])
    expected = torch.tensor(list(ref.values()), dtype=torch.float32)
    record_parity("editscore", original=f"{ES} EditScore.evaluate arithmetic on canned answers", how="transcribed",
                  actual=actual, expected=expected, cases=("canned answers",))
    assert_close_scaled(actual, expected, rel=1e-6)
