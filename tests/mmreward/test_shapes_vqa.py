"""ShapesWorld VQA world, the shapes-vqa response reward, the TRL/verl row writers and the adapters' response path.

The truth side of these tests is the scene's ground truth as `mmreward.synthetic.vqa` computes it from the
scene specs (object lists), while shapes-vqa without references reads answers off the rendered pixels with
the analytic detector: two independent paths that must agree.
"""

from __future__ import annotations

import random
import re

import pytest
import torch

import mmreward
from mmreward.errors import RewardInputError
from mmreward.synthetic.captions import PLURALS, parse_prompt
from mmreward.synthetic.prompts import COLORS, HELD_OUT_PAIRS, SHAPES
from mmreward.synthetic.scenes import realize
from mmreward.synthetic.vqa import (
    KINDS,
    VQAItem,
    is_held_out_question,
    item_images,
    make_questions,
    normalize_answer,
    prompt_text,
    to_trl_rows,
    to_verl_rows,
)
from mmreward.types import ResponseReward
from vlm_rm.adapters.media_refs import media_ref


@pytest.fixture(scope="module")
def reward():
    return mmreward.load("shapes-vqa")


def _wrong(item: VQAItem) -> str:
    """A well-formed but wrong answer of the same kind."""
    a = item.answer
    if item.kind == "count":
        return str(int(a) + 1)
    if item.kind == "color":
        return next(c for c in COLORS if c != a)
    if item.kind == "shape":
        return next(s for s in SHAPES if s != a)
    if item.kind == "position":
        return {"yes": "no", "no": "yes"}[a]
    if item.kind == "which":
        return {"first": "second", "second": "first"}[a]
    spec = parse_prompt(a)  # a caption naming another colour for its first object
    other = next(c for c in COLORS if c != spec.objects[0].color and c not in a)
    return re.sub(rf"\b{spec.objects[0].color}\b", other, a, count=1) if spec.objects[0].color else f"a {other} {a}"


def _first_images(items):
    return torch.cat([item_images(i)[:1] for i in items])


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_exact_answers_score_one_and_wrong_answers_zero(reward, split):
    items = make_questions(36, seed=3, split=split)
    assert {i.kind for i in items} == set(KINDS)
    images = _first_images(items)
    questions = [prompt_text(i) for i in items]
    refs = [i.answer for i in items]
    right = reward.score_responses(questions, images, [f"<answer>{a}</answer>" for a in refs], refs)
    wrong = reward.score_responses(questions, images, [f"<answer>{_wrong(i)}</answer>" for i in items], refs)
    assert right.scores.tolist() == [1.0] * len(items), right.rationales
    assert wrong.scores.tolist() == [0.0] * len(items), wrong.rationales
    assert right.details["format_ok"].tolist() == [1.0] * len(items)
    # without references the truth is read off the pixels: the same verdicts (which-image needs the reference)
    single = [k for k, i in enumerate(items) if i.kind != "which"]
    free = reward.score_responses([questions[k] for k in single], images[single], [refs[k] for k in single])
    assert free.scores.tolist() == [1.0] * len(single), free.rationales
    assert free.details["format_ok"].sum() == 0


@pytest.mark.parametrize(("kind", "text", "expected"), [
    ("count", "There are 3 circles.", "3"),
    ("count", "<answer>three</answer>", "3"),
    ("count", "I count four.", "4"),
    ("count", "No circles.", "0"),
    ("count", "2 or 3", None),
    ("color", "It is crimson.", "red"),
    ("color", "<answer>Violet</answer>", "purple"),
    ("color", "red or blue", None),
    ("shape", "It's a plus sign.", "cross"),
    ("shape", "Circles", "circle"),
    ("position", "Yes, it is.", "yes"),
    ("position", "No, it is not.", "no"),
    ("position", "yes and no", None),
    ("which", "The first image.", "first"),
    ("which", "Image 2", "second"),
    ("caption", "The image shows a red circle to the left of a blue square.", "a red circle left of a blue square"),
    ("caption", "a dog", None),
])
def test_answer_normalisation(kind, text, expected):
    assert normalize_answer(kind, text) == expected


def test_free_form_responses_and_details(reward):
    item = next(i for i in make_questions(30, seed=5, kinds=("count",)) if i.answer == "1")
    image = item_images(item)
    out = reward.score_responses([prompt_text(item)] * 4, image.expand(4, -1, -1, -1),
                                 ["There is 1 of them.", "<answer>one</answer>", "There are 2.", "I don't know."],
                                 [item.answer] * 4)
    assert out.scores.tolist() == [1.0, 1.0, 0.0, 0.0]
    assert out.details["format_ok"].tolist() == [0.0, 1.0, 0.0, 0.0]
    assert out.details["parsed"].tolist() == [1.0, 1.0, 1.0, 0.0]
    assert out.details["kind"].tolist() == [float(KINDS.index("count"))] * 4


