"""HPSv3, VideoReward (VideoAlign) and EditReward against their originals' code paths, on tiny random
Qwen2-VL / Qwen2.5-VL checkpoints written in the official layouts and loaded through our real loaders.

Each reference is transcribed from the original (repo@commit in its docstring) and builds its inputs the
original's way: its own `fetch_image` / `fetch_video` (Pillow's `convert("RGB")` and bicubic resize of 8-bit
images; `smart_nframes` frame counts and torchvision's resize of uint8 frames), its own processor call
(`do_rescale` on 8-bit values), then its forward: token embeddings, visual features scattered in, the decoder
called with `inputs_embeds` and no position ids (plain sequential positions), the head on the reward tokens.
Nothing here imports our preprocessing (`mmreward.backbones.qwen_vl`, `mmreward.media`).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

import mmreward
from tests._helpers.parity_record import record_parity
from tests._helpers.tolerances import assert_close_scaled
from tests._helpers.vlm_parity import IMAGE_SPECS, write_image_files

pytest.importorskip("transformers")
pytest.importorskip("torchvision")
Image = pytest.importorskip("PIL.Image")

pytestmark = pytest.mark.parity

# float32 through the same weights in a different but equivalent order (batched vision tower, padding):
# the measured differences are ~1e-7 of the scores' magnitude; a wrong position, resize or frame count
# moves them by 1e-3 or more (see each test's failure on the M-RoPE / float-resize code).
REL = 2e-5
HPSV3_COMMIT = "MizzenAI/HPSv3@d232ff8 (pip hpsv3==1.0.0)"
VIDEOALIGN_COMMIT = "KwaiVGI/VideoAlign@219ab9d"
EDITREWARD_COMMIT = "TIGER-AI-Lab/EditReward@edb027e"
IMAGE_CASES = ("RGB", "grayscale", "odd size", "RGBA")


# ------------------------------------------------------------------------------------------------
# the originals' helpers, transcribed (qwen_vl_utils vision_process.py as vendored by each repository)
# ------------------------------------------------------------------------------------------------
def _round_by_factor(number, factor):
    return round(number / factor) * factor


def _ceil_by_factor(number, factor):
    return math.ceil(number / factor) * factor


def _floor_by_factor(number, factor):
    return math.floor(number / factor) * factor


def _smart_resize(height, width, factor=28, min_pixels=4 * 28 * 28, max_pixels=16384 * 28 * 28):
    h_bar = max(factor, _round_by_factor(height, factor))
    w_bar = max(factor, _round_by_factor(width, factor))
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = _floor_by_factor(height / beta, factor)
        w_bar = _floor_by_factor(width / beta, factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = _ceil_by_factor(height * beta, factor)
        w_bar = _ceil_by_factor(width * beta, factor)
    return h_bar, w_bar


def _fetch_image(path, min_pixels, max_pixels):
    """hpsv3/dataset/utils.py and EditReward/dataset/utils.py `fetch_image` for a path."""
    image = Image.open(path).convert("RGB")
    width, height = image.size
    resized_height, resized_width = _smart_resize(height, width, min_pixels=min_pixels, max_pixels=max_pixels)
    return image.resize((resized_width, resized_height), Image.BICUBIC)


def _smart_nframes(ele, total_frames, video_fps):
    """VideoAlign vision_process.py `smart_nframes` (FRAME_FACTOR 2, FPS_MIN_FRAMES 4, FPS_MAX_FRAMES 768)."""
    if "nframes" in ele:
        nframes = _round_by_factor(ele["nframes"], 2)
    else:
        fps = ele.get("fps", 2.0)
        min_frames = _ceil_by_factor(ele.get("min_frames", 4), 2)
        max_frames = _floor_by_factor(ele.get("max_frames", min(768, total_frames)), 2)
        nframes = total_frames / video_fps * fps
        nframes = min(max(nframes, min_frames), max_frames)
        nframes = _round_by_factor(nframes, 2)
    if nframes > total_frames:
        nframes = total_frames
    assert 2 <= nframes <= total_frames
    return nframes


def _fetch_video(frames_tchw_uint8, video_fps, ele):
    """VideoAlign vision_process.py `_read_video_decord` ('uniform') after decoding, then `fetch_video`."""
    from torchvision import transforms
    from torchvision.transforms import InterpolationMode

    total_frames = frames_tchw_uint8.shape[0]
    nframes = _smart_nframes(ele, total_frames=total_frames, video_fps=video_fps)
    idx = torch.linspace(0, total_frames - 1, nframes).round().long().tolist()
    video = frames_tchw_uint8[idx]
    nframes, _, height, width = video.shape
    min_pixels = ele.get("min_pixels", 128 * 28 * 28)
    total_pixels = ele.get("total_pixels", 24576 * 28 * 28)
    max_pixels = max(min(768 * 28 * 28, total_pixels / nframes * 2), int(min_pixels * 1.05))
    max_pixels = ele.get("max_pixels", max_pixels)
    resized_height, resized_width = _smart_resize(height, width, factor=28, min_pixels=min_pixels, max_pixels=max_pixels)
    return transforms.functional.resize(video, [resized_height, resized_width],
                                        interpolation=InterpolationMode.BICUBIC, antialias=True).float()


def _ranknet_head(hidden, seed):
    """The 'ranknet' head of HPSv3 / EditReward (Linear 1024, ReLU, Dropout, Linear 16, ReLU, Linear 2)."""
    torch.manual_seed(seed)
    head = nn.Sequential(nn.Linear(hidden, 1024), nn.ReLU(), nn.Dropout(0.05), nn.Linear(1024, 16), nn.ReLU(),
                         nn.Linear(16, 2))
    with torch.no_grad():  # larger weights so that the scores spread visibly on a random backbone
        for layer in (head[0], head[3], head[5]):
            layer.weight.mul_(4.0)
    return head.eval()


def _visual_embeds(visual, pixel_values, grid_thw):
    out = visual(pixel_values.type(visual.dtype), grid_thw=grid_thw)
    return getattr(out, "pooler_output", out)  # transformers >= 5 wraps the merged features


def _scatter_visual(vlm, batch):
    """`inputs_embeds = embed_tokens(input_ids)`, then the visual features masked_scatter-ed in."""
    input_ids = batch["input_ids"]
    inputs_embeds = vlm.get_input_embeddings()(input_ids)
    for key, grid, token in (("pixel_values", "image_grid_thw", vlm.config.image_token_id),
                             ("pixel_values_videos", "video_grid_thw", vlm.config.video_token_id)):
        if batch.get(key) is not None:
            embeds = _visual_embeds(vlm.model.visual, batch[key], batch[grid])
            mask = (input_ids == token).unsqueeze(-1).expand_as(inputs_embeds)
            inputs_embeds = inputs_embeds.masked_scatter(mask, embeds.to(inputs_embeds.device, inputs_embeds.dtype))
    return inputs_embeds


def _decoder_445(vlm, batch):
    """transformers 4.45.2 (HPSv3, VideoAlign): `self.model(input_ids=None, position_ids=None, inputs_embeds=...)`,
    where `self.model` is the text decoder, which numbers the tokens with arange."""
    embeds = _scatter_visual(vlm, batch)
    return vlm.model.language_model(inputs_embeds=embeds, attention_mask=batch["attention_mask"]).last_hidden_state


def _decoder_457(vlm, batch):
    """transformers 4.57.0 (EditReward): `self.model` is Qwen2_5_VLModel; with input_ids=None its `get_rope_index`
    takes the branch without vision grids: positions = attention_mask.cumsum(-1) - 1, padding set to 1."""
    embeds = _scatter_visual(vlm, batch)
    mask = batch["attention_mask"]
    pos = mask.long().cumsum(-1) - 1
    pos = pos.masked_fill(mask == 0, 1).unsqueeze(0).expand(3, -1, -1)
    return vlm.model.language_model(inputs_embeds=embeds, attention_mask=mask, position_ids=pos).last_hidden_state


def _special_pool(logits, input_ids, token_ids, n_tokens):
    mask = torch.zeros_like(input_ids, dtype=torch.bool)
    for t in token_ids:
        mask = mask | (input_ids == t)
    return logits[mask, ...].view(input_ids.shape[0], n_tokens, -1)


def _to_legacy(sd):
    """Current transformers keys -> the 4.x names the HPSv3 / VideoReward checkpoints were saved with."""
    out = {}
    for k, v in sd.items():
        if k.startswith("model.visual."):
            k = "visual." + k[len("model.visual."):]
        elif k.startswith("model.language_model."):
            k = "model." + k[len("model.language_model."):]
        out[k] = v.contiguous()
    return out


def _base(tmp_path_factory, variant, seed):
    from mmreward.testing.qwen_vl import build_tiny_qwen_vl

    path = tmp_path_factory.mktemp(variant)
    # the real processors' bounds (min 56*56, max 28*28*1280): their own resize leaves the originals' sizes alone
    build_tiny_qwen_vl(path, variant=variant, seed=seed, max_pixels=28 * 28 * 1280)
    return path


def _vlm_with_tokens(folder, tokens, seed):
    """The original's `create_model_and_processor`: special tokens added, embeddings resized (new rows random)."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    proc = AutoProcessor.from_pretrained(folder, padding_side="right")
    proc.tokenizer.add_special_tokens({"additional_special_tokens": list(tokens)})
    vlm = AutoModelForImageTextToText.from_pretrained(folder).eval()
    vlm.resize_token_embeddings(len(proc.tokenizer), mean_resizing=False)
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed)
        emb = vlm.get_input_embeddings().weight
        emb[-len(tokens):] = torch.randn(len(tokens), emb.shape[1], generator=g)
    return vlm, proc


