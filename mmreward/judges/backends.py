"""Where a generative judge runs: in-process transformers, or any OpenAI-compatible chat endpoint.

Both take `JudgeRequest`s (a user text plus media tensors in [0, 1]) and return, per request, a list of
n sampled completions. Decoding is greedy (temperature 0) unless told otherwise.

- `TransformersBackend`: one padded batch through `model.generate` (left padding for generation),
  plus `choice_probs`, which teacher-forces a prefix and reads the next-token distribution over a few
  choices (digit-probability soft scores, P("Image 1") vs P("Image 2")) in one forward, and
  `next_token_logprobs` (the whole first-token distribution, for P("Yes") judges such as PaCo-Reward).
- `OpenAIChatBackend`: POSTs to `{base_url}/chat/completions` (vLLM, SGLang, ...) with `httpx` (the
  `judges` extra), images as base64 PNG data URLs (a video is sent as its frames), a batch's requests all in
  flight at once under a concurrency cap, a per-request timeout, and retries with exponential backoff on
  timeouts, connection errors, 408, 429 and 5xx (honouring Retry-After). Other HTTP errors fail at once
  with the server's message (`JudgeHTTPError`); exhausted retries raise `JudgeUnavailableError`, a
  malformed answer `JudgeResponseError` (all `JudgeBackendError`). `top_logprobs` asks for one token with
  `logprobs`/`top_logprobs` (at most 20, the OpenAI limit). docs/serving.md serves a judge with vLLM/SGLang.
"""

from __future__ import annotations

import asyncio
import base64
import io
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from mmreward.errors import MMRewardError, RewardInputError


class JudgeBackendError(MMRewardError, RuntimeError):
    """A judge backend failed (endpoint unreachable after retries, HTTP error, malformed response)."""


class Completion(str):
    """A generated text that remembers whether it stopped at the token limit (`truncated`): a reasoning
    judge cut off before its <answer> must be reported as cut off, not read as an unparsable verdict."""

    truncated: bool = False

    def __new__(cls, text: str, truncated: bool = False) -> Completion:
        obj = super().__new__(cls, text)
        obj.truncated = bool(truncated)
        return obj


def is_truncated(text: str) -> bool:
    """True when a backend marked `text` as stopped by the token limit (plain strings: False)."""
    return bool(getattr(text, "truncated", False))


# qwen_vl_utils' pixel budgets (QwenLM/Qwen2.5-VL qwen-vl-utils/src/qwen_vl_utils/vision_process.py @ f0af299,
# unchanged through qwen-vl-utils 0.0.14): what the originals' scripts feed the model when they set none.
QWEN_IMAGE_MIN_PIXELS = 4 * 28 * 28
QWEN_IMAGE_MAX_PIXELS = 16384 * 28 * 28
QWEN_VIDEO_MIN_PIXELS = 128 * 28 * 28
QWEN_VIDEO_MAX_PIXELS = 768 * 28 * 28
QWEN_VIDEO_TOTAL_PIXELS = int(128000 * 28 * 28 * 0.9)


def qwen_default_pixels(kind: str, num_frames: int = 1) -> tuple[int, int]:
    """(min_pixels, max_pixels) per image or per video frame, as qwen_vl_utils' fetch_image/fetch_video pick
    them: images 4..16384 patches of 28x28; video frames 128..768 patches, within a total budget shared by
    the frames (`max(min(768*28*28, total / nframes * 2), int(min * 1.05))`)."""
    if kind == "video":
        cap = max(min(QWEN_VIDEO_MAX_PIXELS, QWEN_VIDEO_TOTAL_PIXELS / max(num_frames, 1) * 2),
                  int(QWEN_VIDEO_MIN_PIXELS * 1.05))
        return QWEN_VIDEO_MIN_PIXELS, int(cap)
    return QWEN_IMAGE_MIN_PIXELS, QWEN_IMAGE_MAX_PIXELS


@dataclass
class JudgeRequest:
    text: str
    media: list[torch.Tensor] = field(default_factory=list)  # (3, H, W) images or (T, 3, H, W) videos
    system: str | None = None
    media_labels: tuple[str, ...] | None = None  # text placed before each medium, e.g. ('<img1>: ', '<img2>: ')

    @property
    def kind(self) -> str:
        return "video" if self.media and self.media[0].ndim == 4 else "image"


