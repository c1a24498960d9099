"""EditReward and EditScore: official prompts, score parsing, strict loading, on tiny Qwen2.5-VL checkpoints.

The expected prompt digests were computed from the official repositories' own files (TIGER-AI-Lab/EditReward
edb027e EditReward/dataset/prompts.py + data_collator_qwen_edit.py; VectorSpaceLab/EditScore 6e0f1b9
editscore/vie_prompts.py joined as editscore/__init__.py does with score_range=25), not from our data module.
"""

from __future__ import annotations

import hashlib
import math

import pytest
import torch

import mmreward
from mmreward.errors import CheckpointError, RewardInputError
from mmreward.models.edit_rewards import (
    EditScore,
    editreward_prompt,
    editscore_prompts,
    parse_editscore_output,
)

pytest.importorskip("transformers")

QWEN_USER = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
VISION = "<|vision_start|><|image_pad|><|vision_end|>"
ASSISTANT = "<|im_end|>\n<|im_start|>assistant\n"


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture(scope="module")
def qwen25_dir(tmp_path_factory):
    from mmreward.backbones.tiny_qwen_vl import build_tiny_qwen_vl

    path = tmp_path_factory.mktemp("qwen25vl")
    build_tiny_qwen_vl(path, variant="qwen2_5_vl", seed=1)
    return path


class _Spy:
    """A processor that records the chat text it renders (what the model reads)."""

    def __init__(self, real):
        self.real, self.tokenizer, self.rendered = real, real.tokenizer, []

    def apply_chat_template(self, *args, **kwargs):
        out = self.real.apply_chat_template(*args, **kwargs)
        self.rendered += out
        return out

    def __call__(self, **kwargs):
        return self.real(**kwargs)


# -- prompts ---------------------------------------------------------------------------------------
def test_editreward_prompts_are_the_official_texts():
    instr = "Add a green bowl on the branch"
    follow, quality = editreward_prompt(instr, "following"), editreward_prompt(instr, "quality")
    assert _sha(follow) == "762761b5f69eb4b5e3ca0bfeb3ce6011a2f6c4eda9bc22ca5ec5831ad4aa2943"
    assert _sha(quality) == "b5813a93a0ab806e44cf4792a2e71d6b0f1bfa08bccfd56be076c8f35beaf224"
    assert follow.endswith(f"Text instruction - {instr}\n\nPlease provide the overall ratings of this image: "
                           "<|Reward|>\n\nEND\n")
    assert "**Instruction Following & Semantic Fidelity**" in follow and "**Visual Quality & Realism**" in quality


def test_editscore_prompts_are_the_official_texts():
    sc, pq = editscore_prompts(25)
    filled = sc.replace("<instruction>", "make the circle blue")
    assert _sha(filled) == "103d0791fd21f0c0c7871949642883d2a4fb366ba92070a9013586e284f1e5c4"
    assert _sha(pq) == "8249deba103d112dddd4c2e7fe1d5a1c40fe3143dc640a422a19aced0d260c78"
    # the score range replaces every '10' of the rules (the official str.replace), not of the context
    assert "From scale 0 to 25: \nA score from 0 to 25 will be given" in filled and "0 to 10" not in filled
    assert filled.endswith("Editing instruction: make the circle blue\n")


def test_editscore_requests_render_as_the_official_chat(qwen25_dir):
    from mmreward.backbones.qwen_vl import build_batch, load_processor

    judge = EditScore(_CannedBackend([]), score_range=25)
    src, edit = torch.rand(3, 56, 56), torch.rand(3, 56, 56)
    sc_req, pq_req = judge.requests(["make the circle blue"], [src], [edit])
    spy = _Spy(load_processor(str(qwen25_dir)))
    for req in (sc_req[0], pq_req[0]):
        build_batch(spy, [req.text], req.media, kind="image", min_pixels=28 * 28, max_pixels=56 * 56,
                    media_per_item=len(req.media), media_labels=req.media_labels)
    sc, pq = editscore_prompts(25)
    # editscore/mllm_tools/qwen25vl.py apply_chat_template, written out by hand
    assert spy.rendered[0] == (QWEN_USER + f"<img1>: {VISION}<img2>: {VISION}"
                               + sc.replace("<instruction>", "make the circle blue") + ASSISTANT)
    assert spy.rendered[1] == QWEN_USER + f"<img1>: {VISION}" + pq + ASSISTANT


