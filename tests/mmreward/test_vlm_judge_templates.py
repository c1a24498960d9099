"""Judge prompts are the official text, and the parsers read the official output formats (canned answers
copied from the official repositories' examples, plus malformed ones); VideoScore2's normed soft score."""

from __future__ import annotations

import math
import re
from string import Template

import pytest
import torch

from mmreward.judges.backends import JudgeBackend
from mmreward.models.vlm_judge import FAMILIES, VLMJudge

# Typed from TIGER-AI-Lab/VideoScore2 vs2_inference.py (indentation and trailing spaces included).
VS2_QUERY = Template("""
    You are an expert for evaluating AI-generated videos from three dimensions:
    (1) visual quality \u2013 clarity, smoothness, artifacts;
    (2) text-to-video alignment \u2013 fidelity to the prompt;
    (3) physical/common-sense consistency \u2013 naturalness and physics plausibility.

    Video prompt: $t2v_prompt

    Please output in this format:
    visual quality: <v_score>; \n    text-to-video alignment: <t_score>, \n    physical/common-sense consistency: <p_score>
    """)
VS2_REGEX = r"visual quality:\s*(\d+).*?text-to-video alignment:\s*(\d+).*?physical/common-sense consistency:\s*(\d+)"
# Typed from CodeGoat24/UnifiedReward inference_qwen/UnifiedReward-2.0-inference/point_score_ACS_image_generation.py
UR2_ACS = (
    "You are presented with a generated image and its associated text caption. Your task is to analyze the image "
    "across multiple dimensions in relation to the caption. Specifically:\nProvide overall assessments for the "
    "image along the following axes (each rated from 1 to 5):\n- Alignment Score: How well the image matches the "
    "caption in terms of content.\n- Coherence Score: How logically consistent the image is (absence of visual "
    "glitches, object distortions, etc.).\n- Style Score: How aesthetically appealing the image looks, regardless "
    "of caption accuracy.\n\nOutput your evaluation using the format below:\n\nAlignment Score (1-5): X\n"
    "Coherence Score (1-5): Y\nStyle Score (1-5): Z\n\nYour task is provided as follows:\nText Caption: [{}]"
)


class Canned(JudgeBackend):
    """Answers each request with the next canned text (cycling over calls); records the requests; optional scripted digit probs."""

    name = "canned"
    supports_choice_probs = True

    def __init__(self, texts=(), probs=None):
        self.texts, self.probs, self.requests, self.prefixes = list(texts), probs, [], []

    def generate(self, requests, *, n=1, temperature=0.0, seed=0):
        start = len(self.requests)
        self.requests += requests
        return [[self.texts[(start + i) % len(self.texts)]] * n for i in range(len(requests))]

    def choice_probs(self, requests, prefix, choices):
        self.requests += requests
        self.prefixes.append(prefix)
        return self.probs.expand(len(requests), -1)


def _videos(n=2):
    return torch.rand(n, 2, 3, 8, 8, generator=torch.Generator().manual_seed(0))


def test_videoscore2_prompt_is_the_official_text_and_official_answers_parse():
    answers = [
        "<think>The fox's fur flickers between frames; the motion is plausible.</think>\n"
        "visual quality: 4;\ntext-to-video alignment: 3,\nphysical/common-sense consistency: 2",
        "(1) visual quality \u2013 clarity, smoothness, artifacts: 3\n(2) text-to-video alignment \u2013 fidelity to "
        "the prompt: 4\n(3) physical/common-sense consistency \u2013 naturalness and physics plausibility: 5",
    ]
    backend = Canned(answers)
    out = VLMJudge(backend, FAMILIES["videoscore2"]).score("a red fox jumps", _videos())
    assert backend.requests[0].text == VS2_QUERY.substitute(t2v_prompt="a red fox jumps")
    torch.testing.assert_close(out.scores, torch.tensor([3.0, 4.0]))
    assert out.details["visual quality"].tolist() == [4.0, 3.0]
    assert out.details["physical/common-sense consistency"].tolist() == [2.0, 5.0]
    # where VideoScore2's own regex reads the answer, it agrees with ours
    official = [int(x) for x in re.search(VS2_REGEX, answers[0], re.DOTALL | re.IGNORECASE).groups()]
    assert official == [4, 3, 2]


