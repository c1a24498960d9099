"""The shared tolerance helper: float noise on a large scale passes, a real defect does not."""

from __future__ import annotations

import pytest
import torch

from tests._helpers.tolerances import assert_close_scaled


def test_noise_on_a_0_100_score_passes_where_an_absolute_1e5_failed():
    want = torch.tensor([49.2, 12.0, 0.0, 3.1])
    got = want + torch.tensor([1.14e-5, -3e-6, 0.0, 2e-6])  # float32 noise seen on another machine
    with pytest.raises(AssertionError):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert_close_scaled(got, want, rel=1e-5)


def test_near_zero_elements_are_judged_at_the_vector_scale():
    cos = torch.tensor([0.49, 1e-7, -0.2])
    want = 100 * cos
    assert_close_scaled(want + torch.tensor([0.0, 2e-5, 0.0]), want, rel=1e-6)  # 2e-5 is 4e-7 of 49


def test_real_defects_still_fail():
    want = torch.tensor([49.2, 12.0, 30.5])
    for wrong in (want * 1.001, want + torch.tensor([0.0, 0.0, 0.01]), want.clamp(max=40.0)):
        with pytest.raises(AssertionError):
            assert_close_scaled(wrong, want, rel=1e-5)
    with pytest.raises(AssertionError):  # a known scale overrides a sample of small values
        assert_close_scaled(torch.tensor([0.02]), torch.tensor([0.01]), rel=1e-5, scale=100.0)
