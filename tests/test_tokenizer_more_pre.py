"""Pre types llama.cpp ships no vectors for, against llama.cpp's own tokenization: ``glm4``
(GLM-4.5 / 4.7 vocabularies; GLM-4.7-Flash is a deepseek2 file), ``kanana2`` / ``gpt-4o``
(GPT-4o's regex; Kanana-2 is a deepseek2 "lite" file), ``tekken`` (Mistral-Large-3's, a
deepseek2 file; a BOS by default), ``kimi-k2`` (Kimi-K2's and Moonlight's deepseek2 files: Han
runs apart from other letters), ``gigachat`` (GPT-2's regex; GigaChat3 is
one too) and the names llama.cpp reads as qwen2 (``kormo``, ``f2llmv2``: F2LLM-v2 is a qwen3
file).

llama.cpp ships no vectors for ``glm4``, so as for deepseek-v3 (test_tokenizer_deepseek_v3.py)
this writes a vocab-only GGUF with that pre type over a real byte-level BPE vocabulary (llama.cpp's
``ggml-vocab-qwen2.gguf``: GLM's is of the same kind) plus:

* merges that make digit grouping visible (qwen2's vocabulary has no multi-digit token): glm4
  takes digits in runs of up to three, qwen2 one by one;
* tokens no merge makes ("ignore merges": llama.cpp emits a piece that is a token as that token
  without running the merges, as GLM's own tokenizer does);
* no ``bos_token_id`` key: glm4 then has no BOS, where other BPE vocabularies default to 11.

The others: qwen2's vocabulary (gigachat: GPT-2's) under each name. Compared over
test_tokenizer_oracle.py's random corpus and hand texts, with add_special /
parse_special off and on. Without llama-cpp-python or REFLEX_LLAMA_VOCAB_DIR the tests fail,
never skip.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from reflex_core.testing import oracle
from test_tokenizer_deepseek_v3 import DIGIT_MERGES, _byte_level, write_derived_vocab
from test_tokenizer_oracle import assert_encodes_as_llama_cpp, corpus
from test_vocab_vectors import reflex_tokenizer

pytestmark = pytest.mark.oracle

EOS = 151643  # qwen2's <|endoftext|>
N_QWEN2 = 151936
# whole pieces no merge reaches: with a space in front (a word) and alone
ALONE = ("zqxjv", " zqxjv", " Hellozqx")


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory) -> Path:
    return write_derived_vocab(tmp_path_factory.mktemp("vocab") / "ggml-vocab-glm4.gguf", "glm4",
                               list(DIGIT_MERGES), source="ggml-vocab-qwen2.gguf", bos=None,
                               eos=EOS, add_bos=False,
                               tokens_alone=tuple(_byte_level(t) for t in ALONE))


HAND = ("1234567", "a1b22c333d4444", "x=12345678;", "zqxjv", "a zqxjv b", " Hellozqx!",
        "Hellozqx", "\u0661\u0662\u0663\u0664", "\u00bd\u00b2 12", "don't STOP'LL", "\n\n  x  ")


@pytest.mark.parametrize("mode", ["auto", "full"])
def test_encodes_as_llama_cpp(vocab_file, mode):
    tok = reflex_tokenizer(str(vocab_file), mode)
    assert tok.pre == "glm4"
    assert_encodes_as_llama_cpp(vocab_file, tok, list(HAND) + corpus(seed=7), f"glm4, {mode}")


def test_the_texts_reach_what_glm4_changes(vocab_file):
    """Digits go in threes, a piece that is a token skips the merges, and there is no BOS: on
    llama.cpp's side, so the comparison above covers each."""
    extra = [m.replace(" ", "") for m in DIGIT_MERGES]
    t123, t456 = (N_QWEN2 + extra.index(t) for t in ("123", "456"))
    seven = oracle.llama_tokenize(vocab_file, "7")
    assert oracle.llama_tokenize(vocab_file, "1234567") == [t123, t456, seven[0]]
    alone = {t: N_QWEN2 + len(DIGIT_MERGES) + i for i, t in enumerate(ALONE)}
    assert oracle.llama_tokenize(vocab_file, "a zqxjv b")[1] == alone[" zqxjv"]
    assert oracle.llama_tokenize(vocab_file, "zqxjv") == [alone["zqxjv"]]
    assert oracle.llama_bos(vocab_file) is None
    tok = reflex_tokenizer.__wrapped__(str(vocab_file), "auto")  # a fresh one
    assert tok.bos_id is None and tok.eos_id == EOS
    # the prompt-scoped BPE serves it (the comparison above ran on it in "auto" until the many
    # texts made the full build the cheaper path)
    assert tok.encode("a zqxjv b") == oracle.llama_tokenize(vocab_file, "a zqxjv b")
    assert tok.last_path == "fast", tok.fast_reason


