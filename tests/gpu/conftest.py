"""GPU test fixtures. Every test here is marked ``gpu``. On a machine without a GPU (no NVIDIA
driver, or no device) they all skip with the reason (``pytest -rs`` shows it). On a machine with
one they never skip: a GPU that CUDA cannot start (cuda-bindings missing, a package built
without kernels or not for this GPU, a driver too old) fails every test with the reason.

Run on the GPU machine:  ``pytest -m gpu tests/gpu``  (kernels from reflex_core/kernels, or set
REFLEX_KERNEL_DIR=/tmp/kout after ``python reflex_core/_build.py cuda /tmp/kout cuda/include``).

Fixtures
  cuda_device  the initialised reflex_core.cuda.driver.Device
  cuda_ops     a fresh CudaOps
  ref_ops      a fresh NumpyOps (the reference)
  cuda_ctx     raw memory helper for kernel tests: .alloc(nbytes) -> int, .htod(ptr, bytes_like),
               .dtoh(ptr, nbytes) -> bytes, .free(ptr); plus .kernels(module, package=...) and
               .synchronize(). Pointers still allocated at the end of a test are freed.
"""

from __future__ import annotations

import numpy as np
import pytest


def pytest_collection_modifyitems(config, items):
    here = __file__.rsplit("/", 1)[0]
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.gpu)


_state: dict = {}


def _no_gpu_here() -> str | None:
    """Why this machine has no GPU to test, or None. Asked without initialising CUDA (the
    driver reads its environment at cuInit, which reflex_core.cuda must be the first to call):
    the driver library loads and a device node exists."""
    import ctypes
    import glob

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        return f"no NVIDIA driver ({e})"
    if not glob.glob("/dev/nvidia[0-9]*"):
        return "an NVIDIA driver but no GPU device (/dev/nvidia0, ...)"
    return None


def _device_or_skip():
    if not _state:
        _state["no_gpu"] = _no_gpu_here()
    if _state["no_gpu"]:
        pytest.skip(f"no GPU here: {_state['no_gpu']}")
    if "device" not in _state:
        from reflex_core.errors import ReflexError

        try:
            from reflex_core.cuda.start import start

            _state["device"] = start().wait()  # the process's CUDA start, as `reflex` runs it
        except ReflexError as e:  # CudaUnavailable / CudaError: one line saying why
            pytest.fail(f"this machine has a GPU but CUDA did not start: {e}", pytrace=False)
    return _state["device"]


@pytest.fixture(scope="session")
def cuda_device():
    return _device_or_skip()


@pytest.fixture
def cuda_ops(cuda_device):
    from reflex_core.backends.cuda_backend import CudaOps

    ops = CudaOps()
    yield ops
    ops.synchronize()
    ops.release()


@pytest.fixture
def ref_ops():
    from reflex_core.backends.numpy_backend import NumpyOps

    return NumpyOps()


class CudaCtx:
    """Raw device memory for kernel-level tests (used by the quant-kernel tests too)."""

    def __init__(self):
        from reflex_core.cuda import driver, memory, modules

        self.driver, self.memory, self.modules = driver, memory, modules
        self._live: set[int] = set()

    def alloc(self, nbytes: int) -> int:
        p = self.memory.alloc(nbytes)
        self._live.add(p)
        return p

    def htod(self, ptr: int, data) -> None:
        self.memory.htod(ptr, data)

    def dtoh(self, ptr: int, nbytes: int) -> bytes:
        return bytes(self.memory.dtoh(ptr, nbytes))

    def free(self, ptr: int) -> None:
        self._live.discard(ptr)
        self.memory.free(ptr)

    def kernels(self, module: str, package: str = "reflex_core"):
        return self.modules.get_kernels(module, package)

    def synchronize(self) -> None:
        self.driver.synchronize()

    def close(self) -> None:
        for p in list(self._live):
            self.free(p)


@pytest.fixture
def cuda_ctx(cuda_device):
    ctx = CudaCtx()
    yield ctx
    ctx.synchronize()
    ctx.close()