class JudgeBackend:
    name = "backend"
    supports_choice_probs = False

    def generate(self, requests: Sequence[JudgeRequest], *, n: int = 1, temperature: float = 0.0,
                 seed: int = 0) -> list[list[str]]:
        raise NotImplementedError

    def choice_probs(self, requests: Sequence[JudgeRequest], prefix: str, choices: Sequence[str]) -> torch.Tensor:
        raise JudgeBackendError(
            f"the {self.name} backend cannot read token probabilities; use mode='generate' with it"
        )

    def top_logprobs(self, requests: Sequence[JudgeRequest], k: int = 20) -> list[dict[str, float]]:
        """Per request, {decoded token: log-probability} of the k most likely first answer tokens."""
        raise JudgeBackendError(f"the {self.name} backend cannot return token log-probabilities")


def _check_uniform(requests: Sequence[JudgeRequest]) -> tuple[str, int]:
    if not requests:
        raise RewardInputError("requests: expected at least one judge request")
    counts = {len(r.media) for r in requests}
    kinds = {r.kind for r in requests}
    if len(counts) != 1 or len(kinds) != 1:
        raise RewardInputError("requests: every request of a batch must carry the same number and kind of media")
    if len({r.media_labels for r in requests}) != 1:
        raise RewardInputError("requests: every request of a batch must carry the same media_labels")
    return kinds.pop(), counts.pop()


