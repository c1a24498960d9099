"""The OpenAI-compatible judge client (mmreward.judges.backends.OpenAIChatBackend, on httpx).

Default suite: the client's retry, backoff, Retry-After, concurrency-cap and typed-error logic against
httpx.MockTransport (no network, milliseconds).

`-m slow`: the same client against a real OpenAI-compatible server process (tests/_helpers/openai_server.py: a tiny
random Qwen2ForCausalLM with a tokenizer behind /v1/chat/completions, started with subprocess on loopback):
generated texts and a yes/no probability judge's scores (paco-reward, soft mode) equal what the same model
gives when run directly with transformers; retries against a server that fails its first N requests; the
concurrency cap read from the server's own count of requests in flight.
"""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

httpx = pytest.importorskip("httpx")

from mmreward.errors import RewardInputError  # noqa: E402
from mmreward.judges.backends import (  # noqa: E402
    JudgeBackendError,
    JudgeHTTPError,
    JudgeRequest,
    JudgeResponseError,
    JudgeUnavailableError,
    OpenAIChatBackend,
)

URL = "http://judge.test/v1"


def _reply(text: str, finish: str = "stop") -> dict:
    return {"choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": finish}]}


def _backend(handler, **kw) -> OpenAIChatBackend:
    return OpenAIChatBackend(URL, "judge", transport=httpx.MockTransport(handler), **kw)


# ---------------------------------------------------------------------------------------------- retries
def test_retries_5xx_with_exponential_backoff_then_succeeds():
    seen = []

    def handler(request):
        seen.append(time.perf_counter())
        return httpx.Response(503, text="warming up") if len(seen) <= 2 else httpx.Response(200, json=_reply("ok"))

    backend = _backend(handler, max_retries=3, backoff=0.05)
    assert backend.generate([JudgeRequest("q")]) == [["ok"]]
    assert backend.calls == 3 and len(seen) == 3
    gaps = [b - a for a, b in zip(seen, seen[1:])]
    assert gaps[0] >= 0.05 - 0.005 and gaps[1] >= 0.10 - 0.005  # backoff * 2**attempt


def test_429_waits_for_retry_after_when_longer_than_the_backoff():
    seen = []

    def handler(request):
        seen.append(time.perf_counter())
        if len(seen) == 1:
            return httpx.Response(429, headers={"Retry-After": "0.3"}, text="slow down")
        return httpx.Response(200, json=_reply("ok"))

    assert _backend(handler, backoff=0.01).generate([JudgeRequest("q")]) == [["ok"]]
    assert seen[1] - seen[0] >= 0.3 - 0.01


def test_client_errors_fail_at_once_with_a_typed_error():
    calls = []

    def handler(request):
        calls.append(1)
        return httpx.Response(400, json={"error": {"message": "max_tokens too large"}})

    with pytest.raises(JudgeHTTPError, match="HTTP 400.*max_tokens too large") as info:
        _backend(handler, max_retries=3, backoff=0.01).generate([JudgeRequest("q")])
    assert info.value.status == 400 and len(calls) == 1
    assert isinstance(info.value, JudgeBackendError)


@pytest.mark.parametrize("failure", ["timeout", "connect", "502"])
def test_unavailable_after_the_retries_run_out(failure):
    calls = []

    def handler(request):
        calls.append(1)
        if failure == "timeout":
            raise httpx.ReadTimeout("no answer", request=request)
        if failure == "connect":
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(502, text="bad gateway")

    with pytest.raises(JudgeUnavailableError, match="after 3 attempts"):
        _backend(handler, max_retries=2, backoff=0.001).generate([JudgeRequest("q")])
    assert len(calls) == 3


@pytest.mark.parametrize("body,match", [(b"<html>oops</html>", "not JSON"), (b"[1, 2]", "not an object"),
                                        (b'{"choices": [{"text": "x"}]}', "message.content")])
def test_malformed_answers_are_response_errors(body, match):
    backend = _backend(lambda request: httpx.Response(200, content=body), max_retries=3)
    with pytest.raises(JudgeResponseError, match=match):
        backend.generate([JudgeRequest("q")])
    assert backend.calls == 1  # a malformed 200 is not retried


# ---------------------------------------------------------------------------------------------- batching
def test_a_batch_runs_concurrently_under_the_cap_and_keeps_its_order():
    state = {"now": 0, "max": 0}

    async def handler(request):
        state["now"] += 1
        state["max"] = max(state["max"], state["now"])
        await asyncio.sleep(0.02)
        state["now"] -= 1
        text = json.loads(request.content)["messages"][0]["content"][-1]["text"]
        return httpx.Response(200, json=_reply(text.upper()))

    requests = [JudgeRequest(f"q{i}") for i in range(10)]
    out = _backend(handler, max_concurrency=3).generate(requests)
    assert out == [[f"Q{i}"] for i in range(10)]
    assert state["max"] == 3
    state["max"] = 0
    _backend(handler, max_concurrency=10).generate(requests)
    assert state["max"] > 3  # without a tighter cap they do overlap: the count above measures the cap


