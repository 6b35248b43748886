"""Reflex's on-disk caches (the plugin entry-point list, GGUF indexes): where they live and how
they are written. Stdlib only; on the cold path."""

from __future__ import annotations

import os


def cache_root() -> str:
    """``$XDG_CACHE_HOME/reflex`` (``~/.cache/reflex``)."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "reflex")


def write_atomic(path: str, data: bytes) -> bool:
    """Write ``data`` to ``path`` through a temporary file and a rename, so a reader sees the old
    file or the whole new one. Best effort: False (and no file left behind) when the cache
    cannot be written, e.g. a read-only home."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        return True
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False
