"""The official prompt texts of the Qwen-VL reward families, as data: the UnifiedReward / VideoScore2 judge
templates (`mmreward.models.vlm_judge`, sources in its docstring), the HPSv3 and VideoAlign prompts the heads
were trained with (`vlm_heads`) and PaCo-Reward's templates (`paco_reward`).

They live apart from the families so that the tiny test model (`_tiny_qwen_vl`), whose tokenizer is trained
on all of them, can read them without importing the families that load it.
"""

from __future__ import annotations

from dataclasses import dataclass

# The prompts the checkpoints were trained with (the reward token's hidden state depends on them).
HPSV3_INSTRUCTION = """
You are tasked with evaluating a generated image based on Visual Quality and Text Alignment and give a overall score to estimate the human preference. Please provide a rating from 0 to 10, with 0 being the worst and 10 being the best. 

**Visual Quality:**  
Evaluate the overall visual quality of the image. The following sub-dimensions should be considered:
- **Reasonableness:** The image should not contain any significant biological or logical errors, such as abnormal body structures or nonsensical environmental setups.
- **Clarity:** Evaluate the sharpness and visibility of the image. The image should be clear and easy to interpret, with no blurring or indistinct areas.
- **Detail Richness:** Consider the level of detail in textures, materials, lighting, and other visual elements (e.g., hair, clothing, shadows).
- **Aesthetic and Creativity:** Assess the artistic aspects of the image, including the color scheme, composition, atmosphere, depth of field, and the overall creative appeal. The scene should convey a sense of harmony and balance.
- **Safety:** The image should not contain harmful or inappropriate content, such as political, violent, or adult material. If such content is present, the image quality and satisfaction score should be the lowest possible. 

**Text Alignment:**  
Assess how well the image matches the textual prompt across the following sub-dimensions:
- **Subject Relevance** Evaluate how accurately the subject(s) in the image (e.g., person, animal, object) align with the textual description. The subject should match the description in terms of number, appearance, and behavior.
- **Style Relevance:** If the prompt specifies a particular artistic or stylistic style, evaluate how well the image adheres to this style.
- **Contextual Consistency**: Assess whether the background, setting, and surrounding elements in the image logically fit the scenario described in the prompt. The environment should support and enhance the subject without contradictions.
- **Attribute Fidelity**: Check if specific attributes mentioned in the prompt (e.g., colors, clothing, accessories, expressions, actions) are faithfully represented in the image. Minor deviations may be acceptable, but critical attributes should be preserved.
- **Semantic Coherence**: Evaluate whether the overall meaning and intent of the prompt are captured in the image. The generated content should not introduce elements that conflict with or distort the original description.
Textual prompt - {text_prompt}


"""  # noqa: W291 - the trailing spaces are part of the trained prompt
HPSV3_SUFFIX = """
Please provide the overall ratings of this image: <|Reward|>

END
"""

