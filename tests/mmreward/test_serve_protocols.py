"""The reward server's scorer protocol (flow_grpo / verl-omni fields over JSON), /healthz and /metrics, on
loopback: the clients below are transcribed from flow_grpo's and verl-omni's code with JSON + base64 in place
of pickle (the only change their users make), and score exactly what the reward gives in-process on the same
decoded JPEGs. The server runs with engine="local" (the front end and the reward in this process, no Ray), so
the module starts in about a second; the Ray deployment shares the same ScoringApp (tests/mmreward/test_vlm_serve.py).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import pickle
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from PIL import Image

import mmreward
from mmreward.serve import (
    Item,
    MicroBatcher,
    RewardClient,
    ServeConfig,
    ServeMetrics,
    nearest_rank,
    shutdown,
    start,
)

REWARD = "mmreward.testing.faulty:FaultyMockReward"


@pytest.fixture(scope="module")
def server():
    cfg = ServeConfig(reward=REWARD, engine="local", port=0, max_request_items=8, max_batch_size=16,
                      batch_wait_timeout_s=0.05)
    url = start(cfg)
    yield url, cfg
    shutdown()


@pytest.fixture(scope="module")
def local():
    return mmreward.load(REWARD)


def _jpeg(image_hwc_uint8: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(image_hwc_uint8).save(buf, format="JPEG")
    return buf.getvalue()


def _decoded(jpeg: bytes) -> torch.Tensor:
    """What the server should score: the JPEG decoded by PIL, as floats in [0, 1] (independent of mmreward.serve)."""
    return torch.from_numpy(np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB")).copy()).permute(2, 0, 1) / 255.0


def _images(n: int, h: int, w: int, seed: int) -> torch.Tensor:
    return torch.rand(n, 3, h, w, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------- verl-omni
async def verl_omni_compute_score(solution_image: torch.Tensor, ground_truth: str, server_url: str,
                                  max_retries: int = 2, retry_backoff: float = 0.5) -> dict:
    """verl-omni's HTTP scorer client (verl-project/verl-omni@a1139ba
    verl_omni/utils/reward_score/http_scorer_client.py `compute_score`), transcribed with the body sent as JSON
    with base64 JPEGs instead of `pickle.dumps`, and the answer read with `json.loads` instead of `pickle.loads`.
    Same fields, same retry rule (408/429/5xx and connection errors retried with doubling backoff)."""
    import aiohttp

    image = solution_image[0] if solution_image.ndim == 4 else solution_image
    image_bytes = _jpeg(image.permute(1, 2, 0).cpu().numpy())
    payload = json.dumps({"images": [base64.b64encode(image_bytes).decode()], "prompts": [ground_truth],
                          "metadata": {}})
    last_error = None
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        for attempt in range(max_retries + 1):
            try:
                async with session.post(server_url, data=payload) as resp:
                    response_bytes = await resp.read()
                    if resp.status != 200:
                        error = RuntimeError(f"Scorer server returned HTTP {resp.status}: {response_bytes[:200]!r}")
                        if not (resp.status in {408, 429} or 500 <= resp.status < 600):
                            raise error
                        last_error = error
                    else:
                        response_data = json.loads(response_bytes)
                        break
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError) as exc:
                last_error = exc
            if attempt < max_retries:
                await asyncio.sleep(retry_backoff * (2 ** attempt))
        else:
            raise RuntimeError(f"HTTP scoring failed after {max_retries + 1} attempts: {last_error}")
    if "error" in response_data:
        raise RuntimeError(f"Scorer server error: {response_data['error']}")
    return {"score": float(response_data["scores"][0])}


def test_verl_omni_scorer_client_scores_like_in_process(server, local):
    url, cfg = server
    prompts = ["a cat", "two squares", "a red circle", "a dog"]
    images = [(_images(1, h, w, i)[0] * 255).round().to(torch.uint8) for i, (h, w) in
              enumerate([(16, 16), (24, 20), (16, 16), (8, 12)])]  # two shapes batch together, two alone

    async def batch():  # RewardLoopWorker.compute_score_batch: every sample at once with asyncio.gather
        return await asyncio.gather(*(verl_omni_compute_score(img, p, f"{url}/scorer?token={cfg.token}")
                                      for img, p in zip(images, prompts)))

    got = [r["score"] for r in asyncio.run(batch())]
    want = [local.score([p], _decoded(_jpeg(img.permute(1, 2, 0).numpy()))[None]).scores.item()
            for img, p in zip(images, prompts)]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)  # float32 scores through JSON
    assert len(set(got)) == 4


# ---------------------------------------------------------------------------------------------- flow_grpo
def flow_grpo_remote_scorer(url: str):
    """flow_grpo's remote reward function (yifan123/flow_grpo@ac4c86e flow_grpo/rewards.py
    `unifiedreward_score_remote`: uint8 NHWC, JPEG, batches of 64 by np.array_split, requests.Session with
    urllib3 Retry on 500), transcribed with `json.dumps`/`json.loads` and base64 strings in place of pickle."""
    import requests
    from requests.adapters import HTTPAdapter, Retry

    batch_size = 64
    sess = requests.Session()
    sess.mount("http://", HTTPAdapter(max_retries=Retry(total=3, backoff_factor=0.1, status_forcelist=[500],
                                                        allowed_methods=False)))

    def _fn(images, prompts, metadata):
        if isinstance(images, torch.Tensor):
            images = (images * 255).round().clamp(0, 255).to(torch.uint8).cpu().numpy()
            images = images.transpose(0, 2, 3, 1)  # NCHW -> NHWC
        images_batched = np.array_split(images, np.ceil(len(images) / batch_size))
        prompts_batched = np.array_split(prompts, np.ceil(len(prompts) / batch_size))
        all_scores = []
        for image_batch, prompt_batch in zip(images_batched, prompts_batched):
            jpeg_images = [base64.b64encode(_jpeg(image)).decode() for image in image_batch]
            data = {"images": jpeg_images, "prompts": [str(p) for p in prompt_batch]}
            response = sess.post(url, data=json.dumps(data), timeout=120)
            all_scores += json.loads(response.content)["outputs"]
        return all_scores, {}

    return _fn


def test_flow_grpo_remote_client_scores_like_in_process(server, local):
    url, cfg = server
    images = _images(5, 16, 16, 7)
    prompts = ["a cat", "a dog", "a fox", "a box", "a car"]
    scores, info = flow_grpo_remote_scorer(f"{url}/?token={cfg.token}")(images, prompts, [{}] * 5)
    uint8 = (images * 255).round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()
    decoded = torch.stack([_decoded(_jpeg(x)) for x in uint8])
    np.testing.assert_allclose(scores, local.score(prompts, decoded).scores.numpy(), rtol=0, atol=1e-6)
    assert info == {}


# ---------------------------------------------------------------------------------------------- refusals
def _post(url: str, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _scorer_body(n: int = 1, prompts=None, **extra) -> dict:
    imgs = [base64.b64encode(_jpeg(np.full((8, 8, 3), (40 * i) % 256, np.uint8))).decode() for i in range(n)]
    return {"images": imgs, "prompts": prompts or [f"p{i}" for i in range(n)], **extra}


def test_scorer_refusals_are_typed_json_errors(server, monkeypatch):
    url, cfg = server
    scorer = f"{url}/scorer?token={cfg.token}"
    assert _post(f"{url}/scorer", json.dumps(_scorer_body()).encode())[0] == 401
    assert _post(f"{url}/scorer?token=wrong", json.dumps(_scorer_body()).encode())[0] == 401
    assert _post(f"{url}/score?token={cfg.token}", b"{}")[0] == 401  # ?token= only on the scorer routes
    # flow_grpo's original pickle body is refused as not JSON: nothing is ever unpickled
    status, body = _post(scorer, pickle.dumps({"images": [b"\xff\xd8"], "prompts": ["x"]}))
    assert status == 400 and "not valid JSON" in body["error"]
    cases = [
        (_scorer_body(meta_datas=[{}], only_strict=True), 400, "unknown keys ['meta_datas', 'only_strict']"),
        ({"images": ["%%%"], "prompts": ["x"]}, 400, "images[0]: not valid base64"),
        ({"images": [base64.b64encode(b"hello").decode()], "prompts": ["x"]}, 400, "not a readable"),
        ({"images": [], "prompts": []}, 400, "non-empty list"),
        (_scorer_body(9), 413, "max_request_items=8"),
        (_scorer_body(2, prompts=["only one"]), 400, "prompts"),
        (_scorer_body(1, prompts=["nan-score"]), 422, "RewardValueError"),
        (_scorer_body(1, prompts=["raise-untyped"]), 500, "internal error"),
    ]
    for payload, want_status, match in cases:
        status, body = _post(scorer, json.dumps(payload).encode())
        assert status == want_status and match in body["error"], (payload.keys(), status, body)
    monkeypatch.setattr("mmreward.serve.wire.MAX_IMAGE_PIXELS", 63)  # an 8x8 image is now a decompression bomb
    status, body = _post(scorer, json.dumps(_scorer_body()).encode())
    assert status == 413 and "8x8 image exceeds 63 pixels" in body["error"]


def test_a_data_url_png_and_the_bearer_header_work_too(server, local):
    url, cfg = server
    img = (np.arange(8 * 8 * 3).reshape(8, 8, 3) * 2 % 256).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG")
    body = {"images": ["data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()], "prompts": ["x"]}
    status, out = _post(f"{url}/scorer", json.dumps(body).encode(), {"Authorization": f"Bearer {cfg.token}"})
    want = local.score(["x"], torch.from_numpy(img).permute(2, 0, 1)[None] / 255.0).scores.item()
    assert status == 200 and out["scores"] == out["outputs"] and abs(out["scores"][0] - want) < 1e-6


# ---------------------------------------------------------------------------------------------- health, metrics
def test_healthz_is_open_and_metrics_count_batches_and_latency(server, local):
    url, cfg = server
    with urllib.request.urlopen(url + "/healthz", timeout=10) as r:
        health = json.loads(r.read())
    assert health["status"] == "ok" and health["reward"] == "faulty-mock" and "POST /scorer" in health["routes"]
    try:
        urllib.request.urlopen(url + "/metrics", timeout=10)
        raise AssertionError("/metrics answered without a token")
    except urllib.error.HTTPError as exc:
        assert exc.code == 401
    client = RewardClient(url, cfg.token)
    before = client.metrics()
    x = _images(6, 8, 8, 3)
    with ThreadPoolExecutor(6) as pool:  # six one-item requests inside one 50 ms batch window
        outs = list(pool.map(lambda i: client.score([f"p{i}"], x[i:i + 1]).scores.item(), range(6)))
    np.testing.assert_allclose(outs, local.score([f"p{i}" for i in range(6)], x).scores.numpy(), atol=1e-6)
    after = client.metrics()
    assert after["requests"]["score"] - before["requests"].get("score", 0) == 6
    assert after["batches"]["items"] - before["batches"]["items"] == 6
    assert after["batches"]["count"] - before["batches"]["count"] < 6  # concurrent requests shared reward calls
    assert after["queue_depth"] == 0 and after["in_flight_requests"] == 0
    lat = after["latency_ms"]
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] and lat["window"] >= 6


def test_nearest_rank_percentiles():
    values = list(range(100, 0, -1))  # 1..100, unsorted
    assert (nearest_rank(values, 50), nearest_rank(values, 90), nearest_rank(values, 99)) == (50, 90, 99)
    assert nearest_rank([5.0, 1.0, 3.0], 50) == 3.0 and nearest_rank([5.0, 1.0, 3.0], 99) == 5.0
    assert nearest_rank([7.0], 1) == 7.0 and nearest_rank([], 50) is None


def test_micro_batcher_reports_queue_depth_and_merges_what_waited():
    """While one batch runs, later items queue (queue_depth counts them) and go together in the next batch."""
    release, started = threading.Event(), threading.Event()
    metrics = ServeMetrics()
    seen: list[list[str]] = []

    def fn(items):
        seen.append([it.prompt for it in items])
        started.set()
        release.wait(10)
        return [{"scores": it.prompt.upper()} for it in items]

    def items(names):
        return [Item(0, n, (torch.zeros(1),)) for n in names]

    async def run(max_batch_size):
        seen.clear()
        release.clear()
        started.clear()
        batcher = MicroBatcher(fn, max_batch_size, 0.0, metrics)
        first = asyncio.ensure_future(batcher.submit(items(["a"])))
        while not started.is_set():
            await asyncio.sleep(0.005)
        rest = asyncio.ensure_future(batcher.submit(items(["b", "c", "d", "e", "f"])))
        await asyncio.sleep(0.05)
        depth = metrics.queue_depth
        release.set()
        return depth, await first, await rest

    depth, first, rest = asyncio.run(run(8))
    assert depth == 5 and seen == [["a"], ["b", "c", "d", "e", "f"]]
    assert first == [{"scores": "A"}] and [r["scores"] for r in rest] == ["B", "C", "D", "E", "F"]
    depth, _, rest = asyncio.run(run(2))
    assert depth == 5 and seen == [["a"], ["b", "c"], ["d", "e"], ["f"]]
    assert metrics.queue_depth == 0 and list(metrics.batch_sizes) == [1, 5, 1, 2, 2, 1]


def test_engine_is_validated():
    with pytest.raises(mmreward.ConfigError, match="engine"):
        ServeConfig(engine="threads")


def test_generated_tokens_never_read_as_a_command_line_flag():
    """A generated token is printed for users to paste after `--token`; a leading '-' (one urlsafe token in 64)
    made argparse take it for a flag, so generated tokens are 192-bit lowercase hex."""
    import re

    tokens = {ServeConfig(reward=REWARD, auth=True).token for _ in range(200)}
    assert len(tokens) == 200
    assert all(re.fullmatch(r"[0-9a-f]{48}", t) for t in tokens)


# ---------------------------------------------------------------------------------------------- the CLI (slow)
@pytest.mark.slow
@pytest.mark.parametrize("engine", ["local", "ray"])
def test_cli_server_speaks_the_scorer_protocol(engine, local):
    """`mmreward serve --engine ...` in its own process, as a user starts it, scored by flow_grpo's client."""
    import os
    import secrets
    import signal
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_urlsafe(16)
    proc = subprocess.Popen([sys.executable, "-m", "mmreward", "serve", "--reward", REWARD, "--engine", engine,
                             "--port", str(port), f"--token={token}"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env={**os.environ, "OMP_NUM_THREADS": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            try:
                with urllib.request.urlopen(url + "/healthz", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "no /healthz within 240 s"
            time.sleep(0.3)
        images = _images(3, 16, 16, 11)
        prompts = ["a", "b", "c"]
        scores, _ = flow_grpo_remote_scorer(f"{url}/?token={token}")(images, prompts, None)
        uint8 = (images * 255).round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()
        want = local.score(prompts, torch.stack([_decoded(_jpeg(x)) for x in uint8])).scores.numpy()
        np.testing.assert_allclose(scores, want, rtol=0, atol=1e-6)
        req = urllib.request.Request(url + "/metrics", headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            metrics = json.loads(r.read())
        assert metrics["requests"] == {"scorer": 1} and metrics["batches"]["items"] == 3
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stderr.close()
