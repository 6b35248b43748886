"""Opening a model file: the GGUF parse and the tokenizer, from the file's cached index when it
has a valid one (reflex_core.gguf_index), else the slow way -- and then the index is scheduled
to be written once the process's work is done.

The layers stay apart: reflex_core.gguf parses (and re-parses with a record of where its string
arrays lie); the tokenizer exports, stores, checks and imports its own tables; gguf_index stores
both per file and checks the index against the file. This module is where they meet.
"""

from __future__ import annotations

import os
from typing import Any

from . import gguf_index
from .gguf import GGUFFile, map_file, parse


class ModelFile(GGUFFile):
    """A GGUFFile opened by ``open_model_file``; says how its cached index served it."""

    def __init__(self, path: str, mm: Any):
        super().__init__(path, mm)
        self.index_state = "off"  # "hit", "miss" (parsed; its index is scheduled), "off"
        self.tokenizer_tables: Any = None  # from the index, checked (Tokenizer.from_tables)
        # CRC-32 of [0, data_offset) when the index check computed it (state files reuse it)
        self.region_crc: int | None = None


def open_model_file(path: str | os.PathLike, use_index: bool = True) -> ModelFile:
    """Open and parse a GGUF model file (GGUFError, one line, for a bad one).

    ``use_index``: take the parse and the tokenizer's tables from the file's cached index when
    there is a valid one (REFLEX_NO_INDEX=1 turns it off), and schedule one to be written when
    there is not (``gguf_index.pending_paths()`` / ``write_pending()``). Whatever is wrong with
    an index only makes it a miss."""
    path = os.fspath(path)
    mm, st = map_file(path)
    g = ModelFile(path, mm)
    if not (use_index and gguf_index.enabled()):
        parse(g)
        return g
    rec = gguf_index.restore(g, st)
    if rec is not None:
        g.index_state, g.tokenizer_tables = "hit", rec.tok
        g.region_crc = rec.region[1]  # restore() checked the file's region against it
    else:
        parse(g)
        g.index_state = "miss"
        gguf_index.schedule(g, st)
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
