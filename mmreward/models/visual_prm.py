"""visual-prm: VisualPRM, a multimodal process reward model: a score for every step of a response, then min or mean.

The original (OpenGVLab/VisualPRM-8B; Wang et al. 2025, arXiv:2503.10291) is InternVL2.5-8B trained on VisualPRM400K
as a multi-turn chat: the system prompt asks for "+" or "-" after each step; the first user turn holds the image,
the question and the first step, every later user turn one more step, each assistant turn the verdict. How it
scores, and how we follow it (references with their commits below):
1. steps: the response split on blank lines ("\\n\\n"); with `max_steps`, consecutive steps are merged into groups of
   ceil(n / max_steps) (`split_response`, OpenGVLab/InternVL@2410d1dbf208f0e799459aff9376e5747dbf41a2
   internvl_chat/tools/reasoning_data_pipeline/visualprm_data_pieline.py; the hub model's
   `InternVLRewardModel.split_response` is the same; no limit by default, as its `select_best_response`);
2. the conversation (`render_conversation`): system prompt `PRM_SYSTEM_PROMPT` (utils/constants.py there, verbatim);
   first user turn "### Question:\\n<image>\\n{question}\\n\\n### Solution Process:\\n{step 1}" (the training
   format of visualprm_data_pipeline_postprocess.py `item2conv_prm`), then one user turn per step, every assistant
   turn "+" (teacher-forced history), rendered with InternVL's `internvl2_5` conversation template (MPT style:
   "<|im_start|>system\\n...<|im_end|>\\n<|im_start|>user\\n...<|im_end|>\\n<|im_start|>assistant\\n+<|im_end|>\\n");
   "<image>" becomes "<img>" + "<IMG_CONTEXT>" x (tokens per tile x tiles) + "</img>";
3. the image: InternVL's `load_image(max_num=12)`: RGB, `dynamic_preprocess` (the closest tile grid of at most
   `max_num` 448-px tiles, the image resized to it with Pillow's bicubic, cut row by row, plus a 448-px thumbnail
   when there are several tiles), ToTensor, ImageNet mean/std. Here on the image's 8-bit values with
   `pillow_bicubic` (bit-exact to Pillow), batched;
4. one forward over the whole conversation (the hub model's `generate_steps_with_soft_score_v2`): each step's score
   is softmax over the logits of the "+" and "-" tokens at the position that predicts that step's verdict
   (`find_placeholder_idx`: the last token of "<|im_start|>assistant\\n" before each "+<|im_end|>\\n"),
   weighted {+: 1, -: 0}, i.e. P("+"). Under the causal mask this equals the per-turn forward of
   `generate_steps_with_soft_score`;
5. the response score aggregates the step scores: "mean" (the paper's default and the hub code's soft
   `generate_overall_score`) or "min" (the paper's ablation); details carry both, and `step_scores` returns
   every step's P("+"). Best-of-N: `skywork_vl_reward.select_best_responses` (argmax per item).

What is covered, and what is not: the official checkpoint is InternVL's remote-code `InternVLChatModel` with an
InternLM2.5-7B language model, which transformers 5.24 cannot build natively (and this library never runs hub code,
`trust_remote_code`). Such a folder (config.json `architectures: [InternVLChatModel]`, InternLM2 `llm_config`,
safetensors) is converted in memory to transformers' native InternVL (`InternVLForConditionalGeneration`, the "-hf"
layout: InternViT + pixel-shuffle MLP projector + a Llama language model) by mmreward/backbones/internvl_chat.py,
strictly, with the tokenizer from the folder's tokenizer.json; a native "-hf" checkpoint (Qwen2 or Llama language
model) loads as it is. Checked in tests/mmreward/test_visual_prm_official_layout.py against transcriptions of the
original InternLM2 and InternViT forwards. The tokenizer.json of such a folder gives the ids of InternVL's slow
sentencepiece InternLM2Tokenizer on this reward's prompts (tests/mmreward/test_visual_prm_tokenizer.py, a tiny
sentencepiece model with InternLM2's token layout; the folder's tokenizer.model normaliser is checked at load,
`_check_against_sentencepiece`). Not checked: the real 8B weights and the real 92,544-piece vocabulary (a folder with
only its sentencepiece tokenizer.model is refused with how to add a tokenizer.json). The hub model's
hard-score mode (generated "+"/"-" text, summed) is not implemented. Scoring is checked against a transcription of
the original's scoring code in tests/mmreward/test_parity_visual_prm.py.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from mmreward.errors import CheckpointError, RewardInputError
from mmreward.types import ResponseReward, RewardOutput

DEFAULT_CHECKPOINT = "OpenGVLab/VisualPRM-8B"
# InternVL/internvl_chat/tools/reasoning_data_pipeline/utils/constants.py PRM_SYSTEM_PROMPT, verbatim
PRM_SYSTEM_PROMPT = (
    "You are an advanced AI assistant, designed to serve as a process supervision model. In this task, I will "
    "provide a problem statement followed by the first step of the solution process. For each subsequent turn, I "
    "will give you a new step in the solution. Your role is to assess whether the solution process is correct up to "
    "the current step.\n\n"
    "- In the **first round**, I will input the problem and the first step of the solution process.\n"
    "- In **each subsequent round**, I will provide the next step in the solution.\n\n"
    "For each step, you should:\n\n"
    "- Respond with **\"+\"** if you believe the solution process is correct up to this step.\n"
    "- Respond with **\"-\"** if you detect any issues or errors in the process up to this step.\n\n"
    "Please note:\n"
    "- Only respond with **\"+\"** or **\"-\"**. Do not provide any additional explanations, comments, or "
    "justifications.\n\n"
    "Your task is to verify the accuracy and correctness of each step in the given solution process."
)
# InternVL's internvl2_5 conversation template (MPT separator style)
SYSTEM_TEMPLATE = "<|im_start|>system\n{system_message}"
ROLES = ("<|im_start|>user\n", "<|im_start|>assistant\n")
SEP = "<|im_end|>\n"
PLACEHOLDER, NEGATIVE = "+", "-"
IMG_START, IMG_END, IMG_CONTEXT = "<img>", "</img>", "<IMG_CONTEXT>"
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
MAX_TILES = 12  # the model card's load_image(image, max_num=12)
AGGREGATIONS = ("mean", "min")


def split_response(response: str, sep: str = "\n\n", max_steps: int | None = None) -> list[str]:
    """The response's steps: split on `sep`; with `max_steps`, runs of ceil(n / max_steps) steps joined back."""
    steps = response.split(sep)
    if max_steps is None:
        return steps
    group = math.ceil(len(steps) / max_steps)
    return [sep.join(steps[i:i + group]) for i in range(0, len(steps), group)]


