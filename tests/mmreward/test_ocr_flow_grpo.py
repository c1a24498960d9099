"""The OCR reward's preset="flow_grpo" is Flow-GRPO's OCR reward: settings, filtering, formula, weights error.

References, transcribed here (never through our helpers):
- yifan123/flow_grpo@ac4c86e8cae021841f1fde853d340e0db67690dd flow_grpo/ocr.py (OcrScorer) and
  flow_grpo/rewards.py (ocr_score: images * 255, round, clamp, uint8, NHWC, passed to PaddleOCR as arrays);
- paddleocr==2.9.1 (the version flow_grpo's README installs): paddleocr.py MODEL_URLS["OCR"]["PP-OCRv4"]
  (lang "en": en_PP-OCRv3_det_infer, en_PP-OCRv4_rec_infer, ppocr/utils/en_dict.txt), tools/infer/utility.py
  init_args defaults, tools/infer/predict_system.py TextSystem.__call__ (drop_score filter),
  ppocr/data/imaug/operators.py DetResizeForTest.resize_image_type0, ppocr/postprocess/rec_postprocess.py
  BaseRecLabelDecode / CTCLabelDecode.add_special_char.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import mmreward
from mmreward.errors import CheckpointError, RewardInputError
from tests._helpers.parity_record import record_parity

pytest.importorskip("onnxruntime")
pytest.importorskip("cv2")
pytest.importorskip("onnx")

ROOT = Path(__file__).resolve().parents[2]

# paddleocr 2.9.1 tools/infer/utility.py init_args (the defaults PaddleOCR(lang="en") runs with)
PADDLE_291 = {"det_limit_side_len": 960, "det_limit_type": "max", "drop_score": 0.5, "rec_batch_num": 6,
              "rec_image_shape": "3, 48, 320", "use_space_char": True, "det_db_thresh": 0.3,
              "det_db_box_thresh": 0.6, "det_db_unclip_ratio": 1.5}
# paddleocr 2.9.1 MODEL_URLS["OCR"]["PP-OCRv4"] for lang "en" (det_lang "en")
PADDLE_291_EN_URLS = ("https://paddleocr.bj.bcebos.com/PP-OCRv3/english/en_PP-OCRv3_det_infer.tar",
                      "https://paddleocr.bj.bcebos.com/PP-OCRv4/english/en_PP-OCRv4_rec_infer.tar",
                      "./ppocr/utils/en_dict.txt")


# -- transcriptions ------------------------------------------------------------------------------------
def _ref_levenshtein(a: str, b: str) -> int:
    """Levenshtein.distance: the full (len(a)+1) x (len(b)+1) table."""
    d = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(len(a) + 1):
        d[i][0] = i
    for j in range(len(b) + 1):
        d[0][j] = j
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
    return d[len(a)][len(b)]


def _ref_text_system_filter(rec_res, drop_score=0.5):
    """TextSystem.__call__: keep (text, score) when score >= drop_score; ocr() returns None when none is left."""
    kept = [[None, r] for r in rec_res if r[1] >= drop_score]
    return [kept if kept else None]


def _ref_flow_grpo_reward(result, prompt: str) -> float:
    """OcrScorer.__call__ for one image, with `result` = self.ocr.ocr(img, cls=False)."""
    prompt = prompt.split('"')[1]
    recognized_text = ''.join([res[1][0] if res[1][1] > 0 else '' for res in result[0]]) if result[0] else ''
    recognized_text = recognized_text.replace(' ', '').lower()
    prompt = prompt.replace(' ', '').lower()
    if prompt in recognized_text:
        dist = 0
    else:
        dist = _ref_levenshtein(recognized_text, prompt)
    if dist > len(prompt):
        dist = len(prompt)
    return 1 - dist / (len(prompt))


def _ref_resize_image_type0_max(h: int, w: int, limit_side_len: int = 960) -> tuple[int, int]:
    if max(h, w) > limit_side_len:
        if h > w:
            ratio = float(limit_side_len) / h
        else:
            ratio = float(limit_side_len) / w
    else:
        ratio = 1.0
    resize_h = int(h * ratio)
    resize_w = int(w * ratio)
    resize_h = max(int(round(resize_h / 32) * 32), 32)
    resize_w = max(int(round(resize_w / 32) * 32), 32)
    return resize_h, resize_w


def _ref_ctc_characters(dict_bytes: bytes) -> list[str]:
    """BaseRecLabelDecode.__init__ (use_space_char=True) then CTCLabelDecode.add_special_char."""
    character_str = []
    for line in dict_bytes.splitlines(keepends=True):  # fin.readlines()
        line = line.decode("utf-8").strip("\n").strip("\r\n")
        character_str.append(line)
    character_str.append(" ")
    return ["blank"] + list(character_str)


# -- tests ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def preset_reward():
    return mmreward.load("ocr", preset="flow_grpo", weights="random")


def test_preset_settings_are_paddleocr_291_lang_en(preset_reward):
    from mmreward.ocr.ppocr import MODEL_FILES

    engine = preset_reward.engine
    assert engine.limit_type == PADDLE_291["det_limit_type"]
    assert engine.limit_side_len == PADDLE_291["det_limit_side_len"]
    assert engine.min_confidence == PADDLE_291["drop_score"]
    assert engine.rec_batch_size == PADDLE_291["rec_batch_num"]
    assert engine.channel_order == "rgb"  # flow_grpo passes RGB arrays; PaddleOCR converts none
    db = engine.db
    assert (db.thresh, db.box_thresh, db.unclip_ratio) == (
        PADDLE_291["det_db_thresh"], PADDLE_291["det_db_box_thresh"], PADDLE_291["det_db_unclip_ratio"])
    det, rec, dict_file, _ = MODEL_FILES["ppocrv4_en"]
    assert det == PADDLE_291_EN_URLS[0].rsplit("/", 1)[1].replace("_infer.tar", ".onnx")
    assert rec == PADDLE_291_EN_URLS[1].rsplit("/", 1)[1].replace("_infer.tar", ".onnx")
    assert dict_file == PADDLE_291_EN_URLS[2].rsplit("/", 1)[1]
    assert preset_reward.target_source == "flow_grpo" and preset_reward.match_rule == "flow_grpo"
    # our default stays PP-OCRv5 with every line kept and the shorter side at least 64
    default = mmreward.load("ocr", weights="random")
    assert (default.engine.limit_type, default.engine.limit_side_len, default.engine.min_confidence) == ("min", 64, 0.0)


@pytest.mark.parametrize("hw", [(512, 512), (1024, 1024), (1000, 700), (700, 1000), (1999, 37), (37, 1999),
                                (960, 961), (48, 100), (15, 15), (1337, 999)])
def test_detection_size_is_291_resize_image_type0_max(hw):
    from mmreward.ocr.ppocr import det_resize_shape

    assert det_resize_shape(*hw, 960, 4000, "max") == _ref_resize_image_type0_max(*hw)


def test_en_dict_classes_are_291_ctc_label_decode(tmp_path):
    from mmreward.ocr.ppocr import load_paddle_dict

    # the head of PaddleOCR's en_dict.txt, its last line (a space) and a CRLF line
    raw = b"0\n1\na\nB\r\n!\n\"\n \n"
    (tmp_path / "en_dict.txt").write_bytes(raw)
    assert load_paddle_dict(tmp_path / "en_dict.txt") == _ref_ctc_characters(raw)


# synthetic recognition outputs: per image, (text, confidence) of each detected line in reading order
CASES = [
    ('a sign that says "Hello World"', [("HELLO", 0.93), ("World", 0.81)]),
    ('a sign that says "Hello World"', [("HELLO", 0.93), ("xWorld", 0.49)]),     # one line under drop_score
    ('"OPEN" in neon', [("SHOP", 0.7), ("open", 0.5), ("24h", 0.99)]),          # exactly 0.5 is kept
    ('"OPEN" in neon', [("OPEN", 0.2)]),                                        # all dropped: nothing read
    ('the word "Fresh  Bread" twice', [("fresh", 0.9), ("brad", 0.95)]),
    ('caption "abc" and "xyz"', [("xyz", 0.99)]),                              # first span only
    ('unterminated "Tail text', [("tailtext", 0.8)]),                           # split('"')[1] runs to the end
    ('"Long Sentence Here"', [("completely unrelated and far longer", 0.99)]),  # distance capped
    ('tab "A\tB"', [("a\tb", 0.9)]),                                            # only ' ' is removed
    ('curly “quote” then "ok"', [("ok", 0.9)]),                                 # ASCII quotes only
]


FLOW_GRPO_OCR = "yifan123/flow_grpo@ac4c86e ocr.py + paddleocr==2.9.1 (transcribed)"
NOT_CHECKED_OCR = ("the recognition network itself on real text (PaddleOCR 2.9.1 needs paddlepaddle, not installable "
                   "here); the default PP-OCRv5 pipeline (not Flow-GRPO's) against PaddleOCR 3.x")


@pytest.mark.parity
@pytest.mark.parametrize("prompt, lines", CASES)
def test_filter_and_reward_match_flow_grpo(preset_reward, monkeypatch, prompt, lines):
    engine = preset_reward.engine
    quads = [np.array([[0, 10 * i], [20, 10 * i], [20, 10 * i + 8], [0, 10 * i + 8]], np.float32)
             for i in range(len(lines))]
    monkeypatch.setattr(engine, "detect", lambda images: [list(quads) for _ in images])
    monkeypatch.setattr(engine, "recognize", lambda crops: [lines[i % len(lines)] for i in range(len(crops))])
    ours = preset_reward.score([prompt], torch.rand(1, 3, 40, 40)).scores
    expected = _ref_flow_grpo_reward(_ref_text_system_filter(lines, PADDLE_291["drop_score"]), prompt)
    assert ours.shape == (1,)
    record_parity("ocr (flow_grpo preset): reward", original=FLOW_GRPO_OCR, how="transcribed", actual=ours,
                  expected=[expected], cases=("canned recognitions",), not_checked=NOT_CHECKED_OCR)
    assert abs(float(ours[0]) - expected) <= 1e-6 * max(1.0, abs(expected))


def test_flow_grpo_targets_that_the_original_crashes_on_are_typed_errors(preset_reward):
    image = torch.rand(1, 3, 40, 40)
    with pytest.raises(RewardInputError, match="no '\"'"):
        preset_reward.score(["no quotes at all"], image)
    with pytest.raises(RewardInputError, match="empty"):
        preset_reward.score(['an empty "" target'], image)


@pytest.mark.parity
def test_network_sees_rgb_resized_as_291(preset_reward, monkeypatch):
    """The detector's input is NormalizeImage(DetResizeForTest(img)) on the RGB array as given (flow_grpo)."""
    import cv2

    engine = preset_reward.engine
    seen = []

    class Spy:
        def __init__(self, session):
            self.session = session

        def run(self, names, feeds):
            seen.append(next(iter(feeds.values())))
            return self.session.run(names, feeds)

        def get_inputs(self):
            return self.session.get_inputs()

    monkeypatch.setattr(engine, "det", Spy(engine.det))
    rgb = (np.random.default_rng(0).random((70, 1100, 3)) * 255).round().astype(np.uint8)
    engine.detect([rgb])
    rh, rw = _ref_resize_image_type0_max(70, 1100)
    ref = cv2.resize(rgb, (rw, rh)).astype(np.float32)
    ref = ((ref * (1.0 / 255.0) - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225]))
    ref = ref.transpose(2, 0, 1)[None].astype(np.float32)
    assert seen[0].shape == ref.shape
    record_parity("ocr (flow_grpo preset): detector input", original=FLOW_GRPO_OCR, how="transcribed",
                  actual=seen[0], expected=ref, cases=("RGB", "odd size"), not_checked=NOT_CHECKED_OCR)
    np.testing.assert_allclose(seen[0], ref, rtol=1e-5, atol=1e-5 * float(np.abs(ref).max()))


