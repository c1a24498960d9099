"""MLLM RL adapters: trl GRPO reward functions (sync/async), verl compute_score, EasyR1 batch reward."""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import inspect
import json

import pytest
from PIL import Image

import mmreward
from mmreward.errors import RewardInputError
from vlm_rm.adapters import easyr1, media_ref, parse_media_ref, trl_reward_function, verl

# the registry's 'mock' reward: -mean((pixel - colour named in the text)^2); a solid red image scores
# 0 against "red" and -(1 + 1 + 0) / 3 against "green"
RED, GREEN = 0.0, -2 / 3


@pytest.fixture
def red_png(tmp_path):
    path = tmp_path / "red.png"
    Image.new("RGB", (16, 16), (255, 0, 0)).save(path)
    return str(path)


def test_media_reference_forms(red_png):
    ref = media_ref(red_png, answer="red")
    assert parse_media_ref(ref) == [red_png] and json.loads(ref)["answer"] == "red"
    assert parse_media_ref({"mmreward_media": [red_png, "b.png"]}) == [red_png, "b.png"]
    assert parse_media_ref(f"mmreward-media:{red_png}|b.png") == [red_png, "b.png"]
    assert parse_media_ref("plain answer") is None and parse_media_ref({"other": 1}) is None


def test_trl_reward_function_sync_and_async(red_png):
    fn = trl_reward_function(mmreward.load("mock"), scale=2.0, shift=1.0)
    red = Image.open(red_png)
    prompts = [[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "colour?"}]}]] * 3
    completions = [[{"role": "assistant", "content": "red"}], [{"role": "assistant", "content": "green"}],
                   [{"role": "assistant", "content": "red"}]]
    # trl 1.x: keywords only, plus the trainer's own kwargs next to the dataset columns
    out = fn(prompts=prompts, completions=completions, completion_ids=[[1], [2], [3]], image=[red, red, None],
             trainer_state=None, log_extra=lambda *a, **k: None, log_metric=lambda *a, **k: None,
             environments=[{"mmreward_media": red_png}] * 3)
    assert out[0] == pytest.approx(2 * RED + 1) and out[1] == pytest.approx(2 * GREEN + 1) and out[2] is None
    afn = trl_reward_function(mmreward.load("mock"), asynchronous=True, name="colour")
    assert asyncio.iscoroutinefunction(afn) and afn.__name__ == "colour"
    got = asyncio.run(afn(["p", "p"], ["green", "red"], images=[[red_png], [red_png]]))
    assert got == pytest.approx([GREEN, RED])
    # trainers that drop the image column: a media reference in any column still works
    assert fn(["p"], ["green"], solution=[media_ref(red_png)]) == pytest.approx([2 * GREEN + 1])
    with pytest.raises(Exception, match="text: expected one of"):
        trl_reward_function(mmreward.load("mock"), text="answer")


def test_verl_compute_score_per_sample_and_batch(red_png):
    kwargs = {"reward": "mock", "device": "cpu"}
    assert verl.compute_score("shapes", "green", "green", {"mmreward_media": red_png}, **kwargs) == pytest.approx(GREEN)
    assert verl.compute_score("shapes", "red", media_ref(red_png), None, **kwargs) == pytest.approx(RED)
    batch = verl.compute_score_batch(["s", "s"], ["red", "green"], ["x", "y"],
                                     [{"mmreward_media": red_png}] * 2, scale=3.0, **kwargs)
    assert batch == pytest.approx([3 * RED, 3 * GREEN])
    with pytest.raises(RewardInputError, match="no media reference"):
        verl.compute_score("shapes", "red", "red", {}, **kwargs)


def test_easyr1_batch_reward(red_png):
    inputs = [{"response": "green", "response_length": 1, "ground_truth": media_ref(red_png, answer="red")},
              {"response": "red", "response_length": 1, "ground_truth": media_ref(red_png)}]
    out = easyr1.compute_score(inputs, reward="mock", device="cpu")
    assert [o["overall"] for o in out] == pytest.approx([GREEN, RED]) and out[0]["mock"] == out[0]["overall"]
    with pytest.raises(RewardInputError, match="no media reference"):
        easyr1.compute_score([{"response": "r", "ground_truth": "red"}], reward="mock")
    with pytest.raises(RewardInputError, match="reward input dict"):
        easyr1.compute_score("not an input", reward="mock")


