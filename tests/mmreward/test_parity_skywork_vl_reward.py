"""Skywork-VL-Reward against the original's code path, on a tiny random checkpoint in the official layout.

The reference follows the Skywork/Skywork-VL-Reward-7B model card's inference code (the hub README, gated; read
through public copies of it, e.g. its quick start as reproduced verbatim by third-party scorers), step by step:
messages [user: image + question, assistant: response]; `processor.apply_chat_template(..., tokenize=False,
add_generation_prompt=False)`; qwen_vl_utils `process_vision_info` (below, with the `fetch_image` transcribed in
tests/_helpers/vlm_parity.py: `to_rgb`, `smart_resize`, Pillow's default bicubic `Image.resize`); `processor(text=[text], images=..., padding=True)`;
TRL's `AutoModelForCausalLMWithValueHead` forward and `ValueHead` (transcribed from
huggingface/trl@0734879e177ccd0fa0fa6ec83fd232ecc18bbdf9 trl/models/modeling_value_head.py: the wrapped model
called with `output_hidden_states=True`, `hidden_states[-1]`, dropout, fp32 `summary` Linear, `.squeeze(-1)`),
the value head loaded from `value_head.safetensors` by `load_state_dict(strict=False)` on the wrapper; the score is
`values.gather(-1, attention_mask.sum(-1, keepdim=True) - 1)`. One item per call, as on the card. The model and
processor come from transformers' own `from_pretrained`, not our loaders. Nothing here imports our preprocessing.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import mmreward
from tests._helpers.parity_record import record_parity
from tests._helpers.tolerances import assert_close_scaled
from tests._helpers.vlm_parity import (
    IMAGE_SPECS,
    alpha_mode_images,
    as_transformers4_sees,
    fetch_image,
    write_image_files,
)

pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")

ORIGINAL = ("Skywork/Skywork-VL-Reward-7B model card (TRL AutoModelForCausalLMWithValueHead, "
            "huggingface/trl@0734879 modeling_value_head.py; qwen_vl_utils fetch_image)")
# float32, same weights; the product runs one right-padded batch where the reference runs items one by one:
# measured differences are ~1e-7 of the scores; a wrong token, position scheme or resize moves them by >1e-3
REL = 2e-5
MIN_PIXELS, MAX_PIXELS = 28 * 28, 112 * 112
CASES = ("RGB", "grayscale", "odd size", "downscaled", "RGBA", "LA (grey + alpha)", "P with a transparent index")
QUESTIONS = ["How many circles are there?", "What colour is the square?", "Describe the image.", "", "Is it red?",
             "Is it grey?", "How many colours?"]
RESPONSES = ["There are 3 circles.", "<answer>red</answer>", "a blue triangle left of a green star", "A photo.", "no",
             "yes", "four"]


# ------------------------------------------------------------------------------------------------
# qwen_vl_utils vision_process.py (QwenLM/Qwen2.5-VL qwen-vl-utils): fetch_image in tests/_helpers/vlm_parity.py
# ------------------------------------------------------------------------------------------------
def _process_vision_info(messages):
    # fetch_image with `to_rgb` (RGBA on white) and the one-patch floor when shrinking, as the card's transformers
    # 4.x processor takes it (`as_transformers4_sees`)
    return [as_transformers4_sees(fetch_image(c["image"], rgba_on_white=True, min_pixels=c["min_pixels"],
                                              max_pixels=c["max_pixels"], floor_shrunk_at_one_patch=True))
            for m in messages if isinstance(m["content"], list) for c in m["content"] if c.get("type") == "image"]


# ------------------------------------------------------------------------------------------------
# TRL's value head wrapper, transcribed
# ------------------------------------------------------------------------------------------------
class _TRLValueHead(nn.Module):
    def __init__(self, hidden_size, summary_dropout_prob=0.1):
        super().__init__()
        self.dropout = nn.Dropout(summary_dropout_prob)
        self.summary = nn.Linear(hidden_size, 1)

    def forward(self, hidden_states):
        output = self.dropout(hidden_states)
        if output.dtype != self.summary.weight.dtype:
            output = output.to(self.summary.weight.dtype)
        return self.summary(output)


class _TRLWithValueHead(nn.Module):
    def __init__(self, pretrained_model):
        super().__init__()
        self.pretrained_model = pretrained_model
        self.v_head = _TRLValueHead(pretrained_model.config.text_config.hidden_size)

    def forward(self, input_ids=None, past_key_values=None, attention_mask=None, **kwargs):
        out = self.pretrained_model(input_ids=input_ids, past_key_values=past_key_values,
                                    attention_mask=attention_mask, output_hidden_states=True, **kwargs)
        value = self.v_head(out.hidden_states[-1]).squeeze(-1)
        return (out.logits, out.loss, value)


def _original_scores(folder, paths, questions, responses):
    from safetensors import safe_open
    from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration

    model = _TRLWithValueHead(Qwen2_5_VLForConditionalGeneration.from_pretrained(str(folder)))
    with safe_open(str(folder / "value_head.safetensors"), framework="pt", device="cpu") as f:
        vhead_params = {key: f.get_tensor(key) for key in f.keys()}
    missing, unexpected = model.load_state_dict(vhead_params, strict=False)
    assert not unexpected and not [k for k in missing if k.startswith("v_head.")]
    model.requires_grad_(False)
    model.eval()
    processor = AutoProcessor.from_pretrained(str(folder))
    scores = []
    for path, question, answer in zip(paths, questions, responses):
        messages = [
            {"role": "user", "content": [
                {"type": "image", "image": path, "min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS},
                {"type": "text", "text": question}]},
            {"role": "assistant", "content": answer},
        ]
        text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
        image_inputs = _process_vision_info(messages)
        inputs = processor(text=[text], images=image_inputs, videos=None, padding=True, return_tensors="pt")
        with torch.no_grad():
            values = model(**inputs, return_dict=True, use_cache=False)[-1]
        scores.append(values.gather(dim=-1, index=(inputs["attention_mask"].sum(dim=-1, keepdim=True) - 1))[0, 0])
    return torch.stack(scores)


def _image_files(tmp_path, seed=3):
    """RGB, grayscale, odd-size RGB, a large RGB image (downscaled by smart_resize), RGBA, then LA and a palette
    image with a transparent index (which to_rgb converts without compositing), as PNG files."""
    specs = [*IMAGE_SPECS[:3], ("large.png", "RGB", (150, 133, 3)), ("rgba.png", "RGBA", (45, 45, 4))]
    paths = write_image_files(tmp_path, specs, seed=seed, sine_red=True)
    for name, im in zip(("la.png", "palette.png"), alpha_mode_images(seed)):
        im.save(tmp_path / name)
        paths.append(str(tmp_path / name))
    return paths


@pytest.fixture(scope="module")
def sky_dir(tmp_path_factory):
    from mmreward.models.skywork_vl_reward import write_tiny_skywork_vl_reward

    return write_tiny_skywork_vl_reward(tmp_path_factory.mktemp("skywork"), seed=5)


@pytest.fixture(scope="module")
def reward(sky_dir):
    return mmreward.load("skywork-vl-reward", checkpoint=str(sky_dir), min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)


@pytest.mark.parity
def test_skywork_vl_reward_matches_the_original_path(sky_dir, reward, tmp_path):
    paths = _image_files(tmp_path)
    expected = _original_scores(sky_dir, paths, QUESTIONS, RESPONSES)
    got = reward.score_responses(QUESTIONS, paths, RESPONSES).scores
    max_abs, max_rel = record_parity("skywork-vl-reward", original=ORIGINAL, how="transcribed", actual=got,
                                     expected=expected, cases=CASES,
                                     not_checked="bf16 on GPU (the card runs bf16, value head in fp32)")
    assert float(expected.max() - expected.min()) > 1e-2  # the tiny model's scores spread: the check has teeth
    assert_close_scaled(got, expected, rel=REL, msg=lambda m: f"{m}\nmax abs {max_abs:.3g}, rel {max_rel:.3g}")
    # LA and P: compositing them on white (as RGBA images) would move their scores far past the tolerance
    on_white = _original_scores(sky_dir, [Image.open(p).convert("RGBA") for p in paths[-2:]], QUESTIONS[-2:],
                                RESPONSES[-2:])
    assert float((on_white - expected[-2:]).abs().min()) > 100 * REL * float(expected.abs().max())


def test_the_score_depends_on_the_response_and_the_image(reward, tmp_path):
    paths = _image_files(tmp_path)
    base = reward.score_responses(QUESTIONS[:1] * 3, [paths[0], paths[0], paths[2]],
                                  ["There are 3 circles.", "No idea, sorry.", "There are 3 circles."]).scores
    assert abs(float(base[0] - base[1])) > 1e-3 and abs(float(base[0] - base[2])) > 1e-3


def test_the_tiny_checkpoint_has_the_official_layout(sky_dir):
    import json

    from safetensors import safe_open

    with safe_open(str(sky_dir / "value_head.safetensors"), framework="pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        dtype = f.get_tensor("v_head.summary.weight").dtype
    hidden = json.loads((sky_dir / "config.json").read_text())["text_config"]["hidden_size"]
    assert shapes == {"v_head.summary.weight": (1, hidden), "v_head.summary.bias": (1,)}
    assert dtype == torch.bfloat16
    assert json.loads((sky_dir / "config.json").read_text())["model_type"] == "qwen2_5_vl"


def test_a_value_head_in_another_layout_is_refused(sky_dir, tmp_path):
    import shutil

    from safetensors.torch import save_file

    from mmreward.errors import CheckpointError

    bad = tmp_path / "bad"
    shutil.copytree(sky_dir, bad)
    save_file({"score.weight": torch.zeros(1, 32)}, str(bad / "value_head.safetensors"))  # a classifier's name
    with pytest.raises(CheckpointError, match="summary"):
        mmreward.load("skywork-vl-reward", checkpoint=str(bad))
    (bad / "value_head.safetensors").unlink()
    with pytest.raises(CheckpointError, match="value_head.safetensors"):
        mmreward.load("skywork-vl-reward", checkpoint=str(bad))


def test_best_of_n_picks_the_argmax_per_question(reward, tmp_path):
    from mmreward.models.skywork_vl_reward import select_best_responses

    paths = _image_files(tmp_path)[:2]
    candidates = [["There are 3 circles.", "No idea.", "<answer>2</answer>"], ["red", "The square is blue."]]
    best, scores = select_best_responses(reward, QUESTIONS[:2], paths, candidates)
    for i, cands in enumerate(candidates):
        single = reward.score_responses([QUESTIONS[i]] * len(cands), [paths[i]] * len(cands), cands).scores
        assert_close_scaled(scores[i], single, rel=REL)
        assert best[i] == int(single.argmax())
    assert len(set(torch.cat(scores).round(decimals=4).tolist())) == 5  # distinct scores: the argmax means something
