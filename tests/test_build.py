"""The AOT build helper (reflex_core/_build.py): nvcc discovery, target selection, skip mode,
the kernel signatures and limits it records in the manifest.

The real compile of every kernel happens when scripts/test.sh installs the package (a compile
error fails CI there); these tests cover the switches around it, and build the core's kernels
once for one target to check that every kernel the launchers use is in the manifest with the
arguments they pass.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from reflex_core import _build

ROOT = Path(__file__).resolve().parent.parent


def test_missing_nvcc_is_a_clear_build_error(monkeypatch, tmp_path):
    for var in ("REFLEX_NVCC", "CUDA_HOME", "CUDA_PATH", "REFLEX_SKIP_CUDA"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(_build.Path, "exists", lambda self: False)
    with pytest.raises(_build.BuildError) as e:
        _build.find_nvcc()
    msg = str(e.value)
    assert "nvcc not found" in msg and "REFLEX_SKIP_CUDA=1" in msg and "CUDA_HOME" in msg


def test_skip_writes_a_skipped_manifest_and_no_kernels(monkeypatch, tmp_path):
    monkeypatch.setenv("REFLEX_SKIP_CUDA", "1")
    src = tmp_path / "src"
    src.mkdir()
    (src / "k.cu").write_text('extern "C" __global__ void k() {}\n')
    assert _build.build_kernels(src, tmp_path / "out", log=lambda m: None) is None
    assert json.loads((tmp_path / "out" / "manifest.json").read_text()) == {
        "skipped": True, "modules": {}}
    assert not list((tmp_path / "out").glob("*.fatbin"))


def test_one_target_with_reflex_cuda_arch(monkeypatch):
    monkeypatch.setenv("REFLEX_CUDA_ARCH", "sm_90")
    assert _build.sass_targets("nvcc") == ([90], 90)
    monkeypatch.setenv("REFLEX_CUDA_ARCH", "sm_90, sm_80,sm_90")  # a list: PTX of the newest
    assert _build.sass_targets("nvcc") == ([80, 90], 90)
    for bad in ("ampere", "sm_90,ampere"):
        monkeypatch.setenv("REFLEX_CUDA_ARCH", bad)
        with pytest.raises(_build.BuildError, match="sm_XX"):
            _build.sass_targets("nvcc")


def test_default_targets_cover_sm80_to_sm90_and_newer(monkeypatch):
    monkeypatch.delenv("REFLEX_CUDA_ARCH", raising=False)
    monkeypatch.setattr(_build, "toolkit_sms", lambda nvcc: [75, 80, 86, 87, 89, 90, 100, 120])
    sms, ptx = _build.sass_targets("nvcc")
    assert sms == [80, 86, 89, 90, 100, 120] and ptx == 120


def test_compiles_a_module_into_a_fatbin_with_a_manifest(monkeypatch, tmp_path):
    """nvcc is installed here and in CI: a one-kernel module compiles for one target."""
    monkeypatch.delenv("REFLEX_SKIP_CUDA", raising=False)
    monkeypatch.setenv("REFLEX_CUDA_ARCH", "sm_80")
    src = tmp_path / "src"
    src.mkdir()
    (src / "tiny.cu").write_text(
        'extern "C" __global__ void reflex_tiny(float* y) { y[threadIdx.x] = 1.0f; }\n')
    m = _build.build_kernels(src, tmp_path / "out", log=lambda s: None)
    assert m["sass"] == ["sm_80"] and m["ptx"] == "compute_80" and "tiny" in m["modules"]
    assert m["kernels"] == {"reflex_tiny": "P"} and m["limits"] == {}
    assert (tmp_path / "out" / "tiny.fatbin").stat().st_size > 0
    # the device's cubin, kept from the same nvcc run: an ELF, its kernel named inside
    cubin = (tmp_path / "out" / "tiny.sm_80.cubin").read_bytes()
    assert m["cubins"] is True and cubin[:4] == b"\x7fELF" and b"reflex_tiny" in cubin
    assert sorted(x.name for x in (tmp_path / "out").iterdir()) == [
        "manifest.json", "tiny.fatbin", "tiny.sm_80.cubin"]
    (src / "broken.cu").write_text("this is not C++\n")
    with pytest.raises(_build.BuildError, match="nvcc failed on"):
        _build.build_kernels(src, tmp_path / "out2", log=lambda s: None)


def test_a_plugin_kernel_compiles_against_the_core_headers(monkeypatch, tmp_path):
    """What plugin_cmdclass does for a plugin's cuda/*.cu: compile with the core's headers."""
    monkeypatch.delenv("REFLEX_SKIP_CUDA", raising=False)
    monkeypatch.setenv("REFLEX_CUDA_ARCH", "sm_90")
    (tmp_path / "cuda").mkdir()
    (tmp_path / "cuda" / "moe_extra.cu").write_text(
        '#include "reflex/common.cuh"\n'
        'extern "C" __global__ void myplugin_half(const unsigned short* h, float* y) {\n'
        '    y[threadIdx.x] = rx_f16_to_f32(h[threadIdx.x]);\n}\n')
    inc = _build.core_include_dir()
    assert (inc / "reflex" / "quants.cuh").exists()
    m = _build.build_kernels(tmp_path / "cuda", tmp_path / "pkg" / "kernels",
                             [inc, tmp_path / "cuda"], log=lambda s: None)
    assert "moe_extra" in m["modules"] and m["kernels"] == {"myplugin_half": "PP"}
    cmd = _build.plugin_cmdclass(tmp_path, "pkg")
    assert "build_py" in cmd


# --- kernel signatures and limits --------------------------------------------------------------
SAMPLE = r"""
#define REFLEX_FOO_MAX 12
#  define REFLEX_BAR 0x10  // a comment
#define REFLEX_BAZ (3)
#define NOT_A_LIMIT 5
// extern "C" __global__ void commented_out(short s) {}
/* extern "C" __global__ void also_commented(short s); */
extern "C" { int host_helper(int); }
extern "C" __host__ int host_only(float x) { return 0; }
extern "C" __global__ void k_plain(const float* __restrict__ a, float *b, int n, float s,
                                   double d, unsigned u, unsigned int u2, long long q,
                                   unsigned long long Q, size_t z, const int64_t c) {}
