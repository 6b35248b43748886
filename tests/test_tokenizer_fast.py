"""The prompt-scoped ("fast") tokenizer path against the full tokenizer and the real Qwen3
tokenizer.json: same ids, which path ran, the fallbacks, and decoding without any BPE built."""

from __future__ import annotations

import copy
import marshal
import os
import random
import subprocess
import sys
import textwrap
import unicodedata

import pytest
import tokenizers

from reflex_core.errors import ModelError
from reflex_core.gguf import open_gguf
from reflex_core.testing.modelwriter import ModelShape, qwen3_tokenizer_json_path
from reflex_core.tokenizer import Tokenizer, prompt_scoped
from test_tokenizer import HAND, _Meta, _random_corpus



def _code_point_strings(n=150, seed=99):
    """Strings of random code points (no surrogates), as in the notes' corpus."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        cps = []
        for _ in range(rng.randint(1, 20)):
            cp = rng.choice([rng.randint(0x20, 0x7F), rng.randint(0x80, 0x7FF), rng.randint(0x800, 0xD7FF),
                             rng.randint(0xE000, 0xFFFF), rng.randint(0x10000, 0x10FFFF)])
            cps.append(chr(cp))
        out.append("".join(cps))
    return out


EXTRA = [
    " " * 300, "\n" * 50, " " * 257 + "x", "\t \t" * 40, "x" + " " * 129 + "y",
    unicodedata.normalize("NFD", "Ça, c'est l'été à Zürich — Ελληνικά, Tiếng Việt, 한국어"),
    "<|im_start|><|im_start|>user<|im_end|><think></think><tool_call><|endoftext|>",
    "<|im_start|>x<|im_end>y<|im_end|", "<think><think>", "a<|fim_pad|>b",
    "👨‍👩‍👧‍👦🇫🇷🇯🇵🏳️‍🌈1️⃣ family", "def f(x):\n\treturn {'a': [1, 2, 3]}\n",
    "中文文本，标点。日本語のテキスト", "\u0301\u0301\u0301", "\ufeff\u200b\u200d",
    "The capital of France is", " Paris", " London", " Berlin",
]
CORPUS = HAND + _random_corpus() + _random_corpus(n=150, seed=4321) + _code_point_strings() + EXTRA
CANDS = {" Paris": [12095], " London": [7148], " Berlin": [19846]}


@pytest.fixture(scope="module")
def model_path(model_files):
    return model_files(ModelShape(n_layer=1), tokenizer="qwen3")


@pytest.fixture(scope="module")
def ref():
    return tokenizers.Tokenizer.from_file(str(qwen3_tokenizer_json_path()))


@pytest.fixture(scope="module")
def base(model_path):
    """A fast-path tokenizer (the bulk merge check done); tests copy it with a fresh mini BPE."""
    tok = Tokenizer.from_gguf(open_gguf(model_path))
    assert not tok.full_built and tok.last_path is None
    tok.encode("warm up")
    assert tok.last_path == "fast" and tok.fast_reason is None
    return tok


@pytest.fixture(scope="module")
def full(model_path):
    mp = pytest.MonkeyPatch()
    mp.setenv("REFLEX_TOKENIZER", "full")
    try:
        tok = Tokenizer.from_gguf(open_gguf(model_path))
    finally:
        mp.undo()
    assert tok.full_built and tok.fast_reason == "REFLEX_TOKENIZER=full"
    return tok


def fresh(tok: Tokenizer) -> Tokenizer:
    """A copy sharing the parsed vocabulary but with no prompt-scoped BPE yet (so each text is
    encoded by a mini BPE built for it alone, as on the cold path)."""
    t = copy.copy(tok)
    t._scoped = copy.copy(tok._scoped)
    t._scoped.reset()
    return t


def test_corpus_size():
    assert len(CORPUS) >= 600


def test_fast_equals_full_and_reference_per_text(base, full, ref):
    bad = []
    for x in CORPUS:
        t = fresh(base)
        ids = t.encode(x)
        assert t.last_path == "fast", (x, t.fast_reason)
        want = ref.encode(x).ids
        if ids != want or full.encode(x) != want:
            bad.append((x, ids, want))
    assert not t.full_built
    assert not bad, f"{len(bad)}/{len(CORPUS)} mismatches, first: {bad[0]!r}"


def test_fast_accumulating_one_tokenizer(model_path, ref):
    # one tokenizer encoding everything in turn (the mini BPE grows, restarts, and after about
    # one full build's cost the full tokenizer takes over): every text stays exact
    tok = Tokenizer.from_gguf(open_gguf(model_path))
    paths = []
    for x in CORPUS + CORPUS:
        assert tok.encode(x) == ref.encode(x).ids, repr(x)
        paths.append(tok.last_path)
    assert paths[:len(CORPUS) // 2] == ["fast"] * (len(CORPUS) // 2)
    assert paths == sorted(paths, key=("fast", "full").index)


def test_parse_special_false_fast_equals_full(base, full):
    full_hf = full._hf
    for x in CORPUS:
        if "<" not in x:
            continue
        t = fresh(base)
        ids = t.encode(x, parse_special=False)
        assert t.last_path == "fast"
        assert ids == full.encode(x, parse_special=False), repr(x)
        assert full_hf.encode_special_tokens is False
    t = fresh(base)
    ids = t.encode("<|im_start|>user\n<think>x</think><|im_end|>", parse_special=False)
    assert 151644 not in ids and 151645 not in ids and 151667 in ids and 151668 in ids


def test_candidates(base):
    t = fresh(base)
    for text, ids in CANDS.items():
        assert t.encode(text, add_special=False) == ids
        assert t.last_path == "fast"


def test_prepare_prompt_and_candidates(base, ref):
    prompt = "<|im_start|>user\nThe capital of France is<|im_end|>\n<|im_start|>assistant\n"
    t = fresh(base)
    assert t.prepare([prompt, *CANDS]) == "fast"
    mini = t._scoped._mini
    assert t.encode(prompt) == ref.encode(prompt).ids and t.last_path == "fast"
    for text, ids in CANDS.items():
        assert t.encode(text, add_special=False) == ids and t.last_path == "fast"
    assert t._scoped._mini is mini  # covered: no rebuild
    # a text that is not covered extends the same tokenizer
    assert t.encode(" Madrid and Rome") == ref.encode(" Madrid and Rome").ids
    assert t.last_path == "fast" and t._scoped._mini is not mini


def test_guard_pathological_text_builds_full(base, ref):
    t = fresh(base)
    x = "a" * 3000  # one 3000-letter word: ~7e5 substring look-ups > 2e5
    assert t.encode(x) == ref.encode(x).ids
    assert t.last_path == "full" and t.full_built and "look-ups" in t.fast_reason
    assert t.encode(" Paris") == [12095] and t.last_path == "full"  # full from then on


def test_growth_cap_builds_full(base, ref, monkeypatch):
    # every new text costs a mini BPE build; after about one full build's worth, build in full
    monkeypatch.setattr(prompt_scoped, "_MAX_FAST_COST", 2000.0)
    t = fresh(base)
    t._scoped._cost = 0.0
    paths = []
    for x in HAND[1:12]:
        assert t.encode(x) == ref.encode(x).ids, repr(x)
        paths.append(t.last_path)
    assert paths[0] == "fast" and paths[-1] == "full" and t.full_built
    assert paths == sorted(paths, key=("fast", "full").index)  # switches once, for good
    assert "one full build" in t.fast_reason


def test_union_then_fresh_mini(base, ref, monkeypatch):
    monkeypatch.setattr(prompt_scoped, "_UNION_MAX", 100)
    t = fresh(base)
    t.encode("The capital of France is")
    m1, n1 = t._scoped._mini, len(t._scoped._sub_ids)
    assert t.encode(" Paris", add_special=False) == [12095] and t._scoped._mini is not m1
    assert len(t._scoped._sub_ids) > n1  # joined the union
    for x in HAND[2:6]:
        assert t.encode(x) == ref.encode(x).ids and t.last_path == "fast"
    assert t._scoped._cov.isdisjoint(["Ġcapital", "ĠParis"])  # the union was restarted, not grown for ever


def test_env_full(full, ref):
    for x in CORPUS[:80]:
        assert full.encode(x) == ref.encode(x).ids
        assert full.last_path == "full"


# ---------------------------------------------------------------- fallbacks on other layouts


def _qwen3_lists():
    from reflex_core.testing.modelwriter import _qwen3_vocab

    tokens, types, merges = _qwen3_vocab()
    return list(tokens), list(types), list(merges)


def _write_tokenizer_gguf(path, tokens, types, merges, bos=151643, eos=151645):
    import gguf
    w = gguf.GGUFWriter(str(path), "qwen3")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_add_bos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_file_violating_256_plus_i_falls_back(tmp_path, ref):
    # swap two tokens' ids: merge 12095-256 now makes the text of token 7148 and vice versa.
    # A mini BPE would pick the wrong merges; the bulk check must catch it.
    tokens, types, merges = _qwen3_lists()
    a, b = 12095, 7148
    tokens[a], tokens[b] = tokens[b], tokens[a]
    path = _write_tokenizer_gguf(tmp_path / "swapped.gguf", tokens, types, merges)
    tok = Tokenizer.from_gguf(open_gguf(path))
    swap = {a: b, b: a}
    assert tok.encode(" Paris") == [b] and tok.encode(" London") == [a]
    assert tok.last_path == "full" and tok.full_built and "256+i" in tok.fast_reason
    for x in CORPUS[::7]:
        assert tok.encode(x) == [swap.get(i, i) for i in ref.encode(x).ids], repr(x)
    assert tok.decode([b]) == " Paris"


def test_merges_out_of_order_fall_back():
    # two merges swapped (ranks change): fast path refused, same ids as the forced full build
    tokens, types, merges = _qwen3_lists()
    merges[100], merges[5000] = merges[5000], merges[100]
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.tokens": tokens,
          "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges,
          "tokenizer.ggml.eos_token_id": 151645, "tokenizer.ggml.add_bos_token": False}
    tok = Tokenizer.from_gguf(_Meta(md))
    mp = pytest.MonkeyPatch()
    mp.setenv("REFLEX_TOKENIZER", "full")
    try:
        want = Tokenizer.from_gguf(_Meta(md))
    finally:
        mp.undo()
    for x in HAND:
        assert tok.encode(x) == want.encode(x), repr(x)
    assert tok.last_path == "full" and "256+i" in tok.fast_reason


def test_malformed_merge_falls_back():
    tokens, types, merges = _qwen3_lists()
    merges[7] = merges[7] + " "  # two spaces: not "a b"
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.tokens": tokens,
          "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges}
    tok = Tokenizer.from_gguf(_Meta(md))  # cheap: nothing is checked or built yet
    with pytest.raises(ModelError, match="inconsistent"):  # the full build reports the file
        tok.encode("hello")
    assert "one space" in tok.fast_reason


def test_small_vocab_fast_path_and_pinned_added():
    # the layout of test_tokenizer's pinned-ids test (CONTROL at id 0, as DeepSeek-V3 has its
    # three special tokens): the BPE vocabulary is the NORMAL tokens after it, served fast
    from test_tokenizer import _byte_vocab

    tokens = ["<|bos|>"] + _byte_vocab() + ["\u0120t", "[PAD258]", "<think>"]
    types = [3] + [1] * 256 + [1, 5, 4]
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.tokens": tokens,
          "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": ["\u0120 t"],
          "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.add_bos_token": True}
    tok = Tokenizer.from_gguf(_Meta(md))
    assert tok.encode(" t<think>") == [0, 257, 259]
    assert tok.last_path == "fast" and list(tok._scoped._run_tok) == [257]
    # the Qwen layout (byte tokens, merges, then added tokens): fast, added ids pinned
    tokens = _byte_vocab() + ["\u0120t", "\u0120tt", "<think>", "<|end|>", "[PAD260]"]
    types = [1] * 258 + [4, 3, 5]
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.tokens": tokens,
          "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": ["\u0120 t", "\u0120t t"]}
    tok = Tokenizer.from_gguf(_Meta(md))
    assert tok.encode(" tt<think> t<|end|>") == [257, 258, 256, 259]
    assert tok.last_path == "fast"
    assert tok.encode(" tt<|end|>", parse_special=False)[:1] == [257]
    assert tok.last_path == "fast"


# ---------------------------------------------------------------- tables() / from_tables()


def test_tables_round_trip_equals_the_tokenizer(model_path, ref, monkeypatch):
    g = open_gguf(model_path)
    tok = Tokenizer.from_gguf(g)
    tables = tok.tables()
    assert tables["fast"] is True
    assert marshal.loads(marshal.dumps(tables)) == tables  # plain data
    served = Tokenizer.from_tables(g, marshal.loads(marshal.dumps(tables)))
    assert served is not None and served._scoped.checked and not served.full_built
    for attr in ("n_vocab", "bos_id", "eos_id", "eot_id", "pad_id", "add_bos", "add_eos",
                 "eog_ids", "pre"):
        assert getattr(served, attr) == getattr(tok, attr), attr
    bad = []
    for x in CORPUS:
        a, b = fresh(served), fresh(tok)
        ids = a.encode(x)
        assert a.last_path == "fast", (x, a.fast_reason)
        if ids != b.encode(x) or ids != ref.encode(x).ids or a.decode(ids) != b.decode(ids):
            bad.append(x)
    assert not bad, f"{len(bad)} mismatches, first {bad[0]!r}"
    rng = random.Random(17)
    for i in rng.sample(range(tok.n_vocab), 500) + [0, 255, 256, tok.n_vocab - 1]:
        assert served.token_bytes(i) == tok.token_bytes(i)
    assert served.tables() == tables  # a served tokenizer exports the same tables
    # the tables describe the vocabulary, not this process's state: a tokenizer whose
    # prompt-scoped path is off (REFLEX_TOKENIZER=full) exports the same ones, and in that
    # mode from_tables declines (from_gguf builds the full tokenizer)
    monkeypatch.setenv("REFLEX_TOKENIZER", "full")
    assert Tokenizer.from_gguf(g).tables() == tables
    assert Tokenizer.from_tables(g, tables) is None


def test_tables_of_a_vocabulary_the_path_refuses(tmp_path):
    tokens, types, merges = _qwen3_lists()
    tokens[12095], tokens[7148] = tokens[7148], tokens[12095]
    g = open_gguf(_write_tokenizer_gguf(tmp_path / "swapped.gguf", tokens, types, merges))
    tables = Tokenizer.from_gguf(g).tables()
    assert tables["fast"] is False and "256+i" in tables["reason"]
    assert Tokenizer.from_tables(g, tables) is None
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2",
          "tokenizer.ggml.tokens": ["a", "b"]}
    assert Tokenizer.from_gguf(_Meta(md)).tables()["fast"] is False  # no file to point into


# ---------------------------------------------------------------- decoding without any BPE


def _random_ids(rng, n):
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.05:
            out.append(rng.choice([151669, 151700, 151935, 151936, 10**6, -1]))  # [PAD…] / out of range
        elif r < 0.1:
            out.append(rng.randrange(151643, 151669))  # added tokens
        else:
            out.append(rng.randrange(151643))
    return out


def test_decode_streamer_token_bytes_without_full_build(model_path, full, ref):
    tok = Tokenizer.from_gguf(open_gguf(model_path))  # nothing encoded: no BPE at all
    rng = random.Random(2024)
    for _ in range(300):
        ids = _random_ids(rng, rng.randint(1, 40))
        assert tok.decode(ids) == full.decode(ids)
        assert tok.decode(ids, skip_special=True) == full.decode(ids, skip_special=True)
        valid = [i for i in ids if 0 <= i < 151669]
        assert tok.decode(ids) == ref.decode(valid, skip_special_tokens=False)
        s1, s2 = tok.streamer(), full.streamer()
        p1 = [s1.push(i) for i in ids] + [s1.flush()]
        p2 = [s2.push(i) for i in ids] + [s2.flush()]
        assert p1 == p2 and "".join(p1) == tok.decode(ids)
    for i in _random_ids(rng, 3000) + [0, 255, 151642, 151643, 151668, 151669, 151935]:
        assert tok.token_bytes(i) == full.token_bytes(i)
        assert tok.token_text(i) == full.token_text(i)
        assert tok.is_control(i) == full.is_control(i)
    assert tok.token_bytes(151700) == b"" and tok.token_bytes(-1) == b"" and tok.token_bytes(151936) == b""
    assert not tok.full_built and tok._scoped._mini is None


def test_decode_roundtrip_fast(base):
    for x in CORPUS:
        t = fresh(base)
        assert t.decode(t.encode(x)) == unicodedata.normalize("NFC", x), repr(x)
        assert not t.full_built


# ---------------------------------------------------------------- the GGUF reader's raw access


def test_gguf_raw_list_and_chunks(tmp_path):
    import gguf
    rng = random.Random(5)
    strings = ["".join(rng.choice("abĠĊ é日🙂") for _ in range(rng.randint(1, 30))) for _ in range(5000)]
    strings[10:16] = ["", "x\0y", "z" * 256, "y" * 255, "w" * 70000, "\0"]
    w = gguf.GGUFWriter(str(tmp_path / "s.gguf"), "test")
    w.add_array("t.strs", strings)
    w.add_array("t.nums", [1, 2, 3])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    want = [s.encode("utf-8") for s in strings]
    g = open_gguf(tmp_path / "s.gguf")
    arr = g.metadata["t.strs"]
    chunks = list(arr.raw_chunks())
    assert len(chunks) > 1 and [b for c in chunks for b in c] == want
    assert arr.raw_list() == want and arr.raw_list() is arr.raw_list()
    assert list(arr.raw_chunks()) == [want]  # once the list exists it is the one chunk
    assert arr.tolist() == strings and arr.raw_list() == want
    g2 = open_gguf(tmp_path / "s.gguf")
    a2 = g2.metadata["t.strs"]
    assert a2.tolist() == strings  # decoded first, then raw
    assert a2.raw_list() == want and [b for c in a2.raw_chunks() for b in c] == want
    assert a2.raw(12) == b"z" * 256
    with pytest.raises(TypeError):
        g.metadata["t.nums"].raw_list()
    with pytest.raises(TypeError):
        list(g.metadata["t.nums"].raw_chunks())


# ---------------------------------------------------------------- the cold path's imports


def test_cold_path_imports_and_path(model_path):
    code = textwrap.dedent(f"""
        import sys
        from reflex_core.gguf import open_gguf
        from reflex_core.tokenizer import Tokenizer
        tok = Tokenizer.from_gguf(open_gguf({str(model_path)!r}))
        assert "tokenizers" not in sys.modules, "from_gguf imported tokenizers"
        prompt = "The capital of France is"
        assert tok.prepare([prompt, " Paris", " London"]) == "fast"
        assert tok.encode(prompt) == [785, 6722, 315, 9625, 374]
        assert tok.encode(" Paris", add_special=False) == [12095]
        assert tok.last_path == "fast" and not tok.full_built
        s = tok.streamer(); [s.push(i) for i in [12095, 151645]]; s.flush()
        assert tok.decode([12095, 151645]) == " Paris<|im_end|>"
        bad = sorted(m for m in ("numpy", "gguf", "transformers") if m in sys.modules)
        print("LOADED", bad)
        sys.exit(1 if bad else 0)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, REFLEX_TOKENIZER=""))
    assert r.returncode == 0, r.stdout + r.stderr


def test_invalid_unicode_is_one_line_error(base, full):
    from reflex_core.errors import ReflexError

    for t in (fresh(base), full):
        with pytest.raises(ReflexError, match="lone surrogate at index 1"):
            t.encode("a\ud800b")
        assert t.encode("ok") == [562]
    t = fresh(base)
    with pytest.raises(ReflexError, match="lone surrogate"):
        t.prepare(["ok", "\udcff"])
    assert t.encode("ok") == [562] and t.last_path == "fast"
