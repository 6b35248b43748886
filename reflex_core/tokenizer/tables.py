"""The prompt-scoped path's tables as plain data, their on-disk form, and the structures that
serve them.

``export_tables`` turns what the prompt-scoped BPE needs -- the token types, the added tokens,
the vocabulary size k (the NORMAL tokens, wherever they lie) and merge count m, where each
token and merge string lies in the GGUF, the runs that say which merge makes which token
(prompt_scoped: one run for Qwen and DeepSeek) and an open-addressing bytes -> id table over
the vocabulary -- into a dict of ints, bytes and tuples. ``dumps`` / ``loads`` give it a fixed
binary form (a cache stores it without looking inside: reflex_core.gguf_index); ``loads``
bounds every count and length by the bytes present and ``fits`` checks the tables against the
file they claim to describe, so that a damaged or forged copy is refused before use rather
than trusted. ``import_tables`` serves them back over
the same file's mmap: ``Strings`` (a string array's elements as bytes, from one copy of its
span) and ``VocabTable`` (bytes -> id in a few microseconds, without building a dict of 152k
entries; every lookup is bounded and checks the id it reads).
"""

from __future__ import annotations

import struct
import zlib
from array import array
from itertools import accumulate, chain, islice, starmap
from operator import add, le, lt, sub
from typing import Any, NamedTuple, Sequence

from .vocab import TT_BYTE, TT_CONTROL, TT_NORMAL, TT_UNKNOWN, TT_USER_DEFINED, normal_spans

# Longest probe sequence a table may have. Linear probing at load <= 1/2 keeps chains short
# (Qwen3's 151,643 tokens: 26); the bound makes a lookup's cost fixed whatever a table holds.
MAX_PROBE = 256

_MAGIC = b"RXTB"
_VERSION = 2  # of the binary form (dumps / loads); 2: the merge runs, k NORMAL tokens anywhere
_HEAD = struct.Struct("<4sBB")  # magic, version, fast
_U32 = struct.Struct("<I")
_FAST = struct.Struct("<IIIII")  # k, m, kb, probe, number of added tokens
_ADDED = struct.Struct("<IBI")  # id, is CONTROL, text length
_SPAN = struct.Struct("<QQI")  # lo, hi, number of strings
_EMPTY = b"\xff" * 4  # an empty table slot (-1)


