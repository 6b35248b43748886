"""A GGUF file's index: what its parse and its tokenizer cost, cached on disk per file.

Why: in Python, reading a Qwen3 GGUF's directory means walking 152k token strings and 151k
merges (to find where the arrays end), and the tokenizer needs a bytes -> id table over the
whole vocabulary and a check of every merge. That is ~250 ms of GIL-bound work per process
on the H200 machine's CPU -- the longest chain of the cold start, longer than the CUDA
driver's start. None of it depends on the prompt, so it is done once per file and kept, the
way Python keeps ``.pyc`` files: the next process maps the index and looks tokens up in an
open-addressing table (a few microseconds each) without building anything.

The index is a cache, never an authority. A run never fails or changes its output because of
it: whatever is wrong with one -- unreadable, truncated, damaged, of another format, stale,
forged -- makes it a miss (the full parse runs), and it is deleted and written again.

- What it holds: where the file's string arrays lie (``gguf.parse_record``: ``gguf.from_record``
  reads everything else from the file again, with the reader's checks) and the tokenizer's
  tables (``tokenizer.tables.dumps``: checked against the file by ``tables.fits`` before use,
  and bounded in every lookup). Nothing else is taken from it.
- Identity: the model's real path, size, mtime (ns), inode and device, and a CRC-32 of every
  byte the index was derived from: the file's header, metadata and tensor directory, i.e.
  ``[0, data_offset)`` (5.95 MB for Qwen3-0.6B: ~1.4 ms on a 2-core dev VM). A file rewritten in
  place with its size and mtime kept no longer matches.
- Integrity: a CRC-32 of the whole index, so random damage (any single bit flip, a truncation)
  is a miss before anything in it is read.
- Format: a fixed binary layout (``_HEAD`` then ``_BODY``, then the model's path and the two
  sections), every length checked against the bytes present; no marshal or pickle.
- Forged indexes (their CRC recomputed by someone who can write the cache directory) meet the
  same checks. What those cannot see -- where inside a string array each block or token lies,
  which id each table slot holds -- a forger could misstate, changing a prompt's ids, never the
  parse, and never making a run crash, loop or read out of bounds. The directory is the user's
  own (reflex_core.cachedir), as ``__pycache__`` is.
- Reading: the index path is lstat'ed and must be a regular file of at most
  ``MAX_INDEX_BYTES``, then opened with O_NOFOLLOW | O_NONBLOCK and fstat'ed again before one
  byte is read; a symlink, FIFO or device there is refused (and removed) without reading it.

Where: ``$XDG_CACHE_HOME/reflex/index`` (``~/.cache/reflex/index``); ``REFLEX_NO_INDEX=1``
turns the index off (never read, never written).

Prebuilt indexes (``reflex index MODEL [--out DIR]``, ``write_prebuilt``): a fresh container
has an empty user cache, so every run there would be a file's first. An index made once where
the model is put (an image layer, a volume) is found by the cold path before the user cache:
``$REFLEX_INDEX_DIR/NAME.rxi``, then ``MODEL.rxi`` beside the file. Its identity cannot be the
user cache's (the path, mtime and inode differ in every copy), so it is the bytes it derives
from: the model's size and the region's length and CRC-32 -- the CRC a user-cache hit computes
anyway, so a prebuilt hit costs what a cached one does. A stale or foreign one is a miss (never
deleted: it is not ours, and often on a read-only volume); one that someone other than root,
us or the model's owner could have written is not used (unless its mount is read-only), since
the folder is not one we checked (``restore_prebuilt``).

When written: reflex_core.modelfile schedules the index of a file it parsed the slow way; the
CLI has it written after the command's output is flushed, by ``write_pending()`` in this
process or by ``python -m reflex_core.gguf_index PATH...`` (``pending_paths()``) in another.
That helper also keeps the directory tidy (``evict``): indexes whose model is gone or changed
are removed, and the oldest go while the directory is over ``MAX_CACHE_BYTES``. Never on the
way to a first token.

No third-party imports (struct, zlib): this module is on the cold path.
"""

from __future__ import annotations

