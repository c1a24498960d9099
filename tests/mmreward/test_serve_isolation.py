"""The reward server's per-request logic without Ray: bounded body reading, JSON object checks, validation
before batching, and isolation of a failing request inside a merged batch."""

from __future__ import annotations

import asyncio
import base64

import pytest
import torch

import mmreward
from mmreward.errors import MediaError, RewardInputError, RewardValueError
from mmreward.serve import (
    BadRequestError,
    Item,
    RequestTooLargeError,
    decode_tensor,
    encode_tensor,
    error_status,
    merge_results,
    parse_json_object,
    prepare_request,
    read_body,
    score_items,
)
from mmreward.testing.faulty import FaultyMockReward


@pytest.fixture(scope="module")
def mock():
    return mmreward.load("mock")


# ---------------------------------------------------------------------------------------------- body
def _chunks(n_chunks: int, size: int, pulled: list[int]):
    async def gen():
        for _ in range(n_chunks):
            pulled[0] += 1
            yield b"x" * size

    return gen()


def test_read_body_stops_at_the_first_chunk_past_the_limit():
    pulled = [0]
    with pytest.raises(RequestTooLargeError, match="max_request_bytes=10500"):
        asyncio.run(read_body(_chunks(1000, 1000, pulled), limit=10_500))
    assert pulled[0] == 11  # 11 000 bytes > 10 500: nothing after that chunk is read
    pulled = [0]
    assert asyncio.run(read_body(_chunks(10, 1000, pulled), limit=10_000)) == b"x" * 10_000


@pytest.mark.parametrize("body,kind", [(b"[1, 2]", "array"), (b"null", "null"), (b'"media"', "string"),
                                       (b"3", "number"), (b"true", "boolean")])
def test_non_object_json_is_a_bad_request_naming_what_it_got(body, kind):
    with pytest.raises(BadRequestError, match=f"must be a JSON object.*got a JSON {kind}"):
        parse_json_object(body)


@pytest.mark.parametrize("body,match", [(b"[" * 200_000 + b"]" * 200_000, "nested too deeply"),
                                        (b'{"media": ' + b"[" * 200_000, "nested too deeply"),
                                        (b"{not json", "not valid JSON"), (b"\xff\xfe{}", "not valid JSON"),
                                        (b"", "not valid JSON")])
def test_unparsable_bodies_are_bad_requests(body, match):
    with pytest.raises(BadRequestError, match=match):
        parse_json_object(body)


# ---------------------------------------------------------------------------------------------- wire format
def test_decode_tensor_round_trips_float32_exactly():
    x = torch.rand(2, 3, 5, 4)
    assert torch.equal(decode_tensor(encode_tensor(x), "media"), x)


@pytest.mark.parametrize("obj,match", [
    ([1, 2], "expected an object"),
    ({"dtype": "float32", "shape": [1]}, "expected an object"),
    ({"dtype": ["float32"], "shape": [1], "data": ""}, "dtype must be one of"),
    ({"dtype": "float64", "shape": [1], "data": ""}, "dtype must be one of"),
    ({"dtype": "float32", "shape": [1.5], "data": ""}, "non-negative integers"),
    ({"dtype": "float32", "shape": [-1], "data": ""}, "non-negative integers"),
    ({"dtype": "float32", "shape": [True], "data": ""}, "non-negative integers"),
    ({"dtype": "float32", "shape": "1,3", "data": ""}, "non-negative integers"),
    ({"dtype": "float32", "shape": [1] * 9, "data": ""}, "non-negative integers"),
    ({"dtype": "float32", "shape": [1], "data": 12}, "base64 string"),
    ({"dtype": "float32", "shape": [1], "data": "@@@@"}, "not valid base64"),
    ({"dtype": "float32", "shape": [1], "data": "é"}, "not valid base64"),
    ({"dtype": "float32", "shape": [2], "data": base64.b64encode(b"abc").decode()}, "3 bytes of data do not fill"),
])
def test_decode_tensor_names_every_malformed_field(obj, match):
    with pytest.raises(RewardInputError, match=match):
        decode_tensor(obj, "media")


# ---------------------------------------------------------------------------------------------- validation
def _score_payload(x, prompts="a red square"):
    return {"prompts": prompts, "media": encode_tensor(x)}


def test_prepare_request_makes_one_item_per_image(mock):
    x = torch.rand(3, 3, 4, 4)
    items = prepare_request(_score_payload(x, ["a", "b", "c"]), "score", mock, max_items=8, request_id=7)
    assert [it.prompt for it in items] == ["a", "b", "c"] and {it.request for it in items} == {7}
    assert all(torch.equal(it.media[0], x[i]) for i, it in enumerate(items))


