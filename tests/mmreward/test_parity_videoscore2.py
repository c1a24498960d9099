"""VideoScore2 against its original inference script, on a tiny random Qwen2.5-VL checkpoint written in the official
layout and loaded through our real loader.

The reference is transcribed from TIGER-AI-Lab/VideoScore2 @ e6abe26 vs2_inference.py (never through mmreward's code;
qwen_vl_utils' `smart_resize` is the shared transcription in tests/_helpers/vlm_parity.py):
VS2_QUERY_TEMPLATE filled with the prompt; one user turn [video at fps 2.0, text] through the processor's chat
template; qwen_vl_utils' `process_vision_info` (qwen-vl-utils 0.0.10 = QwenLM/Qwen2.5-VL @ f0af299
vision_process.py: `_read_video_decord` after decoding (smart_nframes: total / video_fps * 2, clamped to
[4, min(768, total)], floored to an even count; frames linspace(0, total - 1, n).round()), `fetch_video` (128..768
patches per frame within the 128000*28*28*0.9 total, torchvision's bicubic antialiased resize of the uint8 frames));
the processor call with fps=2.0; `generate(max_new_tokens=1024, output_scores=True, do_sample=True,
temperature=0.7)`; the answer regex; `find_score_token_index_by_prompt`; `ll_based_soft_score_normed` on
`scores[token_idx]` (the scores after the sampling warpers), best digit times its probability renormalised over 1..5.
The random model writes no answer lines, so the soft value is compared at every generated step (what the script
reads at whichever step writes a digit), and the token index and regex on canned answers.
"""

from __future__ import annotations

import math
import re
from string import Template

import numpy as np
import pytest
import torch

import mmreward
from tests._helpers.parity_record import record_parity
from tests._helpers.tolerances import assert_close_scaled
from tests._helpers.vlm_parity import smart_resize, spy_on_generate

pytest.importorskip("transformers")
pytest.importorskip("torchvision")

pytestmark = pytest.mark.parity

VS2 = "TIGER-AI-Lab/VideoScore2@e6abe26 vs2_inference.py"
GEN_TOKENS = 10  # the tiny random model never stops; both sides generate this many (the original allows 1024)
SEED = 0

VS2_QUERY_TEMPLATE = Template("""
    You are an expert for evaluating AI-generated videos from three dimensions:
    (1) visual quality – clarity, smoothness, artifacts;
    (2) text-to-video alignment – fidelity to the prompt;
    (3) physical/common-sense consistency – naturalness and physics plausibility.

    Video prompt: $t2v_prompt

    Please output in this format:
    visual quality: <v_score>; 
    text-to-video alignment: <t_score>, 
    physical/common-sense consistency: <p_score>
    """)  # noqa: W291 (the original's trailing spaces)


# ------------------------------------------------------------------------------------------------
# qwen_vl_utils 0.0.10 video path and vs2_inference.py, transcribed
# ------------------------------------------------------------------------------------------------
def _smart_nframes(fps, total_frames, video_fps):
    min_frames = math.ceil(4 / 2) * 2
    max_frames = math.floor(min(768, total_frames) / 2) * 2
    nframes = total_frames / video_fps * fps
    nframes = min(min(max(nframes, min_frames), max_frames), total_frames)
    return math.floor(nframes / 2) * 2


def _fetch_video(frames_tchw_uint8, video_fps, fps=2.0):
    from torchvision import transforms
    from torchvision.transforms import InterpolationMode

    total_frames = frames_tchw_uint8.shape[0]
    nframes = _smart_nframes(fps, total_frames, video_fps)
    idx = torch.linspace(0, total_frames - 1, nframes).round().long().tolist()
    video = frames_tchw_uint8[idx]
    nframes, _, height, width = video.shape
    min_pixels = 128 * 28 * 28
    total_pixels = int(float(128000 * 28 * 28 * 0.9))
    max_pixels = max(min(768 * 28 * 28, total_pixels / nframes * 2), int(min_pixels * 1.05))
    rh, rw = smart_resize(height, width, factor=28, min_pixels=min_pixels, max_pixels=max_pixels)
    return transforms.functional.resize(video, [rh, rw], interpolation=InterpolationMode.BICUBIC,
                                        antialias=True).float()