@pytest.mark.parametrize("answer, reason", [
    ("visual quality: 6;\ntext-to-video alignment: 3,\nphysical/common-sense consistency: 2", "outside"),
    ("visual quality: 4;\ntext-to-video alignment: 3", "missing"),
    ("<think>I could not watch the video.</think>", "missing"),
])
def test_videoscore2_malformed_answers_are_nan_and_flagged(answer, reason):
    out = VLMJudge(Canned([answer]), FAMILIES["videoscore2"]).score("a fox", _videos(1))
    assert math.isnan(out.scores[0]) and out.details["parse_failed"].tolist() == [1.0]


def test_videoscore2_compare_is_bradley_terry_on_pointwise_scores():
    good = "visual quality: 5;\ntext-to-video alignment: 4,\nphysical/common-sense consistency: 3"
    bad = "visual quality: 2;\ntext-to-video alignment: 1,\nphysical/common-sense consistency: 3"
    backend = Canned([good, bad])  # first item of the concatenated batch scores 4, second 2
    judge = VLMJudge(backend, FAMILIES["videoscore2"])
    out = judge.compare("a fox", _videos(1), _videos(1) * 0.5)
    assert out.prob_a.item() == pytest.approx(1 / (1 + math.exp(-2.0)))
    assert all(r.text.startswith("\n    You are an expert") for r in backend.requests)  # no pairwise prompt invented


def test_unifiedreward_pointwise_official_text_and_2_0_decimal_answers():
    image_answer = ("Alignment Score (1-5): 2.694700002670288\nCoherence Score (1-5): 2.371500015258789\n"
                    "Style Score (1-5): 2.802500009536743")  # the official example output
    backend = Canned([image_answer])
    out = VLMJudge(backend, FAMILIES["unifiedreward"]).score("a cat on a mat", torch.rand(1, 3, 8, 8))
    assert backend.requests[0].text == UR2_ACS.format("a cat on a mat")
    expected = (2.694700002670288 + 2.371500015258789 + 2.802500009536743) / 3
    assert out.scores.item() == pytest.approx(expected, rel=1e-6)

    video_answer = "Alignment Score (1-5): 2.4036\nPhysics Score (1-5): 3.0987\nStyle Score (1-5): 3.3889"
    backend = Canned([video_answer])
    out = VLMJudge(backend, FAMILIES["unifiedreward"]).score("a cat", _videos(1))
    assert "- Physics Score: How well the gravity, movements, collisions, and interactions make physical sense.\n" \
        in backend.requests[0].text
    assert out.scores.item() == pytest.approx((2.4036 + 3.0987 + 3.3889) / 3, rel=1e-6)
    assert out.details["Physics Score"].item() == pytest.approx(3.0987)
    # an image answer (Coherence) for a video request is missing its Physics line: NaN, flagged
    out = VLMJudge(Canned([image_answer]), FAMILIES["unifiedreward"]).score("a cat", _videos(1))
    assert math.isnan(out.scores[0]) and out.details["parse_failed"].item() == 1.0


@pytest.mark.parametrize("family, media_kind, answers, expected", [
    ("unifiedreward", "image", ["Image 1 is better.", "Image 1 is better."], 0.5),  # same words both orders
    ("unifiedreward", "image", ["Image 1 is better.", "Image 2 is better."], 1.0),
    ("unifiedreward", "image", ["Both images are equally good.", "Both images are equally good."], 0.5),
    ("unifiedreward", "video", ["Video 2 is better,", "Video 1 is better,"], 0.0),
    ("unifiedreward-think", "image", [
        "<think>\n1. Semantic consistency: Image 1 (9/10) - ...; Image 2 (7/10) - ...\nImage 2 is better at color.\n"
        "Total score:\nImage 1: 9+8+8+6=31\nImage 2: 7+8+5+8=28\n</think>\n<answer>Image 1 is better</answer>",
        "<think>\nTotal score:\nImage 1: 20\nImage 2: 30\n</think>\n<answer>Image 2 is better</answer>"], 1.0),
])
def test_pairwise_official_answer_formats(family, media_kind, answers, expected):
    backend = Canned(answers)
    media = torch.rand(2, 3, 8, 8) if media_kind == "image" else _videos()
    out = VLMJudge(backend, FAMILIES[family]).compare("a cat", media[:1], media[1:])
    assert out.prob_a.item() == pytest.approx(expected)
    text = backend.requests[0].text
    if family == "unifiedreward" and media_kind == "image":
        assert 'Provide a clear conclusion such as "Image 1 is better.", "Image 2 is better." and "Both images are ' \
               'equally good."\nYour task is provided as follows:\nText Caption: [a cat]' in text
    if family == "unifiedreward" and media_kind == "video":
        assert text.startswith("Imagine you are an expert tasked with evaluating AI-generated videos.")
        assert text.endswith("Text Caption: [a cat]\n")
    if family == "unifiedreward-think":
        assert "output exactly one of the following strings: 'Image 1 is better' or 'Image 2 is better'" in text


