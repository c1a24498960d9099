"""benchmarks/gradient_agreement.py: its statistics against closed forms, and its gradients on the shipped
video generator (the same noise gives the same gradient; fresh noise does not)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks.gradient_agreement import agreement, batch_gradients

ROOT = Path(__file__).resolve().parents[1]


def test_agreement_matches_closed_forms():
    # rows mu + e_i with e_i orthogonal to each other and to mu, |e_i| = s: every pairwise cosine is
    # |mu|^2 / (|mu|^2 + s^2), and so is the signal fraction (the estimator is exact for this construction)
    n, mu_norm, s = 5, 2.0, 3.0
    basis = torch.eye(n + 1, dtype=torch.float64)
    g = mu_norm * basis[0] + s * basis[1:]
    stats = agreement(g)
    expected = mu_norm**2 / (mu_norm**2 + s**2)
    assert stats["cosine_mean"] == pytest.approx(expected, rel=1e-12)
    assert stats["signal_fraction"] == pytest.approx(expected, rel=1e-12)
    # identical rows: no noise at all
    same = agreement(torch.ones(3, 7))
    assert same["cosine_min"] == pytest.approx(1.0) and same["signal_fraction"] == pytest.approx(1.0)
    # zero-mean noise (antipodal pairs): no signal
    assert agreement(torch.cat([basis[1:3], -basis[1:3]]))["signal_fraction"] == pytest.approx(-1 / 3)
    with pytest.raises(ValueError, match="n >= 2"):
        agreement(torch.ones(1, 4))


@pytest.mark.skipif(not (ROOT / "assets/shapesworld/video-generator/model_index.json").is_file(),
                    reason="the shipped video generator is not built")
def test_batch_gradients_repeat_with_the_same_noise_and_differ_with_fresh_noise(tmp_path):
    small = ["sample.prompts_per_iteration=2", "sample.group_size=4", "sample.batch_size=8", "train.micro_batch_size=8",
             "sample.num_steps=4", "sample.sde_window=[0, 2]", "sample.share_initial_noise=false",
             "sample.kernel=flow_sde", "sample.noise_level=0.7", "reward.options={shapes-video-eval: {mode: soft}}",
             f"log.output_dir={tmp_path}"]  # per-sample noise and the dense reward: no group without spread
    config = str(ROOT / "configs" / "shapes_video_grpo.yaml")
    same = batch_gradients(config, small, 2, same_noise=True)
    assert same.shape[0] == 2 and same[0].norm() > 0
    torch.testing.assert_close(same[0], same[1], rtol=1e-5, atol=1e-9 * float(same[0].abs().max()))
    fresh = agreement(batch_gradients(config, small, 2))
    assert fresh["cosine_mean"] < 0.99
