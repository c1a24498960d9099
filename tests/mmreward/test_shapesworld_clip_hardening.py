"""CLIP training with hard negatives: corrupted renders and generator samples the checker rejects."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from mmreward.errors import ConfigError, RewardInputError
from mmreward.synthetic.build import train_clip
from mmreward.synthetic.build.generated_pool import GeneratedPool
from mmreward.synthetic.build.train_clip import ClipTrainConfig

ASSETS = Path(__file__).resolve().parents[2] / "assets" / "shapesworld"


def _pool(tmp_path, name="pool.pt", prompts=("a red circle", "a red circle", "a blue square", "a blue square", "two crosses"),
          strict=(1.0, 0.0, 0.0, 0.0, 1.0)):
    n = len(prompts)
    d = {"images": torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8), "prompts": list(prompts),
         "strict": torch.tensor(strict), "partial": torch.tensor(strict)}
    path = tmp_path / name
    torch.save(d, path)
    return path, d


def test_contrast_groups_pair_accepted_with_rejected_samples_of_one_prompt(tmp_path):
    path, _ = _pool(tmp_path)
    pool = GeneratedPool.load(path)
    # only "a red circle" has both verdicts
    assert pool.contrast_groups() == [([0], [1])]
    path2, _ = _pool(tmp_path, "b.pt", prompts=("a blue square",), strict=(1.0,))
    both = GeneratedPool.load_many(f"{path},{path2}")
    assert len(both.prompts) == 6
    assert sorted(both.contrast_groups()) == [([0], [1]), ([5], [2, 3])]


def test_pool_errors_are_typed(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        GeneratedPool.load(tmp_path / "missing.pt")
    with pytest.raises(RewardInputError, match="one entry per sample"):
        GeneratedPool(torch.zeros(2, 3, 4, 4, dtype=torch.uint8), ["a"], torch.zeros(2), torch.zeros(2))
    with pytest.raises(RewardInputError, match="uint8"):
        GeneratedPool(torch.zeros(1, 3, 4, 4), ["a"], torch.zeros(1), torch.zeros(1))
    with pytest.raises(ConfigError, match="is not a file"):
        ClipTrainConfig(generated=str(tmp_path / "nope.pt"))
    with pytest.raises(ConfigError, match="hard_negatives must be in"):
        ClipTrainConfig(hard_negatives=2.0)


def test_batch_puts_positives_first_and_hard_negatives_after(tmp_path):
    path, d = _pool(tmp_path)
    cfg = ClipTrainConfig(batch_size=8, hard_negatives=0.5, generated=str(path), generated_groups=3)
    pool = GeneratedPool.load(path)
    images, texts, target = train_clip._batch(5, cfg, pool)
    # 8 rendered positives + 3 accepted generated samples, then 4 corrupted renders + 3 rejected samples
    assert len(texts) == 11 and target.shape == (11, 11)
    assert images.shape == (11 + 4 + 3, 3, 32, 32)
    assert torch.allclose(target.sum(1), torch.ones(11))
    accepted = d["images"][0].float() / 255
    rejected = d["images"][1].float() / 255
    assert all(torch.allclose(images[8 + k], accepted) for k in range(3))
    assert all(torch.allclose(images[15 + k], rejected) for k in range(3))
    assert texts[8:].count("a red circle") + texts[8:].count("a photo of a red circle") == 3
    # each corrupted render differs from the scene it came from
    plain, _, _ = train_clip._batch(5, ClipTrainConfig(batch_size=8), None)
    assert all(not torch.allclose(images[11 + k], plain[k]) for k in range(4))


def test_hard_negative_loss_reduces_to_symmetric_infonce_without_negatives():
    torch.manual_seed(0)
    logits = torch.randn(5, 5)
    target = torch.eye(5)
    ref = 0.5 * (F.cross_entropy(logits, torch.arange(5)) + F.cross_entropy(logits.T, torch.arange(5)))
    assert torch.allclose(train_clip.contrastive_loss(logits, target), ref, atol=1e-6)
    # an extra image column that matches a caption strongly raises only the text->image term
    extra = torch.cat([logits, torch.full((5, 1), 10.0)], 1)
    t2i = F.cross_entropy(extra, torch.arange(5))
    assert torch.allclose(train_clip.contrastive_loss(extra, target),
                          0.5 * (t2i + F.cross_entropy(logits.T, torch.arange(5))), atol=1e-6)


def test_clip_trainer_smoke_with_pool_and_negatives(tmp_path):
    path, _ = _pool(tmp_path)
    out = tmp_path / "clip"
    before = torch.get_num_threads()
    # the caller runs 2 threads, the trainer 1 (tiny batches): it must resize the pool and then restore it
    torch.set_num_threads(2)
    try:
        metrics = train_clip.main(["--out", str(out), "--steps", "2", "--batch-size", "8", "--eval-images", "4",
                                   "--hard-negatives", "0.5", "--degrade", "0.3", "--generated", str(path),
                                   "--generated-groups", "2", "--threads", "1"])
        assert torch.get_num_threads() == 2  # the caller's thread pool is left as it was
    finally:
        torch.set_num_threads(before)
    assert all(0 <= m["top1"] <= 1 for m in metrics.values())
    assert (out / "model.safetensors").is_file()


def test_evaluation_reserve_is_a_third_of_every_training_category_and_never_used_for_training():
    from mmreward.synthetic import caption
    from mmreward.synthetic.build.generated_pool import reserved_for_evaluation, reward_training_specs
    from mmreward.synthetic.scenes import specs_for_split

    for cat, specs in specs_for_split("train").items():
        mine = [s for s in specs if reserved_for_evaluation(caption(s))]
        assert len(mine) == (len(specs) + 2) // 3, cat  # every third after a fixed shuffle
    held = [caption(s) for specs in specs_for_split("heldout").values() for s in specs]
    assert not any(reserved_for_evaluation(p) for p in held)
    train = reward_training_specs(300, seed=3)
    assert len(train) == 300 and not any(reserved_for_evaluation(caption(s)) for s in train)


@pytest.mark.skipif(not (ASSETS / "generator" / "model_index.json").is_file(), reason="needs the generator asset")
def test_harden_clip_quick_builds_a_loadable_clip_from_unreserved_prompts(tmp_path):
    import json

    import mmreward
    from diffusion_rl.experiments import harden_clip
    from mmreward.synthetic.build.generated_pool import reserved_for_evaluation

    out, work = tmp_path / "clip-hardened", tmp_path / "work"
    summary = harden_clip.main(["--quick", "--generator", str(ASSETS / "generator"), "--clip", str(ASSETS / "clip"),
                                "--work", str(work), "--out", str(out)])
    for name in ("pool.pt", "adversarial_pool.pt"):
        pool = torch.load(work / name, weights_only=True)
        assert pool["images"].dtype == torch.uint8 and len(pool["prompts"]) == len(pool["strict"])
        assert not any(reserved_for_evaluation(p) for p in pool["prompts"])
    assert 0.0 <= summary["pool"]["strict"] <= 1.0
    assert json.loads((out / "hardening.json").read_text())["round2"].keys() == summary["round2"].keys()
    assert "reserved_for_evaluation" in (out / "README.md").read_text()
    reward = mmreward.load("clipscore", checkpoint=str(out))
    images = torch.rand(2, 3, 32, 32)
    scores = reward.score(["a red circle", "two squares"], images).scores
    assert scores.shape == (2,) and torch.isfinite(scores).all()


def test_harden_clip_card_reports_the_starting_clip_measured_in_this_build(tmp_path):
    """The card's baseline is read from the build's own measurement, not a number typed into the script."""
    import json

    from diffusion_rl.experiments.harden_clip import write_card

    summary = {
        "start": {"folder": "my/start-clip", "params": 1_230_000,
                  "retrieval": {"colors": {"top1": 0.2}, "position": {"top1": 0.1}}},
        "pool": {"samples": 8, "strict": 0.25, "sampling_steps": [2]},
        "clip_steps": [3, 5],
        "adversarial_pool": {"strict_by_iteration": {0: 0.5, 1: 0.0}, "prompts": 2, "sampling_steps": 2},
        "round2": {"colors": {"top1": 0.9, "chance": 0.04}, "position": {"top1": 0.5, "chance": 0.001}},
        "minutes": 0.1,
    }
    write_card(tmp_path, summary)
    card = (tmp_path / "README.md").read_text()
    assert "Mean top-1 **0.700**; the starting CLIP on the same scenes: 0.150." in card
    assert "| colors | 0.900 | 0.200 | 0.040 |" in card and "| position | 0.500 | 0.100 | 0.001 |" in card
    assert "1.23M-parameter CLIP of `my/start-clip`" in card and "8 generator samples (2 steps)" in card
    assert "0.372" not in card and "0.32M" not in card
    assert json.loads((tmp_path / "hardening.json").read_text())["start"]["retrieval"]["colors"]["top1"] == 0.2