# -- EditScore parsing and scores ---------------------------------------------------------------------
@pytest.mark.parametrize("text, scores", [
    ('{\n"reasoning" : "The circle is now blue; nothing else changed.",\n"score" : [23, 20]\n}', [23, 20]),
    ('||V^=^V||\n{"reasoning": "ok", "score": [12, 7]}\n||V^=^V||', [12, 7]),
    ("Here is my evaluation: {'reasoning': 'fine', 'score': [5, 9]}", [5, 9]),
    ('{"reasoning": "the "blue" circle is right", "score": [18, 4]}', [18, 4]),  # unescaped quotes
    ("{reasoning: natural, score: [25, 24]}", [25, 24]),  # unquoted keys
    ("[6, 0]", [6, 0]),
    ("7", [7]),
    ("I cannot evaluate these images.", None),
    ("", None),
])
def test_editscore_parser_on_official_style_outputs(text, scores):
    assert parse_editscore_output(text) == scores


class _CannedBackend:
    name = "canned"

    def __init__(self, texts):
        self.texts, self.calls = list(texts), []

    def generate(self, requests, *, n=1, temperature=0.0, seed=0):
        self.calls.append((len(requests), temperature, seed))
        out, self.texts = self.texts[: len(requests)], self.texts[len(requests):]
        return [[t] for t in out]


def test_editscore_combines_sc_and_pq_as_the_official_and_nan_on_garbage():
    sc_ok = '{"reasoning": "done", "score": [20, 15]}'
    pq_ok = '{"reasoning": "clean", "score": [25, 10]}'
    backend = _CannedBackend([sc_ok, "no json here", "[30, 2]", pq_ok, pq_ok, pq_ok])  # 3 SC then 3 PQ
    judge = EditScore(backend, score_range=25, temperature=0.7, seed=42)
    media = torch.rand(3, 3, 32, 32)
    meta = [{"source_image": torch.rand(3, 32, 32)} for _ in range(3)]
    out = judge.score(["make the circle blue"] * 3, media, metadata=meta)
    # item 0 by hand: SC = min(20, 15) / 2.5 = 6, PQ = min(25, 10) / 2.5 = 4, overall = sqrt(24)
    assert out.scores[0].item() == pytest.approx(math.sqrt(24), rel=1e-6)
    assert out.details["prompt_following"][0].item() == pytest.approx(8.0, rel=1e-6)
    assert out.details["consistency"][0].item() == pytest.approx(6.0, rel=1e-6)
    assert out.details["perceptual_quality"][0].item() == pytest.approx(4.0, rel=1e-6)
    # unparsable (item 1) and out of range 0..25 (item 2): NaN and flagged, never a guess
    assert torch.isnan(out.scores[1:]).all() and out.details["parse_failed"].tolist() == [0.0, 1.0, 1.0]
    assert backend.calls == [(3, 0.7, 42), (3, 0.7, 42)]  # the SC requests, then the PQ ones; the official seed