def test_captions_are_checked_clause_by_clause_on_the_image(reward):
    spec = parse_prompt("a red circle left of a blue square")
    scene = realize(spec, random.Random(0))
    image = item_images(VQAItem("caption", "", "", (scene,), "train"))
    captions = ["There is a red circle to the left of a blue square.",  # all clauses hold, every object named
                "a blue square and a red circle",
                "a red circle",                       # true but leaves the square out
                "a red circle right of a blue square",  # wrong relation
                "a green circle and a blue square",    # wrong colour
                "hello"]                               # not a caption
    out = reward.score_responses("Describe the image in one phrase.", image.expand(6, -1, -1, -1), captions)
    assert out.scores.tolist() == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0], out.rationales
    # the plain Reward contract reads each text as a caption (a response to no question)
    assert reward.score(captions, image.expand(6, -1, -1, -1)).scores.tolist() == out.scores.tolist()
    assert isinstance(reward, ResponseReward)


def test_errors_are_typed(reward):
    image = item_images(make_questions(1, seed=0)[0])
    with pytest.raises(RewardInputError, match="not a ShapesWorld question"):
        reward.score_responses("What is the meaning of life?", image, "42")
    with pytest.raises(RewardInputError, match="reference"):
        reward.score_responses("Which image shows the red circle: the first or the second?", image, "first")
    with pytest.raises(RewardInputError, match="same length"):
        reward.score_responses("How many circles are there?", image, "1", ["1", "2"])


def _named_pairs(item: VQAItem) -> set[tuple[str, str]]:
    """The colour-shape pairs a question's text and answer name (read back from the text, not from vqa)."""
    singular = {**{s: s for s in SHAPES}, **{p: s for s, p in PLURALS.items()}}
    words = [singular.get(w, w) for w in re.findall(r"[a-z]+", f"{item.question} {item.answer}".lower())]
    pairs = {(a, b) for a, b in zip(words, words[1:]) if a in COLORS and b in SHAPES}
    if item.kind == "color":  # "What colour is the <shape>?"
        pairs.add((item.answer, words[4]))
    if item.kind == "shape":  # "What shape is the <colour> object?"
        pairs.add((words[4], item.answer))
    return pairs


def test_splits_are_seeded_and_disjoint_by_held_out_pairs():
    train = make_questions(120, seed=0, split="train")
    held = make_questions(120, seed=0, split="heldout")
    assert [(i.question, i.answer) for i in train] == [(i.question, i.answer) for i in make_questions(120, 0, "train")]
    assert [(i.question, i.answer) for i in train] != [(i.question, i.answer) for i in make_questions(120, 1, "train")]
    # no training question or answer names a held-out colour-shape pair, nor shows one in a caption's scene
    for item in train:
        assert not _named_pairs(item) & HELD_OUT_PAIRS, item
        if item.kind == "caption":
            assert not {(o.color, o.shape) for o in item.scenes[0].objects} & HELD_OUT_PAIRS
    named = [i for i in held if i.kind in ("color", "shape", "position", "caption")]
    assert named and all(_named_pairs(i) & HELD_OUT_PAIRS for i in named)
    # texts that name pairs never repeat across the splits (count/which texts may: their images differ)
    text = {(i.question, i.answer) for i in train}
    assert not any((i.question, i.answer) in text for i in named)
    assert all(is_held_out_question(i.kind, i.answer, [(o.color, o.shape) for s in i.scenes for o in s.objects],
                                    next((s for s in SHAPES if s in i.question), None)) for i in held)


def test_trl_rows_are_what_grpo_trainer_reads():
    """trl 1.16.0 GRPOTrainer: `_signature_columns = ["prompt", "image", "images"]`, conversational prompts
    (`is_conversational`), images put into the prompt's image placeholders by `prepare_multimodal_messages`."""
    from trl.data_utils import is_conversational, prepare_multimodal_messages

    items = make_questions(12, seed=1, kinds=("count", "which"))
    rows = to_trl_rows(items, size=64)
    for row, item in zip(rows, items):
        assert is_conversational(row)
        filled = prepare_multimodal_messages(row["prompt"], images=row["images"])
        parts = filled[0]["content"]
        assert [p["image"] for p in parts if p["type"] == "image"] == row["images"]
        assert len(row["images"]) == (2 if item.kind == "which" else 1)
        assert row["images"][0].size == (64, 64) and row["answer"] == item.answer


def _verl_build_messages(example: dict, prompt_key: str = "prompt", image_key: str = "images") -> list:
    """verl RLHFDataset._build_messages (volcengine/verl verl/utils/dataset/rl_dataset.py, transcribed)."""
    messages = example.pop(prompt_key)
    if image_key in example or "videos" in example:
        for message in messages:
            segments = [s for s in re.split("(<image>|<video>)", message["content"]) if s != ""]
            message["content"] = [{"type": "image"} if s == "<image>" else {"type": "video"} if s == "<video>"
                                  else {"type": "text", "text": s} for s in segments]
    return messages


