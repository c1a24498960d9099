"""Judge parsers on canned outputs, order-swap debiasing with a position-biased fake judge, voting, and the
OpenAI-compatible backend against a loopback fake server."""

from __future__ import annotations

import base64
import io
import math
import time

import pytest
import torch

from mmreward.judges.backends import JudgeBackend, JudgeBackendError, JudgeRequest, OpenAIChatBackend
from mmreward.judges.debias import agreement_rate, debias, vote
from mmreward.judges.parsers import parse_dimensions, parse_pairwise, parse_score, parse_yes_no
from mmreward.models.vlm_judge import FAMILIES, VLMJudge
from tests._helpers.loopback_chat import LoopbackChatServer


# ---------------------------------------------------------------------------------------------- parsers
@pytest.mark.parametrize("text, expected", [
    ("<think>Image 2 is better at color...</think><answer>Image 1 is better</answer>", 1.0),
    ("<answer> Video 2 is better </answer>", 0.0),
    ("After careful thought, Image 2 is better.", 0.0),
    ("Final answer: Image 1", 1.0),
    ("<answer>2</answer>", 0.0),
    ("Both are equally good: tie.", 0.5),
])
def test_parse_pairwise(text, expected):
    p = parse_pairwise(text)
    assert p.ok and p.value == expected


@pytest.mark.parametrize("text", ["", "I cannot decide which image I like", "<answer>Image 3 is better</answer>", None])
def test_parse_pairwise_malformed_is_nan_with_flag(text):
    p = parse_pairwise(text)
    assert not p.ok and math.isnan(p.value) and p.reason


def test_parse_scores_and_dimensions():
    assert parse_score("reasoning... Final Score: 7.5", 1, 10).value == 7.5
    assert parse_score("<answer>4</answer>", 1, 10).value == 4
    out_of_range = parse_score("Final Score: 11", 1, 10)
    assert not out_of_range.ok and math.isnan(out_of_range.value) and "outside" in out_of_range.reason
    assert not parse_score("no number here", 1, 10).ok
    text = "Alignment Score (1-5): 4\nCoherence Score (1-5): 3\nStyle Score (1-5): 5"
    p = parse_dimensions(text, ("Alignment Score", "Coherence Score", "Style Score"), 1, 5)
    assert p.ok and p.value == pytest.approx(4.0) and p.values["Style Score"] == 5
    partial = parse_dimensions("Alignment Score (1-5): 4\nStyle Score (1-5): 9", ("Alignment Score", "Coherence Score",
                                                                                 "Style Score"), 1, 5)
    assert not partial.ok and math.isnan(partial.value)
    assert partial.values["Alignment Score"] == 4 and math.isnan(partial.values["Style Score"])
    assert "Coherence Score' missing" in partial.reason and "outside" in partial.reason
    assert parse_yes_no("<answer>Yes, consistent</answer>").value == 1.0
    assert parse_yes_no("No.").value == 0.0
    assert not parse_yes_no("maybe").ok


# ---------------------------------------------------------------------------------------------- debiasing
def test_debias_formula_and_agreement():
    v_ab = torch.tensor([1.0, 1.0, 0.0, float("nan"), 0.5])
    v_ba = torch.tensor([0.0, 1.0, 1.0, 1.0, 0.5])
    prob, agree = debias(v_ab, v_ba)
    torch.testing.assert_close(prob[:3], torch.tensor([1.0, 0.5, 0.0]))
    assert math.isnan(prob[3]) and prob[4] == 0.5
    assert agree[:3].tolist() == [1.0, 0.0, 1.0] and math.isnan(agree[3]) and agree[4] == 1.0
    assert agreement_rate(agree) == pytest.approx(3 / 4)
    mean, count = vote(torch.tensor([[1.0, float("nan"), 0.0, 1.0], [float("nan")] * 4]))
    assert mean[0] == pytest.approx(2 / 3) and count.tolist() == [3, 0] and math.isnan(mean[1])


