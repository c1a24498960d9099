"""What a run leaves to look at: metrics.jsonl, experiment trackers, image grids and reward curves (PNG,
matplotlib headless)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import torch


def save_grid(images: torch.Tensor, path: str | Path, ncol: int = 8) -> Path:
    """Save (B, 3, H, W) images in [0, 1] as one PNG grid; (B, T, 3, H, W) clips as one row (a strip of T
    frames) per clip, so motion reads left to right."""
    from PIL import Image

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    imgs = images.detach().float().clamp(0, 1).cpu()
    if imgs.ndim == 5:
        ncol = imgs.shape[1]
        imgs = imgs.flatten(0, 1)
    b, _, h, w = imgs.shape
    ncol = max(1, min(ncol, b))
    nrow = math.ceil(b / ncol)
    grid = torch.ones(3, nrow * (h + 2), ncol * (w + 2))
    for i in range(b):
        r, c = divmod(i, ncol)
        grid[:, r * (h + 2) + 1 : r * (h + 2) + 1 + h, c * (w + 2) + 1 : c * (w + 2) + 1 + w] = imgs[i]
    arr = (grid.permute(1, 2, 0).numpy() * 255).round().astype("uint8")
    Image.fromarray(arr).save(path)
    return path


def grid_selection(items: list[tuple[int, int]], max_images: int) -> list[list[int]]:
    """Rows of indices into `items` ((prompt, sample) pairs): up to sqrt(max_images) samples per row, one row
    per prompt, prompts spread evenly over the list, so a grid shows many prompts (never 16 samples of the
    first prompt, which prompt-major order gave)."""
    by_prompt: dict[int, list[int]] = {}
    for k, (p, _) in enumerate(items):
        by_prompt.setdefault(p, []).append(k)
    prompts = sorted(by_prompt)
    if not prompts or max_images < 1:
        return []
    most = max(len(v) for v in by_prompt.values())
    ncol = max(1, min(most, math.isqrt(max_images)))
    nrow = min(len(prompts), max(1, max_images // ncol))
    picked = [prompts[round(r * (len(prompts) - 1) / max(nrow - 1, 1))] for r in range(nrow)]
    return [by_prompt[p][:ncol] for p in dict.fromkeys(picked)]


def save_captioned_grid(images: torch.Tensor, rows: list[list[int]], captions: list[str], path: str | Path,
                        ) -> Path:
    """One row per caption: `images[rows[r]]` (images (N, 3, H, W), or clips (N, T, 3, H, W) as frame strips)
    after the row's caption (its prompt and scores). Clips are also written as an animated GIF beside the PNG
    (`path` with .gif), one captioned frame per video frame."""
    from PIL import Image, ImageDraw, ImageFont

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    imgs = images.detach().float().clamp(0, 1).cpu()
    video = imgs.ndim == 5
    font = ImageFont.load_default()
    measure = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    text_w = min(420, max(int(measure.textlength(c, font=font)) for c in captions) + 8) if captions else 0
    h, w = imgs.shape[-2:]
    cell_h = max(h + 2, 14)

    def canvas(frame: int | None) -> Image.Image:
        """frame None: every frame of a clip side by side; else that frame of each clip."""
        per_item = imgs.shape[1] if video and frame is None else 1
        ncol = max(len(r) for r in rows) * per_item
        out = Image.new("RGB", (text_w + ncol * (w + 2), len(rows) * cell_h), "white")
        draw = ImageDraw.Draw(out)
        for r, (idx, caption) in enumerate(zip(rows, captions)):
            text = caption
            while text and draw.textlength(text, font=font) > text_w - 8:
                text = text[:-2] + "…"
            draw.text((4, r * cell_h + max(0, (cell_h - 11) // 2)), text, fill="black", font=font)
            for c, k in enumerate(idx):
                tiles = imgs[k] if video and frame is None else (imgs[k, frame][None] if video else imgs[k][None])
                for t, tile in enumerate(tiles):
                    arr = (tile.permute(1, 2, 0).numpy() * 255).round().astype("uint8")
                    out.paste(Image.fromarray(arr), (text_w + (c * per_item + t) * (w + 2) + 1, r * cell_h + 1))
        return out

    canvas(None).save(path)
    if video:
        frames = [canvas(t) for t in range(imgs.shape[1])]
        frames[0].save(path.with_suffix(".gif"), save_all=True, append_images=frames[1:], duration=250, loop=0)
    return path


def trailing_mean(values: list[float], window: int) -> list[float]:
    """Mean of each value and up to window - 1 before it (NaNs skipped; NaN where the window has none)."""
    out = []
    for i in range(len(values)):
        finite = [v for v in values[max(0, i - window + 1): i + 1] if v == v]
        out.append(sum(finite) / len(finite) if finite else float("nan"))
    return out


# metrics logged under reward/ that are not rewards: the GRPO group statistics (fractions of groups or variance)
REWARD_DIAGNOSTICS = ("reward/zero_std_groups", "reward/within_group_fraction")


def is_reward_metric(key: str) -> bool:
    """A training reward's mean (reward/<name>, reward/combined), not its std and not a group diagnostic."""
    return key.startswith("reward/") and not key.endswith("_std") and key not in REWARD_DIAGNOSTICS