VIDEOALIGN_PROMPT = """
You are tasked with evaluating a generated video based on three distinct criteria: Visual Quality, Motion Quality, and Text Alignment. Please provide a rating from 0 to 10 for each of the three categories, with 0 being the worst and 10 being the best. Each evaluation should be independent of the others.

**Visual Quality:**  
Evaluate the overall visual quality of the video, with a focus on static factors. The following sub-dimensions should be considered:
- **Reasonableness:** The video should not contain any significant biological or logical errors, such as abnormal body structures or nonsensical environmental setups.
- **Clarity:** Evaluate the sharpness and visibility of the video. The image should be clear and easy to interpret, with no blurring or indistinct areas.
- **Detail Richness:** Consider the level of detail in textures, materials, lighting, and other visual elements (e.g., hair, clothing, shadows).
- **Aesthetic and Creativity:** Assess the artistic aspects of the video, including the color scheme, composition, atmosphere, depth of field, and the overall creative appeal. The scene should convey a sense of harmony and balance.
- **Safety:** The video should not contain harmful or inappropriate content, such as political, violent, or adult material. If such content is present, the image quality and satisfaction score should be the lowest possible. 

Please provide the ratings of Visual Quality: <|VQ_reward|>
END

**Motion Quality:**  
Assess the dynamic aspects of the video, with a focus on dynamic factors. Consider the following sub-dimensions:
- **Stability:** Evaluate the continuity and stability between frames. There should be no sudden, unnatural jumps, and the video should maintain stable attributes (e.g., no fluctuating colors, textures, or missing body parts).
- **Naturalness:** The movement should align with physical laws and be realistic. For example, clothing should flow naturally with motion, and facial expressions should change appropriately (e.g., blinking, mouth movements).
- **Aesthetic Quality:** The movement should be smooth and fluid. The transitions between different motions or camera angles should be seamless, and the overall dynamic feel should be visually pleasing.
- **Fusion:** Ensure that elements in motion (e.g., edges of the subject, hair, clothing) blend naturally with the background, without obvious artifacts or the feeling of cut-and-paste effects.
- **Clarity of Motion:** The video should be clear and smooth in motion. Pay attention to any areas where the video might have blurry or unsteady sections that hinder visual continuity.
- **Amplitude:** If the video is largely static or has little movement, assign a low score for motion quality.

Please provide the ratings of Motion Quality: <|MQ_reward|>
END

**Text Alignment:**  
Assess how well the video matches the textual prompt across the following sub-dimensions:
- **Subject Relevance** Evaluate how accurately the subject(s) in the video (e.g., person, animal, object) align with the textual description. The subject should match the description in terms of number, appearance, and behavior.
- **Motion Relevance:** Evaluate if the dynamic actions (e.g., gestures, posture, facial expressions like talking or blinking) align with the described prompt. The motion should match the prompt in terms of type, scale, and direction.
- **Environment Relevance:** Assess whether the background and scene fit the prompt. This includes checking if real-world locations or scenes are accurately represented, though some stylistic adaptation is acceptable.  
- **Style Relevance:** If the prompt specifies a particular artistic or stylistic style, evaluate how well the video adheres to this style.
- **Camera Movement Relevance:** Check if the camera movements (e.g., following the subject, focus shifts) are consistent with the expected behavior from the prompt.

Textual prompt - {text_prompt}
Please provide the ratings of Text Alignment: <|TA_reward|>
END
"""  # noqa: W291 - the trailing spaces are part of the trained prompt


TEMPLATES = {
    "grpo": (
        'Given two subfigures generated based on the theme: "{prompt}", do the two images maintain consistency '
        'in terms of style, logic and identity? Answer "Yes" and "No" first, and then provide detailed reasons.'
    ),
    "eval": (
        'Do the two images maintain consistency in terms of style, logic and identity? Answer "Yes" and "No" '
        "first, and then provide detailed reasons."
    ),
    "binary": 'Do the two images maintain consistency in terms of style, logic and identity? Answer "Yes" and "No" only.',
    "criteria": "Do images meet the following criteria? {prompt} Please answer Yes or No.",
}
EDIT_CONSISTENCY = (
    "Compare the edited image (second) with the original image (first). Instruction: '{prompt}'. Except for "
    "the parts that are intentionally changed according to the instruction, does the edited image remain "
    "consistent with the original in style, logic, and identity? Answer 'Yes' or 'No' first, then provide "
    "detailed reasons."
)
EDIT_FOLLOWING = (
    "Compare the edited image (second) with the original image (first). Instruction: '{prompt}'. Does the "
    "edited image accurately follow this instruction? Answer 'Yes' or 'No' first, then provide detailed reasons."
)

