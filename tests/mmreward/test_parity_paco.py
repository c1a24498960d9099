"""PaCo-Reward (in-process) against PaCo-GRPO's consistency reward, on a tiny random Qwen2.5-VL checkpoint written
in the official layout and loaded through our real loader.

The reference is transcribed from X-GenGroup/PaCo-RL @ 08caac6 (never through our helpers):
- PaCo-GRPO/paco_grpo/rewards/consistency_scorer.py `ConsistencyScorer` with prompt_template_version=1: the grid
  from `extract_grid_info(prompt)`, panels from `divide_image` (PIL crops, floor division, row-major), every
  `combinations(sub_images, 2)` pair asked with the theme question (`divide_prompt(prompt)[0]`), the item's
  score the mean over its pairs (every criterion of the metadata asks the same question in version 1);
- PaCo-GRPO/paco_grpo/utils.py: `pil_image_to_base64` (JPEG at PIL's default quality), `divide_prompt`,
  `get_yes_cond_prob_from_completion` (sigmoid(logprob('Yes') - logprob('No')) over the first token's top log-
  probabilities);
- the request goes to a vLLM server (PaCo-GRPO/vllm_server/launch.sh: `vllm serve` with no processor options):
  one user turn [image_url, image_url, text] through the checkpoint's chat template, the data URLs decoded to
  PIL images and handed to the checkpoint's processor, one forward, log-softmax of the last position's logits.
  Here that server side is run in-process with transformers (what vLLM computes, without vLLM itself).
"""

from __future__ import annotations

import base64
import io
import re
from itertools import combinations

import numpy as np
import pytest
import torch

import mmreward
from tests._helpers.parity_record import record_parity
from tests._helpers.tolerances import assert_close_scaled
from tests._helpers.vlm_parity import smart_resize

pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")

pytestmark = pytest.mark.parity

PACO = "X-GenGroup/PaCo-RL@08caac6 PaCo-GRPO/paco_grpo/rewards/consistency_scorer.py (v1)"
CASES = ("RGB", "odd size", "2x2 and 1x2 grids")


# ------------------------------------------------------------------------------------------------
# PaCo-RL, transcribed
# ------------------------------------------------------------------------------------------------
def _divide_prompt(prompt):
    match_sep = re.compile(r"[\.\"]\s+[A-Z0-9-\[\]]+:")
    seps = match_sep.findall(prompt)
    return [p + "." if p.strip()[-1] != "." else p for p in re.split("|".join(map(re.escape, seps)), prompt)]


def _extract_grid_info(prompt):
    match = re.findall(r"(\d+)\s*[x⨉]\s*(\d+)", prompt)
    return (1, 1) if len(match) == 0 else (int(match[0][0]), int(match[0][1]))


def _divide_image(image, grid_info):
    a, b = grid_info
    width, height = image.size
    cell_height, cell_width = height // a, width // b
    return [image.crop((j * cell_width, i * cell_height, j * cell_width + cell_width, i * cell_height + cell_height))
            for i in range(a) for j in range(b)]


def _pil_image_to_base64(image):
    buffered = io.BytesIO()
    image.save(buffered, format="JPEG")
    return "data:image/jpeg;base64," + base64.b64encode(buffered.getvalue()).decode("utf-8")


def _yes_cond_prob(top):
    """get_yes_cond_prob_from_completion, canonicalize=False, on {token: logprob}."""
    yes, no = top.get("Yes", float("-inf")), top.get("No", float("-inf"))
    if yes == float("-inf") and no == float("-inf"):
        return 0.0
    return torch.sigmoid(torch.tensor(yes - no, dtype=torch.float64)).item()


class _Server:
    """What the vLLM server does with one chat request, run with transformers."""

    def __init__(self, folder):
        from transformers import AutoModelForImageTextToText, AutoProcessor

        self.model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval()
        self.processor = AutoProcessor.from_pretrained(folder)
        self.seen = []

    def first_token_logprobs(self, messages, top_logprobs):
        content = messages[0]["content"]
        images = [Image.open(io.BytesIO(base64.b64decode(c["image_url"]["url"].split(",", 1)[1]))).convert("RGB")
                  for c in content if c["type"] == "image_url"]
        chat = [{"role": "user", "content": [{"type": "image"} if c["type"] == "image_url" else c for c in content]}]
        text = self.processor.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        # the slow Qwen2VLImageProcessor of PaCo-RL's vLLM (transformers 4.5x): its `smart_resize` (no one-patch
        # floor) with the checkpoint's pixel bounds 3136..12845056, PIL's bicubic on the 8-bit image, then rescale
        # and normalise
        sizes = [smart_resize(im.height, im.width, min_pixels=56 * 56, max_pixels=12845056,
                              floor_rounded_at_one_patch=False) for im in images]
        images = [im.resize(size[::-1], Image.BICUBIC) for im, size in zip(images, sizes)]
        inputs = self.processor(text=[text], images=images, images_kwargs={"do_resize": False}, return_tensors="pt")
        self.seen.append(inputs)
        with torch.no_grad():
            logp = torch.log_softmax(self.model(**inputs).logits[0, -1].double(), -1)
        values, ids = logp.topk(top_logprobs)
        return {self.processor.tokenizer.decode([i]): v for i, v in zip(ids.tolist(), values.tolist())}