class ScriptedBackend(JudgeBackend):
    """A fake judge. 'biased' always prefers the first position; 'truthful' prefers the brighter image;
    'noisy' answers from a fixed list of samples per call."""

    name = "scripted"

    def __init__(self, behaviour, samples=None):
        self.behaviour = behaviour
        self.samples = samples
        self.calls = []

    def generate(self, requests, *, n=1, temperature=0.0, seed=0):
        self.calls.append((len(requests), n))
        out = []
        for r in requests:
            if self.behaviour == "biased":
                out.append(["<answer>Image 1 is better</answer>"] * n)
            elif self.behaviour == "truthful":
                first, second = (m.mean() for m in r.media)
                out.append([f"<answer>Image {1 if first > second else 2} is better</answer>"] * n)
            elif self.behaviour == "samples":
                out.append(list(self.samples[:n]))
            else:  # pointwise
                out.append([f"Alignment Score (1-5): {1 + round(4 * float(r.media[0].mean()))}\nCoherence Score (1-5): 3"
                            f"\nStyle Score (1-5): 3"] * n)
        return out


def _pairs():
    g = torch.Generator().manual_seed(0)
    bright = 0.6 + 0.4 * torch.rand(6, 3, 16, 16, generator=g)
    dark = 0.4 * torch.rand(6, 3, 16, 16, generator=g)
    a = torch.cat([bright[:3], dark[:3]])
    b = torch.cat([dark[3:], bright[3:]])
    return a, b, torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0])


def test_position_biased_judge_is_neutralised():
    judge = VLMJudge(ScriptedBackend("biased"), FAMILIES["unifiedreward"])
    a, b, _ = _pairs()
    out = judge.compare("a photo", a, b)
    torch.testing.assert_close(out.prob_a, torch.full((6,), 0.5))
    assert judge.last_agreement_rate == 0.0
    assert out.details["agreement"].tolist() == [0.0] * 6
    raw = VLMJudge(ScriptedBackend("biased"), FAMILIES["unifiedreward"], debias=False).compare("a photo", a, b)
    torch.testing.assert_close(raw.prob_a, torch.ones(6))  # what the bias does without the swap


def test_truthful_judge_keeps_its_verdicts_and_antisymmetry():
    backend = ScriptedBackend("truthful")
    judge = VLMJudge(backend, FAMILIES["unifiedreward"])
    a, b, truth = _pairs()
    ab, ba = judge.compare("a photo", a, b), judge.compare("a photo", b, a)
    torch.testing.assert_close(ab.prob_a, truth)
    torch.testing.assert_close(ab.prob_a + ba.prob_a, torch.ones(6))
    assert judge.last_agreement_rate == 1.0
    assert backend.calls == [(6, 1)] * 4  # one batched call per order
    rates = judge.group_win_rates("a photo", torch.stack([a[0], b[0], a[4]]))  # bright, dark, dark-ish
    assert rates[0] == 1.0 and rates.sum() == pytest.approx(1.5)


def test_k_sample_voting_and_unparsable_samples():
    samples = ["Image 1 is better", "Image 2 is better", "Image 1 is better", "gibberish"]
    judge = VLMJudge(ScriptedBackend("samples", samples), FAMILIES["unifiedreward"], samples=4, temperature=0.7,
                     debias=False)
    a, b, _ = _pairs()
    out = judge.compare("x", a[:2], b[:2])
    torch.testing.assert_close(out.prob_a, torch.full((2,), 2 / 3))
    torch.testing.assert_close(out.details["parse_failed"], torch.full((2,), 0.25))
    with pytest.raises(Exception, match="temperature"):
        VLMJudge(ScriptedBackend("samples", samples), FAMILIES["unifiedreward"], samples=3)


def test_pointwise_scores_nan_flagged_not_zero():
    judge = VLMJudge(ScriptedBackend("pointwise"), FAMILIES["unifiedreward"])
    imgs = torch.stack([torch.full((3, 8, 8), 0.0), torch.full((3, 8, 8), 1.0)])
    out = judge.score("x", imgs)
    torch.testing.assert_close(out.scores, torch.tensor([(1 + 3 + 3) / 3, (5 + 3 + 3) / 3]))
    broken = VLMJudge(ScriptedBackend("samples", ["Alignment Score (1-5): 9"]), FAMILIES["unifiedreward"])
    out = broken.score("x", imgs)
    assert torch.isnan(out.scores).all() and out.details["parse_failed"].tolist() == [1.0, 1.0]


