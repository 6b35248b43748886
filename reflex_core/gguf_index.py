"""A GGUF file's index: its parse and its tokenizer's tables, cached on disk per file.

Why: in Python, reading a Qwen3 GGUF's directory means walking 152k token strings and 151k
merges (to find where the arrays end), and the tokenizer needs a bytes -> id table over the
whole vocabulary and a check of every merge. That is ~250 ms of GIL-bound work per process
on the H200 machine's CPU -- the longest chain of the cold start, longer than the CUDA
driver's start. None of it depends on the prompt, so it is done once per file and kept, the
way Python keeps ``.pyc`` files: the next process maps the index and looks tokens up in an
open-addressing table (a few microseconds each) without building anything.

Keyed by the file's identity (real path, size, mtime in ns, inode, device) and checked against
its content (its 24-byte header and a CRC-32 of its first and last MiB, ~2 ms): a file that is
rewritten or replaced does not match its old index, which is then ignored and replaced. An
index that is unreadable, of another format version or inconsistent with the file is ignored
too (the full parse runs). Where: ``$XDG_CACHE_HOME/reflex/index`` (``~/.cache/reflex/index``);
``REFLEX_NO_INDEX=1`` turns the index off (never read, never written).

When written: a process that parsed a file the slow way schedules its index; the CLI writes
it after the command's output is flushed -- in the detached exit child when there is one (so
the caller does not wait), else just before exiting. ``write_pending()`` does it.

Stdlib only (marshal, zlib, array): this module is on the cold path.
"""

from __future__ import annotations

import marshal
import os
import weakref
import zlib
from array import array
from itertools import accumulate
from typing import Any, Sequence

from .cachedir import cache_root, write_atomic

FORMAT = 2  # bump when the record's layout or meaning changes (2: the content probe)
_pending: list[tuple[Any, os.stat_result]] = []  # (weakref to a GGUFFile, its fstat)
_kept: list[Any] = []  # see keep()


def enabled() -> bool:
    return os.environ.get("REFLEX_NO_INDEX", "") in ("", "0")


def cache_dir() -> str:
    return os.path.join(cache_root(), "index")


def _identity(path: str, st: os.stat_result) -> tuple:
    return (os.path.realpath(path), st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)


def index_file(path: str) -> str:
    real = os.path.realpath(path)
    base = "".join(c if c.isalnum() or c in "-_." else "_" for c in os.path.basename(real))[:80]
    return os.path.join(cache_dir(), f"{base}-{zlib.crc32(real.encode()):08x}.rxi")


def load(path: str, st: os.stat_result) -> dict | None:
    """The index of ``path`` (whose fstat is ``st``) when a valid one is cached, else None."""
    try:
        with open(index_file(path), "rb") as f:
            data = marshal.loads(f.read())
    except (OSError, EOFError, ValueError, TypeError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return None
    if data.get("identity") != _identity(path, st):
        return None
    return data


def schedule(g: Any, st: os.stat_result) -> None:
    """Have ``write_pending`` write the index of the parsed GGUFFile ``g`` (held weakly: a file
    nobody uses any more is skipped, so a library opening many files keeps nothing alive)."""
    _pending[:] = [p for p in _pending if p[0]() is not None and p[0]().path != g.path]
    _pending.append((weakref.ref(g), st))


def keep(g: Any) -> None:
    """Hold ``g`` until the process ends (the CLI's one-shot jobs: the file's index is written
    at exit, after the job's objects are gone)."""
    _kept.append(g)


def pending() -> bool:
    return any(p[0]() is not None for p in _pending)


def write_pending() -> None:
    """Write the index of every file parsed the slow way in this process (best effort: a
    read-only cache or a file closed meanwhile just means no index)."""
    while _pending:
        ref, st = _pending.pop()
        g = ref()
        if g is None or g._mm is None:
            continue
        try:
            record = build(g, st)
        except Exception:  # noqa: BLE001 - an index is an optimisation, never an error
            continue
        save(g.path, record)


def save(path: str, record: dict) -> None:
    write_atomic(index_file(path), marshal.dumps(record))


def build(g: Any, st: os.stat_result) -> dict:
    """The index record of the open GGUFFile ``g``: its parse and, when it has a tokenizer the
    prompt-scoped path can serve, the tables that path needs."""
    from .gguf import index_record

    return {"format": FORMAT, "identity": _identity(g.path, st), "gguf": index_record(g),
            "tok": _tokenizer_record(g)}


# ----------------------------------------------------------------------------------------------
# tokenizer tables


def _tokenizer_record(g: Any) -> dict | None:
    model = g.get("tokenizer.ggml.model")
    if model in (None, "none", "no_vocab"):
        return None
    from .tokenizer import Tokenizer, _NotFast

    tok = Tokenizer.from_gguf(g, use_index=False)
    try:
        tok._check_fast()
    except _NotFast as e:
        return {"fast": False, "reason": str(e)}
    raw, k = tok._raw, tok._k
    tok_pos = _string_starts(g.layout["tokenizer.ggml.tokens"][1], raw)
    merges = g.get("tokenizer.ggml.merges")
    mraw = merges.raw_list() if merges is not None and len(merges) else []
    mer_pos = (_string_starts(g.layout["tokenizer.ggml.merges"][1], mraw) if mraw
               else (array("Q"), 0, 0))
    table, mask = _build_table(raw, k)
    return {
        "fast": True, "k": k, "m": tok._m, "tb": tok._tb, "added": tok._added,
        "kb": max(map(len, raw[:k]), default=0),
        "tokens": _pack(tok_pos, raw), "merges": _pack(mer_pos, mraw),
        "table": table.tobytes(), "mask": mask,
    }


def _string_starts(blocks: Sequence[tuple], raw: Sequence[bytes]) -> tuple[array, int, int]:
    """File offsets of each string's bytes (after its 8-byte length), from the array's block
    layout and the strings' lengths; plus the span [lo, hi) holding all of them."""
    starts = array("Q")
    i = 0
    for cnt, a, _b, _fast in blocks:
        lens = map(len, raw[i:i + cnt])
        starts.extend(accumulate((8 + n for n in lens), initial=a + 8))
        starts.pop()  # the position after the block's last string
        i += cnt
    lo = blocks[0][1] if blocks else 0
    hi = blocks[-1][2] if blocks else 0
    return starts, lo, hi


def _pack(pos: tuple[array, int, int], raw: Sequence[bytes]) -> tuple:
    starts, lo, hi = pos
    rel = array("I", (s - lo for s in starts))
    lens = array("I", map(len, raw))
    return (lo, hi, rel.tobytes(), lens.tobytes())


def _build_table(raw: Sequence[bytes], k: int) -> tuple[array, int]:
    """Open addressing (linear probing, load <= 1/2) over ids 0..k-1 keyed by crc32 of the
    token's bytes. The texts are distinct (the fast path requires it)."""
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
        self._rel = array("I")
        self._rel.frombytes(rel)
        self._lens = array("I")
        self._lens.frombytes(lens)
        if len(self._rel) != len(self._lens):
            raise ValueError("inconsistent index")

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
            raise ValueError("inconsistent index")
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