def export_tables(*, tb: bytes, added: list[tuple[int, str, bool]], k: int,
                  tokens: Sequence[bytes], tokens_at: int, merges: Sequence[bytes],
                  merges_at: int | None, runs: tuple[array, array]) -> dict:
    """The tables of a vocabulary the prompt-scoped path serves. ``tokens`` / ``merges``: the
    strings' exact bytes; ``*_at``: the file offset where each array's elements start; ``k``:
    the number of NORMAL tokens (the BPE vocabulary); ``runs``: (first token, first rank) of
    each run of merges (prompt_scoped.PromptScopedBPE)."""
    spans = normal_spans(tb)
    table, mask, probe = _build_table(tokens, chain.from_iterable(starmap(range, spans)), k)
    if probe > MAX_PROBE:  # a vocabulary crafted to collide: the dict in from_gguf serves it
        return refusal(f"the bytes -> id table has a probe sequence of {probe} (> {MAX_PROBE})")
    return {
        "fast": True, "k": k, "m": len(merges), "tb": tb, "added": added,
        "kb": max((max(map(len, tokens[a:b])) for a, b in spans), default=0),
        "tokens": _pack(tokens_at, tokens), "merges": _pack(merges_at or 0, merges),
        "table": table.tobytes(), "mask": mask, "probe": probe,
        "runs": (runs[0].tobytes(), runs[1].tobytes()),
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
    runs: tuple[array, array]  # (first token, first rank) of each run of merges


def import_tables(mm: Any, t: Any, n: int) -> Served | None:
    """The tables ``t`` served over ``mm`` (the file they were exported from, with ``n``
    tokens); None when they are a refusal, malformed, or do not fit."""
    try:
        if not t.get("fast"):
            return None
        tb, k, m, added = t["tb"], t["k"], t["m"], [tuple(a) for a in t["added"]]
        tokens = Strings(mm, t["tokens"])
        merges = Strings(mm, t["merges"])
        runs = _u32s(t["runs"][0]), _u32s(t["runs"][1])
        if (len(tb) != n or len(tokens) != n or not 0 <= k <= n or len(merges) < m
                or not _runs_fit(*runs, m, n)):
            return None
        tb = bytes(tb)
        return Served(tb, added, k, m, t["kb"], tokens, merges,
                      VocabTable(t["table"], t["mask"], t["probe"], tokens, n, tb), runs)
    except (AttributeError, KeyError, TypeError, ValueError, IndexError):
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


def _u32s(data: Any) -> array:
    a = array("I")
    a.frombytes(data)
    return a


def _runs_fit(tok: array, rank: array, m: int, n: int) -> bool:
    """Whether runs (first token, first rank) can describe m merges of a vocabulary of n
    tokens: they start at rank 0, ranks rise, and each run's tokens end before the next
    run's first (so token ids rise with the ranks) and within the vocabulary."""
    if len(tok) != len(rank) or (m == 0) != (len(rank) == 0):
        return False
    if not rank:
        return True
    if rank[0] != 0 or not all(map(lt, rank, islice(rank, 1, None))) or rank[-1] >= m:
        return False
    ends = map(add, tok, map(sub, islice(rank, 1, None), rank))  # each run but the last
    return all(map(le, ends, islice(tok, 1, None))) and tok[-1] + m - rank[-1] <= n


def _table_size(k: int) -> int:
    return 1 << max(4, (2 * k).bit_length())  # load <= 1/2


def _build_table(raw: Sequence[bytes], ids: Any, k: int) -> tuple[array, int, int]:
    """Open addressing (linear probing) over the k ``ids`` keyed by crc32 of the token's
    bytes, and the longest probe sequence it takes to find one of them. The texts are distinct
    (the prompt-scoped path requires it)."""
    size = _table_size(k)
    mask = size - 1
    table = array("i", [-1]) * size
    crc = zlib.crc32
    longest = 1 if k else 0
    for t in ids:
        h = crc(raw[t]) & mask
        d = 1
        while table[h] != -1:
            h = (h + 1) & mask
            d += 1
        table[h] = t
        if d > longest:
            longest = d
    return table, mask, longest


# ----------------------------------------------------------------------------------------------
# The binary form


def dumps(t: dict) -> bytes:
    """``t`` (from export_tables or refusal) as bytes, for ``loads``."""
    if not t["fast"]:
        reason = t["reason"].encode("utf-8", "replace")
        return _HEAD.pack(_MAGIC, _VERSION, 0) + _U32.pack(len(reason)) + reason
    tb, added = t["tb"], t["added"]
    out = [_HEAD.pack(_MAGIC, _VERSION, 1),
           _FAST.pack(t["k"], t["m"], t["kb"], t["probe"], len(added)), _U32.pack(len(tb)), tb]
    for i, text, ctl in added:
        b = text.encode("utf-8")
        out += [_ADDED.pack(i, 1 if ctl else 0, len(b)), b]
    for lo, hi, rel, lens in (t["tokens"], t["merges"]):
        out += [_SPAN.pack(lo, hi, len(lens) // 4), rel, lens]
    run_tok, run_rank = t["runs"]
    out += [_U32.pack(t["mask"]), t["table"], _U32.pack(len(run_tok) // 4), run_tok, run_rank]
    return b"".join(out)


class _Cursor:
    """Reads a buffer front to back; ValueError (the caller's "malformed") on any read past
    its end, so no count or length taken from the data can allocate more than is there."""

    def __init__(self, data: memoryview):
        self.data, self.pos = data, 0

    def take(self, n: int) -> memoryview:
        if not 0 <= n <= len(self.data) - self.pos:
            raise ValueError("past the end")
        self.pos += n
        return self.data[self.pos - n:self.pos]

    def unpack(self, s: struct.Struct) -> tuple:
        return s.unpack(self.take(s.size))


def loads(data: Any) -> dict | None:
    """The tables ``dumps`` wrote (a dict as export_tables / refusal make; the string offsets and
    lengths as memoryviews of ``data``); None when ``data`` is not exactly that."""
    try:
        c = _Cursor(memoryview(data).cast("B"))
        magic, version, fast = c.unpack(_HEAD)
        if magic != _MAGIC or version != _VERSION or fast not in (0, 1):
            return None
        if not fast:
            t = refusal(str(c.take(c.unpack(_U32)[0]), "utf-8"))
        else:
            k, m, kb, probe, n_added = c.unpack(_FAST)
            tb = bytes(c.take(c.unpack(_U32)[0]))
            added = []
            for _ in range(n_added):  # each takes >= 9 bytes: the data bounds the loop
                i, ctl, n = c.unpack(_ADDED)
                if ctl > 1:
                    return None
                added.append((i, str(c.take(n), "utf-8"), ctl == 1))
            spans = []
            for _ in range(2):
                lo, hi, count = c.unpack(_SPAN)
                spans.append((lo, hi, c.take(4 * count), c.take(4 * count)))
            mask = c.unpack(_U32)[0]
            if mask + 1 != _table_size(k):
                return None
            table = bytes(c.take(4 * (mask + 1)))
            n_runs = c.unpack(_U32)[0]
            runs = (bytes(c.take(4 * n_runs)), bytes(c.take(4 * n_runs)))
            t = {"fast": True, "k": k, "m": m, "tb": tb, "added": added, "kb": kb,
                 "tokens": spans[0], "merges": spans[1], "table": table, "mask": mask,
                 "probe": probe, "runs": runs}
        return t if c.pos == len(c.data) else None
    except (ValueError, TypeError, struct.error, UnicodeDecodeError):
        return None


# ----------------------------------------------------------------------------------------------
# Checks against the file


def fits(t: dict, g: Any) -> bool:
    """Whether the tables ``t`` (from ``loads``) can describe the parsed GGUF ``g``: the token
    and merge strings span exactly the file's arrays (inside its metadata) and the counts agree;
    k, the added tokens and their texts agree with the token types and the file; the merge runs
    cover the merges in rising token order within the vocabulary; the table has the size k
    implies, a bounded probe sequence and an empty slot. Cheap: no pass over the vocabulary.
    Not seen here: where inside the token array each id's bytes are, which id each slot holds,
    and which token each merge makes -- a forged copy can hide or alias tokens, but every
    lookup is bounded and checks the id and its bytes, so none can crash, loop or read outside
    the arrays."""
    if not t["fast"]:
        return True
    try:
        md, mm = g.metadata, g.mm
        src, msrc = md["tokenizer.ggml.tokens"], md.get("tokenizer.ggml.merges")
        n, k, m, tb = len(src), t["k"], t["m"], t["tb"]
        lo, hi, rel, lens = t["tokens"]
        spans = [(lo, hi), t["merges"][:2]]
        want = [g.array_span("tokenizer.ggml.tokens"),
                g.array_span("tokenizer.ggml.merges") or (0, 0)]
        if spans != want or max(hi, spans[1][1]) > g.data_offset:
            return False
        if len(tb) != n or len(lens) != 4 * n or len(t["merges"][3]) != 4 * m:
            return False
        if m != (len(msrc) if msrc is not None else 0) or m > k:
            return False
        # k: the NORMAL tokens, when the BPE vocabulary is exactly those (bpe_vocab)
        if k != tb.count(TT_NORMAL) or tb.count(TT_UNKNOWN) or tb.count(TT_BYTE):
            return False
        if not _runs_fit(_u32s(t["runs"][0]), _u32s(t["runs"][1]), m, n):
            return False
        if not 0 <= t["kb"] <= hi - lo or not 1 <= t["probe"] <= MAX_PROBE:
            return False
        for a, b, r, ln in (t["tokens"], t["merges"]):
            if ln and (_U32.unpack_from(r, 0)[0] != 8
                       or _U32.unpack_from(r, len(r) - 4)[0] + _U32.unpack_from(ln, len(ln) - 4)[0]
                       != b - a):
                return False
        if [(i, ctl) for i, _, ctl in t["added"]] != _added_ids(tb):
            return False
        for i, text, _ in t["added"]:
            p = lo + _U32.unpack_from(rel, 4 * i)[0]
            if mm[p:p + _U32.unpack_from(lens, 4 * i)[0]] != text.encode("utf-8"):
                return False
        # An empty slot (-1) exists. Every other slot holds an id < 2^24 (top byte 0), so in a
        # table as exported the first run of four 0xff bytes is a slot (find: -1 % 4 == 3).
        return t["table"].find(_EMPTY) % 4 == 0
    except (AttributeError, KeyError, TypeError, ValueError, IndexError, struct.error):
        return False


def _added_ids(tb: bytes) -> list[tuple[int, bool]]:
    """(id, is CONTROL) of the tokens whose type makes them added tokens, in id order (memchr
    per token found: ~30 us for Qwen3, where a regex over the 152k types takes ~1 ms)."""
    out = []
    for tt in (TT_CONTROL, TT_USER_DEFINED):
        c, i = bytes((tt,)), tb.find(bytes((tt,)))
        while i >= 0:
            out.append((i, tt == TT_CONTROL))
            i = tb.find(c, i + 1)
    out.sort()
    return out


# ----------------------------------------------------------------------------------------------
# Serving


class Strings(Sequence):
    """A string array's elements as bytes, served from one copy of its span of the file."""

    __slots__ = ("_blob", "_rel", "_lens")

    def __init__(self, mm: Any, packed: tuple):
        lo, hi, rel, lens = packed
        if not 0 <= lo <= hi:
            raise ValueError("inconsistent tables")
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
        return self._blob[p:p + self._lens[i]]  # a bad offset gives short bytes, never a read past


class VocabTable:
    """bytes -> token id over the BPE vocabulary, as a dict's ``get``: ids below ``k`` and,
    given the token types ``tb``, only NORMAL ones. A lookup probes at most ``probe`` slots and
    takes an id only when it is one of those and its token's bytes are the key, so no table
    content can make it loop, read outside ``raw`` or lie."""

    __slots__ = ("_t", "_mask", "_probe", "_raw", "_k", "_tb")

    def __init__(self, table: Any, mask: int, probe: int, raw: Strings, k: int,
                 tb: bytes | None = None):
        self._t = array("i")
        self._t.frombytes(table)
        if (len(self._t) != mask + 1 or not 0 <= k <= len(raw) or not 1 <= probe <= MAX_PROBE
                or tb is not None and len(tb) < k):
            raise ValueError("inconsistent tables")
        self._mask, self._probe, self._raw, self._k, self._tb = mask, probe, raw, k, tb

    def get(self, key: bytes, default: Any = None) -> Any:
        t, mask = self._t, self._mask
        h = zlib.crc32(key) & mask
        i = t[h]
        if i < 0:  # the common case first, without the loop's set-up (a hot path: ~0.7 us)
            return default
        raw, k, tb = self._raw, self._k, self._tb
        if i < k and raw[i] == key and (tb is None or tb[i] == TT_NORMAL):
            return i
        for _ in range(self._probe - 1):
            h = (h + 1) & mask
            i = t[h]
            if i < 0:
                return default
            if i < k and raw[i] == key and (tb is None or tb[i] == TT_NORMAL):
                return i
        return default

    def __contains__(self, key: bytes) -> bool:
        return self.get(key) is not None
