"""PaCo-Reward (Ping et al., PaCo-RL 2025): a pairwise consistency judge scored by P("Yes").

PaCo-Reward-7B (Qwen2.5-VL-7B fine-tuned on PaCo-Dataset) sees two images and a question such as
"do the two images maintain consistency in terms of style, logic and identity?" and is trained to answer
"Yes"/"No" first, then give its reasons (a chain of thought after the verdict, with the first answer
token's loss weighted separately). The reward is generative and autoregressive: it is read from the
first answer token only, P(Yes) / (P(Yes) + P(No)) (`mmreward.judges.yes_no`), so no reasons are
decoded at scoring time.

What `score` computes (PaCo-GRPO's `consistency_score` reward): each image is a grid of panels (rows x
cols from `grid=`, else parsed from the prompt as PaCo-RL does, e.g. "a 2x2 grid"); the panels are cut
with floor division from the top-left; every unordered pair of panels (i < j, in row-major order,
earlier panel first) is judged; the score is the mean P(Yes) over the pairs.
`consistency(prompts, first, second)` judges explicit pairs (ConsistencyRank: reference, candidate);
`edit_score(instructions, originals, edited)` is PaCo-GRPO's editing reward, the geometric mean of the
consistency and instruction-following P(Yes).

Template text, verbatim from X-GenGroup/PaCo-RL (commit 08caac6):
- "grpo" (default): PaCo-GRPO/paco_grpo/rewards/consistency_scorer.py, prompt_template_version=1, the
  RL reward; {prompt} is the theme, the prompt's text before its first panel tag (PaCo-RL's
  `divide_prompt`; a prompt without panel tags is its own theme), ending in '.'.
- "eval" / "binary" / "criteria": PaCo-Reward/evaluation/Consistency_Rank/consistency_scorer*.py
  prompt templates 3 (the evaluation default), 2 and 1 ({prompt} is the criterion text).
- edit templates: PaCo-GRPO/paco_grpo/rewards/consistency_for_editing.py.
Layout: the two images come first in the user turn, then the text, through the checkpoint's chat template
(what PaCo-GRPO sends to its vLLM server). `image_labels=True` puts "<img1>: " / "<img2>: " before the
images as PaCo-Reward's offline evaluation scripts do. Over HTTP, images go as JPEG data URLs (PIL's
default quality, as PaCo-RL's `pil_image_to_base64`).

In-process, each panel takes the same JPEG round trip (`jpeg_round_trip=False` skips it) and is resized as the
served processor resizes it (Pillow's bicubic on 8-bit values; tests/mmreward/test_parity_paco.py).

Deviations, on purpose: in-process we read the whole first-token distribution, so P(Yes) is exact even
when 'Yes' or 'No' falls outside the top 20 log-probabilities PaCo-RL gets from vLLM; when a server's top
log-probabilities contain neither answer, the pair is NaN and flagged (`details["parse_failed"]`) where
PaCo-RL returns 0.0; failed requests raise instead of scoring 0.0.
"""

from __future__ import annotations

import itertools
import re

import torch

from mmreward.errors import RewardInputError
from mmreward.prompt_templates.vlm import EDIT_CONSISTENCY, EDIT_FOLLOWING, TEMPLATES
from mmreward.types import Reward, RewardOutput, normalize_prompts

IMAGE_LABELS = ("<img1>: ", "<img2>: ")

_PANEL_SEP = re.compile(r"[\.\"]\s+[A-Z0-9-\[\]]+:")  # '. [TOP]-[LEFT]:' between panel descriptions
_GRID = re.compile(r"(\d+)\s*[x⨉]\s*(\d+)")


def split_panel_prompt(prompt: str) -> list[str]:
    """PaCo-RL's `divide_prompt`: the theme, then one text per panel, each ending in '.'."""
    seps = _PANEL_SEP.findall(prompt)
    parts = re.split("|".join(map(re.escape, seps)), prompt) if seps else [prompt]
    return [p if not p.strip() or p.strip()[-1] == "." else p + "." for p in parts]