def _ll_based_soft_score_normed(hard_val, token_idx, scores, tokenizer):
    if hard_val is None or token_idx < 0:
        return None
    logits = scores[token_idx][0]
    score_probs = []
    for s in range(1, 6):
        ids = tokenizer.encode(str(s), add_special_tokens=False)
        if len(ids) == 1:
            prob = float(np.exp(torch.log_softmax(logits, dim=-1)[ids[0]].item()))
            score_probs.append((s, prob))
    scores_list, probs_list = zip(*score_probs)
    total_prob, max_prob = sum(probs_list), max(probs_list)
    best_score = scores_list[probs_list.index(max_prob)]
    return round(best_score * (max_prob / total_prob if total_prob > 0 else 0), 4)


def _find_score_token_index_by_prompt(prompt_text, tokenizer, gen_ids):
    gen_str = tokenizer.decode(gen_ids, skip_special_tokens=False)
    match = re.search(r"(?:\(\d+\)\s*|\n\s*)?" + re.escape(prompt_text), gen_str, flags=re.IGNORECASE)
    if not match:
        return -1
    num_match = re.search(r"\d", gen_str[match.end():])
    if not num_match:
        return -1
    target_substr = gen_str[:match.end() + num_match.start() + 1]
    for i in range(len(gen_ids)):
        if tokenizer.decode(gen_ids[:i + 1], skip_special_tokens=False) == target_substr:
            return i
    return -1


