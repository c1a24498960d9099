"""visual-prm's tokenizer.json gives the ids of InternVL's slow sentencepiece InternLM2Tokenizer on VisualPRM's prompts.

InternVL trains and runs VisualPRM with the slow `InternLM2Tokenizer` (`use_fast=False`); visual-prm reads the
folder's fast tokenizer.json instead (mmreward/models/visual_prm.py `_chat_tokenizer`). Without the real 8B vocabulary,
a tiny sentencepiece BPE model is trained here on VisualPRM-like text, with InternLM2's layout: <unk> <s> </s> at
0, 1, 2, byte fallback, the last six pieces "[UNUSED_TOKEN_141..146]" that InternLM2's tokenizer_config.json
overrides with <|plugin|> ... <|im_start|> (added tokens at those ids), and InternVL's nine added tokens after the
vocabulary (<img>, </img>, <IMG_CONTEXT>, <quad>, ... as internvl_chat_finetune.py adds them). Two tokenizers of it:
- the reference, the SLOW path transcribed on the sentencepiece package: InternLM2Tokenizer
  (OpenGVLab/InternVL@2410d1dbf208f0e799459aff9376e5747dbf41a2 internvl_chat/internvl/model/internlm2/
  tokenization_internlm2.py: `_tokenize` = sp.encode(text, out_type=str), `_convert_token_to_id` = piece_to_id,
  `build_inputs_with_special_tokens` = [sp.bos_id()] + ids) inside transformers 4.37.2's PreTrainedTokenizer, the
  version InternVL pins (internvl_chat/pyproject.toml there; tokenization_utils.py of the 4.37.2 wheel:
  `tokenize` splits the text on the added tokens with `Trie.split`, applies their lstrip/rstrip/single_word, runs
  `_tokenize` on each stretch between them; `_add_tokens` gives new tokens the ids len(get_vocab()), ...);
- the PRODUCT path: the tokenizer.json a user saves from the hub's fast class (tokenization_internlm2_fast.py at the
  same InternVL commit: `InternLM2Converter`, which differs from transformers' LlamaConverter in its vocabulary
  override by the added tokens, its normaliser (Prepend("▁") only if the model adds a dummy prefix) and in adding
  every added token; `SentencePieceExtractor.extract(vocab_scores)` of transformers 4.37.2 for the merges;
  `InternLM2TokenizerFast.update_post_processor` for the BOS template), written with the tokenizers library and
  loaded by visual-prm's own `_chat_tokenizer`.
On the exact texts visual-prm tokenizes (`render_query`: system prompt, multi-step responses, unicode, digits, leading
and repeated spaces, newlines, the image tokens), through the reward's own batched, padded call, the ids are equal,
with and without the model's dummy prefix. A model that strips and collapses spaces (remove_extra_whitespaces, which
the converter drops) gives other ids through tokenizer.json alone (shown); the loader adds that step from the folder's
tokenizer.model, and the ids are equal again. Where the model maps characters (NFKC), or tokenizer.json's normaliser
or pre-tokenizer is not the converter's for this model, the ids differ (shown) and the loader refuses the folder.
Not covered: the real InternLM2 vocabulary (92,544 pieces) and its normaliser settings, which are not here; the
loader checks the latter on the user's folder when it ships tokenizer.model.
"""

from __future__ import annotations

import io
import json
import re

import pytest

spm = pytest.importorskip("sentencepiece", reason="sentencepiece is not installed (pip install -e '.[dev]')")
pytest.importorskip("transformers")

from sentencepiece import sentencepiece_model_pb2 as spm_pb2  # noqa: E402 - after the skip

from mmreward.backbones.sentencepiece_spec import parse_normalizer_spec, read_normalizer_spec  # noqa: E402
from mmreward.errors import CheckpointError  # noqa: E402
from mmreward.models import visual_prm as vp  # noqa: E402

CHAT_TOKENS = ["<|plugin|>", "<|interpreter|>", "<|action_end|>", "<|action_start|>", "<|im_end|>", "<|im_start|>"]
UNUSED = [f"[UNUSED_TOKEN_{k}]" for k in range(141, 147)]  # the sentencepiece pieces those ids hold in InternLM2
INTERNVL_TOKENS = ["<img>", "</img>", "<IMG_CONTEXT>", "<quad>", "</quad>", "<ref>", "</ref>", "<box>", "</box>"]
SPECIAL = {"unk": "<unk>", "bos": "<s>", "eos": "</s>", "pad": "</s>"}