def grid_from_prompt(prompt: str) -> tuple[int, int]:
    """PaCo-RL's `extract_grid_info`: the first 'RxC' in the prompt, else (1, 1)."""
    m = _GRID.search(prompt)
    return (int(m.group(1)), int(m.group(2))) if m else (1, 1)


def grid_panels(image: torch.Tensor, rows: int, cols: int) -> list[torch.Tensor]:
    """Row-major panels of a (3, H, W) image, each (3, H // rows, W // cols), as PIL crops them."""
    h, w = image.shape[-2] // rows, image.shape[-1] // cols
    return [image[:, i * h:(i + 1) * h, j * w:(j + 1) * w] for i in range(rows) for j in range(cols)]


def jpeg_round_trip(image: torch.Tensor) -> torch.Tensor:
    """(3, H, W) in [0, 1] -> 8-bit -> JPEG at PIL's default settings -> decoded, in [0, 1] (what the judge sees
    of PaCo-RL's `pil_image_to_base64(image)`: `image.save(buffer, format="JPEG")`)."""
    import io

    import numpy as np
    from PIL import Image

    arr = (image.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).cpu().numpy()
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="JPEG")
    decoded = np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB"))
    return torch.from_numpy(decoded.copy()).permute(2, 0, 1).float().div(255).to(image.device)


