"""VQAScore, HPSv3 and VideoReward on tiny random Qwen2-VL / Qwen2.5-VL checkpoints written in the official
layouts, each checked against a plain transformers pipeline written here (HPSv3's and VideoReward's scores
against their originals' forward: tests/mmreward/test_parity_qwen_heads.py)."""

from __future__ import annotations

import json

import pytest
import torch

import mmreward
from mmreward.errors import CheckpointError

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def qwen2vl_dir(tmp_path_factory):
    from mmreward.testing.qwen_vl import build_tiny_qwen_vl

    path = tmp_path_factory.mktemp("qwen2vl")
    build_tiny_qwen_vl(path, variant="qwen2_vl", seed=1)
    return path


def _reference_p_yes(folder, prompt, medium, kind):
    """P(first token of 'Yes') after the generation prompt, one item at a time (t2v_metrics' way)."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from mmreward.backbones.qwen_vl import even_frames, resize_for_qwen

    proc = AutoProcessor.from_pretrained(folder)
    model = AutoModelForImageTextToText.from_pretrained(folder).eval()
    msgs = [{"role": "user", "content": [{"type": kind}, {"type": "text",
             "text": f'Does this figure show "{prompt}"? Please answer Yes or No.'}]}]
    text = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    x = resize_for_qwen(medium, 28 * 28, 56 * 56)
    kw = ({"images": [x], "images_kwargs": {"do_rescale": False, "do_resize": False}} if kind == "image" else
          {"videos": [even_frames(x)], "videos_kwargs": {"do_rescale": False, "do_resize": False, "do_sample_frames": False}})
    batch = proc(text=[text], return_tensors="pt", **kw)
    with torch.no_grad():
        logits = model(**batch).logits[0, -1]
    yes = proc.tokenizer("Yes", add_special_tokens=False).input_ids[0]
    return torch.softmax(logits.float(), -1)[yes]


@pytest.mark.parametrize("variant", ["qwen2_vl", "qwen2_5_vl"])
def test_vqascore_matches_plain_pipeline(tmp_path, variant):
    from mmreward.testing.qwen_vl import build_tiny_qwen_vl

    build_tiny_qwen_vl(tmp_path, variant=variant)
    reward = mmreward.load("vqascore", checkpoint=str(tmp_path), max_pixels=56 * 56, min_pixels=28 * 28)
    g = torch.Generator().manual_seed(0)
    images = [torch.rand(3, 56, 56, generator=g), torch.rand(3, 40, 70, generator=g)]  # different sizes, one batch
    prompts = ["a red circle", "two blue squares on a table"]
    got = reward.score(prompts, images).scores
    ref = torch.stack([_reference_p_yes(tmp_path, p, m, "image") for p, m in zip(prompts, images)])
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-7)
    assert got[0] != got[1]


def test_vqascore_video_through_video_input(qwen2vl_dir):
    reward = mmreward.load("vqascore", checkpoint=str(qwen2vl_dir), max_pixels=56 * 56, min_pixels=28 * 28)
    video = torch.rand(1, 3, 3, 56, 56, generator=torch.Generator().manual_seed(2))
    got = reward.score("a cat", video).scores
    torch.testing.assert_close(got, _reference_p_yes(qwen2vl_dir, "a cat", video[0], "video")[None], rtol=1e-4, atol=1e-7)


def test_vqascore_bad_template_and_missing_checkpoint(qwen2vl_dir, tmp_path):
    with pytest.raises(mmreward.RewardInputError, match="question_template"):
        mmreward.load("vqascore", checkpoint=str(qwen2vl_dir), question_template="no placeholder")
    with pytest.raises(CheckpointError):
        mmreward.load("vqascore", checkpoint=str(tmp_path / "nothing-here"))


def _to_legacy(sd):
    """Current transformers keys -> the 4.x names the official reward checkpoints use (independent of the loader)."""
    out = {}
    for k, v in sd.items():
        if k.startswith("model.visual."):
            k = "visual." + k[len("model.visual."):]
        elif k.startswith("model.language_model."):
            k = "model." + k[len("model.language_model."):]
        out[k] = v
    return out


def test_hpsv3_official_layout_and_reference(qwen2vl_dir, tmp_path):
    from safetensors.torch import save_file
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from mmreward.models.vlm_heads import hpsv3_head

    proc = AutoProcessor.from_pretrained(qwen2vl_dir)
    proc.tokenizer.add_special_tokens({"additional_special_tokens": ["<|Reward|>"]})
    torch.manual_seed(3)
    vlm = AutoModelForImageTextToText.from_pretrained(qwen2vl_dir).eval()
    vlm.resize_token_embeddings(len(proc.tokenizer), mean_resizing=False)
    head = hpsv3_head(vlm.config.text_config.hidden_size).eval()
    sd = _to_legacy(vlm.state_dict())
    sd.update({f"rm_head.{k}": v for k, v in head.state_dict().items()})
    save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / "HPSv3.safetensors"))

    reward = mmreward.load("hpsv3", checkpoint=str(tmp_path), base_model=str(qwen2vl_dir),
                           min_pixels=56 * 56, max_pixels=56 * 56)
    images = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(4))
    prompts = ["a cat", "a dog in the rain"]
    out = reward.score(prompts, images)
    # the scores against HPSv3's own forward: tests/mmreward/test_parity_qwen_heads.py; here, that the file's weights
    # (backbone and head) are the ones scoring: the loaded head maps the loaded backbone's states to the output
    states = reward.reward_token_states(prompts, images)[:, 0]
    torch.testing.assert_close(torch.stack([out.scores, out.details["sigma"]], 1), head(states.float()),
                               rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(reward.vlm.get_input_embeddings().weight, vlm.get_input_embeddings().weight)

    bad = dict(sd)
    bad.pop("rm_head.5.weight")
    save_file({k: v.contiguous() for k, v in bad.items()}, str(tmp_path / "HPSv3.safetensors"))
    with pytest.raises(CheckpointError, match="missing"):
        mmreward.load("hpsv3", checkpoint=str(tmp_path), base_model=str(qwen2vl_dir))


def test_videoreward_lora_layout_zscores_and_sum(qwen2vl_dir, tmp_path):
    from safetensors.torch import save_file
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from mmreward.models.vlm_heads import VIDEOALIGN_PROMPT, VIDEOALIGN_TOKENS, write_videoalign_config

    stats = {"VQ_mean": 0.1, "VQ_std": 2.0, "MQ_mean": -0.3, "MQ_std": 0.5, "TA_mean": 0.0, "TA_std": 4.0}
    r, alpha = 4, 8
    write_videoalign_config(tmp_path, str(qwen2vl_dir), stats,
                            lora={"lora_enable": True, "lora_r": r, "lora_alpha": alpha, "use_rslora": False})
    step = tmp_path / "checkpoint-7"
    step.mkdir()
    proc = AutoProcessor.from_pretrained(qwen2vl_dir)
    proc.tokenizer.add_special_tokens({"additional_special_tokens": list(VIDEOALIGN_TOKENS)})
    vlm = AutoModelForImageTextToText.from_pretrained(qwen2vl_dir).eval()
    vlm.resize_token_embeddings(len(proc.tokenizer), mean_resizing=False)
    g = torch.Generator().manual_seed(5)
    hidden = vlm.config.text_config.hidden_size
    embed = vlm.model.language_model.embed_tokens.weight.detach().clone()
    embed[-3:] = torch.randn(3, hidden, generator=g)
    head_w = torch.randn(3, hidden, generator=g)
    q = vlm.model.language_model.layers[0].self_attn.q_proj.weight
    lora_a, lora_b = torch.randn(r, q.shape[1], generator=g), torch.randn(q.shape[0], r, generator=g)
    pre = "base_model.model."
    torch.save({pre + "model.embed_tokens.weight": embed, pre + "rm_head.weight": head_w}, step / "non_lora_state_dict.pth")
    save_file({pre + "model.layers.0.self_attn.q_proj.lora_A.weight": lora_a.contiguous(),
               pre + "model.layers.0.self_attn.q_proj.lora_B.weight": lora_b.contiguous()},
              str(step / "adapter_model.safetensors"))

    reward = mmreward.load("videoalign", checkpoint=str(tmp_path), min_pixels=28 * 28, max_pixels=56 * 56)
    video = (torch.rand(1, 4, 3, 56, 56, generator=g) * 255).round() / 255  # 8-bit frames, at the card's size
    out = reward.score("a running horse", video)

    # plain reference: patch the weights by hand, run the model, read the three tokens
    with torch.no_grad():
        vlm.model.language_model.embed_tokens.weight.copy_(embed)
        q.add_((alpha / r) * lora_b @ lora_a)
    msgs = [{"role": "user", "content": [{"type": "video"}, {"type": "text",
             "text": VIDEOALIGN_PROMPT.format(text_prompt="a running horse")}]}]
    rendered = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    batch = proc(text=[rendered], videos=[(video[0] * 255).round()], return_tensors="pt",
                 videos_kwargs={"do_rescale": True, "do_resize": False, "do_sample_frames": False})
    with torch.no_grad():  # VideoReward's forward: visual features scattered in, sequential positions
        embeds = vlm.get_input_embeddings()(batch["input_ids"])
        feats = vlm.model.visual(batch["pixel_values_videos"], grid_thw=batch["video_grid_thw"])
        feats = getattr(feats, "pooler_output", feats)
        mask = (batch["input_ids"] == vlm.config.video_token_id)[..., None].expand_as(embeds)
        embeds = embeds.masked_scatter(mask, feats)
        h = vlm.model.language_model(inputs_embeds=embeds, attention_mask=batch["attention_mask"]).last_hidden_state[0]
    ids = proc.tokenizer.convert_tokens_to_ids(list(VIDEOALIGN_TOKENS))
    raw = torch.stack([h[batch["input_ids"][0] == t][0] @ head_w[k] for k, t in enumerate(ids)])
    mean = torch.tensor([0.1, -0.3, 0.0])
    std = torch.tensor([2.0, 0.5, 4.0])
    z = (raw - mean) / std
    for k, d in enumerate(["VQ", "MQ", "TA"]):
        torch.testing.assert_close(out.details[f"{d}_raw"][0], raw[k], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(out.details[d][0], z[k], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out.scores[0], z.sum(), rtol=1e-4, atol=1e-4)
    # DanceGRPO's vq_coef=1, mq_coef=0.5: only the named dimensions, weighted
    weighted = mmreward.load("videoalign", checkpoint=str(tmp_path), min_pixels=28 * 28, max_pixels=56 * 56,
                             dimension_weights={"VQ": 1.0, "MQ": 0.5})
    torch.testing.assert_close(weighted.score("a running horse", video).scores[0], z[0] + 0.5 * z[1],
                               rtol=1e-4, atol=1e-4)
    for bad in ({"Overall": 1.0}, {"VQ": float("nan")}, ["VQ"]):
        with pytest.raises(mmreward.RewardInputError, match="dimension_weights"):
            mmreward.load("videoalign", checkpoint=str(tmp_path), dimension_weights=bad)


def test_videoreward_folder_without_steps_is_a_clear_error(qwen2vl_dir, tmp_path):
    from mmreward.models.vlm_heads import write_videoalign_config

    write_videoalign_config(tmp_path, str(qwen2vl_dir), None)
    with pytest.raises(CheckpointError, match="checkpoint-<step>"):
        mmreward.load("videoalign", checkpoint=str(tmp_path))
    cfg = json.loads((tmp_path / "model_config.json").read_text())
    cfg["data_config"]["prompt_template_type"] = "simple"
    (tmp_path / "model_config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="detailed_special"):
        mmreward.load("videoalign", checkpoint=str(tmp_path))
