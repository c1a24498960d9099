"""The client of `mmreward serve`: a Reward whose scores come over HTTP."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import torch

from mmreward.errors import MMRewardError, RewardInputError
from mmreward.serve.wire import encode_tensor
from mmreward.types import PairwiseOutput, Reward, RewardOutput, normalize_prompts


# ----------------------------------------------------------------------------------------------
# client
# ----------------------------------------------------------------------------------------------
class RemoteRewardError(MMRewardError, RuntimeError):
    """The reward server refused a request or could not be reached."""


class RewardClient(Reward):
    """A `Reward` whose scores come from an `mmreward serve` endpoint.

    Besides `score`/`compare`, it speaks the scorer conventions trainers already use:
    `client.flow_grpo_scorer()` returns `fn(images, prompts, metadata) -> (scores, info)` as in
    flow_grpo's reward functions, and `client.compute_score(prompts, images)` returns a list of floats
    (the batched reward-function shape verl-style trainers call).
    """

    def __init__(self, url: str, token: str | None = None, *, timeout: float = 120.0, micro_batch_size: int = 64):
        super().__init__(micro_batch_size=micro_batch_size)
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        info = self._request("GET", "/healthz")
        self.name = info["reward"]
        self.modalities = tuple(info["modalities"])
        self.higher_is_better = bool(info["higher_is_better"])
        self.requires_prompt = bool(info["requires_prompt"])
        self.micro_batch_size = min(micro_batch_size, int(info.get("max_request_items", micro_batch_size)))

    def metrics(self) -> dict:
        """The server's GET /metrics (one replica's: queue depth, batch sizes, latency percentiles)."""
        return self._request("GET", "/metrics")

    def _request(self, method: str, path: str, payload: dict | None = None) -> dict:
        data = json.dumps(payload).encode() if payload is not None else None
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            try:
                msg = json.loads(exc.read()).get("error", "")
            except Exception:  # noqa: BLE001 - a non-JSON error page
                msg = ""
            raise RemoteRewardError(f"{self.url}{path} answered HTTP {exc.code}: {msg}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise RemoteRewardError(f"cannot reach the reward server at {self.url}: {exc}") from exc

    def _score(self, prompts, media):
        if isinstance(media, list):
            return RewardOutput.concat([self._score([p], m[None]) for p, m in zip(prompts, media)])
        body = self._request("POST", "/score", {"prompts": prompts, "media": encode_tensor(media)})
        nan = float("nan")

        def t(v):
            return torch.tensor([nan if x is None else x for x in v], dtype=torch.float32)

        return RewardOutput(t(body["scores"]), {k: t(v) for k, v in body.get("details", {}).items()})

    def compare(self, prompts, media_a, media_b, *, value_range=None) -> PairwiseOutput:

        a, b = self.prepare(media_a, value_range), self.prepare(media_b, value_range)
        if len(a) != len(b):
            raise RewardInputError(f"media_a and media_b must have the same length: got {len(a)} and {len(b)} items")
        if len(a) == 0:
            raise RewardInputError("media_a: got an empty batch; pass at least one pair")
        prompt_list = normalize_prompts(prompts, len(a), required=self.requires_prompt)
        body = self._request("POST", "/compare", {"prompts": prompt_list, "media_a": encode_tensor(torch.stack(list(a))),
                                                  "media_b": encode_tensor(torch.stack(list(b)))})
        nan = float("nan")
        prob = torch.tensor([nan if x is None else x for x in body["prob_a"]], dtype=torch.float32)
        sa = torch.tensor(body["score_a"]) if "score_a" in body else None
        sb = torch.tensor(body["score_b"]) if "score_b" in body else None
        return PairwiseOutput(prob_a=prob, score_a=sa, score_b=sb)

    def compute_score(self, prompts, images, **_: Any) -> list[float]:
        return self.score(prompts, images).scores.tolist()

    def flow_grpo_scorer(self):
        def scorer(images, prompts, metadata=None):
            value_range = None
            if isinstance(images, torch.Tensor) and images.dtype != torch.uint8 and float(images.min()) < 0:
                value_range = (-1.0, 1.0)
            out = self.score(list(prompts), images, value_range=value_range)
            return out.scores.cpu().numpy(), {}

        return scorer
