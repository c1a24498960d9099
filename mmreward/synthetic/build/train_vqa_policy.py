"""The tiny ShapesWorld VQA policy: a Qwen2-VL built from config, supervised briefly on the VQA world.

    python -m mmreward.synthetic.build.build_assets --only vqa-policy            # assets/shapesworld/vqa-policy
    python -m mmreward.synthetic.build.train_vqa_policy --out /tmp/vqa-policy --steps 20   # a smoke build

What is built (all seeded, deterministic on one machine):
- a Qwen2 byte-level BPE tokenizer trained on the world's questions and answers (so "circle", "yes" or
  "3" is one token) with Qwen's special tokens and Qwen2-VL-Instruct's chat template;
- a Qwen2-VL (`Qwen2VLForConditionalGeneration`) from config: 3 text layers of width 96, a 2-block vision
  tower (initializer_range 0.1, so the pixels matter from the start); images of `image_size` pixels (56, the
  default: 16 patches, 4 visual tokens after the 2x2 merge, one per cell of the scenes' 2x2 grid; 84: 9 tokens);
- a short supervised run (cross-entropy on the answer tokens and <|im_end|>) on training-split questions, stopped
  early on purpose: the policy answers above chance but far from perfectly, so a reinforcement-learning run has
  room to raise it (`vlm_rm.trl_shapes_vqa`). A curriculum: the first 300 steps train on shape questions only,
  then 1,200 steps on all five kinds (count, color, shape, position, which). In the five-kind mix alone the
  language model did not learn to name shapes in 2,000 steps, though the vision tower's tokens encode them
  (docs/results/trl_shapes_vqa.md, "Diagnosis"); `--first-steps 0` builds that earlier policy's recipe.

Everything is written with `save_pretrained`, so `Qwen2VLForConditionalGeneration.from_pretrained` and
`AutoProcessor.from_pretrained` (or trl's GRPOTrainer given the folder) load it. The answers are bare words
(no <answer> tag: the checker reads the whole response), which keeps completions to two tokens.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from mmreward.errors import ConfigError
from mmreward.synthetic.build.threads import torch_threads
from mmreward.synthetic.vqa_policy import (  # noqa: F401 - re-exported: the recipe's public helpers
    IMAGE_SIZE,
    POLICY_KINDS,
    accuracy,
    chat_prompt,
    eval_items,
    flat_images,
    generate_answers,
    gold_correct,
    prompt_texts,
    render_items,
    shuffled_within_kind,
)


@dataclass
class VQAPolicyTrainConfig:
    out: str = "assets/shapesworld/vqa-policy"
    steps: int = 1500  # ~0.6 test accuracy: above chance (~0.32), room left for GRPO
    batch_size: int = 32
    lr: float = 2e-3
    warmup: int = 20
    weight_decay: float = 0.01
    train_questions: int = 20000
    eval_questions: int = 500
    seed: int = 0
    threads: int = 1
    eval_every: int = 250
    snapshots: str = ""  # a folder: the model at every evaluation step (the LR is constant after warmup, so the
    # snapshot at step N equals a run with steps=N: how the shipped step count was chosen)
    vocab_size: int = 480
    hidden: int = 96
    layers: int = 3
    vision_init: float = 0.1  # the vision tower's initializer_range; at 0.02 the policy stayed blind
    # (its loss on shuffled images equalled its loss on the true ones after 125 steps)
    image_size: int = IMAGE_SIZE  # a multiple of 28 (14-pixel patches, 2x2 merge)
    # a curriculum: the first `first_steps` steps train on these kinds only (fresh questions of seed 50 + seed, one
    # pass). In the five-kind mix alone the language model never learned to name shapes (2,000 steps), though the
    # vision tower's tokens encode them; 300 shape-only steps first teach it, and the mix keeps it
    first_kinds: str = "shape"
    first_steps: int = 300
    rope_theta: float = 0.0  # the text model's RoPE base; 0 keeps Qwen2-VL's 1e6, under which this model's
    # 24-wide heads turn M-RoPE's h and w sections by at most 0.01 and 1e-4 rad per grid step (issue 30)


# ----------------------------------------------------------------------------------------------
# the architecture and tokenizer
# ----------------------------------------------------------------------------------------------
def _tokenizer_corpus(seed: int) -> list[str]:
    """Questions and answers of every kind and split, plus the chat template's fixed text."""
    from mmreward.synthetic.prompts import COLORS, SHAPES
    from mmreward.synthetic.vqa import ANSWER_FORMAT, KINDS, make_questions

    # the chat framing repeated, so "user" and "assistant" merge into single tokens (shorter sequences)
    texts = ["<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"] * 50
    texts += ["<|im_end|>\n<|im_start|>assistant\n"] * 50 + [ANSWER_FORMAT,
             " ".join(COLORS), " ".join(SHAPES), "yes no first second 0 1 2 3 4 5"]
    for split in ("train", "heldout"):
        for item in make_questions(600, seed=10_000 + seed, split=split, kinds=KINDS):
            texts += [item.question, item.answer]
    return texts