extern "C" __global__ void __launch_bounds__(256, 2)
k_bounds(const uint8_t* __restrict__ w, int32_t T, uint32_t m, int) {
    const char* s = "extern \"C\" __global__ void in_a_string(short)";
}
extern "C" __global__ void k_none() {}
extern "C" __global__ void k_void(void);
extern "C" __global__ void k_void(void) {}
extern "C" __attribute__((global)) void __attribute__((launch_bounds(4 * 32)))
    k_pre(float* y, int n) { }
"""


def test_signature_parser_on_sample_declarations():
    assert _build.parse_kernel_signatures(SAMPLE) == {
        "k_plain": "PPifdIIqQQq", "k_bounds": "PiIi", "k_none": "", "k_void": "", "k_pre": "Pi"}
    assert _build.parse_limits(SAMPLE) == {"FOO_MAX": 12, "BAR": 16}


@pytest.mark.parametrize("decl,why", [
    ('extern "C" __global__ void k(short s) {}', "parameter 1 ('short s')"),
    ('extern "C" __global__ void k(int a, const Params p) {}', "parameter 2 ('const Params p')"),
    ('extern "C" __global__ void k(int& r) {}', "parameter 1 ('int& r')"),
    ('extern "C" __global__ void k(int a);\nextern "C" __global__ void k(float a) {}',
     "declared with two signatures ('i' and 'f')"),
])
def test_signature_parser_refuses_what_a_launch_cannot_pass(decl, why):
    with pytest.raises(_build.BuildError, match="x.cu: kernel k ") as e:
        _build.parse_kernel_signatures(decl, "x.cu")
    assert why in str(e.value) and "\n" not in str(e.value)


def test_conflicting_limits_are_a_build_error(tmp_path):
    (tmp_path / "a.cu").write_text("#define REFLEX_N 4\n")
    (tmp_path / "include" / "r").mkdir(parents=True)
    (tmp_path / "include" / "r" / "h.cuh").write_text("#define REFLEX_M 7\n")
    assert _build.source_limits(tmp_path) == {"N": 4, "M": 7}
    (tmp_path / "b.cu").write_text("#define REFLEX_N 5\n")
    with pytest.raises(_build.BuildError, match="REFLEX_N = 5, but 4 elsewhere"):
        _build.source_limits(tmp_path)


def test_macro_generated_kernels_are_read_from_the_preprocessed_source(tmp_path):
    """As cuda/quant.cu declares its kernels: one macro per type, names pasted together."""
    (tmp_path / "gen.cu").write_text(
        '#define PARAMS const float* __restrict__ x, float* y, long long n\n'
        '#define GEN(name, T) \\\n'
        '    extern "C" __global__ void __launch_bounds__(128) gen_##name(PARAMS, T v) {}\n'
        'GEN(f32, float)\nGEN(i32, int)\n')
    sigs = _build.module_signatures(_build.find_nvcc(), tmp_path / "gen.cu", [], 80)
    assert sigs == {"gen_f32": "PPqf", "gen_i32": "PPqi"}


@pytest.fixture(scope="module")
def core_build(tmp_path_factory):
    """(folder, manifest) of the core's kernels built for sm_90 (what the package build does,
    one target)."""
    mp = pytest.MonkeyPatch()
    mp.delenv("REFLEX_SKIP_CUDA", raising=False)
    mp.setenv("REFLEX_CUDA_ARCH", "sm_90")
    try:
        out = tmp_path_factory.mktemp("kernels")
        return out, _build.build_kernels(ROOT / "cuda", out, [ROOT / "cuda" / "include"],
                                         log=lambda s: None)
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def core_manifest(core_build):
    return core_build[1]


def _launches(path: Path):
    """(kernel name or None, number of arguments or None, line) of every ``.launch(...)`` call
    in a module, and the names it passes to ``limit(...)``."""
    tree = ast.parse(path.read_text())
    launches, limits = [], []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr == "launch":
            name = node.args[0].value if isinstance(node.args[0], ast.Constant) else None
            args = node.args[3] if len(node.args) > 3 else None
            n = len(args.elts) if isinstance(args, ast.Tuple) else None
            launches.append((name, n, node.lineno))
        elif isinstance(f, ast.Name) and f.id == "limit" and node.args:
            limits.append(node.args[0].value)
    return launches, limits


def test_every_launched_kernel_is_in_the_manifest_with_its_arity(core_manifest):
    from reflex_core.cuda import quant_ops

    kernels = core_manifest["kernels"]
    backend = ROOT / "reflex_core" / "backends" / "cuda_backend.py"
    launches, limits = _launches(backend)
    assert len(launches) >= 14
    for name, n, line in launches:
        if name is not None:
            assert name in kernels, f"cuda_backend.py:{line} launches {name}, not in the build"
        if name is not None and n is not None:
            assert n == len(kernels[name]), (
                f"cuda_backend.py:{line}: {name} takes {len(kernels[name])} arguments "
                f"({kernels[name]}), the call passes {n}")
    # the names launched through variables and f-strings
    tree = ast.parse(backend.read_text())
    literals = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
                and isinstance(n.value, str) and n.value.startswith("reflex_")}
    assert {"reflex_add", "reflex_swiglu"} <= literals
    weight_kernels = {n for m in quant_ops.MODULES for n in quant_ops.kernel_names(m)}
    assert len(weight_kernels) == (12 * len(quant_ops.SUPPORTED_TYPES)
                                   + 2 * len(quant_ops.XQ_TYPES)  # + gemvq1{,s}
                                   + 2 * len(quant_ops.XH_TYPES)  # + xh, moe_xh
                                   # + gemv1x{,4,1}, moe_matmulx
                                   + 4 * len(quant_ops.XS_CHUNK)
                                   + 3 * len(quant_ops.NORM_TYPES)  # + gemv1ws{r,n}, gemv1sn
                                   # + gemv1x{,4}{r,n}, gemv1x1n, moe_matmulxn
                                   + 6 * len(quant_ops.NORM_TYPES & set(quant_ops.XS_CHUNK))
                                   + sum(len(v) for v in quant_ops.MIXED_XS.values())
                                   # + the streamed gemv1xs{n,r}
                                   + sum(len(v) for v in quant_ops.STREAM_FORMS.values())
                                   + 4)  # the pairs GEMM: f16x{3,1}{,_64}
    missing = sorted(n for n in literals | weight_kernels if n not in kernels)
    assert not missing, f"launched but not built: {missing}"
    assert set(quant_ops.MODULES) <= set(core_manifest["modules"])
    # the limits the backend checks against are the kernels' own
    assert set(limits) == {"ARGMAX_SPLIT_CHUNK", "ATT_MAX_HEAD", "ATT_MAX_SPLITS",
                           "QKR_MAX_HEAD", "MOE_MAX_E", "MOE_MAX_K"}
    assert all(name in core_manifest["limits"] for name in limits)
    assert core_manifest["limits"]["ATT_MAX_HEAD"] == 256


# --- the weight kernels' two modules: which one serves a type, which ones the start loads -------
def _defined(cubin: bytes, name: str) -> bool:
    """Whether the cubin's string table holds the kernel ``name`` (NUL-delimited there)."""
    return b"\0" + name.encode() + b"\0" in cubin


