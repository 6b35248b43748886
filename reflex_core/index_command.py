"""``reflex index MODEL... [--out DIR]``: write each model's prebuilt index where an image layer or
a read-only volume carries it with the model, so that a fresh container's first run is as fast as
its second (reflex_core.gguf_index, "Prebuilt indexes"), and say how runs find it.

Not on the cold path: imported by the command alone.
"""

from __future__ import annotations

import os

from . import gguf_index
from .errors import ReflexError


def run(models: list[str], out_dir: str | None) -> list[dict]:
    """Write the index of each of ``models`` (beside it, or into ``out_dir``); one dict per
    model: ``model``, ``index`` (the file), ``bytes``, ``tokenizer_tables`` (whether the index
    holds them: a file without a tokenizer we read has the parse's part only) and ``env`` (what
    a run needs set to find it). GGUFError / ReflexError (one line) at the first failure."""
    env = {} if out_dir is None else {gguf_index.PREBUILT_DIR_ENV: os.path.abspath(out_dir)}
    if out_dir is not None:  # OUT_DIR/NAME.rxi: one index a file name
        seen: dict[str, str] = {}
        for model in models:
            name = os.path.basename(model)
            if name in seen and os.path.realpath(seen[name]) != os.path.realpath(model):
                raise ReflexError(f"{seen[name]} and {model} would share --out's index "
                                  f"{name}{gguf_index.PREBUILT_SUFFIX}: index them into two "
                                  f"folders (or beside each, without --out)")
            seen[name] = model
    out = []
    for model in models:
        fn, size, tables = gguf_index.write_prebuilt(model, out_dir)
        out.append({"model": model, "index": fn, "bytes": size, "tokenizer_tables": tables,
                    "env": env})
    return out


def lines(results: list[dict]) -> list[str]:
    """One line per index written, then the status line ``REFLEX_INDEX_OK``."""
    out = []
    for r in results:
        how = " ".join(f"{k}={v}" for k, v in r["env"].items())
        out.append(f"{r['index']}: {r['bytes']} bytes"
                   f"{', with the tokenizer tables' if r['tokenizer_tables'] else ''}; "
                   f"runs of {r['model']} use it{' with ' + how if how else ''}")
    out.append(f"REFLEX_INDEX_OK n_indexes={len(results)} "
               f"bytes={sum(r['bytes'] for r in results)}")
    return out


def as_json(results: list[dict]) -> dict:
    return {"status": "ok", "indexes": results}
