"""The Reward contract: validation, micro-batching, grad policy, NaN policing, Bradley-Terry compare."""

from __future__ import annotations

import pytest
import torch

import mmreward
from mmreward.errors import RewardInputError, RewardValueError
from mmreward.models.mock import COLOURS
from mmreward.types import Reward, RewardOutput, normalize_prompts


class MeanBrightness(Reward):
    name = "brightness"
    requires_prompt = False

    def __init__(self, lower_is_better=False, nan_at=None, **kw):
        super().__init__(**kw)
        self.calls = []
        self.nan_at = nan_at
        if lower_is_better:
            self.higher_is_better = False

    def _score(self, prompts, media):
        self.calls.append(len(prompts))
        s = media.flatten(1).mean(1)
        if self.nan_at is not None:
            s = s.clone()
            s[self.nan_at] = float("nan")
        return RewardOutput(s)


def test_mock_reward_matches_its_formula():
    reward = mmreward.load("mock")
    x = torch.rand(3, 3, 5, 5)
    prompts = ["a red ball", "blue sky", "a yellow star"]
    expected = torch.stack([
        -((x[i] - torch.tensor(COLOURS[c]).view(3, 1, 1)) ** 2).mean() for i, c in enumerate(["red", "blue", "yellow"])
    ])
    torch.testing.assert_close(reward.score(prompts, x).scores, expected)
    video = torch.rand(2, 4, 3, 5, 5)
    torch.testing.assert_close(
        reward.score(prompts[:2], video).scores,
        torch.stack([-((video[i] - torch.tensor(COLOURS[c]).view(3, 1, 1)) ** 2).mean() for i, c in enumerate(["red", "blue"])]),
    )


def test_micro_batching_gives_the_same_scores():
    x = torch.rand(7, 3, 4, 4)
    big = MeanBrightness(micro_batch_size=32)
    small = MeanBrightness(micro_batch_size=3)
    torch.testing.assert_close(small.score(None, x).scores, big.score(None, x).scores)
    assert small.calls == [3, 3, 1] and big.calls == [7]


def test_prompt_validation_messages():
    assert normalize_prompts("p", 3) == ["p", "p", "p"]
    with pytest.raises(RewardInputError, match="got 2 prompts for 3 media"):
        normalize_prompts(["a", "b"], 3)
    with pytest.raises(RewardInputError, match="index 1"):
        normalize_prompts(["a", 3], 2)
    with pytest.raises(RewardInputError, match="needs a prompt"):
        normalize_prompts(None, 2)
    with pytest.raises(RewardInputError, match="micro_batch_size"):
        MeanBrightness(micro_batch_size=0)


def test_compare_is_bradley_terry_and_respects_direction():
    a, b = torch.full((1, 3, 2, 2), 0.8), torch.full((1, 3, 2, 2), 0.3)
    up = MeanBrightness()
    up.compare_temperature = 0.25
    p = up.compare(None, a, b).prob_a
    torch.testing.assert_close(p, torch.sigmoid(torch.tensor([(0.8 - 0.3) / 0.25])))
    down = MeanBrightness(lower_is_better=True)
    torch.testing.assert_close(down.compare(None, a, b).prob_a, torch.sigmoid(torch.tensor([-(0.8 - 0.3)])))


def test_nan_scores_are_a_typed_error():
    with pytest.raises(RewardValueError, match=r"indices \[1\]"):
        MeanBrightness(nan_at=1).score(None, torch.rand(3, 3, 2, 2))


def test_grad_policy():
    x = torch.rand(2, 3, 4, 4, requires_grad=True)
    with pytest.raises(RewardInputError, match="not differentiable"):
        MeanBrightness().score(None, x)
    out = mmreward.load("mock").score("red", x)
    assert out.scores.requires_grad
    # scores computed without grad are ordinary tensors: usable as advantages in a later backward pass
    adv = mmreward.load("mock").score("red", torch.rand(2, 3, 4, 4)).scores
    logp = torch.zeros(2, requires_grad=True)
    (adv * logp).sum().backward()
    torch.testing.assert_close(logp.grad, adv)