@pytest.mark.parametrize("pre", ["kormo", "f2llmv2"])
def test_qwen2_names_encode_as_llama_cpp(tmp_path, pre):
    """As qwen2 (NFC first, as for qwen2: test_tokenizer_oracle.py says why)."""
    path = write_derived_vocab(tmp_path / f"ggml-vocab-{pre}.gguf", pre, [],
                               source="ggml-vocab-qwen2.gguf", bos=EOS, eos=EOS, add_bos=False)
    tok = reflex_tokenizer(str(path), "auto")
    assert tok.pre == pre
    assert_encodes_as_llama_cpp(path, tok, corpus(seed=8)[:150], pre, specials=(True,), nfc=True)


# the look-ahead classes of GPT-4o's regex: case runs, a capital inside a word, contractions
# after either case, letters outside ASCII (neither a-z nor A-Z), marks, digits in threes
GPT4O_HAND = ("HelloWorld", "HTTPServer", "iPhone", "camelCaseWord", "ALLCAPS's", "don'T",
              "WE'LL go", "\u00c9cole \u00e9t\u00e9", "\u00dcBER\u00fcber", "a\u0301b\u0301C",
              "\u0391\u03b8\u03ae\u03bd\u03b1", "x1234567y", "path/to/file\n\n", "  A  b  ",
              # Han against other letters (kimi-k2): runs, inside words, after a leading character,
              # kana and Hangul (letters, not Han), an extension-B character, a contraction after Han
              "Hello\u4e16\u754c", "\u4e2d\u6587abc", " \u4e2d", "!\u4e2d\u6587", "x\u4e2dy",
              "\u3053\u3093\u306b\u3061\u306f\u4e16\u754c", "\ud55c\uad6d\uc5b4 \u4e2d",
              "\U00020000\U00020001a", "\u4e2d's", "\uf900\u3400x", "it's\u4e2d")


@pytest.mark.parametrize("pre,source,add_bos", [("kanana2", "ggml-vocab-qwen2.gguf", False),
                                                ("gpt-4o", "ggml-vocab-qwen2.gguf", False),
                                                ("tekken", "ggml-vocab-qwen2.gguf", None),
                                                ("kimi-k2", "ggml-vocab-qwen2.gguf", False),
                                                ("gigachat", "ggml-vocab-gpt-2.gguf", False)])
@pytest.mark.parametrize("mode", ["auto", "full"])
def test_other_regexes_encode_as_llama_cpp(tmp_path, pre, source, add_bos, mode):
    """add_bos None: no key (tekken adds a BOS by default)."""
    eos = EOS if "qwen2" in source else 50256
    path = write_derived_vocab(tmp_path / f"ggml-vocab-{pre}.gguf", pre, [], source=source,
                               bos=eos, eos=eos, add_bos=add_bos)
    tok = reflex_tokenizer(str(path), mode)
    assert tok.pre == pre
    assert_encodes_as_llama_cpp(path, tok, list(GPT4O_HAND) + corpus(seed=9), f"{pre}, {mode}")


def test_glm4_served_from_tables(vocab_file):
    """What the file's index keeps (``tables()``) serves glm4 as the file does: the skipped
    merges and the missing BOS come back from the tables."""
    from reflex_core.gguf import open_gguf
    from reflex_core.tokenizer import Tokenizer, tables

    g = open_gguf(str(vocab_file))
    t = Tokenizer.from_gguf(g).tables()
    assert t["fast"] is True
    served = Tokenizer.from_tables(g, tables.loads(tables.dumps(t)))
    assert served is not None and served.bos_id is None
    for text in HAND:
        assert served.encode(text) == oracle.llama_tokenize(vocab_file, text), text
        assert served.last_path == "fast"