def test_normed_and_expected_soft_scores_and_forced_answer_lines():
    probs = torch.tensor([[0.1, 0.2, 0.4, 0.2, 0.1]])  # digits 1..5, already renormalised over the digits
    backend = Canned(probs=probs)
    out = VLMJudge(backend, FAMILIES["videoscore2"], mode="soft").score("a fox", _videos(1))
    torch.testing.assert_close(out.scores, torch.tensor([3 * 0.4]))  # ll_based_soft_score_normed: 3 * 0.4
    assert backend.prefixes == ["visual quality: ", "visual quality: 3;\ntext-to-video alignment: ",
                                "visual quality: 3;\ntext-to-video alignment: 3,\nphysical/common-sense consistency: "]
    expected = VLMJudge(Canned(probs=probs), FAMILIES["videoscore2"], mode="soft", soft_formula="expected")
    torch.testing.assert_close(expected.score("a fox", _videos(1)).scores, torch.tensor([3.0]))
    backend = Canned(probs=probs)
    VLMJudge(backend, FAMILIES["unifiedreward"], mode="soft").score("a cat", torch.rand(1, 3, 8, 8))
    assert backend.prefixes[1] == "Alignment Score (1-5): 3\nCoherence Score (1-5): "
    with pytest.raises(Exception, match="soft_formula"):
        VLMJudge(Canned(probs=probs), FAMILIES["videoscore2"], soft_formula="mean")


def test_in_process_soft_scores_match_a_plain_pipeline(tmp_path):
    """Tiny Qwen2-VL: each item alone, the answer lines forced by hand, digits read from the last logits."""
    pytest.importorskip("transformers")
    from transformers import AutoModelForImageTextToText, AutoProcessor

    import mmreward
    from mmreward.backbones.qwen_vl import even_frames, resize_for_qwen
    from mmreward.testing.qwen_vl import build_tiny_qwen_vl

    build_tiny_qwen_vl(tmp_path, seed=4)
    judge = mmreward.load("videoscore2", checkpoint=str(tmp_path), mode="soft", min_pixels=28 * 28,
                          max_pixels=56 * 56)
    videos = torch.rand(2, 2, 3, 28, 56, generator=torch.Generator().manual_seed(3))
    prompts = ["a fox", "two cats playing in the snow"]  # different lengths: left padding is exercised
    out = judge.score(prompts, videos)

    proc = AutoProcessor.from_pretrained(tmp_path)
    model = AutoModelForImageTextToText.from_pretrained(tmp_path).eval()
    digit_ids = [proc.tokenizer.convert_tokens_to_ids(str(d)) for d in range(1, 6)]
    labels = ["visual quality: ", "text-to-video alignment: ", "physical/common-sense consistency: "]
    ends = [";\n", ",\n", ""]
    expected = []
    for prompt, video in zip(prompts, videos):
        msgs = [{"role": "user", "content": [{"type": "video"},
                                             {"type": "text", "text": VS2_QUERY.substitute(t2v_prompt=prompt)}]}]
        text = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        frames = even_frames(resize_for_qwen(video, 28 * 28, 56 * 56))
        dims = []
        for label, end in zip(labels, ends):
            text += label
            batch = proc(text=[text], videos=[frames], return_tensors="pt",
                         videos_kwargs={"do_rescale": False, "do_resize": False, "do_sample_frames": False})
            with torch.no_grad():
                logits = model(**batch).logits[0, -1].double()
            p = torch.softmax(logits, -1)[digit_ids]
            p = p / p.sum()  # VideoScore2: max_prob / total_prob over the digits 1..5
            best = int(p.argmax())
            dims.append((best + 1) * float(p[best]))
            text += str(best + 1) + end
        expected.append(sum(dims) / 3)
    torch.testing.assert_close(out.scores, torch.tensor(expected, dtype=torch.float32), rtol=1e-4, atol=1e-5)
    assert out.scores.unique().numel() == 2


