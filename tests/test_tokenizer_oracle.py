"""Reflex's tokenizer against llama.cpp's ``llama_tokenize`` on llama.cpp's own vocab files, over
texts built at random from a pool of pieces that reach every branch of the pre-tokenizers
(contractions, digit runs, punctuation runs, every kind of whitespace, CJK, kana, Hangul,
combining marks, emoji sequences, special-token texts) plus hand-picked ones.

test_vocab_vectors.py checks llama.cpp's fixed vectors; these texts go where the vectors do not,
for example the ideographic space U+3000 beside other whitespace: llama.cpp runs deepseek-llm's
regexes that have no ``\\p{..}`` class through ``std::wregex`` with every non-ASCII whitespace
character replaced by a vertical tab, so U+3000 counts as ``\\s`` and never as the literal
``\\u3000`` of regex 3's class (nor as a member of regex 5's range ``\\u0800-\\u4E00``).

The random draws take any code point (surrogates aside): the regexes' categories are llama.cpp's
own table (tests/test_unicode_classes.py), so a character that Unicode assigned after it (an
Emoji 16 face, an Egyptian hieroglyph of Unicode 16) splits as in llama.cpp too. One known
difference is left out of the comparison: for qwen2 (Qwen3's files) Reflex applies NFC first, as
Qwen's own tokenizer.json does and DESIGN.md asks (llama.cpp applies no normalizer), so llama.cpp
gets the NFC form of the text.

Without llama-cpp-python or REFLEX_LLAMA_VOCAB_DIR (which scripts/test.sh fills) these tests
fail, never skip.
"""

from __future__ import annotations

import os
import random
import unicodedata
from pathlib import Path

import pytest

from reflex_core.testing import oracle
from test_tokenizer_deepseek_v3 import _byte_level, write_derived_vocab
from test_vocab_vectors import reflex_tokenizer

pytestmark = pytest.mark.oracle

ENV = "REFLEX_LLAMA_VOCAB_DIR"
VOCABS = ("qwen2", "qwen35", "deepseek-llm", "deepseek-coder", "gpt-2")
N_RANDOM = 400

POOL = (
    "a", "Z", "hello", "World", "the", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\r",
    "\u00a0", "\u2003", "\u2009", "\u1680", "\u3000", "\u3000\u3000", "\u205f", "\u0085", "0", "12",
    "123", "4567", "3.14", "1,000", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL",
    "\u2019s", "!", "?", ".", ",", "...", "\u2014", "--", "__init__", "(", ")", "[", "]", "{", "}",
    "<", ">", "/", "\\", "|", "@", "#", "$", "%", "^", "&", "*", "+", "=", "~", "`", '"', "'", ";",
    ":", "\u3001", "\u3002", "\uff01", "\u00e9", "\u00f1", "\u00df", "\u03a9", "\u03b1\u03b2",
    "\u041c\u043e\u0441\u043a\u0432\u0430", "\u4e2d", "\u4e2d\u6587", "\u65e5\u672c\u8a9e",
    "\u3053\u3093\u306b\u3061\u306f", "\u30ab\u30bf\u30ab\u30ca", "\ud55c\uad6d\uc5b4",
    "\u0e44\u0e17\u0e22", "\u0627\u0644\u0639\u0631\u0628\u064a\u0629", "\u0939\u093f\u0928\u094d\u0926\u0940",
    "\u0661\u0662", "\u00b2", "\u00bd", "\u216b", "\u2460", "\U0001f642", "\U0001f44d\U0001f3fd",
    "\U0001f468\u200d\U0001f469\u200d\U0001f467", "\U0001f1eb\U0001f1f7", "e\u0301", "a\u0308",
    "\u200b", "\ufeff", "\ufb01", "\uff21", "\uff11\uff12", "<|im_start|>", "<|im_end|>",
    "<|endoftext|>", "<think>", "<\uff5cbegin\u2581of\u2581sentence\uff5c>", "\u2581", "\u0120",
    "\x7f", "\x1b[0m", "http://x.y/z?q=1", "CamelCase", "snake_case", "i++", "def f(x):",
    "    return",
)

HAND = (
    "   \u3000",  # regex 4 (\s+$) keeps the four together in llama.cpp
    "a   \u3000b", "\u3000\u3000\u7b2c\u4e00\u7ae0", "\u4e2d\u3000\u6587", "x \u3000 y",
    "\u4f60\u597d\u2003\u4e16\u754c", "\u30a2\u3000\u30a4", "\u4e2d\u1680\u6587", "!\u3000?",
    " \u3001 \u3002", "\u3000", "  \u2009\u2009 end",
    # assigned in Unicode 16, after llama.cpp's table (15.1): an emoji, a Garay letter, a hieroglyph
    "hello \U0001fae9!", "a \U0001fac6.", "x \U00010d4a's", "\U00014175'thello", " \u1c89abc",
)


