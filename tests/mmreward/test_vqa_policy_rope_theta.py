"""train_vqa_policy's --rope-theta option (issue 30): the text model's RoPE base, default unchanged."""

from __future__ import annotations

import torch

from mmreward.synthetic.build.train_vqa_policy import VQAPolicyTrainConfig, policy_config


class _Tok:  # what policy_config reads from a tokenizer: its size and the special tokens' ids
    SPECIAL = ["<|endoftext|>", "<|im_end|>", "<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"]

    def __len__(self) -> int:
        return 100

    def convert_tokens_to_ids(self, token: str) -> int:
        return 90 + self.SPECIAL.index(token)


def _inv_freq(theta: float, head_dim: int = 24) -> torch.Tensor:
    # RoPE's frequencies written out: theta ** (-2i / head_dim), i = 0 .. head_dim/2 - 1
    return torch.tensor([theta ** (-2 * i / head_dim) for i in range(head_dim // 2)])


def test_rope_theta_sets_the_text_models_frequencies_and_default_keeps_qwen2vl():
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding

    assert VQAPolicyTrainConfig().rope_theta == 0.0  # the shipped recipe is unchanged
    for theta, expected in ((0.0, 1e6), (10.0, 10.0)):
        text = policy_config(_Tok(), rope_theta=theta).text_config
        assert text.rope_parameters["mrope_section"] == [4, 4, 4]  # sums to head_dim / 2 = 12
        got = Qwen2VLRotaryEmbedding(text).inv_freq.float()
        torch.testing.assert_close(got, _inv_freq(expected).float(), rtol=1e-5, atol=0)