import os
import stat
import struct
import sys
import time
import weakref
import zlib
from typing import Any, NamedTuple

from . import cachedir
from .cachedir import cache_root, write_atomic
from .errors import ReflexError
from .gguf import GGUFFile, from_record, map_file, parse, parse_record

FORMAT = 3  # bump when the layout or meaning changes (3: binary, region CRC, string-array hints)
MAX_INDEX_BYTES = 64 << 20  # an index larger than this is refused unread (Qwen3's: ~4.7 MB)
MAX_CACHE_BYTES = 256 << 20  # evict() keeps the directory under this

_MAGIC = b"RXINDEX\n"
_HEAD = struct.Struct("<8sII")  # magic, FORMAT, CRC-32 of everything after the head
# the model's size, mtime_ns, inode, device; the length and CRC-32 of the region the index was
# derived from; the byte lengths of the model's real path, the parse record and the tables
# (the last + 1; 0: no tables)
_BODY = struct.Struct("<QqQQQIIII")
_MAX_PATH = 1 << 16
_OPEN = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) \
    | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)

_pending: list[tuple[Any, os.stat_result]] = []  # (weakref to a GGUFFile, its fstat)
_kept: list[Any] = []  # see keep()


class Record(NamedTuple):
    model: bytes  # the model's real path (os.fsencode)
    stat: tuple  # the model's (size, mtime_ns, inode, device)
    region: tuple  # (length, CRC-32) of the model's bytes the index was derived from
    gguf: Any  # gguf.parse_record
    tok: Any  # the tokenizer's tables: tables.dumps() bytes; after restore(), the decoded dict


def enabled() -> bool:
    return os.environ.get("REFLEX_NO_INDEX", "") in ("", "0")


INDEX_DIR = "index"  # below the cache root


def cache_dir() -> str:
    return os.path.join(cache_root(), INDEX_DIR)


def _stat_key(st: os.stat_result) -> tuple:
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)


def _index_path(real: str) -> str:
    base = "".join(c if c.isalnum() or c in "-_." else "_" for c in os.path.basename(real))[:80]
    return os.path.join(cache_dir(), f"{base}-{zlib.crc32(os.fsencode(real)):08x}.rxi")


def index_file(path: str) -> str:
    return _index_path(os.path.realpath(path))


def _region_crc(mm: Any, n: int) -> int:
    with memoryview(mm) as mv, mv[:n] as region:  # released: the mapping can still be closed
        return zlib.crc32(region)


# ----------------------------------------------------------------------------------------------
# The file format


def encode(rec: Record) -> bytes:
    tok = b"" if rec.tok is None else rec.tok
    body = b"".join((_BODY.pack(*rec.stat, *rec.region, len(rec.model), len(rec.gguf),
                                0 if rec.tok is None else len(tok) + 1),
                     rec.model, rec.gguf, tok))
    return _HEAD.pack(_MAGIC, FORMAT, zlib.crc32(body)) + body


def decode(data: Any) -> Record | None:
    """The Record ``encode`` wrote (its sections as memoryviews of ``data``); None unless
    ``data`` is exactly one, of this FORMAT, with its CRC."""
    data = memoryview(data).cast("B")
    if len(data) < _HEAD.size + _BODY.size:
        return None
    magic, fmt, crc = _HEAD.unpack_from(data, 0)
    if magic != _MAGIC or fmt != FORMAT or zlib.crc32(data[_HEAD.size:]) != crc:
        return None
    *st, rlen, rcrc, n_path, n_gguf, n_tok = _BODY.unpack_from(data, _HEAD.size)
    a = _HEAD.size + _BODY.size
    b, c = a + n_path, a + n_path + n_gguf
    if n_path > _MAX_PATH or c + max(n_tok - 1, 0) != len(data):
        return None
    return Record(bytes(data[a:b]), tuple(st), (rlen, rcrc), data[b:c],
                  data[c:] if n_tok else None)