def test_editscore_pastes_rgba_tensors_on_white_as_pillow():
    """4-channel tensors (edited and source) reach the judge as qwen_vl_utils' `to_rgb` makes them: Pillow's
    `paste` of the RGBA image on white with alpha as the mask, here run by Pillow itself on the 8-bit values."""
    import numpy as np
    from PIL import Image

    class _Recording(_CannedBackend):
        def generate(self, requests, *, n=1, temperature=0.0, seed=0):
            self.requests = [*getattr(self, "requests", []), *requests]
            return super().generate(requests, n=n, temperature=temperature, seed=seed)

    rng = np.random.default_rng(0)
    rgba = [rng.integers(0, 256, (20, 24, 4), dtype=np.uint8) for _ in range(2)]  # alpha 0..255 at random

    def on_white(arr):
        white = Image.new("RGB", (arr.shape[1], arr.shape[0]), (255, 255, 255))
        white.paste(Image.fromarray(arr, "RGBA"), mask=Image.fromarray(arr[..., 3]))
        return torch.from_numpy(np.asarray(white).copy()).permute(2, 0, 1).float() / 255

    edited, source = (torch.from_numpy(a).permute(2, 0, 1).float() / 255 for a in rgba)
    backend = _Recording(["[20, 15]", "[25, 10]"])
    EditScore(backend).score(["make it blue"], edited[None], metadata=[{"source_image": source}])
    sc, pq = backend.requests
    torch.testing.assert_close(sc.media[0], on_white(rgba[1]), atol=1e-6, rtol=0)  # the source
    torch.testing.assert_close(sc.media[1], on_white(rgba[0]), atol=1e-6, rtol=0)  # the edited image
    torch.testing.assert_close(pq.media[0], on_white(rgba[0]), atol=1e-6, rtol=0)
    assert (pq.media[0] - edited[:3]).abs().max() > 0.5  # dropping alpha instead would be far off


def test_editscore_needs_the_source_images():
    judge = EditScore(_CannedBackend([]))
    with pytest.raises(RewardInputError, match="source_image"):
        judge.score(["make it blue"], torch.rand(1, 3, 32, 32))
    with pytest.raises(RewardInputError, match="score_range"):
        EditScore(_CannedBackend([]), score_range=0)


# -- EditReward: official layout, reference computation, strict loading --------------------------------
def test_editreward_official_layout_matches_a_plain_pipeline_and_loads_strictly(qwen25_dir, tmp_path):
    from safetensors.torch import save_file
    from torch import nn
    from transformers import AutoModelForImageTextToText, AutoProcessor

    proc = AutoProcessor.from_pretrained(qwen25_dir)
    proc.tokenizer.add_special_tokens({"additional_special_tokens": ["<|Reward|>"]})
    torch.manual_seed(3)
    vlm = AutoModelForImageTextToText.from_pretrained(qwen25_dir).eval()
    vlm.resize_token_embeddings(len(proc.tokenizer), mean_resizing=False)
    hidden = vlm.config.text_config.hidden_size
    # the released head layout: Linear(h, 1024), ReLU, Dropout, Linear(1024, 16), ReLU, Linear(16, 2)
    heads = [nn.Sequential(nn.Linear(hidden, 1024), nn.ReLU(), nn.Dropout(0.05), nn.Linear(1024, 16), nn.ReLU(),
                           nn.Linear(16, 2)).eval() for _ in range(2)]
    sd = dict(vlm.state_dict())
    for i, h in enumerate(heads):
        sd.update({f"rm_heads.head_{i}.{k}": v for k, v in h.state_dict().items()})
    save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / "model.safetensors"))

    reward = mmreward.load("editreward", checkpoint=str(tmp_path), base_model=str(qwen25_dir),
                           min_pixels=56 * 56, max_pixels=56 * 56)
    g = torch.Generator().manual_seed(4)
    src, edited = torch.rand(2, 3, 64, 64, generator=g), torch.rand(2, 3, 64, 64, generator=g)
    prompts = ["make the circle blue", "add a red square"]
    out = reward.score(prompts, edited, metadata=[{"source_image": s} for s in src])
    # the scores against EditReward's own forward: tests/mmreward/test_parity_qwen_heads.py; here, that the file's
    # heads are the ones scoring, pooled with 'mean'
    per_head = [out.details["instruction_following"], out.details["visual_quality"]]
    torch.testing.assert_close(out.scores, (per_head[0] + per_head[1]) / 2, rtol=1e-6, atol=1e-7)
    for name, head in zip(("head_0", "head_1"), heads):
        torch.testing.assert_close(reward.rm_head[name][5].weight, head[5].weight)
    # that the source image is read, in the official two-image layout, is checked against the original in
    # tests/mmreward/test_parity_qwen_heads.py (this seed's one-layer model attends from <|Reward|> to text tokens only)

    bad = dict(sd)
    bad.pop("rm_heads.head_1.5.weight")
    save_file({k: v.contiguous() for k, v in bad.items()}, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="missing"):
        mmreward.load("editreward", checkpoint=str(tmp_path), base_model=str(qwen25_dir))
    with pytest.raises(CheckpointError, match="checkpoint"):
        mmreward.load("editreward", base_model=str(qwen25_dir))