def _image_files(tmp_path, seed):
    """RGB, grayscale, odd-size RGB and RGBA PNGs (what users hand the originals as paths)."""
    return write_image_files(tmp_path, IMAGE_SPECS, seed=seed, sine_red=True)


@pytest.fixture(scope="module")
def qwen2vl_dir(tmp_path_factory):
    return _base(tmp_path_factory, "qwen2_vl", seed=11)


@pytest.fixture(scope="module")
def qwen25vl_dir(tmp_path_factory):
    return _base(tmp_path_factory, "qwen2_5_vl", seed=12)


# ------------------------------------------------------------------------------------------------
# HPSv3
# ------------------------------------------------------------------------------------------------
def test_hpsv3_matches_the_original_forward(qwen2vl_dir, tmp_path):
    """Reference: MizzenAI/HPSv3@d232ff8 (= pip hpsv3==1.0.0): hpsv3/inference.py `HPSv3RewardInferencer.
    prepare_batch` (min = max = 256*28*28, INSTRUCTION + prompt_with_special_token, chat template with the
    generation prompt, processor with do_rescale), hpsv3/dataset/utils.py `fetch_image` (convert('RGB'), Pillow
    bicubic), hpsv3/model/qwen2vl_trainer.py `Qwen2VLRewardModelBT.forward` (embeds, visual masked_scatter,
    decoder with input_ids=None / position_ids=None, fp32 rm_head on the <|Reward|> token; score = mu)."""
    from safetensors.torch import save_file

    from mmreward.prompt_templates.vlm import HPSV3_INSTRUCTION, HPSV3_SUFFIX

    vlm, proc = _vlm_with_tokens(qwen2vl_dir, ["<|Reward|>"], seed=21)
    head = _ranknet_head(vlm.config.text_config.hidden_size, seed=22)
    sd = _to_legacy(vlm.state_dict())
    sd.update({f"rm_head.{k}": v.contiguous() for k, v in head.state_dict().items()})
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    save_file(sd, str(ckpt / "HPSv3.safetensors"))

    paths = _image_files(tmp_path, seed=23)
    prompts = ["a cat", "a dog in the rain", "two red apples on a table", "a city at night"]

    # the original: one padded batch of the four items
    pixels = 256 * 28 * 28
    messages = [[{"role": "user", "content": [
        {"type": "image", "image": p, "min_pixels": pixels, "max_pixels": pixels},
        {"type": "text", "text": HPSV3_INSTRUCTION.format(text_prompt=t) + HPSV3_SUFFIX}]}]
        for t, p in zip(prompts, paths)]
    images = [_fetch_image(p, pixels, pixels) for p in paths]
    batch = proc(text=proc.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                 images=images, padding=True, return_tensors="pt", videos_kwargs={"do_rescale": True})
    with torch.no_grad():
        hidden = _decoder_445(vlm, batch)
        logits = head(hidden.float())
    reward_id = proc.tokenizer.convert_tokens_to_ids("<|Reward|>")
    expected = _special_pool(logits, batch["input_ids"], [reward_id], 1)[:, 0]  # (B, 2): mu, sigma

    reward = mmreward.load("hpsv3", checkpoint=str(ckpt), base_model=str(qwen2vl_dir))
    out = reward.score(prompts, paths)
    got = torch.stack([out.scores, out.details["sigma"]], dim=1)
    max_abs, max_rel = record_parity("hpsv3", original=HPSV3_COMMIT, how="transcribed", actual=got, expected=expected,
                                     cases=IMAGE_CASES, not_checked="bf16 on GPU (the original runs bf16; "
                                     "both keep the head in fp32); the pip package itself (pins transformers 4.45.2)")
    assert float(expected[:, 0].max() - expected[:, 0].min()) > 1e-3, "the tiny model must tell the items apart"
    assert_close_scaled(got, expected, rel=REL, msg=lambda m: f"{m}\nmax abs {max_abs:.3g}, rel {max_rel:.3g}")