QUESTIONS = ["How many circles are there?", "  What is 3+4-2? (leading spaces)", "Ünïcödé: is ∑ x² ≈ 中文 🙂?",
             "", "Find x if 2x - 5 = 11.\nGive the   answer.", " "]
RESPONSES = [
    "I count the round shapes.\n\nThere are two.\n\nSo the answer is 2.",
    "Step 1: 3 + 4 = 7.\n\nStep 2: 7 - 2 = 5.\n\n  indented step\n\n\n- bullet\n+ plus\n\nfinal: 12,345",
    "x = 7 − 2\n\n∴ answer: 5 🙂 ﬁne",
    "+",
    "2x = 16\n\nx = 8 .  \n\n### Solution Process:\nThe answer is 8",
    "   \n\n  spaced   out  step  \n\n\n\n\t tab\n\n ",
]
CORPUS = [line for line in vp.PRM_SYSTEM_PROMPT.split("\n") if line] + [
    "### Question:", "### Solution Process:", "Step 1: the area is 3 + 4 = 7.", "x - 2 = 5, so x = 7",
    "The triangle has sides 3, 4 and 5; 3^2 + 4^2 = 25.", "So the answer is 42.", "How many circles are there?",
    "The angle is 90°, and π ≈ 3.14.", "Therefore √16 = 4 − 0 = 4.", "system user assistant", "  two  spaces  ",
] * 3


def train_model(**options) -> bytes:
    """A tiny sentencepiece BPE model (serialized ModelProto) with InternLM2's special-token layout."""
    buf = io.BytesIO()
    opts = dict(model_type="bpe", vocab_size=1000, character_coverage=1.0, byte_fallback=True, unk_id=0, bos_id=1,
                eos_id=2, pad_id=-1, user_defined_symbols=UNUSED, add_dummy_prefix=True,
                remove_extra_whitespaces=False, normalization_rule_name="identity", minloglevel=2)
    opts.update(options)
    spm.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS), model_writer=buf, **opts)
    proto = spm_pb2.ModelProto()
    proto.ParseFromString(buf.getvalue())
    pieces = list(proto.pieces)
    del proto.pieces[:]
    for p in [p for p in pieces if p.piece not in UNUSED] + [p for p in pieces if p.piece in UNUSED]:
        proto.pieces.add().CopyFrom(p)  # the "[UNUSED_TOKEN_*]" pieces last, as in InternLM2's 92,544
    return proto.SerializeToString()


def _added(content: str) -> dict:
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
            "special": True}


def base_added_tokens(model: bytes) -> dict[int, dict]:
    """InternLM2's tokenizer_config.json `added_tokens_decoder`: <unk> <s> </s>, the chat tokens on the last six."""
    n = spm.SentencePieceProcessor(model_proto=model).get_piece_size()
    out = {0: _added("<unk>"), 1: _added("<s>"), 2: _added("</s>")}
    out.update({n - 6 + i: _added(t) for i, t in enumerate(CHAT_TOKENS)})
    return out