def test_payload_is_deterministic_and_carries_extra_body_and_logprob_fields():
    bodies = []

    def handler(request):
        bodies.append(json.loads(request.content))
        top = [{"token": "Yes", "logprob": -0.25}, {"token": "No", "logprob": -1.75}]
        return httpx.Response(200, json={"choices": [{"message": {"content": "Yes"}, "finish_reason": "length",
                                                      "logprobs": {"content": [{"token": "Yes", "logprob": -0.25,
                                                                                "top_logprobs": top}]}}]})

    backend = _backend(handler, extra_body={"top_k": 1, "repetition_penalty": 1.0}, api_key="sk-x")
    (texts,) = backend.generate([JudgeRequest("q")], max_new_tokens=7)
    assert texts[0] == "Yes" and texts[0].truncated
    assert backend.top_logprobs([JudgeRequest("q")], k=5) == [{"Yes": -0.25, "No": -1.75}]
    gen, lp = bodies
    assert gen["temperature"] == 0.0 and gen["seed"] == 0 and gen["max_tokens"] == 7 and gen["top_k"] == 1
    assert lp["logprobs"] is True and lp["top_logprobs"] == 5 and lp["max_tokens"] == 1 and lp["temperature"] == 0.0
    with pytest.raises(RewardInputError, match="1 to 20"):
        backend.top_logprobs([JudgeRequest("q")], k=21)


def test_bad_settings_are_refused():
    with pytest.raises(RewardInputError, match="http"):
        OpenAIChatBackend("127.0.0.1:8000/v1", "m")
    with pytest.raises(RewardInputError, match="max_concurrency"):
        OpenAIChatBackend(URL, "m", max_concurrency=0)
    with pytest.raises(RewardInputError, match="image_format"):
        OpenAIChatBackend(URL, "m", image_format="bmp")


def test_judge_loaders_pass_backoff_and_extra_body_to_the_client():
    import mmreward

    judge = mmreward.load("unifiedreward", backend="openai", base_url=URL, checkpoint="served",
                          extra_body={"top_k": 1}, backoff=0.2, max_concurrency=3)
    backend = judge.backend
    assert isinstance(backend, OpenAIChatBackend) and backend.model == "served"
    assert (backend.extra_body, backend.backoff, backend.max_concurrency) == ({"top_k": 1}, 0.2, 3)


