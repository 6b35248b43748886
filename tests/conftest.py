"""Shared fixtures. The tests run against the INSTALLED packages (scripts/test.sh installs the
core and every plugin; for development use editable installs: pip install -e . -e plugins/*),
so entry points, packaged kernels and the import graph are the ones users get."""

import os
import tempfile

import pytest


def pytest_configure(config):
    # Caches the code writes (the plugin entry-point cache, GGUF indexes) go to a fresh folder,
    # not the user's ~/.cache; subprocesses inherit it.
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="reflex-test-cache-")


@pytest.fixture(scope="session")
def model_files(tmp_path_factory):
    """``model_files(shape, weight_type="F32", seed=0, tokenizer="none") -> Path``: a tiny random
    GGUF written once per session for each distinct set of arguments (see testing.modelwriter)."""
    from reflex_core.testing.modelwriter import write_model

    root = tmp_path_factory.mktemp("models")
    cache: dict = {}

    def get(shape, weight_type: str = "F32", seed: int = 0, tokenizer: str = "none", **kw):
        key = (repr(shape), weight_type, seed, tokenizer, repr(sorted(kw.items())))
        if key not in cache:
            path = root / f"m{len(cache)}-{shape.arch}-{weight_type}-s{seed}.gguf"
            cache[key] = write_model(path, shape, weight_type=weight_type, seed=seed,
                                     tokenizer=tokenizer, **kw)
        return cache[key]

    return get


class FakeGGUF:
    """A stand-in for reflex_core.gguf.GGUFFile built in memory: metadata with value types, and
    tensors from raw bytes (``add_tensor(name, ne, ggml_type, data)``)."""

    class _Info:
        def __init__(self, name, ne, ggml_type, nbytes):
            self.name, self.ne, self.ggml_type, self.offset, self.nbytes = (
                name, tuple(ne), ggml_type, 0, nbytes)

    def __init__(self, path="fake.gguf", metadata=None, value_types=None):
        self.path = path
        self.metadata = dict(metadata or {})
        self.value_types = dict(value_types or {})
        self.tensors = {}
        self._data = {}

    def get(self, key, default=None):
        return self.metadata.get(key, default)

    def set(self, key, value, vtype):
        self.metadata[key] = value
        self.value_types[key] = vtype
        return self

    def add_tensor(self, name, ne, ggml_type, data):
        b = bytes(memoryview(data).cast("B"))
        self.tensors[name] = FakeGGUF._Info(name, ne, ggml_type, len(b))
        self._data[name] = b
        return self

    def tensor_data(self, name):
        return memoryview(self._data[name])


@pytest.fixture
def fake_gguf():
    return FakeGGUF