def _vs2_main(folder, frames_uint8, video_fps, t2v_prompt):
    """vs2_inference.main up to the generation (float32 on CPU; the file decoded to frames beforehand)."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    user_prompt = VS2_QUERY_TEMPLATE.substitute(t2v_prompt=t2v_prompt)
    infer_fps, temperature = 2.0, 0.7
    model = AutoModelForImageTextToText.from_pretrained(folder).eval()
    processor = AutoProcessor.from_pretrained(folder)
    messages = [{"role": "user", "content": [{"type": "video", "video": "clip.mp4", "fps": infer_fps},
                                             {"type": "text", "text": user_prompt}]}]
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    video_inputs = [_fetch_video(frames_uint8, video_fps, infer_fps)]
    inputs = processor(text=[text], images=None, videos=video_inputs, fps=infer_fps, padding=True, return_tensors="pt")
    torch.manual_seed(SEED)
    with torch.no_grad():
        gen_out = model.generate(**inputs, max_new_tokens=GEN_TOKENS, output_scores=True, return_dict_in_generate=True,
                                 do_sample=True, temperature=temperature)
    return inputs, gen_out, processor.tokenizer


# ------------------------------------------------------------------------------------------------
# fixtures
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def vs2_dir(tmp_path_factory):
    from transformers import AutoProcessor, Qwen2_5_VLProcessor

    from mmreward.testing.qwen_vl import build_tiny_qwen_vl

    path = tmp_path_factory.mktemp("vs2_qwen25")
    build_tiny_qwen_vl(path, variant="qwen2_5_vl", seed=21, max_pixels=16384 * 28 * 28)
    # VideoScore2 ships Qwen2.5-VL's processor (its videos carry second_per_grid_ts)
    p = AutoProcessor.from_pretrained(path)
    Qwen2_5_VLProcessor(image_processor=p.image_processor, tokenizer=p.tokenizer, video_processor=p.video_processor,
                        chat_template=p.chat_template).save_pretrained(str(path))
    return path


def _clip():
    rng = np.random.default_rng(5)
    frames = np.kron(rng.random((20, 7, 9, 3)), np.ones((1, 8, 8, 1)))[:, :50, :66]  # 20 frames, 50x66
    return torch.from_numpy((frames * 255).astype(np.uint8)).permute(0, 3, 1, 2).contiguous()


# the checkpoint's generation_config decides the sampling warpers both sides apply: the library defaults (top-k 50,
# which leaves the random model's digits out), temperature alone, and top-p with a repetition penalty
GENERATION_CONFIGS = [{}, {"top_k": 0}, {"top_k": 0, "top_p": 0.99999, "repetition_penalty": 1.05}]


@pytest.mark.parametrize("generation", GENERATION_CONFIGS)
def test_videoscore2_request_sampling_and_soft_scores_are_vs2_inference(vs2_dir, tmp_path, generation):
    import json
    import shutil

    folder = tmp_path / "vs2"
    shutil.copytree(vs2_dir, folder)
    config = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**config, **generation}))
    vs2_dir = folder
    clip_u8, video_fps, prompt = _clip(), 8.0, "a paper boat drifting down a gutter"
    judge = mmreward.load("videoscore2", checkpoint=str(vs2_dir), max_new_tokens=GEN_TOKENS, seed=SEED)
    backend = judge.backend
    calls = spy_on_generate(judge)
    out = judge.score([prompt], (clip_u8.float() / 255)[None], fps=video_fps)
    ref_inputs, ref_out, tok = _vs2_main(vs2_dir, clip_u8, video_fps, prompt)

    ((kwargs, _),) = calls
    assert kwargs["input_ids"].tolist() == ref_inputs["input_ids"].tolist(), "prompt tokens differ"
    assert kwargs["video_grid_thw"].tolist() == ref_inputs["video_grid_thw"].tolist(), "frames or frame size differ"
    if "second_per_grid_ts" in ref_inputs:
        assert torch.as_tensor(kwargs["second_per_grid_ts"]).tolist() == torch.as_tensor(
            ref_inputs["second_per_grid_ts"]).tolist()
    cases = ("video: 20 frames at 8 fps -> 4 frames, 50x66 -> 280x392",)
    record_parity("videoscore2", original=f"{VS2} video pixels", how="transcribed",
                  actual=kwargs["pixel_values_videos"], expected=ref_inputs["pixel_values_videos"], cases=cases,
                  not_checked="decoding the file (decord/PyAV give both sides the same frames); bf16 on CUDA; "
                  "answers of real weights (random weights write no answer: the soft value is compared at every "
                  "step, the token index and regex on canned answers)")
    assert_close_scaled(kwargs["pixel_values_videos"], ref_inputs["pixel_values_videos"], rel=1e-6)
    n_in = ref_inputs["input_ids"].shape[1]
    ref_ids = ref_out.sequences[0, n_in:].tolist()

    # the sampled tokens and, at every step, the value ll_based_soft_score_normed would read there
    texts, ids, probs = backend.generate_with_choice_probs(
        judge._requests(judge._pointwise_for("video"), [prompt], [[judge.prepare((clip_u8.float() / 255)[None],
                                                                                 fps=video_fps)[0]]], "video"),
        ["1", "2", "3", "4", "5"], temperature=0.7, seed=SEED, max_new_tokens=GEN_TOKENS)
    assert ids[0] == ref_ids, "sampled generations differ"
    assert out.rationales[0] == texts[0]
    ours = probs[0].max(dim=1)
    ours_soft = (ours.indices + 1).double() * ours.values.double()
    ref_soft = torch.tensor([_ll_based_soft_score_normed(1, k, ref_out.scores, tok) for k in range(len(ref_ids))],
                            dtype=torch.float64)
    if generation:  # the digits survive these warpers: the values compared are not all zero
        assert float(ref_soft.abs().max()) > 0
    record_parity("videoscore2", original=f"{VS2} ll_based_soft_score_normed at each step", how="transcribed",
                  actual=ours_soft, expected=ref_soft, cases=(*cases, f"generation_config {generation or 'defaults'}"))
    assert_close_scaled(ours_soft, ref_soft, rel=1e-3)  # the original rounds to 4 decimals


CANNED = [
    "visual quality: 4;\ntext-to-video alignment: 3,\nphysical/common-sense consistency: 5",
    "The clip is smooth but the boat melts.\n(1) visual quality: 3; (2) text-to-video alignment: 4, "
    "(3) physical/common-sense consistency: 2",
]


@pytest.mark.parametrize("answer", CANNED)
def test_videoscore2_reads_the_digit_vs2_inference_reads(vs2_dir, answer):
    from transformers import AutoProcessor

    from mmreward.judges.parsers import parse_dimensions

    tok = AutoProcessor.from_pretrained(vs2_dir).tokenizer
    judge = mmreward.load("videoscore2", checkpoint=str(vs2_dir), max_new_tokens=GEN_TOKENS)
    gen_ids = tok.encode(answer, add_special_tokens=False)
    pattern = r"visual quality:\s*(\d+).*?text-to-video alignment:\s*(\d+).*?physical/common-sense consistency:\s*(\d+)"
    match = re.search(pattern, answer, re.DOTALL | re.IGNORECASE)
    labels = ("visual quality", "text-to-video alignment", "physical/common-sense consistency")
    parsed = parse_dimensions(tok.decode(gen_ids, skip_special_tokens=True), labels, 1, 5)
    for k, label in enumerate(labels):
        assert parsed.values[label] == int(match.group(k + 1))
        ref_idx = _find_score_token_index_by_prompt(label + ":", tok, gen_ids)
        assert ref_idx >= 0
        assert judge.backend.token_index_at(gen_ids, parsed.positions[label]) == ref_idx, label