def build_tokenizer(out_dir: str | Path, vocab_size: int = 480, seed: int = 0):
    """A Qwen2 byte-level BPE tokenizer (Qwen's special tokens and chat template) trained on the world's text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import Qwen2TokenizerFast

    from mmreward.backbones.tiny_qwen_vl import QWEN2_VL_CHAT_TEMPLATE, QWEN_SPECIAL_TOKENS

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    bpe.train_from_iterator(_tokenizer_corpus(seed), trainer=trainer)
    state = json.loads(bpe.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in state["merges"]]
    tok = Qwen2TokenizerFast(vocab=state["vocab"], merges=merges, unk_token=None, bos_token=None,
                             eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.add_special_tokens({"additional_special_tokens": QWEN_SPECIAL_TOKENS[1:]})
    tok.add_special_tokens({"pad_token": "<|endoftext|>"})
    tok.chat_template = QWEN2_VL_CHAT_TEMPLATE
    tok.save_pretrained(str(out_dir))
    return tok


def policy_config(tok, hidden: int = 96, layers: int = 3, vision_init: float = 0.02, rope_theta: float = 0.0):
    """Qwen2VLConfig of the policy: text width `hidden` (4 heads of 24, mrope 4+4+4), a 2-block vision tower.

    `rope_theta` > 0 sets the text RoPE base (0: Qwen2-VL's default, 1e6)."""
    from transformers import Qwen2VLConfig

    ids = tok.convert_tokens_to_ids
    head_dim = hidden // 4
    third = head_dim // 2 // 3
    text = dict(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                rope_scaling={"type": "mrope", "mrope_section": [head_dim // 2 - 2 * third, third, third]},
                tie_word_embeddings=True, pad_token_id=ids("<|endoftext|>"), eos_token_id=ids("<|im_end|>"),
                bos_token_id=ids("<|endoftext|>"), initializer_range=0.02)
    if rope_theta > 0:
        text["rope_scaling"]["rope_theta"] = rope_theta
    vision = dict(depth=2, embed_dim=64, hidden_size=hidden, num_heads=4, mlp_ratio=2, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, in_chans=3, initializer_range=vision_init)
    return Qwen2VLConfig(text_config=text, vision_config=vision, image_token_id=ids("<|image_pad|>"),
                         video_token_id=ids("<|video_pad|>"), vision_start_token_id=ids("<|vision_start|>"),
                         vision_end_token_id=ids("<|vision_end|>"),
                         **{k: v for k, v in text.items() if k in ("vocab_size", "hidden_size", "pad_token_id",
                                                                    "eos_token_id", "tie_word_embeddings")})


def build_processor(out_dir: str | Path, tok, image_size: int = IMAGE_SIZE):
    """Qwen2-VL's processor for square images of `image_size` pixels (no resize: min = max = image_size**2)."""
    from transformers.models.qwen2_vl import Qwen2VLImageProcessor, Qwen2VLProcessor
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    from mmreward.backbones.tiny_qwen_vl import QWEN2_VL_CHAT_TEMPLATE

    size = {"shortest_edge": image_size * image_size, "longest_edge": image_size * image_size}
    kw = dict(size=size, patch_size=14, merge_size=2, temporal_patch_size=2)
    processor = Qwen2VLProcessor(image_processor=Qwen2VLImageProcessor(**kw), tokenizer=tok,
                                 video_processor=Qwen2VLVideoProcessor(**kw), chat_template=QWEN2_VL_CHAT_TEMPLATE)
    processor.save_pretrained(str(out_dir))
    return processor


# ----------------------------------------------------------------------------------------------
# supervised training
# ----------------------------------------------------------------------------------------------
def _sft_batch(processor, items, images) -> dict[str, torch.Tensor]:
    """Right-padded prompt + answer + <|im_end|>; labels only on the answer and <|im_end|>."""
    tok = processor.tokenizer
    tok.padding_side = "right"
    prompts = prompt_texts(processor, items)
    ims = flat_images(items, images)
    full = processor(text=[p + it.answer + "<|im_end|>" for p, it in zip(prompts, items)], images=ims,
                     return_tensors="pt", padding=True)
    lengths = processor(text=prompts, images=ims, return_tensors="pt", padding=True)["attention_mask"].sum(1)
    labels = full["input_ids"].clone()
    pos = torch.arange(labels.shape[1])[None]
    labels[(pos < lengths[:, None]) | (full["attention_mask"] == 0)] = -100
    return {**full, "labels": labels}


def train(cfg: VQAPolicyTrainConfig) -> dict:
    """Build, train and save the policy; returns the measured metrics (also in training.json).

    Runs on cfg.threads threads and restores the caller's torch thread count afterwards."""
    with torch_threads(cfg.threads):
        return _train(cfg)


def _train(cfg: VQAPolicyTrainConfig) -> dict:
    from transformers import Qwen2VLForConditionalGeneration

    from mmreward.synthetic.vqa import make_questions

    t0 = time.time()
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out, cfg.vocab_size, cfg.seed)
    if cfg.image_size % 28:
        raise ConfigError(f"image_size must be a multiple of 28 (14-pixel patches merged 2x2), got {cfg.image_size}")
    processor = build_processor(out, tok, cfg.image_size)
    torch.manual_seed(cfg.seed)
    model = Qwen2VLForConditionalGeneration(policy_config(tok, cfg.hidden, cfg.layers, cfg.vision_init, cfg.rope_theta))
    train_items = make_questions(cfg.train_questions, seed=cfg.seed, split="train", kinds=POLICY_KINDS)
    train_images = render_items(train_items, cfg.image_size)[0]
    first = tuple(k for k in cfg.first_kinds.split(",") if k) if cfg.first_steps else ()
    if first:  # its own pool, sized for one pass (fresh questions: the mixed pool's order is unchanged)
        first_items = make_questions(cfg.first_steps * cfg.batch_size, seed=50 + cfg.seed, split="train",
                                     kinds=first)
        first_images = render_items(first_items, cfg.image_size)[0]
    held = eval_items(cfg.eval_questions, "train")  # fresh training-distribution scenes (seed 1, not trained on)
    held_images, held_first = render_items(held, cfg.image_size)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / cfg.warmup))
    rng = random.Random(f"vqa-policy/{cfg.seed}")
    order: list[int] = []
    curve = []
    model.train()
    for step in range(1, cfg.steps + 1):
        if first and step <= cfg.first_steps:
            sl = slice((step - 1) * cfg.batch_size, step * cfg.batch_size)
            batch = _sft_batch(processor, first_items[sl], first_images[sl])
        else:
            if len(order) < cfg.batch_size:
                perm = list(range(len(train_items)))
                rng.shuffle(perm)
                order += perm
            idx, order = order[:cfg.batch_size], order[cfg.batch_size:]
            batch = _sft_batch(processor, [train_items[i] for i in idx], [train_images[i] for i in idx])
        loss = model(**batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % cfg.eval_every == 0 or step == cfg.steps:
            model.eval()
            acc, se = accuracy(gold_correct(held, generate_answers(model, processor, held, held_images), held_first))
            model.train()
            curve.append({"step": step, "loss": round(loss.item(), 4), "test_accuracy": round(acc, 4)})
            if cfg.snapshots:
                model.save_pretrained(str(Path(cfg.snapshots) / f"step{step:05d}"))
            print(f"step {step} loss {loss.item():.4f} test accuracy {acc:.3f} +- {se:.3f} "
                  f"({time.time() - t0:.0f}s)", flush=True)
    model.eval()
    model.save_pretrained(str(out))
    metrics = measure(model, processor, cfg.eval_questions, cfg.image_size)
    runtime = round((time.time() - t0) / 60, 1)
    record = {"config": asdict(cfg), "runtime_minutes": runtime, "curve": curve, "metrics": metrics,
              "parameters": sum(p.numel() for p in model.parameters()), "torch": torch.__version__}
    (out / "training.json").write_text(json.dumps(record, indent=1))
    write_card(out, record)
    return record


def measure(model, processor, n: int, image_size: int = IMAGE_SIZE) -> dict:
    """Greedy accuracy per split and per kind on the fixed evaluation questions."""
    from mmreward.synthetic.vqa import make_questions

    result: dict[str, Any] = {}
    for split, items in (("heldout", eval_items(n, "heldout")),
                         ("train_distribution", make_questions(n, seed=2, split="train", kinds=POLICY_KINDS))):
        images, first = render_items(items, image_size)
        correct = gold_correct(items, generate_answers(model, processor, items, images), first)
        # the label-prior control: each question with another question's images of its kind
        shuffled = gold_correct(items, generate_answers(model, processor, items, shuffled_within_kind(items, images)),
                                first)
        acc, se = accuracy(correct)

        result[split] = {"accuracy": round(acc, 4), "se": round(se, 4), "n": len(items), "per_kind": _per_kind(items, correct),
                         "shuffled_images_accuracy": round(accuracy(shuffled)[0], 4),
                         "shuffled_images_per_kind": _per_kind(items, shuffled)}
    return result


def _per_kind(items, correct: torch.Tensor) -> dict[str, float]:
    return {k: round(float(correct[[i for i, it in enumerate(items) if it.kind == k]].float().mean()), 3)
            for k in POLICY_KINDS}


def write_card(out: Path, record: dict) -> None:
    m, c = record["metrics"], record["config"]
    def kinds(v: dict) -> str:
        shuffled = v.get("shuffled_images_per_kind", {})
        return ", ".join(f"{k} {a:.2f}" + (f" ({shuffled[k]:.2f})" if k in shuffled else "")
                         for k, a in v["per_kind"].items())

    rows = "\n".join(f"| {split} | {v['accuracy']:.3f} ± {v['se']:.3f} (n={v['n']}) | "
                      f"{v.get('shuffled_images_accuracy', float('nan')):.3f} | {kinds(v)} |" for split, v in m.items())
    curriculum = (f" The first {c['first_steps']} steps see only {c['first_kinds'].replace(',', ', ')} questions (a "
                  "curriculum: in the five-kind mix alone the language model never learned to name shapes)."
                  if c.get("first_steps") and c.get("first_kinds") else "")
    (out / "README.md").write_text(f"""# ShapesWorld VQA policy (tiny Qwen2-VL)

A `Qwen2VLForConditionalGeneration` built from config ({record['parameters']:,} parameters, 3 text layers of
width {c['hidden']}, a 2-block vision tower) with a byte-level BPE tokenizer trained on the world's text
({c['vocab_size']} BPE pieces + Qwen's special tokens) and Qwen2-VL-Instruct's chat template. Supervised for
{c['steps']} steps (batch {c['batch_size']}, AdamW lr {c['lr']}) on training-split ShapesWorld questions
of kinds {', '.join(POLICY_KINDS)}: stopped early on purpose so that it answers above chance but far from perfectly,
the starting point of the GRPO recipe `python -m vlm_rm.trl_shapes_vqa` (docs/results/trl_shapes_vqa.md).{curriculum}

Prompts are the user turn `[image(s), question]` with no answer format; answers are bare words ("3", "red",
"circle", "yes", "first") followed by <|im_end|>. Images are {c.get('image_size', IMAGE_SIZE)}x{c.get('image_size', IMAGE_SIZE)}
({(c.get('image_size', IMAGE_SIZE) // 28) ** 2} visual tokens each).

Load: `Qwen2VLForConditionalGeneration.from_pretrained(folder)`, `AutoProcessor.from_pretrained(folder)`.

Greedy accuracy by the `shapes-vqa` checker (chance: count ~0.2, color 1/6, shape 1/4, position 1/2, which 1/2),
and in brackets with shuffled images (each question shown another question's images of its kind: what the
question's words alone earn; a kind whose two numbers agree is answered without looking at the image):

| split | accuracy ± SE | shuffled images | per kind (shuffled) |
|---|---|---|---|
{rows}

"heldout" questions involve the world's held-out colour-shape pairs (compositional generalisation);
"train_distribution" are fresh training-split scenes. Rebuild (seeded):
`python -m mmreward.synthetic.build.build_assets --only vqa-policy` ({record['runtime_minutes']} min on this
shared 2-core machine, torch {record['torch']}, {c['threads']} thread(s){'; ' + record['note'] if record.get('note') else ''}).
""")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    defaults = VQAPolicyTrainConfig()
    for k, v in asdict(defaults).items():
        parser.add_argument(f"--{k.replace('_', '-')}", type=type(v), default=v)
    args = parser.parse_args(argv)
    return train(VQAPolicyTrainConfig(**vars(args)))


if __name__ == "__main__":
    main()
