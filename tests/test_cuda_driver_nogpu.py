"""reflex_core.cuda without a GPU (CI): error messages, the CUDA start (against a stub libcuda),
parameter packing, launch plumbing (against a fake cuda-bindings module), the mmap address
helper, the upload and its failure path, the decode-graph switch, no numpy.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from reflex_core.cuda import driver, manifest, memory, modules, upload
from reflex_core.errors import CudaError, CudaUnavailable

ROOT = Path(__file__).resolve().parent.parent


def run_py(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=e, timeout=120)


# --- errors when CUDA is unusable ------------------------------------------------------------
def test_init_without_driver_is_one_clear_line():
    r = run_py("""
        from reflex_core.cuda import driver
        from reflex_core.errors import CudaUnavailable
        try:
            d = driver.init()
        except CudaUnavailable as e:
            print("UNAVAILABLE", str(e))
        else:
            print("HAVE_GPU", d.name)
        """)
    assert r.returncode == 0, r.stderr
    out = r.stdout.strip()
    if out.startswith("HAVE_GPU"):
        pytest.skip("this machine has a usable GPU")
    assert out.startswith("UNAVAILABLE"), out
    msg = out.split(" ", 1)[1]
    assert "\n" not in msg and len(msg) < 400
    assert any(s in msg for s in ("NVIDIA driver", "no CUDA GPU", "REFLEX_SKIP_CUDA",
                                  "this GPU is")), msg
    assert "Traceback" not in r.stderr


@pytest.fixture(scope="module")
def stub_libcuda(tmp_path_factory) -> Path:
    """tests/native/stub_libcuda.c built as ``libcuda.so.1``: a driver the early init can
    talk to without a GPU. Returns the folder to put on LD_LIBRARY_PATH."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("no C compiler (cc/gcc): these tests build tests/native/stub_libcuda.c")
    out = tmp_path_factory.mktemp("stubcuda")
    proc = subprocess.run([cc, "-shared", "-fPIC", "-O1", "-Wall", "-o",
                           str(out / "libcuda.so.1"), str(ROOT / "tests/native/stub_libcuda.c")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    # a kernels manifest for an sm_90 build (no module is loaded in these tests), so they do not
    # depend on where reflex_core is imported from (run_py puts the source tree first)
    (out / "kernels").mkdir()
    (out / "kernels" / "manifest.json").write_text(json.dumps(
        {"skipped": False, "nvcc": "13.0", "sass": ["sm_90"], "ptx": "compute_90",
         "modules": {"core": "0"}}))
    return out


def _with_stub(stub: Path, **knobs: str) -> dict:
    env = {"LD_LIBRARY_PATH": str(stub) + os.pathsep + os.environ.get("LD_LIBRARY_PATH", ""),
           "REFLEX_KERNEL_DIR": str(stub / "kernels")}
    env.update({k: str(v) for k, v in knobs.items()})
    return env


INIT_AND_PRINT = """
    import sys
    {pre}
    from reflex_core.cuda import driver
    from reflex_core.errors import CudaUnavailable
    try:
        driver.init()
    except CudaUnavailable as e:
        print("MSG", e)
    else:
        print("INIT_OK")
    """


def test_missing_bindings_is_one_clear_line(stub_libcuda):
    # The driver answers (the stub), but cuda-bindings cannot be imported.
    r = run_py(INIT_AND_PRINT.format(pre='sys.modules["cuda"] = None'), env=_with_stub(stub_libcuda))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("MSG") and "cuda-bindings" in r.stdout, r.stdout
    assert "pip install cuda-bindings" in r.stdout and r.stdout.count("\n") == 1


@pytest.mark.parametrize("knobs,expect", [
    ({"STUB_CUINIT": 100}, "no CUDA GPU found; use --backend cpu"),
    ({"STUB_COUNT": 0}, "no CUDA GPU found; use --backend cpu"),
    ({"STUB_CUINIT": 35}, "the NVIDIA driver is too old"),
    ({"STUB_CUINIT": 999}, "cuInit failed: CUDA_ERROR_UNKNOWN (unknown error)"),
    ({"STUB_CUINIT": 4242}, "cuInit failed: CUresult 4242"),
    ({"STUB_CTX": 2}, "cuDevicePrimaryCtxRetain failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory)"),
    ({"STUB_SM": 50}, "this GPU is sm_50"),
])
def test_early_init_errors_are_one_line(stub_libcuda, knobs, expect):
    r = run_py(INIT_AND_PRINT.format(pre=""), env=_with_stub(stub_libcuda, **knobs))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("MSG "), r.stdout
    msg = r.stdout[4:].strip()
    assert expect in msg and "\n" not in msg, msg
    assert "Traceback" not in r.stderr


def test_early_init_adopts_the_stub_context(stub_libcuda):
    # Success path of the ctypes init: the context handle is the stub's, current on the thread
    # that ran it, and every step is timed.
    r = run_py("""
        import ctypes
        from reflex_core.cuda import early
        e = early.run(0)
        lib = ctypes.CDLL("libcuda.so.1")
        cur = ctypes.c_void_p()
        assert lib.cuCtxGetCurrent(ctypes.byref(cur)) == 0
        print(e.name, e.sm, e.count, e.total_mem, e.driver_version, e.ctx == cur.value,
              sorted(e.steps))
        try:
            early.run(3)
        except early.EarlyError as err:
            print("ERR", err.step, err.detail)
        """, env=_with_stub(stub_libcuda, STUB_SM=89))
    assert r.returncode == 0, r.stderr
    first, second = r.stdout.strip().splitlines()
    assert first.startswith("Stub GPU 89 1 17179869184 13000 True"), first
    assert "'cuInit'" in first and "'primary context'" in first and "'dlopen libcuda'" in first
    assert second == "ERR cuDeviceGet GPU 3 does not exist (1 visible)"


@pytest.mark.parametrize("preset", [None, "4"])
def test_cuda_start_sets_the_driver_env_on_the_main_thread_then_puts_it_back(stub_libcuda,
                                                                           preset):
    # The driver sees one work queue (unless the user chose) and eager module loading; start()
    # sets them on the main thread before its thread starts, wait() removes them there again
    # (children and later libraries inherit nothing) -- on success and on failure alike (here
    # cuda-bindings is missing, so the start fails after the context exists).
    env = _with_stub(stub_libcuda)
    env.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    if preset:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = preset
    r = run_py("""
        import ctypes, os, sys
        sys.modules["cuda"] = None
        os.environ.pop("CUDA_MODULE_LOADING", None)
        from reflex_core.cuda import start
        s = start.start()
        during = os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"), os.environ["CUDA_MODULE_LOADING"]
        try:
            s.wait()
        except Exception as e:
            print(type(e).__name__)
        lib = ctypes.CDLL("libcuda.so.1")
        lib.stub_seen_env.restype = ctypes.c_char_p
        print(lib.stub_seen_env().decode(), *during, os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"),
              os.environ.get("CUDA_MODULE_LOADING"))
        """, env=env)
    assert r.returncode == 0, r.stderr
    v = preset or "1"
    assert r.stdout.split("\n")[:2] == ["CudaUnavailable", f"{v},EAGER {v} EAGER {preset} None"]


def test_cuda_start_off_the_main_thread_leaves_the_env_alone(stub_libcuda):
    # setenv while another thread may read the environment is undefined behaviour in glibc:
    # a start made on another thread runs with the driver's defaults instead. early.run itself
    # never touches the environment.
    env = _with_stub(stub_libcuda)
    env.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    r = run_py("""
        import ctypes, os, sys, threading
        sys.modules["cuda"] = None
        os.environ.pop("CUDA_MODULE_LOADING", None)
        from reflex_core.cuda import early, start
        lib = ctypes.CDLL("libcuda.so.1")
        lib.stub_seen_env.restype = ctypes.c_char_p
        early.run(0)
        print(lib.stub_seen_env().decode())
        th = threading.Thread(target=lambda: start.start()._ready.wait())
        th.start()
        th.join()
        print(lib.stub_seen_env().decode(), os.environ.get("CUDA_MODULE_LOADING"),
              start.current().succeeded())
        """, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["-,-", "-,- None False"]


def test_cuda_start_reports_failure_through_wait(stub_libcuda):
    # The background start (two threads) hands the init error to wait(); succeeded() is False.
    r = run_py("""
        import sys
        sys.modules["cuda"] = None
        from reflex_core.cuda import start
        from reflex_core.errors import CudaUnavailable
        assert start.current() is None
        s = start.start()
        assert start.start() is s and start.current() is s
        try:
            s.wait()
        except CudaUnavailable as e:
            print("OK", s.succeeded(), s.starting(), "cuda-bindings" in str(e))
        """, env=_with_stub(stub_libcuda))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "OK False False True"


def test_init_error_is_sticky_and_smoke_raises_same():
    r = run_py("""
        from reflex_core.cuda import driver, smoke, start
        from reflex_core.errors import CudaUnavailable
        msgs = []
        for f in (driver.init, smoke.smoke, lambda: start.start().wait()):
            try:
                f()
                print("HAVE_GPU")
                raise SystemExit(0)
            except CudaUnavailable as e:
                msgs.append(str(e))
        print(len(set(msgs)))
        """)
    assert r.returncode == 0, r.stderr
    if "HAVE_GPU" in r.stdout:
        pytest.skip("this machine has a usable GPU")
    assert r.stdout.strip() == "1"


class _FakeStartSteps:
    """Stands in for the init thread's steps (early.run, driver.init, the module loads),
    recording which thread loaded which package; early.run waits for ``go``."""

    def __init__(self, monkeypatch):
        from reflex_core.cuda import early

        self.go = threading.Event()
        self.loads = []
        monkeypatch.setattr(early, "run", lambda ordinal: self.go.wait() and None)
        monkeypatch.setattr(driver, "init", lambda ordinal, early_result=None: "device")
        monkeypatch.setattr(driver, "current_device", lambda: "device")
        monkeypatch.setattr(manifest, "has_kernels", lambda package: package != "no_kernels")
        monkeypatch.setattr(modules, "load_modules", lambda names=None, package="reflex_core":
                            self.loads.append((package, threading.current_thread().name)))


def test_cuda_start_loads_requested_packages_after_the_core(monkeypatch):
    from reflex_core.cuda import start

    for k in start.DRIVER_ENV:
        monkeypatch.delenv(k, raising=False)
    steps = _FakeStartSteps(monkeypatch)
    s = start.CudaStart()
    assert s.starting() and os.environ["CUDA_MODULE_LOADING"] == "EAGER"
    s.load_package("plugin_a")  # before the core's modules: queued for the init thread
    s.load_package("plugin_a")  # once
    s.load_package("no_kernels")  # nothing to load
    s.load_package("reflex_core")  # the core's load anyway
    steps.go.set()
    assert s.wait() == "device" and s.succeeded()
    init = "reflex-cuda-init"
    assert steps.loads == [("reflex_core", init), ("plugin_a", init)]
    assert not any(k in os.environ for k in start.DRIVER_ENV)  # wait() put the env back
    s.load_package("plugin_b")  # the thread has finished: the next wait() loads it here
    assert steps.loads[-1][0] == "plugin_a"
    assert s.wait() == "device"
    assert steps.loads[-1] == ("plugin_b", threading.current_thread().name)
    assert s.span()[0] <= s.span()[1] == s.modules_span()[0] <= s.modules_span()[1]


def test_cuda_start_plugin_load_failure_is_sticky(monkeypatch):
    from reflex_core.cuda import start

    steps = _FakeStartSteps(monkeypatch)
    steps.go.set()
    s = start.CudaStart()
    s.wait()

    def fail(names=None, package="reflex_core"):
        raise CudaUnavailable(f"{package} was built with REFLEX_SKIP_CUDA=1")

    monkeypatch.setattr(modules, "load_modules", fail)
    s.load_package("plugin_c")
    for _ in range(2):
        with pytest.raises(CudaUnavailable, match="plugin_c was built"):
            s.wait()
    assert not s.succeeded()


def test_import_is_light():
    r = run_py("""
        import sys
        import reflex_core.cuda.start
        print(sorted(m for m in sys.modules if m.startswith("reflex_core")))
        import reflex_core.cuda.driver, reflex_core.cuda.modules, reflex_core.cuda.memory
        import reflex_core.cuda.upload, reflex_core.cuda.smoke, reflex_core.backends.cuda_backend
        heavy = [m for m in ("numpy", "gguf", "cuda.bindings.driver") if m in sys.modules]
        print(heavy)
        """)
    assert r.returncode == 0, r.stderr
    # the CUDA start is importable before anything else: nothing of Reflex beyond itself
    assert r.stdout.splitlines() == [
        "['reflex_core', 'reflex_core.cuda', 'reflex_core.cuda.start']", "[]"]


# --- manifest / coverage ---------------------------------------------------------------------
FULL = {"skipped": False, "nvcc": "13.0.88", "modules": {"core": "x"},
        "sass": ["sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_103", "sm_110", "sm_120",
                 "sm_121"], "ptx": "compute_121"}


def test_image_for():
    assert manifest.image_for(90, FULL) == "sass"
    assert manifest.image_for(87, FULL) == "sass"  # sm_86 SASS runs on sm_87
    one = dict(FULL, sass=["sm_90"], ptx="compute_90")
    assert manifest.image_for(90, one) == "sass"
    assert manifest.image_for(100, one) == "ptx"  # the driver JITs compute_90 PTX
    assert manifest.image_for(89, one) is None
    assert manifest.image_for(86, dict(FULL, sass=["sm_80"], ptx="compute_80")) == "sass"


def test_best_cubin_is_the_one_the_driver_would_pick():
    m = dict(FULL, cubins=True)
    sass = sorted(int(t[3:]) for t in FULL["sass"])
    for sm in (80, 86, 87, 89, 90, 100, 103, 120, 121):
        fits = [t for t in sass if t // 10 == sm // 10 and t % 10 <= sm % 10]
        assert manifest.best_cubin(sm, m) == (max(fits) if fits else None), sm
    assert manifest.best_cubin(87, m) == 86 and manifest.best_cubin(90, m) == 90
    assert manifest.best_cubin(75, m) is None  # too old: coverage_error refuses it anyway
    assert manifest.best_cubin(130, dict(m, ptx="compute_121")) is None  # the fatbin's PTX
    assert manifest.best_cubin(90, FULL) is None  # an older build without cubins: the fatbin


def test_coverage_error_message():
    msg = manifest.coverage_error(75, FULL)
    assert msg == ("reflex_core was built for sm_80..sm_121 (PTX compute_121); this GPU is "
                   "sm_75; rebuild with REFLEX_CUDA_ARCH=sm_75")
    assert manifest.coverage_error(90, FULL) is None


def test_manifest_missing_or_skipped(tmp_path, monkeypatch):
    monkeypatch.setenv("REFLEX_KERNEL_DIR", str(tmp_path))
    with pytest.raises(CudaUnavailable, match="REFLEX_SKIP_CUDA.*reinstall without"):
        manifest.read_manifest()
    (tmp_path / "manifest.json").write_text(json.dumps({"skipped": True, "modules": {}}))
    with pytest.raises(CudaUnavailable) as ei:
        manifest.read_manifest()
    assert "built with REFLEX_SKIP_CUDA=1" in str(ei.value)
    assert "reinstall without REFLEX_SKIP_CUDA with nvcc available" in str(ei.value)
    (tmp_path / "manifest.json").write_text(json.dumps(FULL))
    assert manifest.read_manifest()["ptx"] == "compute_121"


# --- parameter packing -----------------------------------------------------------------------
def test_packer_each_sig_char():
    p = modules.packer("PiIqQfd")
    vals = (0x7F00DEADBEEF, -5, 0xFFFFFFFE, -(2**40), 2**63 + 5, 1.1, 1.1)
    addr = p.pack(vals)
    assert addr == ctypes.addressof(p.ptrs)
    want = [struct.pack("<Q", vals[0]), struct.pack("<i", -5), struct.pack("<I", 0xFFFFFFFE),
            struct.pack("<q", -(2**40)), struct.pack("<Q", 2**63 + 5), struct.pack("<f", 1.1),
            struct.pack("<d", 1.1)]
    ptrs = (ctypes.c_void_p * 7).from_address(addr)
    for i, w in enumerate(want):
        # the i-th kernelParams pointer points at the i-th 8-byte slot holding the value
        assert ptrs[i] == ctypes.addressof(p.buf) + 8 * i
        assert ctypes.string_at(ptrs[i], len(w)) == w, f"param {i} ({p.sig[i]})"
    # every slot is 8-byte aligned (the driver copies sizeof(param) bytes from each pointer)
    assert all(ptrs[i] % 8 == 0 for i in range(7))
    assert modules.packer("PiIqQfd") is p


def test_packer_rejects_unknown_char():
    with pytest.raises(ValueError, match="unknown parameter kind 'x'"):
        modules.packer("Px")


class FakeDriver:
    """Stands in for cuda.bindings.driver: records launches, decoding kernelParams."""

    class R(int):
        name = "CUDA_ERROR_INVALID_VALUE"

    def __init__(self, register_ok=True):
        self.launches = []
        self.copies = []
        self.register_ok = register_ok
        self.registered = []
        self.events = []  # context synchronizations and unregistrations, in order
        self.CU_MEMHOSTREGISTER_READ_ONLY = 8

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra):
        sig = f["sig"]
        ptrs = (ctypes.c_void_p * len(sig)).from_address(params)
        fmt = {"P": "<Q", "i": "<i", "I": "<I", "q": "<q", "Q": "<Q", "f": "<f", "d": "<d"}
        vals = tuple(struct.unpack(fmt[c], ctypes.string_at(ptrs[i], struct.calcsize(fmt[c])))[0]
                     for i, c in enumerate(sig))
        self.launches.append((f["name"], (gx, gy, gz), (bx, by, bz), shmem, vals, extra))
        return (0,)

    def cuMemHostRegister(self, start, length, flags):
        self.registered.append((start, length, flags))
        return (0,) if self.register_ok else (FakeDriver.R(801),)

    def cuMemcpyHtoD(self, dst, src, n):
        self.copies.append((dst, src, n))
        return (0,)

    def cuMemcpyHtoDAsync(self, dst, src, n, stream):
        self.copies.append((dst, src, n))
        return (0,)

    def cuStreamCreate(self, flags):
        return (0, object())

    def cuStreamSynchronize(self, stream):
        return (0,)

    def cuStreamDestroy(self, stream):
        return (0,)

    def cuCtxSetCurrent(self, ctx):  # worker threads bind the context
        return (0,)

    def cuCtxSynchronize(self):
        self.events.append("ctx sync")
        return (0,)

    def cuMemHostUnregister(self, start):
        self.events.append(("unregister", start))
        return (0,)

    def cuGetErrorName(self, e):
        return (1, None)

    def cuGetErrorString(self, e):
        return (1, None)


@pytest.fixture
def fake(monkeypatch):
    fd = FakeDriver()
    monkeypatch.setattr(driver, "_d", fd)
    monkeypatch.setattr(driver, "_SUCCESS", 0)
    monkeypatch.setattr(driver, "_STREAM", None)
    monkeypatch.setattr(driver._tls, "bound", True, raising=False)
    if driver._device is None:  # worker threads bind "the context" of a stand-in device
        import types

        monkeypatch.setattr(driver, "_device", types.SimpleNamespace(ctx=None))
    return fd


SIGS = {"reflex_rope": "PPPiiiidddddd", "reflex_add": "PPPi"}  # as a manifest records them


def _kernels(fake_fns=SIGS):
    k = modules.Kernels("core", "reflex_core", None, "sass", dict(SIGS))
    for name, sig in fake_fns.items():  # FakeDriver decodes kernelParams by the "sig"
        k._fns[name] = {"name": name, "sig": sig}
    return k


def test_launch_packs_params_by_the_manifest_signature(fake):
    k = _kernels()
    args = (0x1000, 0x2000, 0x3000, 16, 128, 64, 1, 1e6, 0.25, 1.0, 1.0, 3.0, 27.0)
    k.launch("reflex_rope", (16, 7), 64, args)
    name, grid, block, shmem, vals, extra = fake.launches[-1]
    assert (name, grid, block, shmem, extra) == ("reflex_rope", (16, 7, 1), (64, 1, 1), 0, 0)
    assert vals == args
    k.launch("reflex_add", 3, (256,), (1, 2, 3, -1), shmem=128)
    assert fake.launches[-1][1:5] == ((3, 1, 1), (256, 1, 1), 128, (1, 2, 3, -1))
    n = modules.launch_count()
    k.launch("reflex_add", 1, 256, (4, 5, 6, 7))
    assert modules.launch_count() == n + 1 and fake.launches[-1][4] == (4, 5, 6, 7)


def test_pdl_launches_the_core_kernels_with_programmatic_serialization(fake, monkeypatch):
    """While a decode graph is captured (modules.pdl), the core's kernels launch through
    cuLaunchKernelEx with programmatic stream serialization (their RX_PDL_ENTRY waits); a plugin's
    kernels, which make no such promise, and every launch outside the capture stay plain."""
    import types

    class Config:
        pass

    class Attr:
        def __init__(self):
            self.value = types.SimpleNamespace()

    ex = []

    def launch_ex(config, f, params, extra):
        ex.append((f["name"], config))
        return (0,)

    monkeypatch.setattr(fake, "CUlaunchConfig", Config, raising=False)
    monkeypatch.setattr(fake, "CUlaunchAttribute", Attr, raising=False)
    monkeypatch.setattr(fake, "CUlaunchAttributeID", types.SimpleNamespace(
        CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION="pss"), raising=False)
    monkeypatch.setattr(fake, "cuLaunchKernelEx", launch_ex, raising=False)
    k = _kernels()
    plugin = modules.Kernels("attn", "reflex_someplugin", None, "sass", dict(SIGS))
    plugin._fns["reflex_add"] = {"name": "reflex_add", "sig": "PPPi"}
    monkeypatch.setattr(modules, "pdl", True)
    k.launch("reflex_add", (5, 2), 128, (1, 2, 3, 4), shmem=64)
    plugin.launch("reflex_add", 1, 32, (1, 2, 3, 4))
    monkeypatch.setattr(modules, "pdl", False)
    k.launch("reflex_add", 1, 32, (1, 2, 3, 4))
    assert [name for name, _ in ex] == ["reflex_add"]
    c = ex[0][1]
    assert (c.gridDimX, c.gridDimY, c.gridDimZ, c.blockDimX, c.blockDimY, c.blockDimZ,
            c.sharedMemBytes, c.numAttrs) == (5, 2, 1, 128, 1, 1, 64, 1)
    assert c.attrs[0].id == "pss" and c.attrs[0].value.programmaticStreamSerializationAllowed == 1
    assert len(fake.launches) == 2  # the plugin's launch and the one after the capture: plain


def test_allow_shmem_opts_in_once_within_the_device_limit(fake, monkeypatch):
    """Kernels.allow_shmem: up to 32 KB nothing to do; past it the kernel's dynamic shared memory
    attribute is set once per size (the largest kept), after asking the device's opt-in limit
    once; a size over that limit is refused (False, nothing set) so the caller takes another
    kernel. Kernels.multiprocessors asks the device once too."""
    import types

    asked, attrs = [], []

    def get_attr(attr, dev):
        asked.append((attr, dev))
        return (0, {"optin": 99 << 10, "sms": 132}[attr])

    def set_attr(f, attr, value):
        attrs.append((f["name"], attr, value))
        return (0,)

    monkeypatch.setattr(fake, "CUdevice_attribute", types.SimpleNamespace(
        CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN="optin",
        CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT="sms"), raising=False)
    monkeypatch.setattr(fake, "CUfunction_attribute", types.SimpleNamespace(
        CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES="maxdyn"), raising=False)
    monkeypatch.setattr(fake, "cuDeviceGetAttribute", get_attr, raising=False)
    monkeypatch.setattr(fake, "cuFuncSetAttribute", set_attr, raising=False)
    monkeypatch.setattr(driver, "current_device", lambda: types.SimpleNamespace(handle="dev0"))
    monkeypatch.setattr(modules, "_attrs", {})
    k = _kernels()
    assert k.allow_shmem("reflex_add", 32 << 10) and asked == [] and attrs == []
    assert k.allow_shmem("reflex_add", 48 << 10)
    assert k.allow_shmem("reflex_add", 40 << 10)  # under the size already allowed
    assert k.allow_shmem("reflex_add", 64 << 10)
    assert not k.allow_shmem("reflex_add", 99 << 10)  # no room left for static shared memory
    assert asked == [("optin", "dev0")]
    assert attrs == [("reflex_add", "maxdyn", 48 << 10), ("reflex_add", "maxdyn", 64 << 10)]
    # the multiprocessor count (the GEMV launchers' block shapes): asked once as well
    assert k.multiprocessors() == 132 and k.multiprocessors() == 132
    assert asked == [("optin", "dev0"), ("sms", "dev0")]


def test_blocks_per_sm_asks_the_driver_once_per_kernel_and_sizes(fake, monkeypatch):
    """Kernels.blocks_per_sm: the driver's occupancy count for the kernel's function, threads and
    dynamic shared memory, asked once per (kernel, threads, bytes); a driver error is a
    CudaError naming the call."""
    asked = []

    def occupancy(f, threads, shmem):
        asked.append((f["name"], threads, shmem))
        return (0, 2 if shmem < (100 << 10) else 1)

    monkeypatch.setattr(fake, "cuOccupancyMaxActiveBlocksPerMultiprocessor", occupancy,
                        raising=False)
    k = _kernels()
    assert k.blocks_per_sm("reflex_add", 288, 90 << 10) == 2
    assert k.blocks_per_sm("reflex_add", 288, 127 << 10) == 1
    assert k.blocks_per_sm("reflex_add", 288, 90 << 10) == 2
    assert asked == [("reflex_add", 288, 90 << 10), ("reflex_add", 288, 127 << 10)]
    monkeypatch.setattr(fake, "cuOccupancyMaxActiveBlocksPerMultiprocessor",
                        lambda f, t, m: (1, 0), raising=False)
    with pytest.raises(driver.CudaError, match="cuOccupancyMaxActiveBlocksPerMultiprocessor"):
        k.blocks_per_sm("reflex_add", 256, 0)


def test_launch_rejects_bad_args(fake):
    k = _kernels()
    with pytest.raises(ValueError, match="reflex_add: signature 'PPPi' has 4 parameters, got 3"):
        k.launch("reflex_add", 1, 256, (1, 2, 3))
    with pytest.raises(ValueError, match="do not fit signature"):
        k.launch("reflex_add", 1, 256, (1, 2, 3, 2**31))
    with pytest.raises(ValueError, match="do not fit signature"):
        k.launch("reflex_add", 1, 256, (-1, 2, 3, 4))  # negative pointer
    with pytest.raises(ValueError, match="do not fit signature"):
        k.launch("reflex_add", 1, 256, (1, 2, 3, 4.5))  # a float for an int
    with pytest.raises(CudaError, match="'reflex_nope' is not in reflex_core's 'core' kernels"):
        k.launch("reflex_nope", 1, 256, ())


def test_launch_error_names_the_kernel(fake, monkeypatch):
    k = _kernels()
    monkeypatch.setattr(fake, "cuLaunchKernel", lambda *a: (FakeDriver.R(1),))
    with pytest.raises(CudaError, match=r"cuLaunchKernel\(reflex_add, grid=\(1,1,1\)"):
        k.launch("reflex_add", 1, 256, (1, 2, 3, 4))


def test_limits_come_from_the_manifest(tmp_path, monkeypatch):
    monkeypatch.setenv("REFLEX_KERNEL_DIR", str(tmp_path))
    monkeypatch.setattr(modules, "_limits", {})
    (tmp_path / "manifest.json").write_text(json.dumps(
        dict(FULL, limits={"MOE_MAX_E": 1024, "ATT_MAX_HEAD": 256})))
    assert modules.limit("MOE_MAX_E") == 1024 and modules.limit("ATT_MAX_HEAD") == 256
    with pytest.raises(KeyError, match="no REFLEX_NOPE .known: ATT_MAX_HEAD, MOE_MAX_E"):
        modules.limit("NOPE")


def test_check():
    r = FakeDriver.R(1)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(driver, "_SUCCESS", 0)
        m.setattr(driver, "_d", FakeDriver())
        assert driver.check((0, 5)) == 5
        assert driver.check((0,)) is None
        assert driver.check((0, 1, 2)) == (1, 2)
        with pytest.raises(CudaError, match=r"cuFoo\(3\) failed: CUDA_ERROR_INVALID_VALUE"):
            driver.check((r, 5), "cuFoo(3)")


# --- host buffers: addresses, registration, upload --------------------------------------------
def test_buffer_address_readonly_mmap(tmp_path):
    data = os.urandom(3 * mmap.PAGESIZE + 123)
    f = tmp_path / "w.bin"
    f.write_bytes(data)
    with open(f, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    addr, n = upload.buffer_address(mm)
    assert n == len(data) and addr % mmap.PAGESIZE == 0
    assert ctypes.string_at(addr, n) == data
    assert ctypes.string_at(addr + 5000, 100) == data[5000:5100]
    mm.close()  # the helper released its buffer export: closing works


def test_buffer_address_other_buffers():
    b = b"hello world"
    addr, n = upload.buffer_address(b)
    assert n == 11 and ctypes.string_at(addr, n) == b
    ba = bytearray(b"abcdef")
    a2, n2 = upload.buffer_address(memoryview(ba)[2:])
    assert n2 == 4 and ctypes.string_at(a2, 4) == b"cdef"
    with pytest.raises(TypeError):
        upload.buffer_address(12345)


def test_page_range():
    P = 4096
    assert upload.page_range(P * 3 + 10, 100, P) == (P * 3, P)
    assert upload.page_range(P * 3, P, P) == (P * 3, P)
    assert upload.page_range(P * 3 + 1, P, P) == (P * 3, 2 * P)


@pytest.mark.parametrize("register_ok", [True, False])
def test_upload_registers_then_copies(fake, tmp_path, register_ok):
    fake.register_ok = register_ok
    data = os.urandom(2 * mmap.PAGESIZE + 77)
    f = tmp_path / "w.bin"
    f.write_bytes(data)
    with open(f, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    base, _ = upload.buffer_address(mm)
    info = upload.upload_host_region(0xD000, mm, 100, len(data) - 100)
    start, length, flags = fake.registered[-1]
    assert start == base and start % mmap.PAGESIZE == 0 and length % mmap.PAGESIZE == 0
    assert start + length >= base + len(data) and flags == 8
    assert fake.copies[-1] == (0xD000, base + 100, len(data) - 100)
    assert info["method"] == ("registered" if register_ok else "pageable")
    assert bool(info["registration"].regs) == register_ok
    with pytest.raises(ValueError, match="outside a buffer"):
        upload.upload_host_region(0xD000, mm, 100, len(data))


def test_upload_in_chunks_covers_the_range_exactly(fake, tmp_path):
    """Chunks are page-aligned and disjoint, and their copies tile [offset, offset+n) once."""
    data = os.urandom(7 * mmap.PAGESIZE + 123)
    f = tmp_path / "w.bin"
    f.write_bytes(data)
    with open(f, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    base, _ = upload.buffer_address(mm)
    off, n = 300, len(data) - 300 - 11
    info = upload.upload_host_region(0x10000, mm, off, n, chunk=2 * mmap.PAGESIZE, threads=3)
    regs = sorted(fake.registered)
    assert info["chunks"] == len(regs) == 4 and info["threads"] == 3
    for (s0, l0, _), (s1, _, _) in zip(regs, regs[1:]):
        assert s0 % mmap.PAGESIZE == 0 and s0 + l0 == s1
    copies = sorted(fake.copies, key=lambda c: c[1])
    assert copies[0][1] == base + off and copies[0][0] == 0x10000
    for (d0, s0, n0), (d1, s1, _) in zip(copies, copies[1:]):
        assert s0 + n0 == s1 and d1 - d0 == s1 - s0
    assert sum(c[2] for c in copies) == n


def test_round_size():
    assert memory._round_size(1) == 512
    assert memory._round_size(513) == 1024
    assert memory._round_size(1 << 20) == 1 << 20
    assert memory._round_size((1 << 20) + 1) == 2 << 20
    assert memory._round_size(5 * (1 << 20) - 3) == 5 << 20


def test_failed_upload_waits_for_queued_copies_before_unpinning(fake, tmp_path, monkeypatch):
    """A worker's copy fails after other chunks' async copies were queued: the call joins every
    worker, synchronizes the context, only then releases the registrations, and raises the
    copy's error."""
    data = os.urandom(8 * mmap.PAGESIZE)
    f = tmp_path / "w.bin"
    f.write_bytes(data)
    with open(f, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    queued = []

    def copy_async(dst, src, n, stream):
        if len(queued) == 2:
            return (FakeDriver.R(1),)
        queued.append((dst, src, n))
        return (0,)

    monkeypatch.setattr(fake, "cuMemcpyHtoDAsync", copy_async)
    with pytest.raises(CudaError, match=r"cuMemcpyHtoDAsync\(weights"):
        upload.upload_host_region(0x20000, mm, 0, len(data), chunk=mmap.PAGESIZE, threads=3)
    assert len(queued) == 2 and fake.events[0] == "ctx sync"
    unregistered = sorted(e[1] for e in fake.events[1:])
    assert unregistered == sorted(r[0] for r in fake.registered)  # every pinned chunk, after
    assert not [t for t in threading.enumerate() if t.name.startswith("reflex-upload")]


@pytest.mark.parametrize("value,on", [(None, True), ("1", True), ("0", False)])
def test_decode_graphs_are_the_default_and_zero_turns_them_off(monkeypatch, value, on):
    from reflex_core.backends import cuda_graph

    if value is None:
        monkeypatch.delenv("REFLEX_CUDA_GRAPHS", raising=False)
    else:
        monkeypatch.setenv("REFLEX_CUDA_GRAPHS", value)
    assert cuda_graph.enabled() is on


def test_no_decode_graph_off_the_gpu(model_files, monkeypatch):
    from reflex_core import engine
    from reflex_core.testing.modelwriter import ModelShape

    monkeypatch.delenv("REFLEX_CUDA_GRAPHS", raising=False)
    lm = engine.load(str(model_files(ModelShape(n_vocab=200))), "cpu")[0]
    try:
        assert engine.decode_graph(lm) is None
    finally:
        lm.close()


@pytest.mark.parametrize("T,H,n_cells,want", [
    (1, 16, 511, 1),  # a short cache: one slice
    (1, 16, 512, 2),  # from SPLIT_MIN_CELLS: a slice a SPLIT_CELLS cells or more
    (1, 16, 1647, 8),
    (1, 16, 1535, 7),
    (1, 32, 40960, 8),  # no more than SPLIT_BLOCKS blocks
    (1, 2, 40960, 64),  # nor REFLEX_ATT_MAX_SPLITS
    (4, 8, 4096, 8),
    (5, 8, 4096, 1),  # more than 4 tokens: the query tiles' work fills the GPU
    (4, 1025, 4096, 1),  # more (token, head) pairs than the counters
])
def test_attention_splits(T, H, n_cells, want, monkeypatch):
    """How many slices of the cache one (token, head) of the decode attention runs in: from the
    cache's size and the launch's shape only (a captured decode graph replays it)."""
    from reflex_core.backends.cuda_backend import attention_splits
    from reflex_core.cuda import modules

    monkeypatch.setitem(modules._limits, modules.CORE_PACKAGE, {"ATT_MAX_SPLITS": 64})

    assert attention_splits(T, H, n_cells) == want


@pytest.mark.parametrize("T,dk,want", [
    (1, 128, ("reflex_qk_norm_rope_store", 1, 128)),  # decode: a block a head, a thread a dim
    (15, 192, ("reflex_qk_norm_rope_store", 1, 256)),
    (16, 128, ("reflex_qk_norm_rope_rows", 8, 256)),  # a prefill: a warp a head, 8 a block
    (1518, 512, ("reflex_qk_norm_rope_rows", 8, 256)),
])
def test_qk_norm_rope_kernel_choice(T, dk, want):
    """The attention prologue's kernel (heads a block, threads) for T tokens of head size dk:
    the GPU tests check that both give the same bits."""
    from reflex_core.backends.cuda_backend import qkr_kernel

    assert qkr_kernel(T, dk) == want


@pytest.mark.parametrize("T,dk,dv,ptr,want", [
    (1, 128, 128, 0, None),  # decode: the flash-decoding kernel
    (15, 128, 128, 0, None),
    (16, 128, 128, 0, ("reflex_attention_tiled128", 32)),
    (300, 64, 40, 0, ("reflex_attention_tiled128", 32)),
    (20, 192, 128, 0, ("reflex_attention_tiled256", 16)),  # d_k != d_v (MLA-like)
    (20, 256, 256, 0, ("reflex_attention_tiled256", 16)),
    (20, 42, 42, 0, None),  # not a multiple of 4: no float4 rows
    (20, 288, 288, 0, None),  # over the tiles' 256
    (20, 128, 128, 8, None),  # a buffer not 16-byte aligned
])
def test_attention_kernel_choice(T, dk, dv, ptr, want):
    """Which attention kernel a forward of T tokens launches (the GPU tests run each one): the
    tensor-core tiles where the float32 query tiles would serve, with the same bounds."""
    from reflex_core.backends.cuda_backend import _attention_mma_kernel, _attention_tiled_kernel

    assert _attention_tiled_kernel(T, dk, dv, 0, ptr) == want
    mma = _attention_mma_kernel(T, dk, dv, 0, ptr)
    if want is None:
        assert mma is None
    elif max(dk, dv) <= 128:  # 128 tokens (8 warps) x 32 cells: Q, then 2 stages of K and V
        smem = (2 * 128 + 2 * 4 * 32) * 2 * 136
        assert mma == ("reflex_attention_mma128", 128, 256, smem, 128)
    else:  # 64 tokens (4 warps) x 16 cells, rows of 264 16-bit values
        smem = (2 * 64 + 2 * 4 * 16) * 2 * 264
        assert mma == ("reflex_attention_mma256", 64, 128, smem, 256)