def _open_regular(fn: str, limit: int) -> tuple[int, os.stat_result] | None:
    """A read-only descriptor of the index file ``fn`` and its fstat, if it is a regular file of
    at most ``limit`` bytes; None when there is none. OSError when something else is there or
    it cannot be opened. Never opens a symlink (O_NOFOLLOW), never blocks on a FIFO or device
    (lstat first, O_NONBLOCK, fstat again once open)."""
    try:
        st = os.lstat(fn)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
        raise OSError(f"{fn}: not a regular file of at most {limit} bytes")
    fd = os.open(fn, _OPEN)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            raise OSError(f"{fn}: not a regular file of at most {limit} bytes")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _read_fd(fd: int, fn: str, n: int) -> bytearray:
    buf = bytearray(n)
    with memoryview(buf) as mv:
        got = 0
        while got < n:
            k = os.readv(fd, [mv[got:]])
            if k == 0:
                raise OSError(f"{fn}: shorter than its size")  # truncated meanwhile
            got += k
    return buf


def _read(fn: str, limit: int, size: int | None = None) -> bytearray | None:
    """The first ``size`` bytes (all when None) of the index file ``fn`` (see _open_regular);
    None when there is none, OSError when something else is there or it cannot be read."""
    opened = _open_regular(fn, limit)
    if opened is None:
        return None
    fd, st = opened
    try:
        return _read_fd(fd, fn, st.st_size if size is None else min(size, st.st_size))
    finally:
        os.close(fd)


def _discard(fn: str) -> None:
    """Remove a bad index (best effort: the next write replaces it anyway)."""
    try:
        os.unlink(fn)
    except OSError:
        pass


def load(path: str, st: os.stat_result) -> Record | None:
    """The index of ``path`` (whose fstat is ``st``) when one is cached, intact, of this FORMAT
    and made for this very file (path, size, mtime, inode, device), else None; one that is
    there but fails any of this is deleted. Its region's CRC is restore()'s to check."""
    if cachedir.cache_dir(INDEX_DIR, create=False) is None:  # missing, or not safe to trust
        return None
    real = os.path.realpath(path)
    return _load(_index_path(real), real, st)


def _load(fn: str, real: str, st: os.stat_result) -> Record | None:
    try:
        data = _read(fn, MAX_INDEX_BYTES)
    except OSError:
        _discard(fn)
        return None
    if data is None:
        return None
    rec = decode(data)
    if rec is None or rec.model != os.fsencode(real) or rec.stat != _stat_key(st):
        _discard(fn)
        return None
    return rec


def restore(g: GGUFFile, st: os.stat_result) -> Record | None:
    """Fill the fresh (unparsed) ``g``, whose file's fstat is ``st``, from its cached index.
    Returns the Record (``tok``: the tokenizer's tables, decoded and checked against the file,
    or None), or None (``g`` untouched: parse it; a bad index is deleted) when there is no
    valid one."""
    try:
        return _restore(g, st)
    except Exception:  # noqa: BLE001 - a cache never fails a run (e.g. an unusable cache dir)
        return None


def _restore(g: GGUFFile, st: os.stat_result) -> Record | None:
    real = os.path.realpath(g.path)
    fn = _index_path(real)
    rec = _load(fn, real, st)
    if rec is None:
        return None
    out = _apply(g, rec)
    if out is None:
        _discard(fn)
    return out


def _apply(g: GGUFFile, rec: Record) -> Record | None:
    """Fill the fresh ``g`` from ``rec`` when ``rec`` was derived from the very bytes ``g`` maps
    (the region's length and CRC-32, then the parse with the record's hints, then the tables
    checked against the parsed file); the Record with its tables decoded, or None (``g``
    untouched)."""
    n, crc = rec.region
    tables = None

    def accept(h: GGUFFile) -> bool:
        nonlocal tables
        if h.data_offset != n:
            return False
        if rec.tok is None:
            return True
        from .tokenizer.tables import fits, loads

        tables = loads(rec.tok)
        return tables is not None and fits(tables, h)

    if n > g.file_size or _region_crc(g.mm, n) != crc or not from_record(g, rec.gguf, accept):
        return None
    return rec._replace(tok=tables)


