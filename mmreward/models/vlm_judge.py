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
  step that wrote it (`normed`); the hard values stay in the details (over HTTP: hard values).
- mode="soft": teacher-forced digit probabilities. For each dimension the answer line's prefix is forced
  and the digit distribution over low..high is read from the next token (renormalised over the digits);
  the argmax digit is then forced before the next line. The value is VideoScore2's `normed` soft score
  (argmax digit times its probability; VideoScore2's default) or the `expected` digit (the others'
  default), `soft_formula=` overrides. Unlike VideoScore2's script, which reads the digit's distribution
  where its own sampled answer wrote it (after its reasoning), the answer lines are forced at once: a
  fast, deterministic approximation. Pairwise verdicts in soft mode are P("1") vs P("2") after the forced
  prefix "... Image ". In-process backend only.

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
from mmreward.models._vlm_prompts import FAMILIES, JudgeFamily  # the official template texts, as data
from mmreward.types import PairwiseOutput, Reward, RewardOutput, normalize_prompts


class VLMJudge(Reward):
    name = "vlm-judge"
    requires_prompt = True
    may_return_nan = True

    def __init__(self, backend, family: JudgeFamily, *, mode: str = "generate", samples: int = 1,
                 temperature: float = 0.0, seed: int = 0, debias: bool = True,
                 pointwise_template: str | None = None, pairwise_template: str | None = None,
                 soft_formula: str | None = None,
                 micro_batch_size: int = 8) -> None:
        super().__init__(micro_batch_size=micro_batch_size)
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

    def _requests(self, template, prompts, groups):
        from mmreward.judges.backends import JudgeRequest

        medium = self._medium(groups[0])
        return [JudgeRequest(self._fill(template, p, medium), list(g)) for p, g in zip(prompts, groups)]

    # -- pointwise ----------------------------------------------------------------------------
    def _score(self, prompts, media):
        medium = self._medium(media)
        labels = self.family.dimensions[medium]
        requests = self._requests(self._pointwise_for(medium), prompts, [[m] for m in media])
        if self.mode == "soft":
            return self._soft_score(requests, labels)
        if (self.family.generated_soft and self.samples == 1 and labels != ("",)
                and hasattr(self.backend, "generate_with_choice_probs")):
            return self._generated_soft_score(requests, labels)
        from mmreward.judges.parsers import parse_dimensions, parse_score

        outs = self.backend.generate(requests, n=self.samples, temperature=self.temperature, seed=self.seed)
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
        details = {"parse_failed": 1.0 - count.float() / self.samples}
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
        texts, ids, probs = self.backend.generate_with_choice_probs(requests, digits, temperature=self.temperature,
                                                                    seed=self.seed)
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
        details = {"parse_failed": torch.isnan(score).float(), **hard}
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
    def _first_better(self, prompts, first, second) -> tuple[torch.Tensor, torch.Tensor, list[str] | None]:
        """(P(first better) per pair, failed-sample fraction, first texts) for one presentation order."""
        template = self._pairwise_for(self._medium([first[0]]))
        requests = self._requests(template, prompts, [[x, y] for x, y in zip(first, second)])
        if self.mode == "soft":
            medium = self._medium([first[0]]).capitalize()
            prefix = self.family.pair_prefix.replace("{Medium}", medium)
            probs = self.backend.choice_probs(requests, prefix, ["1", "2"])
            return probs[:, 0], torch.zeros(len(requests)), None
        from mmreward.judges.debias import vote
        from mmreward.judges.parsers import parse_pairwise

        outs = self.backend.generate(requests, n=self.samples, temperature=self.temperature, seed=self.seed)
        verdicts = torch.tensor([[parse_pairwise(t).value for t in texts] for texts in outs])
        v, count = vote(verdicts)
        return v, 1.0 - count.float() / self.samples, [t[0] for t in outs]

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
            v_ab, fail_ab, texts = self._first_better(prompt_list, list(a), list(b))
            if not self.debias:
                self.last_agreement_rate = float("nan")
                return PairwiseOutput(prob_a=v_ab.clone(), details={"v_ab": v_ab.clone(), "parse_failed": fail_ab.clone()},
                                      rationales=texts)
            v_ba, fail_ba, _ = self._first_better(prompt_list, list(b), list(a))
        prob, agree = debias(v_ab, v_ba)
        self.last_agreement_rate = agreement_rate(agree)
        details = {"v_ab": v_ab.clone(), "v_ba": v_ba.clone(), "agreement": agree.clone(),
                   "parse_failed": ((fail_ab + fail_ba) / 2).clone()}
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


# ----------------------------------------------------------------------------------------------
# loaders
# ----------------------------------------------------------------------------------------------
def make_backend(checkpoint, weights, *, backend: str = "transformers", base_url: str | None = None,
                 api_key: str | None = None, tiny: bool = False, min_pixels: int | None = None,
                 max_pixels: int | None = None, max_new_tokens: int = 256, timeout: float = 60.0,
                 max_retries: int = 3, max_concurrency: int = 8, image_format: str = "png"):
    from mmreward.judges.backends import OpenAIChatBackend, TransformersBackend

    if backend == "openai":
        if not base_url:
            raise RewardInputError("backend='openai' needs base_url, e.g. 'http://127.0.0.1:8000/v1'")
        return OpenAIChatBackend(base_url, str(checkpoint or "default"), api_key=api_key, timeout=timeout,
                                 max_retries=max_retries, max_concurrency=max_concurrency, max_tokens=max_new_tokens,
                                 image_format=image_format)
    if backend != "transformers":
        raise RewardInputError(f"backend must be 'transformers' or 'openai', got {backend!r}")
    from mmreward.models import _qwen_vl

    if tiny:
        from mmreward.models.vlm_heads import _tiny_base

        checkpoint = _tiny_base(())  # tiny=True always means the seeded tiny model
        min_pixels = min_pixels or 28 * 28
        max_pixels = max_pixels or 56 * 56
        max_new_tokens = min(max_new_tokens, 8)
    processor = _qwen_vl.load_processor(checkpoint)
    model = (_qwen_vl.vlm_from_config(_qwen_vl.load_config(checkpoint)) if weights == "random"
             else _qwen_vl.load_vlm(checkpoint))
    return TransformersBackend(model, processor, min_pixels=min_pixels or 28 * 28 * 4,
                               max_pixels=max_pixels or 448 * 448, max_new_tokens=max_new_tokens)


_BACKEND_KEYS = ("backend", "base_url", "api_key", "tiny", "min_pixels", "max_pixels", "max_new_tokens", "timeout",
                 "max_retries", "max_concurrency", "image_format")


def _load(family: str, checkpoint, weights, options) -> VLMJudge:
    backend_opts = {k: options.pop(k) for k in _BACKEND_KEYS if k in options}
    return VLMJudge(make_backend(checkpoint, weights, **backend_opts), FAMILIES[family], **options)


def load_unifiedreward(checkpoint=None, *, weights="pretrained", **options) -> VLMJudge:
    return _load("unifiedreward", checkpoint, weights, options)


def load_unifiedreward_think(checkpoint=None, *, weights="pretrained", **options) -> VLMJudge:
    return _load("unifiedreward-think", checkpoint, weights, options)


def load_videoscore2(checkpoint=None, *, weights="pretrained", **options) -> VLMJudge:
    return _load("videoscore2", checkpoint, weights, options)
