"""The tiny random Qwen2-VL / Qwen2.5-VL builders, re-exported for tests from `mmreward.backbones.tiny_qwen_vl`."""

from mmreward.backbones.tiny_qwen_vl import (
    QWEN2_VL_CHAT_TEMPLATE,
    QWEN_SPECIAL_TOKENS,
    build_qwen_tokenizer,
    build_tiny_qwen_vl,
    tiny_qwen_vl_config,
)

__all__ = [
    "QWEN2_VL_CHAT_TEMPLATE",
    "QWEN_SPECIAL_TOKENS",
    "build_qwen_tokenizer",
    "build_tiny_qwen_vl",
    "tiny_qwen_vl_config",
]
