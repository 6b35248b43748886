"""Reflex's tokenizer against llama.cpp's own tokenizer test vectors.

llama.cpp ships, per pre-tokenizer type, a vocab-only GGUF (``models/ggml-vocab-NAME.gguf``)
with inputs (``.inp``) and the ids its tokenizer must produce (``.out``); its
``tests/test-tokenizer-0.cpp`` checks them with add_special = false and parse_special = false.
scripts/test.sh extracts those files from the llama-cpp-python sdist (the oracle's version) and
points REFLEX_LLAMA_VOCAB_DIR at them. Without them the test fails (never skips): CI must run it.

File format (as test-tokenizer-0.cpp reads it): the .inp holds the cases, each followed by the
line ``__ggml_vocab_test__``; the .out has one line per case, its ids separated by spaces (an
empty line: no tokens).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

from reflex_core.gguf import open_gguf
from reflex_core.modelfile import load_tokenizer

ENV = "REFLEX_LLAMA_VOCAB_DIR"
# The pre types we support that llama.cpp ships vectors for; the file name is the pre type.
VOCABS = ("qwen35", "qwen2", "deepseek-llm", "deepseek-coder", "gpt-2")
# "auto": the default (prompt-scoped BPE where it can serve, else the full one);
# "full": REFLEX_TOKENIZER=full, the full Hugging Face BPE for every text.
MODES = ("auto", "full")
_SEP = "\n__ggml_vocab_test__\n"


def _vocab_path(name: str) -> Path:
    return Path(os.environ.get(ENV, "")) / f"ggml-vocab-{name}.gguf"


def _missing() -> str | None:
    """Why the vectors cannot be read (None: all there)."""
    root = os.environ.get(ENV)
    if not root:
        return (f"{ENV} is not set: run scripts/test.sh, or point it at llama.cpp's models/ "
                f"directory (vendor/llama.cpp/models in the llama-cpp-python 0.3.36 sdist)")
    absent = [f"{_vocab_path(name)}{ext}" for name in VOCABS for ext in ("", ".inp", ".out")
              if not Path(f"{_vocab_path(name)}{ext}").is_file()]
    return f"{ENV}={root} lacks " + ", ".join(absent) if absent else None


def _read_cases(name: str) -> list[tuple[str, list[int]]]:
    """(input text, expected ids) of each case, in file order."""
    gguf = _vocab_path(name)
    # Bytes, not text mode: some inputs hold "\r" that newline translation would change.
    raw = Path(f"{gguf}.inp").read_bytes().decode("utf-8")
    out_lines = Path(f"{gguf}.out").read_bytes().decode("utf-8").split("\n")
    if out_lines[-1] == "":
        out_lines.pop()
    texts = raw.split(_SEP)
    if texts[-1] == "":  # the last case is followed by the marker too
        texts.pop()
    if len(texts) != len(out_lines):
        raise AssertionError(f"{gguf}: {len(texts)} inputs but {len(out_lines)} output lines")
    return [(text, [int(t) for t in line.split()]) for text, line in zip(texts, out_lines)]


def _params() -> list:
    why = _missing()
    if why is not None:
        return [pytest.param(None, None, None, None, why, id="vectors-missing")]
    return [pytest.param(name, mode, text, ids, None, id=f"{name}-{mode}-{i:02d}-{text[:24]!r}")
            for name in VOCABS for i, (text, ids) in enumerate(_read_cases(name))
            for mode in MODES]


@functools.lru_cache(maxsize=None)
def reflex_tokenizer(path: str, mode: str):
    """Reflex's tokenizer of ``path``: "auto" (the default paths) or "full" (REFLEX_TOKENIZER=full,
    the full Hugging Face BPE for every text); one a (path, mode) for the process."""
    with pytest.MonkeyPatch.context() as mp:
        if mode == "full":
            mp.setenv("REFLEX_TOKENIZER", "full")
        else:
            mp.delenv("REFLEX_TOKENIZER", raising=False)
        return load_tokenizer(open_gguf(path))


def _tokenizer(name: str, mode: str):
    tok = reflex_tokenizer(str(_vocab_path(name)), mode)
    # The file's pre type is the one this vector set is meant to test.
    assert tok.pre == name, f"{_vocab_path(name)} declares pre = {tok.pre!r}"
    return tok


@pytest.mark.parametrize("name, mode, text, expected, missing", _params())
def test_encodes_as_llama_cpp(name, mode, text, expected, missing):
    if missing is not None:
        pytest.fail(f"llama.cpp's vocab test vectors are required: {missing}", pytrace=False)
    tok = _tokenizer(name, mode)
    ids = tok.encode(text, add_special=False, parse_special=False)
    assert ids == expected, f"{name} ({mode}, {tok.last_path} path) encodes {text!r} differently"
    # Byte-level BPE loses nothing and these pre types normalize none of these inputs away.
    assert tok.decode(ids) == text