class ScoredGenerations(JudgeBackend):
    """generate_with_choice_probs with canned texts, one token per character, scripted digit distributions."""

    name = "scored"

    def __init__(self, texts, digit_probs):
        self.texts, self.digit_probs = texts, digit_probs

    def generate_with_choice_probs(self, requests, choices, *, temperature=0.0, seed=0):
        ids, probs = [], []
        for text in self.texts[: len(requests)]:
            ids.append([ord(c) for c in text])
            rows = torch.full((len(text), len(choices)), 1.0 / len(choices))
            for pos, ch in enumerate(text):
                if ch in self.digit_probs:
                    rows[pos] = self.digit_probs[ch]
            probs.append(rows)
        return list(self.texts[: len(requests)]), ids, probs

    def token_index_at(self, token_ids, char_offset):
        return char_offset if char_offset < len(token_ids) else -1


def test_videoscore2_generate_mode_scores_the_digits_where_the_answer_wrote_them():
    # VideoScore2's vs2_inference.py: hard value from the text, soft = argmax digit * its renormalised probability
    # at the step that wrote the digit. Digit '4' written with P = (.1, .1, .1, .6, .1), '3' with (0, .2, .5, .3, 0).
    text = "<think>fine</think>\nvisual quality: 4;\ntext-to-video alignment: 3,\nphysical/common-sense consistency: 4"
    probs = {"4": torch.tensor([0.1, 0.1, 0.1, 0.6, 0.1]), "3": torch.tensor([0.0, 0.2, 0.5, 0.3, 0.0])}
    out = VLMJudge(ScoredGenerations([text, "no scores"], probs), FAMILIES["videoscore2"]).score(
        "a fox", _videos())
    assert out.details["visual quality (soft)"][0].item() == pytest.approx(4 * 0.6)
    assert out.details["text-to-video alignment (soft)"][0].item() == pytest.approx(3 * 0.5)
    assert out.scores[0].item() == pytest.approx((2.4 + 1.5 + 2.4) / 3)
    assert out.details["visual quality"][0].item() == 4.0  # the hard value is kept
    assert math.isnan(out.scores[1]) and out.details["parse_failed"].tolist() == [0.0, 1.0]


def test_transformers_backend_step_digit_probs_match_generate_output_scores(tmp_path):
    """The recorded per-step digit distributions equal transformers' own output_scores, and character
    offsets map to the token that writes them."""
    pytest.importorskip("transformers")
    from mmreward.judges.backends import JudgeRequest
    from mmreward.models.vlm_judge import make_backend
    from mmreward.testing.qwen_vl import build_tiny_qwen_vl

    build_tiny_qwen_vl(tmp_path, seed=5)
    backend = make_backend(str(tmp_path), "pretrained", min_pixels=28 * 28, max_pixels=56 * 56, max_new_tokens=6)
    reqs = [JudgeRequest("Rate it.", [torch.rand(2, 3, 28, 28, generator=torch.Generator().manual_seed(i))])
            for i in range(2)]
    digits = [str(d) for d in range(1, 6)]
    texts, ids, probs = backend.generate_with_choice_probs(reqs, digits)
    inputs = backend._batch(reqs, padding_side="left")
    with torch.no_grad():
        ref = backend.model.generate(**inputs, max_new_tokens=6, do_sample=False, output_scores=True,
                                     return_dict_in_generate=True)
    digit_ids = [backend.processor.tokenizer.convert_tokens_to_ids(d) for d in digits]
    for i in range(2):
        steps = len(ids[i])
        assert ids[i] == ref.sequences[i, inputs["input_ids"].shape[1]:][:steps].tolist()
        expected = torch.stack([torch.softmax(s[i, digit_ids].float(), -1) for s in ref.scores[:steps]])
        torch.testing.assert_close(probs[i], expected, rtol=1e-5, atol=1e-6)
    # end to end through the judge: six random tokens hold no score lines, so NaN and flagged; the text is kept
    out = VLMJudge(backend, FAMILIES["videoscore2"]).score(["a fox", "a cat"], torch.stack([r.media[0] for r in reqs]))
    assert torch.isnan(out.scores).all() and out.details["parse_failed"].tolist() == [1.0, 1.0]
    assert len(out.rationales) == 2 and all(isinstance(t, str) for t in out.rationales)
    tok = backend.processor.tokenizer
    written = tok("visual quality: 4;", add_special_tokens=False).input_ids
    decoded = tok.decode(written)
    k = backend.token_index_at(written, decoded.index("4"))
    assert tok.decode(written[k:k + 1]).strip().startswith("4")
