"""The prompt-scoped ("fast") tokenizer path on DeepSeek vocabularies: it serves them, and it
encodes exactly like the full tokenizer.

DeepSeek's token ids follow the merge order, as Qwen's do, but not from 256: DeepSeek-LLM/V2
lack 13 byte characters in their BPE (those of bytes valid UTF-8 never holds, added as
one-character tokens), so merge i makes token 243+i; DeepSeek-V3 has its special tokens at ids
0-2, before the BPE vocabulary. The vocabularies here: llama.cpp's ggml-vocab-deepseek-llm.gguf
(REFLEX_LLAMA_VOCAB_DIR, which scripts/test.sh fills; without it these tests fail, never
skip), the deepseek-v3 file tests/test_tokenizer_deepseek_v3.py writes from it (digit merges
appended after the added tokens: a second run of merges), and the same with its two special
tokens moved in front of the BPE vocabulary, as DeepSeek-V3 lays them out.
"""

from __future__ import annotations

import marshal
import random
import re
from array import array

import gguf
import numpy as np
import pytest

from reflex_core.errors import ModelError
from reflex_core.gguf import open_gguf
from reflex_core.modelfile import load_tokenizer, open_model_file
from reflex_core.testing.modelwriter import deepseek_llm_vocab_path
from reflex_core.tokenizer import Tokenizer, prompt_scoped, tables
from test_tokenizer import HAND, _byte_vocab, _Meta
from test_tokenizer_deepseek_v3 import CORPUS as V3_CORPUS, DIGIT_MERGES
from test_tokenizer_fast import CORPUS, fresh

BOS_TEXT = "<\uff5cbegin\u2581of\u2581sentence\uff5c>"
EOS_TEXT = "<\uff5cend\u2581of\u2581sentence\uff5c>"
# DeepSeek-LLM's one-character added tokens: the byte-level characters of 0xC0, 0xC1, 0xF5-0xFF
ONE_CHAR = "\u00c0\u00c1" + "".join(chr(b) for b in range(0xF5, 0x100))
DS_EXTRA = [
    "K\u00f6ln, Z\u00fcrich, f\u00fcr \u00fcber, \u00f8re, \u00fe\u00f3rn, 3 \u00f7 4, "
    "\u00c0 la carte, \u00c1lvaro, caf\u00e9 \u00fd \u00ff \u00fb \u00f9 \u00fa \u00f5",
    ONE_CHAR, " ".join(ONE_CHAR), "x" + "y".join(ONE_CHAR) + "z", "\u00f8\u00f8\u00f8 \u00f8",
    "\u00f6" * 40, "K\u00f6ln" * 20, "\u00c0b\u00c1c", "o\u0308 u\u0308",  # NFD: not the tokens
    "[PAD100015]", "a[PAD100015]b[PAD102399] c [PAD100200][PAD100201]", "[PAD100015",
    "[PAD1000150]", "[PAD]", "[[PAD100016]]", " [PAD100016] ", "[pad100016]",
    f"{BOS_TEXT}Hello{EOS_TEXT}", f"x{BOS_TEXT}{BOS_TEXT} {EOS_TEXT}\n", EOS_TEXT[:-1],
    f"{BOS_TEXT}[PAD100015]\u00f8{EOS_TEXT}", "1234567890 3.14159 12345678901234567890",
    "\u4ef7\u683c\u662f1234567\u5143\uff0c\u4e1c\u4eac\u30bf\u30ef\u30fc",
]
TEXTS = CORPUS + V3_CORPUS + DS_EXTRA
# one mini BPE per text costs ~4 ms here (2,400 added tokens): a sample of the corpus
PER_TEXT = HAND + DS_EXTRA + V3_CORPUS[::2] + CORPUS[len(HAND)::10]


def _vocab_lists():
    src = open_gguf(str(deepseek_llm_vocab_path()))
    return (list(src.get("tokenizer.ggml.tokens")),
            [int(t) for t in src.get("tokenizer.ggml.token_type")],
            list(src.get("tokenizer.ggml.merges")))


