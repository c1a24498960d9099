"""Generative VLM judges: the UnifiedReward family and VideoScore2, in-process or on a served model.

A judge writes its verdict; we parse it. `score` uses the family's pointwise template, `compare` its
pairwise template asked in both orders (position-bias control, see `mmreward.functional.pairwise`), and
`group_win_rates` turns pairwise verdicts into Pref-GRPO's per-candidate win rates. VideoScore2 has no
pairwise prompt, so its `compare` is Bradley-Terry on the two pointwise scores.

Two modes:
- mode="generate" (default): deterministic greedy decoding (or k samples at temperature > 0 with
  voting), parsed by `mmreward.judges.parsers`. Unparsable or out-of-range outputs become NaN and are
  flagged in `details["parse_failed"]` (the fraction of failed samples); the raw text is kept in
  `rationales`. Works with every backend. VideoScore2 in-process (one sample) follows vs2_inference.py:
  each dimension's digit is located in the generated answer and scored from the digit distribution at the
  step that wrote it (`normed`), read after the sampling warpers (temperature and the checkpoint's top-k/top-p)
  as its `output_scores` are (tests/mmreward/test_parity_videoscore2.py); the hard values stay in the details (over
  HTTP: hard values).
- mode="soft": teacher-forced digit probabilities. For each dimension the answer line's prefix is forced
  and the digit distribution over low..high is read from the next token (renormalised over the digits);
  the argmax digit is then forced before the next line. The value is VideoScore2's `normed` soft score
  (argmax digit times its probability; VideoScore2's default) or the `expected` digit (the others'
  default), `soft_formula=` overrides. Unlike VideoScore2's script, which reads the digit's distribution
  where its own sampled answer wrote it (after its reasoning), the answer lines are forced at once: a
  fast, deterministic approximation. Pairwise verdicts in soft mode are P("1") vs P("2") after the forced
  prefix "... Image ". In-process backend only.

Decoding and media follow each original's inference code by default (options restore our earlier choices):
- token limit per request: UnifiedReward-Think 512 for images, 1024 for videos in-process
  (UnifiedReward-Think/inference_qwen/{image,video}_generation/qwen_infer_cot_*.py @ ff6f520), 4096 over an
  OpenAI-compatible server (UnifiedReward-Think/vllm_qwen/vllm_request.py @ ff6f520 and CodeGoat24/Pref-GRPO
  vllm_utils/vllm_request.py @ 3e787f6); UnifiedReward(-2.0) 4096 (vllm_qwen/vllm_request.py @ ff6f520);
  VideoScore2 1024 (vs2_inference.py @ e6abe26). `max_new_tokens=` overrides. A generation that reaches the
  limit before an answer is NaN like any unreadable verdict, and also flagged in `details["truncated"]`,
  counted in `judge.truncated_count` and warned about, so a cut-off reasoning trace never passes for a tie.
- VideoScore2 samples at temperature 0.7 (seeded, `seed=`) on the frames qwen_vl_utils keeps at 2 fps
  (`sample_fps=2.0`: a clip tensor needs its rate, `score(..., fps=)` or `set_clip_fps`); `temperature=0`
  decodes greedily, `sample_fps=0` keeps the frames given.
- UnifiedReward's video pointwise prompt gets 16 frames as 16 images, picked as its read_video_frames picks
  them (`unifiedreward_frame_indices`; point_score_APS_video_generation.py @ ff6f520); `video_frames=0` sends
  one video. Not reproduced: the original writes each frame as a JPEG (cv2, quality 95) first; we send pixels.
- Pixels: unset `min_pixels`/`max_pixels` follow qwen_vl_utils' defaults per medium (images 4..16384 patches
  of 28x28, video frames 128..768), the originals' native resolution; resized as qwen_vl_utils resizes, on
  8-bit values (Pillow's bicubic for images, torchvision's for video frames), not on floats.
- Alpha: transparent images lose it (PIL `convert("RGB")`), as UnifiedReward's scripts do: its README @ ff6f520
  installs qwen-vl-utils 0.0.8 for the in-process Qwen2.5-VL scripts, whose `fetch_image` converts (0.0.9 and later
  paste RGBA on white), and the 2.0 pointwise scripts `convert("RGB")` before their JPEG to the vLLM server
  (tests/mmreward/test_parity_vlm_judges.py checks RGBA images).

Template text is the official one, verbatim (pass `pointwise_template=`/`pairwise_template=` to change it):
- UnifiedReward pointwise: CodeGoat24/UnifiedReward (commit ff6f520)
  inference_qwen/UnifiedReward-2.0-inference/point_score_ACS_image_generation.py (images: alignment,
  coherence, style) and point_score_APS_video_generation.py (videos: alignment, physics, style), the
  UnifiedReward-2.0 format 'Alignment Score (1-5): X' (the 2.0 models write decimals, which we parse).
- UnifiedReward pairwise: inference_qwen/image_generation/qwen_pair_rank_image_generation.py and
  inference_qwen/video_generation/qwen_pair_rank_video_generation.py ('Image 1 is better.', ties as
  'Both images are equally good.').
- UnifiedReward-Think pairwise: UnifiedReward-Think/inference_qwen/{image,video}_generation/
  qwen_infer_cot_{image,video}_generation.py (<think>...</think><answer>Image 1 is better</answer>).
  Its pointwise prompt is our own wording: the repository has none for Think.
- VideoScore2: TIGER-AI-Lab/VideoScore2 vs2_inference.py (commit e6abe26), VS2_QUERY_TEMPLATE with its
  indentation and trailing spaces; answer lines 'visual quality: 4;' etc., also accepted as numbered
  lines '(1) visual quality - clarity, ...: 4'. Where a label appears several times (a reasoning trace
  quoting the format), the last value wins; VideoScore2's own regex takes the first.
"""