# ---------------------------------------------------------------------------------------------- OpenAI backend
class FakeChatServer(LoopbackChatServer):
    """Scripted failures first (status `status`), then `answer` n times per request."""

    def __init__(self, fail_first=0, status=500, delay=0.0, answer="Image 1 is better"):
        self.fail_first, self.status, self.delay, self.answer = fail_first, status, delay, answer
        super().__init__()

    def reply(self, body, n_seen):
        if n_seen <= self.fail_first:
            return self.status, {"error": "scripted failure"}
        return 200, {"choices": [{"message": {"role": "assistant", "content": self.answer}}
                                 for _ in range(body.get("n", 1))]}


def test_openai_backend_payload_auth_and_data_urls():
    from PIL import Image

    img = torch.rand(3, 12, 10, generator=torch.Generator().manual_seed(0))
    with FakeChatServer() as srv:
        backend = OpenAIChatBackend(srv.url, "judge-model", api_key="sk-test", max_concurrency=3)
        out = backend.generate([JudgeRequest("which?", [img, img])] * 5, n=2)
    assert out == [["Image 1 is better"] * 2] * 5
    path, headers, body = srv.requests[0]
    assert path == "/v1/chat/completions" and headers["Authorization"] == "Bearer sk-test"
    assert body["model"] == "judge-model" and body["temperature"] == 0.0 and body["n"] == 2
    content = body["messages"][0]["content"]
    assert [c["type"] for c in content] == ["image_url", "image_url", "text"]
    url = content[0]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    decoded = torch.tensor(list(Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).getdata()))
    expected = (img.permute(1, 2, 0).reshape(-1, 3) * 255).round()
    torch.testing.assert_close(decoded.float(), expected)  # lossless: the judge sees our pixels


def test_openai_backend_retries_with_backoff_then_succeeds():
    with FakeChatServer(fail_first=2, status=503) as srv:
        backend = OpenAIChatBackend(srv.url, "m", max_retries=3, backoff=0.05)
        t0 = time.perf_counter()
        out = backend.generate([JudgeRequest("q")])
        elapsed = time.perf_counter() - t0
    assert out == [["Image 1 is better"]] and backend.calls == 3
    assert elapsed >= 0.05 + 0.1 - 0.01  # backoff * (1 + 2)


def test_openai_backend_client_error_fails_fast_and_timeout_is_reported():
    with FakeChatServer(fail_first=10, status=400) as srv:
        backend = OpenAIChatBackend(srv.url, "m", max_retries=3, backoff=0.01)
        with pytest.raises(JudgeBackendError, match="HTTP 400"):
            backend.generate([JudgeRequest("q")])
        assert backend.calls == 1
    with FakeChatServer(delay=1.0) as srv:
        backend = OpenAIChatBackend(srv.url, "m", timeout=0.2, max_retries=1, backoff=0.01)
        with pytest.raises(JudgeBackendError, match="after 2 attempts"):
            backend.generate([JudgeRequest("q")])


def test_judge_over_openai_backend_end_to_end():
    import mmreward

    with FakeChatServer(answer="<answer>Image 1 is better</answer>") as srv:
        judge = mmreward.load("unifiedreward-think", backend="openai", base_url=srv.url, checkpoint="served-judge")
        a, b, _ = _pairs()
        out = judge.compare("a cat", a[:3], b[:3])
    torch.testing.assert_close(out.prob_a, torch.full((3,), 0.5))  # a constant answer is pure position bias
    assert judge.last_agreement_rate == 0.0
    assert len(srv.requests) == 6 and all(r[2]["model"] == "served-judge" for r in srv.requests)
    with pytest.raises(mmreward.RewardInputError, match="base_url"):
        mmreward.load("unifiedreward", backend="openai", checkpoint="x")


