"""Op backends: ``get_backend("cpu")`` is the NumPy reference, ``get_backend("cuda")`` the GPU.

Each backend module is imported only when asked for, so the CUDA path never imports NumPy.
"""

from __future__ import annotations

from typing import Any

from ..errors import ReflexError

NAMES = ("cpu", "cuda")


def get_backend(name: str, **options: Any):
    """A fresh :class:`reflex_core.ops.Ops` of backend ``name`` ("cpu" or "cuda").

    Options are passed to the backend's constructor (e.g. ``cache_weights=False`` for NumPy).
    """
    if name in ("cpu", "numpy"):
        from .numpy_backend import NumpyOps

        return NumpyOps(**options)
    if name == "cuda":
        from .cuda_backend import CudaOps

        return CudaOps(**options)
    raise ReflexError(f"unknown backend {name!r}; choose one of {', '.join(NAMES)}")
