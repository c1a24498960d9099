"""Every training method on the same ShapesWorld model, reward, prompts and budget (issue 31, item 3).

    python benchmarks/algorithm_comparison.py --output runs/algorithm_comparison \
        --report docs/results/algorithm_comparison.md

Each method trains the tiny ShapesWorld generator (every transformer weight) on the 18 `colors` training prompts
against the hardened ShapesWorld CLIP (`clipscore` with assets/shapesworld/clip-hardened: a learned proxy), and is
evaluated on the 6 held-out colour-shape pairs with the exact checker it never sees (`shapes-eval`, strict
accuracy), which is also the gold reward of the reward-hacking monitor (`guard.mode: warn`, window 3,
tolerance 0.02; diffusion_rl/hacking_guard.py). Every run uses the same rollout geometry (prompts x group size per
iteration, sampling steps, resolution) and the same evaluation noise; what differs is each method's own loss and
knobs, taken from its preset (the papers' defaults) with a shared learning rate for this full fine-tune.

One run per (method, seed) goes on until it has spent both budgets: `--seconds` of training wall-clock (rollout +
update, evaluation excluded; CPU seconds of the single-threaded process, because the CPU is shared with other
jobs and their load would otherwise count against whichever method ran while it was high; the wall-clock seconds
are reported beside them) and `--samples` generated training samples. It is evaluated at the start, every
`--eval-every` iterations, at the iteration where it reaches the sample budget (the equal-sample table) and at the
one where it passes the time budget (the equal-time table). Writes results.json (every evaluation of every run),
curves (held-out strict against samples and against training seconds) and the markdown report.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GENERATOR = ROOT / "assets" / "shapesworld" / "generator"
CLIP = ROOT / "assets" / "shapesworld" / "clip-hardened"
TRAIN_PROMPTS = ["a red circle", "a red square", "a red cross", "a green circle", "a green square", "a green triangle",
                 "a blue circle", "a blue triangle", "a blue cross", "a yellow square", "a yellow triangle",
                 "a yellow cross", "a purple circle", "a purple square", "a purple cross", "a white circle",
                 "a white square", "a white triangle"]
EVAL_PROMPTS = ["a red triangle", "a green cross", "a blue square", "a yellow circle", "a purple triangle",
                "a white cross"]

LR = 1e-4  # configs/shapes_grpo.yaml and shapes_nft.yaml: the full fine-tune's learning rate
LR_BACKPROP = 5e-5  # configs/shapes_draft.yaml: reward backpropagation moves faster per step

# Each method: its preset (the paper's defaults) and what this comparison overrides, with why. Rollout geometry,
# the reward, prompts and evaluation come from `base_config` and are the same for all.
METHODS: dict[str, dict[str, Any]] = {
    # configs/shapes_grpo.yaml's recipe: Flow-SDE on the first half of the steps, 2 of 4 trained per sample
    "grpo": {"preset": "flow_grpo",
             "sample": {"kernel": "flow_sde", "noise_level": 0.7, "sde_window": [0, 4], "guidance_scale": 4.0},
             "train": {"clip_range": 2e-3, "timestep_fraction": 0.5, "timestep_selection": "random", "kl_beta": 0.04,
                       "ema": False},
             "ppo": {"kl_mode": "exact"}},
    # configs/shapes_nft.yaml: CFG-free DPM-Solver++ rollouts, 7 of 8 steps trained, KL 1e-4
    "nft": {"preset": "diffusion_nft", "sample": {"guidance_scale": 1.0},
            "train": {"timestep_fraction": 0.99, "kl_beta": 1e-4, "ema": False}},
    # the reference is the frozen copy (kl_beta only creates it: DPO's loss has no KL term)
    "dpo": {"preset": "diffusion_dpo", "sample": {"guidance_scale": 4.0},
            "train": {"kl_beta": 1e-4}},
    # one pass over the winners (the preset's 10 passes would spend 10x the update time of the others)
    "raft": {"preset": "raft", "sample": {"guidance_scale": 4.0}, "train": {"num_inner_epochs": 1}},
    "awm": {"preset": "awm", "sample": {"guidance_scale": 1.0}},
    "dgpo": {"preset": "dgpo", "sample": {"guidance_scale": 4.0}},
    # KL to the reference at CFG 4 (the evaluation's scale; the preset's 4.5 is SD3.5's)
    "crd": {"preset": "crd", "sample": {"guidance_scale": 1.0},
            "crd": {"kl_cfg": 4.0}},
    # configs/shapes_draft.yaml: DRaFT-1 through CFG 4 on ODE samples
    "draft": {"preset": "draft", "sample": {"kernel": "ode", "noise_level": 0.0, "guidance_scale": 4.0},
              "model": {"gradient_checkpointing": True}, "train": {"learning_rate": LR_BACKPROP}},
    # ReFL's one-step x0 at a late step; loss scale 1 and no margin (ReFL.py's relu(2 - r) * 1e-3 is for
    # ImageReward's scale and a 1e-5 UNet lr): the reward itself, as DRaFT
    "refl": {"preset": "refl", "sample": {"kernel": "ode", "noise_level": 0.0, "guidance_scale": 4.0},
             "refl": {"loss": "identity", "scale": 1.0}, "train": {"learning_rate": LR_BACKPROP}},
}
OPTIONAL_METHODS: dict[str, dict[str, Any]] = {  # added when the algorithm is registered (other helpers' work)
    "grpo_guard": {"preset": "grpo_guard",
                   "sample": {"kernel": "flow_sde", "noise_level": 0.7, "sde_window": [0, 4], "guidance_scale": 4.0},
                   "train": {"ema": False}},
    # PRDP on the flow model: grpo's Flow-SDE rollouts (its preset's DDIM is the paper's UNet sampler); the frozen
    # copy is its reference (kl_beta only creates it: beta = prdp.beta is PRDP's KL weight). beta is in reward units:
    # the paper's 10 is for HPSv2/PickScore (~0.3), CLIPScore here is 100 cos, so 1000 (on 8 iterations of 16
    # samples, beta 10 and 100 fell 2-4 points of CLIPScore below grpo at every iteration, 1000 did not)
    "prdp": {"preset": "prdp",
             "sample": {"kernel": "flow_sde", "noise_level": 0.7, "sde_window": [0, 4], "guidance_scale": 4.0},
             "train": {"kl_beta": 1e-4, "timestep_fraction": 0.5, "timestep_selection": "random"},
             "prdp": {"beta": 1000.0}},
}


def available_methods() -> dict[str, dict[str, Any]]:
    """METHODS plus the optional ones whose preset exists in this checkout."""
    from diffusion_rl.presets import PRESETS

    out = dict(METHODS)
    out.update({k: v for k, v in OPTIONAL_METHODS.items() if v["preset"] in PRESETS})
    return out


def _merge(base: dict, update: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in update.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def base_config(*, prompts_per_iteration: int, group_size: int, num_steps: int, eval_samples: int,
                eval_every: int) -> dict[str, Any]:
    """What every method shares: model, rollout geometry, reward, prompts, evaluation and the hacking monitor."""
    return {
        "model": {"pretrained": str(GENERATOR), "max_sequence_length": 4, "lora": False, "height": None,
                  "width": None},
        "sample": {"num_steps": num_steps, "eval_num_steps": 10, "eval_guidance_scale": 4.0, "ode_solver": "euler",
                   "prompts_per_iteration": prompts_per_iteration, "group_size": group_size, "batch_size": 48,
                   "share_initial_noise": False},
        "reward": {"rewards": {"clipscore": 1.0}, "options": {"clipscore": {"checkpoint": str(CLIP)}},
                   "eval_rewards": ["shapes-eval", "clipscore"]},
        "advantage": {"std_scope": "group", "eps": 1e-4, "clip_max": 5.0},
        "train": {"iterations": 10_000, "learning_rate": LR, "weight_decay": 1e-4, "max_grad_norm": 1.0,
                  "num_minibatches": 1, "micro_batch_size": prompts_per_iteration * group_size,
                  "probe": "off",
                  "kl_reference": "copy"},  # a full fine-tune: the reference (KL, DPO-style losses) is a frozen copy
        "guard": {"mode": "warn", "window": 3, "tolerance": 0.02},
        "prompts": {"train": TRAIN_PROMPTS, "eval": EVAL_PROMPTS, "eval_samples_per_prompt": eval_samples},
        "log": {"gold_rewards": ["shapes-eval"], "eval_every": eval_every, "grid_every": 0, "save_every": 0,
                "progress": False, "eval_at_start": False},
    }


def method_config(name: str, spec: dict[str, Any], base: dict[str, Any], seed: int, output: Path) -> dict[str, Any]:
    """The run config of one method: its preset, the shared base over it, then the method's overrides."""
    cfg = _merge(base, {k: v for k, v in spec.items() if k != "preset"})
    cfg["preset"] = spec["preset"]
    cfg["train"]["seed"] = seed
    cfg["log"]["output_dir"] = str(output / name / f"seed{seed}")
    return cfg