def build(g: GGUFFile, st: os.stat_result) -> Record:
    """The index record of the parsed GGUFFile ``g`` (whose file's fstat was ``st``): where its
    string arrays lie and, when it has a tokenizer we can read, that tokenizer's tables.
    ReflexError when the file changed since ``st`` (its index would describe other bytes)."""
    from .tokenizer import Tokenizer
    from .tokenizer.tables import dumps

    try:
        tables = dumps(Tokenizer.from_gguf(g).tables())
    except ReflexError:  # no tokenizer, or one we cannot read: the parse alone is worth keeping
        tables = None
    region = (g.data_offset, _region_crc(g.mm, g.data_offset))
    # The region's CRC is taken now, not when g was parsed: the file must not have changed in
    # between (a rewrite that also restores the mtime within that window is not caught).
    try:
        now = _stat_key(os.stat(g.path))
    except OSError:
        now = None
    if now != _stat_key(st):
        raise ReflexError(f"{g.path} changed since it was parsed")
    return Record(os.fsencode(os.path.realpath(g.path)), _stat_key(st), region, parse_record(g),
                  tables)


def save(path: str, record: Record, create_dirs: bool = True) -> bool:
    """Write ``record`` as the index of ``path``. ``create_dirs`` False: only into a cache
    directory that exists (the detached writer must not bring back one the user deleted)."""
    data = encode(record)
    if len(data) > MAX_INDEX_BYTES:  # it would never be read: keep the parse's part alone
        data = encode(record._replace(tok=None))
    return write_atomic(index_file(path), data, create_dirs=create_dirs)


# ----------------------------------------------------------------------------------------------
# Prebuilt indexes (``reflex index``): made once, carried with the model


PREBUILT_SUFFIX = ".rxi"
PREBUILT_DIR_ENV = "REFLEX_INDEX_DIR"  # a folder of prebuilt indexes, looked at first


def prebuilt_paths(path: str) -> list[str]:
    """Where the cold path looks for a prebuilt index of the model at ``path``, in order:
    ``$REFLEX_INDEX_DIR/NAME.rxi`` (NAME: the model's file name), then ``PATH.rxi`` beside
    it. A folder holding several models' indexes keys them by file name alone: two models of
    one name need two folders (the wrong one is a miss, never used)."""
    beside = path + PREBUILT_SUFFIX
    folder = os.environ.get(PREBUILT_DIR_ENV)
    if not folder:
        return [beside]
    named = os.path.join(folder, os.path.basename(path) + PREBUILT_SUFFIX)
    return [named] if os.path.abspath(named) == os.path.abspath(beside) else [named, beside]


def _trusted(st: os.stat_result, model: os.stat_result, read_only: bool) -> str | None:
    """Why a prebuilt index with fstat ``st`` must not be used for the model with fstat
    ``model``, or None. It is trusted as far as the model beside it: owned by root, by us or by
    the model's owner, and writable by nobody else -- or on a read-only mount (a volume mounted
    read-only), where nobody can change it. Otherwise someone who cannot change the model
    could still plant an index for it."""
    if read_only:
        return None
    if st.st_uid not in (0, os.geteuid(), model.st_uid):
        return f"owned by uid {st.st_uid}, neither root, this user nor the model's owner"
    if st.st_mode & 0o022:
        return f"writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _read_prebuilt(fn: str, model: os.stat_result) -> tuple[Record | None, str | None]:
    """(the decoded prebuilt index ``fn``, None), or (None, why it is not used), or
    (None, None) when there is none."""
    try:
        opened = _open_regular(fn, MAX_INDEX_BYTES)
    except OSError:
        return None, "not a readable regular file"
    if opened is None:
        return None, None
    fd, st = opened
    try:
        try:
            read_only = bool(os.fstatvfs(fd).f_flag & os.ST_RDONLY)
        except OSError:
            read_only = False
        why = _trusted(st, model, read_only)
        if why is not None:
            return None, why
        data = _read_fd(fd, fn, st.st_size)
    except OSError:
        return None, "not a readable regular file"
    finally:
        os.close(fd)
    rec = decode(data)
    if rec is None:
        return None, "not an index of this format"
    if rec.stat[0] != model.st_size:
        return None, "made for a file of another size"
    return rec, None