class TransformersBackend(JudgeBackend):
    name = "transformers"
    supports_choice_probs = True
    supports_prefix_lists = True  # choice_probs takes one forced prefix per request

    def __init__(self, model, processor, *, min_pixels: int | None = None, max_pixels: int | None = None,
                 max_new_tokens: int = 1024, resize: str = "float") -> None:
        """`resize`: "8-bit" resizes as the originals' qwen_vl_utils does, Pillow's bicubic on the image's 8-bit
        values and torchvision's bicubic on uint8 video frames (the UnifiedReward / VideoScore2 judges use it);
        "float" resizes [0, 1] floats (pixel values up to ~0.02 apart from qwen_vl_utils')."""
        if resize not in ("8-bit", "float"):
            raise RewardInputError(f"resize must be '8-bit' or 'float', got {resize!r}")
        self.model = model
        self.processor = processor
        self.resize = resize
        # None: qwen_vl_utils' defaults for the medium (`qwen_default_pixels`), as the originals' scripts use
        self.min_pixels, self.max_pixels = min_pixels, max_pixels
        self.max_new_tokens = max_new_tokens

    def pixels_for(self, kind: str, num_frames: int = 1) -> tuple[int, int]:
        lo, hi = qwen_default_pixels(kind, num_frames)
        return (self.min_pixels if self.min_pixels is not None else lo,
                self.max_pixels if self.max_pixels is not None else hi)

    def _stop_ids(self) -> set[int]:
        ids: set[int] = set()
        for source in (getattr(self.model, "generation_config", None), self.processor.tokenizer):
            for attr in ("eos_token_id", "pad_token_id"):
                v = getattr(source, attr, None)
                ids.update(v if isinstance(v, (list, tuple)) else [] if v is None else [v])
        return ids

    def _completions(self, new: torch.Tensor) -> list[Completion]:
        """Decoded rows of generated ids; a row holding no stop token ran into max_new_tokens."""
        stop = self._stop_ids()
        texts = self.processor.batch_decode(new, skip_special_tokens=True)
        return [Completion(t, truncated=not any(i in stop for i in row)) for t, row in zip(texts, new.tolist())]

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def _batch(self, requests, suffixes=None, padding_side="right"):
        from mmreward.backbones.qwen_vl import build_batch, model_inputs

        kind, per_item = _check_uniform(requests)
        media = [m for r in requests for m in r.media] if per_item else None
        frames = max((m.shape[0] for m in media), default=1) if kind == "video" and media else 1
        min_pixels, max_pixels = self.pixels_for(kind, frames)
        tok = self.processor.tokenizer
        old = tok.padding_side
        tok.padding_side = padding_side
        try:
            batch = build_batch(
                self.processor, [r.text for r in requests], media, kind=kind, min_pixels=min_pixels,
                max_pixels=max_pixels, suffixes=suffixes, media_per_item=max(per_item, 1),
                system=requests[0].system, media_labels=requests[0].media_labels,
                resize="float" if self.resize == "float" else "torchvision" if kind == "video" else "pillow",
            )
        finally:
            tok.padding_side = old
        return model_inputs(batch, self.device, self.dtype)

    def generate(self, requests, *, n=1, temperature=0.0, seed=0, max_new_tokens: int | None = None,
                 top_p: float | None = None, top_k: int | None = None):
        """`top_p`/`top_k` (sampling only): None keeps the checkpoint's generation_config values, which for
        the Qwen-VL instruct releases (top_k 1) would make sampling greedy: judges that sample pass theirs."""
        inputs = self._batch(requests, padding_side="left")
        sample = temperature > 0
        kwargs = {"max_new_tokens": max_new_tokens or self.max_new_tokens, "do_sample": sample,
                  "num_return_sequences": n}
        if sample:
            kwargs["temperature"] = temperature
            kwargs.update({k: v for k, v in (("top_p", top_p), ("top_k", top_k)) if v is not None})
            torch.manual_seed(seed)
        elif n > 1:
            raise RewardInputError("n > 1 samples need temperature > 0 (greedy decoding repeats itself)")
        with torch.inference_mode():
            out = self.model.generate(**inputs, **kwargs)
        texts = self._completions(out[:, inputs["input_ids"].shape[1]:].cpu())
        return [texts[i * n:(i + 1) * n] for i in range(len(requests))]

    def choice_probs(self, requests, prefix, choices):
        """P(choice_j | prompt + prefix) renormalised over the choices' first tokens: (B, len(choices)).

        `prefix` is one string for every request or one per request (all rows still go in one forward).
        """
        ids = []
        for c in choices:
            toks = self.processor.tokenizer(c, add_special_tokens=False).input_ids
            if not toks:
                raise RewardInputError(f"choice {c!r} encodes to no tokens")
            ids.append(toks[0])
        logp = self.next_token_logprobs(requests, prefix)
        return torch.softmax(logp[:, ids], dim=-1)

    def generate_with_choice_probs(self, requests, choices: Sequence[str], *, temperature: float = 0.0, seed: int = 0,
                                   max_new_tokens: int | None = None):
        """One completion per request plus, at every generated step, the distribution over `choices`' first
        tokens renormalised over them, read from the scores `generate(output_scores=True)` returns (after the
        sampling warpers: temperature, top-k, top-p), without keeping (steps, V) score tensors; a step whose
        warpers removed every choice gives zeros (as VideoScore2's renormalisation does). Returns (texts,
        generated token ids, [(steps, len(choices)) tensors]).
        """
        from transformers import (
            GenerationConfig,
            LogitsProcessor,
            LogitsProcessorList,
            TemperatureLogitsWarper,
            TopKLogitsWarper,
            TopPLogitsWarper,
        )

        ids = [self.processor.tokenizer(c, add_special_tokens=False).input_ids[0] for c in choices]
        steps: list[torch.Tensor] = []

        class Record(LogitsProcessor):
            def __call__(self, input_ids, scores):
                probs = torch.softmax(scores[:, ids].float(), dim=-1)
                steps.append(torch.nan_to_num(probs, nan=0.0).cpu())
                return scores

        processors = [Record()]
        inputs = self._batch(requests, padding_side="left")
        kwargs = {"max_new_tokens": max_new_tokens or self.max_new_tokens, "do_sample": temperature > 0}
        if temperature > 0:
            # generate runs custom processors before its own warpers, so the warpers are ours here, in generate's
            # order and with its values (the checkpoint's generation_config, else the library defaults), and the
            # built-in ones are switched off; Record then sees the scores generate would return
            config = getattr(self.model, "generation_config", None) or GenerationConfig()
            defaults = (GenerationConfig._get_default_generation_params()
                        if hasattr(GenerationConfig, "_get_default_generation_params") else {})
            top_k = getattr(config, "top_k", None)
            top_k = defaults.get("top_k", GenerationConfig().top_k) if top_k is None else top_k
            top_p = getattr(config, "top_p", None)
            top_p = 1.0 if top_p is None else top_p
            warpers = [TemperatureLogitsWarper(temperature)] if temperature != 1.0 else []
            warpers += [TopKLogitsWarper(top_k)] if top_k else []
            warpers += [TopPLogitsWarper(top_p)] if top_p < 1.0 else []
            processors = warpers + processors
            kwargs.update(temperature=1.0, top_k=0, top_p=1.0)
            torch.manual_seed(seed)
        kwargs["logits_processor"] = LogitsProcessorList(processors)
        with torch.inference_mode():
            out = self.model.generate(**inputs, **kwargs)
        new = out[:, inputs["input_ids"].shape[1]:].cpu()
        per_step = torch.stack(steps, dim=1) if steps else torch.empty(len(requests), 0, len(ids))
        pad = self.processor.tokenizer.pad_token_id
        texts, token_ids, probs = self._completions(new), [], []
        for i, row in enumerate(new.tolist()):
            n = len(row)
            while n and row[n - 1] == pad:  # rows that stopped early are right-padded
                n -= 1
            token_ids.append(row[:n])
            probs.append(per_step[i, :n])
        return texts, token_ids, probs

    def token_index_at(self, token_ids: Sequence[int], char_offset: int) -> int:
        """Index of the generated token that writes character `char_offset` of the decoded text, or -1."""
        tok = self.processor.tokenizer
        for i in range(len(token_ids)):
            if len(tok.decode(token_ids[: i + 1], skip_special_tokens=True)) > char_offset:
                return i
        return -1

    def next_token_logprobs(self, requests: Sequence[JudgeRequest], prefix: str | Sequence[str] = "") -> torch.Tensor:
        """log p(next token | prompt + prefix) over the whole vocabulary: (B, V), float32, CPU.

        `prefix`: one forced answer prefix for every request, or one per request. Left padding puts every
        row's last token at the end, so only the last position's logits are computed (`logits_to_keep=1`)
        instead of a (B, L, V) tensor (gigabytes for a 150k vocabulary).
        """
        suffixes = [prefix] * len(requests) if isinstance(prefix, str) else list(prefix)
        if len(suffixes) != len(requests):
            raise RewardInputError(f"prefix: expected one string or {len(requests)} strings, got {len(suffixes)}")
        inputs = self._batch(requests, suffixes=suffixes if any(suffixes) else None, padding_side="left")
        with torch.inference_mode():
            logits = self.model(**inputs, logits_to_keep=1).logits[:, -1].float()
        return torch.log_softmax(logits, dim=-1).cpu()

    def top_logprobs(self, requests, k=20):
        logp = self.next_token_logprobs(requests)
        values, ids = logp.topk(k, dim=-1)
        tok = self.processor.tokenizer
        return [{tok.decode([i]): v for i, v in zip(row_ids.tolist(), row_vals.tolist())}
                for row_ids, row_vals in zip(ids, values)]