# ------------------------------------------------------------------------------------------------------
# one run
# ------------------------------------------------------------------------------------------------------
def _eval_row(ev: dict[str, float]) -> dict[str, float]:
    keep = ("gold/shapes-eval", "gold/shapes-eval_se", "eval/shapes-eval/strict", "eval/shapes-eval/strict_se",
            "eval/clipscore", "eval/clipscore_se", "diversity", "hacking_alarm", "guard/train_reward")
    return {k: float(ev[k]) for k in keep if k in ev}


def run_one(cfg_dict: dict[str, Any], *, seconds: float, samples: int, eval_every: int,
            start_eval: dict[str, float] | None = None, max_iterations: int = 10_000) -> dict[str, Any]:
    """Train one method until both budgets are spent; returns its evaluations and per-iteration timings."""
    from diffusion_rl.config import from_dict
    from diffusion_rl.trainer import Trainer

    cfg = from_dict(cfg_dict)
    trainer = Trainer(cfg)
    per_it = cfg.sample.prompts_per_iteration * cfg.sample.group_size
    sample_stop = math.ceil(samples / per_it)
    evals: list[dict[str, Any]] = []
    wall_now = [0.0]

    def evaluate(it: int, n: int, secs: float, tags: Sequence[str]) -> dict[str, float]:
        ev = dict(start_eval) if (it == 0 and start_eval is not None) else trainer.evaluate()
        trainer.log({"iteration": it, **ev})  # the monitor reads its trends back from this history
        row = {"iteration": it, "samples": n, "train_seconds": secs, "train_wall_seconds": wall_now[0],
               "tags": list(tags), **_eval_row(ev)}
        evals.append(row)
        return ev

    first = evaluate(0, 0, 0.0, ["start"])
    spent, wall, it, alarm = 0.0, 0.0, 0, False
    iterations: list[dict[str, float]] = []
    time_stop = None
    while it < max_iterations:
        # the budget is this process's CPU time: on a CPU shared with other jobs, wall-clock measures their load
        # too, while one single-threaded process's CPU seconds are what it would take alone
        c0, t0 = time.process_time(), time.perf_counter()
        metrics = trainer.train_iteration(it)
        spent += time.process_time() - c0
        wall += time.perf_counter() - t0
        it += 1
        trainer.iteration = it
        iterations.append({"iteration": it, "seconds": spent, "wall_seconds": wall,
                           "train_reward": float(metrics.get("reward/clipscore", math.nan))})
        tags = []
        if it == sample_stop:
            tags.append("equal_samples")
        if time_stop is None and spent >= seconds:
            time_stop = it
            tags.append("equal_time")
        if tags or it % eval_every == 0:
            wall_now[0] = wall
            ev = evaluate(it, it * per_it, spent, tags)
            alarm = alarm or ev.get("hacking_alarm", 0.0) > 0
        if it >= sample_stop and time_stop is not None:
            break
    return {"evals": evals, "iterations": iterations, "samples_per_iteration": per_it, "start": _eval_row(first),
            "alarm": alarm}