def _merge_identical(history: list[dict[str, Any]], keys: list[str]) -> dict[str, tuple[list, list]]:
    """label -> (iterations, values); series with identical points are one line labelled 'a = b' (with a single
    reward of weight 1, reward/combined equals it, and one line would hide the other)."""
    series: dict[str, tuple[list, list]] = {}
    for k in keys:
        pts = [(h["iteration"], h[k]) for h in history if k in h]
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        name = k.split("/", 1)[1]
        same = next((label for label, v in series.items() if v == (xs, ys)), None)
        if same is None:
            series[name] = (xs, ys)
        else:
            series[f"{same} = {name}"] = series.pop(same)
    return series


def plot_curves(history: list[dict[str, Any]], path: str | Path) -> Path | None:
    """Training reward per iteration and held-out evaluation (mean +/- 1 SE) on one figure."""
    from mmreward.errors import DIFFUSION_EXTRA, require

    matplotlib = require("matplotlib", DIFFUSION_EXTRA, "reward curves (plot_curves)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    fig = curve_figure(history)
    if fig is None:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def curve_figure(history: list[dict[str, Any]]) -> Any:
    """The matplotlib figure of `plot_curves` (None when there is nothing to plot)."""
    import matplotlib.pyplot as plt

    train_keys = sorted({k for h in history for k in h if is_reward_metric(k)})
    diag_keys = sorted({k for h in history for k in h if k in REWARD_DIAGNOSTICS})
    eval_keys = sorted({k for h in history for k in h if k.startswith("eval/") and not k.endswith("_se")})
    if not train_keys and not eval_keys:
        return None
    gold_keys = sorted({k for h in history for k in h if k.startswith("gold/") and not k.endswith("_se")})
    panels = 2 + bool(gold_keys) + bool(diag_keys)
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 3.6))
    for label, (xs, ys) in _merge_identical(history, train_keys).items():
        window = max(5, len(ys) // 20)
        if len(ys) >= 4 * window:  # long noisy runs: the raw series faint, its running mean on top
            (line,) = axes[0].plot(xs, ys, alpha=0.25, linewidth=0.8)
            axes[0].plot(xs, trailing_mean(ys, window), color=line.get_color(),
                         label=f"{label} (mean of last {window})")
        else:
            axes[0].plot(xs, ys, label=label)
    axes[0].set_title("training reward")
    if diag_keys:  # fractions in [0, 1], not rewards: their own panel and scale
        ax = axes[-1]
        for label, (xs, ys) in _merge_identical(history, diag_keys).items():
            ax.plot(xs, ys, label=label)
        ax.set_title("group diagnostics (fractions)")
        ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize=8)
    from matplotlib.ticker import MaxNLocator

    for ax in axes:
        ax.set_xlabel("iteration")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # iterations are whole numbers
    # counts (e.g. shapes-eval/objects_found) beside [0, 1] accuracies would squash them: their own right axis
    unit = [k for k in eval_keys if all(-0.05 <= h[k] <= 1.05 for h in history if k in h)]
    other_ax = axes[1].twinx() if len(unit) not in (0, len(eval_keys)) else None
    merged = _merge_identical(history, eval_keys)  # identical series: one line labelled "a = b"
    for i, (label, (xs, ys)) in enumerate(merged.items()):
        k = "eval/" + label.split(" = ")[0]
        ax = axes[1] if other_ax is None or k in unit else other_ax
        ses = [h.get(k + "_se", 0.0) for h in history if k in h]
        ax.errorbar(xs, ys, yerr=ses, marker="o", capsize=3, label=label, color=f"C{i}",
                    linestyle="--" if ax is other_ax else "-")
    if other_ax is not None:
        other_ax.set_ylabel("counts (dashed)")
        other_ax.legend(fontsize=8, loc="lower right")
    axes[1].set_title("held-out evaluation (mean ± SE)")
    axes[1].set_xlabel("iteration")
    if gold_keys:
        _plot_guard(axes[2], history, gold_keys)
    for ax in axes[:2]:  # the monitor's panel has its own two-axis legend
        if ax.lines or ax.containers:
            ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _plot_guard(ax: Any, history: list[dict[str, Any]], gold_keys: list[str]) -> None:
    """The reward-hacking monitor: training reward on the evaluation samples (left axis), gold rewards (right
    axis, their own scale) and a red line at every evaluation where the alarm fired."""
    pts = [(h["iteration"], h["guard/train_reward"]) for h in history if "guard/train_reward" in h]
    if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], color="tab:blue", marker="o", label="training reward")
    ax.set_ylabel("training reward (eval samples)")
    gold_ax = ax.twinx()
    for i, k in enumerate(gold_keys):
        pts = [(h["iteration"], h[k], h.get(k + "_se", 0.0)) for h in history if k in h]
        gold_ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="s", capsize=3,
                         color=f"C{i + 1}", label=k)
    gold_ax.set_ylabel("gold reward")
    alarms = [h["iteration"] for h in history if h.get("hacking_alarm")]
    for j, it in enumerate(alarms):
        ax.axvline(it, color="red", linestyle="--", label="hacking alarm" if j == 0 else None)
    ax.set_title("reward-hacking monitor")
    ax.set_xlabel("iteration")
    lines = ax.get_legend_handles_labels()
    gold_lines = gold_ax.get_legend_handles_labels()
    ax.legend(lines[0] + gold_lines[0], lines[1] + gold_lines[1], fontsize=8)