def test_verl_rows_follow_rlhf_dataset_and_score_through_the_verl_adapter(tmp_path):
    from PIL import Image

    from vlm_rm.adapters.verl import compute_score

    items = make_questions(12, seed=2, split="heldout")
    rows = to_verl_rows(items, tmp_path / "images")
    for row, item in zip(rows, items):
        messages = _verl_build_messages(dict(row))
        n_img = sum(p["type"] == "image" for p in messages[0]["content"])
        assert n_img == len(row["images"]) == len(item.scenes)
        assert row["reward_model"]["ground_truth"] == item.answer and row["reward_model"]["style"] == "rule"
        pixels = torch.tensor(list(Image.open(row["images"][0]["image"]).getdata())).float()
        rendered = (item_images(item)[0].permute(1, 2, 0).reshape(-1, 3) * 255).round()
        assert torch.equal(pixels, rendered)
        kwargs = dict(data_source=row["data_source"], ground_truth=row["reward_model"]["ground_truth"],
                      extra_info=row["extra_info"], reward="shapes-vqa")
        assert compute_score(solution_str=f"<answer>{item.answer}</answer>", **kwargs) == 1.0
        assert compute_score(solution_str=f"<answer>{_wrong(item)}</answer>", **kwargs) == 0.0


def test_trl_adapter_scores_completions_through_the_response_contract():
    from trl.data_utils import prepare_multimodal_messages

    from vlm_rm.adapters.trl import trl_reward_function

    items = make_questions(12, seed=4)
    rows = to_trl_rows(items)
    fn = trl_reward_function("shapes-vqa")
    prompts = [prepare_multimodal_messages(r["prompt"], images=r["images"]) for r in rows]
    columns = {k: [r[k] for r in rows] for k in ("images", "answer", "kind", "question")}
    right = [[{"role": "assistant", "content": f"<answer>{i.answer}</answer>"}] for i in items]
    wrong = [[{"role": "assistant", "content": f"The answer is {_wrong(i)}."}] for i in items]
    assert fn(prompts, right, **columns) == [1.0] * len(items)
    assert fn(prompts, wrong, **columns) == [0.0] * len(items)
    # without an answer column, single-image questions are checked on the image itself
    single = [k for k, i in enumerate(items) if i.kind != "which"]
    no_ref = {"images": [columns["images"][k] for k in single]}
    assert fn([prompts[k] for k in single], [right[k] for k in single], **no_ref) == [1.0] * len(single)


def test_easyr1_adapter_reads_question_and_answer_from_ground_truth(tmp_path):
    from vlm_rm.adapters.easyr1 import compute_score

    items = [i for i in make_questions(12, seed=6) if i.kind != "which"][:6]
    inputs = []
    for k, item in enumerate(items):
        path = tmp_path / f"{k}.png"
        to_trl_rows([item])[0]["images"][0].save(path)
        gt = media_ref(str(path), answer=item.answer, question=item.question)
        inputs.append({"response": f"<answer>{item.answer}</answer>", "ground_truth": gt})
        inputs.append({"response": f"<answer>{_wrong(item)}</answer>", "ground_truth": gt})
    scores = [d["overall"] for d in compute_score(inputs, reward="shapes-vqa")]
    assert scores == [1.0, 0.0] * len(items)


def test_response_contract_micro_batches_and_broadcasts():
    from mmreward.models.shapes_vqa import ShapesVQAReward

    items = [i for i in make_questions(12, seed=7) if i.kind != "which"][:5]
    images = _first_images(items)
    questions = [prompt_text(i) for i in items]
    responses = [i.answer if k % 2 else _wrong(i) for k, i in enumerate(items)]
    whole = ShapesVQAReward().score_responses(questions, images, responses)
    split = ShapesVQAReward(micro_batch_size=2).score_responses(questions, images, responses)
    assert whole.scores.tolist() == split.scores.tolist() == [float(k % 2) for k in range(5)]
    assert whole.rationales == split.rationales
    count = next(i for i in items if i.kind == "count")  # one question string for every item
    one = ShapesVQAReward().score_responses(count.question, item_images(count).expand(3, -1, -1, -1),
                                            [count.answer, "7", count.answer])
    assert one.scores.tolist() == [1.0, 0.0, 1.0]
    with pytest.raises(RewardInputError, match="responses"):
        ShapesVQAReward().score_responses(questions, images, None)


def test_verl_async_reward_loop_batches_response_rewards(tmp_path):
    import asyncio

    from vlm_rm.adapters.verl import compute_score_async

    items = make_questions(6, seed=8, split="heldout")
    rows = to_verl_rows(items, tmp_path)

    async def run() -> list:
        calls = []
        for row, item in zip(rows, items):
            for answer in (item.answer, _wrong(item)):
                calls.append(compute_score_async(
                    data_source=row["data_source"], solution_str=f"<answer>{answer}</answer>",
                    ground_truth=row["reward_model"]["ground_truth"], extra_info=row["extra_info"],
                    reward="shapes-vqa"))
        return await asyncio.gather(*calls)

    assert asyncio.run(run()) == [1.0, 0.0] * len(items)