def test_trl_grpo_two_steps_on_a_tiny_vlm(tmp_path, red_png):
    trl = pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    from mmreward.testing.qwen_vl import build_tiny_qwen_vl

    model_dir = tmp_path / "tiny-qwen2-vl"
    build_tiny_qwen_vl(model_dir)
    red = Image.open(red_png).convert("RGB").resize((56, 56))
    prompt = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour is it?"}]}]
    data = datasets.Dataset.from_dict({"prompt": [prompt] * 4, "image": [red] * 4})
    reward = mmreward.load("mock")
    calls = []

    def counted(fn):
        def wrapped(*args, **kwargs):
            out = fn(*args, **kwargs)
            calls.append(out)
            return out
        wrapped.__name__ = fn.__name__
        return wrapped

    config = trl.GRPOConfig(
        output_dir=str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=2, num_generations=2,
        max_completion_length=4, learning_rate=1e-4, logging_steps=1, report_to=[], use_cpu=True,
        save_strategy="no", bf16=False, seed=0,
    )
    trainer = trl.GRPOTrainer(
        model=str(model_dir), args=config, train_dataset=data,
        reward_funcs=[counted(trl_reward_function(reward)), trl_reward_function(reward, asynchronous=True, name="mock_async")],
    )
    trainer.train()
    assert trainer.state.global_step == 2
    assert len(calls) == 2 and all(len(c) == 2 and all(v is not None and v <= 0 for v in c) for c in calls)
    logged = [h for h in trainer.state.log_history if "rewards/mock_async/mean" in h]
    assert len(logged) == 2


# --- verl, called exactly as verl's trainer does -------------------------------------------------------------
COLOUR_PNGS = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255), "yellow": (255, 255, 0)}


@pytest.fixture
def colour_samples(tmp_path):
    """Six verl samples (data_source, solution_str, ground_truth, extra_info), references in both fields."""
    paths = {}
    for name, rgb in COLOUR_PNGS.items():
        paths[name] = str(tmp_path / f"{name}.png")
        Image.new("RGB", (8, 8), rgb).save(paths[name])
    texts = ["red", "green", "a blue one", "yellow", "purple", "red"]
    images = ["red", "blue", "blue", "green", "yellow", "yellow"]
    samples = []
    for i, (text, img) in enumerate(zip(texts, images)):
        if i % 2:  # extra_info dict (verl parquet) or a JSON ground_truth
            samples.append(("shapes", text, "answer", {"mmreward_media": paths[img], "index": i}))
        else:
            samples.append(("shapes", text, media_ref(paths[img], answer="x"), {"index": i}))
    return samples, [paths[i] for i in images]


