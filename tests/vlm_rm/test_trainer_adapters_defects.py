"""Issue 30 item 5: the trl, verl and EasyR1 adapter defects a user hits at integration time.

Each test drives our adapter through the trainer's own calling code: trl's installed
`GRPOTrainer._calculate_rewards` (trl 1.16.0) itself, and for verl 0.9.1 and EasyR1 (not installed here)
their reward managers' calls transcribed from the release sources named in each docstring.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import types

import numpy as np
import pytest
import torch
from PIL import Image

import mmreward
from mmreward.errors import ConfigError, RewardInputError
from vlm_rm.adapters import easyr1, media_ref, trl_reward_function, verl

# the registry's 'mock' reward: -mean((pixel - colour named in the text)^2); a solid red image scores
# 0 against "red" and -(1 + 1 + 0) / 3 against "green"
RED, GREEN = 0.0, -2 / 3


@pytest.fixture
def red_png(tmp_path):
    path = tmp_path / "red.png"
    Image.new("RGB", (16, 16), (255, 0, 0)).save(path)
    return str(path)


# ------------------------------------------------------------------------------------------------
# trl: GRPOTrainer._calculate_rewards, the installed release's own code
# ------------------------------------------------------------------------------------------------
def _trl_calculate_rewards(reward_funcs, inputs, prompts, completions):
    """Run trl's real `GRPOTrainer._calculate_rewards` on a minimal trainer stand-in.

    The method builds reward_kwargs from every dataset column but prompt/completion/completion_ids,
    adds trainer_state/log_extra/log_metric, and calls each function with
    `f(prompts=, completions=, completion_ids=, **reward_kwargs)`; async functions are gathered on
    `self.async_loop`. Only the attributes it reads are provided.
    """
    trl = pytest.importorskip("trl")
    from trl import GRPOTrainer

    assert trl.__version__ == "1.16.0", "the calling convention below was read from trl 1.16.0"
    loop = asyncio.new_event_loop()
    import threading

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    stand_in = types.SimpleNamespace(
        accelerator=types.SimpleNamespace(device=torch.device("cpu"), is_main_process=True),
        reward_funcs=reward_funcs, reward_processing_classes=[None] * len(reward_funcs),
        reward_func_names=[f.__name__ for f in reward_funcs], state=types.SimpleNamespace(global_step=0),
        args=types.SimpleNamespace(report_to=[]), _log_completion_extra=lambda *a, **k: None,
        _log_metric=lambda *a, **k: None, environments=None, async_loop=loop,
    )
    try:
        return GRPOTrainer._calculate_rewards(stand_in, inputs, prompts, completions, [[1]] * len(completions))
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


def _trl_batch(image):
    """Two completions of one VLM prompt, as GRPOTrainer holds them after generation (trl 1.16.0:
    dataset images inserted into the prompt by prepare_multimodal_messages, the `image` column kept)."""
    from trl.data_utils import prepare_multimodal_messages

    prompt = prepare_multimodal_messages([{"role": "user", "content": "What colour is the shape?"}], images=[image])
    inputs = [{"prompt": prompt, "image": image}, {"prompt": prompt, "image": image}]
    completions = [[{"role": "assistant", "content": "red"}], [{"role": "assistant", "content": "green"}]]
    return inputs, [prompt, prompt], completions


def test_trl_reward_by_name_is_loaded_once_at_construction(red_png, monkeypatch):
    """Today: trl_reward_function('mock') returns a function that raises AttributeError: 'str' object
    has no attribute 'score' at the first step."""
    calls = []
    real_load = mmreward.load
    monkeypatch.setattr(mmreward, "load", lambda *a, **k: calls.append((a, k)) or real_load(*a, **k))
    fn = trl_reward_function("mock", scale=2.0, asynchronous=False)
    afn = trl_reward_function("mock", asynchronous=True, name="colour_async")
    assert len(calls) == 2 and calls[0][0] == ("mock",)  # loaded here, not at the first step
    inputs, prompts, completions = _trl_batch(Image.open(red_png))
    for _ in range(2):  # two training steps: still two loads in all
        got = _trl_calculate_rewards([fn, afn], inputs, prompts, completions)
    assert len(calls) == 2
    assert got[:, 0].tolist() == pytest.approx([2 * RED, 2 * GREEN])
    assert got[:, 1].tolist() == pytest.approx([RED, GREEN])


def test_trl_shapesworld_pref_by_name_and_tag_and_object(red_png, monkeypatch):
    """The issue's exact case: 'shapesworld-pref' by name, by name:tag, and as a Reward, equal scores.

    shapesworld-pref has no tags (its tagged siblings name hub checkpoints, unreachable offline), so
    the test gives its spec one tag naming the shipped weights.
    """
    import dataclasses

    from mmreward import registry

    spec = registry.get_spec("shapesworld-pref")
    monkeypatch.setitem(registry._REGISTRY, "shapesworld-pref",
                        dataclasses.replace(spec, tags={"shipped": spec.default_checkpoint}))
    by_object = mmreward.load("shapesworld-pref")
    fns = [trl_reward_function("shapesworld-pref"), trl_reward_function("shapesworld-pref:shipped"),
           trl_reward_function(by_object)]
    inputs, prompts, completions = _trl_batch(Image.open(red_png))
    got = _trl_calculate_rewards(fns, inputs, prompts, completions)
    direct = by_object.score(["red", "green"], [red_png, red_png]).scores
    for j in range(3):
        assert torch.allclose(got[:, j], direct, rtol=1e-5, atol=1e-5 * float(direct.abs().max()))


def test_trl_images_only_in_prompt_messages(red_png):
    """A dataset whose images live only inside the prompt messages (no image column): trl 1.16.0
    reads them from `{"type": "image", "image": ...}` parts for generation; the reward must too."""
    image = Image.open(red_png)
    inputs, prompts, completions = _trl_batch(image)
    inputs = [{"prompt": p} for p in prompts]  # no image column
    got = _trl_calculate_rewards([trl_reward_function("mock")], inputs, prompts, completions)
    assert got[:, 0].tolist() == pytest.approx([RED, GREEN])


def test_trl_bad_reward_argument_is_a_config_error():
    with pytest.raises(ConfigError, match="expected an mmreward Reward or a reward name"):
        trl_reward_function(3.0)
    with pytest.raises(ConfigError, match="apply when `reward` is a name"):
        trl_reward_function(mmreward.load("mock"), device="cuda")
    with pytest.raises(mmreward.errors.UnknownRewardError, match="clipscore"):
        trl_reward_function("no-such-reward")


# ------------------------------------------------------------------------------------------------
# verl 0.9.1: the Reward Loop's managers, GDPO components, the remote manager
# ------------------------------------------------------------------------------------------------
VERL_091_MANAGERS = ("dapo", "gdpo", "naive", "rate_limited", "remote")  # REWARD_MANAGER in verl==0.9.1


def _verl_fn(name, reward_kwargs):
    """verl==0.9.1 verl/trainer/ppo/reward.py get_custom_reward_fn: our file loaded by path, reward_kwargs
    merged over the call's kwargs (`{**kwargs, **extra_kwargs}`), the async wrapper for coroutines."""
    spec = importlib.util.spec_from_file_location("custom_module", verl.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    raw = getattr(module, name)

    def call(*args, **kwargs):
        return raw(*args, **{**kwargs, **reward_kwargs})

    async def call_async(*args, **kwargs):
        return await raw(*args, **{**kwargs, **reward_kwargs})

    return call_async if inspect.iscoroutinefunction(raw) else call


async def _run_single(compute_score, sample, manager):
    """verl==0.9.1 verl/experimental/reward_loop/reward_manager/{naive,gdpo,remote}.py run_single: keyword
    call, then `score = result["score"]` and every key into reward_extra_info for a dict, else acc."""
    data_source, solution_str, ground_truth, extra_info = sample
    kwargs = dict(data_source=data_source, solution_str=solution_str, ground_truth=ground_truth,
                  extra_info=dict(extra_info))
    if manager == "remote":  # RemoteRewardManager.__init__ asserts a sync function; a worker process calls it
        assert not inspect.iscoroutinefunction(compute_score), "Async reward score is not supported in remote"
        result = compute_score(**kwargs)
    elif inspect.iscoroutinefunction(compute_score):
        result = await compute_score(**kwargs)
    else:
        result = await asyncio.get_running_loop().run_in_executor(None, lambda: compute_score(**kwargs))
    if isinstance(result, dict):
        return {"reward_score": result["score"], "reward_extra_info": dict(result)}
    return {"reward_score": result, "reward_extra_info": {"acc": result}}


def _reward_loop(compute_score, samples, manager):
    """verl==0.9.1 reward_loop.py RewardLoopWorker: samples gathered, then reward_extra_info stacked key by
    key from the first sample's keys (`np.array([info[key] for info in reward_extra_infos])`)."""
    import numpy as np

    async def gather():
        return await asyncio.gather(*(_run_single(compute_score, s, manager) for s in samples))

    outputs = asyncio.run(gather())
    infos = [o["reward_extra_info"] for o in outputs]
    return [o["reward_score"] for o in outputs], {k: np.array([i[k] for i in infos]) for k in infos[0]}


def _gdpo_advantage(non_tensor_batch, keys, weights, index, eps=1e-6):
    """verl==0.9.1 core_algos.compute_gdpo_outcome_advantage for one-token responses: each key normalised
    within its group (compute_grpo_outcome_advantage: torch.std, + eps), weighted sum, masked_whiten."""
    from collections import defaultdict

    total = None
    for key, w in zip(keys, weights):
        scores = torch.tensor(np.asarray(non_tensor_batch[key], dtype=np.float32))
        groups = defaultdict(list)
        for i, g in enumerate(index):
            groups[g].append(scores[i])
        stats = {g: (torch.stack(v).mean(), torch.stack(v).std()) for g, v in groups.items()}
        norm = torch.stack([(scores[i] - stats[g][0]) / (stats[g][1] + eps) for i, g in enumerate(index)])
        total = w * norm if total is None else total + w * norm
    mean = total.sum() / (len(total) + 1e-8)
    var = ((total - mean) ** 2).sum() / (len(total) + 1e-8) * (len(total) / (len(total) - 1))
    return (total - mean) * torch.rsqrt(var + 1e-8)


@pytest.fixture
def colour_samples(tmp_path):
    paths = {}
    for name, rgb in {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255)}.items():
        paths[name] = str(tmp_path / f"{name}.png")
        Image.new("RGB", (8, 8), rgb).save(paths[name])
    texts = ["red", "green", "blue", "red", "green", "blue"]
    images = ["red", "red", "red", "blue", "blue", "green"]
    samples = [("shapes", t, "x", {"mmreward_media": paths[i]}) for t, i in zip(texts, images)]
    return samples, [paths[i] for i in images]


