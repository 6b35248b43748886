"""Opening a model file: the GGUF parse and the tokenizer, from the file's prebuilt index or
else its cached one when it has a valid one (reflex_core.gguf_index), else the slow way -- and
then the user cache's index is scheduled to be written once the process's work is done.

The layers stay apart: reflex_core.gguf parses (and re-parses with a record of where its string
arrays lie); the tokenizer exports, stores, checks and imports its own tables; gguf_index stores
both per file and checks the index against the file. This module is where they meet.
"""

from __future__ import annotations

import os
from typing import Any

from . import gguf_index, mapguard
from .errors import GGUFError
from .gguf import GGUFFile, map_file, parse


class ModelFile(GGUFFile):
    """A GGUFFile opened by ``open_model_file``; says how its cached index served it."""

    def __init__(self, path: str, mm: Any):
        super().__init__(path, mm)
        # "prebuilt" (an index made by `reflex index`), "hit" (the user cache's), "miss"
        # (parsed; its index is scheduled for the user cache), "off"
        self.index_state = "off"
        self.index_file: str | None = None  # the prebuilt index used
        self.index_ignored: str | None = None  # "FILE: why" of a prebuilt index not used
        self.tokenizer_tables: Any = None  # from the index, checked (Tokenizer.from_tables)
        # CRC-32 of [0, data_offset) when the index check computed it (state files reuse it)
        self.region_crc: int | None = None

    @property
    def index_note(self) -> str:
        """Which index served this file, for ``--timings``."""
        if self.index_state == "prebuilt":
            return f"hit, prebuilt {self.index_file} (parse and tokenizer tables)"
        if self.index_state == "hit":
            why = f"; prebuilt {self.index_ignored}" if self.index_ignored else ""
            return f"hit, user cache (parse and tokenizer tables from the cached index{why})"
        if self.index_state == "miss":
            why = f"; prebuilt {self.index_ignored}" if self.index_ignored else ""
            return f"miss, no index (full parse; {_user_cache_fate()}{why})"
        return "off"


def _user_cache_fate() -> str:
    """What becomes of this file's index at exit: the user cache gets it when it can."""
    from . import cachedir

    folder = cachedir.cache_dir(gguf_index.INDEX_DIR)
    if folder is not None and os.access(folder, os.W_OK):
        return "the user cache's is written at exit"
    return ("none is written: the user cache is not writable; `reflex index MODEL` prebuilds "
            "one")


def open_model_file(path: str | os.PathLike, use_index: bool = True) -> ModelFile:
    """Open and parse a GGUF model file (GGUFError, one line, for a bad one).

    ``use_index``: take the parse and the tokenizer's tables from the file's prebuilt index
    (``reflex index``) or else its cached one when there is a valid one (REFLEX_NO_INDEX=1
    turns both off), and schedule one to be written to the user cache when there is neither
    (``gguf_index.pending_paths()`` / ``write_pending()``). Whatever is wrong with an index
    only makes it a miss."""
    path = os.fspath(path)
    mm, st = map_file(path)
    mapguard.mapped(path)
    g = ModelFile(path, mm)
    if not (use_index and gguf_index.enabled()):
        parse(g)
        return _whole(g)
    rec, where = gguf_index.restore_prebuilt(g, st)
    if rec is not None:
        g.index_state, g.index_file, g.tokenizer_tables = "prebuilt", where, rec.tok
        g.region_crc = rec.region[1]
        return _whole(g)
    g.index_ignored = where
    rec = gguf_index.restore(g, st)
    if rec is not None:
        g.index_state, g.tokenizer_tables = "hit", rec.tok
        g.region_crc = rec.region[1]  # restore() checked the file's region against it
        return _whole(g)
    parse(g)
    _whole(g)  # before its index is scheduled
    g.index_state = "miss"
    gguf_index.schedule(g, st)
    return g


def _whole(g: ModelFile) -> ModelFile:
    """``g``, unless it is one part of a split GGUF (``split.count`` > 1: llama-gguf-split's
    parts, the metadata in the first, the tensors spread over all): refused in one line that
    says what to do, not as a tensor missing from it."""
    n = g.get("split.count", 1)
    if isinstance(n, int) and not isinstance(n, bool) and n > 1:
        no = g.get("split.no", 0)
        part = f"part {no + 1} of " if isinstance(no, int) and not isinstance(no, bool) else ""
        raise GGUFError(f"{g.path} is {part}a {n}-part split GGUF; split files are not "
                        f"supported: merge the parts into one (llama-gguf-split --merge FIRST "
                        f"OUT.gguf) and run that")
    return g


def load_tokenizer(g: GGUFFile) -> Any:
    """The tokenizer of ``g``: served from its index's tables when ``g`` was opened from a
    valid index that has them, else built from the metadata (``Tokenizer.from_gguf``).
    ModelError (one line) when the file has no tokenizer we can read."""
    from .tokenizer import Tokenizer

    tables = g.tokenizer_tables if isinstance(g, ModelFile) else None
    if tables is not None:
        tok = Tokenizer.from_tables(g, tables)
        if tok is not None:
            return tok
    return Tokenizer.from_gguf(g)
