"""A GGUF file's index: its parse and its tokenizer's tables, cached on disk per file.

Why: in Python, reading a Qwen3 GGUF's directory means walking 152k token strings and 151k
merges (to find where the arrays end), and the tokenizer needs a bytes -> id table over the
whole vocabulary and a check of every merge. That is ~250 ms of GIL-bound work per process
on the H200 machine's CPU -- the longest chain of the cold start, longer than the CUDA
driver's start. None of it depends on the prompt, so it is done once per file and kept, the
way Python keeps ``.pyc`` files: the next process maps the index and looks tokens up in an
open-addressing table (a few microseconds each) without building anything.

A record is ``{"format", "identity", "gguf": gguf.parse_record(g), "tok": Tokenizer.tables()}``
(``tok`` None for a file without a tokenizer we can read); the tokenizer's tables are kept as
they come, never looked into here. Keyed by the file's identity (real path, size, mtime in ns,
inode, device) and checked against its content (its 24-byte header and a CRC-32 of its first
and last MiB, ~2 ms): a file that is rewritten or replaced does not match its old index, which
is then ignored and replaced. An index that is unreadable, of another format version or
inconsistent with the file is ignored too (the full parse runs). Where:
``$XDG_CACHE_HOME/reflex/index`` (``~/.cache/reflex/index``); ``REFLEX_NO_INDEX=1`` turns the
index off (never read, never written).

When written: reflex_core.modelfile schedules the index of a file it parsed the slow way; the
CLI has it written after the command's output is flushed, by ``write_pending()`` in this
process or by ``python -m reflex_core.gguf_index PATH...`` (``pending_paths()``) in another.

No third-party imports (marshal, zlib): this module is on the cold path.
"""

from __future__ import annotations

import marshal
import os
import sys
import weakref
import zlib
from typing import Any

from .cachedir import cache_root, write_atomic
from .errors import ReflexError
from .gguf import GGUFFile, from_record, map_file, parse, parse_record

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


def restore(g: GGUFFile, st: os.stat_result) -> dict | None:
    """Fill the fresh (unparsed) ``g``, whose file's fstat is ``st``, from its cached index.
    Returns the record, or None (``g`` untouched: parse it) when there is no valid one."""
    rec = load(g.path, st)
    if rec is None or not from_record(g, rec.get("gguf")):
        return None
    return rec


def build(g: GGUFFile, st: os.stat_result) -> dict:
    """The index record of the parsed GGUFFile ``g``: its parse and, when it has a tokenizer
    we can read, that tokenizer's tables."""
    from .tokenizer import Tokenizer

    try:
        tables = Tokenizer.from_gguf(g).tables()
    except ReflexError:  # no tokenizer, or one we cannot read: the parse alone is worth keeping
        tables = None
    return {"format": FORMAT, "identity": _identity(g.path, st), "gguf": parse_record(g),
            "tok": tables}


def save(path: str, record: dict) -> bool:
    return write_atomic(index_file(path), marshal.dumps(record))


# ----------------------------------------------------------------------------------------------
# Files whose index is written later


def schedule(g: GGUFFile, st: os.stat_result) -> None:
    """Have the index of the parsed GGUFFile ``g`` written later (``write_pending``, or an
    exec'd ``python -m reflex_core.gguf_index`` for ``pending_paths()``). ``g`` is held weakly:
    a file nobody uses any more is skipped, so a library opening many files keeps nothing
    alive (``keep`` holds one on purpose)."""
    _pending[:] = [p for p in _pending if p[0]() is not None and p[0]().path != g.path]
    _pending.append((weakref.ref(g), st))


def keep(g: GGUFFile) -> None:
    """Hold ``g`` until the process ends (the CLI's one-shot jobs: the file's index is written
    at exit, after the job's objects are gone)."""
    _kept.append(g)


def _live() -> list[tuple[GGUFFile, os.stat_result]]:
    out = []
    for ref, st in _pending:
        g = ref()
        if g is not None and not g.closed:
            out.append((g, st))
    return out


def pending() -> bool:
    """Whether a file parsed the slow way in this process (and still open) awaits its index."""
    return bool(_live())


def pending_paths() -> list[str]:
    """The paths of the files ``pending()`` is about, for ``python -m reflex_core.gguf_index``."""
    return [g.path for g, _ in _live()]


def write_pending() -> None:
    """Write, in this process, the index of every file parsed the slow way in it (best effort:
    a read-only cache or a file closed meanwhile just means no index)."""
    live = _live()
    _pending.clear()
    for g, st in live:
        try:
            record = build(g, st)
        except Exception:  # noqa: BLE001 - an index is an optimisation, never an error
            continue
        save(g.path, record)


# ----------------------------------------------------------------------------------------------
# python -m reflex_core.gguf_index PATH...


def refresh(path: str) -> None:
    """Write the index of the GGUF at ``path`` unless a valid one is cached (GGUFError for a
    file that is not a readable GGUF)."""
    if not enabled():
        return
    mm, st = map_file(path)
    g = GGUFFile(path, mm)
    try:
        if restore(g, st) is None:
            parse(g)
            save(path, build(g, st))
    finally:
        g.close()


def main(argv: list[str]) -> int:
    """(Re)write the index of each path where it is missing or stale; silent, and exit
    status 0 whatever happens: a process exiting after its output hands this its pending
    paths (fork + exec), and nobody reads its output or waits for it."""
    for path in argv:
        try:
            refresh(path)
        except BaseException:  # noqa: BLE001 - an index is an optimisation, never an error
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