# ---------------------------------------------------------------------------------------------- Pref-GRPO cost
class BrightnessJudgeServer(LoopbackChatServer):
    """Prefers the brighter image, with a first-position bonus of `bias` grey levels; records every verdict
    as (prompt, level shown first, level shown second, 1.0 if the first won else 0.0)."""

    def __init__(self, bias=40):
        self.bias, self.verdicts = bias, []
        super().__init__()

    def reply(self, body, n_seen):
        from PIL import Image

        content = body["messages"][0]["content"]
        urls = [c["image_url"]["url"] for c in content if c["type"] == "image_url"]
        first, second = (Image.open(io.BytesIO(base64.b64decode(u.split(",", 1)[1]))).getpixel((0, 0))[0]
                         for u in urls)
        text = next(c["text"] for c in content if c["type"] == "text")
        won = first + self.bias > second
        self.verdicts.append((text, first, second, 1.0 if won else 0.0))
        answer = f"<answer>Image {1 if won else 2} is better</answer>"
        return 200, {"choices": [{"message": {"role": "assistant", "content": answer}}] * body.get("n", 1)}


@pytest.mark.parametrize("group_size", [4, 8])
@pytest.mark.parametrize("both_orders", [True, False])
def test_pref_grpo_with_a_pairwise_judge_asks_each_ordered_pair_once(group_size, both_orders):
    """Pref-GRPO's advantage path with a served judge: G(G-1) judge requests per group with both orders
    (the judge's own swap; group win rates do not swap again), G(G-1)/2 with one; win rates from the
    per-order verdicts by hand."""
    from types import SimpleNamespace

    import mmreward
    from diffusion_rl.algorithms.pref_grpo import PrefGRPO
    from diffusion_rl.config import from_dict

    G, prompts = group_size, ["a red circle", "two blue squares"]
    g = torch.Generator().manual_seed(group_size)
    levels = [torch.randperm(200, generator=g)[:G] + 30 for _ in prompts]  # distinct grey levels per group
    images = torch.cat([lv.float().div(255).view(G, 1, 1, 1).expand(G, 3, 8, 8) for lv in levels])
    cfg = from_dict({"preset": "pref_grpo", "sample": {"group_size": G}, "reward": {"both_orders": both_orders,
                                                                                  "rewards": {"unifiedreward-think": 1.0}}})
    batch = SimpleNamespace(prompts=[p for p in prompts for _ in range(G)], images=images,
                            slots=torch.arange(len(prompts)).repeat_interleave(G))
    with BrightnessJudgeServer() as srv:
        judge = mmreward.load("unifiedreward-think", backend="openai", base_url=srv.url, checkpoint="j",
                              debias=both_orders)
        adv, metrics = PrefGRPO(cfg, judge).advantages(SimpleNamespace(batch=batch, order=None))

    expected_adv, agree = [], []
    for prompt, lv in zip(prompts, levels):
        asked = {(f, s): v for text, f, s, v in srv.verdicts if prompt in text}
        per_group = sum(prompt in text for text, *_ in srv.verdicts)
        assert per_group == (G * (G - 1) if both_orders else G * (G - 1) // 2)
        lv = lv.tolist()
        credit = torch.zeros(G, G)
        for i in range(G):
            for j in range(i + 1, G):
                v_ij = asked[(lv[i], lv[j])]  # the pair is shown in group order: i first
                if both_orders:
                    v_ji = asked[(lv[j], lv[i])]
                    p = (v_ij + 1 - v_ji) / 2
                    agree.append(float(v_ij != v_ji))  # binary verdicts: same winner iff the first-shown differs
                else:
                    p = v_ij
                credit[i, j] = 1.0 if p > 0.5 else 0.0 if p < 0.5 else 0.5
                credit[j, i] = 1 - credit[i, j]
        win = credit.sum(1) / (G - 1)
        expected_adv.append((win - win.mean()) / (win.std() + 1e-8))
    torch.testing.assert_close(adv, torch.cat(expected_adv).clamp(-5, 5), rtol=1e-5, atol=1e-6)
    if both_orders:
        assert 0 < sum(agree) < len(agree)  # the bias flips some close pairs: the swap matters here
        assert metrics["pref/order_agreement"] == pytest.approx(sum(agree) / len(agree))
        assert metrics["pref/ties"] == len(agree) - sum(agree)
    else:
        assert "pref/order_agreement" not in metrics