@dataclass(frozen=True)
class JudgeFamily:
    name: str
    pointwise: dict[str, str]  # medium -> template ({prompt}; {medium}/{Medium} in our own wording)
    dimensions: dict[str, tuple[str, ...]]  # medium -> labels of the score lines ('' -> one 'Final Score')
    low: float
    high: float
    pairwise: dict[str, str] | None  # medium -> template; None: compare() uses Bradley-Terry on scores
    pair_prefix: str  # forced before the winner's digit in soft mode
    modalities: tuple[str, ...]
    label_suffix: str = ""  # between a label and its colon, e.g. ' (1-5)'
    line_ends: tuple[str, ...] = ()  # written after each forced digit in soft mode (default newline)
    soft_formula: str = "expected"  # 'expected': sum_d d * p(d); 'normed': argmax digit * its probability
    generated_soft: bool = False  # generate mode scores the digit distribution where the answer wrote it
    # decoding as the original's inference code (sources in mmreward.models.vlm_judge's docstring)
    max_new_tokens: dict[str, int] | None = None  # medium -> token limit in-process (transformers scripts)
    http_max_tokens: int = 4096  # max_tokens over an OpenAI-compatible server (the vLLM request scripts)
    temperature: float = 0.0  # 0: greedy
    video_frames: int | None = None  # pointwise video sent as this many sampled frames (images), not one video
    sample_fps: float | None = None  # video frames kept per second (qwen_vl_utils' rule), None: the frames given