@pytest.mark.parametrize(("entry", "manager"), [("compute_score", "gdpo"), ("compute_score_async", "gdpo"),
                                               ("compute_score", "remote"), ("compute_score_async", "dapo")])
def test_verl_gdpo_components_from_rewards_mapping(colour_samples, entry, manager):
    """Today `rewards:` and `details:` are ignored keyword arguments and the answer is a float, so verl's
    GDPO estimator finds no component keys. With them: one key per reward, raw scores, 'score' the sum."""
    samples, paths = colour_samples
    kwargs = {"rewards": {"mock": 1.0, "jpeg-compressibility": 0.5}, "details": True, "device": "cpu"}
    scores, extra = _reward_loop(_verl_fn(entry, kwargs), samples, manager)
    texts = [s[1] for s in samples]
    loaded = {n: mmreward.load(n) for n in ("mock", "jpeg-compressibility")}
    direct = {n: r.score(texts, paths).scores for n, r in loaded.items()}
    assert sorted(extra) == ["jpeg-compressibility", "mock", "score"]
    for n in ("mock", "jpeg-compressibility"):
        assert torch.allclose(torch.tensor(extra[n], dtype=torch.float32), direct[n], atol=1e-6)
    sign = 1.0 if loaded["jpeg-compressibility"].higher_is_better else -1.0  # WeightedSum orients each term
    total = direct["mock"] + 0.5 * sign * direct["jpeg-compressibility"]
    assert torch.allclose(torch.tensor(scores, dtype=torch.float32), total, atol=1e-6)
    index = ["a", "a", "a", "b", "b", "b"]
    got = _gdpo_advantage(extra, ["mock", "jpeg-compressibility"], [1.0, 0.5], index)
    want = _gdpo_advantage({n: direct[n].numpy() for n in direct}, ["mock", "jpeg-compressibility"], [1.0, 0.5], index)
    assert torch.allclose(got, want, atol=1e-5)