def restore_prebuilt(g: GGUFFile, st: os.stat_result) -> tuple[Record | None, str | None]:
    """Fill the fresh ``g`` (its file's fstat: ``st``) from a prebuilt index (``prebuilt_paths``).

    Identity: the model's size, and the region's length and CRC-32 -- the bytes the index was
    derived from -- never its path, mtime, inode or device, which differ wherever the model was
    copied (an image layer, a volume). That CRC is what a user-cache hit computes too: no cost
    beyond it. Returns (the Record, its file); or (None, "FILE: why it was not used") for the
    first one there that was not (stale, foreign, untrusted, damaged), or (None, None) when
    there is none. A prebuilt index is never deleted or rewritten here: it is not ours."""
    ignored = None
    for fn in prebuilt_paths(g.path):
        try:
            rec, why = _read_prebuilt(fn, st)
            if rec is not None:
                rec = _apply(g, rec)
                if rec is not None:
                    return rec, fn
                why = "made from other bytes (a stale or foreign index)"
        except Exception:  # noqa: BLE001 - an index never fails a run
            why = "unusable"
        if why is not None and ignored is None:
            ignored = f"{fn}: {why}"
    return None, ignored


def write_prebuilt(path: str, out_dir: str | None = None) -> tuple[str, int, bool]:
    """Write the prebuilt index of the GGUF at ``path``: ``PATH.rxi`` beside it, or
    ``OUT_DIR/NAME.rxi`` (``out_dir`` created when missing; runs find it with
    ``REFLEX_INDEX_DIR=OUT_DIR``). Returns (the index file, its size, whether it holds the
    tokenizer's tables). GGUFError for a file that is not a readable GGUF; ReflexError (one
    line) when the index cannot be written, or a run would not use it (its folder's mount or
    owner).

    The file depends only on the model's name and bytes (no folder, mtime or inode in it), so
    an image layer holding it is reproducible; it is mode 0644 whatever the umask, so another
    user of the image can read it."""
    mm, st = map_file(path)
    g = GGUFFile(path, mm)
    try:
        parse(g)
        rec = build(g, st)
    finally:
        g.close()
    rec = rec._replace(model=os.fsencode(os.path.basename(path)), stat=(st.st_size, 0, 0, 0))
    data = encode(rec)
    if len(data) > MAX_INDEX_BYTES:  # it would never be read: keep the parse's part alone
        rec = rec._replace(tok=None)
        data = encode(rec)
    if out_dir is None:
        fn = path + PREBUILT_SUFFIX
    else:
        fn = os.path.join(out_dir, os.path.basename(path) + PREBUILT_SUFFIX)
    try:
        if out_dir is not None:
            os.makedirs(out_dir, exist_ok=True)
        _write_public(fn, data)
    except OSError as e:
        raise ReflexError(f"cannot write the index {fn}: {e.strerror or e}; give --out DIR, a "
                          f"folder you can write, and run with {PREBUILT_DIR_ENV}=DIR") from None
    # What the cold path will do with it: refused here, it would be refused there too.
    got, why = _read_prebuilt(fn, os.stat(path))
    if got is None:
        raise ReflexError(f"wrote {fn}, but runs would not use it: {why}")
    return fn, len(data), rec.tok is not None


def _write_public(fn: str, data: bytes) -> None:
    """Write ``fn`` (mode 0644) through a temporary file and a rename: a run started meanwhile
    sees the old index or the whole new one. Synced: it is made once and shipped."""
    folder, name = os.path.split(os.path.abspath(fn))
    tmp = os.path.join(folder, f".{name[:100]}.{os.urandom(8).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, 0o644)  # the umask may have taken the others' read bit
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, fn)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# ----------------------------------------------------------------------------------------------
# Eviction (the index helper's, never on the way to a first token)


