"""The ShapesWorld VQA world through verl 0.9.1's own reward loop (issue 30 item 3, the verl side).

Everything between the parquet file and the token-level reward tensor is verl's installed code
(`pip install verl==0.9.1 --no-deps` plus omegaconf, tensordict, codetiming; scripts/setup_env.sh dev):
`RLHFDataset` reads the rows our `to_verl_rows` writes, verl's `collate_fn` and `DataProto.from_single_dict`
make the batch, `DataProto.repeat(interleave=True)` and `union` shape it as the trainer's fit step does,
`RewardLoopWorker` (built from the config, loading our adapter file by path with `load_reward_manager`) runs
the registered `naive` / `dapo` / `gdpo` manager's `run_single` per sample, and `RewardLoopManager.compute_rm_score`
pads, chunks and assembles the `rm_scores` tensor. Only the rollout is ours: the responses are fixed token
sequences laid out as verl's agent loop `_postprocess` lays them out (left-padded prompts, right-padded
responses, attention mask over both). The ray actor boundary is replaced by direct calls on the worker's own
event loop (`ray.get` on already computed results), which is the only thing not verl's code here.

The expected rewards come from scoring the decoded responses with `shapes-vqa` directly; the expected tensor
is built here from verl's documented layout (the score at each response's last valid token, zeros elsewhere).
"""

from __future__ import annotations

import asyncio
import types

import numpy as np
import pytest
import torch

import mmreward
from mmreward.synthetic import vqa

pytest.importorskip("verl", reason="verl==0.9.1 (pip install verl==0.9.1 --no-deps; see scripts/setup_env.sh)")
pytest.importorskip("tensordict")
pytest.importorskip("omegaconf")

VERL_VERSION = "0.9.1"
ROLLOUT_N = 2  # responses per prompt: the first right, the second wrong (or unparseable)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """A Qwen2-VL policy's config, tokenizer and processor (the tiny checkpoints' own), as
    actor_rollout_ref.model.path names one; the reward side never loads the policy's weights."""
    from transformers.models.qwen2_vl import Qwen2VLImageProcessor, Qwen2VLProcessor
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    from mmreward.backbones.tiny_qwen_vl import (
        QWEN2_VL_CHAT_TEMPLATE,
        build_qwen_tokenizer,
        tiny_qwen_vl_config,
    )

    out = tmp_path_factory.mktemp("policy")
    tok = build_qwen_tokenizer(out)
    tiny_qwen_vl_config(tok).save_pretrained(str(out))  # verl's hf_processor reads the model config too
    size = {"shortest_edge": 28 * 28, "longest_edge": 56 * 56}
    Qwen2VLProcessor(image_processor=Qwen2VLImageProcessor(size=size), tokenizer=tok,
                     video_processor=Qwen2VLVideoProcessor(size=size),
                     chat_template=QWEN2_VL_CHAT_TEMPLATE).save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def parquet(tmp_path_factory):
    """Nine questions, every kind (count, colour, shape, position, which-image, caption), as verl parquet."""
    import datasets

    folder = tmp_path_factory.mktemp("shapes_vqa_verl")
    items = vqa.make_questions(9, seed=3, split="train")
    rows = vqa.to_verl_rows(items, folder / "images", size=64)
    path = folder / "train.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    return path, items


def _config(tokenizer_dir, manager: str, entry: str):
    from omegaconf import OmegaConf

    from vlm_rm.adapters import verl as adapter

    return OmegaConf.create({
        "actor_rollout_ref": {"model": {"path": str(tokenizer_dir), "tokenizer_path": None},
                              "rollout": {"n": ROLLOUT_N}},
        "reward": {
            "num_workers": 2,
            "reward_manager": {"source": "register", "name": manager},
            "custom_reward_function": {"path": adapter.__file__, "name": entry,
                                       "reward_kwargs": {"reward": "shapes-vqa", "details": True}},
            "reward_model": {"enable": False, "enable_resource_pool": False},
            "reward_kwargs": {"overlong_buffer_cfg": None, "max_resp_len": None},
        },
        "trainer": {"experiment_name": "shapes-vqa-verl"},  # the gdpo manager reads it
    })