def render_conversation(question: str, steps: Sequence[str], system_message: str = PRM_SYSTEM_PROMPT) -> str:
    """The internvl2_5 template over [system, (step turn, "+") per step]; "<image>" marks where the image goes."""
    parts = [SYSTEM_TEMPLATE.format(system_message=system_message) + SEP]
    for i, step in enumerate(steps):
        if i == 0:
            step = f"### Question:\n<image>\n{question}\n\n### Solution Process:\n{step}"
        parts.append(ROLES[0] + step + SEP + ROLES[1] + PLACEHOLDER + SEP)
    return "".join(parts)


def render_query(question: str, steps: Sequence[str], image_tokens: int,
                 system_message: str = PRM_SYSTEM_PROMPT) -> str:
    """The text that is tokenized: the conversation with "<image>" replaced by "<img>", `image_tokens` x
    "<IMG_CONTEXT>" (tokens per tile x tiles), "</img>", as the original's `chat` does."""
    image = IMG_START + IMG_CONTEXT * image_tokens + IMG_END
    return render_conversation(question, steps, system_message).replace("<image>", image, 1)


def _target_ratios(max_num: int, min_num: int = 1) -> list[tuple[int, int]]:
    found = {(i, j) for n in range(min_num, max_num + 1) for i in range(1, n + 1) for j in range(1, n + 1)
             if min_num <= i * j <= max_num}
    return sorted(found, key=lambda r: r[0] * r[1])


def tile_grid(width: int, height: int, image_size: int, max_num: int) -> tuple[int, int]:
    """InternVL's `find_closest_aspect_ratio`: (columns, rows) of the tile grid for a width x height image."""
    aspect = width / height
    best_diff, best = float("inf"), (1, 1)
    area = width * height
    for ratio in _target_ratios(max_num):
        diff = abs(aspect - ratio[0] / ratio[1])
        if diff < best_diff:
            best_diff, best = diff, ratio
        elif diff == best_diff and area > 0.5 * image_size * image_size * ratio[0] * ratio[1]:
            best = ratio
    return best


