"""PaCo-Reward: P(Yes) scoring against a plain transformers pipeline on a tiny Qwen2-VL (both layouts), the
grid/theme parsing of PaCo-RL, the top-logprob formula on canned server answers (incl. malformed ones),
the OpenAI-compatible path on a loopback server, generate mode, both-order averaging and the edit reward."""

from __future__ import annotations

import math

import pytest
import torch

import mmreward
from mmreward.judges.backends import JudgeBackend
from mmreward.judges.yes_no import yes_probability
from mmreward.models.paco_reward import PacoReward, grid_from_prompt, split_panel_prompt
from tests._helpers.loopback_chat import LoopbackChatServer

pytest.importorskip("transformers")

# PaCo-RL's text, typed here from X-GenGroup/PaCo-RL (not imported from the module under test).
GRPO_Q = ('Given two subfigures generated based on the theme: "{}", do the two images maintain consistency in '
          'terms of style, logic and identity? Answer "Yes" and "No" first, and then provide detailed reasons.')
EVAL_Q = ('Do the two images maintain consistency in terms of style, logic and identity? Answer "Yes" and "No" '
          'first, and then provide detailed reasons.')
T2IS_PROMPT = ("FOUR-PANEL Images with a 2x2 grid layout portraying a dentist in a dental office.All images feature "
               "a dentist. [TOP]-[LEFT]:A dentist gestures toward a model. [TOP]-[RIGHT]:The dentist adjusts an "
               "X-ray machine. [BOTTOM]-[LEFT]:The dentist leans over a patient. [BOTTOM]-[RIGHT]:The dentist "
               "wears loupes.")


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    from mmreward.testing.qwen_vl import build_tiny_qwen_vl

    path = tmp_path_factory.mktemp("paco-qwen2vl")
    build_tiny_qwen_vl(path, variant="qwen2_vl", seed=3)
    return path


def _reference_p_yes(proc, model, text, first, second, labels):
    """P(Yes)/(P(Yes)+P(No)) at the first answer token, one pair at a time."""
    from mmreward.backbones.qwen_vl import resize_for_qwen

    if labels:  # PaCo-Reward's evaluation scripts render this string by hand
        vis = "<|vision_start|><|image_pad|><|vision_end|>"
        rendered = (f"<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n<img1>: {vis}"
                    f"<img2>: {vis}{text}<|im_end|>\n<|im_start|>assistant\n")
    else:
        msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": text}]}]
        rendered = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    # Pillow's 8-bit bicubic, as the served processor (the JPEG round trip is off in these tests; its parity with
    # PaCo-RL's requests is tests/mmreward/test_parity_paco.py)
    images = [resize_for_qwen(x, 28 * 28, 56 * 56, "pillow") for x in (first, second)]
    batch = proc(text=[rendered], images=images, images_kwargs={"do_rescale": True, "do_resize": False},
                 return_tensors="pt")
    with torch.no_grad():
        probs = torch.softmax(model(**batch).logits[0, -1].double(), -1)
    yes = proc.tokenizer.convert_tokens_to_ids("Yes")
    no = proc.tokenizer.convert_tokens_to_ids("No")
    return float(probs[yes] / (probs[yes] + probs[no]))