@pytest.mark.parametrize("make,error,match", [
    (lambda: torch.full((1, 3, 4, 4), float("nan")), MediaError, "NaN or infinite"),
    (lambda: torch.zeros(1, 3, 0, 0), RewardInputError, "at least one frame, channel and pixel"),
    (lambda: torch.zeros(2, 0, 3, 4, 4), RewardInputError, "at least one frame, channel and pixel"),
    (lambda: torch.zeros(0, 3, 4, 4), RewardInputError, "empty batch"),
    (lambda: torch.rand(3, 4, 4), RewardInputError, r"\[B, 3, H, W\]"),
    (lambda: torch.rand(1, 2, 6, 6), MediaError, "channel"),
    (lambda: torch.rand(1, 3, 4, 4) * 7, MediaError, "outside the declared range"),
])
def test_prepare_request_refuses_bad_media_on_its_own(mock, make, error, match):
    with pytest.raises(error, match=match) as info:
        prepare_request(_score_payload(make()), "score", mock, max_items=8, request_id=0)
    assert error_status(info.value) == 400


def test_prepare_request_checks_keys_prompts_pairs_and_item_count(mock):
    x = encode_tensor(torch.rand(2, 3, 4, 4))
    with pytest.raises(BadRequestError, match=r"unknown keys \['prompt'\]"):
        prepare_request({"prompt": "a", "media": x}, "score", mock, max_items=8, request_id=0)
    with pytest.raises(BadRequestError, match="missing 'media_b'"):
        prepare_request({"media_a": x}, "compare", mock, max_items=8, request_id=0)
    with pytest.raises(RewardInputError, match="same length"):
        prepare_request({"prompts": ["a"], "media": x}, "score", mock, max_items=8, request_id=0)
    with pytest.raises(RewardInputError, match="same length"):
        prepare_request({"media_a": x, "media_b": encode_tensor(torch.rand(3, 3, 4, 4))}, "compare", mock,
                        max_items=8, request_id=0)
    # the item count is refused from the shape alone, before the data is decoded
    huge = {"dtype": "float32", "shape": [9, 3, 4, 4], "data": "not base64 at all"}
    with pytest.raises(RequestTooLargeError, match="max_request_items=8") as info:
        prepare_request({"media": huge}, "score", mock, max_items=8, request_id=0)
    assert error_status(info.value) == 413


# ---------------------------------------------------------------------------------------------- isolation
def test_a_failing_request_fails_alone_inside_a_merged_batch():
    """Four requests share one same-shaped batch; two of them make the reward fail (untyped and typed)."""
    reward, mock = FaultyMockReward(), mmreward.load("mock")
    g = torch.Generator().manual_seed(0)
    requests = {0: ["a red square", "a blue square"], 1: ["raise-untyped"], 2: ["a green square"],
                3: ["nan-score here", "a red square"]}
    media = {r: torch.rand(len(ps), 3, 6, 6, generator=g) for r, ps in requests.items()}
    items = [Item(r, p, (media[r][i],)) for r, ps in requests.items() for i, p in enumerate(ps)]
    calls = []

    def call(prompts, stacked):
        calls.append(len(prompts))
        return reward.score(prompts, stacked[0])

    results = score_items(items, call)
    assert calls[0] == 6  # the merged call was tried first
    per_request = {r: merge_results([res for it, res in zip(items, results) if it.request == r]) for r in requests}
    for r in (0, 2):
        body, status = per_request[r]
        assert status == 200
        assert body["scores"] == mock.score(requests[r], media[r]).scores.tolist()
    assert per_request[1][1] == 500 and "RuntimeError" in per_request[1][0]["error"]
    assert "raise-untyped" not in per_request[1][0]["error"]  # an untyped error's text stays in the log
    assert per_request[3][1] == 422 and "RewardValueError" in per_request[3][0]["error"]


def test_merged_and_isolated_pairs_give_the_in_process_probabilities():
    reward, mock = FaultyMockReward(), mmreward.load("mock")
    g = torch.Generator().manual_seed(1)
    a, b = torch.rand(3, 3, 5, 5, generator=g), torch.rand(3, 3, 5, 5, generator=g)
    prompts = ["a red square", "raise-untyped", "a blue square"]
    items = [Item(i, p, (a[i], b[i])) for i, p in enumerate(prompts)]
    results = score_items(items, lambda ps, m: reward.compare(ps, m[0], m[1]))
    for i in (0, 2):
        want = mock.compare(prompts[i], a[i : i + 1], b[i : i + 1])
        assert results[i]["prob_a"] == want.prob_a.tolist()[0]
        assert results[i]["score_a"] == want.score_a.tolist()[0]
    assert results[1]["status"] == 500


@pytest.mark.parametrize("exc,status", [(RequestTooLargeError("x"), 413), (BadRequestError("x"), 400),
                                        (MediaError("x"), 400), (RewardValueError("x"), 422),
                                        (mmreward.CheckpointError("x"), 500), (RuntimeError("x"), 500),
                                        (KeyError("x"), 500)])
def test_error_status(exc, status):
    assert error_status(exc) == status