class PacoReward(Reward):
    name = "paco-reward"
    modalities = ("image",)
    requires_prompt = True
    may_return_nan = True

    def __init__(self, backend, *, template: str = "grpo", grid: tuple[int, int] | None = None,
                 image_labels: bool = False, canonicalize: bool = False, mode: str = "soft",
                 both_orders: bool = False, top_logprobs: int = 20, jpeg_round_trip: bool = True,
                 micro_batch_size: int = 4) -> None:
        """`jpeg_round_trip` (in-process backends): each panel goes through a JPEG at PIL's default quality
        first, as PaCo-RL's `pil_image_to_base64` sends it to the judge; False scores the pixels as given."""
        super().__init__(micro_batch_size=micro_batch_size)
        if mode not in ("soft", "generate"):
            raise RewardInputError(f"mode must be 'soft' (P(Yes), PaCo-RL's score) or 'generate', got {mode!r}")
        text = TEMPLATES.get(template, template)
        if template not in TEMPLATES and not ("{prompt}" in template or " " in template.strip()):
            raise RewardInputError(
                f"template: expected one of {sorted(TEMPLATES)} or a question text (with optional {{prompt}}), "
                f"got {template!r}"
            )
        if grid is not None:
            if len(grid) != 2 or not all(isinstance(g, int) and g >= 1 for g in grid) or grid[0] * grid[1] < 2:
                raise RewardInputError(f"grid: expected (rows, cols) of positive ints with at least 2 panels, got {grid!r}")
            grid = (int(grid[0]), int(grid[1]))
        if mode == "soft" and not (hasattr(backend, "next_token_logprobs") or _overrides(backend, "top_logprobs")):
            raise RewardInputError(f"mode='soft' needs token log-probabilities, which the {backend.name} backend lacks")
        self.backend = backend
        if isinstance(getattr(backend, "model", None), torch.nn.Module):
            self.vlm = backend.model  # registered so .to(device) and dtype follow the reward
        self.template, self.grid, self.mode = text, grid, mode
        self.labels = IMAGE_LABELS if image_labels else None
        self.canonicalize, self.both_orders, self.top_k = canonicalize, both_orders, top_logprobs
        # an HTTP backend encodes its own JPEG data URLs; in-process the round trip is ours to do
        self.jpeg_round_trip = jpeg_round_trip and getattr(backend, "processor", None) is not None
        self.requires_prompt = "{prompt}" in text
        self._answer_ids: tuple[list[int], list[int]] | None = None

    # -- the judge ----------------------------------------------------------------------------
    def _requests(self, texts: list[str], pairs: list[tuple[torch.Tensor, torch.Tensor]]):
        from mmreward.judges.backends import JudgeRequest

        if self.jpeg_round_trip:
            pairs = [(jpeg_round_trip(a), jpeg_round_trip(b)) for a, b in pairs]
        return [JudgeRequest(t, [a, b], media_labels=self.labels) for t, (a, b) in zip(texts, pairs)]

    def _judge(self, texts, pairs) -> tuple[torch.Tensor, list[str] | None]:
        """(P(Yes) per pair (NaN when unreadable), generated texts in generate mode)."""
        requests = self._requests(texts, pairs)
        if self.mode == "generate":
            from mmreward.judges.parsers import parse_yes_no

            outs = [o[0] for o in self.backend.generate(requests)]
            return torch.tensor([parse_yes_no(t).value for t in outs]), outs
        from mmreward.judges import yes_no

        if hasattr(self.backend, "next_token_logprobs"):
            if self._answer_ids is None:
                self._answer_ids = yes_no.answer_token_ids(self.backend.processor.tokenizer, self.canonicalize)
            logp = self.backend.next_token_logprobs(requests)
            return yes_no.yes_probability_from_logprobs(logp, *self._answer_ids), None
        tops = self.backend.top_logprobs(requests, k=self.top_k)
        return torch.tensor([yes_no.yes_probability(t, self.canonicalize) for t in tops]), None

    def _judge_pairs(self, texts, pairs) -> tuple[torch.Tensor, torch.Tensor, list[str] | None]:
        """(P(Yes), |order gap| or zeros, texts); with both_orders the two presentation orders are averaged."""
        p, outs = self._judge(texts, pairs)
        if not self.both_orders:
            return p, torch.zeros_like(p), outs
        q, _ = self._judge(texts, [(b, a) for a, b in pairs])
        return (p + q) / 2, (p - q).abs(), outs

    def _fill(self, template: str, prompt: str) -> str:
        return template.replace("{prompt}", prompt)

    # -- public API ---------------------------------------------------------------------------
    def _score(self, prompts, media):
        texts, pairs, owner = [], [], []
        for i, (prompt, image) in enumerate(zip(prompts, media)):
            rows, cols = self.grid or grid_from_prompt(prompt)
            if rows * cols < 2:
                raise RewardInputError(
                    f"prompts[{i}]: paco-reward scores the consistency between the panels of a grid image, but "
                    f"the prompt {prompt[:60]!r} names no grid (such as '2x2') and grid= was not given. Pass "
                    "grid=(rows, cols) when loading, or use .consistency(prompts, first, second) for image pairs."
                )
            if image.shape[-2] < rows or image.shape[-1] < cols:
                raise RewardInputError(f"media[{i}]: a {tuple(image.shape[-2:])} image cannot hold a {rows}x{cols} grid")
            panels = grid_panels(image, rows, cols)
            text = self._fill(self.template, split_panel_prompt(prompt)[0])
            for a, b in itertools.combinations(range(len(panels)), 2):
                texts.append(text)
                pairs.append((panels[a], panels[b]))
                owner.append(i)
        p, gap, outs = self._judge_pairs(texts, pairs)
        return _reduce_pairs(p, gap, torch.tensor(owner), len(prompts), outs)

    def consistency(self, prompts, first, second, *, value_range=None) -> RewardOutput:
        """P(Yes) per explicit pair, first image shown first (ConsistencyRank: reference, then candidate)."""
        a, b = self.prepare(first, value_range), self.prepare(second, value_range)
        if len(a) != len(b) or len(a) == 0:
            raise RewardInputError(f"first and second must be non-empty and of the same length: got {len(a)} and {len(b)}")
        prompt_list = normalize_prompts(prompts, len(a), required=self.requires_prompt)
        texts = [self._fill(self.template, split_panel_prompt(p)[0]) for p in prompt_list]
        with torch.inference_mode():
            p, gap, outs = self._judge_pairs(texts, list(zip(a, b)))
        return _reduce_pairs(p, gap, torch.arange(len(a)), len(a), outs).detach()

    def edit_score(self, instructions, originals, edited, *, value_range=None) -> RewardOutput:
        """PaCo-GRPO's editing reward: sqrt(P(consistent with the original) * P(follows the instruction))."""
        a, b = self.prepare(originals, value_range), self.prepare(edited, value_range)
        if len(a) != len(b) or len(a) == 0:
            raise RewardInputError(f"originals and edited must be non-empty and of the same length: got {len(a)} and {len(b)}")
        prompt_list = normalize_prompts(instructions, len(a), required=True)
        pairs = list(zip(a, b))
        with torch.inference_mode():
            both, outs = self._judge([self._fill(EDIT_CONSISTENCY, p) for p in prompt_list]
                                     + [self._fill(EDIT_FOLLOWING, p) for p in prompt_list], pairs + pairs)
        cons, follow = both[: len(a)], both[len(a):]
        details = {"consistency": cons, "instruction_following": follow,
                   "parse_failed": (torch.isnan(cons).float() + torch.isnan(follow).float()) / 2}
        return RewardOutput((cons * follow).sqrt(), details, outs[: len(a)] if outs else None).detach()