def corpus(seed: int) -> list[str]:
    r = random.Random(seed)
    texts = list(HAND)
    while len(texts) < len(HAND) + N_RANDOM:
        parts = []
        for _ in range(r.randint(1, 12)):
            if r.random() < 0.15:
                lo, hi = r.choice(((0x20, 0x7e), (0xa0, 0x2fff), (0x3000, 0x9fff),
                                   (0x1f300, 0x1faff), (0x10000, 0x2ffff)))
                parts.append(chr(r.randint(lo, hi)))
            else:
                parts.append(r.choice(POOL))
        texts.append("".join(parts))
    return texts


def _vocab_path(name: str) -> Path:
    root = os.environ.get(ENV)
    if not root:
        pytest.fail(f"{ENV} is not set: run scripts/test.sh, or point it at llama.cpp's models/ "
                    f"directory (vendor/llama.cpp/models in the llama-cpp-python 0.3.36 sdist)",
                    pytrace=False)
    path = Path(root) / f"ggml-vocab-{name}.gguf"
    if not path.is_file():
        pytest.fail(f"{ENV}={root} lacks {path.name}", pytrace=False)
    return path


def llama_tokenize(path: Path, text: str, special: bool) -> list[int]:
    return oracle.llama_tokenize(path, text, add_special=special, parse_special=special)


def assert_encodes_as_llama_cpp(path: Path, tok, texts, what: str,
                                specials=(False, True), nfc: bool = False) -> None:
    """``tok`` encodes every one of ``texts`` as llama.cpp does with ``path``'s vocabulary, with
    add_special = parse_special = each of ``specials``; ``nfc``: llama.cpp gets the NFC form
    (Reflex normalizes first for qwen2, llama.cpp does not)."""
    wrong = []
    for text in texts:
        theirs = unicodedata.normalize("NFC", text) if nfc else text
        for special in specials:
            want = llama_tokenize(path, theirs, special)
            got = tok.encode(text, add_special=special, parse_special=special)
            if got != want:
                wrong.append(f"{text!r} (special {special}): reflex {got} llama.cpp {want}")
    assert not wrong, (f"{len(wrong)} of {len(specials) * len(texts)} encodings differ "
                       f"({what}):\n" + "\n".join(wrong[:20]))


@pytest.mark.parametrize("mode", ["auto", "full"])
@pytest.mark.parametrize("name", VOCABS)
def test_encodes_as_llama_cpp(name, mode):
    path = _vocab_path(name)
    tok = reflex_tokenizer(str(path), mode)
    assert_encodes_as_llama_cpp(path, tok, corpus(seed=VOCABS.index(name)), f"{name}, {mode}",
                                nfc=name == "qwen2")


def test_the_corpus_reaches_the_whitespace_rules():
    """The hand texts hold what made deepseek-llm differ: U+3000 after ASCII spaces at a
    piece's end (llama.cpp: one whitespace run), and the Unicode spaces of regex 5's range."""
    path = _vocab_path("deepseek-llm")
    spaces3 = llama_tokenize(path, "   ", False)
    assert len(spaces3) == 1
    assert llama_tokenize(path, "   \u3000", False)[0] == spaces3[0]
    assert sum(ch in HAND[i] for i in range(len(HAND)) for ch in "\u2003\u1680\u2009") >= 3


# Appended merges that join a CJK character with a Unicode space of regex 5's range: they apply
# only where one piece holds both (the tokenizers regex engine would keep them in one piece).
SPACE_MERGES = (("\u4e2d", "\u3000"), ("\u2003", "\u6587"), ("\u30a2", "\u2009"))


@pytest.fixture(scope="module")
def space_merge_vocab(tmp_path_factory) -> Path:
    return write_derived_vocab(tmp_path_factory.mktemp("vocab") / "deepseek-llm-spaces.gguf",
                               "deepseek-llm",
                               [f"{_byte_level(a)} {_byte_level(b)}" for a, b in SPACE_MERGES])


@pytest.mark.parametrize("mode", ["auto", "full"])
def test_unicode_spaces_split_from_cjk_as_llama_cpp(space_merge_vocab, mode):
    tok = reflex_tokenizer(str(space_merge_vocab), mode)
    texts = ["\u4e2d\u3000\u6587", "\u4e2d\u2003\u6587", "\u30a2\u2009\u30a4", "x\u4e2d\u3000",
             *("".join(p) for p in SPACE_MERGES)]
    for text in texts:
        want = llama_tokenize(space_merge_vocab, text, False)
        assert tok.encode(text, add_special=False, parse_special=False) == want, text
    # llama.cpp never joins them: the appended tokens (ids past the vocabulary) do not appear
    n = len(tok.encode("\u4e2d", add_special=False, parse_special=False))
    assert n == 1 and all(t < 102400 for x in texts for t in llama_tokenize(space_merge_vocab, x, False))