class SlowInternLM2:
    """InternLM2Tokenizer's encode path (see the module docstring), on the sentencepiece package only.

    Built as InternVL builds it: the tokenizer_config's added tokens, then `add_tokens(token_list,
    special_tokens=True)` (internvl_chat_finetune.py), which in 4.37.2 makes each an AddedToken(lstrip=False,
    rstrip=False, normalized=False, special=True) with the next id after len(get_vocab())."""

    def __init__(self, model: bytes, added: dict[int, dict], new_tokens: list[str]):
        self.sp = spm.SentencePieceProcessor(model_proto=model)
        self.decoder = dict(added)  # _added_tokens_decoder
        vocab = {self.decoder[i]["content"] if i in self.decoder else self.sp.id_to_piece(i): i
                 for i in range(self.sp.get_piece_size())}  # get_vocab(): convert_ids_to_tokens(i) for i < vocab_size
        vocab.update({t["content"]: i for i, t in self.decoder.items()})
        for token in new_tokens:  # _add_tokens: a new content gets new_idx + added so far, i.e. len(vocab)
            if token in {t["content"] for t in self.decoder.values()}:
                continue
            index = vocab.setdefault(token, len(vocab))
            self.decoder[index] = _added(token)
        self.encoder = {t["content"]: i for i, t in self.decoder.items()}
        contents = sorted(self.encoder, key=len, reverse=True)
        # Trie.split finds the leftmost, then longest, added token; with no added token inside another (asserted in
        # the test) that is this alternation, longest first
        self.splitter = re.compile("(" + "|".join(re.escape(c) for c in contents) + ")")

    def tokenize(self, text: str) -> list[str]:
        tokens = self.splitter.split(text)
        for i, token in enumerate(tokens):
            if token in self.encoder:
                flags = self.decoder[self.encoder[token]]
                left = tokens[i - 1] if i > 0 else None
                right = tokens[i + 1] if i < len(tokens) - 1 else None
                if flags["rstrip"] and right:
                    tokens[i + 1] = right.lstrip()
                if flags["lstrip"] and left:
                    tokens[i - 1] = left.rstrip()
                if flags["single_word"] and left and left[-1] != " ":
                    tokens[i - 1] += token
                    tokens[i] = ""
                elif flags["single_word"] and right and right[0] != " ":
                    tokens[i + 1] = token + tokens[i + 1]
                    tokens[i] = ""
        out: list[str] = []
        for token in tokens:
            if not token:
                continue
            out += [token] if token in self.encoder else self.sp.encode(token, out_type=str)
        return out

    def encode(self, text: str) -> list[int]:
        ids = [self.encoder[t] if t in self.encoder else self.sp.piece_to_id(t) for t in self.tokenize(text)]
        return [self.sp.bos_id()] + ids  # add_bos_token=True, add_eos_token=False (InternVL passes it)