# ------------------------------------------------------------------------------------------------------
# the tables
# ------------------------------------------------------------------------------------------------------
def _at(run: dict[str, Any], tag: str) -> dict[str, Any]:
    return next(e for e in run["evals"] if tag in e["tags"])


def _alarm_until(run: dict[str, Any], tag: str) -> bool:
    stop = _at(run, tag)["iteration"]
    return any(e.get("hacking_alarm", 0.0) > 0 for e in run["evals"] if e["iteration"] <= stop)


def summarise(results: dict[str, dict[str, dict[str, Any]]], tag: str) -> list[dict[str, Any]]:
    """One row per method at the budget `tag` ('equal_time' or 'equal_samples'): means over seeds, the spread
    between seeds, the evaluation's own standard error, and whether the monitor fired by then."""
    rows = []
    for method, seeds in results.items():
        pts = [_at(r, tag) for r in seeds.values()]
        starts = [r["start"] for r in seeds.values()]
        strict = [p["gold/shapes-eval"] for p in pts]
        delta = [p["gold/shapes-eval"] - s["gold/shapes-eval"] for p, s in zip(pts, starts, strict=True)]
        n = len(pts)

        def mean(xs: Sequence[float]) -> float:
            return sum(xs) / len(xs)

        seed_sd = math.sqrt(sum((d - mean(delta)) ** 2 for d in delta) / (n - 1)) if n > 1 else math.nan
        eval_se = math.sqrt(mean([p["gold/shapes-eval_se"] ** 2 for p in pts]) / n)  # SE of the mean over seeds
        rows.append({
            "method": method, "seeds": n, "strict": mean(strict), "delta_strict": mean(delta),
            "seed_sd": seed_sd, "eval_se": eval_se,
            "noise": math.sqrt(eval_se ** 2 + (seed_sd ** 2 / n if n > 1 else 0.0)),
            "clip": mean([p.get("eval/clipscore", math.nan) for p in pts]),
            "diversity": mean([p.get("diversity", math.nan) for p in pts]),
            "iterations": mean([p["iteration"] for p in pts]), "samples": mean([p["samples"] for p in pts]),
            "train_seconds": mean([p["train_seconds"] for p in pts]),
            "train_wall_seconds": mean([p.get("train_wall_seconds", math.nan) for p in pts]),
            "alarm": sum(_alarm_until(r, tag) for r in seeds.values()),
        })
    return sorted(rows, key=lambda r: -r["delta_strict"])


