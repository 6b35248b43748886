"""The core's GGUF reader: mmap + struct, stdlib only (no numpy, no gguf: this is the cold path).

Reads GGUF versions 2 and 3 (same layout; v1 and big-endian files are refused), every metadata
value type including arrays, and the tensor directory with absolute data offsets. Tensor bytes
are zero-copy memoryviews over a read-only mmap. Every count, length and offset is checked
against the file size before it is used, so a malformed file raises a one-line `GGUFError`,
never a crash or a huge allocation; time and memory stay linear in the file size.

String arrays (the tokenizer's 152k tokens and 151k merges) dominate the parse. At open time
only their end is found, in C-speed bulk operations (see `_scan_block`); the strings are
decoded on first access, in bulk as well. ``parse_record`` keeps where those arrays lie, and
``from_record`` parses the same file again with it, skipping only their walk (a cache of records
lives elsewhere: this module imports only errors and ggml_types from reflex_core).
"""

from __future__ import annotations

import mmap
import operator
import os
import stat
import struct
import sys
from array import array
from collections.abc import Sequence

from .errors import GGUFError
from .ggml_types import (  # noqa: F401 - the type tables are re-exported for the reader's users
    GGML_TYPE_IDS, GGML_TYPES, GGUF_TYPE_ARRAY, GGUF_TYPE_BOOL, GGUF_TYPE_FLOAT32,
    GGUF_TYPE_FLOAT64, GGUF_TYPE_INT8, GGUF_TYPE_INT16, GGUF_TYPE_INT32, GGUF_TYPE_INT64,
    GGUF_TYPE_STRING, GGUF_TYPE_UINT8, GGUF_TYPE_UINT16, GGUF_TYPE_UINT32, GGUF_TYPE_UINT64,
    UNSIGNED_INT_TYPES, VALUE_TYPE_NAMES, VALUE_TYPES, GGMLType, tensor_nbytes)

GGUF_MAGIC = b"GGUF"
GGUF_DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
_INT64_MAX = (1 << 63) - 1

# scalar value type -> little-endian struct (bool is read as a byte, see _read_value)
_SCALAR = {t: struct.Struct("<" + c) for t, c in (
    (0, "B"), (1, "b"), (2, "H"), (3, "h"), (4, "I"), (5, "i"), (6, "f"), (7, "B"),
    (10, "Q"), (11, "q"), (12, "d"))}


def _typecode(size: int, signed: bool) -> str:
    for c in ("bhilq" if signed else "BHILQ"):
        if array(c).itemsize == size:
            return c
    raise ImportError(f"no array typecode for {size}-byte integers")  # pragma: no cover


# numeric array element type -> array.array typecode of the same width
_ARRAY_CODE = {0: "B", 1: "b", 2: _typecode(2, False), 3: _typecode(2, True),
               4: _typecode(4, False), 5: _typecode(4, True), 6: "f", 7: "B",
               10: _typecode(8, False), 11: _typecode(8, True), 12: "d"}
_BYTESWAP = sys.byteorder != "little"  # the file is little-endian; struct handles scalars

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_HEADER = struct.Struct("<4sIQQ")
_TYPE_COUNT = struct.Struct("<IQ")  # array element type, count
_TENSOR_TAIL = struct.Struct("<IQ")  # ggml type, relative offset

# Bulk string arrays (see _scan_block)
_Z7 = b"\0" * 7
_PLUS1 = bytes(range(1, 256)) + b"\0"  # translate table: byte b -> (b + 1) % 256
_LAST = operator.itemgetter(-1)
_STRIP_LAST = operator.itemgetter(slice(None, -1))
_BLOCK = 1024  # strings per bulk block: a block that fails the fast check costs ~0.15 ms


# ------------------------------------------------------------------------------------------
# Public objects


class TensorInfo:
    """One tensor directory entry. `offset` is absolute (from the start of the file)."""

    __slots__ = ("name", "ne", "ggml_type", "offset", "nbytes")

    def __init__(self, name: str, ne: tuple[int, ...], ggml_type: int, offset: int, nbytes: int):
        self.name, self.ne, self.ggml_type = name, ne, ggml_type
        self.offset, self.nbytes = offset, nbytes

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.ggml_type].name

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.ne:
            n *= d
        return n

    def __repr__(self) -> str:
        return (f"TensorInfo({self.name!r}, ne={self.ne}, type={self.type_name}, "
                f"offset={self.offset}, nbytes={self.nbytes})")


