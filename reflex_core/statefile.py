"""State files (``--export-kv`` / ``--import-kv``): a job's model state on disk, to resume from.

A file holds one sequence's state (:meth:`reflex_core.state.State.dump`) after the tokens
``tokens`` were fed to the model, and ``pending``: token ids the job was given but has not fed
yet (after ``generate -n N`` the last sampled token; in a prefix file the prompt's last token).
Importing restores the state and feeds ``pending`` + the new prompt as one batch, so a file
never needs logits and a resumed greedy job produces what an uninterrupted one would (a sampled
one draws from a generator seeded afresh: no sampler state is kept, as in llama.cpp's files).

Layout (little-endian; format version 2: version 1's model fingerprints sampled 16 pages of the
whole tensor data, too few to tell a fine-tune from its base)::

    0   8 bytes   magic b"RFXSTATE"
    8   u32       format version
    12  u32       H: header length
    16  u64       D: data length
    24  H bytes   header, UTF-8 JSON (below), padded with spaces to end at a multiple of 64
    24+H  D bytes the buffers' raw bytes, in the header's "data" order, back to back
    24+H+D        checksum: one u32 CRC-32 per CHUNK bytes of [0, 24+H+D), the last chunk short

Header: ``arch``, ``model`` (the model file's fingerprint, not its path: :func:`fingerprint`),
``dtype`` (of the
state buffers), ``backend`` (that wrote it; informational: a file moves between backends),
``n_ctx_train``, ``tokens``, ``pending``, State.dump()'s bookkeeping (``n_cells_used``,
``n_seqs``, ``seqs``, ``buffers``) and ``data``: ``[name, offset, nbytes]`` per buffer, offsets
relative to the data section.

Checksums are per chunk so that a large state (340 MB for 1500 tokens of a 0.6B model) is
checked on a few threads (zlib.crc32 releases the GIL). Every size is checked against the file
size before anything is allocated or parsed; the file is written to a temporary file in the
target's folder (a symlink's file: the link stays), fsync'ed and renamed over the target, so a
reader never sees half a file; a character device or FIFO at the path (``/dev/null``, a pipe) is
written into. Reflex never decides where the file lives and never creates folders.

Stdlib only: this module is on the GPU cold path.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import struct
import zlib
from typing import Any, NamedTuple, Sequence

from .errors import ReflexError

MAGIC = b"RFXSTATE"
FORMAT = 2
CHUNK = 1 << 25  # 32 MiB per CRC
_PREFIX = struct.Struct("<8sIIQ")
_ITEMSIZE = {"f32": 4, "f16": 2, "bf16": 2}
_MAX_HEADER = 1 << 28  # a header is token ids and bookkeeping: far below this
_PAGE = 4096


class Saved(NamedTuple):
    """A state file, read and checked (:func:`read`)."""

    path: str
    header: dict
    dumped: dict  # for State.load
    tokens: list[int]
    pending: list[int]


def fingerprint(g: Any) -> str:
    """The identity of a model file's content, not its path: the size and CRC-32 of
    ``[0, data_offset)`` (header, metadata, tensor directory) and a CRC-32 of every tensor's
    first, middle and last page (a small tensor whole). Files of one layout that differ in
    their weights only -- a fine-tune, a merged LoRA (llama.cpp's export-lora keeps the
    header), another seed -- have the same directory, and their changed tensors differ
    throughout; a few pages a tensor read about 5 MB of an 8B file."""
    crc = getattr(g, "region_crc", None)  # the index computed it when it validated the file
    data_crc = 0
    with memoryview(g.mm) as mv:
        if crc is None:
            with mv[:g.data_offset] as region:
                crc = zlib.crc32(region)
        for ti in sorted(g.tensors.values(), key=lambda t: t.offset):
            end = ti.offset + ti.nbytes
            if ti.nbytes <= 3 * _PAGE:
                spans = [(ti.offset, end)]
            else:
                mid = ti.offset + (ti.nbytes // 2) // _PAGE * _PAGE
                spans = [(a, a + _PAGE) for a in (ti.offset, mid, end - _PAGE)]
            for a, b in spans:
                with mv[a:b] as page:
                    data_crc = zlib.crc32(page, data_crc)
    return f"{g.data_offset}:{crc:08x}:{data_crc:08x}"


# ----------------------------------------------------------------------------------------------
# Checksums


def _chunk_crcs(pieces: Sequence[Any]) -> list[int]:
    """CRC-32 of every CHUNK bytes of the concatenation of ``pieces`` (bytes-like), computed
    on up to 8 threads when there is more than one chunk (zlib.crc32 releases the GIL)."""
    views = [memoryview(p).cast("B") for p in pieces]
    total = sum(len(v) for v in views)
    # each chunk as its list of (view, start, end) segments
    chunks: list[list[tuple[memoryview, int, int]]] = [[] for _ in range((total + CHUNK - 1)
                                                                        // CHUNK)]
    pos = 0
    for v in views:
        a = 0
        while a < len(v):
            k = (pos + a) // CHUNK
            b = min(len(v), (k + 1) * CHUNK - pos)
            chunks[k].append((v, a, b))
            a = b
        pos += len(v)

    def crc(segs: list[tuple[memoryview, int, int]]) -> int:
        c = 0
        for v, a, b in segs:
            c = zlib.crc32(v[a:b], c)
        return c

    if len(chunks) <= 1:
        return [crc(s) for s in chunks]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(8, len(chunks), os.cpu_count() or 1)) as pool:
        return list(pool.map(crc, chunks))


def _trailer_size(n: int) -> int:
    return 4 * ((n + CHUNK - 1) // CHUNK)


# ----------------------------------------------------------------------------------------------
# Writing


def check_target(path: str) -> None:
    """Refuse, before any work is done, an export to ``path`` that cannot succeed: a path that
    no system call takes, a socket, block device or directory at ``path``, or (for a regular
    file, which is replaced) its folder missing or not writable. A character device or a FIFO at
    ``path`` (``/dev/null``, a pipe to a reader) is written into, as llama.cpp's ``fopen``
    would."""
    if "\0" in path:
        raise ReflexError(f"cannot write the state file {path!r}: the path holds a NUL byte")
    try:
        os.fsencode(path)
    except UnicodeEncodeError:
        raise ReflexError(f"cannot write the state file {path!r}: the path is not valid "
                          f"text") from None
    kind = _stream_kind(path)
    if kind is not None:
        if kind != "stream":
            raise ReflexError(f"cannot write the state file {path}: it is a {kind}")
        return
    path = _resolved(path)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ReflexError(f"cannot write the state file {path}: the folder {folder} does not "
                          f"exist")
    if os.path.isdir(path):
        raise ReflexError(f"cannot write the state file {path}: it is a directory")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ReflexError(f"cannot write the state file {path}: the folder {folder} is not "
                          f"writable")


def write(path: str, lm: Any, dumped: dict, tokens: Sequence[int],
          pending: Sequence[int]) -> int:
    """Write ``dumped`` (a one-sequence State.dump) of the loaded model ``lm`` (engine.Loaded)
    with its token ids to ``path``, atomically. Returns the file's size."""
    order = [b[0] for b in dumped["buffers"]]
    blobs = [dumped["data"][name] for name in order]
    data_index, off = [], 0
    for name, blob in zip(order, blobs):
        n = memoryview(blob).nbytes
        data_index.append([name, off, n])
        off += n
    header = {
        "arch": lm.arch, "model": fingerprint(lm.gguf), "lora": list(getattr(lm, "lora", [])),
        "dtype": dumped["dtype"],
        "backend": lm.backend, "n_ctx_train": int(lm.model.n_ctx_train),
        "tokens": [int(x) for x in tokens], "pending": [int(x) for x in pending],
        "n_cells_used": dumped["n_cells_used"], "n_seqs": dumped["n_seqs"],
        "seqs": dumped["seqs"], "buffers": dumped["buffers"], "data": data_index,
    }
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-(_PREFIX.size + len(head)) % 64)  # the data starts 64-byte aligned
    pieces = [_PREFIX.pack(MAGIC, FORMAT, len(head), off), head, *blobs]
    crcs = _chunk_crcs(pieces)
    pieces.append(struct.pack(f"<{len(crcs)}I", *crcs))
    _write_atomic(path, pieces)
    return sum(memoryview(p).nbytes for p in pieces)