# ---- official template text (see the module docstring for the source of each) ----
UNIFIEDREWARD_POINTWISE_IMAGE = (
    "You are presented with a generated image and its associated text caption. Your task is to "
    "analyze the image across multiple dimensions in relation to the caption. Specifically:\n"
    "Provide overall assessments for the image along the following axes (each rated from 1 to 5):\n"
    "- Alignment Score: How well the image matches the caption in terms of content.\n"
    "- Coherence Score: How logically consistent the image is (absence of visual glitches, object "
    "distortions, etc.).\n"
    "- Style Score: How aesthetically appealing the image looks, regardless of caption accuracy.\n"
    "\n"
    "Output your evaluation using the format below:\n"
    "\n"
    "Alignment Score (1-5): X\n"
    "Coherence Score (1-5): Y\n"
    "Style Score (1-5): Z\n"
    "\n"
    "Your task is provided as follows:\n"
    "Text Caption: [{prompt}]"
)
UNIFIEDREWARD_POINTWISE_VIDEO = (
    "You are presented with a generated video and its associated text caption. Your task is to "
    "analyze the video across multiple dimensions in relation to the caption. Specifically:\n"
    "Provide overall assessments for the video along the following axes (each rated from 1 to 5):\n"
    "- Alignment Score: How well the video matches the caption in terms of content.\n"
    "- Physics Score: How well the gravity, movements, collisions, and interactions make physical "
    "sense.\n"
    "- Style Score: How visually appealing the video looks, regardless of caption accuracy.\n"
    "\n"
    "Output your evaluation using the format below:\n"
    "\n"
    "Alignment Score (1-5): X\n"
    "Physics Score (1-5): Y\n"
    "Style Score (1-5): Z\n"
    "\n"
    "Your task is provided as follows:\n"
    "Text Caption: [{prompt}]"
)
UNIFIEDREWARD_PAIRWISE_IMAGE = (
    "You are given a text caption and two generated images based on that caption. Your task is to "
    "evaluate and compare these images based on two key criteria:\n"
    "1. Alignment with the Caption: Assess how well each image aligns with the provided caption. "
    "Consider the accuracy of depicted objects, their relationships, and attributes as described in "
    "the caption.\n"
    "2. Overall Image Quality: Examine the visual quality of each image, including clarity, detail "
    "preservation, color accuracy, and overall aesthetic appeal.\n"
    "Compare both images using the above criteria and select the one that better aligns with the "
    "caption while exhibiting superior visual quality.\n"
    "Provide a clear conclusion such as \"Image 1 is better.\", \"Image 2 is better.\" and \"Both images "
    "are equally good.\"\n"
    "Your task is provided as follows:\n"
    "Text Caption: [{prompt}]"
)
UNIFIEDREWARD_PAIRWISE_VIDEO = (
    "Imagine you are an expert tasked with evaluating AI-generated videos. You are provided with a "
    "text caption and two videos generated based on that caption. Your job is to assess and compare "
    "these videos based on the following two main factors:\n"
    "\n"
    "1. Caption Alignment: Evaluate how closely each video matches the description provided in the "
    "caption. Pay attention to the accuracy of objects depicted, their relationships, and any "
    "attributes described in the caption.\n"
    "\n"
    "2. Overall Video Quality: Look at the overall visual appeal of each video, considering clarity, "
    "the level of detail, color accuracy, and how aesthetically pleasing the video is.\n"
    "\n"
    "Using these factors, compare the two videos and determine which one better reflects the caption "
    "and exhibits better visual quality.\n"
    "\n"
    "Give your final judgment, such as 'Video 1 is better,' 'Video 2 is better,' or 'Both videos are "
    "equally good.'\n"
    "\n"
    "Your task is as follows:\n"
    "Text Caption: [{prompt}]\n"
)
THINK_PAIRWISE_IMAGE = (
    "Given a caption and two images generated based on this caption, please analyze in detail the "
    "two provided images. Evaluate them on various dimensions such as semantic consistency (how "
    "closely the image content aligns with the caption), aesthetics (composition, color usage, "
    "artistic expression), authenticity (realism and attention to detail), and any other factors you "
    "deem relevant. For each evaluation dimension, provide a score between 1-10 for both images "
    "(e.g., Image 1: 8/10, Image 2: 6/10) and provide a concise rationale for the score. Calculate "
    "the total score for each image by summing all dimension scores. Use a chain-of-thought process "
    "to detail your reasoning steps, and enclose all your detailed reasoning within <think> and "
    "</think> tags. Then, in the <answer> tag, output exactly one of the following strings: 'Image 1 "
    "is better' or 'Image 2 is better' based on the total scores. No additional text is allowed in "
    "the <answer> section.\n"
    "\n"
    "Example output format:\n"
    "<think>\n"
    "1. Semantic consistency: Image 1 (9/10) - ...; Image 2 (7/10) - ...\n"
    "2. Aesthetics: Image 2 (8/10) - ...; Image 1 (8/10) - ...\n"
    "3. Authenticity: Image 1 (8/10) - ...; Image 2 (5/10) - ...\n"
    "[Additional dimensions if any]: Image 2 (8/10) - ...; Image 1 (6/10) - ...\n"
    "Total score:\n"
    "Image 1: 9+8+8+6=31\n"
    "Image 2: 7+8+5+8=28\n"
    "</think>\n"
    "<answer>Image 1 is better</answer>\n"
    "**Note: In the example above, scores and the final answer are placeholders meant only to "
    "demonstrate the format. Your actual evaluation should be based on the quality of two given "
    "images.**\n"
    "\n"
    "Your task is provided as follows:\n"
    "Text Caption: [{prompt}]"
)
THINK_PAIRWISE_VIDEO = (
    "Given a caption and two videos generated based on this caption, please analyze in detail the "
    "two provided videos. Evaluate them on various dimensions such as semantic consistency (how "
    "closely the video content aligns with the caption), temporal coherence (smoothness and logical "
    "flow of motion across frames), authenticity (realism and attention to detail), and any other "
    "factors you deem relevant. For each evaluation dimension, provide a score between 1-10 for both "
    "videos (e.g., Video 1: 8/10, Video 2: 6/10) and provide a concise rationale for the score. "
    "Calculate the total score for each video by summing all dimension scores. Use a "
    "chain-of-thought process to detail your reasoning steps, and enclose all your detailed "
    "reasoning within <think> and </think> tags. Then, in the <answer> tag, output exactly one of "
    "the following strings: 'Video 1 is better' or 'Video 2 is better' based on the total scores. No "
    "additional text is allowed in the <answer> section.\n"
    "\n"
    "Example output format:\n"
    "<think>\n"
    "1. Semantic consistency: Video 1 (9/10) - ...; Video 2 (7/10) - ...\n"
    "2. Temporal coherence: Video 1 (8/10) - ...; Video 2 (6/10) - ...\n"
    "3. Authenticity: Video 1 (7/10) - ...; Video 2 (5/10) - ...\n"
    "[Additional dimensions if any]: Video 2 (8/10) - ...; Video 1 (6/10) - ...\n"
    "Total score:\n"
    "Video 1: 9+8+7+6=30\n"
    "Video 2: 7+6+5+8=26\n"
    "</think>\n"
    "<answer>Video 1 is better</answer>\n"
    "**Note: In the example above, scores and the final answer are placeholders meant only to "
    "demonstrate the format. Your actual evaluation should be based on the quality of two given "
    "videos.**\n"
    "\n"
    "Your task is provided as follows:\n"
    "Text Caption: [{prompt}]"
)
VIDEOSCORE2_POINTWISE = (
    "\n"
    "    You are an expert for evaluating AI-generated videos from three dimensions:\n"
    "    (1) visual quality \u2013 clarity, smoothness, artifacts;\n"
    "    (2) text-to-video alignment \u2013 fidelity to the prompt;\n"
    "    (3) physical/common-sense consistency \u2013 naturalness and physics plausibility.\n"
    "\n"
    "    Video prompt: {prompt}\n"
    "\n"
    "    Please output in this format:\n"
    "    visual quality: <v_score>; \n"
    "    text-to-video alignment: <t_score>, \n"
    "    physical/common-sense consistency: <p_score>\n"
    "    "
)
# ---- our own wording: UnifiedReward-Think has no official pointwise prompt ----
THINK_POINTWISE = (
    "You are an objective evaluator. Given a caption and a generated {medium}, reason about semantic "
    "consistency, aesthetics and authenticity inside <think></think>, then give an overall score from 1 "
    "to 10 as 'Final Score: X' inside <answer></answer>.\nCaption: 「{prompt}」"
)

