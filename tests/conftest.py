"""Shared fixtures. The tests run against the INSTALLED packages (scripts/test.sh installs the
core and every plugin; for development use editable installs: pip install -e . -e plugins/*),
so entry points, packaged kernels and the import graph are the ones users get."""

import os
import sys
import tempfile
import zlib

import numpy as np
import pytest


def pytest_configure(config):
    # Caches the code writes (the plugin entry-point cache, GGUF indexes) go to a fresh folder,
    # not the user's ~/.cache; subprocesses inherit it.
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="reflex-test-cache-")


def seed_for(nodeid: str) -> int:
    """A test's random seed, from its node id (``tests/test_x.py::test_y[params]``): the same in
    every run and on every machine (``hash()`` of a str is salted per process, so a failure it
    seeded could not be reproduced), different for each test and each parametrization."""
    return zlib.crc32(nodeid.encode())


@pytest.fixture
def rng(request):
    """This test's NumPy Generator, seeded by :func:`seed_for`: a failing test run again alone
    draws the same numbers."""
    return np.random.default_rng(seed_for(request.node.nodeid))


class _NoOracle:
    """An import hook that refuses llama_cpp, saying why."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "llama_cpp":
            raise ImportError("llama_cpp (the oracle) is for tests marked @pytest.mark.oracle; "
                              "mark this test (tests/conftest.py)")
        return None


@pytest.fixture(autouse=True)
def _llama_cpp_for_oracle_tests_only(request, monkeypatch):
    """llama.cpp (llama-cpp-python) is the oracle, and the tests that use it are marked
    ``oracle``. A marked test fails, never skips, when llama_cpp cannot be imported: CI must
    not go green without the oracle. Every other test sees llama_cpp as not installed (also
    through testing.oracle's cached handle), so a test that uses it without the mark fails
    whatever ran before it."""
    if request.node.get_closest_marker("oracle"):
        try:
            import llama_cpp  # noqa: F401
        except ImportError as e:
            why = e
        else:
            return
        pytest.fail("the oracle tests need llama-cpp-python (pip install "
                    f"llama-cpp-python==0.3.36, CPU build; scripts/test.sh does): {why!r}",
                    pytrace=False)
    for name in [m for m in sys.modules if m.split(".")[0] == "llama_cpp"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [_NoOracle()] + sys.meta_path)
    oracle = sys.modules.get("reflex_core.testing.oracle")
    if oracle is not None:
        monkeypatch.setattr(oracle, "_STATE", {})  # forget an already initialised library


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


@pytest.fixture()
def index_cache(tmp_path, monkeypatch):
    """A fresh cache folder with GGUF indexes on, and no index pending from another test."""
    from reflex_core import gguf_index

    d = tmp_path / "xdg"
    monkeypatch.setenv("XDG_CACHE_HOME", str(d))
    monkeypatch.delenv("REFLEX_NO_INDEX", raising=False)
    gguf_index._pending.clear()
    yield d
    gguf_index._pending.clear()


@pytest.fixture(scope="module")
def qwen_tok_file(model_files):
    """A one-layer qwen3 file with the real Qwen3 tokenizer."""
    from reflex_core.testing.modelwriter import ModelShape

    return model_files(ModelShape(n_layer=1), tokenizer="qwen3")