_in_flight: set[str] = set()  # temporary files being written


def discard_writes_in_flight() -> None:
    """Remove the temporary files of the writes under way. For a signal handler about to end
    the process with ``os._exit`` (reflex_core.lifecycle): the ``except`` below will not run."""
    for tmp in list(_in_flight):
        try:
            os.unlink(tmp)
        except OSError:
            pass


def _stream_kind(path: str) -> str | None:
    """What is at ``path`` (symlinks followed) when it is no regular file and nothing that is
    missing: "stream" (a character device or FIFO: written into), or a name to refuse it by."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        return "stream"
    if stat.S_ISDIR(mode):
        return "directory"
    return "block device" if stat.S_ISBLK(mode) else "socket" if stat.S_ISSOCK(mode) else \
        "special file"


def _resolved(path: str) -> str:
    """The file a symlink at ``path`` names (so the rename replaces that file, not the link),
    else ``path``."""
    return os.path.realpath(path) if os.path.islink(path) else path


def _write_pieces(fd: int, pieces: Sequence[Any]) -> None:
    for p in pieces:
        view = memoryview(p).cast("B")
        while view:
            view = view[os.write(fd, view):]


def _write_stream(path: str, pieces: Sequence[Any]) -> None:
    """Write into the character device or FIFO at ``path`` (no rename is possible there). A
    FIFO nobody reads is refused at once: a blocking open would wait for a reader forever."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        why = "a FIFO with no reader" if e.errno == errno.ENXIO else e.strerror
        raise ReflexError(f"cannot write the state file {path}: {why}") from None
    try:
        os.set_blocking(fd, True)  # the writes wait for the reader, as a pipe's do
        _write_pieces(fd, pieces)
    except OSError as e:
        raise ReflexError(f"cannot write the state file {path}: {e.strerror}") from None
    finally:
        os.close(fd)