from __future__ import annotations

import torch

from mmreward.errors import RewardInputError
from mmreward.prompt_templates.vlm import FAMILIES, JudgeFamily  # the official template texts, as data
from mmreward.types import PairwiseOutput, Reward, RewardOutput, normalize_prompts


class VLMJudge(Reward):
    name = "vlm-judge"
    requires_prompt = True
    may_return_nan = True

    def __init__(self, backend, family: JudgeFamily, *, mode: str = "generate", samples: int = 1,
                 temperature: float | None = None, seed: int = 0, debias: bool = True,
                 pointwise_template: str | None = None, pairwise_template: str | None = None,
                 soft_formula: str | None = None, max_new_tokens: int | None = None,
                 video_frames: int | None = None, sample_fps: float | None = None,
                 micro_batch_size: int = 8) -> None:
        """`temperature`, `max_new_tokens` (per request), `video_frames` (a pointwise video sent as that many
        sampled frames; 0: as one video) and `sample_fps` (frames kept per second of video; 0: every frame
        given) default to the family's original settings (see the module docstring)."""
        super().__init__(micro_batch_size=micro_batch_size)
        temperature = family.temperature if temperature is None else temperature
        if max_new_tokens is not None and max_new_tokens < 1:
            raise RewardInputError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if mode not in ("generate", "soft"):
            raise RewardInputError(f"mode must be 'generate' or 'soft', got {mode!r}")
        if samples < 1:
            raise RewardInputError(f"samples must be >= 1, got {samples}")
        if samples > 1 and temperature <= 0:
            raise RewardInputError("samples > 1 (voting) needs temperature > 0; greedy samples are identical")
        if mode == "soft" and not getattr(backend, "supports_choice_probs", False):
            raise RewardInputError(f"mode='soft' needs token probabilities, which the {backend.name} backend lacks")
        self.backend = backend
        if isinstance(getattr(backend, "model", None), torch.nn.Module):
            self.vlm = backend.model  # registered so .to(device) and dtype follow the judge
        self.family = family
        self.name = family.name
        self.modalities = family.modalities
        self.mode, self.samples, self.temperature, self.seed, self.debias = mode, samples, temperature, seed, debias
        if soft_formula is not None and soft_formula not in ("expected", "normed"):
            raise RewardInputError(f"soft_formula must be 'expected' or 'normed', got {soft_formula!r}")
        self.soft_formula = soft_formula or family.soft_formula
        self.pointwise_template = pointwise_template  # None: the family's official text for the medium
        self.pairwise_template = pairwise_template
        self.last_agreement_rate = float("nan")
        self.max_new_tokens = max_new_tokens  # None: the family's limit for the medium
        self.video_frames = family.video_frames if video_frames is None else (video_frames or None)
        fps = family.sample_fps if sample_fps is None else (sample_fps or None)
        if fps is not None:  # Reward.prepare keeps these frames of each clip (qwen_vl_utils' smart_nframes)
            self.card_fps, self.card_fps_sampling = float(fps), "qwen-vl-utils"
        self.truncated_count = 0  # generations that hit the token limit before an answer, since loading

    # -- decoding -----------------------------------------------------------------------------
    def _limit(self, medium: str) -> int | None:
        if self.max_new_tokens is not None:
            return self.max_new_tokens
        return (self.family.max_new_tokens or {}).get(medium)

    def _generate(self, requests, medium: str) -> list[list[str]]:
        """backend.generate with the family's token limit, grouping requests that carry as many media
        (clips of different lengths sent as frames) because a backend batch must be uniform."""
        import inspect

        kwargs = {"n": self.samples, "temperature": self.temperature, "seed": self.seed}
        limit = self._limit(medium)
        if limit is not None and "max_new_tokens" in inspect.signature(self.backend.generate).parameters:
            kwargs["max_new_tokens"] = limit
        groups: dict[tuple, list[int]] = {}
        for i, r in enumerate(requests):
            groups.setdefault((len(r.media), r.kind), []).append(i)
        out: list[list[str]] = [[] for _ in requests]
        for idx in groups.values():
            for i, texts in zip(idx, self.backend.generate([requests[i] for i in idx], **kwargs)):
                out[i] = texts
        return out

    def _truncated(self, texts, failed: torch.Tensor, medium: str) -> torch.Tensor:
        """Per request, the fraction of samples cut by the token limit with no answer read (counted and
        warned about: a cut-off verdict is not a judgement, and as a tie it flattens win rates)."""
        from mmreward.judges.backends import is_truncated

        cut = torch.tensor([[is_truncated(t) for t in row] for row in texts], dtype=torch.bool)
        cut = cut & failed.reshape(cut.shape)
        n = int(cut.sum())
        if n:
            import warnings

            self.truncated_count += n
            warnings.warn(f"{self.name}: {n} of {cut.numel()} generations reached max_new_tokens="
                          f"{self._limit(medium)} before an answer (NaN, flagged in details['truncated']); "
                          "raise max_new_tokens", RuntimeWarning, stacklevel=3)
        return cut.float().mean(dim=1)

    def _frames_as_images(self, media) -> list[list[torch.Tensor]]:
        """Each clip as `video_frames` images, sampled as UnifiedReward's read_video_frames does."""
        return [[v[i] for i in unifiedreward_frame_indices(v.shape[0], self.video_frames)] for v in media]

    # -- prompts ------------------------------------------------------------------------------
    @staticmethod
    def _medium(media) -> str:
        return "video" if media[0].ndim == 4 else "image"

    def _pointwise_for(self, medium: str) -> str:
        return self.pointwise_template or self.family.pointwise[medium]

    def _pairwise_for(self, medium: str) -> str | None:
        if self.pairwise_template:
            return self.pairwise_template
        return self.family.pairwise[medium] if self.family.pairwise is not None else None

    def _fill(self, template: str, prompt: str, medium: str) -> str:
        return template.replace("{prompt}", prompt).replace("{medium}", medium).replace("{Medium}", medium.capitalize())

    def _requests(self, template, prompts, groups, medium: str | None = None):
        from mmreward.judges.backends import JudgeRequest

        medium = medium or self._medium(groups[0])
        return [JudgeRequest(self._fill(template, p, medium), list(g)) for p, g in zip(prompts, groups)]

    # -- pointwise ----------------------------------------------------------------------------
    def _score(self, prompts, media):
        medium = self._medium(media)
        labels = self.family.dimensions[medium]
        groups = ([[m] for m in media] if medium != "video" or not self.video_frames
                  else self._frames_as_images(media))
        requests = self._requests(self._pointwise_for(medium), prompts, groups, medium)
        if self.mode == "soft":
            return self._soft_score(requests, labels)
        if (self.family.generated_soft and self.samples == 1 and labels != ("",)
                and hasattr(self.backend, "generate_with_choice_probs")):
            return self._generated_soft_score(requests, labels)
        from mmreward.judges.parsers import parse_dimensions, parse_score

        outs = self._generate(requests, medium)
        fam = self.family
        vals = torch.full((len(requests), self.samples), float("nan"))
        dims = {d: torch.full((len(requests), self.samples), float("nan")) for d in labels if d}
        for i, texts in enumerate(outs):
            for j, text in enumerate(texts):
                if labels == ("",):
                    parsed = parse_score(text, fam.low, fam.high)
                else:
                    parsed = parse_dimensions(text, labels, fam.low, fam.high)
                    for d, v in parsed.values.items():
                        dims[d][i, j] = v
                vals[i, j] = parsed.value
        from mmreward.judges.debias import vote

        score, count = vote(vals)
        details = {"parse_failed": 1.0 - count.float() / self.samples,
                   "truncated": self._truncated(outs, torch.isnan(vals), medium)}
        details.update({d: vote(v)[0] for d, v in dims.items()})
        return RewardOutput(score, details, [t[0] for t in outs])

    def _generated_soft_score(self, requests, labels):
        """VideoScore2's inference: generate, parse each dimension's digit, and score it from the digit
        distribution at the step that wrote it (normed by default). Hard values stay in the details."""
        import math

        from mmreward.judges.parsers import parse_dimensions

        fam = self.family
        digits = [str(d) for d in range(int(fam.low), int(fam.high) + 1)]
        values = torch.tensor([float(d) for d in digits])
        import inspect

        kwargs = {"temperature": self.temperature, "seed": self.seed}
        limit = self._limit("video" if requests[0].kind == "video" else "image")
        if limit is not None and "max_new_tokens" in inspect.signature(self.backend.generate_with_choice_probs).parameters:
            kwargs["max_new_tokens"] = limit
        texts, ids, probs = self.backend.generate_with_choice_probs(requests, digits, **kwargs)
        n = len(requests)
        hard = {d: torch.full((n,), float("nan")) for d in labels}
        soft = {d: torch.full((n,), float("nan")) for d in labels}
        for i, text in enumerate(texts):
            parsed = parse_dimensions(text, labels, fam.low, fam.high)
            for d in labels:
                hard[d][i] = parsed.values[d]
                if math.isnan(parsed.values[d]):
                    continue
                k = self.backend.token_index_at(ids[i], parsed.positions[d])
                if not 0 <= k < len(probs[i]):
                    continue
                p = probs[i][k]
                top_p, top = p.max(dim=0)
                soft[d][i] = values[top] * top_p if self.soft_formula == "normed" else p @ values
        score = torch.stack([soft[d] for d in labels], dim=1).mean(dim=1)  # NaN when a dimension is missing
        truncated = self._truncated([[t] for t in texts], torch.isnan(score)[:, None], requests[0].kind)
        details = {"parse_failed": torch.isnan(score).float(), "truncated": truncated, **hard}
        details.update({f"{d} (soft)": soft[d] for d in labels})
        return RewardOutput(score, details, texts)

    def _soft_score(self, requests, labels):
        fam = self.family
        digits = [str(d) for d in range(int(fam.low), int(fam.high) + 1)]
        values = torch.tensor([float(d) for d in digits])
        prefix = "<answer>Final Score: " if labels == ("",) else ""
        per_dim = {}
        forced = [""] * len(requests)
        for k, label in enumerate(labels):
            line = prefix if not label else f"{label}{fam.label_suffix}: "
            forced = [f + line for f in forced]
            probs = self._choice_probs_varying(requests, forced, digits)
            top_p, top = probs.max(dim=1)
            # 'normed' is VideoScore2's ll_based_soft_score_normed: the likeliest digit times its probability
            # renormalised over the digits; 'expected' is the mean digit under that distribution.
            per_dim[label or "score"] = values[top] * top_p if self.soft_formula == "normed" else probs @ values
            end = fam.line_ends[k] if fam.line_ends else ("\n" if k < len(labels) - 1 else "")
            forced = [f + digits[b] + end for f, b in zip(forced, top.tolist())]
        stacked = torch.stack(list(per_dim.values()), dim=1)
        return RewardOutput(stacked.mean(dim=1), {k: v for k, v in per_dim.items()})

    def _choice_probs_varying(self, requests, prefixes, choices):
        if len(set(prefixes)) == 1:
            return self.backend.choice_probs(requests, prefixes[0], choices)
        if getattr(self.backend, "supports_prefix_lists", False):
            return self.backend.choice_probs(requests, list(prefixes), choices)
        # otherwise requests with the same forced prefix share one call
        out = torch.empty(len(requests), len(choices))
        by_prefix: dict[str, list[int]] = {}
        for i, p in enumerate(prefixes):
            by_prefix.setdefault(p, []).append(i)
        for p, idx in by_prefix.items():
            out[idx] = self.backend.choice_probs([requests[i] for i in idx], p, choices)
        return out

    # -- pairwise -----------------------------------------------------------------------------
    def _first_better(self, prompts, first, second
                      ) -> tuple[torch.Tensor, torch.Tensor, list[str] | None, torch.Tensor]:
        """(P(first better) per pair, failed-sample fraction, first texts, truncated-sample fraction) for one
        presentation order."""
        medium_name = self._medium([first[0]])
        template = self._pairwise_for(medium_name)
        requests = self._requests(template, prompts, [[x, y] for x, y in zip(first, second)])
        if self.mode == "soft":
            medium = self._medium([first[0]]).capitalize()
            prefix = self.family.pair_prefix.replace("{Medium}", medium)
            probs = self.backend.choice_probs(requests, prefix, ["1", "2"])
            return probs[:, 0], torch.zeros(len(requests)), None, torch.zeros(len(requests))
        from mmreward.judges.debias import vote
        from mmreward.judges.parsers import parse_pairwise

        outs = self._generate(requests, medium_name)
        verdicts = torch.tensor([[parse_pairwise(t).value for t in texts] for texts in outs])
        v, count = vote(verdicts)
        cut = self._truncated(outs, torch.isnan(verdicts), medium_name)
        return v, 1.0 - count.float() / self.samples, [t[0] for t in outs], cut

    def compare(self, prompts, media_a, media_b, *, value_range=None) -> PairwiseOutput:
        a = self.prepare(media_a, value_range)
        b = self.prepare(media_b, value_range)
        if len(a) != len(b):
            raise RewardInputError(f"media_a and media_b must have the same length: got {len(a)} and {len(b)} items")
        if len(a) == 0:
            raise RewardInputError("media_a: got an empty batch; pass at least one pair")
        if self._pairwise_for(self._medium(a)) is None:
            # no pairwise prompt was trained (VideoScore2): Bradley-Terry on the two pointwise scores
            self.last_agreement_rate = float("nan")
            return super().compare(prompts, a, b)
        prompt_list = normalize_prompts(prompts, len(a), required=self.requires_prompt)
        from mmreward.functional.pairwise import agreement_rate, debias

        with torch.inference_mode():
            v_ab, fail_ab, texts, cut_ab = self._first_better(prompt_list, list(a), list(b))
            if not self.debias:
                self.last_agreement_rate = float("nan")
                return PairwiseOutput(prob_a=v_ab.clone(), details={"v_ab": v_ab.clone(), "parse_failed": fail_ab.clone(),
                                                                    "truncated": cut_ab.clone()},
                                      rationales=texts)
            v_ba, fail_ba, _, cut_ba = self._first_better(prompt_list, list(b), list(a))
        prob, agree = debias(v_ab, v_ba)
        self.last_agreement_rate = agreement_rate(agree)
        details = {"v_ab": v_ab.clone(), "v_ba": v_ba.clone(), "agreement": agree.clone(),
                   "parse_failed": ((fail_ab + fail_ba) / 2).clone(), "truncated": ((cut_ab + cut_ba) / 2).clone()}
        return PairwiseOutput(prob_a=prob.clone(), details=details, rationales=texts)

    @property
    def compare_debiased(self) -> bool:
        """`compare` asks both orders itself (debias=True), so group win rates need not swap again."""
        return self.debias

    def group_win_rates(self, prompt: str, group, *, mode: str = "hard") -> torch.Tensor:
        """Pref-GRPO rewards for one group: each candidate's mean credit against every other one (hard wins,
        NaN -> 0.5), each pair judged once through `compare` (mmreward.compose.group_win_rates)."""
        from mmreward.compose import group_win_rates

        media = self.prepare(group)
        return group_win_rates(self, [prompt] * len(media), media, len(media), both_orders=False, mode=mode).win_rates