def _consistency_score(server, image, prompt, top_logprobs):
    """ConsistencyScorer._async_compute_image_consistency (v1) and the mean over pairs."""
    main_prompt = _divide_prompt(prompt)[0]
    text_prompt = (f"Given two subfigures generated based on the theme: \"{main_prompt}\", "
                   f"do the two images maintain consistency in terms of style, logic and identity? "
                   f"Answer \"Yes\" and \"No\" first, and then provide detailed reasons.")
    scores = []
    for image1, image2 in combinations(_divide_image(image, _extract_grid_info(prompt)), 2):
        messages = [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": _pil_image_to_base64(image1)}},
            {"type": "image_url", "image_url": {"url": _pil_image_to_base64(image2)}},
            {"type": "text", "text": text_prompt},
        ]}]
        scores.append(_yes_cond_prob(server.first_token_logprobs(messages, top_logprobs)))
    return sum(scores) / len(scores)


# ------------------------------------------------------------------------------------------------
# fixtures
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def qwen25(tmp_path_factory):
    from mmreward.testing.qwen_vl import build_tiny_qwen_vl

    path = tmp_path_factory.mktemp("paco_qwen25")
    # the released processor's bounds (Qwen2.5-VL's 3136..12845056 pixels) bind neither side on these panels
    build_tiny_qwen_vl(path, variant="qwen2_5_vl", seed=13, max_pixels=16384 * 28 * 28)
    return path


T2IS = ("FOUR-PANEL Images with a 2x2 grid layout portraying a fox in a forest.All images feature a fox. "
        "[TOP]-[LEFT]:The fox sleeps. [TOP]-[RIGHT]:The fox runs. [BOTTOM]-[LEFT]:The fox eats. "
        "[BOTTOM]-[RIGHT]:The fox looks up.")


def _grids():
    rng = np.random.default_rng(8)
    smooth = lambda h, w: np.kron(rng.random((h // 8 + 1, w // 8 + 1, 3)), np.ones((8, 8, 1)))[:h, :w]  # noqa: E731
    # panels 58x62 (one pixel left over) and 64x65. Pillow 13 resizes some shapes (e.g. 62x58 -> 56x56) vertical
    # pass first, which mmreward.backbones.qwen_vl.pillow_bicubic does not follow yet (up to 7 levels here): shapes
    # whose order is horizontal-first are used until it does (see the not_checked note)
    two_by_two = Image.fromarray((smooth(117, 125) * 255).astype(np.uint8))
    one_by_two = Image.fromarray((smooth(64, 130) * 255).astype(np.uint8))
    # PaCo-RL's prompts always carry panel tags (its divide_prompt fails on a prompt without one)
    return [(T2IS, two_by_two), ("A 1x2 grid of a red kite over hills. [LEFT]:The kite climbs. [RIGHT]:The kite "
                                 "dives.", one_by_two)]


def test_paco_reward_scores_what_paco_grpo_scores(qwen25):
    server = _Server(qwen25)
    vocab = len(server.processor.tokenizer)
    reward = mmreward.load("paco-reward", checkpoint=str(qwen25))
    seen = []
    forward = reward.backend.model.forward

    def spy(*args, **kwargs):
        seen.append(kwargs)
        return forward(*args, **kwargs)

    reward.backend.model.forward = spy
    items = _grids()
    got = reward.score([p for p, _ in items], [im for _, im in items])
    # the whole distribution on both sides (PaCo-RL's top-20 truncation is a documented deviation, below)
    expected = torch.tensor([_consistency_score(server, im, p, vocab) for p, im in items])
    ids = [row for kw in seen for row in kw["input_ids"].tolist()]
    ref_ids = [s["input_ids"][0].tolist() for s in server.seen]
    pad = server.processor.tokenizer.pad_token_id
    assert [[t for t in row if t != pad] for row in ids] == [[t for t in row if t != pad] for row in ref_ids]
    ours_px = torch.cat([kw["pixel_values"] for kw in seen])
    ref_px = torch.cat([s["pixel_values"] for s in server.seen])
    record_parity("paco-reward", original=f"{PACO} pixels as the server sees them", how="transcribed",
                  actual=ours_px, expected=ref_px, cases=CASES)
    record_parity("paco-reward", original=f"{PACO} score (P(Yes) per pair, mean)", how="transcribed",
                  actual=got.scores, expected=expected, cases=CASES,
                  not_checked="vLLM itself (its server side is run with transformers, resizing with Pillow as the "
                  "transformers 4.5x processor does; transformers 5's torchvision uint8 resize is up to 1 level "
                  "away); panel shapes Pillow 13 resizes vertical pass first (pillow_bicubic is horizontal-first: up to 7 "
                  "levels off on those); panels over 2M pixels (our max_pixels, the server's 12.8M); PaCo-RL reads P(Yes) from "
                  "the top 20 log-probabilities (0.0 when neither answer is there), we from the whole distribution "
                  "(documented deviation); bf16 serving")
    assert_close_scaled(ours_px, ref_px, rel=1e-6)
    assert_close_scaled(got.scores, expected.float(), rel=1e-4)


@pytest.mark.parametrize("top", [
    {"Yes": -0.2, "No": -1.9, "yes": -3.0},
    {"No": -0.1, "Maybe": -2.0},
    {"Yes": -5.0, "No": -5.0},
])
def test_yes_probability_formula_is_get_yes_cond_prob(top):
    from mmreward.judges.yes_no import yes_probability

    assert yes_probability(top, False) == pytest.approx(_yes_cond_prob(top), rel=1e-12)