def _responses(items):
    """Per prompt, ROLLOUT_N responses: the right answer in tags, then a wrong or unreadable one."""
    out = []
    for item in items:
        right = f"<answer>{item.answer}</answer>"
        if item.kind == "caption":
            wrong = "<answer>a purple hexagon</answer>"
        elif item.kind == "count":
            wrong = f"There are {int(item.answer) + 1} of them."
        else:
            wrong = "I cannot tell."
        out.append([right, wrong])
    return out


def _rollout(tokenizer, prompts: torch.Tensor, prompt_mask: torch.Tensor, texts: list[str]):
    """The generation output as verl's agent loop `_postprocess` lays it out: prompts left-padded (from the
    dataset's prompt ids), responses right-padded with the pad id, attention mask over both, ids concatenated."""
    from tensordict import TensorDict
    from verl import DataProto

    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for t in texts]
    width = max(len(i) for i in ids) + 3  # trailing padding, as a batch of responses always has
    responses = torch.full((len(ids), width), tokenizer.pad_token_id, dtype=torch.long)
    response_mask = torch.zeros((len(ids), width), dtype=torch.long)
    for row, seq in enumerate(ids):
        responses[row, : len(seq)] = torch.tensor(seq)
        response_mask[row, : len(seq)] = 1
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    input_ids = torch.cat([prompts, responses], dim=1)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    batch = TensorDict({"prompts": prompts, "responses": responses, "response_mask": response_mask,
                        "input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids},
                       batch_size=len(ids))
    return DataProto(batch=batch, non_tensor_batch={"__num_turns__": np.full(len(ids), 2, dtype=np.int32)}), ids


def _left_padded_prompts(tokenizer, raw_prompts) -> tuple[torch.Tensor, torch.Tensor]:
    texts = [tokenizer.apply_chat_template(list(p), add_generation_prompt=True, tokenize=False) for p in raw_prompts]
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(len(i) for i in ids)
    out = torch.full((len(ids), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for row, seq in enumerate(ids):
        out[row, width - len(seq):] = torch.tensor(seq)
        mask[row, width - len(seq):] = 1
    return out, mask


def _verl_reward_step(config, tokenizer_dir, parquet_path, responses, monkeypatch):
    """verl's trainer step up to `extract_reward`, with verl's classes (see the module docstring)."""
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.experimental.reward_loop import reward_loop as rl
    from verl.trainer.ppo.reward import extract_reward
    from verl.utils import hf_processor, hf_tokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    tokenizer = hf_tokenizer(str(tokenizer_dir))
    data_cfg = OmegaConf.create({"max_prompt_length": 512, "filter_overlong_prompts": False,
                                 "cache_dir": str(parquet_path.parent / "cache")})
    dataset = RLHFDataset(data_files=[str(parquet_path)], tokenizer=tokenizer, config=data_cfg,
                           processor=hf_processor(str(tokenizer_dir)))
    batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(len(dataset))]))
    batch.non_tensor_batch["uid"] = np.array([f"uid-{i}" for i in range(len(batch))], dtype=object)
    prompts, prompt_mask = _left_padded_prompts(tokenizer, batch.non_tensor_batch["raw_prompt"])
    gen_output, response_ids = _rollout(tokenizer, prompts.repeat_interleave(ROLLOUT_N, 0),
                                        prompt_mask.repeat_interleave(ROLLOUT_N, 0),
                                        [t for per in responses for t in per])
    batch = batch.repeat(repeat_times=ROLLOUT_N, interleave=True).union(gen_output)

    # RewardLoopManager.compute_rm_score with its ray actors replaced by workers called on their own loop
    # built inside a coroutine, the workers' get_event_loop() is this loop, as in a ray actor's own event loop;
    # the thread's current loop is never set, so later tests see the asyncio state they started with
    loop = asyncio.new_event_loop()

    async def build():
        return [rl.RewardLoopWorker(config) for _ in range(config.reward.num_workers)]

    try:
        workers = loop.run_until_complete(build())

        def handle(worker):
            run = lambda chunk: loop.run_until_complete(worker.compute_score_batch(chunk))  # noqa: E731
            return types.SimpleNamespace(compute_score_batch=types.SimpleNamespace(remote=run))

        manager = types.SimpleNamespace(reward_loop_workers=[handle(w) for w in workers], reward_model_manager=None,
                                        reward_manager_cls=rl.resolve_reward_manager_cls(config))
        monkeypatch.setattr(rl, "ray", types.SimpleNamespace(get=lambda values: values))
        batch_reward = rl.RewardLoopManager.compute_rm_score(manager, batch)
    finally:
        loop.close()
    batch = batch.union(batch_reward)
    reward_tensor, extra = extract_reward(batch)
    return reward_tensor, extra, batch, response_ids, tokenizer