# ------------------------------------------------------------------------------------------------
# VideoReward (VideoAlign)
# ------------------------------------------------------------------------------------------------
def test_videoalign_matches_the_original_forward(qwen2vl_dir, tmp_path):
    """Reference: KwaiVGI/VideoAlign@219ab9d: inference.py `VideoVLMRewardInference.prepare_batch` / `reward`
    (fps from the data config, max_frame_pixels, 'detailed_special' prompt, processor with do_rescale, z-scores
    with inference_config, Overall = VQ + MQ + TA), vision_process.py `smart_nframes` (frame count rounded to the
    nearest even number) and `fetch_video` (min_pixels 128*28*28, torchvision bicubic on uint8 frames),
    trainer.py `Qwen2VLRewardModelBT.forward` (decoder with input_ids=None / position_ids=None, bias-free
    rm_head in the model's dtype, the diagonal of the three reward tokens' outputs)."""
    from mmreward.models.vlm_heads import write_videoalign_config
    from mmreward.prompt_templates.vlm import VIDEOALIGN_PROMPT

    tokens = ["<|VQ_reward|>", "<|MQ_reward|>", "<|TA_reward|>"]
    vlm, proc = _vlm_with_tokens(qwen2vl_dir, tokens, seed=31)
    hidden_size = vlm.config.text_config.hidden_size
    torch.manual_seed(32)
    rm_head = nn.Linear(hidden_size, 3, bias=False)
    stats = {"VQ_mean": 0.1, "VQ_std": 2.0, "MQ_mean": -0.3, "MQ_std": 0.5, "TA_mean": 0.0, "TA_std": 4.0}
    max_frame_pixels = 112 * 112
    write_videoalign_config(tmp_path, str(qwen2vl_dir), stats, max_frame_pixels=max_frame_pixels)
    step = tmp_path / "checkpoint-5"
    step.mkdir()
    sd = _to_legacy(vlm.state_dict())
    sd["rm_head.weight"] = rm_head.weight.detach().clone()
    torch.save(sd, step / "model.pth")

    # decoded clips at 8 fps: 22 frames -> 5.5 -> 6 sampled, 30 frames -> 7.5 -> 8 (round half to even)
    g = torch.Generator().manual_seed(33)
    clips = [(torch.rand(n, 3, 120, 160, generator=g) * 255).round().to(torch.uint8) for n in (22, 30, 30, 22)]
    video_fps = 8.0
    prompts = ["a running horse", "waves on a beach", "a car turning left", "smoke rising"]

    ele = {"type": "video", "max_pixels": max_frame_pixels, "fps": 2.0, "sample_type": "uniform"}
    videos = [_fetch_video(c, video_fps, ele) for c in clips]
    assert [v.shape[0] for v in videos] == [6, 8, 8, 6]
    chat = [[{"role": "user", "content": [{**ele, "video": f"clip{i}.mp4"},
                                          {"type": "text", "text": VIDEOALIGN_PROMPT.format(text_prompt=t)}]}]
            for i, t in enumerate(prompts)]
    batch = proc(text=proc.apply_chat_template(chat, tokenize=False, add_generation_prompt=True), videos=videos,
                 padding=True, return_tensors="pt", videos_kwargs={"do_rescale": True})
    with torch.no_grad():
        hidden = _decoder_445(vlm, batch)
        logits = rm_head(hidden)
    ids = proc.tokenizer.convert_tokens_to_ids(tokens)
    raw = _special_pool(logits, batch["input_ids"], ids, 3).diagonal(dim1=1, dim2=2)  # (B, 3): VQ, MQ, TA
    mean = torch.tensor([stats["VQ_mean"], stats["MQ_mean"], stats["TA_mean"]])
    std = torch.tensor([stats["VQ_std"], stats["MQ_std"], stats["TA_std"]])
    z = (raw - mean) / std
    expected = torch.cat([z, z.sum(dim=1, keepdim=True)], dim=1)

    reward = mmreward.load("videoalign", checkpoint=str(tmp_path))
    # a clip tensor carries no frame rate: fps= says it, as the file's header tells the original's reader
    out = reward.score(prompts, [c.permute(0, 2, 3, 1).numpy() for c in clips], fps=video_fps)
    got = torch.stack([out.details["VQ"], out.details["MQ"], out.details["TA"], out.scores], dim=1)
    max_abs, max_rel = record_parity("videoalign", original=VIDEOALIGN_COMMIT, how="transcribed", actual=got,
                                     expected=expected, cases=("RGB video 22 frames", "RGB video 30 frames"),
                                     not_checked="decoding a file (decord/PyAV give the frames both sides start "
                                     "from); bf16 on GPU; the LoRA checkpoint layout (tests/mmreward/test_vlm_models.py)")
    assert float(expected[:, 3].max() - expected[:, 3].min()) > 1e-3
    assert_close_scaled(got, expected, rel=REL, msg=lambda m: f"{m}\nmax abs {max_abs:.3g}, rel {max_rel:.3g}")