def test_verl_details_keep_keys_on_a_failed_sample(colour_samples, tmp_path):
    """verl stacks reward_extra_info by the first sample's keys: a failed sample must carry them too."""
    samples, _ = colour_samples
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a png")
    bad = ("shapes", "red", "x", {"mmreward_media": str(broken)})
    kwargs = {"rewards": {"mock": 1.0, "jpeg-compressibility": 1.0}, "details": True, "failure_value": -3.0}
    scores, extra = _reward_loop(_verl_fn("compute_score", kwargs), [samples[0], bad], "naive")
    assert scores[1] == -3.0 and extra["mock"][1] == -3.0 and extra["jpeg-compressibility"][1] == -3.0


def test_verl_docs_name_the_091_managers_not_batch():
    """Today the module documents reward_manager=batch as current; verl 0.9.1 registers none."""
    doc = verl.__doc__
    assert "reward.reward_manager.name" in doc and all(m in doc for m in VERL_091_MANAGERS)
    assert "no longer registers a `batch` manager" in doc
    assert inspect.iscoroutinefunction(verl.compute_score_async) and not inspect.iscoroutinefunction(verl.compute_score)


def test_verl_rewards_kwargs_errors():
    sample = ("s", "red", "x", {"mmreward_media": "a.png"})
    with pytest.raises(ConfigError, match="name the reward once"):
        verl.compute_score(*sample, reward="mock", rewards={"mock": 1.0})
    with pytest.raises(ConfigError, match="other than 'score'"):
        verl.compute_score(*sample, rewards={"score": 1.0})
    with pytest.raises(ConfigError, match="details must be true or false"):
        verl.compute_score(*sample, reward="mock", details="yes")
    with pytest.raises(ConfigError, match="server must be the URL"):
        verl.compute_score(*sample, server="localhost:8000")


