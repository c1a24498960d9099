"""Held-out grids show many prompts with captions; reward curves keep diagnostics apart (issue 28 items 2, 3)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from diffusion_rl.reporting import (
    REWARD_DIAGNOSTICS,
    curve_figure,
    grid_selection,
    is_reward_metric,
    save_captioned_grid,
)


def test_grid_takes_samples_across_prompts_not_the_first_prompt_only():
    items = [(p, i) for p in range(24) for i in range(64)]  # prompt-major, as evaluate() orders them
    rows = grid_selection(items, 16)
    prompts = [items[r[0]][0] for r in rows]
    assert len(rows) == 4 and all(len(r) == 4 for r in rows)
    assert prompts == [0, 8, 15, 23]  # spread over the whole list
    assert all(items[k][0] == items[r[0]][0] for r in rows for k in r)  # a row is one prompt
    # few prompts, few samples: everything fits
    small = [(p, i) for p in range(2) for i in range(2)]
    assert grid_selection(small, 16) == [[0, 1], [2, 3]]
    # a process's strided share (multi-process evaluation) still groups by prompt
    strided = items[1::2]
    assert all(strided[k][0] == strided[r[0]][0] for r in grid_selection(strided, 16) for k in r)


def test_captioned_grid_puts_each_prompt_beside_its_samples(tmp_path):
    imgs = torch.zeros(6, 3, 8, 8)
    imgs[:3, 0] = 1.0  # prompt 0's samples red, prompt 1's blue
    imgs[3:, 2] = 1.0
    path = save_captioned_grid(imgs, [[0, 1, 2], [3, 4, 5]], ["a red one | r: 1.00", "a blue one | r: 0.00"],
                               tmp_path / "g.png")
    arr = np.asarray(Image.open(path).convert("RGB")).astype(int)
    height = arr.shape[0] // 2
    right = arr[:, -8:]  # last tile column
    assert (right[2:height - 2, :, 0] > 200).all() and (right[height + 2:-2, :, 2] > 200).all()
    left = arr[:, :20]
    assert (left < 128).any()  # caption text drawn on the left
    assert not (tmp_path / "g.gif").exists()


def test_video_grid_writes_a_captioned_gif(tmp_path):
    clips = torch.zeros(2, 3, 3, 8, 8)
    for t in range(3):
        clips[:, t, 1] = t / 2  # green brightens frame by frame
    save_captioned_grid(clips, [[0], [1]], ["a", "b"], tmp_path / "v.png")
    gif = Image.open(tmp_path / "v.gif")
    assert gif.n_frames == 3
    greens = []
    for t in range(3):
        gif.seek(t)
        greens.append(np.asarray(gif.convert("RGB"))[2, -4, 1])
    assert greens[0] < greens[1] < greens[2]
    strip = np.asarray(Image.open(tmp_path / "v.png").convert("RGB"))
    assert strip.shape[1] > 3 * 8  # the PNG holds the frames side by side


def test_reward_curve_keeps_diagnostics_apart_and_integer_iterations():
    pytest.importorskip("matplotlib")
    history = [{"iteration": i, "reward/mock": 0.1 * i, "reward/combined": 0.1 * i, "reward/mock_std": 0.01,
                "reward/zero_std_groups": 0.5, "reward/within_group_fraction": 0.25} for i in range(1, 4)]
    assert [k for k in history[0] if is_reward_metric(k)] == ["reward/mock", "reward/combined"]
    assert set(REWARD_DIAGNOSTICS) <= set(history[0])
    fig = curve_figure(history)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles[0] == "training reward" and titles[-1].startswith("group diagnostics")
    train_labels = [line.get_label() for line in fig.axes[0].lines]
    assert train_labels == ["combined = mock"]  # identical series: one line that names both
    diag_labels = sorted(line.get_label() for line in fig.axes[-1].lines)
    assert diag_labels == ["within_group_fraction", "zero_std_groups"]
    fig.canvas.draw()
    ticks = [t for t in fig.axes[0].get_xticks() if 1 <= t <= 3]
    assert ticks and all(float(t).is_integer() for t in ticks)


def test_eval_panel_merges_identical_series_and_puts_counts_on_their_own_axis():
    pytest.importorskip("matplotlib")
    history = [{"iteration": i, "eval/r": 0.5 + 0.1 * i, "eval/r/soft": 0.5 + 0.1 * i, "eval/r/strict": 0.2 * i,
                "eval/r/objects_found": 1.2 + 0.01 * i} for i in (0, 1)]
    fig = curve_figure(history)
    eval_ax = next(ax for ax in fig.axes if ax.get_title().startswith("held-out"))
    labels = sorted(c.get_label() for c in eval_ax.containers)
    assert labels == ["r = r/soft", "r/strict"]  # the identical pair is one line naming both
    twins = [ax for ax in fig.axes if ax is not eval_ax and ax.get_ylabel().startswith("counts")]
    assert len(twins) == 1 and [c.get_label() for c in twins[0].containers] == ["r/objects_found"]