# ------------------------------------------------------------------------------------------------
# EditReward
# ------------------------------------------------------------------------------------------------
def test_editreward_matches_the_original_forward(qwen25vl_dir, tmp_path):
    """Reference: TIGER-AI-Lab/EditReward@edb027e: EditReward/inference_edit.py `EditRewardInferencer.prepare_batch`
    (source then edited image, min = max = 256*28*28, INSTRUCTION_EDIT_FOLLOWING / _QUALITY + the special-token
    suffix, one batch per head, processor with do_rescale), EditReward/dataset/utils.py `fetch_image`,
    EditReward/model/qwen2_5_vl_trainer.py `Qwen2_5_VLRewardModelBT_MultiHead` ('ranknet_multi_head':
    `_run_single_batch_through_model_and_head` with input_ids=None / position_ids=None under transformers 4.57,
    fp32 heads on <|Reward|>, pooling_strategy 'mean' of the two heads; the score is the pooled mu)."""
    from safetensors.torch import save_file

    from mmreward.prompt_templates.edit import EDITREWARD_FOLLOWING, EDITREWARD_QUALITY, EDITREWARD_SUFFIX

    vlm, proc = _vlm_with_tokens(qwen25vl_dir, ["<|Reward|>"], seed=41)
    hidden_size = vlm.config.text_config.hidden_size
    heads = {f"head_{i}": _ranknet_head(hidden_size, seed=42 + i) for i in range(2)}
    sd = {k: v.contiguous() for k, v in vlm.state_dict().items()}  # saved with 4.57: current key names
    for name, head in heads.items():
        sd.update({f"rm_heads.{name}.{k}": v.contiguous() for k, v in head.state_dict().items()})
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    save_file(sd, str(ckpt / "model.safetensors"))

    edited = _image_files(tmp_path, seed=43)
    src_dir = tmp_path / "src"
    src_dir.mkdir()
    sources = _image_files(src_dir, seed=44)[::-1]  # each edit's source differs in size and mode
    prompts = ["make the sky red", "add a hat", "remove the car", "turn it into a painting"]

    pixels = 256 * 28 * 28
    reward_id = proc.tokenizer.convert_tokens_to_ids("<|Reward|>")
    per_head = []
    for i, template in enumerate((EDITREWARD_FOLLOWING, EDITREWARD_QUALITY)):
        messages = [[{"role": "user", "content": [
            {"type": "image", "image": s, "min_pixels": pixels, "max_pixels": pixels},
            {"type": "image", "image": e, "min_pixels": pixels, "max_pixels": pixels},
            {"type": "text", "text": template.format(text_prompt=t) + EDITREWARD_SUFFIX}]}]
            for t, s, e in zip(prompts, sources, edited)]
        images = [_fetch_image(p, pixels, pixels) for pair in zip(sources, edited) for p in pair]
        batch = proc(text=proc.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                     images=images, padding=True, return_tensors="pt", videos_kwargs={"do_rescale": True})
        with torch.no_grad():
            logits = heads[f"head_{i}"](_decoder_457(vlm, batch).float())
        per_head.append(_special_pool(logits, batch["input_ids"], [reward_id], 1)[:, 0])
    pooled = torch.stack(per_head).mean(dim=0)
    expected = torch.stack([pooled[:, 0], pooled[:, 1], per_head[0][:, 0], per_head[1][:, 0]], dim=1)

    reward = mmreward.load("editreward", checkpoint=str(ckpt), base_model=str(qwen25vl_dir))
    out = reward.score(prompts, edited, metadata=[{"source_image": s} for s in sources])
    got = torch.stack([out.scores, out.details["uncertainty"], out.details["instruction_following"],
                       out.details["visual_quality"]], dim=1)
    max_abs, max_rel = record_parity("editreward", original=EDITREWARD_COMMIT, how="transcribed", actual=got,
                                     expected=expected, cases=IMAGE_CASES,
                                     not_checked="bf16 on GPU (the original runs bf16, heads in fp32)")
    assert float(expected[:, 0].max() - expected[:, 0].min()) > 1e-3
    assert_close_scaled(got, expected, rel=REL, msg=lambda m: f"{m}\nmax abs {max_abs:.3g}, rel {max_rel:.3g}")