def append_metrics(out_dir: Path, metrics: dict[str, Any]) -> None:
    """One line of metrics.jsonl (the trackers get the same metrics through `Accelerator.log`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(metrics) + "\n").encode()
    with open(out_dir / "metrics.jsonl", "ab") as f:
        start = f.seek(0, os.SEEK_END)
        try:
            f.write(line)
            f.flush()
        except OSError:  # a full disk: never leave half a line, which would make the whole file unreadable
            f.truncate(start)
            raise


def rewrite_metrics(out_dir: Path, history: list[dict[str, Any]]) -> None:
    """On resume, metrics.jsonl holds exactly the checkpoint's history: lines logged after the checkpoint
    by the interrupted run would otherwise appear twice once those iterations are rerun."""
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / "metrics.jsonl"
    tmp = target.with_name(f".metrics.jsonl.tmp-{os.getpid()}")
    tmp.write_text("".join(json.dumps(m) + "\n" for m in history))
    os.replace(tmp, target)


def log_image(accelerator: Any, tag: str, png: Path, step: int) -> None:
    """Send a saved grid to every tracker that takes images, in the form each expects: TensorBoard a (1, 3, H, W)
    float batch (`add_images`), the others (W&B, Aim, custom trackers) a list of (H, W, 3) uint8 arrays."""
    trackers = [t for t in accelerator.trackers if hasattr(t, "log_images")]
    if not trackers or not accelerator.is_main_process or not Path(png).is_file():
        return
    import numpy as np
    from PIL import Image

    with Image.open(png) as im:
        hwc = np.asarray(im.convert("RGB"))
    for tracker in trackers:
        if tracker.name == "tensorboard":
            tracker.log_images({tag: hwc.transpose(2, 0, 1)[None].astype(np.float32) / 255.0}, step=step)
        else:
            tracker.log_images({tag: [hwc]}, step=step)


def open_trackers(accelerator: Any, cfg: Any, output_dir: str | Path | None = None) -> None:
    """accelerate's trackers (`log_with=...`) for the run, writing under `output_dir` (the run's folder, which
    log.new_run_suffix may have moved from log.output_dir); a no-op on the other processes and without trackers."""
    from diffusion_rl.accelerator import flat_config, tracker_init_kwargs

    if output_dir is not None:  # TensorBoard's folder is the accelerator's logging_dir
        conf = accelerator.project_configuration
        conf.project_dir = conf.logging_dir = str(output_dir)
        os.makedirs(output_dir, exist_ok=True)
    accelerator.init_trackers(cfg.log.project, config=flat_config(cfg),
                              init_kwargs=tracker_init_kwargs(cfg.log, output_dir))


def close_trackers(accelerator: Any) -> None:
    """Flush and close the writers: what `Accelerator.end_training` does for trackers, without its other half
    (destroying the process group, which belongs to whoever launched us and may run more after `fit`)."""
    for tracker in accelerator.trackers:
        tracker.finish()