def test_missing_weights_name_the_files_and_how_to_make_them(tmp_path):
    with pytest.raises(CheckpointError) as info:
        mmreward.load("ocr", preset="flow_grpo")
    text = str(info.value)
    for needed in ("en_PP-OCRv3_det.onnx", "en_PP-OCRv4_rec.onnx", "en_dict.txt", "paddle2onnx",
                   PADDLE_291_EN_URLS[0], PADDLE_291_EN_URLS[1], "paddleocr==2.9.1", "checkpoint="):
        assert needed in text, needed
    # a folder with only some of the files: the missing one is named, with the same instructions
    from mmreward.ocr.random_models import write_random_ppocr

    folder = write_random_ppocr(tmp_path / "partial", layout="ppocrv4_en")
    (folder / "en_PP-OCRv4_rec.onnx").unlink()
    with pytest.raises(CheckpointError, match=r"(?s)en_PP-OCRv4_rec\.onnx.*paddle2onnx"):
        mmreward.load("ocr", preset="flow_grpo", checkpoint=str(folder))
    # a complete folder loads, and explicit options override the preset
    write_random_ppocr(tmp_path / "full", layout="ppocrv4_en")
    reward = mmreward.load("ocr", preset="flow_grpo", checkpoint=str(tmp_path / "full"), min_confidence=0.0)
    assert reward.engine.min_confidence == 0.0 and reward.engine.limit_type == "max"


def test_flow_grpo_ocr_recipe_uses_the_preset():
    from diffusion_rl.config import load_config

    cfg = load_config(ROOT / "configs" / "flow_grpo_sd35_ocr.yaml")
    assert cfg.reward.rewards == {"ocr": 1.0}
    assert cfg.reward.options["ocr"]["preset"] == "flow_grpo"