def _write_atomic(path: str, pieces: Sequence[Any]) -> None:
    if _stream_kind(path) == "stream":
        _write_stream(path, pieces)
        return
    path = _resolved(path)
    folder, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(folder, f".{name[:100]}.{os.urandom(8).hex()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o644)
    except OSError as e:
        raise ReflexError(f"cannot write the state file {path}: {e.strerror}") from None
    _in_flight.add(tmp)
    try:
        try:
            _write_pieces(fd, pieces)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as e:  # an interrupt too: no temporary file is left behind
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise ReflexError(f"cannot write the state file {path}: {e.strerror}") from None
        raise
    finally:
        _in_flight.discard(tmp)
    try:  # the rename itself survives a power cut once the folder is on disk
        dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


# ----------------------------------------------------------------------------------------------
# Reading


def read(path: str) -> Saved:
    """The state file ``path``, its sizes, checksum and structure checked (not yet against a
    model: :func:`check_model`). One-line ReflexError naming the file for anything wrong."""
    def bad(what: str) -> ReflexError:
        return ReflexError(f"{path}: {what}")

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO is not waited on
    except OSError as e:
        raise ReflexError(f"cannot read the state file {path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise bad("not a regular file")
        size = st.st_size
        if size < _PREFIX.size:
            raise bad(f"not a Reflex state file ({size} bytes)")
        prefix = os.pread(fd, _PREFIX.size, 0)
        if len(prefix) < _PREFIX.size:
            raise bad("the file shrank while it was read")
        magic, version, hlen, dlen = _PREFIX.unpack(prefix)
        if magic != MAGIC:
            raise bad("not a Reflex state file (bad magic)")
        if version != FORMAT:
            raise bad(f"state file format version {version}; this Reflex reads version {FORMAT}")
        body = _PREFIX.size + hlen + dlen
        if hlen > _MAX_HEADER or body > size or body + _trailer_size(body) != size:
            raise bad(f"truncated or damaged: {size} bytes, the header says "
                      f"{body + _trailer_size(body)}")
        import mmap

        # Mapped, not read: no copy and no zero-filled buffer (the main thread's imports and the
        # CUDA start run beside this). The file is replaced by rename, never rewritten in place;
        # one cut by someone else under us is the map guard's error (reflex_core.mapguard).
        mm = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    except OSError as e:
        raise bad(f"cannot be read: {e.strerror}") from None
    finally:
        os.close(fd)
    from . import mapguard

    mapguard.mapped(path)
    view = memoryview(mm)
    stored = list(struct.unpack_from(f"<{_trailer_size(body) // 4}I", view, body))
    if _chunk_crcs([view[:body]]) != stored:
        raise bad("damaged: its checksum does not match")
    try:
        h = json.loads(bytes(view[_PREFIX.size:_PREFIX.size + hlen]))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise bad("damaged header") from None
    base = _PREFIX.size + hlen
    return Saved(path, h, _dumped(h, view[base:body], bad), h["tokens"], h["pending"])


def _ints(x: Any, n: int | None = None) -> bool:
    return (isinstance(x, list) and (n is None or len(x) == n)
            and all(type(v) is int and v >= 0 for v in x))


def _dumped(h: Any, data: memoryview, bad) -> dict:
    """State.load's input from the header and the data section, every field checked."""
    ok = (isinstance(h, dict) and all(isinstance(h.get(k), str) for k in ("arch", "model",
                                                                          "dtype", "backend"))
          and _ints(h.get("tokens")) and _ints(h.get("pending"))
          and type(h.get("n_cells_used")) is int and h.get("n_seqs") == 1
          and isinstance(h.get("buffers"), list) and isinstance(h.get("data"), list)
          and len(h["buffers"]) == len(h["data"]))
    if not ok:
        raise bad("damaged header")
    n = h["n_cells_used"]
    # one sequence that has processed its tokens, all in cells [0, n)
    if n != len(h["tokens"]) or h.get("seqs") != [[n, n, n, n]]:
        raise bad("inconsistent header: its bookkeeping does not match its tokens")
    item = _ITEMSIZE.get(h["dtype"])
    if item is None:
        raise bad(f"unknown state dtype {h['dtype']!r}")
    out, end = {}, 0
    for b, d in zip(h["buffers"], h["data"]):
        if not (isinstance(b, list) and len(b) == 3 and isinstance(b[0], str) and _ints(b[1])
                and all(b[1]) and isinstance(b[2], bool) and isinstance(d, list)
                and len(d) == 3 and d[0] == b[0] and _ints(d[1:])):
            raise bad("damaged header")
        rows = n if b[2] else 1
        want = rows * item
        for s in b[1]:
            want *= s
        if d[1] != end or d[2] != want:
            raise bad(f"inconsistent header: buffer {b[0]} should hold {want} bytes at {end}")
        out[b[0]] = data[d[1]:d[1] + d[2]]
        end += want
    if end != len(data):
        raise bad(f"inconsistent header: {len(data)} data bytes, the buffers need {end}")
    return {"n_cells_used": n, "n_seqs": 1, "seqs": h["seqs"], "dtype": h["dtype"],
            "buffers": h["buffers"], "data": out}


def check_model(saved: Saved, lm: Any) -> None:
    """Refuse a state file written for another model than ``lm`` (engine.Loaded), or one this
    backend cannot hold."""
    h = saved.header
    if h["arch"] != lm.arch:
        raise ReflexError(f"{saved.path}: a state of a {h['arch']} model; this model is {lm.arch}")
    if h["model"] != fingerprint(lm.gguf):
        raise ReflexError(f"{saved.path}: written for another model file (fingerprint "
                          f"{h['model']}, this model's is {fingerprint(lm.gguf)})")
    have, want = list(h.get("lora", [])), list(getattr(lm, "lora", []))
    if have != want:
        raise ReflexError(f"{saved.path}: written with {len(have)} LoRA adapter(s) merged, this "
                          f"job has {len(want)} (or other ones or scales); a state depends on "
                          f"the weights: use the same --lora options")
    if h["dtype"] != lm.ops.state_dtype:
        raise ReflexError(f"{saved.path}: holds {h['dtype']} state; the {lm.backend} backend "
                          f"keeps {lm.ops.state_dtype}")
    n_vocab = lm.model.n_vocab
    if n_vocab and any(t >= n_vocab for t in saved.tokens + saved.pending):
        raise ReflexError(f"{saved.path}: holds token ids outside this model's vocabulary")
