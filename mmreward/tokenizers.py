"""Tokenizers that random-weight models need offline, written in the official Hugging Face file formats.

- CLIP: the real BPE tokenizer, built from the vocabulary file that open_clip ships, so a random CLIP
  tokenises exactly like a pretrained one and any CLIP checkpoint's weights fit it.
- BERT: a small lower-casing WordPiece vocabulary in bert-base-uncased's format, for the text towers of
  random ImageReward and Grounding DINO models (the real vocabulary is not shipped by any package).

open_clip's `bpe_simple_vocab_16e6.txt.gz` holds the merges of OpenAI's CLIP tokenizer. The Hugging
Face CLIPTokenizer's vocab.json is: the 256 byte-level unicode characters, the same with '</w>', one
entry per merge (the merged pair), then <|startoftext|> and <|endoftext|> — 49408 tokens in all.
"""

from __future__ import annotations

import gzip
import json
import os
from functools import lru_cache
from pathlib import Path

CLIP_VOCAB_SIZE = 49408
_NUM_MERGES = CLIP_VOCAB_SIZE - 256 - 256 - 2  # 48894


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode map, as used by CLIP."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def open_clip_bpe_path() -> Path:
    import open_clip

    path = Path(open_clip.__file__).parent / "bpe_simple_vocab_16e6.txt.gz"
    if not path.exists():
        raise FileNotFoundError(f"open_clip's BPE vocabulary is missing at {path}")
    return path


def write_clip_tokenizer_files(out_dir: str | os.PathLike, num_merges: int = _NUM_MERGES) -> Path:
    """Write vocab.json and merges.txt of the CLIP tokenizer (optionally truncated to fewer merges)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lines = gzip.open(open_clip_bpe_path()).read().decode("utf-8").split("\n")
    merges = [tuple(line.split()) for line in lines[1 : 1 + num_merges]]
    chars = list(bytes_to_unicode().values())
    vocab = chars + [c + "</w>" for c in chars] + ["".join(m) for m in merges] + ["<|startoftext|>", "<|endoftext|>"]
    (out / "vocab.json").write_text(json.dumps({tok: i for i, tok in enumerate(vocab)}, ensure_ascii=False))
    (out / "merges.txt").write_text("#version: 0.2\n" + "\n".join(" ".join(m) for m in merges) + "\n")
    return out


def build_clip_tokenizer(out_dir: str | os.PathLike, max_length: int = 77, fast: bool = True):
    """A transformers CLIP tokenizer saved in `out_dir` (tokenizer files in the official layout)."""
    from transformers import CLIPTokenizer, CLIPTokenizerFast

    out = write_clip_tokenizer_files(out_dir)
    slow = CLIPTokenizer(
        vocab_file=str(out / "vocab.json"),
        merges_file=str(out / "merges.txt"),
        model_max_length=max_length,
        pad_token="<|endoftext|>",
    )
    tok = CLIPTokenizerFast.from_pretrained(str(out)) if fast else slow
    tok.model_max_length = max_length
    tok.save_pretrained(str(out))
    return tok


# a few dozen everyday words plus single characters, so any prompt tokenises (into pieces if need be)
_BERT_WORDS = (
    "a an the of and on in with to is are photo picture image painting red green blue yellow purple orange "
    "white black cat dog circle square triangle star one two three four big small above below left right"
).split()


def build_bert_tokenizer(path: str | os.PathLike):
    """A BertTokenizerFast (lower-casing WordPiece) with a small vocab.txt in bert-base-uncased's format."""
    from transformers import BertTokenizerFast

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    chars = list("abcdefghijklmnopqrstuvwxyz0123456789.,!?'-")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *_BERT_WORDS, *chars, *("##" + c for c in chars)]
    (out / "vocab.txt").write_text("\n".join(dict.fromkeys(vocab)) + "\n")
    tok = BertTokenizerFast.from_pretrained(str(out), do_lower_case=True)
    tok.save_pretrained(str(out))
    return tok
