"""The Unicode categories of the pre-tokenizer regexes are llama.cpp's.

reflex_core/tokenizer/unicode_classes.py (written by scripts/gen_unicode_classes.py) must hold
exactly the L, N, M, P and S code points of llama.cpp's own table (``src/unicode-data.cpp`` of
the llama-cpp-python 0.3.36 sdist, which scripts/test.sh unpacks into REFLEX_LLAMA_VOCAB_DIR),
and the regex engine of ``tokenizers`` must match a class written from it on exactly those code
points, whatever Unicode version the engine itself knows (0.23 knows 16.0, llama.cpp 15.1: a
new emoji, a letter of a script added since, would otherwise split differently). Without the
table the test fails, never skips.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from reflex_core.tokenizer import pretokenizers
from reflex_core.tokenizer.unicode_classes import CLASSES

GEN = Path(__file__).resolve().parent.parent / "scripts" / "gen_unicode_classes.py"
CODE_POINTS = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]


def _generator():
    spec = importlib.util.spec_from_file_location("gen_unicode_classes", GEN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _table_text() -> str:
    root = os.environ.get("REFLEX_LLAMA_VOCAB_DIR")
    path = Path(root or "") / "unicode-data.cpp"
    if not root or not path.is_file():
        pytest.fail(f"llama.cpp's unicode-data.cpp is required (REFLEX_LLAMA_VOCAB_DIR={root!r}; "
                    f"scripts/test.sh unpacks it from the llama-cpp-python sdist)", pytrace=False)
    return path.read_text()


def _members(cat: str) -> set[int]:
    out: set[int] = set()
    for r in CLASSES[cat].split():
        a, _, b = r.partition("-")
        out.update(range(int(a, 16), int(b or a, 16) + 1))
    return out


def test_the_classes_are_llama_cpps_table():
    gen = _generator()
    rows = gen.read_table(_table_text())
    for cat, bit in gen.BITS.items():
        want = " ".join(f"{a:X}" if a == b else f"{a:X}-{b:X}" for a, b in gen.ranges(rows, bit))
        assert CLASSES[cat] == want, f"{cat}: rerun scripts/gen_unicode_classes.py"


@pytest.mark.parametrize("cat", sorted(CLASSES))
def test_the_regex_engine_matches_exactly_the_class(cat):
    from tokenizers import Regex, pre_tokenizers

    text = "".join(map(chr, CODE_POINTS))
    split = pre_tokenizers.Split(Regex(pretokenizers.llama_categories(r"\p{%s}" % cat)), "removed")
    unmatched = {ord(ch) for piece, _ in split.pre_tokenize_str(text) for ch in piece}
    assert set(CODE_POINTS) - unmatched == _members(cat)


def test_categories_are_spelled_out_inside_and_outside_classes():
    spelled = pretokenizers.llama_categories(r"[^\s\p{L}\p{N}]?\p{L}+|\[\p{N}\]|\p{Han}")
    assert r"\p{L}" not in spelled and r"\p{N}" not in spelled
    assert spelled.startswith(r"[^\s\x41-\x5A\x61-\x7A")  # inside a class: its members
    assert "]?[\\x41-\\x5A" in spelled  # outside one: a class of them
    assert spelled.endswith(r"]\]|\p{Han}")  # escaped brackets and other properties stay
    for pattern in pretokenizers.PRETOKENIZERS.values():
        for r in pattern.regexes:
            assert not any(f"\\p{{{c}}}" in pretokenizers.llama_categories(r) for c in CLASSES)