class _RecordingKernels:
    """Stands in for a loaded module: records each launch's kernel name, after packing its
    arguments by the built signature (struct.error on a count or type mismatch)."""

    def __init__(self, signatures):
        self.signatures = signatures
        self.names = set()

    def launch(self, name, grid, block, args, shmem=0):
        from reflex_core.cuda.modules import packer

        packer(self.signatures[name]).pack(args)
        self.names.add(name)


def test_sm_90_is_built_arch_specific(core_build):
    """The sm_90 SASS target is built as sm_90a (_build.ARCH_SPECIFIC: the prefill GEMM's
    warpgroup MMA exists only there) and keeps its plain name, the one the loader maps."""
    from reflex_core import _build
    from reflex_core.cuda import quant_ops as q

    out, _ = core_build
    assert _build.ARCH_SPECIFIC[90] == "90a"
    for m in q.MODULES:
        assert b"sm_90a" in (out / f"{m}.sm_90.cubin").read_bytes(), m


def test_every_launcher_path_of_a_type_launches_kernels_of_its_module(core_build):
    """Each type's kernels -- what dequant, embed, the GEMV/tiled matmuls (one weight, three,
    SwiGLU) and the MoE gather (plain, SwiGLU) launch for it -- are all in the cubin of the
    module quant_ops assigns it (module_of, MatPlan.module: the backend's ``kern``) and in no
    other module's."""
    from reflex_core.cuda import quant_ops as q

    out, manifest = core_build
    cubins = {m: (out / f"{m}.sm_90.cubin").read_bytes() for m in q.MODULES}
    W, X, Y, IDS = 1 << 20, 2 << 20, 3 << 20, 4 << 20  # 16-byte aligned: the GEMV paths too
    n_in, n_out = 256, 64
    for t in sorted(q.SUPPORTED_TYPES):
        k = _RecordingKernels(manifest["kernels"])
        q.dequant(k, W, t, 4 * n_in, Y)
        q.embed(k, W, t, IDS, Y, 3, n_in, n_vocab=10)
        p = q.plan(t, (n_in, n_out), W)
        for T in (1, 2, 4, 8, 9):
            q.matmul_planned(k, p, X, T, (W, W + 16 * n_in, W), (Y, Y + 4096, Y + 8192),
                             (n_out, n_out, n_out), False, p.gemv_w_ok)
            q.matmul_planned(k, p, X, T, (W, W + 16 * n_in, 0), (Y, 0, 0), (n_out, 0, 0),
                             True, p.gemv_w_ok)
        q.moe_matmul(k, W, t, X, IDS, Y, 3, 2, n_in, n_out, 4)
        q.moe_matmul(k, W, t, X, IDS, Y, 3, 2, n_in, n_out, 4, up_ptr=W)
        core = _RecordingKernels(manifest["kernels"])  # the grouped MoE path's schedule
        for up in (0, W):
            q.moe_matmul_grouped(k, core, W, t, X, IDS, Y, q.MOE_TILED_MIN_T, 2, n_in, n_out, 4,
                                 X, Y, IDS, up_ptr=up)
        assert core.names == {"reflex_moe_schedule"}
        sx = q._TYPES[t][0]
        assert k.names == {f"reflex_dequant_{sx}", f"reflex_embed_{sx}",
                           f"reflex_matmul_tiled_{sx}", f"reflex_moe_matmul_{sx}",
                           f"reflex_moe_tiled_{sx}",
                           *(f"reflex_matmul_gemv{tt}_{sx}" for tt in (1, 2, 4, 8))}
        module = q.module_of(t)
        assert p.module == module and q.modules_for([t]) == [module]
        assert k.names <= set(q.kernel_names(module))
        for m, cubin in cubins.items():
            where = [n for n in sorted(k.names) if _defined(cubin, n)]
            assert where == (sorted(k.names) if m == module else []), (q.type_name(t), m, where)
    common = {q.type_name(t) for t in q.SUPPORTED_TYPES if q.module_of(t) == "quant"}
    assert common == {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K",
                      "Q5_K", "Q6_K"}
    assert q.modules_for([8, 12, 40]) == ["quant"]  # NVFP4 (40): refused when bound, not here
    assert q.modules_for([14, 39, 10]) == ["quant", "quant_lowbit"]