def unifiedreward_frame_indices(total: int, num_frames: int) -> list[int]:
    """The frames UnifiedReward-2.0's video scripts keep (`read_video_frames`: frame k is kept when it is one of
    int(i * total / num_frames), i < num_frames, reading in order): `num_frames` distinct frames, or every
    frame of a shorter clip."""
    if total < 1 or num_frames < 1:
        raise RewardInputError(f"video_frames: need a clip with frames and num_frames >= 1, got {total}, {num_frames}")
    return sorted({int(i * total / num_frames) for i in range(num_frames)})


# ----------------------------------------------------------------------------------------------
# loaders
# ----------------------------------------------------------------------------------------------
def make_backend(checkpoint, weights, *, backend: str = "transformers", base_url: str | None = None,
                 api_key: str | None = None, tiny: bool = False, min_pixels: int | None = None,
                 max_pixels: int | None = None, max_new_tokens: int = 256, timeout: float = 60.0,
                 max_retries: int = 3, max_concurrency: int = 8, image_format: str = "png",
                 qwen_pixels: bool = False, backoff: float = 0.5, extra_body: dict | None = None):
    """A judge backend. `qwen_pixels=True` (the judges): unset pixel bounds follow qwen_vl_utils' per-medium
    defaults, as the originals' scripts; otherwise 4*28*28..448*448 (the other generative families)."""
    from mmreward.judges.backends import OpenAIChatBackend, TransformersBackend

    if backend == "openai":
        if not base_url:
            raise RewardInputError("backend='openai' needs base_url, e.g. 'http://127.0.0.1:8000/v1'")
        return OpenAIChatBackend(base_url, str(checkpoint or "default"), api_key=api_key, timeout=timeout,
                                 max_retries=max_retries, max_concurrency=max_concurrency, max_tokens=max_new_tokens,
                                 image_format=image_format, backoff=backoff, extra_body=extra_body)
    if backend != "transformers":
        raise RewardInputError(f"backend must be 'transformers' or 'openai', got {backend!r}")
    from mmreward.backbones import qwen_vl

    if tiny:
        from mmreward.models.vlm_heads import _tiny_base

        checkpoint = _tiny_base(())  # tiny=True always means the seeded tiny model
        min_pixels = min_pixels or 28 * 28
        max_pixels = max_pixels or 56 * 56
        max_new_tokens = min(max_new_tokens, 8)
    elif not qwen_pixels:
        min_pixels, max_pixels = min_pixels or 28 * 28 * 4, max_pixels or 448 * 448
    processor = qwen_vl.load_processor(checkpoint)
    model = (qwen_vl.vlm_from_config(qwen_vl.load_config(checkpoint)) if weights == "random"
             else qwen_vl.load_vlm(checkpoint))
    # the judges' originals resize 8-bit images with qwen_vl_utils (tests/mmreward/test_parity_vlm_judges.py)
    return TransformersBackend(model, processor, min_pixels=min_pixels, max_pixels=max_pixels,
                               max_new_tokens=max_new_tokens, resize="8-bit" if qwen_pixels else "float")


