"""ShapesWorld edits: tasks, instructions and the exact checker of what changed and what must not."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

import mmreward
from mmreward.synthetic.edits import (
    EditParseError,
    EditSpec,
    check_edits,
    make_edit_task,
    parse_instruction,
    render_edit_targets,
    sample_edit_tasks,
    write_edit_dataset,
)
from mmreward.synthetic.prompts import COLORS, HELD_OUT_PAIRS, SHAPES
from mmreward.synthetic.scenes import Scene, render


def _tasks(kind, n=12, seed=0):
    rng = random.Random(f"test/{kind}/{seed}")
    return [make_edit_task(rng, kind) for _ in range(n)]


def test_instructions_are_the_briefs_templates_and_parse_back():
    assert EditSpec("color", "circle", None, "blue").instruction == "make the circle blue"
    assert EditSpec("shape", "square", None, "triangle").instruction == "turn the square into a triangle"
    assert EditSpec("add", "circle").instruction == "add a circle"
    assert EditSpec("color", "circle", "red", "blue").instruction == "make the red circle blue"
    for task in sample_edit_tasks(40, seed=1, split="all"):
        assert parse_instruction(task.instruction) == task.spec
    assert parse_instruction("Turn the cross into a circle.") == EditSpec("shape", "cross", None, "circle")
    for bad in ("make the circle", "turn the circle into a circle", "paint everything", "add a hexagon"):
        with pytest.raises(EditParseError, match="not a ShapesWorld edit"):
            parse_instruction(bad)


@pytest.mark.parametrize("kind", ["color", "shape", "add"])
def test_checker_accepts_every_correct_rendered_edit(kind):
    tasks = _tasks(kind)
    src, tgt = render_edit_targets(tasks)
    res = check_edits([t.instruction for t in tasks], src, tgt)
    assert res.strict.tolist() == [1.0] * len(tasks), [t.instruction for t, s in zip(tasks, res.strict) if s < 1]
    # doing nothing is not an edit: only the 'edit' clause fails (the rest is trivially preserved)
    idle = check_edits([t.instruction for t in tasks], src, src)
    assert idle.strict.tolist() == [0.0] * len(tasks)
    assert idle.clauses["edit"].tolist() == [0.0] * len(tasks)
    if kind != "add":
        assert idle.partial.tolist() == [0.75] * len(tasks)  # 3 of 4 clauses hold


def _with_object(scene: Scene, i: int, **changes) -> Scene:
    objs = list(scene.objects)
    objs[i] = replace(objs[i], **changes)
    return Scene(tuple(objs), scene.spec)


def test_checker_rejects_wrong_edits():
    tasks = [t for t in _tasks("color", 20) if len(t.source.objects) >= 2][:6]
    src = render([t.source for t in tasks])
    instr = [t.instruction for t in tasks]
    for t in tasks:
        assert len(t.target.objects) == len(t.source.objects)
    # the referred object gets a wrong colour
    wrong_colour = []
    for t in tasks:
        i = next(k for k, (a, b) in enumerate(zip(t.source.objects, t.target.objects)) if a != b)
        bad = next(c for c in COLORS if c not in (t.spec.new, t.source.objects[i].color))
        wrong_colour.append(_with_object(t.source, i, color=bad))
    res = check_edits(instr, src, render(wrong_colour))
    assert res.clauses["edit"].tolist() == [0.0] * 6 and res.strict.tolist() == [0.0] * 6
    # the right colour on the wrong object (another object recoloured instead)
    wrong_object = []
    for t in tasks:
        i = next(k for k, (a, b) in enumerate(zip(t.source.objects, t.target.objects)) if a != b)
        j = next(k for k in range(len(t.source.objects)) if k != i)
        other = t.source.objects[j]
        wrong_object.append(_with_object(t.source, j, color=next(c for c in COLORS if c != other.color)))
    res = check_edits(instr, src, render(wrong_object))
    assert res.clauses["edit"].tolist() == [0.0] * 6 and res.clauses["preserved"].tolist() == [0.0] * 6
    # the shape changed instead of the colour
    tasks_s = _tasks("color", 6, seed=3)
    reshaped = []
    for t in tasks_s:
        i = next(k for k, (a, b) in enumerate(zip(t.source.objects, t.target.objects)) if a != b)
        reshaped.append(_with_object(t.target, i, shape=next(s for s in SHAPES if s != t.source.objects[i].shape)))
    res = check_edits([t.instruction for t in tasks_s], render([t.source for t in tasks_s]), render(reshaped))
    assert res.clauses["edit"].tolist() == [0.0] * 6


def test_checker_rejects_collateral_changes():
    tasks = [t for t in _tasks("shape", 30, seed=5) if len(t.source.objects) <= 2][:5]
    src, tgt = render_edit_targets(tasks)
    instr = [t.instruction for t in tasks]
    assert check_edits(instr, src, tgt).strict.tolist() == [1.0] * 5
    # the edit plus an extra object in a free cell
    extra = []
    for t in tasks:
        taken = {(o.y > 0.5, o.x > 0.5) for o in t.target.objects}
        row, col = next((r, c) for r in (0, 1) for c in (0, 1) if (bool(r), bool(c)) not in taken)
        new = replace(t.target.objects[0], x=0.25 + 0.5 * col, y=0.25 + 0.5 * row, size=0.36)
        extra.append(Scene(t.target.objects + (new,), t.target.spec))
    res = check_edits(instr, src, render(extra))
    assert res.clauses["no_extra"].tolist() == [0.0] * 5 and res.strict.tolist() == [0.0] * 5
    assert res.clauses["edit"].tolist() == [1.0] * 5  # the edit itself is fine
    # the edit plus a faint smudge on the background, too small and faint to be an object
    smudged = tgt.clone()
    for b, t in enumerate(tasks):
        free = [(r, c) for r in (0, 1) for c in (0, 1)
                if not any((o.y > 0.5) == bool(r) and (o.x > 0.5) == bool(c) for o in t.target.objects)]
        r, c = free[0]
        y, x = 16 * r + 6, 16 * c + 6
        smudged[b, :, y:y + 3, x:x + 3] += 0.35
    smudged = smudged.clamp(0, 1)
    res = check_edits(instr, src, smudged)
    assert res.clauses["background"].tolist() == [0.0] * 5
    assert res.clauses["no_extra"].tolist() == [1.0] * 5  # invisible to detection: only the pixel clause sees it
    assert res.partial.tolist() == [0.75] * 5


def test_held_out_edits_produce_held_out_bindings_only():
    from mmreward.synthetic.edits import result_pair

    held = sample_edit_tasks(30, seed=2, split="heldout")
    train = sample_edit_tasks(60, seed=2, split="train")
    assert all(result_pair(t) in HELD_OUT_PAIRS for t in held)
    assert not any(result_pair(t) in HELD_OUT_PAIRS for t in train)


def test_shapes_edit_eval_reward_from_edit_records(tmp_path):
    from mmreward.prompt_sources import load_prompts, score_with_metadata

    tasks = sample_edit_tasks(9, seed=4, split="all")
    path = write_edit_dataset(tmp_path / "edits", tasks)
    prompts = load_prompts(str(path))
    assert [str(p) for p in prompts] == [t.instruction for t in tasks]
    _, targets = render_edit_targets(tasks)
    strict = mmreward.load("shapes-edit-eval")
    partial = mmreward.load("shapes-edit-eval", mode="partial")
    assert score_with_metadata(strict, list(prompts), targets, prompts).scores.tolist() == [1.0] * 9
    sources = render([t.source for t in tasks])
    out = score_with_metadata(partial, list(prompts), sources, prompts)  # nothing edited
    assert out.details["strict"].tolist() == [0.0] * 9 and bool((out.scores < 1).all())
    # a larger rendering of the edit is checked against the source resized to it
    _, big = render_edit_targets(tasks[:3], size=64)
    assert score_with_metadata(strict, list(prompts[:3]), big, prompts).scores.tolist() == [1.0] * 3
    with pytest.raises(mmreward.RewardInputError, match="source_image"):
        strict.score([t.instruction for t in tasks[:1]], targets[:1])


def test_gated_mode_gives_nothing_for_an_untouched_source_and_partial_credit_for_a_sloppy_edit(tmp_path):
    from mmreward.prompt_sources import load_prompts, score_with_metadata

    tasks = sample_edit_tasks(8, seed=5, split="all")
    prompts = load_prompts(str(write_edit_dataset(tmp_path / "edits", tasks)))
    gated = mmreward.load("shapes-edit-eval", mode="gated")
    sources, targets = render_edit_targets(tasks)
    untouched = score_with_metadata(gated, list(prompts), sources, prompts)
    # partial pays 0.5-0.75 for leaving the source alone; gated pays nothing
    assert untouched.scores.tolist() == [0.0] * 8 and bool((untouched.details["partial"] >= 0.5).all())
    sloppy = targets.clone()
    sloppy[:, :, :6, :6] = (sloppy[:, :, :6, :6] + 0.3).clamp(0, 1)  # a faint smudge in the top-left corner
    out = score_with_metadata(gated, list(prompts), sloppy, prompts)
    assert torch.equal(out.scores, out.details["partial"] * out.details["edit"])
    # the smudge breaks the background clause wherever no object covers the corner: partial credit, not 0 or 1
    assert int(((out.details["edit"] == 1) & (out.scores > 0) & (out.scores < 1)).sum()) >= 4
    assert score_with_metadata(gated, list(prompts), targets, prompts).scores.tolist() == [1.0] * 8


def test_shapes_edit_eval_conformance_with_sources():
    from mmreward.testing.conformance import check_conformance

    tasks = sample_edit_tasks(4, seed=6, split="all")
    src, tgt = render_edit_targets(tasks, size=64)
    media = torch.stack([tgt[0], src[1], tgt[2], src[3]])  # two right, two untouched
    sources = {t.instruction: s for t, s in zip(tasks, src)}
    assert len(sources) == 4

    class Bound(mmreward.Reward):
        def __init__(self, inner):
            super().__init__(micro_batch_size=64)
            self.inner = inner

        def _score(self, prompts, media):
            return self.inner.score(prompts, media, metadata=[{"source_image": sources[p]} for p in prompts])

    check_conformance(Bound(mmreward.load("shapes-edit-eval", mode="partial")), media=media,
                      prompts=[t.instruction for t in tasks])