class GGUFArray(Sequence):
    """A metadata array. Numbers are Python int/float/bool; strings are str (decoded on first
    access, in bulk); `raw(i)` gives a string element's exact bytes."""

    __slots__ = ("elem_type", "key", "_path", "_n", "_nums", "_blocks", "_raw", "_strs")

    def __init__(self, elem_type: int, key: str, path: str, n: int, nums=None, blocks=None):
        self.elem_type, self.key, self._path, self._n = elem_type, key, path, n
        self._nums = nums  # array.array for numeric element types
        self._blocks = blocks  # strings: [(count, bytes, fast)] from _Parser.scan_strings
        self._raw: list[bytes] | None = None
        self._strs: list[str] | None = None

    def __len__(self) -> int:
        return self._n

    def _items(self):
        """The decoded elements: array.array (numbers), list[bool] or list[str]."""
        if self._nums is None:
            if self._strs is None:
                self._decode()
            return self._strs
        return list(map(bool, self._nums)) if self.elem_type == GGUF_TYPE_BOOL else self._nums

    def __getitem__(self, i):
        if self._nums is None:
            return self._items()[i]
        v = self._nums[i]
        if isinstance(i, slice):
            v = v.tolist()
            return list(map(bool, v)) if self.elem_type == GGUF_TYPE_BOOL else v
        return bool(v) if self.elem_type == GGUF_TYPE_BOOL else v

    def __iter__(self):
        return iter(self._items())

    def tolist(self) -> list:
        items = self._items()
        return items.tolist() if isinstance(items, array) else list(items)

    def raw(self, i: int) -> bytes:
        """Exact bytes of string element i."""
        if self.elem_type != GGUF_TYPE_STRING:
            raise TypeError(f"{self.key}: raw() is for string arrays")
        if self._strs is not None:
            return self._strs[i].encode("utf-8")  # valid UTF-8 round-trips exactly
        return self._raw_list()[i]

    def raw_list(self) -> list[bytes]:
        """Every string element's exact bytes, in order, without decoding them (split in bulk
        at C speed; ~2x cheaper than decoding). The list is cached and shared: do not modify it."""
        if self.elem_type != GGUF_TYPE_STRING:
            raise TypeError(f"{self.key}: raw_list() is for string arrays")
        if self._raw is None and self._strs is not None:  # already decoded: re-encode once
            self._raw = [s.encode("utf-8") for s in self._strs]
        return self._raw_list()

    def raw_chunks(self):
        """The string elements' exact bytes as consecutive lists (one per bulk block, ~1024
        strings each), made on the fly and not kept: one pass over a big array without holding
        all of its elements at once. Concatenated, the lists are raw_list()."""
        if self.elem_type != GGUF_TYPE_STRING:
            raise TypeError(f"{self.key}: raw_chunks() is for string arrays")
        blocks = self._blocks
        if self._raw is not None or blocks is None:
            yield self.raw_list()
            return
        for blk in blocks:
            yield self._block_raw(*blk)

    def __eq__(self, other):
        if isinstance(other, (GGUFArray, list, tuple)):
            return len(self) == len(other) and self.tolist() == list(other)
        return NotImplemented

    __hash__ = None  # mutable-sequence semantics for ==

    def __repr__(self) -> str:
        return f"<GGUFArray {self.key!r}: {VALUE_TYPE_NAMES[self.elem_type]} x {self._n}>"

    def _block_raw(self, cnt: int, data: bytes, fast: bool) -> list[bytes]:
        """The cnt strings of one block (see _Parser.scan_strings) as bytes."""
        if fast:
            # `data` is exactly these strings and passed _scan_block's check: the same split
            # gives the same pieces (string + next length byte); the last is the last string.
            pieces = data.split(_Z7, cnt)
            out = list(map(_STRIP_LAST, pieces[1:cnt]))
            out.append(pieces[cnt])
            return out
        out, p, end = [], 0, len(data)  # checked at open; rechecked (the file may change)
        for _ in range(cnt):
            n = _U64.unpack_from(data, p)[0] if p + 8 <= end else end
            if n > end - p - 8:
                raise GGUFError(f"{self._path}: metadata key {self.key!r} changed on disk "
                                "while open")
            out.append(data[p + 8:p + 8 + n])
            p += 8 + n
        return out

    def _raw_list(self) -> list[bytes]:
        if self._raw is None:
            out: list[bytes] = []
            for blk in self._blocks:
                out += self._block_raw(*blk)  # list extend: C speed per element
            self._raw = out
        return self._raw

    def _decode(self) -> None:
        # Block by block (cache-friendly): join with NUL, decode once, split.
        strs: list[str] = []
        try:
            for blk in self._blocks:
                raw = self._block_raw(*blk)
                joined = b"\0".join(raw)
                if joined.count(b"\0") == len(raw) - 1:  # no NUL inside any string
                    strs += joined.decode("utf-8").split("\0")
                else:
                    strs += [b.decode("utf-8") for b in raw]
        except UnicodeDecodeError:
            raw = self._raw_list()
            bad = next(i for i, b in enumerate(raw) if not _is_utf8(b))
            raise GGUFError(f"{self._path}: metadata key {self.key!r}: string {bad} is not valid "
                            f"UTF-8 ({raw[bad][:40]!r})") from None
        self._strs, self._raw, self._blocks = strs, None, None