_BACKEND_KEYS = ("backend", "base_url", "api_key", "tiny", "min_pixels", "max_pixels", "max_new_tokens", "timeout",
                 "max_retries", "max_concurrency", "image_format", "backoff", "extra_body")


def _load(family: str, checkpoint, weights, options) -> VLMJudge:
    fam = FAMILIES[family]
    backend_opts = {k: options.pop(k) for k in _BACKEND_KEYS if k in options}
    if "max_new_tokens" in backend_opts:  # the user's limit holds for every medium
        options.setdefault("max_new_tokens", backend_opts["max_new_tokens"])
    else:  # the backend's own limit is the largest the family asks for; each request asks its medium's
        over_http = backend_opts.get("backend") == "openai"
        backend_opts["max_new_tokens"] = fam.http_max_tokens if over_http else max(fam.max_new_tokens.values())
        if over_http:
            options.setdefault("max_new_tokens", fam.http_max_tokens)
    backend = make_backend(checkpoint, weights, qwen_pixels=True, **backend_opts)
    if backend_opts.get("tiny"):
        options["max_new_tokens"] = backend.max_new_tokens  # the tiny model's short cap holds
    return VLMJudge(backend, fam, **options)


def load_unifiedreward(checkpoint=None, *, weights="pretrained", **options) -> VLMJudge:
    return _load("unifiedreward", checkpoint, weights, options)


def load_unifiedreward_think(checkpoint=None, *, weights="pretrained", **options) -> VLMJudge:
    return _load("unifiedreward-think", checkpoint, weights, options)


def load_videoscore2(checkpoint=None, *, weights="pretrained", **options) -> VLMJudge:
    return _load("videoscore2", checkpoint, weights, options)
