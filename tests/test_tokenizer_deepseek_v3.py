"""Reflex's ``deepseek-v3`` pre-tokenizer against llama.cpp's own tokenization.

llama.cpp ships no test vectors for ``pre = "deepseek-v3"``, so this test writes a vocab-only
GGUF with that pre type over a real byte-level BPE vocabulary (the token list, types and
merges of llama.cpp's ``ggml-vocab-deepseek-llm.gguf``, read from REFLEX_LLAMA_VOCAB_DIR, the
folder scripts/test.sh fills, plus a few digit and kana merges: see DIGIT_MERGES) and compares Reflex's encoding with llama.cpp's
(llama-cpp-python's ``llama_tokenize`` on the same file loaded with ``vocab_only``) over a corpus
aimed at the three deepseek-v3 regexes (spec 10.3): digit runs (1-7 digits, split in threes),
CJK / hiragana / katakana runs, punctuation runs with and without a following ASCII word, mixed
scripts, newlines and spaces, emoji, accented letters and combining marks. Both sides run with
add_special / parse_special false (as llama.cpp's test-tokenizer-0 does), then with both true to
check BOS handling and special-token parsing. Without the vocab folder or llama-cpp-python the
test fails, never skips: CI must run it.
"""

from __future__ import annotations

import os
from pathlib import Path

import gguf
import pytest

from reflex_core.gguf import open_gguf
from reflex_core.testing import oracle
from test_vocab_vectors import reflex_tokenizer

ENV = "REFLEX_LLAMA_VOCAB_DIR"
SOURCE = "ggml-vocab-deepseek-llm.gguf"
BOS, EOS = 100000, 100001
# deepseek-llm's vocabulary has no multi-digit token (its pre-tokenizer splits digits one by
# one), so alone it cannot show how digits are grouped. These merges (appended: lowest priority)
# and their tokens (ids 102400...) make the grouping visible: "1234567" is 123|456|7 under
# \p{N}{1,3}, 123|4567 without the split, 1|234|567 if grouped from the right.
DIGIT_MERGES = ("1 2", "12 3", "2 3", "23 4", "4 5", "45 6", "456 7", "5 6", "56 7")
# Likewise a kanji with a katakana and with a hiragana character (appended merges of tokens the
# vocabulary has): they join only where the CJK / kana regex keeps both in one piece.
KANA_MERGES = (("京", "タ"), ("本", "の"))


