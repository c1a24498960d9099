"""The generative judges and VQAScore decode, sample frames and ask as their originals do (issue 34, item 3).

Constants below are transcribed from the originals' source (repo@commit named where used) and asserted
against our defaults: they are configuration, so the check is equality. Behaviour (truncation flags, frame
picking, frame rates, VQAScore's number) is checked on canned backends and tiny random Qwen-VL checkpoints.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from mmreward.judges.backends import Completion, JudgeBackend, OpenAIChatBackend
from mmreward.models.vlm_judge import FAMILIES, VLMJudge, unifiedreward_frame_indices

# CodeGoat24/UnifiedReward @ ff6f520 UnifiedReward-Think/inference_qwen/image_generation/
# qwen_infer_cot_image_generation.py: model.generate(**inputs, max_new_tokens=512); .../video_generation/
# qwen_infer_cot_video_generation.py: max_new_tokens=1024.
THINK_IMAGE_TOKENS, THINK_VIDEO_TOKENS = 512, 1024
# UnifiedReward-Think/vllm_qwen/vllm_request.py @ ff6f520 and CodeGoat24/Pref-GRPO @ 3e787f6
# vllm_utils/vllm_request.py: payload {"do_sample": False, "max_tokens": 4096}.
THINK_HTTP_TOKENS = 4096
# CodeGoat24/UnifiedReward @ ff6f520 vllm_qwen/vllm_request.py (UnifiedReward-2.0-inference scripts): 4096;
# point_score_APS_video_generation.py: read_video_frames(video_path, num_frames=16, ...).
UR_TOKENS, UR_VIDEO_FRAMES = 4096, 16
# TIGER-AI-Lab/VideoScore2 @ e6abe26 vs2_inference.py: infer_fps, max_tokens, temperature = 2.0, 1024, 0.7;
# model.generate(..., do_sample=True, temperature=temperature).
VS2_FPS, VS2_TOKENS, VS2_TEMPERATURE = 2.0, 1024, 0.7
# linzhiqiu/t2v_metrics @ 6ecb74f t2v_metrics/models/vqascore_models/qwen2vl_model.py, Qwen2VLModel.forward.
T2V_QUESTION = 'Does this figure show "{}"? Please answer Yes or No.'
T2V_ANSWER = "Yes"


def read_video_frames_indices(total_frames: int, num_frames: int) -> list[int]:
    """UnifiedReward @ ff6f520 point_score_APS_video_generation.py `read_video_frames`, its loop over a
    cv2 capture replaced by a loop over frame numbers (which frames it writes, in order)."""
    selected_frames = [int(i * total_frames / num_frames) for i in range(num_frames)]
    kept, current_frame, frame_idx = [], 0, 0
    while current_frame < total_frames:
        if current_frame in selected_frames:
            kept.append(current_frame)
            frame_idx += 1
        current_frame += 1
        if frame_idx >= num_frames:
            break
    return kept


def qwen_vl_utils_frame_indices(total_frames: int, video_fps: float, fps: float) -> list[int]:
    """qwen-vl-utils 0.0.14 (same in 0.0.10 = QwenLM/Qwen2.5-VL @ f0af299) vision_process.py: smart_nframes
    with FPS_MIN_FRAMES 4, FPS_MAX_FRAMES 768, FRAME_FACTOR 2, then torch.linspace(0, total - 1, n).round()."""
    factor = 2
    min_frames = math.ceil(4 / factor) * factor
    max_frames = math.floor(min(768, total_frames) / factor) * factor
    nframes = total_frames / video_fps * fps
    nframes = min(min(max(nframes, min_frames), max_frames), total_frames)
    nframes = math.floor(nframes / factor) * factor
    return torch.linspace(0, total_frames - 1, nframes).round().long().tolist()


class Recorder(JudgeBackend):
    """Canned answers; records requests and decoding arguments."""

    name = "recorder"

    def __init__(self, texts):
        self.texts, self.requests, self.calls = list(texts), [], []

    def generate(self, requests, *, n=1, temperature=0.0, seed=0, max_new_tokens=None):
        self.calls.append({"temperature": temperature, "max_new_tokens": max_new_tokens, "n": len(requests)})
        start = len(self.requests)
        self.requests += list(requests)
        return [[self.texts[(start + i) % len(self.texts)]] * n for i in range(len(requests))]

    def generate_with_choice_probs(self, requests, choices, *, temperature=0.0, seed=0, max_new_tokens=None):
        self.calls.append({"temperature": temperature, "max_new_tokens": max_new_tokens, "n": len(requests)})
        self.requests += list(requests)
        texts = [self.texts[i % len(self.texts)] for i in range(len(requests))]
        return texts, [[0] * len(t) for t in texts], [torch.full((len(t), len(choices)), 0.2) for t in texts]

    def token_index_at(self, token_ids, char_offset):
        return char_offset if char_offset < len(token_ids) else -1


def _images(n=2, seed=0):
    return torch.rand(n, 3, 28, 28, generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------------------------
# defaults = the originals' numbers
# ------------------------------------------------------------------------------------------------
def test_family_defaults_are_the_originals():
    think, ur, vs2 = FAMILIES["unifiedreward-think"], FAMILIES["unifiedreward"], FAMILIES["videoscore2"]
    assert think.max_new_tokens == {"image": THINK_IMAGE_TOKENS, "video": THINK_VIDEO_TOKENS}
    assert think.http_max_tokens == THINK_HTTP_TOKENS and think.temperature == 0.0
    assert ur.max_new_tokens == {"image": UR_TOKENS, "video": UR_TOKENS} and ur.http_max_tokens == UR_TOKENS
    assert ur.video_frames == UR_VIDEO_FRAMES
    assert vs2.max_new_tokens == {"video": VS2_TOKENS} and vs2.temperature == VS2_TEMPERATURE
    assert vs2.sample_fps == VS2_FPS
    from mmreward.models import vqascore

    assert vqascore.QUESTION_TEMPLATE == T2V_QUESTION and vqascore.ANSWER_TEMPLATE == T2V_ANSWER


def test_think_asks_each_medium_its_original_token_limit_and_http_asks_4096():
    backend = Recorder(["<think>ok</think><answer>Image 1 is better</answer>"])
    judge = VLMJudge(backend, FAMILIES["unifiedreward-think"])
    judge.compare("a fox", _images(1), _images(1, seed=1))
    videos = torch.rand(1, 2, 3, 28, 28)
    judge.compare("a fox", videos, videos.flip(1))
    assert [c["max_new_tokens"] for c in backend.calls] == [THINK_IMAGE_TOKENS] * 2 + [THINK_VIDEO_TOKENS] * 2
    assert all(c["temperature"] == 0.0 for c in backend.calls)
    # over an OpenAI-compatible server (nothing is contacted: the payload is only built)
    from mmreward.models.vlm_judge import load_unifiedreward_think

    http = load_unifiedreward_think(None, backend="openai", base_url="http://127.0.0.1:9/v1")
    assert http.backend.max_tokens == THINK_HTTP_TOKENS and http.max_new_tokens == THINK_HTTP_TOKENS
    user = load_unifiedreward_think(None, backend="openai", base_url="http://127.0.0.1:9/v1", max_new_tokens=300)
    assert user.backend.max_tokens == 300 and user.max_new_tokens == 300  # an explicit limit holds everywhere


# ------------------------------------------------------------------------------------------------
# truncation is reported, not a silent tie
# ------------------------------------------------------------------------------------------------
def test_a_think_block_cut_at_the_limit_is_flagged_counted_and_warned():
    cut = Completion("<think>\n1. Semantic consistency: Image 1 (9/10) - the fox is", truncated=True)
    done = Completion("<think>fine</think><answer>Image 1 is better</answer>", truncated=False)
    backend = Recorder([cut, done])  # first order cut, second order answered
    judge = VLMJudge(backend, FAMILIES["unifiedreward-think"])
    with pytest.warns(RuntimeWarning, match="max_new_tokens=512"):
        out = judge.compare("a fox", _images(1), _images(1, seed=1))
    assert out.details["truncated"].tolist() == [0.5]  # one of the two orders
    assert out.details["parse_failed"].tolist() == [0.5]
    assert judge.truncated_count == 1
    assert out.rationales[0].truncated  # the rationale text carries the flag
    # a complete but unreadable answer is a parse failure, not a truncation
    judge2 = VLMJudge(Recorder([Completion("no verdict at all", truncated=False)]), FAMILIES["unifiedreward-think"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out2 = judge2.compare("a fox", _images(1), _images(1, seed=1))
    assert out2.details["truncated"].tolist() == [0.0] and judge2.truncated_count == 0
    # pointwise too
    judge3 = VLMJudge(Recorder([cut]), FAMILIES["unifiedreward-think"])
    with pytest.warns(RuntimeWarning):
        s = judge3.score(["a fox", "a cat"], _images())
    assert torch.isnan(s.scores).all() and s.details["truncated"].tolist() == [1.0, 1.0]


def test_transformers_backend_marks_rows_that_hit_the_limit(tmp_path):
    """Tiny random Qwen2-VL: a row is truncated exactly when generate wrote no stop token within the limit."""
    pytest.importorskip("transformers")
    from mmreward.judges.backends import JudgeRequest
    from mmreward.models.vlm_judge import make_backend
    from mmreward.testing.qwen_vl import build_tiny_qwen_vl

    build_tiny_qwen_vl(tmp_path, seed=5)
    backend = make_backend(str(tmp_path), "pretrained", min_pixels=28 * 28, max_pixels=56 * 56, max_new_tokens=3)
    reqs = [JudgeRequest("Rate it.", [_images(1, seed=i)[0]]) for i in range(3)]
    texts = [t[0] for t in backend.generate(reqs)]
    inputs = backend._batch(reqs, padding_side="left")
    with torch.no_grad():
        ref = backend.model.generate(**inputs, max_new_tokens=3, do_sample=False)
    tok = backend.processor.tokenizer
    stop = {tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")}
    expected = [not any(t in stop for t in row) for row in ref[:, inputs["input_ids"].shape[1]:].tolist()]
    assert [t.truncated for t in texts] == expected
    assert any(expected)  # three random tokens hold no end: the case under test happens
    # a larger limit per call (what the judge passes) is honoured
    longer = backend.generate(reqs[:1], max_new_tokens=5)[0][0]
    assert len(tok(longer, add_special_tokens=False).input_ids) >= len(tok(texts[0], add_special_tokens=False).input_ids)


def test_openai_backend_reads_finish_reason_length():
    import httpx

    replies = iter([{"choices": [{"message": {"content": "<think>long"}, "finish_reason": "length"}]},
                    {"choices": [{"message": {"content": "<answer>Image 2 is better</answer>"},
                                  "finish_reason": "stop"}]}])
    backend = OpenAIChatBackend("http://127.0.0.1:9/v1", "m", max_retries=0, max_concurrency=1,
                                transport=httpx.MockTransport(lambda request: httpx.Response(200, json=next(replies))))
    from mmreward.judges.backends import JudgeRequest

    out = backend.generate([JudgeRequest("q", [_images(1)[0]])] * 2, max_new_tokens=77)
    assert [o[0].truncated for o in out] == [True, False]
    assert backend.payload(JudgeRequest("q", [_images(1)[0]]), 1, 0.0, 0, 77)["max_tokens"] == 77


# ------------------------------------------------------------------------------------------------
# UnifiedReward's video pointwise prompt: 16 frames as images
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("total", [30, 16, 10, 49])
def test_unifiedreward_frame_indices_are_read_video_frames(total):
    assert unifiedreward_frame_indices(total, UR_VIDEO_FRAMES) == read_video_frames_indices(total, UR_VIDEO_FRAMES)


def test_unifiedreward_video_pointwise_sends_16_sampled_frames_as_images():
    answer = "Alignment Score (1-5): 4\nPhysics Score (1-5): 3\nStyle Score (1-5): 5"
    backend = Recorder([answer])
    judge = VLMJudge(backend, FAMILIES["unifiedreward"])
    video = torch.rand(1, 30, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    out = judge.score("a fox", video)
    assert out.scores.item() == pytest.approx(4.0)
    (req,) = backend.requests
    assert req.kind == "image" and len(req.media) == UR_VIDEO_FRAMES
    want = read_video_frames_indices(30, UR_VIDEO_FRAMES)
    for frame, k in zip(req.media, want):
        assert torch.equal(frame, video[0, k])
    assert req.text.startswith("You are presented with a generated video")  # the video template
    # over HTTP: 16 image entries, then the text (as vllm_request.build_messages)
    content = OpenAIChatBackend("http://127.0.0.1:9/v1", "m").payload(req, 1, 0.0, 0)["messages"][0]["content"]
    assert [c["type"] for c in content] == ["image_url"] * UR_VIDEO_FRAMES + ["text"]
    # video_frames=0 restores one video input
    backend2 = Recorder([answer])
    VLMJudge(backend2, FAMILIES["unifiedreward"], video_frames=0).score("a fox", video)
    assert backend2.requests[0].kind == "video" and len(backend2.requests[0].media) == 1


def test_clips_of_different_lengths_are_asked_in_uniform_batches():
    backend = Recorder(["Alignment Score (1-5): 2\nPhysics Score (1-5): 2\nStyle Score (1-5): 2"])
    judge = VLMJudge(backend, FAMILIES["unifiedreward"])
    clips = [torch.rand(30, 3, 8, 8), torch.rand(10, 3, 8, 8), torch.rand(20, 3, 8, 8)]
    out = judge.score(["a", "b", "c"], clips)
    assert out.scores.tolist() == [2.0, 2.0, 2.0]
    assert sorted(len(r.media) for r in backend.requests) == [10, 16, 16]


# ------------------------------------------------------------------------------------------------
# VideoScore2: 2 fps frames, sampling at 0.7, 1024 tokens
# ------------------------------------------------------------------------------------------------
def test_videoscore2_keeps_the_frames_qwen_vl_utils_keeps_at_2_fps():
    judge = VLMJudge(Recorder(["visual quality: 4;"]), FAMILIES["videoscore2"])
    clip = torch.arange(30, dtype=torch.float32)[:, None, None, None].expand(30, 3, 4, 4) / 29  # frame k = k/29
    kept = judge.prepare(clip[None], fps=8.0)[0]
    want = qwen_vl_utils_frame_indices(30, 8.0, VS2_FPS)
    assert want == [0, 6, 12, 17, 23, 29]  # 30 frames at 8 fps: 7.5 -> 6 frames (floored to even)
    assert torch.allclose(kept[:, 0, 0, 0] * 29, torch.tensor(want, dtype=torch.float32))
    # sample_fps=0: the frames given
    assert VLMJudge(Recorder(["x"]), FAMILIES["videoscore2"], sample_fps=0).prepare(clip[None], fps=8.0).shape[1] == 30


def test_videoscore2_samples_at_0_7_with_1024_tokens_and_greedy_is_an_option():
    answer = "visual quality: 4;\ntext-to-video alignment: 3,\nphysical/common-sense consistency: 4"
    backend = Recorder([answer])
    VLMJudge(backend, FAMILIES["videoscore2"]).score("a fox", torch.rand(1, 4, 3, 8, 8))
    assert backend.calls[-1]["temperature"] == VS2_TEMPERATURE
    assert backend.calls[-1]["max_new_tokens"] == VS2_TOKENS
    VLMJudge(backend, FAMILIES["videoscore2"], temperature=0.0).score("a fox", torch.rand(1, 4, 3, 8, 8))
    assert backend.calls[-1]["temperature"] == 0.0


# ------------------------------------------------------------------------------------------------
# VQAScore against t2v_metrics' Qwen forward
# ------------------------------------------------------------------------------------------------
def _t2v_metrics_qwen_forward(folder, pil_images, texts, *, convert_first=True):
    """linzhiqiu/t2v_metrics @ 6ecb74f t2v_metrics/models/vqascore_models/qwen2vl_model.py
    Qwen2VLModel.forward with its defaults (question/answer templates, max_new_tokens=1, temperature=1.0),
    one item at a time. `load_images` opens an image file as `Image.open(path).convert('RGB')` (alpha dropped)
    before qwen_vl_utils sees it; then fetch_image (pyproject.toml requires `qwen-vl-utils[decord]` unpinned:
    0.0.14 today, `to_rgb` a no-op on the RGB image; smart_resize with MIN_PIXELS 4*28*28, MAX_PIXELS
    16384*28*28, PIL resize) is tests/_helpers/vlm_parity.py's transcription.

    convert_first=False: the RGBA image handed to qwen_vl_utils as it is (pasted on white by `to_rgb`), the
    alternative convention, only to show that the RGBA case tells the two apart. Returns the probabilities and
    each item's pixel_values."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from tests._helpers.vlm_parity import fetch_image

    model = AutoModelForImageTextToText.from_pretrained(folder).eval()
    processor = AutoProcessor.from_pretrained(folder)

    probs, pixels = [], []
    for image, text in zip(pil_images, texts):
        question, answer = T2V_QUESTION.format(text), T2V_ANSWER.format(text)
        messages = [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": question}]}]
        prompt = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        image_inputs = [fetch_image(image.convert("RGB") if convert_first else image, rgba_on_white=True)]
        inputs = processor(text=[prompt], images=image_inputs, videos=None, padding=True, return_tensors="pt",
                           do_resize=False)
        pixels.append(inputs["pixel_values"])
        answer_token_ids = processor.tokenizer.encode(answer, add_special_tokens=False)
        with torch.inference_mode():
            outputs = model.generate(**inputs, max_new_tokens=1, temperature=1.0, do_sample=False,
                                     output_scores=True, return_dict_in_generate=True)
        generated_ids = outputs.sequences[0][inputs.input_ids.shape[1]:]
        special = [processor.tokenizer.eos_token_id, processor.tokenizer.bos_token_id,
                   processor.tokenizer.pad_token_id]
        assert generated_ids[-1].item() not in special, "t2v_metrics raises when the only token is special"
        n_answer_tokens = min(len(answer_token_ids), len(outputs.scores))
        joint = 1.0
        for i in range(n_answer_tokens):
            logits = outputs.scores[-(n_answer_tokens - i)][0]
            joint *= torch.softmax(logits / 1.0, dim=-1)[answer_token_ids[i]].item()
        probs.append(joint ** (1.0 / n_answer_tokens))
    return torch.tensor(probs, dtype=torch.float64), pixels


@pytest.mark.parity
@pytest.mark.parametrize("variant", ["qwen2_5_vl", "qwen2_vl"])
def test_vqascore_matches_t2v_metrics_qwen_forward(tmp_path, variant):
    """Our batched, teacher-forced VQAScore vs t2v_metrics' one-by-one generate on a tiny random checkpoint
    whose generation_config carries Qwen2.5-VL-Instruct's repetition_penalty 1.05."""
    pytest.importorskip("transformers")
    import numpy as np
    from PIL import Image
    from transformers import GenerationConfig

    import mmreward
    from mmreward.testing.qwen_vl import build_tiny_qwen_vl
    from tests._helpers.parity_record import record_parity
    from tests._helpers.tolerances import assert_close_scaled
    from tests._helpers.vlm_parity import smooth_rgba

    model, _ = build_tiny_qwen_vl(tmp_path, variant=variant, seed=3)
    gen = GenerationConfig.from_model_config(model.config)
    gen.repetition_penalty = 1.05
    gen.save_pretrained(str(tmp_path))
    rng = np.random.default_rng(0)
    # sizes Qwen keeps as they are (multiples of 28 within the pixel bounds): no resize on either side
    # and a partly transparent RGBA image (alpha 0..255), which t2v_metrics converts to RGB (alpha dropped)
    arrays = [rng.integers(0, 256, (56, 84, 3), dtype=np.uint8), rng.integers(0, 256, (84, 56, 3), dtype=np.uint8),
              np.asarray(smooth_rgba(seed=8, height=56, width=84))]
    texts = ["a red circle", "two blue squares on a wooden table", "a green triangle"]
    expected, ref_pixels = _t2v_metrics_qwen_forward(str(tmp_path), [Image.fromarray(a) for a in arrays], texts)

    reward = mmreward.load("vqascore", checkpoint=str(tmp_path))
    assert reward.repetition_penalty == pytest.approx(1.05)
    media = [torch.from_numpy(a).permute(2, 0, 1).float() / 255 for a in arrays]
    seen = []  # what reaches the model: (pixel_values, image_grid_thw) per forward
    reward.model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append((kwargs["pixel_values"], kwargs["image_grid_thw"])), with_kwargs=True)
    got = reward.score(texts, media).scores.double()
    max_abs, max_rel = record_parity(
        "vqascore", original="linzhiqiu/t2v_metrics@6ecb74f t2v_metrics/models/vqascore_models/qwen2vl_model.py",
        how="transcribed", actual=got, expected=expected, cases=("RGB", "RGBA (alpha 0-255)", f"{variant} tiny random"),
        not_checked="sizes that need a resize (qwen_vl_utils resizes 8-bit PIL, we resize float tensors); videos",
    )
    assert_close_scaled(got, expected, rel=1e-4)
    # the penalty matters: without it the numbers differ (the test can fail)
    plain = mmreward.load("vqascore", checkpoint=str(tmp_path), repetition_penalty=1.0).score(texts, media).scores
    gap = float((plain.double() - expected).abs().max() / expected.abs().max())
    assert gap > max(10 * max_rel, 1e-3), (gap, max_rel)
    # the RGBA item's pixels (the tiny random model's score barely moves with them, so they are compared
    # directly): ours equal the alpha-dropping reference, and RGBA pasted on white would be far off
    ours = torch.cat([p for p, _ in seen]).split(torch.cat([g for _, g in seen]).prod(dim=1).tolist())
    assert len(ours) == len(arrays)
    assert_close_scaled(ours[2], ref_pixels[2], rel=1e-5)
    _, on_white = _t2v_metrics_qwen_forward(str(tmp_path), [Image.fromarray(arrays[2])], texts[2:], convert_first=False)
    assert (on_white[0] - ours[2]).abs().max() > 0.5
    print(f"vqascore {variant}: max abs {max_abs:.3g}, max rel {max_rel:.3g}; without the penalty rel {gap:.3g}")