def _write(path, pre, tokens, types, merges, bos, eos):
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_add_bos_token(True)
    # a tensor, so that the file reaches its data offset (an index covers [0, data_offset))
    w.add_tensor("token_embd.weight", np.zeros(32, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    """name -> (file, expected runs as (first tokens, first ranks))."""
    d = tmp_path_factory.mktemp("dsvocab")
    tokens, types, merges = _vocab_lists()
    assert types[100000:100002] == [3, 3] and types[:100000] == [1] * 100000
    extra = [m.replace(" ", "") for m in DIGIT_MERGES]
    digits = (tokens + extra, types + [1] * len(extra), merges + list(DIGIT_MERGES))
    # DeepSeek-V3's layout: the special tokens first (ids 0 and 1), then the BPE vocabulary
    first = ([tokens[100000], tokens[100001]] + tokens[:100000] + digits[0][100002:],
             [3, 3] + types[:100000] + digits[1][100002:], digits[2])
    n = len(merges)
    return {
        "deepseek-llm": (deepseek_llm_vocab_path(), ([243], [0])),
        "deepseek-v3": (_write(d / "v3.gguf", "deepseek-v3", *digits, 100000, 100001),
                        ([243, 102400], [0, n])),
        "deepseek-v3-specials-first": (_write(d / "v3first.gguf", "deepseek-v3", *first, 0, 1),
                                       ([245, 102400], [0, n])),
    }


def _full(path) -> Tokenizer:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("REFLEX_TOKENIZER", "full")
        tok = Tokenizer.from_gguf(open_gguf(str(path)))
    assert tok.full_built
    return tok


@pytest.fixture(scope="module",
                params=["deepseek-llm", "deepseek-v3", "deepseek-v3-specials-first"])
def vocab(request, paths):
    """(fast-path tokenizer with the merge check done, full tokenizer, file, expected runs)."""
    path, runs = paths[request.param]
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("REFLEX_TOKENIZER", raising=False)
        tok = Tokenizer.from_gguf(open_gguf(str(path)))
    tok.encode("warm up")
    return tok, _full(path), path, runs


def test_takes_the_fast_path(vocab):
    tok, full, _, (run_tok, run_rank) = vocab
    assert tok.last_path == "fast" and tok.fast_reason is None and not tok.full_built
    s = tok._scoped
    assert (list(s._run_tok), list(s._run_rank)) == (run_tok, run_rank)
    assert len(tok._added) == 2400 and sum(len(t) == 1 for _, t, _ in tok._added) == 13
    t = fresh(tok)
    assert t.prepare(["The capital of France is", " Paris"]) == "fast"
    assert t.encode("The capital of France is") == full.encode("The capital of France is")
    assert t.encode(" Paris", add_special=False) == full.encode(" Paris", add_special=False)
    assert t.last_path == "fast" and not t.full_built


def test_every_merge_made_by_its_run(vocab):
    # the runs name, for every token, the merge whose "a b" is its text (and no other)
    tok, _, _, _ = vocab
    s = tok._scoped
    merges = [b for blk in s._mblocks for b in blk.split(b"\0")]
    rng = random.Random(8)
    for r in rng.sample(range(len(merges)), 3000) + [0, len(merges) - 1]:
        t = tok._scoped._vocab[merges[r].replace(b" ", b"")]
        assert s._rank(t) == r
    made = {s._vocab[m.replace(b" ", b"")] for m in merges}
    for t in rng.sample(range(tok.n_vocab), 3000) + [0, 242, 243, 244, 245, 102399, 102400]:
        assert (s._rank(t) is None) == (t not in made)


@pytest.mark.parametrize("parse_special", [True, False], ids=["special", "plain"])
def test_fast_equals_full_one_text_per_mini_bpe(vocab, parse_special):
    # the cold path: a mini BPE built for the one text
    tok, full, _, _ = vocab
    bad = []
    for x in PER_TEXT:
        t = fresh(tok)
        ids = t.encode(x, parse_special=parse_special)
        assert t.last_path == "fast", (x, t.fast_reason)
        if ids != full.encode(x, parse_special=parse_special):
            bad.append(x)
    assert not bad, f"{len(bad)} mismatches, first {bad[0]!r}"


@pytest.mark.parametrize("parse_special", [True, False], ids=["special", "plain"])
def test_fast_equals_full_prepared_batches(vocab, parse_special):
    tok, full, _, _ = vocab
    bad = []
    for i in range(0, len(TEXTS), 25):
        batch = TEXTS[i:i + 25]
        t = fresh(tok)
        assert t.prepare(batch, parse_special=parse_special) == "fast"
        for x in batch:
            ids = t.encode(x, parse_special=parse_special)
            assert t.last_path == "fast"
            if ids != full.encode(x, parse_special=parse_special):
                bad.append(x)
    assert not bad, f"{len(bad)} mismatches, first {bad[0]!r}"


def test_tables_round_trip(vocab):
    tok, full, path, (run_tok, _) = vocab
    g = open_gguf(str(path))
    t = Tokenizer.from_gguf(g).tables()
    assert t["fast"] is True and marshal.loads(marshal.dumps(t)) == t
    back = tables.loads(tables.dumps(t))
    assert back is not None and tables.fits(back, g)
    served = Tokenizer.from_tables(g, back)
    assert served is not None and served._scoped.checked and served._scoped._mblocks == []
    assert list(served._scoped._run_tok) == run_tok
    for attr in ("n_vocab", "bos_id", "eos_id", "eot_id", "pad_id", "add_bos", "eog_ids"):
        assert getattr(served, attr) == getattr(tok, attr), attr
    bad = []
    for ps, texts in ((True, TEXTS[::2]), (False, HAND + DS_EXTRA + V3_CORPUS)):
        for i in range(0, len(texts), 50):
            s = fresh(served)
            assert s.prepare(texts[i:i + 50], parse_special=ps) == "fast"
            bad += [x for x in texts[i:i + 50]
                    if s.encode(x, parse_special=ps) != full.encode(x, parse_special=ps)]
            assert s.last_path == "fast"
    assert not bad, f"{len(bad)} mismatches, first {bad[0]!r}"
    assert served.tables() == t


def test_index_hit_serves_the_fast_path(index_cache, paths):
    from reflex_core import gguf_index

    path, _ = paths["deepseek-v3-specials-first"]
    g = open_model_file(path)
    assert g.index_state == "miss"
    gguf_index.write_pending()
    h = open_model_file(path)
    assert h.index_state == "hit" and h.tokenizer_tables["fast"] is True
    tok = load_tokenizer(h)
    assert tok._scoped is not None and tok._scoped._merge_strs is not None  # from the tables
    full = _full(path)
    for x in ["The capital of France is", " K\u00f6ln [PAD100015]", DS_EXTRA[0]]:
        assert tok.encode(x) == full.encode(x) and tok.last_path == "fast"


def test_forged_runs_are_refused(paths):
    path, _ = paths["deepseek-v3"]
    g = open_gguf(str(path))
    t = tables.loads(tables.dumps(Tokenizer.from_gguf(g).tables()))
    m, n = t["m"], len(t["tb"])

    def runs(tok, rank):
        return {**t, "runs": (array("I", tok).tobytes(), array("I", rank).tobytes())}

    for bad in (runs([], []), runs([243], [1]), runs([243, 102400], [0, 0]),
                runs([243, 99000], [0, 99757]),  # the first run's tokens overlap the second's
                runs([243, n - 3], [0, 99757]),  # past the vocabulary
                runs([243, 102400], [0, m]), {**t, "runs": (b"\0" * 5, b"\0" * 5)}):
        assert not tables.fits(bad, g)
        assert Tokenizer.from_tables(g, bad) is None
    blob = bytearray(tables.dumps(t))
    blob[4] = 1  # version 1: before the runs
    assert tables.loads(bytes(blob)) is None


# ---------------------------------------------------------------- small vocabularies


def _md(tokens, types, merges, **kw):
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2",
            "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.merges": merges, **kw}


def _pair(md):
    fast = Tokenizer.from_gguf(_Meta(md))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("REFLEX_TOKENIZER", "full")
        full = Tokenizer.from_gguf(_Meta(md))
    return fast, full


def test_runs_inside_one_block():
    # merges whose tokens have gaps (an added and an unused token between them): three runs
    tokens = _byte_vocab() + ["ab", "abc", "<|x|>", "cd", "abcd", "[PAD261]", "ef"]
    types = [1] * 258 + [3, 1, 1, 5, 1]
    fast, full = _pair(_md(tokens, types, ["a b", "ab c", "c d", "abc d", "e f"]))
    for x in ["abcd ef<|x|>abc", "ab cd abcd efef", "<|x|>"]:
        assert fast.encode(x) == full.encode(x) and fast.last_path == "fast"
    s = fast._scoped
    assert (list(s._run_tok), list(s._run_rank)) == ([256, 259, 262], [0, 2, 4])
    assert [s._rank(t) for t in (255, 256, 257, 258, 259, 260, 261, 262, 263)] == \
        [None, 0, 1, None, 2, 3, None, 4, None]
    assert fast.encode("abcd") == [260]


def test_merges_out_of_token_order_are_refused():
    # "a bc" makes "abc" again (after "ab c"): a token made by two merges, refused
    tokens = _byte_vocab() + ["ab", "bc", "abc"]
    fast, full = _pair(_md(tokens, [1] * 259, ["a b", "b c", "ab c", "a bc"]))
    for x in ["abc", "xabcbc", "a bc"]:
        assert fast.encode(x) == full.encode(x)
    assert fast.last_path == "full" and "merge 3 makes token 258" in fast.fast_reason
    # a merge whose result is an added token's text: not one the BPE can make
    tokens = _byte_vocab() + ["ab"]
    fast = Tokenizer.from_gguf(_Meta(_md(tokens, [1] * 256 + [4], ["a b"])))
    with pytest.raises(ModelError, match="not in the vocabulary"):  # the full build says why
        fast.encode("ab")
    assert "merge 0 does not make a token of the BPE vocabulary" in fast.fast_reason


def test_one_char_added_tokens(monkeypatch):
    # DeepSeek's kind: the character of a byte valid UTF-8 never holds (0xF8): served
    vocab = _byte_vocab()
    tokens = [c for c in vocab if c != "\u00f8"] + ["hi", "\u00f8"]
    fast, full = _pair(_md(tokens, [1] * 256 + [4], ["h i"]))
    for x in [" hi", "\u00f8hi\u00f8", "h\u00f8i"]:
        assert fast.encode(x) == full.encode(x) and fast.last_path == "fast"
    # the character of a byte text does hold ('\u0120', the space): each mini BPE pins it, the
    # full one (added tokens right after its vocabulary) does not and drops it as unknown, so
    # the mini BPE would differ; refused
    tokens = [c for c in vocab if c != "\u0120"] + ["hi", "\u0120"]
    fast, full = _pair(_md(tokens, [1] * 256 + [4], ["h i"]))
    assert full.encode(" hi") == [255]  # the space's character dropped
    assert fast.encode(" hi") == [255] and fast.last_path == "full"
    assert fast.fast_reason == "unusual added tokens"
    monkeypatch.setattr(prompt_scoped, "_may_be_in_a_word", lambda text: False)
    unchecked = Tokenizer.from_gguf(_Meta(_md(tokens, [1] * 256 + [4], ["h i"])))
    assert unchecked.encode(" hi") == [256, 255] and unchecked.last_path == "fast"  # why


def test_literals_match_like_a_regex_alternation():
    rng = random.Random(21)
    alphabet = "ab[]\\^-|.x"
    for _ in range(400):
        texts = {"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4)))
                 for _ in range(rng.randint(1, 8))}
        rx = re.compile("|".join(map(re.escape, sorted(texts, key=len, reverse=True))))
        lit = prompt_scoped._Literals(texts)
        for _ in range(10):
            text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
            assert list(lit.matches(text)) == [m.span() for m in rx.finditer(text)], (texts, text)
