"""GRPO on the ShapesWorld VQA world with TRL's own `GRPOTrainer` and mmreward rewards: the recipe that shows a
tiny vision-language policy learning from our rewards on a CPU.

    python -m vlm_rm.trl_shapes_vqa                          # mixed reward: shapes-vqa 1.0 + shapesworld-pref 0.1
    python -m vlm_rm.trl_shapes_vqa --verifiable-weight 0    # the learned reward alone (does it hack?)
    python -m vlm_rm.trl_shapes_vqa --max-steps 2 --eval-questions 40   # a smoke run

What it does:
- the policy is the shipped tiny Qwen2-VL `assets/shapesworld/vqa-policy` (supervised briefly on the world, see
  its card), loaded by trl itself from the folder (`from_pretrained` of the official layout);
- the training set is training-split ShapesWorld questions of `kinds` (default: shape questions; any of count,
  color, shape, position, which) in trl's conversational VLM format (`vqa.to_trl_rows`, bare-word answers);
- the rewards are `vlm_rm.adapters.trl_reward_function`s mixed by trl's `reward_weights` (each normalised within
  its group first, trl's GDPO `multi_objective_aggregation="normalize_then_sum"`): the verifiable
  `shapes-vqa` checker (given the dataset's "answer" column) and a learned reward, the ShapesWorld preference
  CLIP (`shapesworld-pref`) scoring the claim "<question> <answer>" against the (first) image;
- `GoldMonitor` is the hacking monitor's idea applied to trl: every `eval_every` steps it answers a fixed set of
  held-out questions greedily and scores the answers with the gold checker *and* with the learned reward, so a
  learned reward that rises while gold accuracy does not shows up in the curve (metrics.json, curve.png);
- the same questions are also answered with shuffled images (another question's images of the same kind): the
  label-prior control. A gain on both is the policy learning which answers the training questions favour, not
  reading the image; `image_grounded_gain` is the gain on the true images minus the gain on shuffled ones.

The test questions are fresh training-distribution scenes (seed 1; SFT used seed 0, GRPO seed 100); the world's
compositional held-out split (every question involves a colour-shape pair no training question does) is tracked
beside them (`heldout_split_questions`). Accuracy is greedy decoding scored by `shapes-vqa`; its standard error is
the binomial one, and the before/after difference also gets the paired standard error (same questions).
Measured results (three seeds, the control, the hacking run, and what does not learn): docs/results/trl_shapes_vqa.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from mmreward.errors import ConfigError

DEFAULT_POLICY = "mmreward-assets:shapesworld/vqa-policy"


@dataclass
class RecipeConfig:
    policy: str = DEFAULT_POLICY
    out: str = "runs/trl_shapes_vqa"
    max_steps: int = 200
    prompts_per_step: int = 32
    num_generations: int = 8
    learning_rate: float = 1e-3
    temperature: float = 1.0
    max_completion_length: int = 3
    verifiable_weight: float = 1.0
    learned_weight: float = 0.1
    learned_reward: str = "shapesworld-pref"
    train_questions: int = 1600
    eval_questions: int = 600
    heldout_split_questions: int = 300
    # question kinds trained on and evaluated: shape questions, where the shipped policy reads the image partly
    # (0.72 against 0.23 with shuffled images) and GRPO raises it by reading the image better (the shuffled-image
    # control stays flat). The tiny policy does not read counts, positions or which image at all, and GRPO on
    # several kinds at once did not gain in 200 steps (docs/results/trl_shapes_vqa.md)
    kinds: str = "shape"
    train_kinds: str = ""  # kinds of the training questions when they differ from the evaluated `kinds`
    # the world's splits the training questions come from. "train" keeps the compositional held-out split out of
    # training; "train,heldout" trains on both, which takes away the label prior the split leaves in the
    # training questions (no training question answers "What shape is the red object?" with "triangle")
    train_splits: str = "train"
    eval_every: int = 20
    seed: int = 0
    threads: int = 1
    save_policy: bool = True  # write the trained policy to <out>/policy

    def kind_list(self) -> tuple[str, ...]:
        return tuple(k.strip() for k in self.kinds.split(",") if k.strip())

    def train_kind_list(self) -> tuple[str, ...]:
        return tuple(k.strip() for k in self.train_kinds.split(",") if k.strip()) or self.kind_list()

    def train_split_list(self) -> tuple[str, ...]:
        return tuple(k.strip() for k in self.train_splits.split(",") if k.strip())

    def check(self) -> None:
        for key in ("max_steps", "prompts_per_step", "num_generations", "max_completion_length", "train_questions",
                    "eval_questions", "eval_every", "threads"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"trl_shapes_vqa: {key} must be an integer >= 1, got {value!r}")
        if self.num_generations < 2:
            raise ConfigError("trl_shapes_vqa: num_generations must be >= 2 (GRPO compares completions of a prompt)")
        weights = (self.verifiable_weight, self.learned_weight)
        if any(not math.isfinite(w) or w < 0 for w in weights) or not any(weights):
            raise ConfigError(f"trl_shapes_vqa: reward weights must be finite, >= 0 and not both 0, got {weights}")
        from mmreward.synthetic.vqa_policy import POLICY_KINDS

        for key, kinds in (("kinds", self.kind_list()), ("train_kinds", self.train_kind_list())):
            if not kinds or any(k not in POLICY_KINDS for k in kinds):
                raise ConfigError(f"trl_shapes_vqa: {key} must be a comma-separated subset of {POLICY_KINDS}, "
                                  f"got {getattr(self, key)!r}")
        splits = self.train_split_list()
        if not splits or any(k not in ("train", "heldout") for k in splits) or len(set(splits)) != len(splits):
            raise ConfigError(f"trl_shapes_vqa: train_splits must be 'train', 'heldout' or 'train,heldout', "
                              f"got {self.train_splits!r}")
        if not (self.learning_rate > 0 and self.temperature > 0):
            raise ConfigError("trl_shapes_vqa: learning_rate and temperature must be > 0")


# ----------------------------------------------------------------------------------------------
# rewards
# ----------------------------------------------------------------------------------------------
CLAIM_TEMPLATE = "{prompt} {completion}"  # what the learned reward reads: the question and the answer


def reward_functions(cfg: RecipeConfig) -> tuple[list[Any], list[float]]:
    """trl reward functions (ours, via `trl_reward_function`) and their weights; a weight of 0 drops one."""
    from vlm_rm.adapters.trl import trl_reward_function

    funcs, weights = [], []
    if cfg.verifiable_weight > 0:
        funcs.append(trl_reward_function("shapes-vqa", name="shapes_vqa"))
        weights.append(cfg.verifiable_weight)
    if cfg.learned_weight > 0:
        funcs.append(learned_reward_function(cfg.learned_reward))
        weights.append(cfg.learned_weight)
    return funcs, weights


def learned_reward_function(name: str = "shapesworld-pref"):
    from vlm_rm.adapters.trl import trl_reward_function

    return trl_reward_function(name, text="prompt+completion", template=CLAIM_TEMPLATE,
                               name=name.replace("-", "_"), device="cpu")


def score_with(reward_fn, items, images, answers) -> list[float]:
    """Call a trl reward function as GRPOTrainer does (prompt messages, completion messages, dataset columns)."""
    from mmreward.synthetic.vqa_policy import chat_prompt

    return reward_fn(prompts=[chat_prompt(it) for it in items],
                     completions=[[{"role": "assistant", "content": a}] for a in answers],
                     images=[list(p) for p in images], answer=[it.answer for it in items],
                     kind=[it.kind for it in items], question=[it.question for it in items])


# ----------------------------------------------------------------------------------------------
# the gold monitor
# ----------------------------------------------------------------------------------------------
def _trainer_callback_base():
    from transformers import TrainerCallback

    return TrainerCallback


class GoldMonitor(_trainer_callback_base()):
    """Gold accuracy (greedy answers, `shapes-vqa`) on fixed evaluation questions beside the learned reward of the
    same answers; `split_items` (the world's compositional held-out split) is tracked too, gold only."""

    def __init__(self, items, learned_fn=None, every: int = 20, split_items=(), image_size: int | None = None):
        from mmreward.synthetic.vqa_policy import render_items, shuffled_within_kind

        self.items, self.learned_fn, self.every = items, learned_fn, every
        self.images, self.first = render_items(items, image_size)
        self.split_items = list(split_items)
        self.split_images, self.split_first = (render_items(self.split_items, image_size) if self.split_items
                                               else (None, None))
        self.curve: list[dict[str, Any]] = []
        self.answers: dict[int, list[str]] = {}
        self.correct: dict[int, torch.Tensor] = {}
        self.split_correct: dict[int, torch.Tensor] = {}
        # the control: the same questions with another question's images of the same kind. What the policy gets
        # right there it gets from the question text (the label prior); a gain that reads images shows up
        # only on the true images, a gain in the prior shows up on both
        self.shuffled_images = shuffled_within_kind(items, self.images)
        self.shuffled_correct: dict[int, torch.Tensor] = {}
        self.t0 = time.time()

    def evaluate(self, model, processor, step: int) -> dict[str, Any]:
        from mmreward.synthetic.vqa_policy import accuracy, generate_answers, gold_correct

        was_training = model.training
        model.eval()
        answers = generate_answers(model, processor, self.items, self.images)
        split_answers = (generate_answers(model, processor, self.split_items, self.split_images)
                         if self.split_items else None)
        shuffled_answers = generate_answers(model, processor, self.items, self.shuffled_images)
        if was_training:
            model.train()
        correct = gold_correct(self.items, answers, self.first)
        acc, se = accuracy(correct)
        row: dict[str, Any] = {"step": step, "gold_accuracy": round(acc, 4), "gold_se": round(se, 4)}
        self.shuffled_correct[step] = gold_correct(self.items, shuffled_answers, self.first)
        row["shuffled_images_accuracy"] = round(accuracy(self.shuffled_correct[step])[0], 4)
        if self.learned_fn is not None:
            learned = torch.tensor(score_with(self.learned_fn, self.items, self.images, answers), dtype=torch.float32)
            row["learned_reward"] = round(float(learned.mean()), 4)
        if split_answers is not None:
            self.split_correct[step] = gold_correct(self.split_items, split_answers, self.split_first)
            split_acc, split_se = accuracy(self.split_correct[step])
            row["heldout_split_accuracy"], row["heldout_split_se"] = round(split_acc, 4), round(split_se, 4)
        row["seconds"] = round(time.time() - self.t0, 1)
        self.answers[step], self.correct[step] = answers, correct
        self.curve.append(row)
        print(json.dumps(row), flush=True)
        return row

    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
        if not self.curve:
            self.evaluate(model, processing_class, 0)

    def on_step_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        if state.global_step % self.every == 0 or state.global_step == state.max_steps:
            if not self.curve or self.curve[-1]["step"] != state.global_step:
                self.evaluate(model, processing_class, state.global_step)


# ----------------------------------------------------------------------------------------------
# the run
# ----------------------------------------------------------------------------------------------
def training_rows(cfg: RecipeConfig, image_size: int | None = None):
    from mmreward.synthetic.vqa import make_questions, to_trl_rows
    from mmreward.synthetic.vqa_policy import IMAGE_SIZE, render_items

    size = image_size or IMAGE_SIZE
    splits = cfg.train_split_list()
    share = [cfg.train_questions // len(splits) + (i < cfg.train_questions % len(splits)) for i in range(len(splits))]
    # interleaved, so that every stretch of the shuffled dataset mixes the splits the same way
    parts = [make_questions(n, seed=100 + cfg.seed, split=sp, kinds=cfg.train_kind_list())
             for n, sp in zip(share, splits)]
    items = [it for group in itertools.zip_longest(*parts) for it in group if it is not None]
    return to_trl_rows(items, size=size, answer_format=False, images=render_items(items, size)[0])


def grpo_config(cfg: RecipeConfig):
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(Path(cfg.out) / "trainer"), max_steps=cfg.max_steps,
        per_device_train_batch_size=cfg.prompts_per_step * cfg.num_generations, num_generations=cfg.num_generations,
        max_completion_length=cfg.max_completion_length, temperature=cfg.temperature,
        learning_rate=cfg.learning_rate, lr_scheduler_type="constant", warmup_steps=0, beta=0.0,
        logging_steps=1, report_to=[], use_cpu=True, bf16=False, save_strategy="no", seed=cfg.seed,
        dataloader_num_workers=0, shuffle_dataset=True, disable_tqdm=True,
        gradient_checkpointing=False,  # trl turns it on by default; a 2 MB policy only pays the recompute
        # GDPO: each reward normalised within its group before the weighted sum, so the learned reward's raw
        # scale (logits of about -30..30) does not drown the checker's 0/1
        multi_objective_aggregation="normalize_then_sum",
    )


def build_trainer(cfg: RecipeConfig):
    """(trainer, monitor): trl's GRPOTrainer on the world's training rows with our rewards, and the gold monitor."""
    import datasets
    from transformers import AutoProcessor
    from trl import GRPOTrainer

    from mmreward.synthetic.assets import resolve_asset
    from mmreward.synthetic.vqa_policy import eval_items, policy_image_size

    cfg.check()
    torch.set_num_threads(cfg.threads)
    policy = resolve_asset(cfg.policy)
    size = policy_image_size(AutoProcessor.from_pretrained(policy))  # render at the size the policy was built for
    funcs, weights = reward_functions(cfg)
    learned_fn = learned_reward_function(cfg.learned_reward) if cfg.learned_weight > 0 else None
    kinds = cfg.kind_list()
    split = eval_items(cfg.heldout_split_questions, "heldout", kinds=kinds) if cfg.heldout_split_questions else ()
    monitor = GoldMonitor(eval_items(cfg.eval_questions, "train", kinds=kinds), learned_fn, cfg.eval_every, split,
                          image_size=size)
    data = datasets.Dataset.from_list(training_rows(cfg, size))
    args = grpo_config(cfg)
    args.reward_weights = weights
    trainer = GRPOTrainer(model=policy, args=args, train_dataset=data, reward_funcs=funcs, callbacks=[monitor])
    return trainer, monitor


def gain_statistics(before: torch.Tensor, after: torch.Tensor, shuffled_before: torch.Tensor,
                    shuffled_after: torch.Tensor) -> dict[str, float]:
    """Before/after statistics of 0/1 verdicts on the same n questions (true images, and the shuffled-image control).

    gain: mean(after - before); gain_paired_se: the standard error of that mean difference; gain_unpaired_se: the
    two binomial standard errors in quadrature; gain_in_se: gain / gain_unpaired_se. image_grounded_gain: the mean
    over questions of (after - before) - (shuffled_after - shuffled_before), the gain the true image adds over the
    question's words alone, and image_grounded_gain_se its standard error (paired: same questions)."""
    from mmreward.synthetic.vqa_policy import accuracy

    def mean_se(x: torch.Tensor) -> tuple[float, float]:
        x = x.double()
        return float(x.mean()), (float(x.std(unbiased=True)) / math.sqrt(x.numel()) if x.numel() > 1 else 0.0)

    gain, paired_se = mean_se(after.double() - before.double())
    unpaired_se = math.sqrt(accuracy(before)[1] ** 2 + accuracy(after)[1] ** 2)
    grounded, grounded_se = mean_se(after.double() - before.double() - (shuffled_after.double() - shuffled_before.double()))
    return {"gain": gain, "gain_paired_se": paired_se, "gain_unpaired_se": unpaired_se,
            "gain_in_se": gain / max(unpaired_se, 1e-12), "image_grounded_gain": grounded,
            "image_grounded_gain_se": grounded_se}


def _cpu_seconds() -> float:
    import resource

    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def run(cfg: RecipeConfig) -> dict[str, Any]:
    """Train, monitor, and write metrics.json (+ curve.png) to cfg.out; returns the metrics."""
    from mmreward.synthetic.vqa_policy import accuracy

    cfg.check()  # before the heavy imports and the output folder: a config error costs nothing
    t0, cpu0 = time.time(), _cpu_seconds()
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    trainer, monitor = build_trainer(cfg)
    held = monitor.items
    before_params = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    setup_s = time.time() - t0
    trainer.train()
    wall, cpu = time.time() - t0, _cpu_seconds() - cpu0
    first, last = monitor.curve[0]["step"], monitor.curve[-1]["step"]
    c0, c1 = monitor.correct[first], monitor.correct[last]
    s0, s1 = monitor.shuffled_correct[first], monitor.shuffled_correct[last]
    stats = gain_statistics(c0, c1, s0, s1)
    train_logs = [{k: round(v, 4) if isinstance(v, float) else v for k, v in h.items()
                   if k == "step" or k.startswith("rewards/") or k in ("reward", "loss", "entropy")}
                  for h in trainer.state.log_history if "reward" in h]
    def kind_mean(correct: torch.Tensor, kind: str) -> float:
        return round(float(correct[[i for i, it in enumerate(held) if it.kind == kind]].float().mean()), 3)

    per_kind = {k: {"before": kind_mean(c0, k), "after": kind_mean(c1, k), "shuffled_before": kind_mean(s0, k),
                    "shuffled_after": kind_mean(s1, k)} for k in sorted({it.kind for it in held})}
    def example(i: int) -> dict[str, str]:
        return {"kind": held[i].kind, "question": held[i].question, "truth": held[i].answer,
                "before": monitor.answers[first][i], "after": monitor.answers[last][i]}

    examples = [example(i) for i in range(min(15, len(held)))]
    # the first questions whose answer the run changed: what "before/after" looks like where something happened
    changed = [example(i) for i in range(len(held)) if monitor.answers[first][i] != monitor.answers[last][i]][:15]
    moved = any(not torch.equal(p.detach(), before_params[n]) for n, p in trainer.model.named_parameters())
    metrics = {
        "config": asdict(cfg), "reward_funcs": [getattr(f, "__name__", str(f)) for f in trainer.reward_funcs],
        "reward_weights": trainer.args.reward_weights,
        "before": {"accuracy": monitor.curve[0]["gold_accuracy"], "se": monitor.curve[0]["gold_se"]},
        "after": {"accuracy": monitor.curve[-1]["gold_accuracy"], "se": monitor.curve[-1]["gold_se"]},
        **{k: round(v, 4) for k, v in stats.items()},
        "shuffled_images": {"before": accuracy(s0)[0], "after": accuracy(s1)[0]},
        "per_kind": per_kind, "curve": monitor.curve,
        "train_log": train_logs, "examples": examples, "examples_changed": changed,
        "parameters_changed": moved,
        "steps": trainer.state.global_step, "wall_seconds": round(wall, 1), "setup_seconds": round(setup_s, 1),
        "cpu_seconds": round(cpu, 1), "threads": cfg.threads, "n_eval": len(held),
        "heldout_split": ({"before": accuracy(monitor.split_correct[first])[0],
                           "after": accuracy(monitor.split_correct[last])[0], "n": len(monitor.split_items)}
                          if monitor.split_items else None),
        "load_average_at_end": [round(x, 1) for x in _loadavg()],
    }
    if cfg.save_policy:  # the trained policy, loadable like the shipped one (and by the diagnosis benchmark)
        trainer.model.save_pretrained(str(out / "policy"))
        trainer.processing_class.save_pretrained(str(out / "policy"))
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1))
    plot_curve(metrics, out / "curve.png")
    print(f"test accuracy {metrics['before']['accuracy']:.3f} -> {metrics['after']['accuracy']:.3f} "
          f"(gain {stats['gain']:+.3f}, {stats['gain_in_se']:.1f} SE; image-grounded "
          f"{stats['image_grounded_gain']:+.3f} +- {stats['image_grounded_gain_se']:.3f}) in {wall / 60:.1f} min wall, "
          f"{cpu / 60:.1f} min of CPU", flush=True)
    return metrics


