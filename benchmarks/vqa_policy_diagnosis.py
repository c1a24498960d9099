"""Per-kind diagnosis of a ShapesWorld VQA policy: can GRPO learn each question kind from it? (issue 30)

    python benchmarks/vqa_policy_diagnosis.py                          # the shipped assets/shapesworld/vqa-policy
    python benchmarks/vqa_policy_diagnosis.py --policy DIR --n 500 --json out.json

Every answer of the world is one token, so one forward pass per question gives the policy's whole answer
distribution (the first generated token's softmax; nothing is sampled):
- greedy accuracy (argmax = the reference answer's token) and the accuracy of answers sampled at temperature
  T (the mean probability of the reference token at T), per kind;
- P(a GRPO group of G samples has reward variance) = mean of 1 - p^G - (1-p)^G: GRPO's advantage is zero in
  groups where every sample is right or every one is wrong;
- the same with each question's images swapped for those of another question of the same kind: a kind whose
  accuracy and answer loss do not change is answered from the question text alone (the policy is blind to it);
- a linear (ridge) probe of the object's shape from the vision tower's merged tokens of one-object scenes (does the
  vision side encode shape at all?), beside the same probe on the raw patches.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

import torch

from mmreward.synthetic.vqa_policy import shuffled_within_kind


@torch.inference_mode()
def answer_log_probs(model, processor, items, images, batch: int = 100) -> torch.Tensor:
    """(N, vocab) log-probabilities of the first answer token."""
    from mmreward.synthetic.vqa_policy import flat_images, prompt_texts

    tok = processor.tokenizer
    side, tok.padding_side = tok.padding_side, "left"
    try:
        out = []
        for s in range(0, len(items), batch):
            enc = processor(text=prompt_texts(processor, items[s:s + batch]),
                            images=flat_images(items[s:s + batch], images[s:s + batch]), return_tensors="pt",
                            padding=True)
            out.append(model(**enc).logits[:, -1].float().log_softmax(-1))
    finally:
        tok.padding_side = side
    return torch.cat(out)


def per_kind(items, logp: torch.Tensor, answer_ids: torch.Tensor, temperature: float, group: int,
             decode) -> dict[str, dict]:
    p_t = (logp / temperature).log_softmax(-1).gather(1, answer_ids[:, None]).exp().squeeze(1)
    greedy = logp.argmax(1)
    out = {}
    for kind in dict.fromkeys(it.kind for it in items):
        idx = torch.tensor([i for i, it in enumerate(items) if it.kind == kind])
        p = p_t[idx]
        out[kind] = {"n": len(idx), "greedy": round(float((greedy[idx] == answer_ids[idx]).float().mean()), 3),
                     "sampled": round(float(p.mean()), 3),
                     "answer_nll": round(float(-logp[idx].gather(1, answer_ids[idx, None]).mean()), 3),
                     "group_has_variance": round(float((1 - p ** group - (1 - p) ** group).mean()), 3),
                     "greedy_answers": dict(Counter(decode(int(t)) for t in greedy[idx]).most_common(4))}
    return out


def shape_probe(model, processor, n: int = 800, seed: int = 5) -> dict[str, float]:
    """Held-out accuracy of a linear probe (600 train / rest test) for the shape of one-object scenes, from the
    vision tower's merged tokens (concatenated) and from the raw patches."""
    from mmreward.synthetic.prompts import SHAPES
    from mmreward.synthetic.scenes import render, sample_scenes
    from mmreward.synthetic.vqa import _pil
    from mmreward.synthetic.vqa_policy import policy_image_size

    scenes = [s for s in sample_scenes(5 * n, seed=seed, split="train") if len(s.objects) == 1][:n]
    y = torch.tensor([SHAPES.index(s.objects[0].shape) for s in scenes])
    enc = processor.image_processor(images=_pil(render(scenes, size=policy_image_size(processor))),
                                    return_tensors="pt")
    with torch.inference_mode():
        vis = model.model.visual(enc["pixel_values"], grid_thw=enc["image_grid_thw"])
        vis = getattr(vis, "pooler_output", vis)
    result = {}
    for name, x in (("merged_tokens", vis.reshape(len(scenes), -1)),
                    ("raw_patches", enc["pixel_values"].reshape(len(scenes), -1))):
        result[name] = _linear_probe(x.float().clone(), y, 600)  # a normal tensor (the probe trains on it)
    return result


def _linear_probe(x: torch.Tensor, y: torch.Tensor, n_train: int, ridge: float = 1.0) -> float:
    """Held-out accuracy of a ridge-regression classifier onto one-hot labels (closed form, dual: the features
    can outnumber the examples), standardised on the first n_train rows, tested on the rest."""
    x = (x - x[:n_train].mean(0)) / (x[:n_train].std(0) + 1e-6)
    xt, targets = x[:n_train].double(), torch.nn.functional.one_hot(y[:n_train]).double()
    alpha = torch.linalg.solve(xt @ xt.T + ridge * torch.eye(n_train, dtype=xt.dtype), targets)
    scores = x[n_train:].double() @ (xt.T @ alpha)
    return round(float((scores.argmax(1) == y[n_train:]).float().mean()), 3)


def diagnose(policy: str, n: int = 500, temperature: float = 1.0, group: int = 8) -> dict:
    from transformers import AutoProcessor, Qwen2VLForConditionalGeneration

    from mmreward.synthetic.assets import resolve_asset
    from mmreward.synthetic.vqa_policy import eval_items, render_items

    path = resolve_asset(policy)
    model = Qwen2VLForConditionalGeneration.from_pretrained(path).eval()
    processor = AutoProcessor.from_pretrained(path)
    tok = processor.tokenizer
    items = eval_items(n, "train")
    images = render_items(items, processor=processor)[0]
    ids = torch.tensor([tok.convert_tokens_to_ids(tok.tokenize(it.answer))[0] for it in items])
    true = per_kind(items, answer_log_probs(model, processor, items, images), ids, temperature, group, tok.decode)
    shuffled = per_kind(items, answer_log_probs(model, processor, items, shuffled_within_kind(items, images)), ids,
                        temperature, group, tok.decode)
    return {"policy": policy, "n": n, "temperature": temperature, "group": group, "true_images": true,
            "shuffled_images": shuffled, "shape_probe": shape_probe(model, processor)}


def markdown(result: dict) -> str:
    lines = [f"| kind | greedy | sampled (T={result['temperature']}) | P(group of {result['group']} has variance) | "
             "greedy, shuffled images | answer NLL true / shuffled | greedy answers |", "|---|---|---|---|---|---|---|"]
    for kind, r in result["true_images"].items():
        s = result["shuffled_images"][kind]
        lines.append(f"| {kind} | {r['greedy']:.2f} | {r['sampled']:.2f} | {r['group_has_variance']:.2f} | "
                     f"{s['greedy']:.2f} | {r['answer_nll']:.3f} / {s['answer_nll']:.3f} | {r['greedy_answers']} |")
    p = result["shape_probe"]
    lines.append(f"\nLinear probe of a one-object scene's shape (chance 0.25): merged visual tokens "
                 f"{p['merged_tokens']:.2f}, raw patches {p['raw_patches']:.2f}.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--policy", default="mmreward-assets:shapesworld/vqa-policy")
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    result = diagnose(args.policy, args.n, args.temperature, args.group)
    print(markdown(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
