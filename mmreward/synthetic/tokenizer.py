"""A small-vocabulary CLIP BPE tokenizer for ShapesWorld, in the official Hugging Face CLIP file format.

The full CLIP vocabulary has 49,408 entries, so a text tower for it carries a 49,408-row embedding
(megabytes even at width 64). ShapesWorld needs a few dozen words, so we keep CLIP's exact byte-level
BPE but only the merges those words use: the 512 byte tokens, the used merges in their original rank
order, then <|startoftext|> and <|endoftext|>. BPE applies the lowest-ranked applicable merge at each
step; a subset that contains every merge of a word's full-vocabulary tokenisation therefore yields the
same tokens for that word, and any other word still tokenises (into smaller pieces, down to bytes).
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

from mmreward.synthetic.captions import PLURALS
from mmreward.synthetic.prompts import COLORS, NUMBERS, SHAPES
from mmreward.tokenizers import bytes_to_unicode, open_clip_bpe_path

# Everyday words beyond ShapesWorld's own, so that typical prompts tokenise into whole words.
EXTRA_WORDS = (
    "a an the of and to on in with photo image picture rendering drawing left right above below over under "
    "beneath next near top bottom side plus sign x one two three four five six 1 2 3 4 5 6 shape shapes object "
    "objects colored coloured black gray grey orange pink brown background dark light big small large tiny "
    "cat dog car tree house person man woman bird flower apple"
).split()


def shapes_words() -> list[str]:
    words = set(SHAPES) | set(PLURALS.values()) | set(COLORS) | set(NUMBERS.values()) | set(EXTRA_WORDS)
    return sorted(words)


def _bpe(word: str, ranks: dict[tuple[str, str], int]) -> list[tuple[str, str]]:
    """The merges CLIP's BPE applies to one pre-tokenised word, in order."""
    symbols = list(word[:-1]) + [word[-1] + "</w>"]
    used = []
    while len(symbols) > 1:
        pairs = [(ranks.get((a, b), 1 << 30), i) for i, (a, b) in enumerate(zip(symbols, symbols[1:]))]
        rank, i = min(pairs)
        if rank == 1 << 30:
            break
        pair = (symbols[i], symbols[i + 1])
        used.append(pair)
        merged, j = [], 0
        while j < len(symbols):  # merge every occurrence, left to right, as CLIP does
            if j < len(symbols) - 1 and (symbols[j], symbols[j + 1]) == pair:
                merged.append(symbols[j] + symbols[j + 1])
                j += 2
            else:
                merged.append(symbols[j])
                j += 1
        symbols = merged
    return used


def write_shapes_tokenizer_files(out_dir: str | os.PathLike, words: list[str] | None = None) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lines = gzip.open(open_clip_bpe_path()).read().decode("utf-8").split("\n")
    all_merges = [tuple(line.split()) for line in lines[1 : 49152 - 256 - 2 + 1]]
    ranks = {m: i for i, m in enumerate(all_merges)}
    byte_map = bytes_to_unicode()
    needed: set[tuple[str, str]] = set()
    for w in words or shapes_words():
        needed.update(_bpe("".join(byte_map[b] for b in w.encode("utf-8")), ranks))
    merges = [m for m in all_merges if m in needed]
    chars = list(byte_map.values())
    vocab = chars + [c + "</w>" for c in chars] + ["".join(m) for m in merges] + ["<|startoftext|>", "<|endoftext|>"]
    (out / "vocab.json").write_text(json.dumps({tok: i for i, tok in enumerate(vocab)}, ensure_ascii=False))
    (out / "merges.txt").write_text("#version: 0.2\n" + "\n".join(" ".join(m) for m in merges) + "\n")
    return out


def build_shapes_tokenizer(out_dir: str | os.PathLike, max_length: int = 77):
    """A transformers CLIPTokenizer(Fast) with ShapesWorld's small vocabulary, saved in `out_dir`."""
    from transformers import CLIPTokenizer, CLIPTokenizerFast

    out = write_shapes_tokenizer_files(out_dir)
    CLIPTokenizer(
        vocab_file=str(out / "vocab.json"),
        merges_file=str(out / "merges.txt"),
        model_max_length=max_length,
        pad_token="<|endoftext|>",
    )
    tok = CLIPTokenizerFast.from_pretrained(str(out))
    tok.model_max_length = max_length
    tok.save_pretrained(str(out))
    return tok