@pytest.mark.parametrize("manager,entry", [("naive", "compute_score"), ("naive", "compute_score_async"),
                                           ("dapo", "compute_score"), ("gdpo", "compute_score_async")])
def test_verl_reward_loop_scores_the_world_as_shapes_vqa_does(tokenizer_dir, parquet, manager, entry, monkeypatch):
    import verl
    from PIL import Image

    assert verl.__version__ == VERL_VERSION
    path, items = parquet
    responses = _responses(items)
    config = _config(tokenizer_dir, manager, entry)
    reward_tensor, extra, batch, response_ids, tokenizer = _verl_reward_step(config, tokenizer_dir, path, responses,
                                                                             monkeypatch)

    # direct scoring: the same decoded responses, the written images, the questions and reference answers
    rows = vqa.to_verl_rows(items, path.parent / "images")  # rewrites the same files: the paths to read
    decoded = [tokenizer.decode(ids, skip_special_tokens=True) for ids in response_ids]
    assert decoded == [t for per in responses for t in per]  # the tiny tokenizer round-trips the texts
    direct = mmreward.load("shapes-vqa").score_responses(
        [it.question for it in items for _ in range(ROLLOUT_N)],
        [Image.open(r["extra_info"]["mmreward_media"][0]) for r in rows for _ in range(ROLLOUT_N)],
        decoded, [it.answer for it in items for _ in range(ROLLOUT_N)]).scores

    # verl's layout: a (B, response_length) tensor holding the score at each response's last valid token
    expected = torch.zeros(len(decoded), batch.batch["responses"].shape[1])
    last = torch.tensor([len(ids) - 1 for ids in response_ids])
    expected[torch.arange(len(decoded)), last] = direct
    assert reward_tensor.shape == expected.shape
    torch.testing.assert_close(reward_tensor, expected, rtol=0, atol=0)
    assert direct.tolist() == [1.0, 0.0] * len(items)  # the check has teeth: right answers 1, wrong 0
    # details: true puts shapes-vqa's components in reward_extra_info, stacked per sample by verl
    np.testing.assert_array_equal(np.asarray(extra["score"], dtype=float), direct.numpy())
    assert set(extra) >= {"score", "correct", "format_ok", "parsed", "kind"}
    np.testing.assert_array_equal(np.asarray(extra["kind"], dtype=float),
                                  [float(vqa.KINDS.index(it.kind)) for it in items for _ in range(ROLLOUT_N)])


def test_verl_gdpo_advantages_read_the_shapes_vqa_components(tokenizer_dir, parquet, monkeypatch):
    """verl's own GDPO estimator (core_algos.compute_gdpo_outcome_advantage, algorithm.gdpo_reward_keys) on the
    components our adapter stores: each group is (right answer in tags, wrong or untagged answer), so every right
    answer gets a positive advantage and every wrong one a negative one; where both answers used the tags (the
    caption group) only `correct` separates them, so that gap is smaller than where `format_ok` differs too."""
    from verl.trainer.ppo.core_algos import compute_gdpo_outcome_advantage

    path, items = parquet
    config = _config(tokenizer_dir, "gdpo", "compute_score_async")
    reward_tensor, extra, batch, _, _ = _verl_reward_step(config, tokenizer_dir, path, _responses(items), monkeypatch)
    adv, _ = compute_gdpo_outcome_advantage(
        token_level_rewards=reward_tensor, response_mask=batch.batch["response_mask"],
        index=batch.non_tensor_batch["uid"], config={"gdpo_reward_keys": ["correct", "format_ok"]},
        non_tensor_batch=batch.non_tensor_batch, batch=batch.batch)
    per_sample = adv[:, 0].reshape(len(items), ROLLOUT_N)  # outcome advantages: the same on every response token
    assert bool((per_sample[:, 0] > 0).all()) and bool((per_sample[:, 1] < 0).all())
    gap = per_sample[:, 0] - per_sample[:, 1]
    both_tagged = torch.tensor([it.kind == "caption" for it in items])
    assert both_tagged.any() and (~both_tagged).any()
    assert float(gap[both_tagged].max()) < float(gap[~both_tagged].min())