# ------------------------------------------------------------------------------------------------
# the pieces, each against the original's own implementation
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("total", "video_fps"), [(22, 8.0), (30, 8.0), (81, 16.0), (17, 4.0), (9, 16.0), (3, 8.0),
                                                  (2000, 24.0), (45, 30.0)])
def test_qwen_vl_frame_count_matches_smart_nframes(total, video_fps):
    """VideoAlign vision_process.py `smart_nframes` + uniform indices (KwaiVGI/VideoAlign@219ab9d)."""
    from mmreward.media import sample_frame_indices

    n = _smart_nframes({"fps": 2.0}, total, video_fps)
    expected = torch.linspace(0, total - 1, n).round().long().tolist()
    assert sample_frame_indices(total, fps=2.0, source_fps=video_fps, sampling="qwen-vl") == expected


@pytest.mark.parametrize(("size", "target"), [((64, 80), (448, 448)), ((37, 61), (448, 448)), ((600, 500), (336, 280)),
                                               ((448, 448), (448, 448))])
def test_pillow_resize_is_bit_exact(size, target):
    """Our batched 8-bit bicubic against Pillow's own `Image.resize(..., BICUBIC)`."""
    from mmreward.backbones.qwen_vl import pillow_bicubic

    arr = np.random.default_rng(5).integers(0, 256, (*size, 3), dtype=np.uint8)
    expected = np.asarray(Image.fromarray(arr).resize(target[::-1], Image.BICUBIC))
    x255 = torch.from_numpy(arr).permute(2, 0, 1).float()[None]
    got = pillow_bicubic(x255, *target)[0].permute(1, 2, 0).numpy()
    assert np.array_equal(got, expected.astype(np.float32))