# ----------------------------------------------------------------------------------------------
# OpenAI-compatible endpoint
# ----------------------------------------------------------------------------------------------
class JudgeHTTPError(JudgeBackendError):
    """The server answered an HTTP error that retrying cannot fix (4xx other than 408/429); `status` is it."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class JudgeUnavailableError(JudgeBackendError):
    """The server could not be reached, timed out or kept answering 408/429/5xx until the retries ran out."""


class JudgeResponseError(JudgeBackendError):
    """The server answered 200 with a body that is not the OpenAI chat-completion shape we need."""


RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
MAX_RETRY_AFTER_S = 60.0  # a Retry-After header is honoured up to this


def to_data_url(image: torch.Tensor, fmt: str = "png") -> str:
    """(3, H, W) in [0, 1] -> 'data:image/png;base64,...' (lossless by default, so judges see our pixels)."""
    from PIL import Image

    arr = (image.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).cpu().numpy()
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format=fmt.upper())
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _retry_after(response) -> float | None:
    """Seconds from a Retry-After header given as a number (the form vLLM / OpenAI proxies send), else None."""
    value = response.headers.get("retry-after")
    try:
        return min(max(float(value), 0.0), MAX_RETRY_AFTER_S) if value is not None else None
    except ValueError:
        return None


class OpenAIChatBackend(JudgeBackend):
    """A judge served behind an OpenAI-compatible `/chat/completions` (vLLM, SGLang, LMDeploy, TGI, OpenAI).

    Built on `httpx` (the `judges` extra): one pooled `AsyncClient` per batch, every request of the batch in
    flight at once up to `max_concurrency` (the server batches them continuously), each with `timeout`
    seconds and up to `max_retries` retries on connection errors, timeouts and HTTP 408/429/5xx, waiting
    `backoff * 2**attempt` seconds (or the server's Retry-After, up to 60 s). Decoding is deterministic by
    default: temperature 0 and a fixed `seed` are sent with every request. `extra_body` is merged into every
    request for server-specific sampling fields (vLLM's `top_k`, `repetition_penalty`, `mm_processor_kwargs`).
    `transport` replaces httpx's network transport (tests: `httpx.MockTransport`).
    """

    name = "openai"

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None, timeout: float = 60.0,
                 max_retries: int = 3, backoff: float = 0.5, max_concurrency: int = 8, max_tokens: int = 512,
                 image_format: str = "png", extra_body: dict | None = None, transport=None) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise RewardInputError(f"base_url: expected an http(s) URL such as http://127.0.0.1:8000/v1, got {base_url!r}")
        if not timeout > 0 or max_retries < 0 or backoff < 0 or max_concurrency < 1 or max_tokens < 1:
            raise RewardInputError("timeout must be > 0, max_retries and backoff >= 0, max_concurrency and "
                                   f"max_tokens >= 1; got timeout={timeout}, max_retries={max_retries}, "
                                   f"backoff={backoff}, max_concurrency={max_concurrency}, max_tokens={max_tokens}")
        if image_format.lower() not in ("png", "jpeg", "webp"):
            raise RewardInputError(f"image_format must be 'png', 'jpeg' or 'webp', got {image_format!r}")
        from mmreward.errors import require_installed

        require_installed("httpx", "judges", "the OpenAI-compatible judge backend")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.api_key = api_key
        self.timeout, self.max_retries, self.backoff = timeout, max_retries, backoff
        self.max_concurrency, self.max_tokens, self.image_format = max_concurrency, max_tokens, image_format
        self.extra_body = dict(extra_body or {})
        self.transport = transport
        self.calls = 0  # HTTP attempts made, for tests and monitoring

    def payload(self, request: JudgeRequest, n: int, temperature: float, seed: int,
                max_tokens: int | None = None) -> dict:
        content = []
        for k, m in enumerate(request.media):
            if request.media_labels is not None:
                content.append({"type": "text", "text": request.media_labels[k]})
            frames = m if m.ndim == 4 else m[None]
            content += [{"type": "image_url", "image_url": {"url": to_data_url(f, self.image_format)}} for f in frames]
        content.append({"type": "text", "text": request.text})
        messages = [{"role": "user", "content": content}]
        if request.system:
            messages.insert(0, {"role": "system", "content": request.system})
        return {**self.extra_body, "model": self.model, "messages": messages, "temperature": temperature, "n": n,
                "seed": seed, "max_tokens": max_tokens or self.max_tokens}

    # -- transport ------------------------------------------------------------------------------
    def _client(self):
        import httpx

        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        # the pool holds exactly the connections the semaphore lets through: no request waits on the pool,
        # so `timeout` measures the server, not our queue
        limits = httpx.Limits(max_connections=self.max_concurrency, max_keepalive_connections=self.max_concurrency)
        return httpx.AsyncClient(timeout=httpx.Timeout(self.timeout), limits=limits, headers=headers,
                                 transport=self.transport)

    async def _post(self, client, sem: asyncio.Semaphore, payload: dict) -> dict:
        import httpx

        last = ""
        for attempt in range(self.max_retries + 1):
            wait = self.backoff * (2 ** attempt)
            async with sem:  # the cap holds requests in flight, not the backoff sleeps between them
                self.calls += 1
                try:
                    response = await client.post(self.url, json=payload)
                except httpx.TimeoutException as exc:
                    last = f"timed out after {self.timeout}s ({type(exc).__name__})"
                    response = None
                except httpx.TransportError as exc:  # connection refused/reset, protocol errors
                    last = f"{type(exc).__name__}: {exc}"
                    response = None
            if response is not None:
                if response.status_code == 200:
                    try:
                        body = response.json()
                    except ValueError as exc:
                        raise JudgeResponseError(f"{self.url} returned a body that is not JSON: {exc}") from None
                    if not isinstance(body, dict):
                        raise JudgeResponseError(f"{self.url} returned JSON that is not an object: {str(body)[:200]}")
                    return body
                detail = response.text[:300]
                if response.status_code not in RETRY_STATUSES:
                    raise JudgeHTTPError(f"{self.url} answered HTTP {response.status_code}: {detail}",
                                         response.status_code)
                last = f"HTTP {response.status_code}: {detail}"
                wait = max(wait, _retry_after(response) or 0.0)
            if attempt < self.max_retries:
                await asyncio.sleep(wait)
        raise JudgeUnavailableError(
            f"{self.url} failed after {self.max_retries + 1} attempts (timeout {self.timeout}s): {last}. "
            "Is the server running and reachable?"
        )

    async def _agenerate(self, payloads: list[dict]) -> list[dict]:
        sem = asyncio.Semaphore(self.max_concurrency)
        async with self._client() as client:
            tasks = [asyncio.ensure_future(self._post(client, sem, p)) for p in payloads]
            try:
                return await asyncio.gather(*tasks)
            finally:  # the first failure ends the batch: do not leave its siblings retrying
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    def post_all(self, payloads: list[dict]) -> list[dict]:
        """POST every payload concurrently (capped, retried) and return the JSON bodies in order."""
        return _run_async(self._agenerate(payloads))

    # -- judge API ------------------------------------------------------------------------------
    def top_logprobs(self, requests, k=20):
        """One greedy token with `logprobs`/`top_logprobs` (as PaCo-RL queries its vLLM server)."""
        if not 1 <= k <= 20:
            raise RewardInputError(f"k: OpenAI-compatible servers return 1 to 20 top log-probabilities, got {k}")
        _check_uniform(requests)
        payloads = []
        for r in requests:
            p = self.payload(r, 1, 0.0, 0)
            p.update(max_tokens=1, logprobs=True, top_logprobs=k)
            payloads.append(p)
        out = []
        for resp in self.post_all(payloads):
            try:
                content = (resp["choices"][0].get("logprobs") or {}).get("content") or []
                top = (content[0].get("top_logprobs") or []) if content else []
                out.append({t["token"]: float(t["logprob"]) for t in top})
            except (KeyError, TypeError, IndexError, AttributeError, ValueError) as exc:
                raise JudgeResponseError(f"{self.url} returned no choices[0].logprobs: {str(resp)[:200]}") from exc
        return out  # an empty dict when the server sent no log-probabilities: the caller flags it

    def generate(self, requests, *, n=1, temperature=0.0, seed=0, max_new_tokens: int | None = None):
        _check_uniform(requests)
        payloads = [self.payload(r, n, temperature, seed, max_new_tokens) for r in requests]
        out = []
        for resp in self.post_all(payloads):
            try:
                # finish_reason 'length': the server stopped at max_tokens (OpenAI / vLLM / SGLang)
                texts = [Completion(c["message"]["content"] or "", truncated=c.get("finish_reason") == "length")
                         for c in resp["choices"]]
            except (KeyError, TypeError, IndexError, AttributeError) as exc:
                raise JudgeResponseError(f"{self.url} returned no choices[].message.content: {str(resp)[:200]}") from exc
            out.append(texts[:n] + [""] * max(0, n - len(texts)))  # missing samples parse as NaN
        return out


def _run_async(coro):
    """asyncio.run, also from inside a running event loop (Ray Serve, notebooks): then on a worker thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    result: dict = {}

    def target():
        try:
            result["value"] = asyncio.run(coro)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            result["error"] = exc

    t = threading.Thread(target=target)
    t.start()
    t.join()
    if "error" in result:
        raise result["error"]
    return result["value"]