def internlm2_tokenizer_json(model: bytes, added: dict[int, dict]) -> str:
    """tokenizer.json as InternLM2TokenizerFast builds and saves it (the converter transcribed; module docstring)."""
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, processors
    from tokenizers.models import BPE

    proto = spm_pb2.ModelProto()
    proto.ParseFromString(model)
    added_tokens = {i: AddedToken(t["content"], lstrip=t["lstrip"], rstrip=t["rstrip"], single_word=t["single_word"],
                                  normalized=t["normalized"], special=t["special"]) for i, t in sorted(added.items())}
    # InternLM2Converter.vocab, then the override of the vocabulary by the added tokens at the same ids
    vocab_scores = [("<unk>", 0.0), ("<s>", 0.0), ("</s>", 0.0)] + [(p.piece, p.score) for p in proto.pieces[3:]]
    for i in range(len(vocab_scores)):
        if i in added_tokens:
            vocab_scores[i] = (added_tokens[i].content, vocab_scores[i][1])
    # SentencePieceExtractor(vocab_file).extract(vocab_scores), transformers 4.37.2
    sp = spm.SentencePieceProcessor(model_proto=model)
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    merges = []
    for merge, piece_score in dict(vocab_scores).items():
        local = [(merge[:k], merge[k:], piece_score) for k in range(1, len(merge))
                 if merge[:k] in vocab and merge[k:] in vocab]
        merges += sorted(local, key=lambda x: (vocab[x[0]], vocab[x[1]]))
    merges = [(left, right) for left, right, _ in sorted(merges, key=lambda v: v[2], reverse=True)]
    bpe_vocab = {word: i for i, (word, _score) in enumerate(vocab_scores)}
    tok = Tokenizer(BPE(bpe_vocab, merges, unk_token=proto.trainer_spec.unk_piece, fuse_unk=True, byte_fallback=True))
    tok.add_special_tokens(list(added_tokens.values()))
    # SpmConverter.converted: normalizer, no pre-tokenizer, decoder; then update_post_processor (add_bos_token)
    tok.normalizer = normalizers.Sequence(
        ([normalizers.Prepend(prepend="▁")] if proto.normalizer_spec.add_dummy_prefix else [])
        + [normalizers.Replace(pattern=" ", content="▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(content=" ", left=1)])
    tok.post_processor = processors.TemplateProcessing(single="<s>:0 $A:0", pair="<s>:0 $A:0 <s>:1 $B:1",
                                                       special_tokens=[("<s>", 1)])
    return tok.to_str()


def write_folder(path, model: bytes, *, tokenizer_json: str | None = None, with_model: bool = True):
    """The tokenizer files of an official folder after the user saved the fast tokenizer into it."""
    added = base_added_tokens(model)
    n = spm.SentencePieceProcessor(model_proto=model).get_piece_size()
    added.update({n + i: _added(t) for i, t in enumerate(INTERNVL_TOKENS)})
    path.mkdir(parents=True, exist_ok=True)
    (path / "tokenizer.json").write_text(tokenizer_json or internlm2_tokenizer_json(model, added))
    if with_model:
        (path / "tokenizer.model").write_bytes(model)
    specials = CHAT_TOKENS[::-1] + INTERNVL_TOKENS
    (path / "tokenizer_config.json").write_text(json.dumps({
        "add_bos_token": True, "add_eos_token": False, "added_tokens_decoder": {str(i): t for i, t in added.items()},
        "additional_special_tokens": specials, "bos_token": "<s>", "eos_token": "</s>", "pad_token": "</s>",
        "unk_token": "<unk>", "clean_up_tokenization_spaces": False, "model_max_length": 16384,
        "tokenizer_class": "InternLM2Tokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_internlm2.InternLM2Tokenizer",
                                       "tokenization_internlm2_fast.InternLM2TokenizerFast"]}}))
    (path / "special_tokens_map.json").write_text(json.dumps(
        {"additional_special_tokens": specials, **{f"{k}_token": _added(v) for k, v in SPECIAL.items()}}))
    return path


def prompts(tiles=(1, 3, 2, 1, 13, 1)) -> list[str]:
    """visual-prm's own texts (render_query), with 4 tokens per tile as in the tiny models."""
    return [vp.render_query(q, vp.split_response(r), 4 * t) for q, r, t in zip(QUESTIONS, RESPONSES, tiles)]


def slow_for(model: bytes) -> SlowInternLM2:
    return SlowInternLM2(model, base_added_tokens(model), INTERNVL_TOKENS)


SETTINGS = {"add_dummy_prefix": {}, "no_dummy_prefix": dict(add_dummy_prefix=False),
            "remove_extra_whitespaces": dict(remove_extra_whitespaces=True)}


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_tokenizer_json_gives_the_slow_internlm2_ids_on_visual_prm_prompts(tmp_path, setting):
    """Equal ids for the normaliser settings the loader accepts. With remove_extra_whitespaces the converter's
    tokenizer.json alone differs (shown), and the loader adds sentencepiece's whitespace removal from tokenizer.model."""
    model = train_model(**SETTINGS[setting])
    slow = slow_for(model)
    contents = list(slow.encoder)
    assert not any(a != b and a in b for a in contents for b in contents)  # what the splitter relies on
    folder = write_folder(tmp_path, model)
    texts = prompts()
    want = [slow.encode(t) for t in texts]
    if setting == "remove_extra_whitespaces":
        (folder / "tokenizer.model").rename(folder / "held")
        unchecked = vp._chat_tokenizer(str(folder))
        assert [unchecked(t).input_ids for t in texts] != want
        (folder / "held").rename(folder / "tokenizer.model")
    fast = vp._chat_tokenizer(str(folder))
    # the prompts exercise what can go wrong: byte fallback for unseen characters, added tokens, newlines
    assert any(slow.sp.id_to_piece(i).startswith("<0x") for i in want[2])
    assert sum(i == slow.encoder["<IMG_CONTEXT>"] for i in want[4]) == 4 * 13
    assert slow.encoder["<IMG_CONTEXT>"] == slow.sp.get_piece_size() + 2
    # one by one, and batched, right-padded, as VisualPRM._per_step calls it
    assert [fast(t).input_ids for t in texts] == want
    enc = fast(texts, return_tensors="pt", padding=True, padding_side="right")
    got = [row[mask.bool()].tolist() for row, mask in zip(enc.input_ids, enc.attention_mask)]
    assert got == want
    assert enc.input_ids[0, -1].item() == slow.encoder["</s>"]  # pad_token "</s>", as the slow class sets it
    # the ids VisualPRM looks up itself
    verdicts = [slow.sp.piece_to_id("+"), slow.sp.piece_to_id("-")]
    assert slow.sp.unk_id() not in verdicts
    assert fast.convert_tokens_to_ids([vp.PLACEHOLDER, vp.NEGATIVE, vp.IMG_CONTEXT]) == \
        verdicts + [slow.encoder["<IMG_CONTEXT>"]]
    marker = fast(vp.ROLES[1] + vp.PLACEHOLDER + vp.SEP, add_special_tokens=False).input_ids
    assert marker == slow.encode(vp.ROLES[1] + vp.PLACEHOLDER + vp.SEP)[1:]


def test_normalizer_spec_is_read_as_sentencepiece_reads_it(tmp_path):
    for options in [{}, dict(add_dummy_prefix=False), dict(remove_extra_whitespaces=True),
                    dict(normalization_rule_name="nmt_nfkc")]:
        model = train_model(**options)
        proto = spm_pb2.ModelProto()
        proto.ParseFromString(model)
        ns = proto.normalizer_spec
        spec = parse_normalizer_spec(model)
        assert (spec.name, spec.has_charsmap, spec.add_dummy_prefix, spec.remove_extra_whitespaces,
                spec.escape_whitespaces) == (ns.name, len(ns.precompiled_charsmap) > 0, ns.add_dummy_prefix,
                                             ns.remove_extra_whitespaces, ns.escape_whitespaces), options
    # an empty NormalizerSpec means sentencepiece's defaults (the booleans true)
    bare = parse_normalizer_spec(bytes([0x1A, 0x00]))
    assert (bare.add_dummy_prefix, bare.remove_extra_whitespaces, bare.escape_whitespaces) == (True, True, True)
    # a truncated file is a CheckpointError naming it
    bad = tmp_path / "tokenizer.model"
    bad.write_bytes(train_model()[:-3])
    with pytest.raises(CheckpointError, match="not a readable sentencepiece model"):
        read_normalizer_spec(bad)


@pytest.mark.parametrize("case", ["nmt_nfkc", "dummy_prefix_mismatch", "metaspace"])
def test_tokenizer_json_that_would_differ_from_the_slow_ids_is_refused(tmp_path, case):
    """Each case first shows that the ids really differ on visual-prm's prompts, then that the loader refuses."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers

    if case == "nmt_nfkc":
        model = train_model(normalization_rule_name="nmt_nfkc")
        folder, match = write_folder(tmp_path, model), "normalises characters"
    elif case == "dummy_prefix_mismatch":  # tokenizer.json converted from another tokenizer.model
        model = train_model(add_dummy_prefix=False)
        other = write_folder(tmp_path / "other", train_model(add_dummy_prefix=True))
        folder = write_folder(tmp_path / "f", model, tokenizer_json=(other / "tokenizer.json").read_text())
        match = "normalizer is"
    else:  # a Llama-style (legacy=False) tokenizer.json: "▁" prepended to the first stretch only
        model = train_model()
        n = spm.SentencePieceProcessor(model_proto=model).get_piece_size()
        added = {**base_added_tokens(model), **{n + i: _added(t) for i, t in enumerate(INTERNVL_TOKENS)}}
        tok = Tokenizer.from_str(internlm2_tokenizer_json(model, added))
        tok.normalizer = normalizers.Replace(" ", "▁")
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
        folder, match = write_folder(tmp_path, model, tokenizer_json=tok.to_str()), "normalizer is"
    slow = slow_for(model)
    (folder / "tokenizer.model").rename(folder / "held")  # unchecked without tokenizer.model: the ids differ
    fast = vp._chat_tokenizer(str(folder))
    texts = prompts()
    assert [fast(t).input_ids for t in texts] != [slow.encode(t) for t in texts]
    (folder / "held").rename(folder / "tokenizer.model")
    with pytest.raises(CheckpointError, match=match):
        vp._chat_tokenizer(str(folder))