def _is_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


class GGUFFile:
    """An open GGUF file: metadata, tensor directory and the read-only mmap of its bytes."""

    def __init__(self, path: str, mm: mmap.mmap):
        self.path = path
        self._mm: mmap.mmap | None = mm
        self.file_size = len(mm)
        self.version = 0
        self.alignment = GGUF_DEFAULT_ALIGNMENT
        self.data_offset = 0
        self.metadata: dict[str, object] = {}
        self.value_types: dict[str, int] = {}
        self.tensors: dict[str, TensorInfo] = {}
        # where each metadata array lies in the file: key -> ("s", [(count, start, end, fast)])
        # for string arrays, ("n", start, end) for numbers (parse_record keeps it)
        self.layout: dict[str, tuple] = {}

    @property
    def mm(self) -> mmap.mmap:
        if self._mm is None:
            raise ValueError(f"{self.path}: GGUF file is closed")
        return self._mm

    @property
    def closed(self) -> bool:
        return self._mm is None

    def get(self, key: str, default=None):
        return self.metadata.get(key, default)

    def array_span(self, key: str) -> tuple[int, int] | None:
        """Where metadata array ``key``'s elements lie in the file: [start, end) (for strings,
        each is its u64 length then its bytes). None for a missing key, a scalar or an empty
        string array."""
        lay = self.layout.get(key)
        if lay is None:
            return None
        if lay[0] == "n":
            return lay[1], lay[2]
        blocks = lay[1]
        return (blocks[0][1], blocks[-1][2]) if blocks else None

    def tensor_data(self, name_or_info) -> memoryview:
        """Zero-copy, read-only view of a tensor's bytes."""
        ti = name_or_info if isinstance(name_or_info, TensorInfo) else self.tensors[name_or_info]
        return memoryview(self.mm)[ti.offset:ti.offset + ti.nbytes]

    def close(self) -> None:
        """Unmap. While views from tensor_data() are alive the mapping stays until they go."""
        mm, self._mm = self._mm, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<{type(self).__name__} {self.path!r} v{self.version}: "
                f"{len(self.metadata)} keys, {len(self.tensors)} tensors>")


def open_gguf(path: str | os.PathLike) -> GGUFFile:
    """Open and parse a GGUF file's header, metadata and tensor directory. (The engine opens
    models through reflex_core.modelfile, which takes the parse from a cached index.)"""
    path = os.fspath(path)
    mm, _ = map_file(path)
    g = GGUFFile(path, mm)
    parse(g)
    return g