@pytest.fixture
def attach_both(cuda_ops, ref_ops, tmp_path):
    """``attach_both({name: float32 array | (raw uint8 bytes, ne, ggml_type)}) -> (cuda, ref)``:
    write the tensors into a GGUF (gguf-py's writer), open it with the core reader and attach it
    to ``cuda_ops`` and ``ref_ops``. Arrays are F32 with ne = reversed(shape)."""
    opened = []

    def attach(tensors: dict):
        from reflex_core.gguf import open_gguf
        from reflex_core.testing.op_harness import write_weights

        path = write_weights(tmp_path / f"t{len(opened)}.gguf", tensors)
        g = open_gguf(str(path))
        opened.append(g)
        cuda_ops.attach(g)
        ref_ops.attach(g)
        return cuda_ops, ref_ops

    yield attach
    cuda_ops.synchronize()
    cuda_ops.release()
    for g in opened:
        g.close()


TESTOP = __import__("pathlib").Path(__file__).resolve().parent.parent / "plugins" / "testop"


@pytest.fixture(scope="session")
def testop_plugin(cuda_device, tmp_path_factory):
    """The test plugin of tests/plugins/testop (an op with a CUDA kernel of its own): its kernels
    compiled for this GPU into a temporary folder (REFLEX_KERNEL_DIR_REFLEX_TESTOP), the package
    importable, the plugin registered and its op in the registry. Yields the kernels folder."""
    import os
    import sys

    from reflex_core import _build, opreg
    from reflex_core.registry import get_host

    out = tmp_path_factory.mktemp("testop-kernels")
    env = {"REFLEX_CUDA_ARCH": f"sm_{cuda_device.sm}"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        _build.build_kernels(TESTOP / "cuda", out, [_build.core_include_dir(), TESTOP / "cuda"])
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    os.environ["REFLEX_KERNEL_DIR_REFLEX_TESTOP"] = str(out)
    sys.path.insert(0, str(TESTOP))
    from reflex_testop import plugin

    host = get_host()
    host.register(plugin, name="reflex-infer-testop")
    host.register_ops()
    yield out
    host.unregister("reflex-infer-testop")
    opreg.unregister("testop_sigmoid_mul")
    sys.path.remove(str(TESTOP))
    os.environ.pop("REFLEX_KERNEL_DIR_REFLEX_TESTOP", None)


def _gpu_and_reference(path):
    """(gguf, the file's model on the GPU, the same on NumPy)."""
    from reflex_core.backends import get_backend
    from reflex_core.gguf import open_gguf
    from reflex_core.registry import get_host

    g = open_gguf(path)
    cls = get_host().resolve(g.get("general.architecture")).load_model_class()
    gops, rops = get_backend("cuda"), get_backend("cpu")
    gops.attach(g)
    rops.attach(g)
    return g, cls.load(g, gops), cls.load(g, rops)


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) or 1.0))


@pytest.fixture
def gpu_and_reference(cuda_device):
    """``load(path) -> (gguf, GPU model, NumPy model)``, and ``rel(got, ref)``."""
    return _gpu_and_reference, _rel


@pytest.fixture
def prefill_decode_vs_reference(cuda_device):
    """``check(path, n_prompt, bound, what, n_decode=4)``: a random prompt of ``n_prompt`` tokens
    as one batch, then ``n_decode`` greedy single-token steps, on the GPU and on NumPy from the
    same file; every logit row within ``bound`` (max|diff| / max|ref|)."""

    def check(path, n_prompt: int, bound: float, what: str, n_decode: int = 4) -> None:
        g, gm, rm = _gpu_and_reference(path)
        ids = np.random.default_rng(n_prompt).integers(0, rm.n_vocab, n_prompt).tolist()
        gs, rs = gm.new_state(n_prompt + n_decode), rm.new_state(n_prompt + n_decode)
        b = rs.append(ids)
        gs.append(ids)
        rows = list(range(n_prompt))
        ref = rm.ops.to_numpy(rm.forward(b, rs, rows))
        got = gm.ops.to_numpy(gm.forward(b, gs, rows))
        assert np.all(np.isfinite(got))
        assert _rel(got, ref) < bound, f"prefill {what} T={n_prompt}: {_rel(got, ref):.3g}"
        nxt = int(ref[-1].argmax())
        for _ in range(n_decode):
            b = rs.append([nxt])
            gs.append([nxt])
            ref = rm.ops.to_numpy(rm.forward(b, rs, [0]))
            got = gm.ops.to_numpy(gm.forward(b, gs, [0]))
            assert _rel(got, ref) < bound, f"decode {what} at {b.cell0}: {_rel(got, ref):.3g}"
            nxt = int(ref[-1].argmax())
        g.close()

    return check