def test_verl_server_kwarg_scores_through_the_reward_server(colour_samples, monkeypatch):
    """`server:` makes every worker a client of one `mmreward serve` (the remote manager runs many
    workers). The server here is a stand-in speaking the /healthz and /score protocol of mmreward.serve."""
    import http.server
    import json
    import threading

    from mmreward.serve import decode_tensor

    mock = mmreward.load("mock")
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, obj):
            body = json.dumps(obj).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            self._send({"status": "ok", "reward": "mock", "modalities": ["image"], "higher_is_better": True,
                        "requires_prompt": True, "max_request_items": 64})

        def do_POST(self):
            seen.append(self.headers.get("Authorization"))
            payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            scores = mock.score(payload["prompts"], decode_tensor(payload["media"], "media")).scores
            self._send({"scores": scores.tolist(), "details": {}})

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("MMREWARD_TOKEN", "t0ken")
    try:
        samples, paths = colour_samples
        url = f"http://127.0.0.1:{server.server_address[1]}"
        scores, _ = _reward_loop(_verl_fn("compute_score", {"server": url}), samples, "remote")
    finally:
        server.shutdown()
    direct = mock.score([s[1] for s in samples], paths).scores
    assert torch.allclose(torch.tensor(scores, dtype=torch.float32), direct, atol=1e-6)
    assert seen and all(h == "Bearer t0ken" for h in seen)


# ------------------------------------------------------------------------------------------------
# EasyR1: AutoRewardManager
# ------------------------------------------------------------------------------------------------
def _easyr1_manager(reward_function_kwargs):
    """hiyouga/EasyR1@b44b311 verl/workers/reward/function.py AutoRewardManager.__init__: the file loaded
    by path as module 'custom_reward_fn', REWARD_TYPE read from it (default "batch"), kwargs bound."""
    import functools
    import sys

    spec = importlib.util.spec_from_file_location("custom_reward_fn", easyr1.__file__)
    module = importlib.util.module_from_spec(spec)
    sys.modules["custom_reward_fn"] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop("custom_reward_fn", None)
    return functools.partial(module.compute_score, **reward_function_kwargs), getattr(module, "REWARD_TYPE", "batch")


def _easyr1_compute_reward(reward_fn, reward_type, responses, ground_truths, extra=None):
    """AutoRewardManager.compute_reward_{batch,sequential} at EasyR1@b44b311: each input is exactly
    {response, response_length, ground_truth}; `extra` adds keys a media-forwarding manager would pass."""
    inputs = [{"response": r, "response_length": len(r), "ground_truth": g, **((extra or [{}] * len(responses))[i])}
              for i, (r, g) in enumerate(zip(responses, ground_truths))]
    scores = reward_fn(inputs) if reward_type == "batch" else [reward_fn(x) for x in inputs]
    metrics = {}
    for score in scores:
        for key, value in score.items():
            metrics.setdefault(key, []).append(value)
    return [s["overall"] for s in scores], metrics


def test_easyr1_reads_media_the_input_carries(red_png):
    """Today only a media reference in ground_truth is read: an input carrying its images
    (multi_modal_data, or an images key) is refused with 'no media reference'."""
    fn, reward_type = _easyr1_manager({"reward": "mock"})
    assert reward_type == "batch"
    red = Image.open(red_png)
    extra = [{"multi_modal_data": {"images": [red_png]}}, {"images": [red]},
             {"multi_modal_data": {"images": [{"bytes": open(red_png, "rb").read(), "path": None}]}}]
    got, metrics = _easyr1_compute_reward(fn, reward_type, ["red", "green", "green"], ["3", "3", "3"], extra)
    assert got == pytest.approx([RED, GREEN, GREEN]) and metrics["mock"] == got


@pytest.mark.parametrize("reward_type", ["batch", "sequential"])
def test_easyr1_as_released_uses_the_ground_truth_fallback(red_png, reward_type):
    fn, _ = _easyr1_manager({"reward": "mock", "scale": 2.0})
    got, _ = _easyr1_compute_reward(fn, reward_type, ["red", "green"], [media_ref(red_png, answer="3")] * 2)
    assert got == pytest.approx([2 * RED, 2 * GREEN])
    with pytest.raises(RewardInputError, match="no media reference and no medium of its own: EasyR1 passes only"):
        _easyr1_compute_reward(fn, reward_type, ["red"], ["3"])