def test_dtype_option_casts_the_model_and_returns_float32():
    reward = mmreward.load("mock", dtype="bf16")
    out = reward.score("red", torch.rand(2, 3, 4, 4))
    assert out.scores.dtype == torch.float32


# ----------------------------------------------------------------------------------------------
# prompts and devices are checked by the base class, so every family gets the checks
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("prompts", ["\ud800", ["ok", "bad \udfff end"], ["\udc80"]])
def test_lone_surrogate_prompts_are_input_errors(prompts):
    reward = mmreward.load("mock")
    n = 1 if isinstance(prompts, str) else len(prompts)
    with pytest.raises(RewardInputError, match="surrogate"):
        normalize_prompts(prompts, n)
    with pytest.raises(RewardInputError, match="surrogate"):
        reward.score(prompts, torch.rand(n, 3, 4, 4))
    with pytest.raises(RewardInputError, match="surrogate"):
        reward.compare(prompts, torch.rand(n, 3, 4, 4), torch.rand(n, 3, 4, 4))
    # the check is about encodability, not about non-ASCII text
    assert reward.score(["red 🍎 rouge", "日本語 blue"], torch.rand(2, 3, 4, 4)).scores.shape == (2,)


_NO_SUCH_CUDA = f"cuda:{torch.cuda.device_count() + 7}"


@pytest.mark.parametrize("device,fragment", [
    ("banana", "not a device"), ("cuda:-1", "not a device"), ("", "not a device"), (3.5, "not a device"),
    (_NO_SUCH_CUDA, "cuda"),
])
def test_bad_devices_are_typed_errors_at_load_and_score_time(device, fragment):
    from mmreward import media
    from mmreward.errors import DeviceError
    from mmreward.types import check_device

    with pytest.raises(DeviceError, match=fragment):
        check_device(device)
    with pytest.raises(DeviceError, match=fragment):
        mmreward.load("mock", device=device)
    with pytest.raises(DeviceError, match=fragment):
        mmreward.load("mock").to(device)
    with pytest.raises(DeviceError, match=fragment):
        media.to_batch(torch.rand(1, 3, 2, 2), device=device)


def test_good_devices_resolve():
    from mmreward.types import check_device

    assert check_device("cpu") == torch.device("cpu")
    assert check_device(torch.device("cpu")) == torch.device("cpu")
    assert check_device(None).type == ("cuda" if torch.cuda.is_available() else "cpu")
    reward = MeanBrightness()
    reward.register_buffer("w", torch.zeros(2))
    assert reward.to(torch.float64).w.dtype == torch.float64  # dtype-only .to() still works
    assert reward.to(device="cpu", dtype=torch.float16).w.dtype == torch.float16
    assert reward.to(torch.zeros(1, dtype=torch.float32)).w.dtype == torch.float32


@pytest.mark.parametrize("value", ["x", 2.5, True, None])
def test_micro_batch_size_must_be_a_positive_int(value):
    with pytest.raises(RewardInputError, match="micro_batch_size"):
        MeanBrightness(micro_batch_size=value)


def test_conformance_suite_checks_prompts_sizes_and_devices():
    """A family that bypasses the base-class checks is caught by the suite every registered reward runs."""
    from mmreward.testing.conformance import check_conformance

    class Unchecked(MeanBrightness):
        def score(self, prompts, media, *, value_range=None):
            if isinstance(prompts, list) and any("\ud800" <= ch <= "\udfff" for p in prompts for ch in p):
                return RewardOutput(torch.zeros(len(prompts)))  # the old behaviour: surrogates scored silently
            return super().score(prompts, media, value_range=value_range)

    check_conformance(MeanBrightness())
    with pytest.raises(AssertionError, match="RewardInputError"):
        check_conformance(Unchecked())
