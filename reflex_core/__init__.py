"""Reflex core: GGUF reader, tokenizer, plugin host, op backends, engine and CLI.

Importing this package is cheap on purpose (the cold path): nothing here imports numpy, gguf,
cuda or huggingface_hub. Those are imported by the modules that need them, when they need them.
The Python API (:func:`load`, reflex_core.api) is imported when first called.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs ~5 ms to import, before the CUDA start
if TYPE_CHECKING:
    from .api import Engine

__version__ = "0.1.0"


def load(model=None, *, backend: str = "auto", lora=(), revision: str | None = None,
         ctx_size: int = 0) -> "Engine":
    """Load a model and return a :class:`reflex_core.api.Engine` (see reflex_core.api.load):
    ``model`` a local GGUF path or a Hub repository ``"ORG/NAME[:FILE.gguf]"`` (None: the
    default model), ``backend`` "auto"/"cuda"/"cpu", ``lora`` adapters merged at load,
    ``ctx_size`` the context every job must fit (0: the model's context length)."""
    if backend in ("auto", "cuda"):  # CUDA starts before the API's imports, as the CLI's does
        from .cuda.start import start

        start()
    from .api import load as load_engine

    return load_engine(model, backend=backend, lora=lora, revision=revision, ctx_size=ctx_size)