def _model_of(fn: str) -> tuple[bytes, tuple] | None:
    """(the model's real path, its stat key) from the head of the index file ``fn``; None when
    ``fn`` is not one of this FORMAT. OSError as _read."""
    data = _read(fn, MAX_INDEX_BYTES, _HEAD.size + _BODY.size + _MAX_PATH)
    if data is None or len(data) < _HEAD.size + _BODY.size:
        return None
    magic, fmt, _ = _HEAD.unpack_from(data, 0)
    if magic != _MAGIC or fmt != FORMAT:
        return None
    *st, _, _, n_path, _, _ = _BODY.unpack_from(data, _HEAD.size)
    a = _HEAD.size + _BODY.size
    if a + n_path > len(data):
        return None
    return bytes(data[a:a + n_path]), tuple(st)


def _gone(model: bytes, key: tuple) -> bool:
    """Whether the model an index was made for no longer exists as it was."""
    try:
        return _stat_key(os.stat(model)) != key
    except (FileNotFoundError, NotADirectoryError, ValueError):  # ValueError: a NUL in the path
        return True
    except OSError:  # e.g. no permission now: not evidence that it is gone
        return False


_TEMP_AGE_S = 3600  # a writer's temp file older than this was left by a killed process


def _stale_temp(e: os.DirEntry) -> bool:
    """A temporary file of cachedir.write_atomic that its writer never renamed (SIGKILL, power
    cut): hidden, ``.tmp``, and old."""
    if not (e.name.startswith(".") and e.name.endswith(".tmp")):
        return False
    try:
        return time.time() - e.stat(follow_symlinks=False).st_mtime > _TEMP_AGE_S
    except OSError:
        return False


def evict(keep: frozenset[str] = frozenset(), max_bytes: int | None = None) -> None:
    """Tidy the index directory: remove what is not a regular file, indexes of another format,
    of a model that is gone or changed, then the oldest (by mtime) while the indexes total more
    than ``max_bytes`` (MAX_CACHE_BYTES). ``keep``: index files never removed for size (those
    just written). Best effort: errors only mean less is removed."""
    limit = MAX_CACHE_BYTES if max_bytes is None else max_bytes
    folder = cachedir.cache_dir(INDEX_DIR, create=False)
    if folder is None:
        return
    try:
        with os.scandir(folder) as it:
            entries = [e for e in it if e.name.endswith(".rxi") or _stale_temp(e)]
    except OSError:
        return
    live = []
    for e in entries:
        try:
            st = e.stat(follow_symlinks=False)
            model = _model_of(e.path) if stat.S_ISREG(st.st_mode) else None
        except OSError:
            model = None
        if model is None or e.name.endswith(".tmp") or _gone(*model):
            _discard(e.path)
        else:
            live.append((st.st_mtime_ns, e.path, st.st_size))
    total = sum(size for _, _, size in live)
    for _, fn, size in sorted(live):
        if total <= limit:
            break
        if fn not in keep:
            _discard(fn)
            total -= size


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
            save(g.path, build(g, st))
        except Exception:  # noqa: BLE001 - an index is an optimisation, never an error
            continue


# ----------------------------------------------------------------------------------------------
# python -m reflex_core.gguf_index PATH...


def refresh(path: str, create_dirs: bool = True) -> str | None:
    """Write the index of the GGUF at ``path`` unless a valid one is cached (GGUFError for a
    file that is not a readable GGUF). Returns the index file when there is one now.
    ``create_dirs``: as :func:`save`."""
    if not enabled():
        return None
    mm, st = map_file(path)
    g = GGUFFile(path, mm)
    try:
        if restore(g, st) is not None:
            return index_file(path)
        parse(g)
        return index_file(path) if save(path, build(g, st), create_dirs) else None
    finally:
        g.close()


def main(argv: list[str]) -> int:
    """(Re)write the index of each path where it is missing or stale, then tidy the directory
    (``evict``); silent, and exit status 0 whatever happens: a process exiting after its output
    hands this its pending paths (fork + exec), and nobody reads its output or waits for it."""
    written = set()
    for path in argv:
        try:
            fn = refresh(path, create_dirs=False)  # after the command: never re-create the dir
        except BaseException:  # noqa: BLE001 - an index is an optimisation, never an error
            continue
        if fn is not None:
            written.add(fn)
    if enabled():
        try:
            evict(frozenset(written))
        except BaseException:  # noqa: BLE001
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