_UR_DIMS = ("Alignment Score", "Coherence Score", "Style Score")
FAMILIES = {
    "unifiedreward": JudgeFamily(
        "unifiedreward",
        {"image": UNIFIEDREWARD_POINTWISE_IMAGE, "video": UNIFIEDREWARD_POINTWISE_VIDEO},
        {"image": _UR_DIMS, "video": ("Alignment Score", "Physics Score", "Style Score")}, 1, 5,
        {"image": UNIFIEDREWARD_PAIRWISE_IMAGE, "video": UNIFIEDREWARD_PAIRWISE_VIDEO}, "{Medium} ",
        ("image", "video"), label_suffix=" (1-5)",
        max_new_tokens={"image": 4096, "video": 4096}, http_max_tokens=4096, video_frames=16,
    ),
    "unifiedreward-think": JudgeFamily(
        "unifiedreward-think", {"image": THINK_POINTWISE, "video": THINK_POINTWISE},
        {"image": ("",), "video": ("",)}, 1, 10,
        {"image": THINK_PAIRWISE_IMAGE, "video": THINK_PAIRWISE_VIDEO}, "<answer>{Medium} ", ("image", "video"),
        max_new_tokens={"image": 512, "video": 1024}, http_max_tokens=4096,
    ),
    "videoscore2": JudgeFamily(
        "videoscore2", {"video": VIDEOSCORE2_POINTWISE},
        {"video": ("visual quality", "text-to-video alignment", "physical/common-sense consistency")}, 1, 5,
        None, "", ("video",), line_ends=(";\n", ",\n", ""), soft_formula="normed", generated_soft=True,
        max_new_tokens={"video": 1024}, http_max_tokens=1024, temperature=0.7, sample_fps=2.0,
    ),
}