def map_file(path: str) -> tuple[mmap.mmap, os.stat_result]:
    """A read-only mmap of the regular file ``path`` and its fstat (one-line GGUFErrors)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise GGUFError(f"No such file: {path}") from None
    except OSError as e:
        raise GGUFError(f"{path}: cannot open: {e.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise GGUFError(f"{path}: is a directory, not a GGUF file")
    if not stat.S_ISREG(st.st_mode):  # a FIFO would block, a device has no size
        raise GGUFError(f"{path}: not a regular file")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))
    except OSError as e:
        raise GGUFError(f"{path}: cannot open: {e.strerror}") from None
    try:
        fst = os.fstat(fd)
        if fst.st_size == 0:
            raise GGUFError(f"{path}: empty file (0 bytes), not a GGUF file")
        mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise GGUFError(f"{path}: cannot map: {e.strerror}") from None
    finally:
        os.close(fd)  # the mmap keeps its own reference to the file
    return mm, fst


def parse(g: GGUFFile) -> None:
    """Fill the fresh ``g`` from its mapping; on a malformed file close it and raise GGUFError."""
    try:
        _Parser(g, g.mm).parse()
    except BaseException:
        g.close()
        raise


# ------------------------------------------------------------------------------------------
# The parse's costly part as data (what a cache keeps; see reflex_core.gguf_index)

_HINTS = struct.Struct("<I")  # number of string arrays
_HINT = struct.Struct("<QQI")  # where an array's elements start, its count, its number of blocks
_HINT_BLOCK = struct.Struct("<IQB")  # strings in a block, where the block ends, verified fast


def parse_record(g: GGUFFile) -> bytes:
    """Where the string arrays of the parsed ``g`` lie, block by block (see
    ``_Parser.scan_strings``): the one part of a parse that walks every string. ``from_record``
    parses the same file again with it, reading and checking everything else as ``parse`` does."""
    arrays = [lay[1] for lay in g.layout.values() if lay[0] == "s" and lay[1]]
    out = [_HINTS.pack(len(arrays))]
    for blocks in arrays:
        out.append(_HINT.pack(blocks[0][1], sum(b[0] for b in blocks), len(blocks)))
        out += [_HINT_BLOCK.pack(cnt, end, fast) for cnt, _, end, fast in blocks]
    return b"".join(out)


def from_record(g: GGUFFile, rec, accept=None) -> bool:
    """Fill the fresh ``g`` by parsing its file with ``rec`` (a parse_record of this same file)
    in place of the string arrays' walk. Everything else -- header, every other value, the
    tensor directory -- is read from the file with parse's checks, so a record can only say
    where strings lie, and each of its blocks must fall where the parse reaches that array.
    ``accept(parsed)``, when given, has the last word. False, with ``g`` untouched, when ``rec``
    is malformed or does not fit the bytes ``g`` maps: the caller parses instead."""
    hints = _read_hints(rec, g.file_size)
    if hints is None:
        return False
    h = GGUFFile(g.path, g.mm)  # shares g's mapping; dropped (not closed) when refused
    try:
        _HintedParser(h, g.mm, hints).parse()
    except (GGUFError, _Unhinted):
        return False
    if hints or (accept is not None and not accept(h)):  # a hint no array used: not this file
        return False
    g.version, g.alignment, g.data_offset = h.version, h.alignment, h.data_offset
    g.metadata, g.value_types, g.layout, g.tensors = h.metadata, h.value_types, h.layout, h.tensors
    return True


def _read_hints(rec, size: int) -> dict | None:
    """{where an array's elements start: (count, [(count, start, end, fast)])} from a
    parse_record; None unless ``rec`` is exactly that, every block inside the file's ``size``
    bytes (each count bounded by the bytes that remain, so nothing larger than ``rec`` is built)."""
    try:
        rec = memoryview(rec).cast("B")
        (n_arrays,), pos, hints = _HINTS.unpack_from(rec, 0), _HINTS.size, {}
        for _ in range(n_arrays):
            start, n, n_blocks = _HINT.unpack_from(rec, pos)
            pos += _HINT.size
            end = pos + n_blocks * _HINT_BLOCK.size
            if end > len(rec) or start in hints:
                return None
            blocks, a, total = [], start, 0
            for cnt, b, fast in _HINT_BLOCK.iter_unpack(rec[pos:end]):
                # a string takes at least its 8-byte length
                if not 1 <= cnt <= (b - a) // 8 or b > size or fast > 1:
                    return None
                blocks.append((cnt, a, b, fast == 1))
                a, total = b, total + cnt
            if not blocks or total != n:
                return None
            hints[start], pos = (n, blocks), end
        return hints if pos == len(rec) else None
    except (struct.error, TypeError, ValueError):
        return None


class _Unhinted(Exception):
    """A string array the record does not describe."""


# ------------------------------------------------------------------------------------------
# Parser


class _Parser:
    def __init__(self, g: GGUFFile, mm: mmap.mmap):
        self.g, self.mm, self.size, self.path = g, mm, len(mm), g.path

    def error(self, msg: str) -> GGUFError:
        return GGUFError(f"{self.path}: {msg}")

    def need(self, pos: int, n: int, what: str) -> None:
        if n > self.size - pos:
            raise self.error(f"truncated: {what} runs past the end of the file ({self.size} bytes)")

    def read_str(self, pos: int, what: str) -> tuple[str, int]:
        self.need(pos, 8, what)
        n = _U64.unpack_from(self.mm, pos)[0]
        self.need(pos + 8, n, what)
        b = self.mm[pos + 8:pos + 8 + n]
        try:
            return b.decode("utf-8"), pos + 8 + n
        except UnicodeDecodeError:
            raise self.error(f"{what} is not valid UTF-8 ({b[:40]!r})") from None

    def parse(self) -> None:
        g, mm, size = self.g, self.mm, self.size
        if size < 4 or mm[:4] != GGUF_MAGIC:
            if GGUF_MAGIC.startswith(mm[:4]):
                raise self.error(f"truncated: the {size}-byte file is shorter than a GGUF header")
            raise self.error(f"not a GGUF file (starts with {mm[:4]!r}, expected b'GGUF')")
        self.need(4, 4, "the header")
        version = _U32.unpack_from(mm, 4)[0]
        if version & 0xFFFF == 0 and version:
            raise self.error("big-endian (byte-swapped) GGUF; only little-endian files are "
                             "supported")
        if version == 1:
            raise self.error("GGUF version 1 is not supported; re-convert the model with a "
                             "current llama.cpp")
        if version not in (2, 3):
            raise self.error(f"unsupported GGUF version {version} (this reader supports 2 and 3)")
        self.need(0, _HEADER.size, "the header")
        _, g.version, n_tensors, n_kv = _HEADER.unpack_from(mm, 0)
        pos = _HEADER.size
        # Loose lower bounds on an entry's size (KV >= 14 bytes, tensor entry >= 24) reject
        # absurd counts up front.
        if n_kv > (size - pos) // 14:
            raise self.error(f"truncated or corrupt: the header claims {n_kv} metadata entries, "
                             f"more than the {size}-byte file can hold")
        if n_tensors > (size - pos) // 24:
            raise self.error(f"truncated or corrupt: the header claims {n_tensors} tensors, more "
                             f"than the {size}-byte file can hold")
        pos = self.parse_metadata(pos, n_kv)
        self.set_alignment()
        self.parse_tensors(pos, n_tensors)

    def parse_metadata(self, pos: int, n_kv: int) -> int:
        meta, vtypes = self.g.metadata, self.g.value_types
        for i in range(n_kv):
            key, pos = self.read_str(pos, f"metadata entry {i} (key)")
            if not key:
                raise self.error(f"metadata entry {i} has an empty key")
            if key in meta:
                raise self.error(f"duplicate metadata key {key!r} (entry {i})")
            what = f"metadata entry {i} ({key!r})"
            self.need(pos, 4, what)
            vtype = _U32.unpack_from(self.mm, pos)[0]
            pos += 4
            if vtype == GGUF_TYPE_ARRAY:
                meta[key], pos = self.read_array(pos, key, what)
            else:
                meta[key], pos = self.read_value(pos, vtype, key, what)
            vtypes[key] = vtype
        return pos

    def read_value(self, pos: int, vtype: int, key: str, what: str):
        if vtype == GGUF_TYPE_STRING:
            return self.read_str(pos, what)
        s = _SCALAR.get(vtype)
        if s is None:
            raise self.error(f"metadata key {key!r} has unknown value type {vtype}")
        self.need(pos, s.size, what)
        v = s.unpack_from(self.mm, pos)[0]
        return (v != 0 if vtype == GGUF_TYPE_BOOL else v), pos + s.size

    def read_array(self, pos: int, key: str, what: str):
        self.need(pos, 12, what)
        etype, n = _TYPE_COUNT.unpack_from(self.mm, pos)
        pos += 12
        left = self.size - pos
        if etype == GGUF_TYPE_STRING:
            if n > left // 8:  # every string takes at least its 8-byte length
                raise self.error(f"truncated or corrupt: metadata key {key!r} claims {n} "
                                 f"strings, more than the {left} bytes left can hold")
            start = pos
            blocks, pos = self.scan_strings(pos, n, key)
            lay, a = [], start
            for cnt, data, fast in blocks:
                lay.append((cnt, a, a + len(data), fast))
                a += len(data)
            self.g.layout[key] = ("s", lay)
            return GGUFArray(etype, key, self.path, n, blocks=blocks), pos
        if etype == GGUF_TYPE_ARRAY:
            raise self.error(f"metadata key {key!r} is an array of arrays (not supported, "
                             "llama.cpp refuses them too)")
        code = _ARRAY_CODE.get(etype)
        if code is None:
            raise self.error(f"metadata key {key!r} is an array of unknown value type {etype}")
        nums = array(code)
        if n > left // nums.itemsize:
            raise self.error(f"truncated or corrupt: metadata key {key!r} claims {n} "
                             f"{VALUE_TYPE_NAMES[etype]} elements, more than the {left} bytes "
                             "left can hold")
        end = pos + n * nums.itemsize
        nums.frombytes(self.mm[pos:end])
        self.g.layout[key] = ("n", pos, end)
        if _BYTESWAP:  # pragma: no cover - little-endian hosts only in practice
            nums.byteswap()
        return GGUFArray(etype, key, self.path, n, nums=nums), end

    def scan_strings(self, pos: int, n: int, key: str):
        """Find where n strings starting at pos end. Returns (blocks, end), blocks being
        [(count, the block's bytes, whether _scan_block verified it)]."""
        mm, size, blocks, start, done = self.mm, self.size, [], pos, 0
        while done < n:
            cnt = min(_BLOCK, n - done)
            per = (pos - start) / done if done else 24.0  # bytes per string so far
            found = _scan_block(mm, pos, cnt, int(cnt * per * 1.25) + 256, size)
            if found is not None:
                blocks.append((cnt, found, True))
            else:  # plain loop with bounds checks
                p = pos
                for j in range(cnt):
                    if p + 8 > size:
                        raise self.error(f"truncated: metadata key {key!r} string {done + j} "
                                         f"runs past the end of the file ({size} bytes)")
                    ln = _U64.unpack_from(mm, p)[0]
                    if ln > size - p - 8:
                        raise self.error(f"truncated: metadata key {key!r} string {done + j} "
                                         f"({ln} bytes) runs past the end of the file "
                                         f"({size} bytes)")
                    p += 8 + ln
                blocks.append((cnt, mm[pos:p], False))
            pos += len(blocks[-1][1])
            done += cnt
        return blocks, pos

    def set_alignment(self) -> None:
        g = self.g
        a = g.metadata.get("general.alignment")
        if a is None:
            return
        if g.value_types["general.alignment"] not in UNSIGNED_INT_TYPES or a == 0 or a & (a - 1):
            raise self.error(f"general.alignment must be a non-zero power of two stored as an "
                             f"unsigned integer, found {a!r} "
                             f"({VALUE_TYPE_NAMES[g.value_types['general.alignment']]})")
        g.alignment = a

    def parse_tensors(self, pos: int, n_tensors: int) -> None:
        g, mm, align = self.g, self.mm, self.g.alignment
        tensors = g.tensors
        rel = []
        for i in range(n_tensors):
            what = f"tensor directory entry {i}"
            name, pos = self.read_str(pos, what + " (name)")
            if name in tensors:
                raise self.error(f"duplicate tensor name {name!r} (entry {i})")
            what = f"{what} ({name!r})"
            self.need(pos, 4, what)
            n_dims = _U32.unpack_from(mm, pos)[0]
            if n_dims > MAX_DIMS:
                raise self.error(f"tensor {name!r} has {n_dims} dimensions (at most {MAX_DIMS})")
            self.need(pos + 4, 8 * n_dims + _TENSOR_TAIL.size, what)
            ne = struct.unpack_from(f"<{n_dims}Q", mm, pos + 4)
            pos += 4 + 8 * n_dims
            ggml_type, offset = _TENSOR_TAIL.unpack_from(mm, pos)
            pos += _TENSOR_TAIL.size
            n = 1
            for d in ne:
                if d == 0:
                    raise self.error(f"tensor {name!r} has a zero dimension: ne={list(ne)}")
                n *= d
            if n > _INT64_MAX:
                raise self.error(f"tensor {name!r} has too many elements: ne={list(ne)}")
            t = GGML_TYPES.get(ggml_type)
            if t is None:
                raise self.error(f"tensor {name!r} has unknown GGML type id {ggml_type}")
            ne0 = ne[0] if n_dims else 1
            if ne0 % t.block_size:
                raise self.error(f"tensor {name!r} ({t.name}) has rows of {ne0} elements, not a "
                                 f"multiple of the block size {t.block_size}")
            if offset % align:
                raise self.error(f"tensor {name!r} data offset {offset} is not a multiple of the "
                                 f"alignment {align}")
            tensors[name] = TensorInfo(name, ne, ggml_type, 0, n // t.block_size * t.type_size)
            rel.append(offset)
        g.data_offset = data_offset = pos + (-pos % align)
        for ti, offset in zip(tensors.values(), rel):
            ti.offset = data_offset + offset
            if ti.offset + ti.nbytes > self.size:
                raise self.error(f"truncated: tensor {ti.name!r} data ({ti.nbytes} bytes at offset "
                                 f"{ti.offset}) runs past the end of the file ({self.size} bytes)")


class _HintedParser(_Parser):
    """The parser of from_record: string arrays come from the record's blocks (each used once),
    not from a walk."""

    def __init__(self, g: GGUFFile, mm: mmap.mmap, hints: dict):
        super().__init__(g, mm)
        self.hints = hints

    def scan_strings(self, pos: int, n: int, key: str):
        if n == 0:
            return [], pos
        hint = self.hints.pop(pos, None)
        if hint is None or hint[0] != n:
            raise _Unhinted(key)
        mm, blocks = self.mm, []
        for cnt, a, b, fast in hint[1]:
            # A block starts with a string's length, which fits the block (1..255 in a fast
            # one: see _scan_block). Cheap, and it catches a boundary moved off a string; what
            # lies inside a block is the record's word (its CRC and the file's are the cache's).
            n0 = _U64.unpack_from(mm, a)[0]
            if n0 > b - a - 8 or fast and not 1 <= n0 <= 255:
                raise _Unhinted(key)
            blocks.append((cnt, mm[a:b], fast))
        return blocks, hint[1][-1][2]


def _scan_block(mm, pos: int, cnt: int, window: int, limit: int) -> bytes | None:
    """Prove, with C-speed operations only, where `cnt` (>= 1) strings starting at mm[pos] end.
    Returns exactly their bytes, or None when the fast check does not apply.

    A string is an u64 length then its bytes. For lengths 1..255 the length is one byte L
    followed by 7 zero bytes, so splitting the region at 7-zero runs (maxsplit=cnt) gives
    piece 0 = L0 and pieces 1..cnt-1 = string_{i-1} + L_i. We check exactly that: piece 0 is
    one byte, len(piece i) == (last byte of piece i-1) + 1, and the last piece holds at least
    the last declared length. Any region whose split passes this check parses exactly that
    way (each length read at a piece's last byte is that byte plus seven zeros), whatever the
    content. Empty strings, lengths >= 256 or runs of NULs in strings fail the check (-> None,
    the caller falls back to a plain loop for this block). The window (copied from the mmap) grows
    until the split reaches all cnt strings, up to ~256 bytes a string.
    """
    while True:
        end = min(pos + window, limit)
        chunk = mm[pos:end]
        pieces = chunk.split(_Z7, cnt)
        if len(pieces) == cnt + 1:
            if len(pieces[0]) != 1:
                return None
            try:
                last = bytes(map(_LAST, pieces[:cnt]))  # IndexError: an empty piece
                lens = bytes(map(len, pieces[1:cnt]))  # ValueError: a piece > 255 bytes
            except (IndexError, ValueError):
                return None
            if lens != last[:cnt - 1].translate(_PLUS1):
                return None
            tail = len(pieces[cnt])
            if tail >= last[cnt - 1]:
                return chunk[:len(chunk) - tail + last[cnt - 1]]
        if end >= limit or window > cnt * 256 + 65536:
            return None  # the plain loop reports a truncation; long strings need no trick
        window *= 2