def _loadavg() -> tuple[float, ...]:
    import os

    try:
        return os.getloadavg()
    except OSError:
        return ()


def plot_curve(metrics: dict[str, Any], path: Path) -> None:
    """Gold test accuracy and the learned reward of the same answers, plus the training batches' rewards."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # the curve is also in metrics.json
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    steps = [r["step"] for r in metrics["curve"]]
    ax.errorbar(steps, [r["gold_accuracy"] for r in metrics["curve"]], yerr=[r["gold_se"] for r in metrics["curve"]],
                marker="o", label="test gold accuracy (shapes-vqa, greedy)")
    if any("shuffled_images_accuracy" in r for r in metrics["curve"]):
        ax.plot(steps, [r.get("shuffled_images_accuracy") for r in metrics["curve"]], marker="x", alpha=0.7,
                label="same questions, shuffled images (label-prior control)")
    if any("heldout_split_accuracy" in r for r in metrics["curve"]):
        ax.plot(steps, [r.get("heldout_split_accuracy") for r in metrics["curve"]], marker="^", alpha=0.7,
                label="compositional held-out split (gold)")
    train = [(h["step"], h["rewards/shapes_vqa/mean"]) for h in metrics["train_log"] if "rewards/shapes_vqa/mean" in h]
    if train:
        ax.plot(*zip(*train), alpha=0.4, label="training batches: shapes-vqa (sampled)")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("accuracy")
    if any("learned_reward" in r for r in metrics["curve"]):
        ax2 = ax.twinx()
        ax2.plot(steps, [r.get("learned_reward") for r in metrics["curve"]], color="tab:red", marker="s",
                 label="test: learned reward of the same answers")
        ax2.set_ylabel("learned reward", color="tab:red")
        ax2.legend(loc="lower right", fontsize=7)
    ax.legend(loc="upper left", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def markdown_summary(metrics: dict[str, Any]) -> str:
    """A results-page section of one run: before/after with SE, per kind, the curve and example answers."""
    c, b, a = metrics["config"], metrics["before"], metrics["after"]
    lines = [
        f"Rewards: {', '.join(f'{n} x {w}' for n, w in zip(metrics['reward_funcs'], metrics['reward_weights']))}; "
        f"{metrics['steps']} steps of {c['prompts_per_step']} prompts x {c['num_generations']} generations, "
        f"lr {c['learning_rate']}, max_completion_length {c['max_completion_length']}; {metrics['wall_seconds'] / 60:.1f} "
        f"min wall ({metrics['cpu_seconds'] / 60:.1f} min of CPU, {metrics['threads']} thread(s), load average at the "
        f"end {metrics.get('load_average_at_end')}).",
        "",
        "| | before | after | gain |",
        "|---|---|---|---|",
        f"| test accuracy (n={metrics['n_eval']}) | {b['accuracy']:.3f} ± {b['se']:.3f} | {a['accuracy']:.3f} ± "
        f"{a['se']:.3f} | {metrics['gain']:+.3f} ({metrics['gain_in_se']:+.1f} SE; paired SE "
        f"{metrics['gain_paired_se']:.3f}) |",
    ]
    if metrics.get("shuffled_images"):
        sh = metrics["shuffled_images"]
        lines.append(f"| same questions, shuffled images (control) | {sh['before']:.3f} | {sh['after']:.3f} | "
                     f"{sh['after'] - sh['before']:+.3f} |")
        lines.append(f"| image-grounded gain (true minus shuffled) | | | {metrics['image_grounded_gain']:+.3f} "
                     f"(paired SE {metrics['image_grounded_gain_se']:.3f}) |")
    if metrics.get("heldout_split"):
        h = metrics["heldout_split"]
        lines.append(f"| compositional held-out split (n={h['n']}) | {h['before']:.3f} | {h['after']:.3f} | "
                     f"{h['after'] - h['before']:+.3f} |")
    lines += ["", "| kind | " + " | ".join(metrics["per_kind"]) + " |", "|---|" + "---|" * len(metrics["per_kind"]),
              "| before | " + " | ".join(f"{v['before']:.2f}" for v in metrics["per_kind"].values()) + " |",
              "| after | " + " | ".join(f"{v['after']:.2f}" for v in metrics["per_kind"].values()) + " |"]
    if all("shuffled_before" in v for v in metrics["per_kind"].values()):
        lines += ["| shuffled images, before | " + " | ".join(f"{v['shuffled_before']:.2f}"
                                                           for v in metrics["per_kind"].values()) + " |",
                  "| shuffled images, after | " + " | ".join(f"{v['shuffled_after']:.2f}"
                                                          for v in metrics["per_kind"].values()) + " |"]
    lines += ["", "| step | test gold accuracy | shuffled images | learned reward of the same answers | held-out split |",
              "|---|---|---|---|---|"]
    for r in metrics["curve"]:
        lines.append(f"| {r['step']} | {r['gold_accuracy']:.3f} ± {r['gold_se']:.3f} | "
                     f"{r.get('shuffled_images_accuracy', '-')} | {r.get('learned_reward', '-')} | "
                     f"{r.get('heldout_split_accuracy', '-')} |")
    lines += ["", "| question | truth | before | after |", "|---|---|---|---|"]
    for e in (metrics.get("examples_changed") or metrics["examples"])[:10]:
        lines.append(f"| {e['question']} | {e['truth']} | {e['before'] or '(empty)'} | {e['after'] or '(empty)'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for k, v in asdict(RecipeConfig()).items():
        if isinstance(v, bool):
            parser.add_argument(f"--{k.replace('_', '-')}", action=argparse.BooleanOptionalAction, default=v)
        else:
            parser.add_argument(f"--{k.replace('_', '-')}", type=type(v), default=v)
    args = parser.parse_args(argv)
    try:
        run(RecipeConfig(**vars(args)))
    except ConfigError as exc:
        print(f"trl_shapes_vqa: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