# -- EditScore: the LoRA adapter merged strictly -------------------------------------------------------
def test_editscore_merges_its_lora_adapter_strictly(qwen25_dir, tmp_path):
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForImageTextToText

    base = AutoModelForImageTextToText.from_pretrained(qwen25_dir).eval()
    torch.manual_seed(5)
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                 init_lora_weights=False))
    peft_model.save_pretrained(str(tmp_path / "adapter"))
    lora = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))

    judge = mmreward.load("editscore", checkpoint=str(tmp_path / "adapter"), base_model=str(qwen25_dir),
                          temperature=0.0, max_pixels=56 * 56, min_pixels=28 * 28, max_new_tokens=4)
    name = next(k for k in lora if k.endswith("q_proj.lora_A.weight"))[: -len(".lora_A.weight")]
    module = name.split("base_model.model.", 1)[1]
    fresh = AutoModelForImageTextToText.from_pretrained(qwen25_dir).eval()
    expected = (fresh.get_submodule(module).weight
                + (8 / 4) * lora[name + ".lora_B.weight"] @ lora[name + ".lora_A.weight"])  # W + alpha/r B A
    torch.testing.assert_close(judge.vlm.get_submodule(module).weight, expected, rtol=1e-5, atol=1e-6)
    out = judge.score(["make it blue"], torch.rand(1, 3, 56, 56), metadata=[{"source_image": torch.rand(3, 56, 56)}])
    assert out.scores.shape == (1,) and out.rationales[0].startswith("SC: ")

    bad = {k.replace("q_proj", "nonexistent_proj"): v for k, v in lora.items()}
    save_file(bad, str(tmp_path / "adapter" / "adapter_model.safetensors"))
    with pytest.raises(CheckpointError, match="does not match the base model"):
        mmreward.load("editscore", checkpoint=str(tmp_path / "adapter"), base_model=str(qwen25_dir))


# -- conformance with the sources bound -----------------------------------------------------------------
class _WithSources(mmreward.Reward):
    """Binds a source image to each prompt so the generic conformance suite can drive an edit reward."""

    def __init__(self, inner, sources):
        super().__init__(micro_batch_size=64)
        self.inner, self.sources = inner, sources
        self.may_return_nan = inner.may_return_nan

    def _score(self, prompts, media):
        return self.inner.score(prompts, media, metadata=[{"source_image": self.sources[p]} for p in prompts])


def test_editreward_tiny_passes_conformance_with_sources():
    from mmreward.testing.conformance import PROMPTS, check_conformance

    reward = mmreward.load("editreward", weights="random", **mmreward.get_spec("editreward").tiny_options)
    g = torch.Generator().manual_seed(0)
    check_conformance(_WithSources(reward, {p: torch.rand(3, 64, 64, generator=g) for p in PROMPTS}))


def test_editreward_keeps_its_heads_in_fp32_under_bf16():
    torch.manual_seed(0)
    reward = mmreward.load("editreward", weights="random", dtype="bf16", tiny=True)
    assert next(reward.vlm.parameters()).dtype == torch.bfloat16
    assert {p.dtype for p in reward.rm_head.parameters()} == {torch.float32}  # the heads' outputs are the scores
    g = torch.Generator().manual_seed(1)
    out = reward.score(["make the circle blue"] * 2, torch.rand(2, 3, 56, 56, generator=g),
                       metadata=[{"source_image": torch.rand(3, 56, 56, generator=g)} for _ in range(2)])
    assert out.scores.dtype == torch.float32 and bool(torch.isfinite(out.scores).all())
