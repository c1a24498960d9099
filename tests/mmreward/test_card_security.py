"""A downloaded folder's mmreward.json may tune a reward, never choose where data goes (issue 28 item 14).

Before the allow-list, {"reward": "unifiedreward", "options": {"backend": "openai", "base_url": HOST}} made
`mmreward.load(folder).score(...)` POST the user's images to HOST. Here every refused card is loaded next to
a loopback judge server that records any request, with socket connections recorded as well: none may
happen. The same options passed by the user to `load` still work (and reach the server, which shows the
recording would have seen a request).
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch

import mmreward
from mmreward.errors import CardOptionError, CheckpointError, UnknownOptionError, UnknownRewardError
from mmreward.registry import CARD_KINDS, register_reward, specs
from mmreward.types import RewardSpec
from tests._helpers.loopback_chat import LoopbackChatServer


class RecordingJudge(LoopbackChatServer):
    """Answers every chat request with UnifiedReward-2.0 dimension scores 4, 3, 5 (mean 4), and records it."""

    def reply(self, body, n_seen):
        answer = "Alignment Score (1-5): 4\nCoherence Score (1-5): 3\nStyle Score (1-5): 5"
        return 200, {"choices": [{"message": {"role": "assistant", "content": answer}}
                                 for _ in range(body.get("n", 1))]}


@pytest.fixture
def judge_server():
    with RecordingJudge() as srv:
        yield srv


@pytest.fixture
def connections(monkeypatch):
    """Every outgoing socket connection attempted while the test runs (the loopback server's own accepts
    are not connections); the real connect still runs, so explicit endpoints keep working."""
    seen: list = []
    real = socket.socket.connect

    def connect(self, address):
        seen.append(address)
        return real(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    return seen


def _card_folder(root: Path, card: dict, name: str = "downloaded") -> Path:
    folder = root / name
    folder.mkdir()
    (folder / "mmreward.json").write_text(json.dumps(card))
    return folder


def _images(n: int = 2) -> torch.Tensor:
    return torch.rand(n, 3, 16, 16, generator=torch.Generator().manual_seed(0))


# ---------------------------------------------------------------------------------------------- refused
@pytest.mark.parametrize("reward, options, named", [
    ("unifiedreward", {"backend": "openai", "base_url": "SERVER"}, ["backend", "base_url"]),
    ("unifiedreward", {"backend": "openai", "base_url": "SERVER", "api_key": "sk-stolen"},
     ["api_key", "backend", "base_url"]),
    ("unifiedreward", {"mode": "generate", "api_key": "sk-stolen"}, ["api_key"]),
    ("paco-reward", {"backend": "openai", "base_url": "SERVER"}, ["backend", "base_url"]),
    ("editscore", {"backend": "openai", "base_url": "SERVER", "timeout": 1.0}, ["backend", "base_url", "timeout"]),
    ("vqascore", {"trust_remote_code": True}, ["trust_remote_code"]),
    ("clipscore", {"tokenizer": "/etc"}, ["tokenizer"]),
    ("hpsv2", {"filename": "/etc/passwd"}, ["filename"]),
    ("hpsv2", {"model_cfg": {"text_cfg": {"hf_model_name": "org/any-repo"}}}, ["model_cfg"]),
    ("unifiedreward", {"pointwise_template": "{prompt.__class__}"}, ["pointwise_template"]),
])
def test_card_with_network_code_or_outside_options_is_refused_and_nothing_connects(
        tmp_path, judge_server, connections, reward, options, named):
    options = {k: judge_server.url if v == "SERVER" else v for k, v in options.items()}
    folder = _card_folder(tmp_path, {"reward": reward, "options": options})
    with pytest.raises(CardOptionError) as err:
        mmreward.load(folder).score(["a cat"] * 2, _images())
    msg = str(err.value)
    assert all(repr(n) in msg for n in named), msg
    assert f"mmreward.load('{folder}', " in msg  # the explicit way, for a folder the user trusts
    assert isinstance(err.value, CheckpointError) and isinstance(err.value, UnknownOptionError)
    assert judge_server.requests == [] and connections == []


def test_explicit_user_options_still_reach_the_endpoint_the_user_chose(tmp_path, connections):
    """The user's own backend/base_url override the card's (refused) ones: data goes where the user said."""
    with RecordingJudge() as evil, RecordingJudge() as chosen:
        folder = _card_folder(tmp_path, {"reward": "unifiedreward",
                                         "options": {"backend": "openai", "base_url": evil.url}})
        judge = mmreward.load(folder, backend="openai", base_url=chosen.url)
        scores = judge.score(["a cat", "a dog"], _images()).scores
        assert evil.requests == [] and len(chosen.requests) == 2
        port = int(chosen.url.rsplit(":", 1)[1].split("/")[0])
        assert {a[1] for a in connections} == {port}
    torch.testing.assert_close(scores, torch.full((2,), 4.0))


def test_nested_load_options_obey_the_card_rules(tmp_path, judge_server, connections):
    """A backbone's options inside a card are checked against the backbone reward's own allow-list."""
    bad = _card_folder(tmp_path, {"reward": "video-frames", "options": {
        "image_reward": "mock", "image_options": {"base_url": judge_server.url}}}, "bad")
    with pytest.raises(CardOptionError, match=r"'base_url' for reward 'mock'") as err:
        mmreward.load(bad)
    assert f"mmreward.load('video-frames', checkpoint='{bad}'" in str(err.value)
    assert judge_server.requests == [] and connections == []

    ok = _card_folder(tmp_path, {"reward": "video-frames", "options": {
        "image_reward": "jpeg-compressibility", "image_options": {"quality": 40}, "num_frames": 2}}, "ok")
    reward = mmreward.load(ok)
    assert reward.num_frames == 2 and reward.image_reward.quality == 40


def test_nested_loads_name_registered_rewards_only(tmp_path):
    """A load that a card's loader triggers (a backbone, a detector) may not name another folder (whose own
    card would apply), a class, or a checkpoint outside the card's folder."""
    def loader(checkpoint, *, weights, inner=None, **options):
        mmreward.load(inner["reward"], checkpoint=inner.get("checkpoint"))  # as backbone-wrapping loaders do
        return mmreward.load("mock")

    register_reward(RewardSpec("test-card-nested", loader, "t", needs_weights=False,
                               card_options={"inner": "nested"}), overwrite=True)
    other = _card_folder(tmp_path, {"reward": "mock"}, "other")
    (other / "weights.safetensors").write_bytes(b"")
    cases = [
        ({"reward": str(other)}, UnknownRewardError, "not a registered reward name"),
        ({"reward": "hf-hub:org/repo"}, UnknownRewardError, "not a registered reward name"),
        ({"reward": "mmreward.models.mock:MockReward"}, UnknownRewardError, "not a registered reward name"),
        ({"reward": "univfd", "checkpoint": str(other / "weights.safetensors")}, CardOptionError,
         "'checkpoint' for reward 'univfd'.*outside the card's folder"),
    ]
    for i, (inner, error, match) in enumerate(cases):
        folder = _card_folder(tmp_path, {"reward": "test-card-nested", "options": {"inner": inner}}, f"c{i}")
        with pytest.raises(error, match=match):
            mmreward.load(folder)
    # the same loader, the user's choice: loading by name is not bound by the card rules
    folder = _card_folder(tmp_path, {"reward": "test-card-nested"}, "trusted")
    assert isinstance(mmreward.load("test-card-nested", checkpoint=folder, inner={"reward": str(other)}),
                      mmreward.Reward)