@pytest.mark.parametrize("labels", [False, True])
def test_grid_score_matches_plain_pipeline(qwen_dir, labels):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    reward = mmreward.load("paco-reward", checkpoint=str(qwen_dir), max_pixels=56 * 56, min_pixels=28 * 28,
                           image_labels=labels, micro_batch_size=2, jpeg_round_trip=False)
    g = torch.Generator().manual_seed(0)
    panels = torch.rand(4, 3, 28, 30, generator=g)
    grid = torch.cat([torch.cat([panels[0], panels[1]], 2), torch.cat([panels[2], panels[3]], 2)], 1)
    grid = torch.nn.functional.pad(grid, (0, 1, 0, 1), value=0.5)  # 57x61: floor division drops the extra pixels
    other = torch.rand(3, 57, 61, generator=g)
    got = reward.score([T2IS_PROMPT, "a 1x2 grid of cats"], torch.stack([grid, other]))  # 6 pairs and 1 pair

    proc = AutoProcessor.from_pretrained(qwen_dir)
    model = AutoModelForImageTextToText.from_pretrained(qwen_dir).eval()
    theme = "FOUR-PANEL Images with a 2x2 grid layout portraying a dentist in a dental office.All images feature a dentist."
    pairs = [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    ref = [_reference_p_yes(proc, model, GRPO_Q.format(theme), panels[i], panels[j], labels) for i, j in pairs]
    ref_other = [_reference_p_yes(proc, model, GRPO_Q.format("a 1x2 grid of cats."), other[:, :, :30], other[:, :, 30:60],
                                  labels)]
    expected = torch.tensor([sum(ref) / 6, ref_other[0]], dtype=torch.float32)
    torch.testing.assert_close(got.scores, expected, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(got.details["min_pair"], torch.tensor([min(ref), min(ref_other)]), rtol=1e-4, atol=1e-6)
    assert got.details["parse_failed"].tolist() == [0.0, 0.0] and got.scores[0] != got.scores[1]

    pair = reward.consistency(None if not reward.requires_prompt else "x", panels[:1], panels[3:4])
    expected_pair = _reference_p_yes(proc, model, GRPO_Q.format("x."), panels[0], panels[3], labels)
    assert pair.scores.item() == pytest.approx(expected_pair, rel=1e-4, abs=1e-6)


def test_eval_template_needs_no_prompt_and_canonical_sum(qwen_dir):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    reward = mmreward.load("paco-reward", checkpoint=str(qwen_dir), max_pixels=56 * 56, min_pixels=28 * 28,
                           template="eval", grid=(1, 2), canonicalize=True, jpeg_round_trip=False)
    assert not reward.requires_prompt
    img = torch.rand(1, 3, 28, 56, generator=torch.Generator().manual_seed(5))
    got = reward.score(None, img).scores.item()
    # canonical: every one-token case/space variant of yes/no, from the full next-token distribution
    proc = AutoProcessor.from_pretrained(qwen_dir)
    model = AutoModelForImageTextToText.from_pretrained(qwen_dir).eval()
    from mmreward.backbones.qwen_vl import resize_for_qwen

    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": EVAL_Q}]}]
    rendered = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    halves = [resize_for_qwen(img[0, :, :, :28], 784, 3136, "pillow"),
              resize_for_qwen(img[0, :, :, 28:], 784, 3136, "pillow")]
    batch = proc(text=[rendered], images=halves, images_kwargs={"do_rescale": True, "do_resize": False},
                 return_tensors="pt")
    with torch.no_grad():
        probs = torch.softmax(model(**batch).logits[0, -1].double(), -1)
    vocab = proc.tokenizer.get_vocab()
    decoded = {i: proc.tokenizer.decode([i]) for i in vocab.values()}
    p_yes = sum(float(probs[i]) for i, s in decoded.items() if s.strip().lower() == "yes")
    p_no = sum(float(probs[i]) for i, s in decoded.items() if s.strip().lower() == "no")
    assert got == pytest.approx(p_yes / (p_yes + p_no), rel=1e-4)


# ---------------------------------------------------------------------------------------------- parsing
def test_theme_and_grid_parsing_follow_paco_rl():
    parts = split_panel_prompt(T2IS_PROMPT)
    assert len(parts) == 5 and parts[0].endswith("All images feature a dentist.")
    assert parts[1] == "A dentist gestures toward a model." and parts[4] == "The dentist wears loupes."
    assert split_panel_prompt("a red circle") == ["a red circle."]
    assert grid_from_prompt(T2IS_PROMPT) == (2, 2) and grid_from_prompt("a 2 ⨉ 3 storyboard") == (2, 3)
    assert grid_from_prompt("a red circle") == (1, 1)


@pytest.mark.parametrize("top, canonical, expected", [
    ({"Yes": -0.1, "No": -2.5, "The": -4.0}, False, 1 / (1 + math.exp(-2.4))),
    ({"Yes": -0.3, "yes": -1.0, "No": -2.0}, False, 1 / (1 + math.exp(-1.7))),  # exact tokens only
    ({"Yes": -0.3, " yes": -1.0, "No": -2.0, "NO ": -3.0}, True,
     (math.exp(-0.3) + math.exp(-1.0)) / (math.exp(-0.3) + math.exp(-1.0) + math.exp(-2.0) + math.exp(-3.0))),
    ({"Yes": -0.2, "Maybe": -1.0}, False, 1.0),  # a token missing from the top-k has probability 0
    ({"No": -0.2}, False, 0.0),
])
def test_yes_probability_on_canned_top_logprobs(top, canonical, expected):
    assert yes_probability(top, canonical) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("top", [{}, {"Maybe": -0.1, "The": -2.0}, {"yes": -0.1}])
def test_yes_probability_without_an_answer_is_nan(top):
    assert math.isnan(yes_probability(top, False))


# ---------------------------------------------------------------------------------------------- scripted judges
class ScriptedJudge(JudgeBackend):
    """Top log-probabilities from a rule on the two images; or canned generations."""

    name = "scripted"

    def __init__(self, rule=None, texts=None):
        self.rule, self.texts, self.seen = rule, texts, []

    def top_logprobs(self, requests, k=20):
        self.seen += requests
        out = []
        for r in requests:
            p = self.rule(r)
            out.append({} if p is None else {"Yes": math.log(p), "No": math.log1p(-p)})
        return out

    def generate(self, requests, *, n=1, temperature=0.0, seed=0):
        self.seen += requests
        return [[t] for t in self.texts[: len(requests)]]


def test_both_orders_average_a_position_biased_judge():
    biased = ScriptedJudge(lambda r: 0.9 if float(r.media[0].mean()) > 0.5 else 0.3)
    dark, bright = torch.full((3, 8, 8), 0.2), torch.full((3, 8, 8), 0.8)
    one = PacoReward(biased, template="eval").consistency(None, torch.stack([dark, bright]),
                                                          torch.stack([bright, dark]))
    torch.testing.assert_close(one.scores, torch.tensor([0.3, 0.9]))
    both = PacoReward(biased, template="eval", both_orders=True).consistency(
        None, torch.stack([dark, bright]), torch.stack([bright, dark]))
    torch.testing.assert_close(both.scores, torch.tensor([0.6, 0.6]))
    torch.testing.assert_close(both.details["order_gap"], torch.tensor([0.6, 0.6]))


def test_unreadable_pairs_are_nan_and_flagged_never_zero():
    def rule(r):  # the (0, 2) pair of a 1x3 grid gets no Yes/No among the top tokens
        return None if float(r.media[1].mean()) > 0.7 else 0.8

    g = torch.stack([torch.cat([torch.full((3, 8, 8), v) for v in (0.1, 0.5, 0.9)], 2),
                     torch.full((3, 8, 24), 0.9)])
    out = PacoReward(ScriptedJudge(rule), grid=(1, 3)).score(["a", "b"], g)
    # item 0: pairs (0,1) ok, (0,2) and (1,2) unreadable; item 1: every panel is bright -> all unreadable
    assert out.scores[0].item() == pytest.approx(0.8) and math.isnan(out.scores[1])
    torch.testing.assert_close(out.details["parse_failed"], torch.tensor([2 / 3, 1.0]))


def test_generate_mode_parses_the_verdict_and_keeps_reasons():
    texts = ["Yes. Both show the same woman with red hair.", "No, the style changes from photo to cartoon.",
             "The images are nice.", ""]
    judge = PacoReward(ScriptedJudge(texts=texts), template="eval", mode="generate")
    a = torch.rand(4, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    out = judge.consistency(None, a, a.flip(0))
    assert out.scores[:2].tolist() == [1.0, 0.0] and torch.isnan(out.scores[2:]).all()
    assert out.details["parse_failed"].tolist() == [0.0, 0.0, 1.0, 1.0]
    assert out.rationales[1].startswith("No, the style")


def test_edit_score_is_the_geometric_mean_of_paco_grpo():
    def rule(r):
        return 0.64 if "Except for the parts" in r.text else 0.25

    backend = ScriptedJudge(rule)
    x = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    out = PacoReward(backend).edit_score("make the sky red", x, x.flip(0))
    torch.testing.assert_close(out.scores, torch.full((2,), 0.4))
    assert out.details["consistency"].tolist() == pytest.approx([0.64, 0.64])
    texts = {r.text for r in backend.seen}
    assert ("Compare the edited image (second) with the original image (first). Instruction: 'make the sky red'. "
            "Does the edited image accurately follow this instruction? Answer 'Yes' or 'No' first, then provide "
            "detailed reasons.") in texts


def test_bad_inputs_have_clear_errors():
    judge = PacoReward(ScriptedJudge(lambda r: 0.5))
    with pytest.raises(mmreward.RewardInputError, match="names no grid"):
        judge.score("a red circle", torch.rand(1, 3, 8, 8))
    with pytest.raises(mmreward.RewardInputError, match="grid"):
        PacoReward(ScriptedJudge(lambda r: 0.5), grid=(1, 1))
    with pytest.raises(mmreward.RewardInputError, match="mode"):
        PacoReward(ScriptedJudge(lambda r: 0.5), mode="vote")
    with pytest.raises(mmreward.RewardInputError, match="template"):
        PacoReward(ScriptedJudge(lambda r: 0.5), template="grpoo")
    with pytest.raises(mmreward.RewardInputError, match="same length"):
        judge.consistency("x", torch.rand(2, 3, 8, 8), torch.rand(1, 3, 8, 8))


# ---------------------------------------------------------------------------------------------- OpenAI backend
class LogprobServer(LoopbackChatServer):
    """Answers with scripted first-token top_logprobs, chosen by a key found in the question."""

    def __init__(self, answers):
        self.answers = answers
        super().__init__()

    def reply(self, body, n_seen):
        text = body["messages"][0]["content"][-1]["text"]
        top = next((v for k, v in self.answers.items() if k in text), self.answers[""])
        choice = {"message": {"role": "assistant", "content": "Yes"}}
        if top is not None:
            choice["logprobs"] = {"content": [{"token": "Yes", "logprob": -0.1,
                                               "top_logprobs": [{"token": t, "logprob": v} for t, v in top.items()]}]}
        return 200, {"choices": [choice]}


def test_openai_backend_reads_top_logprobs_and_flags_missing_ones():
    # answer chosen by the theme: normal, no logprobs at all, no Yes/No among the top tokens
    srv = LogprobServer({"a fox": None, "a box": {"The": -0.1, "A": -0.2}, "": {"Yes": -0.5, "No": -1.5, "The": -3.0}})
    try:
        judge = mmreward.load("paco-reward", backend="openai", base_url=srv.url, checkpoint="PaCo-Reward-7B",
                              image_labels=True)
        a = torch.rand(3, 3, 8, 8, generator=torch.Generator().manual_seed(2))
        out = judge.consistency(["a cat", "a fox", "a box"], a, a.flip(0))
    finally:
        srv.close()
    assert out.scores[0].item() == pytest.approx(1 / (1 + math.exp(-1.0)))
    assert torch.isnan(out.scores[1:]).all() and out.details["parse_failed"].tolist() == [0.0, 1.0, 1.0]
    # the three requests run concurrently: pick the cat's by its text, not by arrival order
    body = next(b for b in srv.bodies if '"a cat."' in b["messages"][0]["content"][-1]["text"])
    assert body["model"] == "PaCo-Reward-7B" and body["max_tokens"] == 1 and body["temperature"] == 0.0
    assert body["logprobs"] is True and body["top_logprobs"] == 20
    content = body["messages"][0]["content"]
    assert [c["type"] for c in content] == ["text", "image_url", "text", "image_url", "text"]
    assert content[0]["text"] == "<img1>: " and content[2]["text"] == "<img2>: "
    assert content[1]["image_url"]["url"].startswith("data:image/jpeg;base64,")  # PaCo-RL sends JPEG
    assert content[4]["text"] == GRPO_Q.format("a cat.")