def _byte_level(text: str) -> str:
    """``text``'s UTF-8 bytes as byte-level BPE token characters (GPT-2's byte-to-unicode)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    table, n = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return "".join(table[b] for b in text.encode("utf-8"))

CORPUS = [
    "",
    " ",
    "  ",
    "\n",
    "\n\n\n",
    " \n \n",
    "\t\tx",
    "Hello world",
    " Hello  world ",
    "Hello\nworld\r\n",
    "1", "12", "123", "1234", "12345", "123456", "1234567",
    "a1b22c333d4444", "3.14159 and 2,718,281", "v2.0.17-rc1", "x=12345678;",
    "Ⅻ ½ ٣٤٥ ๑๒๓",  # other \p{N}: roman numeral, fraction, Arabic-Indic and Thai digits
    "你好世界", "我们在2024年发布了新的模型。", "深度求索！",
    "こんにちは", " こんにちは", "abcカタカナ", "x ひらがな", " 東京 タワー", "Hello 你好 世界",
    "カタカナとひらがな", "ｶﾀｶﾅ", "日本語のテキスト、東京タワー。", "本の東京タワー", "京 タ 本 の",
    "한국어 텍스트", "Привет, мир!", "Γειά σου Κόσμε", "مرحبا بالعالم", "नमस्ते दुनिया",
    "...", "!!!???", "Hello!!! How are you???", "(a+b)*c", "--flag=value", "#include <stdio.h>",
    "foo.bar.baz", "'s 're 've 'll", "don't stop", ":)", "@user #tag $5 %d ^_^ ~x `code`",
    "[](){}<>", "a\\b", '"quoted"', "«guillemets» „Anführung“ —dash…",
    "Mixed 中文 and English 和 日本語テキスト 123abc",
    "Hello世界123こんにちは!", "価格は1234567円です", "emoji 😀👍🏽 🇫🇷 👨‍👩‍👧 ok",
    "café naïve résumé Zürich São Paulo",
    "tired \U0001fae9! a \U0001fac6.",  # Emoji 16 symbols: not in llama.cpp's (Unicode 15.1) \p{S} "Ångström øre ÿes", "e\u0301 a\u0308 n\u0303",
    "ÀÁÂÃÄÅ àáâãäå ñ ß œ ÿ",
    "    def f(x):\n        return x * 2\n",
    "line1\n\nline2\n\n\n   indented",
    "tabs\tand\tspaces   end   ",
    "<\uff5cbegin\u2581of\u2581sentence\uff5c>Hi<\uff5cend\u2581of\u2581sentence\uff5c>",
    "a <\uff5cend\u2581of\u2581sentence\uff5c> b",
]


def _source(name: str = SOURCE) -> Path:
    root = os.environ.get(ENV)
    if not root:
        pytest.fail(f"{ENV} is not set: run scripts/test.sh, or point it at llama.cpp's models/ "
                    f"directory (vendor/llama.cpp/models in the llama-cpp-python 0.3.36 sdist)",
                    pytrace=False)
    path = Path(root) / name
    if not path.is_file():
        pytest.fail(f"{ENV}={root} lacks {name}", pytrace=False)
    return path


def write_derived_vocab(path: Path, pre: str, merges: list[str], *, source: str = SOURCE,
                        bos: int | None = BOS, eos: int = EOS, add_bos: bool | None = True,
                        tokens_alone: tuple[str, ...] = ()) -> Path:
    """A vocab-only GGUF at ``path``: the vocabulary and hyper-parameters of llama.cpp's
    ``source`` vocab file under ``pre``, with ``merges`` (byte-level "left right" strings) and
    their tokens appended, then ``tokens_alone`` (byte-level tokens no merge makes). The
    pre-tokenizer does not depend on the architecture; llama.cpp's own vocab files have no
    tensors. ``bos`` / ``add_bos`` None: no such key."""
    src = open_gguf(str(_source(source)))
    arch = src.get("general.architecture")
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"{pre} pre-tokenizer over the {source} vocabulary")
    for key, v in src.metadata.items():  # the architecture's hyper-parameters, as they are
        if key.startswith(arch + "."):
            (w.add_float32 if isinstance(v, float) else w.add_uint32)(key, v)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    tokens = list(src.get("tokenizer.ggml.tokens"))
    extra = [m.replace(" ", "") for m in merges] + list(tokens_alone)
    assert not set(extra) & set(tokens)
    assert {part for m in merges for part in m.split(" ")} <= set(tokens) | set(extra)
    w.add_token_list(tokens + extra)
    w.add_token_types([int(t) for t in src.get("tokenizer.ggml.token_type")]
                      + [int(gguf.TokenType.NORMAL)] * len(extra))
    w.add_token_merges(list(src.get("tokenizer.ggml.merges")) + merges)
    if bos is not None:
        w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_pad_token_id(eos)
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    w.add_add_eos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory) -> Path:
    """The deepseek-llm vocabulary under pre = deepseek-v3, with the digit and kana merges."""
    merges = list(DIGIT_MERGES) + [f"{_byte_level(a)} {_byte_level(b)}" for a, b in KANA_MERGES]
    return write_derived_vocab(tmp_path_factory.mktemp("vocab") / "ggml-vocab-deepseek-v3.gguf",
                               "deepseek-v3", merges)


def _llama_tokenize(path: Path, text: str, add_special: bool, parse_special: bool) -> list[int]:
    return oracle.llama_tokenize(path, text, add_special, parse_special)


def _reflex_tokenizer(path: str, mode: str):
    tok = reflex_tokenizer(path, mode)
    assert tok.pre == "deepseek-v3"
    return tok


@pytest.mark.oracle
@pytest.mark.parametrize("mode", ["auto", "full"])
@pytest.mark.parametrize("special", [False, True], ids=["plain", "special"])
def test_encodes_as_llama_cpp(vocab_file, mode, special):
    tok = _reflex_tokenizer(str(vocab_file), mode)
    wrong = []
    for text in CORPUS:
        want = _llama_tokenize(vocab_file, text, add_special=special, parse_special=special)
        got = tok.encode(text, add_special=special, parse_special=special)
        if got != want:
            wrong.append(f"{text!r}: reflex {got} llama.cpp {want}")
    assert not wrong, f"{len(wrong)} of {len(CORPUS)} texts differ ({mode}):\n" + "\n".join(wrong)


@pytest.mark.oracle
def test_corpus_exercises_the_splits(vocab_file):
    """The corpus reaches what distinguishes deepseek-v3: digits in threes, kanji and kana in one
    piece, a BOS added with add_special, and special tokens parsed only when asked."""
    extra = [m.replace(" ", "") for m in DIGIT_MERGES]
    t123, t456 = (102400 + extra.index(t) for t in ("123", "456"))
    seven = _llama_tokenize(vocab_file, "7", False, False)
    assert len(seven) == 1
    assert _llama_tokenize(vocab_file, "1234567", False, False) == [t123, t456, seven[0]]
    # a kanji joins the katakana and the hiragana after it (one CJK / kana piece), not across a space
    kyo_ta, hon_no = (102400 + len(DIGIT_MERGES) + i for i in range(len(KANA_MERGES)))
    assert _llama_tokenize(vocab_file, "本の京タ", False, False) == [hon_no, kyo_ta]
    assert kyo_ta not in _llama_tokenize(vocab_file, "京 タ", False, False)
    assert _llama_tokenize(vocab_file, "Hi", True, False)[0] == BOS
    eos_text = "<\uff5cend\u2581of\u2581sentence\uff5c>"
    assert _llama_tokenize(vocab_file, eos_text, False, True) == [EOS]
    assert EOS not in _llama_tokenize(vocab_file, eos_text, False, False)