# ---------------------------------------------------------------------------------------------- live server (slow)
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """A tiny model folder, and tests/_helpers/openai_server.py serving it in its own process on loopback."""
    sys.path.insert(0, str(HERE))
    from tests._helpers.openai_server import build_tiny_causal_lm

    folder = tmp_path_factory.mktemp("tiny-judge")
    model, tok = build_tiny_causal_lm(folder)
    proc = subprocess.Popen([sys.executable, str(HERE / "openai_server.py"), "--model", str(folder),
                             "--served-model-name", "tiny-judge"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={"OMP_NUM_THREADS": "1", **__import__("os").environ})
    line = proc.stdout.readline()
    if not line.startswith("PORT "):
        proc.kill()
        pytest.fail(f"openai_server did not start: {line!r} {proc.stderr.read()[-2000:]}")
    base = f"http://127.0.0.1:{int(line.split()[1])}"
    yield {"url": base + "/v1", "base": base, "model": model, "tok": tok}
    proc.terminate()
    proc.wait(timeout=30)


def _control(live, **knobs) -> None:
    req = urllib.request.Request(live["base"] + "/control", data=json.dumps(knobs).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=10).read()


def _stats(live) -> dict:
    with urllib.request.urlopen(live["base"] + "/stats", timeout=10) as r:
        return json.loads(r.read())


def _direct_logprobs(live, prompt: str) -> torch.Tensor:
    tok, model = live["tok"], live["model"]
    with torch.inference_mode():
        logits = model(**tok(prompt, return_tensors="pt", add_special_tokens=False)).logits[0, -1]
    return logits.float().log_softmax(-1)


def _grey(levels) -> torch.Tensor:
    return torch.stack([torch.full((3, 10, 12), v / 255.0) for v in levels])


@pytest.mark.slow
def test_live_generated_texts_equal_the_models_own_greedy_generation(live):
    from tests._helpers.openai_server import render_prompt

    _control(live, reset=True)
    backend = OpenAIChatBackend(live["url"], "tiny-judge", max_concurrency=4)
    requests = [JudgeRequest(t, [img]) for t, img in zip(["a cat", "two blue squares", "a fox", "x"],
                                                         _grey([10, 90, 160, 240]))]
    out = backend.generate(requests, max_new_tokens=6)
    tok, model = live["tok"], live["model"]
    for req, (text,) in zip(requests, out):
        prompt = render_prompt(tok, backend.payload(req, 1, 0.0, 0)["messages"])
        ids = tok(prompt, return_tensors="pt", add_special_tokens=False)
        with torch.inference_mode():
            new = model.generate(**ids, max_new_tokens=6, do_sample=False)[0, ids["input_ids"].shape[1]:].tolist()
        eos = model.generation_config.eos_token_id
        want = new[: new.index(eos) + 1] if eos in new else new
        assert str(text) == tok.decode(want, skip_special_tokens=True)
        assert text.truncated == (eos not in new)
    assert len({str(o[0]) for o in out}) > 1  # the prompts (and image tags) reach the model
    assert sorted(_stats(live)["prompts"]) == sorted(render_prompt(tok, backend.payload(r, 1, 0.0, 0)["messages"])
                                                     for r in requests)


@pytest.mark.slow
def test_live_yes_no_judge_scores_equal_the_direct_model(live):
    import mmreward
    from mmreward.judges.yes_no import yes_probability_from_logprobs

    _control(live, reset=True)
    judge = mmreward.load("paco-reward", backend="openai", base_url=live["url"], checkpoint="tiny-judge",
                          image_labels=True)
    prompts = ["a fox", "a cat", "x", "an old man reading", "three green stars"]
    out = judge.consistency(prompts, _grey([10, 128, 200, 128, 200]), _grey([250, 128, 30, 128, 30]))
    stats = _stats(live)
    assert len(stats["prompts"]) == len(prompts)
    assert all(s["logprobs"] is True and s["top_logprobs"] == 20 and s["max_tokens"] == 1 for s in stats["sampling"])
    tok = live["tok"]
    yes, no = tok("Yes", add_special_tokens=False).input_ids, tok("No", add_special_tokens=False).input_ids
    finite = 0
    for i, p in enumerate(prompts):
        (prompt,) = [s for s in stats["prompts"] if f'"{p}."' in s]  # the question quotes the prompt
        logp = _direct_logprobs(live, prompt)
        top20 = set(logp.topk(20).indices.tolist())
        if yes[0] in top20 and no[0] in top20:
            # PaCo's formula on the direct model's full distribution: sigmoid(log p(Yes) - log p(No))
            want = yes_probability_from_logprobs(logp[None], yes, no).item()
            assert out.scores[i].item() == pytest.approx(want, abs=1e-5)
            finite += 1
        elif yes[0] not in top20 and no[0] not in top20:
            assert math.isnan(out.scores[i].item())
    assert finite >= 3  # the case under test happens for most prompts
    assert out.scores[~out.scores.isnan()].unique().numel() >= 2  # and the scores depend on the request


@pytest.mark.slow
def test_live_retries_a_server_that_fails_its_first_requests(live):
    _control(live, reset=True, fail_next=2, fail_status=503)
    backend = OpenAIChatBackend(live["url"], "tiny-judge", max_retries=3, backoff=0.05)
    (texts,) = backend.generate([JudgeRequest("a cat")], max_new_tokens=2)
    stats = _stats(live)
    assert backend.calls == 3 and stats["requests"] == 3 and stats["failed"] == 2 and len(stats["prompts"]) == 1
    _control(live, reset=True, fail_next=5, fail_status=500)
    with pytest.raises(JudgeUnavailableError, match="after 2 attempts.*HTTP 500"):
        OpenAIChatBackend(live["url"], "tiny-judge", max_retries=1, backoff=0.01).generate([JudgeRequest("q")])
    assert _stats(live)["requests"] == 2
    _control(live, reset=True)
    with pytest.raises(JudgeHTTPError, match="HTTP 404.*not served"):
        OpenAIChatBackend(live["url"], "other-model", max_retries=3).generate([JudgeRequest("q")])
    assert _stats(live)["requests"] == 1  # a 404 is not retried


@pytest.mark.slow
def test_live_concurrency_cap_is_what_the_server_sees_in_flight(live):
    requests = [JudgeRequest(f"prompt {i}") for i in range(8)]
    for cap in (2, 8):
        _control(live, reset=True, delay_s=0.25)
        OpenAIChatBackend(live["url"], "tiny-judge", max_concurrency=cap).generate(requests, max_new_tokens=1)
        seen = _stats(live)["max_in_flight"]
        assert seen == cap if cap == 2 else seen > 2, (cap, seen)
    _control(live, reset=True)


@pytest.mark.slow
def test_live_sampling_is_reproducible_from_the_seed(live):
    _control(live, reset=True)
    backend = OpenAIChatBackend(live["url"], "tiny-judge")
    req = [JudgeRequest("a photo of a dog")]
    a = backend.generate(req, n=3, temperature=1.0, seed=7, max_new_tokens=5)
    b = backend.generate(req, n=3, temperature=1.0, seed=7, max_new_tokens=5)
    c = backend.generate(req, n=3, temperature=1.0, seed=8, max_new_tokens=5)
    assert a == b and a != c
    assert [s["seed"] for s in _stats(live)["sampling"]] == [7, 7, 8]