def within_noise(rows: list[dict[str, Any]], z: float = 2.0) -> tuple[list[str], list[str]]:
    """(methods within z combined standard errors of the best's change in strict, the rest)."""
    best = rows[0]
    same, worse = [], []
    for r in rows:
        gap = best["delta_strict"] - r["delta_strict"]
        (same if gap <= z * math.sqrt(best["noise"] ** 2 + r["noise"] ** 2) else worse).append(r["method"])
    return same, worse


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| method | held-out strict | change from start | +/- (noise) | seed spread (sd) | CLIP reward | "
            "diversity | iterations | samples | train CPU s | train wall s | monitor fired |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        lines.append(f"| {r['method']} | {r['strict']:.3f} | {r['delta_strict']:+.3f} | {r['noise']:.3f} | "
                     f"{r['seed_sd']:.3f} | {r['clip']:.4f} | {r['diversity']:.4f} | {r['iterations']:.1f} | "
                     f"{r['samples']:.0f} | {r['train_seconds']:.1f} | {r['train_wall_seconds']:.1f} | "
                     f"{r['alarm']}/{r['seeds']} |")
    return "\n".join(lines)


def plot(results: dict[str, dict[str, dict[str, Any]]], path: Path) -> None:
    """Held-out strict against training samples and against training seconds, one line per (method, seed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    cmap = plt.get_cmap("tab20")
    for m_i, (method, seeds) in enumerate(sorted(results.items())):
        for s_i, run in enumerate(seeds.values()):
            xs_n = [e["samples"] for e in run["evals"]]
            xs_t = [e["train_seconds"] for e in run["evals"]]
            ys = [e["gold/shapes-eval"] for e in run["evals"]]
            kw = {"color": cmap(m_i % 20), "linestyle": "-" if s_i == 0 else "--", "marker": "o", "markersize": 2.5,
                  "label": method if s_i == 0 else None}
            axes[0].plot(xs_n, ys, **kw)
            axes[1].plot(xs_t, ys, **kw)
    axes[0].set_xlabel("training samples generated")
    axes[1].set_xlabel("training CPU seconds (rollout + update, one thread)")
    for ax in axes:
        ax.set_ylabel("held-out strict (shapes-eval)")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8, ncol=2)
    fig.suptitle("ShapesWorld: every method, same model / reward / prompts (solid: seed 0, dashed: seed 1)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


PROTOCOL = """\
Every method trains the tiny ShapesWorld generator (all transformer weights) on the 18 `colors` training prompts
against the hardened ShapesWorld CLIP (`clipscore` on assets/shapesworld/clip-hardened, a learned proxy), with the
same rollout geometry per iteration, and is evaluated on the 6 held-out colour-shape pairs with the same fixed
evaluation noise. **Held-out strict** is the exact checker's (`shapes-eval`) strict accuracy, never seen by the
optimiser; it is also the gold reward of the reward-hacking monitor (`guard.mode: warn`, window 3,
tolerance 0.02), whose alarm is counted per run. **CLIP reward** is the training reward on the evaluation images.
**Diversity** is the monitor's mean pairwise RMS pixel distance between samples of one prompt. Each method keeps its
preset's own knobs (the papers' defaults) with this full fine-tune's shared learning rate (1e-4; 5e-5 for the
reward-backpropagation methods, as configs/shapes_draft.yaml); the script's METHODS table lists every override.

