"""The offline CLIP and BERT tokenizers, re-exported for tests from their product home, `mmreward.tokenizers`."""

from mmreward.tokenizers import (
    CLIP_VOCAB_SIZE,
    build_bert_tokenizer,
    build_clip_tokenizer,
    bytes_to_unicode,
    open_clip_bpe_path,
    write_clip_tokenizer_files,
)

__all__ = [
    "CLIP_VOCAB_SIZE",
    "bytes_to_unicode",
    "build_bert_tokenizer",
    "build_clip_tokenizer",
    "open_clip_bpe_path",
    "write_clip_tokenizer_files",
]