def internvl_tiles(image: torch.Tensor, image_size: int, max_num: int = MAX_TILES) -> torch.Tensor:
    """InternVL's dynamic tiling of one (3, H, W) [0, 1] image, on its 8-bit values, normalised: (tiles, 3, s, s)."""
    from mmreward.backbones.qwen_vl import pillow_bicubic, to_uint8_values

    x = to_uint8_values(image[:3])
    h, w = x.shape[-2:]
    cols, rows = tile_grid(w, h, image_size, max_num)
    s = image_size
    big = x if (h, w) == (rows * s, cols * s) else pillow_bicubic(x, rows * s, cols * s)
    # row by row, as the original's crop boxes ((i % cols) * s, (i // cols) * s, ...)
    tiles = big.reshape(3, rows, s, cols, s).permute(1, 3, 0, 2, 4).reshape(rows * cols, 3, s, s)
    if rows * cols != 1:  # use_thumbnail
        thumb = x if (h, w) == (s, s) else pillow_bicubic(x, s, s)
        tiles = torch.cat([tiles, thumb[None]])
    mean = torch.tensor(IMAGENET_MEAN, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD, device=x.device).view(1, 3, 1, 1)
    return (tiles / 255 - mean) / std


class VisualPRM(ResponseReward):
    name = "visual-prm"
    modalities = ("image",)
    requires_prompt = False  # a response to no question is scored with an empty question

    def __init__(self, model, tokenizer, *, max_num: int = MAX_TILES, max_steps: int | None = None,
                 aggregation: str = "mean", system_message: str = PRM_SYSTEM_PROMPT, micro_batch_size: int = 4) -> None:
        super().__init__(micro_batch_size=micro_batch_size)
        if aggregation not in AGGREGATIONS:
            raise RewardInputError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
        if not (isinstance(max_num, int) and max_num >= 1):
            raise RewardInputError(f"max_num (the most image tiles) must be an int >= 1, got {max_num!r}")
        if max_steps is not None and not (isinstance(max_steps, int) and max_steps >= 1):
            raise RewardInputError(f"max_steps must be None or an int >= 1, got {max_steps!r}")
        self.vlm = model
        self.tokenizer = tokenizer
        self.max_num, self.max_steps, self.aggregation = max_num, max_steps, aggregation
        self.system_message = system_message
        cfg = model.config
        size = cfg.vision_config.image_size
        self.image_size = int(size[0] if isinstance(size, (list, tuple)) else size)
        patch = cfg.vision_config.patch_size
        patch = int(patch[0] if isinstance(patch, (list, tuple)) else patch)
        self.tokens_per_tile = int((self.image_size // patch) ** 2 * cfg.downsample_ratio ** 2)
        ids = tokenizer.convert_tokens_to_ids([PLACEHOLDER, NEGATIVE, IMG_CONTEXT])
        if tokenizer.unk_token_id is not None and tokenizer.unk_token_id in ids:
            raise CheckpointError(f"visual-prm: the tokenizer lacks one of {PLACEHOLDER!r}, {NEGATIVE!r}, {IMG_CONTEXT!r}")
        self.candidates = ids[:2]
        if ids[2] != cfg.image_token_id:
            raise CheckpointError(f"visual-prm: the config's image_token_id {cfg.image_token_id} is not the tokenizer's "
                                  f"{IMG_CONTEXT} ({ids[2]}); the checkpoint's tokenizer and config disagree")
        self._marker = tokenizer(ROLES[1] + PLACEHOLDER + SEP, add_special_tokens=False).input_ids
        self._lead = len(tokenizer(ROLES[1], add_special_tokens=False).input_ids)

    def _steps(self, response: str) -> list[str]:
        return split_response(response, max_steps=self.max_steps)

    def step_scores(self, questions: Any, media: Any, responses: str | Sequence[str]) -> list[torch.Tensor]:
        """P("+") of every step of every response: one (steps,) tensor per item."""
        from mmreward.types import response_texts

        batch = self.prepare(media, None)
        n = len(batch)
        if n == 0:
            raise RewardInputError("media: got an empty batch; pass at least one image")
        qs = [q or "" for q in response_texts(questions, n, "questions", allow_none=True)]
        rs = response_texts(responses, n, "responses", allow_none=False)
        out: list[torch.Tensor] = []
        with torch.inference_mode():
            for s in range(0, n, self.micro_batch_size):
                e = min(s + self.micro_batch_size, n)
                out += [p.float().cpu().clone() for p in self._per_step(qs[s:e], list(batch[s:e]), rs[s:e])]
        return out

    def _per_step(self, questions, media, responses) -> list[torch.Tensor]:
        steps = [self._steps(r) for r in responses]
        tiles = [internvl_tiles(m, self.image_size, self.max_num) for m in media]
        texts = [render_query(q, st, self.tokens_per_tile * t.shape[0], self.system_message)
                 for q, st, t in zip(questions, steps, tiles)]
        # tokenized as the original's tokenizer(query) (special tokens as the tokenizer adds them: none for Qwen2)
        enc = self.tokenizer(texts, return_tensors="pt", padding=True, padding_side="right")
        ids, mask = enc.input_ids.to(self.device), enc.attention_mask.to(self.device)
        rows, cols = self._placeholder_positions(ids, mask, [len(s) for s in steps])
        logits = self.vlm(input_ids=ids, attention_mask=mask, pixel_values=torch.cat(tiles).to(self.device, self.dtype),
                          use_cache=False).logits
        # P("+") renormalised over {"+", "-"} at each verdict position, weights {+: 1, -: 0}
        picked = logits[rows, cols][:, self.candidates].float()
        per_step = torch.softmax(picked, dim=-1)[:, 0]
        return list(torch.split(per_step, [len(s) for s in steps]))

    def _score_responses(self, questions, media, responses, references):
        parts = self._per_step(questions, list(media), responses)
        mean = torch.stack([p.mean() for p in parts])
        low = torch.stack([p.min() for p in parts])
        scores = mean if self.aggregation == "mean" else low
        rationales = [" ".join(f"{v:.3f}" for v in p.tolist()) for p in parts]
        return RewardOutput(scores, {"mean_step": mean, "min_step": low,
                                     "num_steps": torch.tensor([float(len(p)) for p in parts])}, rationales)

    def _placeholder_positions(self, ids: torch.Tensor, mask: torch.Tensor, counts: list[int]
                               ) -> tuple[torch.Tensor, torch.Tensor]:
        """(row, column) of every step's verdict position, as `find_placeholder_idx` finds them: each occurrence
        of the tokens of "<|im_start|>assistant\\n+<|im_end|>\\n", at the last token before the "+"."""
        target = torch.tensor(self._marker, device=ids.device)
        n = target.numel()
        windows = ids.unfold(1, n, 1)  # (B, T - n + 1, n)
        hit = (windows == target).all(dim=-1) & (mask[:, n - 1:] > 0)
        rows, starts = hit.nonzero(as_tuple=True)
        found = torch.bincount(rows, minlength=ids.shape[0]).tolist()
        if found != counts:
            bad = next(i for i, (f, c) in enumerate(zip(found, counts)) if f != c)
            raise RewardInputError(f"visual-prm: item {bad} has {counts[bad]} steps but {found[bad]} verdict markers "
                                   "were found in its tokens; a step whose text contains the template's own "
                                   "'<|im_start|>assistant' turn cannot be scored")
        return rows, starts + self._lead - 1


# ----------------------------------------------------------------------------------------------
# loading
# ----------------------------------------------------------------------------------------------
def write_tiny_visual_prm(folder: str | os.PathLike, seed: int = 0) -> Path:
    """A tiny random VisualPRM in transformers' InternVL ("-hf") layout: config (InternVLConfig with a Qwen2 language
    model, 56-px tiles of 4 tokens), weights, and a Qwen2 tokenizer with <img>, </img>, <IMG_CONTEXT>."""
    from transformers import InternVLConfig, InternVLForConditionalGeneration

    from mmreward.backbones.tiny_qwen_vl import build_qwen_tokenizer

    out = Path(folder)
    tok = build_qwen_tokenizer(out, [IMG_START, IMG_END, IMG_CONTEXT])
    ids = tok.convert_tokens_to_ids
    # a large init makes the one-layer random model's verdicts depend visibly on the image and each step
    text = dict(model_type="qwen2", vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=8192, tie_word_embeddings=False,
                pad_token_id=ids("<|endoftext|>"), eos_token_id=ids("<|im_end|>"), initializer_range=0.5)
    vision = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, image_size=[56, 56],
                  patch_size=[14, 14], initializer_range=0.5)
    config = InternVLConfig(vision_config=vision, text_config=text, image_token_id=ids(IMG_CONTEXT), image_seq_length=4,
                            downsample_ratio=0.5, tie_word_embeddings=False)
    torch.manual_seed(seed)
    InternVLForConditionalGeneration(config).save_pretrained(str(out))
    return out


def _chat_tokenizer(source: str):
    """The tokenizer of an official InternVLChatModel folder from its tokenizer.json, without its remote-code class.

    The official tokenizer_config.json names `InternLM2Tokenizer` (tokenization_internlm2.py, hub code): AutoTokenizer
    would ask to run it. The fast tokenizer file holds the whole tokenizer (vocabulary, merges, added tokens, the
    BOS template), so it is read as it is and no code from the folder runs. When the folder also has the
    sentencepiece tokenizer.model that InternVL trains with (the slow `InternLM2Tokenizer`), the two must agree:
    `_check_against_sentencepiece`."""
    from transformers import PreTrainedTokenizerFast

    from mmreward.checkpoints import load_files, resolve_files

    files = resolve_files(source, [], optional=["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                               "added_tokens.json", "tokenizer.model"])
    if "tokenizer.json" not in files:
        raise CheckpointError(
            f"visual-prm: '{source}' has no tokenizer.json; its tokenizer is InternLM2's remote-code sentencepiece "
            "class, which this library does not run. Save its fast tokenizer into the folder once (on a machine "
            "where you trust the repo, with transformers 4 as InternVL pins it (4.37.2): AutoTokenizer.from_pretrained("
            "folder, trust_remote_code=True, use_fast=True).save_pretrained(folder), which needs the hub's "
            "tokenization_internlm2_fast.py) or copy tokenizer.json from an InternVL2.5-8B '-hf' conversion that "
            "shares its vocabulary and added tokens")
    tokenizer = load_files(lambda p: PreTrainedTokenizerFast.from_pretrained(p, local_files_only=True),
                           files["tokenizer.json"].parent, "tokenizer")
    if "tokenizer.model" in files:
        _check_against_sentencepiece(tokenizer, files["tokenizer.model"], source)
    return tokenizer


def _check_against_sentencepiece(tokenizer, model_file: Path, source: str) -> None:
    """Make tokenizer.json give the ids of the slow InternLM2Tokenizer on tokenizer.model, or refuse it.

    The slow class (OpenGVLab/InternVL@2410d1dbf208f0e799459aff9376e5747dbf41a2 internvl_chat/internvl/model/internlm2/
    tokenization_internlm2.py) runs sentencepiece on each stretch of text between added tokens, with the model's own
    normaliser. The fast one (tokenization_internlm2_fast.py there, `InternLM2Converter`) has no pre-tokenizer and the
    normaliser [Prepend("▁") if add_dummy_prefix] + Replace(" ", "▁") on the same stretches: equal ids (checked in
    tests/mmreward/test_visual_prm_tokenizer.py) unless the model also strips and collapses spaces
    (remove_extra_whitespaces), which that normaliser does not do and which is added here in front of it, or maps
    characters (e.g. NFKC), refused. So is any other normaliser, and a pre-tokenizer (e.g. a Metaspace that prepends
    "▁" to the first stretch only)."""
    import json

    from tokenizers import Regex, normalizers

    from mmreward.backbones.sentencepiece_spec import read_normalizer_spec

    spec = read_normalizer_spec(model_file)
    problems = []
    if spec.has_charsmap:
        problems.append(f"tokenizer.model normalises characters (rule {spec.name!r}) and tokenizer.json does not")
    if not spec.escape_whitespaces:
        problems.append("tokenizer.model keeps spaces unescaped (escape_whitespaces false) and tokenizer.json "
                        "replaces them with '▁'")
    converted = ([normalizers.Prepend("▁")] if spec.add_dummy_prefix else []) + [normalizers.Replace(" ", "▁")]
    state = json.loads(tokenizer.backend_tokenizer.to_str())
    want = json.loads(normalizers.Sequence(converted).__getstate__())
    if state.get("normalizer") != want:
        problems.append(f"tokenizer.json's normalizer is {json.dumps(state.get('normalizer'), ensure_ascii=False)}, "
                        f"not InternLM2's {json.dumps(want, ensure_ascii=False)} (add_dummy_prefix="
                        f"{spec.add_dummy_prefix} in tokenizer.model)")
    if state.get("pre_tokenizer") is not None:
        problems.append(f"tokenizer.json has the pre-tokenizer {json.dumps(state['pre_tokenizer'], ensure_ascii=False)}"
                        ", InternLM2's fast tokenizer has none")
    if problems:
        raise CheckpointError(
            f"visual-prm: the tokenizer.json of '{source}' would not give the token ids of InternVL's slow "
            f"InternLM2Tokenizer on its tokenizer.model: {'; '.join(problems)}. Use a tokenizer.json converted from "
            "this tokenizer.model by InternLM2's own fast class (docs/mllm_reward_models.md, VisualPRM)")
    if spec.remove_extra_whitespaces:
        # sentencepiece (identity rule): runs of spaces become one, then a leading and a trailing one go; per stretch,
        # before the dummy prefix (tokenizers' Prepend skips an emptied stretch, as sentencepiece does)
        strip = [normalizers.Replace(Regex(" {2,}"), " "), normalizers.Replace(Regex(r"\A | \z"), "")]
        tokenizer.backend_tokenizer.normalizer = normalizers.Sequence(strip + converted)


def _load_official(source: str, raw: dict, weights: str):
    """(model, tokenizer) of an official InternVLChatModel + InternLM2 folder, converted in memory to the native
    layout (mmreward/backbones/internvl_chat.py)."""
    from mmreward.backbones import internvl_chat
    from mmreward.backbones import qwen_vl as loading

    template = raw.get("template")
    if template not in (None, "internvl2_5"):
        raise CheckpointError(f"visual-prm: '{source}' uses the conversation template {template!r}; this reward renders "
                              "VisualPRM's 'internvl2_5' template")
    tokenizer = _chat_tokenizer(source)
    image_token = tokenizer.convert_tokens_to_ids(IMG_CONTEXT)
    if image_token is None or image_token == tokenizer.unk_token_id:
        raise CheckpointError(f"visual-prm: the tokenizer of '{source}' has no {IMG_CONTEXT} token")
    if weights == "pretrained":
        return internvl_chat.load_internvl_chat(source, raw, image_token), tokenizer
    if weights == "random":
        return loading.vlm_from_config(internvl_chat.native_config(raw, image_token, source)), tokenizer
    raise RewardInputError(f"weights must be 'pretrained' or 'random', got {weights!r}")


def load_visual_prm(checkpoint: str | os.PathLike | None = None, *, weights: str = "pretrained", tiny: bool = False,
                    **options: Any) -> VisualPRM:
    """VisualPRM from a native InternVL ("-hf") checkpoint, or from the official remote-code layout
    (InternVLChatModel + InternLM2, e.g. OpenGVLab/VisualPRM-8B) converted in memory; no hub code runs."""
    from transformers import AutoTokenizer

    from mmreward.backbones import internvl_chat
    from mmreward.backbones import qwen_vl as loading
    from mmreward.checkpoints import hub_is_offline

    if tiny:
        import tempfile

        checkpoint = str(write_tiny_visual_prm(tempfile.mkdtemp(prefix="mmreward-tiny-visual-prm-")))
        options.setdefault("max_num", 2)
    source = os.fspath(checkpoint) if checkpoint is not None else DEFAULT_CHECKPOINT
    try:
        raw = internvl_chat.read_config(source)
    except CheckpointError:
        raw = None  # AutoConfig below reports it in its own words
    if raw is not None and internvl_chat.is_internvl_chat(raw):
        model, tokenizer = _load_official(source, raw, weights)
        return VisualPRM(model.eval(), tokenizer, **options)
    config = loading.load_config(source)
    if getattr(config, "model_type", None) != "internvl":
        raise CheckpointError(
            f"visual-prm: '{source}' is a '{getattr(config, 'model_type', None)}' checkpoint; this reward loads "
            "transformers' native InternVL layout (model_type 'internvl', the '-hf' conversions) or the official "
            "InternVLChatModel + InternLM2 layout of OpenGVLab/VisualPRM-8B (docs/mllm_reward_models.md)")
    path, local = loading.local_or_hub(source)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=local or hub_is_offline())
    except Exception as exc:  # noqa: BLE001 - hub/network errors come in many types
        raise CheckpointError(f"visual-prm: cannot load the tokenizer of '{source}': {exc}") from exc
    if weights == "pretrained":
        model = loading.load_vlm(source)
    elif weights == "random":
        model = loading.vlm_from_config(config)
    else:
        raise RewardInputError(f"weights must be 'pretrained' or 'random', got {weights!r}")
    return VisualPRM(model.eval(), tokenizer, **options)