def _verl_custom_reward_fn(name: str, reward_kwargs: dict):
    """verl.trainer.ppo.reward.get_custom_reward_fn: the file loaded by path, reward_kwargs merged in."""
    spec = importlib.util.spec_from_file_location("custom_module", verl.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    raw_fn = getattr(module, name)

    def call(raw, extra, *args, **kwargs):
        return raw(*args, **{**kwargs, **extra})

    async def call_async(raw, extra, *args, **kwargs):
        return await raw(*args, **{**kwargs, **extra})

    wrapper = call_async if inspect.iscoroutinefunction(raw_fn) else call
    return functools.partial(wrapper, raw_fn, reward_kwargs), module


def _expected(samples, image_paths, scale, shift):
    reward = mmreward.load("mock", device="cpu")
    raw = reward.score([s[1] for s in samples], image_paths).scores.tolist()
    return [scale * v + shift for v in raw]


async def _reward_loop_run_single(compute_score, sample):
    """verl.experimental.reward_loop NaiveRewardManager.run_single: keywords only, verl's own kwargs added."""
    data_source, solution_str, ground_truth, extra_info = sample
    kwargs = dict(data_source=data_source, solution_str=solution_str, ground_truth=ground_truth, extra_info=extra_info,
                  reward_router_address="127.0.0.1:30000", reward_model_tokenizer=object())
    if inspect.iscoroutinefunction(compute_score):
        return await compute_score(**kwargs)
    return await asyncio.get_running_loop().run_in_executor(None, lambda: compute_score(**kwargs))


@pytest.mark.parametrize("name", ["compute_score", "compute_score_async"])
def test_verl_reward_loop_call(colour_samples, name):
    samples, paths = colour_samples
    reward_kwargs = {"reward": "mock", "device": "cpu", "scale": 2.0, "shift": 0.5}
    fn, module = _verl_custom_reward_fn(name, reward_kwargs)
    assert inspect.iscoroutinefunction(fn) is (name == "compute_score_async")
    reward = module.reward_from_kwargs(reward_kwargs).reward
    sizes = []
    original = reward.score

    def counting(prompts, media, *args, **kwargs):
        sizes.append(len(prompts))
        return original(prompts, media, *args, **kwargs)

    reward.score = counting

    async def worker():  # RewardLoopWorker.compute_score_batch: one task per sample, gathered
        return await asyncio.gather(*(_reward_loop_run_single(fn, s) for s in samples))

    got = asyncio.run(worker())
    assert all(isinstance(v, float) for v in got)
    assert got == pytest.approx(_expected(samples, paths, 2.0, 0.5), rel=1e-6, abs=1e-6)
    if name == "compute_score_async":
        # concurrent samples share reward calls instead of one forward pass each
        assert sum(sizes) == len(samples) and len(sizes) < len(samples)
    else:
        assert sizes == [1] * len(samples)


def test_verl_async_batch_size_caps_each_reward_call(colour_samples):
    samples, paths = colour_samples
    fn, module = _verl_custom_reward_fn("compute_score_async", {"reward": "mock", "batch_size": 4})
    reward = module.reward_from_kwargs({"reward": "mock", "batch_size": 4}).reward
    sizes, original = [], reward.score
    reward.score = lambda prompts, media, **kw: (sizes.append(len(prompts)), original(prompts, media, **kw))[1]

    async def worker():
        return await asyncio.gather(*(_reward_loop_run_single(fn, s) for s in samples))

    got = asyncio.run(worker())
    assert got == pytest.approx(_expected(samples, paths, 1.0, 0.0), rel=1e-6, abs=1e-6)
    assert sizes == [4, 2]


def test_verl_async_failing_sample_fails_alone(colour_samples, tmp_path):
    samples, paths = colour_samples
    fn, _ = _verl_custom_reward_fn("compute_score_async", {"reward": "mock"})
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a png")
    bad = ("shapes", "red", "answer", {"mmreward_media": str(broken)})
    missing = ("shapes", "red", "answer", {"no": "reference"})

    async def worker():
        return await asyncio.gather(*(_reward_loop_run_single(fn, s) for s in [*samples[:2], bad, missing]),
                                    return_exceptions=True)

    got = asyncio.run(worker())
    assert got[:2] == pytest.approx(_expected(samples[:2], paths[:2], 1.0, 0.0), rel=1e-6, abs=1e-6)
    assert got[2] == 0.0  # an unreadable medium costs only its own sample
    assert isinstance(got[3], RewardInputError) and "no media reference" in str(got[3])


def test_verl_batch_manager_call(colour_samples):
    samples, paths = colour_samples
    fn, _ = _verl_custom_reward_fn("compute_score_batch", {"reward": "mock", "shift": -1.0})
    # verl.workers.reward_manager.batch.BatchRewardManager.verify
    got = fn(data_sources=[s[0] for s in samples], solution_strs=[s[1] for s in samples],
             ground_truths=[s[2] for s in samples], extra_infos=[s[3] for s in samples],
             reward_router_address=None, some_future_verl_kwarg=1)
    assert got == pytest.approx(_expected(samples, paths, 1.0, -1.0), rel=1e-6, abs=1e-6)
    with pytest.raises(RewardInputError, match="one entry per sample"):
        fn(data_sources=["s"], solution_strs=["a", "b"], ground_truths=["x"], extra_infos=[{}])


def test_verl_reward_kwargs_errors_are_typed(colour_samples):
    from mmreward.errors import ConfigError

    sample = colour_samples[0][0]
    with pytest.raises(ConfigError, match="options must be a mapping"):
        verl.compute_score(*sample, reward="mock", options=["x"])
    with pytest.raises(ConfigError, match="batch_size must be >= 1"):
        verl.compute_score_batch([sample[0]], [sample[1]], [sample[2]], [sample[3]], reward="mock", batch_size=0)
    # loader options reach the loader (the mock loader passes them to Reward: an unknown one is its TypeError)
    with pytest.raises(TypeError):
        verl.compute_score(*sample, reward="mock", options={"no_such_option": 1})


def test_easyr1_sequential_and_batch_calls(colour_samples):
    samples, paths = colour_samples
    inputs = [{"response": s[1], "response_length": len(s[1]), "ground_truth": media_ref(p)}
              for s, p in zip(samples, paths)]
    kwargs = {"reward": "mock", "scale": 3.0, "unknown_future_kwarg": True}
    # verl/workers/reward/function.py: partial(reward_fn, **reward_function_kwargs)
    batch = functools.partial(easyr1.compute_score, **kwargs)(inputs)
    sequential = [functools.partial(easyr1.compute_score, **kwargs)(item) for item in inputs]
    want = _expected(samples, paths, 3.0, 0.0)
    assert [b["overall"] for b in batch] == pytest.approx(want, rel=1e-6, abs=1e-6)
    assert [s["overall"] for s in sequential] == pytest.approx(want, rel=1e-6, abs=1e-6)
