"""Issue 30 item 5: the trl, verl and EasyR1 adapter defects a user hits at integration time.

Each test drives our adapter through the trainer's own calling code: trl's installed
`GRPOTrainer._calculate_rewards` (trl 1.16.0) itself, and for verl 0.9.1 and EasyR1 (not installed here)
their reward managers' calls transcribed from the release sources named in each docstring.
"""

from __future__ import annotations

import asyncio
import types

import pytest
import torch
from PIL import Image

import mmreward
from mmreward.errors import ConfigError
from vlm_rm.adapters import trl_reward_function

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
