"""The fuzz targets: each takes one input (bytes) and raises only ReflexError for bad input.

* ``reader``: the GGUF reader (``reflex_core.gguf.open_gguf``) on the input as a file, then every
  metadata value and tensor view read back.
* ``tokenizer``: the tokenizer from the file's metadata (``Tokenizer.from_gguf``): encode,
  decode, export its tables and serve a tokenizer from them, which must encode alike.
* ``hparams``: the plugins' hyper-parameter readers (``Qwen3Config`` / ``Qwen3MoEConfig``), then
  the model built on the CPU backend (weight binding, shape and size checks) and one forward
  pass of two tokens.
* ``index``: the input as the cached index of a valid model file, opened the way the engine
  opens models (``modelfile.open_model_file`` + ``load_tokenizer``). The file is valid, so here
  *any* exception is a finding, and so is a result that differs from the file's own (the index
  is a cache, never an authority). The target knows the index only through its public entry
  points, so that it outlives changes of the format: the index writer's command
  (``python -m reflex_core.gguf_index PATH``) makes the seed, and the file it wrote
  (``gguf_index.index_file(PATH)``, else the largest file under ``$XDG_CACHE_HOME``) is where
  each input goes.

A target returns normally for accepted input and for a ReflexError; any other exception
propagates (the harness, ``run.py``, reports it with the input). Inputs are written to a fresh
file each (under /dev/shm where it exists) that is removed afterwards.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Callable

TEXTS = (" tt hello <think> w\u00f6rld<|im_end|>\n", "")

_counter = itertools.count()
_dir: str | None = None


def _workdir() -> str:
    global _dir
    if _dir is None:
        base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        _dir = tempfile.mkdtemp(prefix="reflex-fuzz-", dir=base)
    return _dir


def set_workdir(path: str) -> None:
    """Write the inputs (and the index target's model) under ``path`` instead of a temporary
    folder: libFuzzer ends the process with exit(), so no ``cleanup()`` would run."""
    global _dir
    os.makedirs(path, mode=0o700, exist_ok=True)
    _dir = path


def _input_file(data: bytes) -> str:
    path = os.path.join(_workdir(), f"in{next(_counter)}.gguf")
    with open(path, "wb") as f:
        f.write(data)
    return path


def _opened(data: bytes):
    """The parsed input, or None when the reader refuses it (a GGUFError: fine here)."""
    from reflex_core.errors import ReflexError
    from reflex_core.gguf import open_gguf

    path = _input_file(data)
    try:
        return open_gguf(path)
    except ReflexError:
        return None
    finally:
        os.unlink(path)  # the mapping stays valid


def _touch_all(g) -> None:
    for v in g.metadata.values():
        if hasattr(v, "tolist"):
            v.tolist()
            if getattr(v, "elem_type", None) == 8:  # string array: the exact bytes too
                v.raw_list()
    for info in g.tensors.values():
        bytes(g.tensor_data(info)[:64])


def reader(data: bytes) -> None:
    from reflex_core.errors import ReflexError

    g = _opened(data)
    if g is None:
        return
    try:
        _touch_all(g)
    except ReflexError:
        pass
    finally:
        g.close()


def tokenizer(data: bytes) -> None:
    from reflex_core.errors import ReflexError
    from reflex_core.tokenizer import Tokenizer

    g = _opened(data)
    if g is None:
        return
    try:
        tok = Tokenizer.from_gguf(g)
        ids = [tok.encode(t) for t in TEXTS]
        for i in ids:
            tok.decode(i)
        tok.decode(range(-2, tok.n_vocab + 2))
        tables = tok.tables()
        served = Tokenizer.from_tables(g, tables)
        if served is not None:
            got = [served.encode(t) for t in TEXTS]
            assert got == ids, f"the tokenizer served from its tables encodes {got}, not {ids}"
    except ReflexError:
        pass
    finally:
        g.close()


_ARCHS: dict = {}


def _families():
    if not _ARCHS:
        from reflex_qwen3.model import Qwen3, Qwen3Config
        from reflex_qwen3_moe.model import Qwen3MoE, Qwen3MoEConfig

        _ARCHS.update(qwen3=(Qwen3Config, Qwen3), qwen3moe=(Qwen3MoEConfig, Qwen3MoE))
    return _ARCHS


def hparams(data: bytes) -> None:
    from reflex_core.backends.numpy_backend import NumpyOps
    from reflex_core.errors import ReflexError

    g = _opened(data)
    if g is None:
        return
    try:
        arch = g.get("general.architecture")
        if not isinstance(arch, str) or not arch:
            arch = "qwen3"
        for config, _ in _families().values():  # every reader on every file: more paths
            try:
                config.from_gguf(g, arch)
            except ReflexError:
                pass
        fam = _families().get(arch)
        if fam is None:
            return
        ops = NumpyOps()
        ops.attach(g)
        model = fam[1](g, ops)
        state = model.new_state(4)
        ids = [i % model.n_vocab for i in (1, 2)]
        model.forward(state.append(ids), state, [1])
    except ReflexError:
        pass
    finally:
        g.close()


# ---------------------------------------------------------------------------------- index


class _Index:
    """A valid model, its index as the writer wrote it, and what the model gives without it."""

    def __init__(self) -> None:
        from .craft import tiny_model

        root = tempfile.mkdtemp(prefix="reflex-fuzz-index-", dir=_workdir())
        os.environ["XDG_CACHE_HOME"] = self.cache = os.path.join(root, "cache")
        os.environ["REFLEX_NO_INDEX"] = "0"
        self.model = os.path.join(root, "model.gguf")
        with open(self.model, "wb") as f:
            f.write(tiny_model("qwen3", tokenizer=True).to_bytes())
        from reflex_core import cachedir, gguf_index

        # the folder a reflex command makes before it hands the write to the writer
        cachedir.cache_dir(gguf_index.INDEX_DIR)
        subprocess.run([sys.executable, "-m", "reflex_core.gguf_index", self.model],
                       check=True, timeout=120)
        self.path = gguf_index.index_file(self.model)
        if not os.path.isfile(self.path):
            raise RuntimeError(f"the index writer wrote no index at {self.path}")
        with open(self.path, "rb") as f:
            self.seed = f.read()
        self.want = self.result(use_index=False)

    def result(self, use_index: bool = True):
        """What the engine sees of the model: metadata, tensor directory, prompt ids."""
        from reflex_core.modelfile import load_tokenizer, open_model_file

        g = open_model_file(self.model, use_index=use_index)
        try:
            md = {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in g.metadata.items()}
            tensors = {n: (tuple(t.ne), t.ggml_type, t.offset, t.nbytes)
                       for n, t in g.tensors.items()}
            tok = load_tokenizer(g)
            ids = [tok.encode(t) for t in TEXTS]
            return md, tensors, g.data_offset, ids
        finally:
            g.close()


_index: _Index | None = None


def index_setup() -> bytes:
    """Make the index target's model and return its valid index (a seed)."""
    global _index
    if _index is None:
        _index = _Index()
    return _index.seed


def index(data: bytes) -> None:
    index_setup()
    try:
        os.unlink(_index.path)
    except FileNotFoundError:
        pass
    os.makedirs(os.path.dirname(_index.path), mode=0o700, exist_ok=True)
    fd = os.open(_index.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    got = _index.result()
    if got != _index.want:
        parts = ("metadata", "tensor directory", "data offset", "prompt ids")
        differ = [p for p, a, b in zip(parts, got, _index.want) if a != b]
        raise AssertionError(f"a valid model read through this index differs from the model "
                             f"itself: {', '.join(differ)}")


def preload() -> None:
    """Import everything the targets run (the harness instruments what is imported here)."""
    import reflex_core.backends.numpy_backend  # noqa: F401
    import reflex_core.gguf  # noqa: F401
    import reflex_core.gguf_index  # noqa: F401
    import reflex_core.modelfile  # noqa: F401
    import reflex_core.tokenizer  # noqa: F401
    import reflex_core.tokenizer.bpe_full  # noqa: F401
    import reflex_core.tokenizer.prompt_scoped  # noqa: F401
    import reflex_core.tokenizer.tables  # noqa: F401

    _families()


TARGETS: dict[str, Callable[[bytes], None]] = {
    "reader": reader, "tokenizer": tokenizer, "hparams": hparams, "index": index}


def cleanup() -> None:
    if _dir is not None:
        shutil.rmtree(_dir, ignore_errors=True)