The time budget is CPU seconds of the single-threaded training process (rollout + update, evaluation excluded):
the machine's 2 cores were shared with other jobs (load average 10-15) while this ran, so wall-clock seconds (also
listed) are inflated several-fold and uneven between runs. The noise column combines the evaluation's standard
error and the spread between the 2 seeds (of the change from the start); with 2 seeds that spread is itself a rough
estimate, and because every evaluation reuses the same noise the paired change is, if anything, less noisy than
this column says."""


def write_report(results: dict[str, dict[str, dict[str, Any]]], settings: dict[str, Any], path: Path,
                 curve: Path | None, notes: str = "") -> str:
    """The markdown results page: both tables, what is within noise, the curves and how it was run."""
    parts = ["# Training methods compared on ShapesWorld", "",
             "Generated by `benchmarks/algorithm_comparison.py` (issue 31 item 3); rerun it to reproduce.", "",
             PROTOCOL, ""]
    if notes:
        parts += [notes.strip(), ""]
    parts += [f"Settings: `{json.dumps(settings)}`", ""]
    for tag, title in (("equal_time", "Equal training time (CPU seconds)"), ("equal_samples", "Equal sample count")):
        rows = summarise(results, tag)
        same, worse = within_noise(rows)
        parts += [f"## {title}", "", table(rows), "",
                  f"Within noise of the best ({rows[0]['method']}, 2 combined standard errors of the change in "
                  f"strict): {', '.join(same)}. Outside: {', '.join(worse) if worse else 'none'}.", ""]
    if curve is not None:
        parts += ["## Curves", "", f"![held-out strict curves]({curve.name})", ""]
    text = "\n".join(parts)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return text


# ------------------------------------------------------------------------------------------------------
# the CLI
# ------------------------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None, log: Callable[[str], None] = print) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--methods", nargs="*", default=None, help="subset of methods (default: every available one)")
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1])
    ap.add_argument("--seconds", type=float, default=30.0,
                    help="training time budget per run: CPU seconds of rollout + update (run with OMP_NUM_THREADS=1)")
    ap.add_argument("--samples", type=int, default=96, help="training sample budget per run")
    ap.add_argument("--prompts-per-iteration", type=int, default=3)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--num-steps", type=int, default=8)
    ap.add_argument("--eval-samples", type=int, default=16, help="evaluation samples per held-out prompt")
    ap.add_argument("--eval-every", type=int, default=4)
    ap.add_argument("--output", type=Path, default=Path("runs/algorithm_comparison"))
    ap.add_argument("--report", type=Path, default=None, help="write the markdown page here (and its curve beside it)")
    ap.add_argument("--notes", type=Path, default=None, help="markdown inserted after the protocol (the reading)")
    ap.add_argument("--merge", type=Path, nargs="*", default=None,
                    help="train nothing: merge the results.json of these output folders (e.g. one per seed, run in "
                         "parallel) into --output and write the report")
    args = ap.parse_args(argv)
    methods = available_methods()
    names = args.methods or list(methods)
    unknown = [m for m in names if m not in methods]
    if unknown:
        print(f"error: unknown method(s) {unknown}; available: {sorted(methods)}", file=sys.stderr)
        return 2
    base = base_config(prompts_per_iteration=args.prompts_per_iteration, group_size=args.group_size,
                       num_steps=args.num_steps, eval_samples=args.eval_samples, eval_every=args.eval_every)
    results_path = args.output / "results.json"
    results: dict[str, dict[str, Any]] = json.loads(results_path.read_text()) if results_path.exists() else {}
    for folder in args.merge or []:
        for method, runs in json.loads((folder / "results.json").read_text()).items():
            results.setdefault(method, {}).update(runs)
    if args.merge:
        args.output.mkdir(parents=True, exist_ok=True)
        results_path.write_text(json.dumps(results, indent=1))
    start_evals: dict[int, dict[str, float]] = {}
    t_all = time.perf_counter()
    for seed in [] if args.merge else args.seeds:
        for name in names:
            if str(seed) in results.get(name, {}):
                continue  # finished in an earlier invocation (the run resumes method by method)
            cfg = method_config(name, methods[name], base, seed, args.output)
            t0 = time.perf_counter()
            run = run_one(cfg, seconds=args.seconds, samples=args.samples, eval_every=args.eval_every,
                          start_eval=start_evals.get(seed))
            if seed not in start_evals:  # the start is the same base model and evaluation noise for every method
                start_evals[seed] = _start_metrics(args.output / name / f"seed{seed}")
            run["wall_seconds"] = time.perf_counter() - t0
            results.setdefault(name, {})[str(seed)] = run
            args.output.mkdir(parents=True, exist_ok=True)
            results_path.write_text(json.dumps(results, indent=1))
            last = run["evals"][-1]
            log(f"{name} seed {seed}: strict {run['start']['gold/shapes-eval']:.3f} -> {last['gold/shapes-eval']:.3f} "
                f"after {last['iteration']} it ({last['train_seconds']:.0f} s training, {run['wall_seconds']:.0f} s "
                f"with evaluation), alarm {run['alarm']}")
    log(f"all runs: {time.perf_counter() - t_all:.0f} s")
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                if k not in ("methods", "merge", "output", "report", "notes")}
    settings["methods"] = names
    done = {m: r for m, r in results.items() if m in names and all(str(s) in r for s in args.seeds)}
    if args.report is not None and done:
        curve = args.report.parent / (args.report.stem + "_curves.png")
        plot(done, curve)
        write_report(done, settings, args.report, curve, args.notes.read_text() if args.notes else "")
        log(f"wrote {args.report} and {curve}")
    return 0


def _start_metrics(run_dir: Path) -> dict[str, float]:
    """The first (iteration 0) evaluation a run logged in metrics.jsonl, to reuse for the other methods."""
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("iteration") == 0:
            return {k: v for k, v in row.items() if k not in ("iteration", "run_id")}
    raise RuntimeError(f"no start evaluation in {run_dir}/metrics.jsonl")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
