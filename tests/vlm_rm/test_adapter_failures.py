"""Trainer adapters (trl, verl, EasyR1) on bad input (issue 28 item 22).

A sample whose image is corrupt or truncated, or whose score is NaN, gets the adapter's documented
failure value (trl: None = "not applicable"; verl/EasyR1: 0.0, a finite float), the reason is logged
and counted, and the rest of the batch is scored. Usage errors are typed: mismatched lengths, a
template naming an unknown field, a missing EasyR1 response, a non-finite scale.
"""

from __future__ import annotations

import io
import logging
import math

import numpy as np
import pytest
import torch
from PIL import Image

import mmreward
from mmreward.errors import ConfigError, RewardInputError
from vlm_rm.adapters import easyr1, media_ref, trl_reward_function, verl
from vlm_rm.adapters import scoring as adapter_scoring

GREEN_ON_RED = -2 / 3  # the mock reward: -mean((pixel - named colour)^2); "green" on a red image


def _png_bytes(noise: bool = False) -> bytes:
    if noise:  # incompressible, so that cutting the file loses pixel data, not just the end marker
        pixels = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
        image = Image.fromarray(pixels)
    else:
        image = Image.new("RGB", (16, 16), (255, 0, 0))
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture
def red_png(tmp_path):
    path = tmp_path / "red.png"
    path.write_bytes(_png_bytes())
    return str(path)


@pytest.fixture
def broken_png(tmp_path):
    path = tmp_path / "broken.png"
    path.write_bytes(b"\x89PNG\r\n\x1a\n not really")
    return str(path)


def _counts() -> dict[str, int]:
    return dict(adapter_scoring.failure_counts)


def _delta(before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in adapter_scoring.failure_counts.items() if v != before.get(k, 0)}


def test_trl_bad_and_truncated_bytes_fail_only_their_sample(caplog):
    noisy = _png_bytes(noise=True)
    truncated = noisy[: len(noisy) // 2]  # a valid header, half the pixel data
    good = _png_bytes()
    fn = trl_reward_function(mmreward.load("mock"))
    before = _counts()
    with caplog.at_level(logging.WARNING, logger="vlm_rm.adapters.scoring"):
        out = fn(["p"] * 3, ["green", "green", "green"],
                 image=[{"bytes": b"junk", "path": None}, {"bytes": truncated, "path": None}, {"bytes": good, "path": None}])
    assert out[0] is None and out[1] is None  # trl: None = this function does not apply to the sample
    assert out[2] == pytest.approx(GREEN_ON_RED, rel=1e-6)
    assert _delta(before) == {"unreadable media": 2}
    reasons = [r.getMessage() for r in caplog.records if "failure value" in r.getMessage()]
    assert len(reasons) == 2 and "truncated" in reasons[1]


def test_trl_failure_value_option_and_nan_scores(red_png, monkeypatch):
    reward = mmreward.load("mock")
    fn = trl_reward_function(reward, failure_value=-1.0, scale=2.0)
    original = reward.score

    def nan_for_blue(prompts, media, **kw):  # a reward that returns NaN for one item
        out = original(prompts, media, **kw)
        out.scores = torch.where(torch.tensor(["blue" in p for p in prompts]), torch.nan, out.scores)
        return out

    monkeypatch.setattr(reward, "score", nan_for_blue)
    before = _counts()
    out = fn(["p", "p"], ["blue", "green"], image=[red_png, red_png])
    assert out[0] == -1.0 and out[1] == pytest.approx(2 * GREEN_ON_RED, rel=1e-6)
    assert _delta(before) == {"non-finite score": 1}
    # NaN is what trl makes of None itself, so it is a valid trl failure value too
    assert math.isnan(trl_reward_function(reward, failure_value=float("nan"))(["p"], ["blue"], image=[red_png])[0])


def test_trl_usage_errors_are_typed(red_png):
    reward = mmreward.load("mock")
    with pytest.raises(ConfigError, match=r"names \['foo'\]"):
        trl_reward_function(reward, template="{foo} {completion}")
    with pytest.raises(ConfigError, match="not a format string"):
        trl_reward_function(reward, template="{completion")
    for bad in (float("nan"), float("inf"), "x"):
        with pytest.raises(ConfigError, match="scale must be"):
            trl_reward_function(reward, scale=bad)
    with pytest.raises(ConfigError, match="shift must be finite"):
        trl_reward_function(reward, shift=float("nan"))
    with pytest.raises(ConfigError, match="failure_value"):
        trl_reward_function(reward, failure_value="zero")
    fn = trl_reward_function(reward)
    with pytest.raises(RewardInputError, match="1 prompts for 2 completions"):
        fn(["p"], ["red", "green"], image=[red_png, red_png])
    with pytest.raises(RewardInputError, match=r"column 'image' must hold one image per completion \(2\), got 1"):
        fn(["p", "p"], ["red", "green"], image=[red_png])
    # a literal brace is still fine
    assert trl_reward_function(reward, template="{{{completion}}}")(["p"], ["red"], image=[red_png]) is not None


def test_verl_failure_value_and_typed_kwargs(red_png, broken_png):
    kwargs = {"reward": "mock", "device": "cpu"}
    before = _counts()
    got = verl.compute_score_batch(["s", "s"], ["green", "green"], ["x", "y"],
                                   [{"mmreward_media": broken_png}, {"mmreward_media": red_png}], **kwargs)
    assert got[0] == 0.0 and got[1] == pytest.approx(GREEN_ON_RED, rel=1e-6)
    assert _delta(before) == {"reward error": 1}
    got = verl.compute_score("s", "green", media_ref(broken_png), None, failure_value=-5.0, **kwargs)
    assert got == -5.0 and isinstance(got, float)
    for key, bad in (("scale", float("nan")), ("shift", float("inf")), ("failure_value", float("nan")),
                     ("failure_value", None)):
        with pytest.raises(ConfigError, match=key):
            verl.compute_score("s", "red", media_ref(red_png), None, **{key: bad}, **kwargs)


def test_easyr1_missing_response_and_bad_media(red_png, broken_png):
    inputs = [{"response": "green", "ground_truth": media_ref(broken_png)},
              {"response": "green", "ground_truth": media_ref(red_png)}]
    out = easyr1.compute_score(inputs, reward="mock", failure_value=-1.0)
    assert out[0] == {"overall": -1.0, "mock": -1.0}
    assert out[1]["overall"] == pytest.approx(GREEN_ON_RED, rel=1e-6)
    with pytest.raises(RewardInputError, match="input 1 has no 'response'"):
        easyr1.compute_score([inputs[1], {"ground_truth": media_ref(red_png)}], reward="mock")
    with pytest.raises(RewardInputError, match="'response' of type int"):
        easyr1.compute_score({"response": 3, "ground_truth": media_ref(red_png)}, reward="mock")
    with pytest.raises(ConfigError, match="scale must be finite"):
        easyr1.compute_score(inputs, reward="mock", scale=float("nan"))
