"""Image-edit judges on Qwen2.5-VL: EditReward (reward heads) and EditScore (a generative judge).

Both score an edited image against its source image and the instruction; the source image comes in each
item's metadata ({"source_image": path or tensor}, what edit records carry, see `mmreward.edit`). Template
texts are the official ones, as data in `mmreward.prompt_templates.edit` (sources and commits there).

EditReward (Wu et al. 2025, TIGER-AI-Lab/EditReward, `EditRewardInferencer` with the released config
EditReward-Qwen2.5-7B-VL.yaml: rm_head_type 'ranknet_multi_head', pooling_strategy 'mean', output_dim 2,
use_special_tokens, reward_token 'special'):
- Qwen2.5-VL-7B-Instruct with the special token <|Reward|> added; two heads (head_0, head_1), each the
  MLP hidden -> 1024 -> 16 -> 2 (kept in fp32) on the last hidden state at <|Reward|>;
- head_0 reads the prompt 'instruction following' (INSTRUCTION_EDIT_FOLLOWING), head_1 the prompt 'visual
  quality' (INSTRUCTION_EDIT_QUALITY), each followed by the reward-token suffix; one user turn holding the
  source image, the edited image, then the text, through the chat template with the generation prompt;
- both images are resized to exactly 256*28*28 pixels (min_pixels = max_pixels, Qwen smart_resize) with
  Pillow's 8-bit bicubic (bit-exact, batched; media that require grad take a float bicubic instead, the one
  deliberate deviation);
- the decoder runs over plain sequential positions, as `_run_single_batch_through_model_and_head` calls it
  with input_ids=None and no position ids (not Qwen's 3-D M-RoPE positions);
- the pooled output is the mean of the two heads' (mu, second output); the score is its mu (the README's
  `rewards[i][0]`). Details: each head's mu and the pooled second output ('uncertainty').
- weights: one full state dict `model.safetensors` (the VLM with the resized embeddings, and
  `rm_heads.head_{0,1}.*`), loaded strictly; `model.pth` pickles are not read. The hub id is not given by
  the repository's README (it links a collection); pass the downloaded folder as `checkpoint`.

EditScore (Luo et al. 2025, VectorSpaceLab/EditScore, `EditScore.batch_evaluate`, score_range 25 as in
its README):
- two requests per item through the checkpoint's chat template with Qwen's default system turn:
  SC (semantic consistency) shows '<img1>: ' source, '<img2>: ' edited, then the SC prompt with the
  instruction; PQ (perceptual quality) shows '<img1>: ' edited, then the PQ prompt (the official layout of
  `qwen25vl.apply_chat_template`), as `EditScore.evaluate` (the README's entry point) sends them;
  `batch_evaluate` @ 35ddc1a would send both images with the PQ prompt;
- each answer is JSON {"reasoning": ..., "score": [..]} (repaired when malformed, as its parser does);
  SC = min(SC scores) / (range / 10), PQ = min(PQ scores) / (range / 10), overall = sqrt(SC * PQ) on 0..10;
  details: prompt_following (SC score 1), consistency (SC score 2), perceptual_quality, SC, PQ;
- decoding as the official (editscore/mllm_tools/qwen25vl.py): sampling at `temperature` (0.7) with top-p 0.9,
  top-k 20, the seed set before each of the SC and PQ calls, `num_pass` passes averaged ('average_last'), seeds
  seed + pass; images resized as its qwen_vl_utils does (Pillow's bicubic on 8-bit values, 4..16384 patches).
- transparent images (edited and source): qwen_vl_utils' `to_rgb` pastes an RGBA image on white before the
  resize (every release from 0.0.9 to 0.0.14, read from the PyPI wheels; EditScore's pyproject.toml @ 35ddc1a
  requires `qwen-vl-utils` unpinned and its README passes `Image.open` PNGs straight to `evaluate`), so we
  composite on white in Pillow's 8-bit arithmetic too (`qwen_vl_to_rgb`), not drop alpha. Only PIL mode "RGBA":
  to_rgb `convert("RGB")`s grey-with-alpha (LA) and palette images with transparency, which drops their alpha,
  and so do we (media alpha "keep_rgba"); 4-channel tensors count as RGBA.
  temperature=0 gives greedy, deterministic rewards. Over HTTP top-p/top-k are the server's.
- weights: the base Qwen2.5-VL-7B-Instruct plus the EditScore LoRA adapter (EditScore/EditScore-7B), merged
  with peft after a strict key check; or a served merged model (backend='openai').
Deviation, on purpose: where the official code guesses (a random score when unparsable, range / 2 for an
empty or out-of-range list), we return NaN and flag `details["parse_failed"]`, as our other judges do.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import torch
from torch import nn

from mmreward.backbones.qwen_vl import qwen_vl_to_rgb
from mmreward.edit import source_image_list
from mmreward.errors import CheckpointError, RewardInputError
from mmreward.models.vlm_heads import HPSV3_TOKEN, QwenVLHeadReward, head_hidden_states, hpsv3_head
from mmreward.prompt_templates.edit import (
    EDITREWARD_FOLLOWING,
    EDITREWARD_QUALITY,
    EDITREWARD_SUFFIX,
    EDITSCORE_CONTEXT,
    EDITSCORE_PQ_RULE,
    EDITSCORE_SC_RULE,
    EDITSCORE_TWO_IMAGE_EDIT_RULE,
)
from mmreward.types import Reward, RewardOutput

EDITREWARD_TOKEN = HPSV3_TOKEN  # the same '<|Reward|>' token
EDITREWARD_PIXELS = 256 * 28 * 28  # min_pixels = max_pixels in EditRewardInferencer.prepare_batch
EDITSCORE_LABELS_SC = ("<img1>: ", "<img2>: ")
EDITSCORE_LABELS_PQ = ("<img1>: ",)
EDITSCORE_DELIMITER = "||V^=^V||"  # VIEScore's optional delimiters around the JSON answer
QWEN_VL_UTILS_MIN_PIXELS, QWEN_VL_UTILS_MAX_PIXELS = 4 * 28 * 28, 16384 * 28 * 28  # process_vision_info defaults


def tiny_qwen25_vl_folder() -> str:
    """A fresh seeded tiny Qwen2.5-VL checkpoint (the edit judges' backbone family) for tiny=True."""
    import tempfile

    from mmreward.backbones.tiny_qwen_vl import build_tiny_qwen_vl

    folder = tempfile.mkdtemp(prefix="mmreward-tiny-qwen25vl-")
    build_tiny_qwen_vl(folder, variant="qwen2_5_vl")
    return folder


# ----------------------------------------------------------------------------------------------
# EditReward
# ----------------------------------------------------------------------------------------------
def editreward_prompt(instruction: str, dim: str) -> str:
    """The text of head `dim` ('following' -> head_0, 'quality' -> head_1) for an instruction."""
    base = {"following": EDITREWARD_FOLLOWING, "quality": EDITREWARD_QUALITY}[dim]
    return base.format(text_prompt=instruction) + EDITREWARD_SUFFIX


class EditReward(QwenVLHeadReward):
    name = "editreward"
    modalities = ("image",)
    accepts_metadata = True

    def __init__(self, vlm, processor, rm_heads: nn.ModuleDict, token_ids: list[int], **kwargs) -> None:
        # the two heads are the reward head (`rm_head`, kept in fp32 by the base class)
        super().__init__(vlm, processor, rm_heads, token_ids, **kwargs)

    def _states(self, texts: list[str], sources: list[torch.Tensor], edited) -> torch.Tensor:
        from mmreward.backbones.qwen_vl import build_batch, model_inputs

        media = [m for pair in zip(sources, edited) for m in pair]  # source first, as the official messages
        batch = build_batch(self.processor, texts, media, kind="image", min_pixels=self.min_pixels,
                            max_pixels=self.max_pixels, media_per_item=2, resize=self.resize_method)
        inputs = model_inputs(batch, self.device, self.dtype)
        hidden = head_hidden_states(self.vlm, inputs)  # sequential positions, as the original's forward
        mask = torch.isin(inputs["input_ids"], self.token_ids)
        counts = mask.sum(dim=1)
        if bool((counts != 1).any()):
            raise RewardInputError(f"prompts: each item must contain the reward token {EDITREWARD_TOKEN} exactly "
                                   f"once, found counts {counts.tolist()}; an instruction quoting it breaks the head")
        return hidden[mask]  # (B, hidden)

    def _score(self, prompts, media, metadata=None):
        sources = source_image_list(metadata, len(prompts), self.name)
        edited = list(media)
        per_head = []
        for i, dim in enumerate(("following", "quality")):
            states = self._states([editreward_prompt(p, dim) for p in prompts], sources, edited)
            per_head.append(self.rm_head[f"head_{i}"](states.float()))  # (B, 2)
        pooled = torch.stack(per_head).mean(dim=0)  # pooling_strategy 'mean'
        return RewardOutput(pooled[:, 0], {"instruction_following": per_head[0][:, 0],
                                           "visual_quality": per_head[1][:, 0], "uncertainty": pooled[:, 1]})


def editreward_heads(hidden: int) -> nn.ModuleDict:
    return nn.ModuleDict({f"head_{i}": hpsv3_head(hidden) for i in range(2)})  # the same MLP as HPSv3's


def load_editreward(checkpoint=None, *, weights="pretrained", base_model: str = "Qwen/Qwen2.5-VL-7B-Instruct",
                    tiny: bool = False, **options) -> EditReward:
    from mmreward.backbones import qwen_vl
    from mmreward.checkpoints import load_state_dict, load_strict, resolve_files
    from mmreward.models.vlm_heads import _add_tokens, _text_hidden

    if tiny:
        base_model = tiny_qwen25_vl_folder()
        options.setdefault("min_pixels", 56 * 56)
        options.setdefault("max_pixels", 56 * 56)
    options.setdefault("min_pixels", EDITREWARD_PIXELS)
    options.setdefault("max_pixels", EDITREWARD_PIXELS)
    processor = qwen_vl.load_processor(base_model)
    token_ids = _add_tokens(processor, [EDITREWARD_TOKEN])
    vlm = qwen_vl.vlm_from_config(qwen_vl.load_config(base_model))
    vlm.resize_token_embeddings(len(processor.tokenizer), mean_resizing=False)
    heads = editreward_heads(_text_hidden(vlm))
    if weights == "pretrained":
        if checkpoint is None:
            raise CheckpointError("editreward needs checkpoint=: the folder holding EditReward's model.safetensors "
                                  "(e.g. the EditReward-Qwen2.5-7B-VL release downloaded from its Hugging Face "
                                  "collection)")
        path = resolve_files(checkpoint, ["model.safetensors"])["model.safetensors"]
        sd = load_state_dict(path)
        head_sd = {k[len("rm_heads."):]: v for k, v in sd.items() if k.startswith("rm_heads.")}
        rest = {k: v for k, v in sd.items() if not k.startswith("rm_heads.")}
        load_strict(vlm, qwen_vl.legacy_to_current_keys(rest), str(path))
        load_strict(heads, head_sd, str(path) + " (rm_heads)")
    return EditReward(vlm, processor, heads, token_ids, **options)


# ----------------------------------------------------------------------------------------------
# EditScore
# ----------------------------------------------------------------------------------------------
def editscore_prompts(score_range: int = 25) -> tuple[str, str]:
    """(SC prompt with '<instruction>' to fill, PQ prompt), built as `EditScore.__init__` builds them."""
    sc = "\n".join([EDITSCORE_CONTEXT, EDITSCORE_TWO_IMAGE_EDIT_RULE,
                    EDITSCORE_SC_RULE.replace("10", str(score_range))])
    pq = "\n".join([EDITSCORE_CONTEXT, EDITSCORE_PQ_RULE.replace("10", str(score_range))])
    return sc, pq


_NUMBER = r"[-+]?\d*\.?\d+"


def _scores_of(data) -> list[float] | None:
    if isinstance(data, dict) and "score" in data:
        val = data["score"]
        vals = val if isinstance(val, list) else [val]
        try:
            return [float(v) for v in vals]
        except (TypeError, ValueError):
            return None
    return None


def parse_editscore_output(text: str) -> list[float] | None:
    """The score list of an EditScore answer, or None when there is none.

    Follows the official parser's stages (editscore/utils.py `mllm_output_to_dict`): curly quotes made ASCII,
    the text between two '||V^=^V||' delimiters, else the outermost
    {...}; JSON; then Python-style literals (single quotes, True/None) and unquoted keys; then the numbers of
    the list after a 'score' key; a bare '[a, b]' list or a bare number. Unlike the official last resort we
    read only the bracketed list after 'score' (numbers quoted in the reasoning are not scores)."""
    if not isinstance(text, str) or not text.strip():
        return None
    # curly quotes -> ASCII first, as the official `normalize_quotes` does before parsing
    text = text.replace("\u201c", '"').replace("\u201d", '"').replace("\u2018", "'").replace("\u2019", "'")
    if text.count(EDITSCORE_DELIMITER) == 2:
        body = text.split(EDITSCORE_DELIMITER)[1].strip()
    else:
        m = re.search(r"\{.*\}", text, re.DOTALL)
        body = m.group(0) if m else text.strip()
    candidates = [body]
    fixed = re.sub(r"\bTrue\b", "true", re.sub(r"\bFalse\b", "false", re.sub(r"\bNone\b", "null", body)))
    candidates += [fixed.replace("'", '"'), re.sub(r'([\{\s,])(\w+)\s*:', r'\1"\2":', fixed)]
    for cand in candidates:
        try:
            scores = _scores_of(json.loads(cand))
        except json.JSONDecodeError:
            continue
        if scores:
            return scores
    m = re.search(r"[\"']?score[\"']?\s*[:：]\s*\[([^\]]*)\]", body, re.IGNORECASE)
    if m:
        nums = re.findall(_NUMBER, m.group(1))
        return [float(n) for n in nums] or None
    m = re.search(r"[\"']?score[\"']?\s*[:：]\s*(" + _NUMBER + ")", body, re.IGNORECASE)
    if m:
        return [float(m.group(1))]
    stripped = text.strip()
    if re.fullmatch(r"\[\s*\d+\s*,\s*\d+\s*\]", stripped):
        return [float(n) for n in re.findall(r"\d+", stripped)]
    if re.fullmatch(r"\d+", stripped):
        return [float(stripped)]
    return None


class EditScore(Reward):
    name = "editscore"
    modalities = ("image",)
    requires_prompt = True
    accepts_metadata = True
    may_return_nan = True

    def __init__(self, backend, *, score_range: int = 25, temperature: float = 0.7, num_pass: int = 1,
                 seed: int = 42, reduction: str = "average_last", micro_batch_size: int = 4) -> None:
        super().__init__(micro_batch_size=micro_batch_size)
        if not isinstance(score_range, int) or isinstance(score_range, bool) or score_range < 1:
            raise RewardInputError(f"score_range must be a positive int (EditScore's models use 25), got {score_range!r}")
        if not isinstance(num_pass, int) or num_pass < 1:
            raise RewardInputError(f"num_pass must be an int >= 1, got {num_pass!r}")
        if num_pass > 1 and temperature <= 0:
            raise RewardInputError("num_pass > 1 averages sampled passes and needs temperature > 0")
        if reduction not in ("average_last", "average_first"):
            raise RewardInputError(f"reduction must be 'average_last' or 'average_first', got {reduction!r}")
        self.backend = backend
        if isinstance(getattr(backend, "model", None), nn.Module):
            self.vlm = backend.model  # so .to(device) and dtype follow the reward
        self.score_range, self.temperature, self.num_pass = score_range, float(temperature), num_pass
        self.seed, self.reduction = seed, reduction
        self.sc_template, self.pq_prompt = editscore_prompts(score_range)
        # Qwen25VL.inference samples with top_p 0.9, top_k 20 (not the checkpoint's generation_config, whose
        # top_k 1 would make the 0.7 temperature greedy); passed where the backend takes them
        import inspect

        params = inspect.signature(backend.generate).parameters
        self._sampling = {k: v for k, v in (("top_p", 0.9), ("top_k", 20)) if k in params}

    @property
    def image_alpha(self) -> str:
        # keep RGBA's alpha through `prepare`: the original's qwen_vl_utils composites it on white (`qwen_vl_to_rgb`)
        # only for PIL mode "RGBA": to_rgb convert("RGB")s LA and palette images, dropping their transparency
        return "white_background_if_rgba"

    def requests(self, instructions, sources, edited):
        """The (SC, PQ) judge requests of a batch, in the official layout."""
        from mmreward.judges.backends import JudgeRequest

        sc = [JudgeRequest(self.sc_template.replace("<instruction>", p), [s, e], media_labels=EDITSCORE_LABELS_SC)
              for p, s, e in zip(instructions, sources, edited)]
        pq = [JudgeRequest(self.pq_prompt, [e], media_labels=EDITSCORE_LABELS_PQ) for e in edited]
        return sc, pq

    def _parse(self, text: str) -> list[float] | None:
        scores = parse_editscore_output(text)
        if not scores or any(not 0 <= s <= self.score_range for s in scores):
            return None  # NaN policy (the official code substitutes guesses here)
        return scores

    def _score(self, prompts, media, metadata=None):
        sources = [qwen_vl_to_rgb(s) for s in source_image_list(metadata, len(prompts), self.name, self.media_alpha)]
        sc_req, pq_req = self.requests(prompts, sources, [qwen_vl_to_rgb(m) for m in media])
        unit = self.score_range / 10
        nan = float("nan")
        passes = []  # per pass: (follow, consistency, SC, PQ, overall), each (B,)
        texts = None
        for k in range(self.num_pass):
            # two calls: a backend batch holds requests with the same number of images
            outs = [o[0] for req in (sc_req, pq_req)
                    for o in self.backend.generate(req, n=1, temperature=self.temperature, seed=self.seed + k,
                                                   **self._sampling)]
            texts = texts or outs
            rows = []
            for sc_text, pq_text in zip(outs[: len(prompts)], outs[len(prompts):]):
                sc, pq = self._parse(sc_text), self._parse(pq_text)
                sc_v = min(sc) / unit if sc else nan
                pq_v = min(pq) / unit if pq else nan
                follow = sc[0] / unit if sc else nan
                cons = sc[1] / unit if sc and len(sc) > 1 else nan
                rows.append((follow, cons, sc_v, pq_v, math.sqrt(sc_v * pq_v)))
            passes.append(torch.tensor(rows, dtype=torch.float32))
        mean = torch.stack(passes).mean(dim=0)  # NaN in any pass makes the item NaN
        overall = mean[:, 4] if self.reduction == "average_last" else (mean[:, 2] * mean[:, 3]).sqrt()
        failed = torch.stack([torch.isnan(p[:, 2]) | torch.isnan(p[:, 3]) for p in passes]).float().mean(dim=0)
        details = {"prompt_following": mean[:, 0], "consistency": mean[:, 1], "SC": mean[:, 2],
                   "perceptual_quality": mean[:, 3], "parse_failed": failed}
        # stripped, as Qwen25VL.inference returns its answers
        rationales = [f"SC: {a.strip()}\n\nPQ: {b.strip()}" for a, b in zip(texts[: len(prompts)], texts[len(prompts):])]
        return RewardOutput(overall, details, rationales)


def _current_lora_keys(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Adapter keys saved with transformers < 4.52 (base_model.model.model.layers.*, base_model.model.visual.*)
    renamed to the current Qwen-VL layout (model.language_model.*, model.visual.*); current keys are kept.
    We rename ourselves rather than rely on the installed PEFT doing it, and the strict check that follows
    still sees every key: a renamed key with no module to go to is an error, never dropped."""
    from mmreward.backbones.qwen_vl import legacy_to_current_keys

    prefix = "base_model.model."
    out: dict[str, torch.Tensor] = {}
    for key, value in sd.items():
        if key.startswith(prefix):
            key = prefix + next(iter(legacy_to_current_keys({key[len(prefix):]: value})))
        if key in out:
            raise CheckpointError(f"the LoRA adapter holds {key} in both the pre-4.52 and the current key layout")
        out[key] = value
    return out


def merge_peft_lora(vlm: nn.Module, adapter: str | Path) -> nn.Module:
    """The VLM with a PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors) merged in,
    after checking that every adapter weight has a module to go to and every targeted module got its weights."""
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict

    from mmreward.checkpoints import load_state_dict, read_json, resolve_files

    files = resolve_files(adapter, ["adapter_config.json", "adapter_model.safetensors"])
    cfg = read_json(files["adapter_config.json"], "EditScore LoRA config")
    fields = {k: v for k, v in cfg.items() if k in LoraConfig.__dataclass_fields__ and k not in ("peft_type", "task_type")}
    model = get_peft_model(vlm, LoraConfig(**fields))
    sd = _current_lora_keys(load_state_dict(files["adapter_model.safetensors"]))
    result = set_peft_model_state_dict(model, sd)
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    own = {k for k in model.state_dict() if "lora_" in k}
    loaded = {k.replace(".lora_A.weight", ".lora_A.default.weight").replace(".lora_B.weight", ".lora_B.default.weight")
              for k in sd}
    missing = sorted(own - loaded)
    if unexpected or missing:
        raise CheckpointError(f"{files['adapter_model.safetensors']}: the LoRA adapter does not match the base model "
                              f"(unexpected keys {unexpected[:5]}, missing keys {missing[:5]}); check that "
                              "base_model is the adapter's base (Qwen/Qwen2.5-VL-7B-Instruct for EditScore-7B)")
    return model.merge_and_unload()


def load_editscore(checkpoint=None, *, weights="pretrained", base_model: str = "Qwen/Qwen2.5-VL-7B-Instruct",
                   **options) -> EditScore:
    """`checkpoint`: the EditScore LoRA adapter (folder or hub id, default EditScore/EditScore-7B) on
    `base_model`; with backend='openai', the served (merged) model's name."""
    from mmreward.backbones import qwen_vl
    from mmreward.judges.backends import TransformersBackend
    from mmreward.models.vlm_judge import _BACKEND_KEYS, make_backend

    backend_opts = {k: options.pop(k) for k in _BACKEND_KEYS if k in options}
    backend_opts.setdefault("max_new_tokens", 512)  # the official generate's max_new_tokens
    if backend_opts.get("backend", "transformers") != "transformers":
        return EditScore(make_backend(checkpoint, weights, **backend_opts), **options)
    tiny = backend_opts.pop("tiny", False)
    if tiny:
        base_model = tiny_qwen25_vl_folder()
        backend_opts.setdefault("min_pixels", 28 * 28)
        backend_opts.setdefault("max_pixels", 56 * 56)
        backend_opts["max_new_tokens"] = min(backend_opts["max_new_tokens"], 8)
    unknown = set(backend_opts) - {"min_pixels", "max_pixels", "max_new_tokens", "backend"}
    if unknown:
        raise RewardInputError(f"options {sorted(unknown)} only apply with backend='openai'")
    processor = qwen_vl.load_processor(base_model)
    vlm = (qwen_vl.vlm_from_config(qwen_vl.load_config(base_model)) if weights == "random"
           else qwen_vl.load_vlm(base_model))
    if weights == "pretrained" and not tiny:
        vlm = merge_peft_lora(vlm, checkpoint or "EditScore/EditScore-7B").eval()
    elif weights == "pretrained" and checkpoint is not None:
        vlm = merge_peft_lora(vlm, checkpoint).eval()
    backend = TransformersBackend(vlm, processor, min_pixels=backend_opts.get("min_pixels", QWEN_VL_UTILS_MIN_PIXELS),
                                  max_pixels=backend_opts.get("max_pixels", QWEN_VL_UTILS_MAX_PIXELS),
                                  max_new_tokens=backend_opts["max_new_tokens"],
                                  resize="8-bit")  # qwen_vl_utils' Pillow bicubic, as Qwen25VL.prepare_input
    return EditScore(backend, **options)