@pytest.mark.parametrize("value", ["/etc", "../downloaded-sibling", "local-dir:/etc", "~/.ssh"])
def test_path_options_outside_the_folder_are_refused(tmp_path, value):
    (tmp_path / "downloaded-sibling").mkdir()
    folder = _card_folder(tmp_path, {"reward": "univfd", "options": {"backbone": value}})
    with pytest.raises(CardOptionError, match="'backbone'.*outside the card's folder"):
        mmreward.load(folder)


# ---------------------------------------------------------------------------------------------- allowed
def test_card_with_allowed_options_loads_and_scores(tmp_path):
    folder = _card_folder(tmp_path, {"reward": "jpeg-compressibility", "options": {"quality": 30}})
    images = _images()
    reward = mmreward.load(folder)
    assert reward.quality == 30
    got = reward.score(["x", "x"], images).scores
    default = mmreward.load("jpeg-compressibility").score(["x", "x"], images).scores
    assert not torch.allclose(got, default)  # the card's option took effect (quality 30 vs 95)

    strict = _card_folder(tmp_path, {"reward": "shapes-eval", "options": {"mode": "partial"}}, "shapes")
    assert mmreward.load(strict).mode == "partial"


def test_card_paths_resolve_inside_the_folder_whatever_the_working_directory(tmp_path, monkeypatch):
    seen = {}

    def loader(checkpoint, *, weights, **options):
        seen.update(checkpoint=checkpoint, **options)
        return mmreward.load("mock")

    register_reward(RewardSpec("test-card-probe", loader, "t", needs_weights=False, card_options={
        "weights_dir": "path", "hub_weights": "path", "level": "value"}), overwrite=True)
    folder = _card_folder(tmp_path, {"reward": "test-card-probe", "options": {
        "weights_dir": "sub", "hub_weights": "org/repo", "level": 3}})
    (folder / "sub").mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    mmreward.load(folder)
    assert seen["weights_dir"] == str((folder / "sub").resolve())
    assert seen["hub_weights"] == "org/repo" and seen["level"] == 3

    # a reward registered without card_options: its cards may set nothing
    register_reward(RewardSpec("test-card-none", loader, "t", needs_weights=False), overwrite=True)
    with pytest.raises(CardOptionError, match="it may set: none"):
        mmreward.load(_card_folder(tmp_path, {"reward": "test-card-none", "options": {"level": 1}}, "none"))
    mmreward.load(_card_folder(tmp_path, {"reward": "test-card-none"}, "bare"), level=1)  # explicit: fine
    assert seen["level"] == 1
    with pytest.raises(ValueError, match="unknown kinds"):
        register_reward(RewardSpec("test-card-bad", loader, "t", card_options={"x": "anything"}), overwrite=True)


# ---------------------------------------------------------------------------------------------- audit
_NEVER = {"backend", "base_url", "api_key", "timeout", "max_retries", "max_concurrency", "image_format",
          "trust_remote_code", "tokenizer", "processor", "base_model", "filename", "model_name",
          "backbone_model_name", "engine", "detector_options", "tiny", "attention", "weights", "device", "dtype",
          "model_cfg", "backbone_config"}  # open_clip configs: text_cfg.hf_model_name fetches a hub config
_NEVER_PARTS = ("url", "key", "host", "server", "endpoint", "port", "remote", "tokenizer", "template", "secret")


def test_no_builtin_reward_lets_a_card_set_network_code_or_path_options():
    paths = set()
    for name, spec in specs().items():
        if name.startswith("test-"):
            continue
        assert set(spec.card_options.values()) <= set(CARD_KINDS), name
        for option, kind in spec.card_options.items():
            assert option not in _NEVER, (name, option)
            assert not any(p in option for p in _NEVER_PARTS), (name, option)
            if kind == "path":
                paths.add((name, option))
    # every path-valued card option, reviewed: each is resolved inside the folder (or a hub id)
    assert paths == {("preference-head", "backbone_checkpoint"), ("univfd", "backbone")}
