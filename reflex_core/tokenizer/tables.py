"""The prompt-scoped path's tables as plain data, and the structures that serve them.

``export_tables`` turns what the prompt-scoped BPE needs -- the token types, the added tokens,
the vocabulary size k and merge count m, where each token and merge string lies in the GGUF,
and an open-addressing bytes -> id table over the vocabulary -- into a dict of ints, bytes and
tuples (marshal-able). ``import_tables`` serves them back over the same file's mmap:
``Strings`` (a string array's elements as bytes, from one copy of its span) and ``VocabTable``
(bytes -> id in a few microseconds, without building a dict of 152k entries). A cache keeps the
dict without looking inside (reflex_core.gguf_index); only this package reads it.
"""

from __future__ import annotations

import zlib
from array import array
from itertools import accumulate
from typing import Any, NamedTuple, Sequence


def export_tables(*, tb: bytes, added: list[tuple[int, str, bool]], k: int,
                  tokens: Sequence[bytes], tokens_at: int, merges: Sequence[bytes],
                  merges_at: int | None) -> dict:
    """The tables of a vocabulary the prompt-scoped path serves. ``tokens`` / ``merges``: the
    strings' exact bytes; ``*_at``: the file offset where each array's elements start."""
    table, mask = _build_table(tokens, k)
    return {
        "fast": True, "k": k, "m": len(merges), "tb": tb, "added": added,
        "kb": max(map(len, tokens[:k]), default=0),
        "tokens": _pack(tokens_at, tokens), "merges": _pack(merges_at or 0, merges),
        "table": table.tobytes(), "mask": mask,
    }


def refusal(reason: str) -> dict:
    """The tables of a vocabulary the prompt-scoped path cannot serve: only why."""
    return {"fast": False, "reason": reason}


class Served(NamedTuple):
    tb: bytes
    added: list[tuple[int, str, bool]]
    k: int
    m: int
    kb: int
    tokens: "Strings"
    merges: "Strings"
    vocab: "VocabTable"


def import_tables(mm: Any, t: Any, n: int) -> Served | None:
    """The tables ``t`` served over ``mm`` (the file they were exported from, with ``n``
    tokens); None when they are a refusal, malformed, or do not fit."""
    try:
        if not t.get("fast"):
            return None
        tb, k, m, added = t["tb"], t["k"], t["m"], [tuple(a) for a in t["added"]]
        tokens = Strings(mm, t["tokens"])
        merges = Strings(mm, t["merges"])
        if len(tb) != n or len(tokens) != n or not 0 <= k <= n or len(merges) < m:
            return None
        return Served(tb, added, k, m, t["kb"], tokens, merges,
                      VocabTable(t["table"], t["mask"], tokens, k))
    except (AttributeError, KeyError, TypeError, ValueError):
        return None


def _pack(at: int, raw: Sequence[bytes]) -> tuple:
    """(lo, hi, offsets from lo, lengths) of strings stored back to back from file offset
    ``at``, each as its u64 length then its bytes; [lo, hi) spans them all."""
    if not raw:
        return (0, 0, b"", b"")
    lens = array("I", map(len, raw))
    rel = array("I", accumulate((8 + n for n in lens), initial=8))
    rel.pop()  # the position after the last string
    return (at, at + rel[-1] + lens[-1], rel.tobytes(), lens.tobytes())


def _build_table(raw: Sequence[bytes], k: int) -> tuple[array, int]:
    """Open addressing (linear probing, load <= 1/2) over ids 0..k-1 keyed by crc32 of the
    token's bytes. The texts are distinct (the prompt-scoped path requires it)."""
    size = 1 << max(4, (2 * k).bit_length())
    mask = size - 1
    table = array("i", [-1]) * size
    crc = zlib.crc32
    for t in range(k):
        h = crc(raw[t]) & mask
        while table[h] != -1:
            h = (h + 1) & mask
        table[h] = t
    return table, mask


class Strings(Sequence):
    """A string array's elements as bytes, served from one copy of its span of the file."""

    __slots__ = ("_blob", "_rel", "_lens")

    def __init__(self, mm: Any, packed: tuple):
        lo, hi, rel, lens = packed
        self._blob = mm[lo:hi]  # a copy: valid after the file is closed
        if len(self._blob) != hi - lo:
            raise ValueError("tables past the end of the file")
        self._rel = array("I")
        self._rel.frombytes(rel)
        self._lens = array("I")
        self._lens.frombytes(lens)
        if len(self._rel) != len(self._lens):
            raise ValueError("inconsistent tables")

    def __len__(self) -> int:
        return len(self._lens)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self._lens)))]
        p = self._rel[i]
        return self._blob[p:p + self._lens[i]]


class VocabTable:
    """bytes -> token id over ids 0..k-1 (the BPE vocabulary), as a dict's ``get``."""

    __slots__ = ("_t", "_mask", "_raw", "_k")

    def __init__(self, table: bytes, mask: int, raw: Strings, k: int):
        self._t = array("i")
        self._t.frombytes(table)
        if len(self._t) != mask + 1:
            raise ValueError("inconsistent tables")
        self._mask, self._raw, self._k = mask, raw, k

    def get(self, key: bytes, default: Any = None) -> Any:
        t, mask, raw = self._t, self._mask, self._raw
        h = zlib.crc32(key) & mask
        while True:
            i = t[h]
            if i < 0:
                return default
            if raw[i] == key:
                return i
            h = (h + 1) & mask

    def __contains__(self, key: bytes) -> bool:
        return self.get(key) is not None

    def __len__(self) -> int:
        return self._k