def _overrides(backend, method: str) -> bool:
    from mmreward.judges.backends import JudgeBackend

    return getattr(type(backend), method, None) is not getattr(JudgeBackend, method)


def _reduce_pairs(p, gap, owner, n, outs) -> RewardOutput:
    """Per item: mean P(Yes) over its readable pairs (NaN if none), min, failed fraction, order gap."""
    valid = ~torch.isnan(p)
    count = torch.zeros(n).index_add_(0, owner, torch.ones_like(p))
    n_valid = torch.zeros(n).index_add_(0, owner, valid.float())
    total = torch.zeros(n).index_add_(0, owner, torch.where(valid, p, torch.zeros_like(p)))
    score = torch.where(n_valid > 0, total / n_valid.clamp(min=1), torch.full((n,), float("nan")))
    lowest = torch.full((n,), float("inf")).scatter_reduce(0, owner, torch.where(valid, p, torch.full_like(p, float("inf"))), "amin")
    lowest = torch.where(n_valid > 0, lowest, torch.full_like(lowest, float("nan")))
    gap_mean = torch.zeros(n).index_add_(0, owner, torch.where(valid, gap, torch.zeros_like(gap))) / n_valid.clamp(min=1)
    details = {"min_pair": lowest, "parse_failed": 1.0 - n_valid / count, "order_gap": gap_mean}
    rationales = None
    if outs is not None:
        per_item: list[list[str]] = [[] for _ in range(n)]
        for i, text in zip(owner.tolist(), outs):
            per_item[i].append(text)
        rationales = ["\n\n".join(texts) for texts in per_item]
    return RewardOutput(score, details, rationales)


def load_paco_reward(checkpoint=None, *, weights="pretrained", **options) -> PacoReward:
    from mmreward.models.vlm_judge import _BACKEND_KEYS, make_backend

    backend_opts = {k: options.pop(k) for k in _BACKEND_KEYS if k in options}
    if not backend_opts.get("tiny"):
        backend_opts.setdefault("max_pixels", 1024 * 1024 * 2)  # PaCo-Reward's training image_max_pixels
        backend_opts.setdefault("min_pixels", 56 * 56)
    backend_opts.setdefault("image_format", "jpeg")  # PaCo-RL sends JPEG data URLs
    if checkpoint is None and not backend_opts.get("tiny"):
        checkpoint = "X-GenGroup/PaCo-Reward-7B"
    backend = make_backend(checkpoint, weights, **backend_opts)
    if hasattr(backend, "resize"):
        # the served processor (transformers' Qwen2VLImageProcessor of PaCo-RL's vLLM) resizes the decoded 8-bit
        # image with Pillow's bicubic, not a float bicubic
        backend.resize = "8-bit"
    return PacoReward(backend, **options)