def test_the_cuda_start_leaves_the_lowbit_weight_module_out(core_build, monkeypatch):
    """What the CUDA start loads from the built manifest (its real module list, with the driver
    steps faked): the core and the common types' weight kernels; quant_lowbit is left to the
    backend (ON_DEMAND), and every weight module but the common one is on demand."""
    import threading

    from reflex_core.cuda import driver, early, modules, quant_ops, start

    out, manifest = core_build
    for k in start.DRIVER_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("REFLEX_KERNEL_DIR", str(out))
    monkeypatch.setattr(early, "run", lambda ordinal: None)
    monkeypatch.setattr(driver, "init", lambda ordinal, early_result=None: "device")
    monkeypatch.setattr(driver, "current_device", lambda: "device")
    monkeypatch.setattr(driver, "INIT_STEPS", {})
    loaded = []
    monkeypatch.setattr(modules, "get_kernels", lambda module, package="reflex_core":
                        loaded.append((module, package, threading.current_thread().name)))
    assert start.CudaStart().wait() == "device"
    assert loaded == [("core", "reflex_core", "reflex-cuda-init"),
                      ("quant", "reflex_core", "reflex-cuda-init")]
    assert modules.start_modules(manifest) == ["core", "quant"]
    assert set(manifest["modules"]) == {"core", "quant", "quant_lowbit"}
    assert modules.ON_DEMAND["reflex_core"] == set(quant_ops.MODULES) - {quant_ops.COMMON_MODULE}
    # a plugin's modules all load at start (none is held back)
    assert modules.start_modules(manifest, "a_plugin") == list(manifest["modules"])


def test_the_lowbit_weight_module_compiles_without_warnings(tmp_path):
    """cuda/quant_lowbit.cu with the build's flags for one target prints no warning and defines
    its types' kernels (tests/test_quant_host.py checks cuda/quant.cu the same way)."""
    import subprocess

    from reflex_core.cuda import quant_ops

    out = tmp_path / "quant_lowbit.cubin"
    cmd = [_build.find_nvcc(), "-cubin", "-O3", "-std=c++17", "-Xptxas=-O3", "-arch=sm_80",
           f"-I{ROOT / 'cuda' / 'include'}", str(ROOT / "cuda" / "quant_lowbit.cu"), "-o",
           str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout}{proc.stderr}"
    assert "warning" not in (proc.stdout + proc.stderr).lower(), proc.stdout + proc.stderr
    cubin = out.read_bytes()
    missing = [n for n in quant_ops.kernel_names("quant_lowbit") if not _defined(cubin, n)]
    assert not missing, f"kernels missing from quant_lowbit.cu: {missing}"
