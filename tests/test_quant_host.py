"""The CUDA kernels' block decoders (cuda/include/reflex/quants.cuh), run on the CPU.

tests/native/quant_host.cu includes the very header the kernels use; nvcc builds it into a shared
library (host code only runs) that ctypes loads. Checked here:

* every decoder against gguf-py's ``gguf.quants.dequantize``, BIT FOR BIT (``reflex check``
  requires the GPU dequant to match it exactly): the generic ``dec4``/``dec1`` path (dequant,
  embed, tiled matmul) and the GEMV lane units' exact path, on random blocks (random bytes, random
  finite f16 scales including subnormals and negatives), plus every f16/bf16 bit pattern and
  every MXFP4 scale byte; the computed IQ2/IQ3 sign table against gguf-py's (the codebooks
  themselves: tests/test_quant_tables.py);
* the GEMV lane units' FMA path (what the kernels use) within rounding;
* the GEMV lane loop itself (the kernels' per-lane code, summed over 32 lanes) against a float64
  NumPy matmul, for T = 1..8, odd row counts and one or several blocks per row.

No GPU needed; nvcc is (CI has it): without it these tests FAIL with a message, they do not skip.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "tests" / "native" / "quant_host.cu"
INCLUDE = ROOT / "cuda" / "include"

# GGML name -> type id of every type the kernels serve
TYPES = {
    "F32": 0, "F16": 1, "BF16": 30, "Q8_0": 8, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7,
    "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "Q2_K": 10, "Q3_K": 11, "IQ2_XXS": 16, "IQ2_XS": 17,
    "IQ2_S": 22, "IQ3_XXS": 18, "IQ3_S": 21, "IQ1_S": 19, "IQ1_M": 29, "IQ4_NL": 20,
    "IQ4_XS": 23, "TQ1_0": 34, "TQ2_0": 35, "MXFP4": 39,
}
QUANT = [n for n in TYPES if n not in ("F32", "F16", "BF16")]
# byte offsets of the f16 fields inside a block (kept finite). IQ1_M spreads its d over the top
# nibbles of its 4 scale u16s at byte 48; MXFP4's scale is an E8M0 byte (every value finite).
F16_FIELDS = {
    "Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2),
    "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "Q2_K": (80, 82), "Q3_K": (108,),
    "IQ2_XXS": (0,), "IQ2_XS": (0,), "IQ2_S": (0,), "IQ3_XXS": (0,), "IQ3_S": (0,),
    "IQ1_S": (0,), "IQ1_M": (), "IQ4_NL": (0,), "IQ4_XS": (0,), "TQ1_0": (52,), "TQ2_0": (64,),
    "MXFP4": (),
}
IQ1_M_SCALES = 48  # the 4 u16 holding IQ1_M's 3-bit scales and, in their top nibbles, d
MXFP4_E_OFFSET = 113  # E8M0 byte e scales by 2^(e - 128): e = f16 exponent field + 113 matches


def _nvcc(why: str) -> str:
    """The build's nvcc (reflex_core._build.find_nvcc); a missing one fails the test with why."""
    from reflex_core import _build

    try:
        return _build.find_nvcc()
    except _build.BuildError as exc:
        pytest.fail(f"{why}: {exc}")


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    nvcc = _nvcc("the quant decoder tests compile tests/native/quant_host.cu")
    out = tmp_path_factory.mktemp("quanthost") / "libquanthost.so"
    cmd = [nvcc, "-x", "cu", "-std=c++17", "-O2", "-shared",
           "-Xcompiler", "-fPIC,-ffp-contract=off,-Wall,-Wno-unknown-pragmas",
           f"-I{INCLUDE}", str(SRC), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(f"building the host harness failed:\n{' '.join(cmd)}\n{proc.stdout}{proc.stderr}")
    warnings = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "warning" in ln]
    assert not warnings, "\n".join(warnings)
    so = ctypes.CDLL(str(out))
    so.rx_host_dequant.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_longlong,
                                   ctypes.c_void_p, ctypes.c_int]
    so.rx_host_dequant.restype = ctypes.c_int
    so.rx_host_gemv.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                ctypes.c_longlong, ctypes.c_int]
    so.rx_host_gemv.restype = ctypes.c_int
    so.rx_host_gemv_xq.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                                   ctypes.c_int, ctypes.c_longlong, ctypes.c_int]
    so.rx_host_gemv_xq.restype = ctypes.c_int
    so.rx_host_stage_xs.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    so.rx_host_xs_elem.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
    so.rx_host_gemv_xs.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                   ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_longlong,
                                   ctypes.c_int]
    so.rx_host_gemv_xs.restype = ctypes.c_int
    so.rx_host_f16_table.argtypes = [ctypes.c_void_p]
    so.rx_host_f16_table.restype = None
    so.rx_host_ksigns.argtypes = [ctypes.c_void_p]
    so.rx_host_ksigns.restype = None
    so.rx_host_type_info.argtypes = [ctypes.c_int] + [ctypes.POINTER(ctypes.c_int)] * 4
    so.rx_host_type_info.restype = ctypes.c_int
    so.rx_host_int_view.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_longlong, ctypes.c_void_p]
    so.rx_host_int_view.restype = ctypes.c_int
    return so


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def host_dequant(lib, name: str, raw: np.ndarray, n: int, mode: int = 0) -> np.ndarray:
    out = np.full(n, np.nan, dtype=np.float32)
    raw = np.ascontiguousarray(raw)
    rc = lib.rx_host_dequant(TYPES[name], _ptr(raw), n, _ptr(out), mode)
    assert rc == 0, rc
    return out


def host_gemv(lib, name: str, tt: int, raw: np.ndarray, x: np.ndarray, n_in: int,
              n_out: int, ks: int = 1) -> np.ndarray:
    T = x.shape[0]
    y = np.full((T, n_out), np.nan, dtype=np.float32)
    x = np.ascontiguousarray(x, dtype=np.float32)
    raw = np.ascontiguousarray(raw)
    rc = lib.rx_host_gemv(TYPES[name], tt, _ptr(raw), _ptr(x), _ptr(y), T, n_in, n_out,
                          raw.nbytes // n_out, ks)
    assert rc == 0, rc
    return y


def random_f16_bits(rng, shape, lo_exp=0, hi_exp=30) -> np.ndarray:
    """Random finite half bit patterns (sign random, exponent in [lo_exp, hi_exp]; exponent 0
    gives zeros and subnormals)."""
    sign = rng.integers(0, 2, size=shape, dtype=np.uint16) << 15
    exp = rng.integers(lo_exp, hi_exp + 1, size=shape, dtype=np.uint16) << 10
    man = rng.integers(0, 1024, size=shape, dtype=np.uint16)
    return (sign | exp | man).astype(np.uint16)


def random_blocks(rng, name: str, n_blocks: int, lo_exp=0, hi_exp=30) -> np.ndarray:
    """n_blocks random blocks of a quantized type: random bytes, finite f16 scale fields (f16
    exponent field in [lo_exp, hi_exp]; MXFP4: the E8M0 byte of the same magnitudes)."""
    _, ts = GGML_QUANT_SIZES[GGMLQuantizationType[name]]
    raw = rng.integers(0, 256, size=(n_blocks, ts), dtype=np.uint8)
    for off in F16_FIELDS[name]:
        raw[:, off:off + 2] = random_f16_bits(rng, (n_blocks,), lo_exp, hi_exp).view(np.uint8) \
            .reshape(n_blocks, 2)
    if name == "IQ1_M":
        d = random_f16_bits(rng, (n_blocks,), lo_exp, hi_exp)
        sc = raw[:, IQ1_M_SCALES:IQ1_M_SCALES + 8].copy().view(np.uint16)
        for k in range(4):
            sc[:, k] = (sc[:, k] & 0x0FFF) | (((d >> (4 * k)) & 15) << 12)
        raw[:, IQ1_M_SCALES:IQ1_M_SCALES + 8] = sc.view(np.uint8)
    if name == "MXFP4":
        raw[:, 0] = rng.integers(lo_exp + MXFP4_E_OFFSET, hi_exp + MXFP4_E_OFFSET + 1, n_blocks)
    return raw


def ref_dequant(name: str, raw: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # MXFP4's largest scales overflow to inf: so must we
        y = dequantize(raw, GGMLQuantizationType[name])
    return y.reshape(-1).astype(np.float32, copy=False)


def assert_bits_equal(got: np.ndarray, want: np.ndarray, what: str) -> None:
    got_u, want_u = got.view(np.uint32), want.view(np.uint32)
    bad = np.flatnonzero(got_u != want_u)
    assert bad.size == 0, (
        f"{what}: {bad.size} of {got.size} elements differ; first at {bad[0]}: "
        f"got {got[bad[0]]!r} ({got_u[bad[0]]:#010x}), want {want[bad[0]]!r} "
        f"({want_u[bad[0]]:#010x})")


# ----------------------------------------------------------------------------------------------
# bit-exact decoders


@pytest.mark.parametrize("name", QUANT)
def test_dec4_bit_exact(lib, name):
    rng = np.random.default_rng(TYPES[name])
    raw = random_blocks(rng, name, 2048)
    want = ref_dequant(name, raw)
    got = host_dequant(lib, name, raw, want.size, mode=0)
    assert_bits_equal(got, want, f"{name} dec4")


# the types with an integer view (rx_qi): the prefill matmul on x halves (quant_ops.XH_TYPES)
INT_VIEW = ["Q8_0", "Q4_0", "Q5_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"]


@pytest.mark.parametrize("name", INT_VIEW)
def test_int_view_bit_exact(lib, name):
    """rx_qi's small integers and per-sub-block (a, c) rebuild every value bit for bit, extreme
    scales included (so the xh kernel's integer products are the weights' own)."""
    rng = np.random.default_rng(300 + TYPES[name])
    raw = np.concatenate([random_blocks(rng, name, 1024), random_blocks(rng, name, 64, 0, 4),
                          random_blocks(rng, name, 64, 26, 30)])
    want = ref_dequant(name, raw)
    got = np.full(want.size, np.nan, np.float32)
    assert lib.rx_host_int_view(TYPES[name], _ptr(raw), want.size, _ptr(got)) == 0
    assert_bits_equal(got, want, f"{name} integer view")


def test_int_view_types_match_quant_ops():
    from reflex_core.cuda import quant_ops
    assert quant_ops.XH_TYPES == {TYPES[n] for n in INT_VIEW} - {TYPES["IQ4_NL"]}


# host_dequant's lane-unit modes: (exact, FMA) as the one-token GEMV and as the 8-token GEMV
# split the units between lanes
LANE_MODES = {"T=1": (1, 2), "T=8": (3, 4)}


@pytest.mark.parametrize("split", LANE_MODES)
@pytest.mark.parametrize("name", QUANT)
def test_lane_units_exact_bit_exact(lib, name, split):
    """The GEMV lane units cover every element once and decode it bit-exactly."""
    rng = np.random.default_rng(100 + TYPES[name])
    raw = random_blocks(rng, name, 1024)
    want = ref_dequant(name, raw)
    got = host_dequant(lib, name, raw, want.size, mode=LANE_MODES[split][0])
    assert_bits_equal(got, want, f"{name} lane units (exact, {split})")


@pytest.mark.parametrize("split", LANE_MODES)
@pytest.mark.parametrize("name", QUANT)
def test_lane_units_fma_close(lib, name, split):
    """The FMA flavour the kernels run differs from exact by at most rounding."""
    rng = np.random.default_rng(200 + TYPES[name])
    raw = random_blocks(rng, name, 1024)
    want = ref_dequant(name, raw)
    got = host_dequant(lib, name, raw, want.size, mode=LANE_MODES[split][1])
    assert not np.isnan(got).any()
    bs, _ = GGML_QUANT_SIZES[GGMLQuantizationType[name]]
    scale = np.repeat(np.abs(want.reshape(-1, bs)).max(axis=1), bs) + 1e-38
    assert (np.abs(got - want) <= 4e-7 * scale).all()


def test_type_table_matches_the_decoders(lib):
    """quant_ops' type table (block size and bytes from ggml_types, the GEMV weight alignment)
    is what the decoders declare (rx_q<T>::QK / TS, rx_lu<T>::ALIGN), and each type's lane units
    tile its block in steps of 8 elements."""
    from reflex_core.cuda import quant_ops as q

    for name, t in TYPES.items():
        qk, ts, align, unit = ctypes.c_int(), ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        assert lib.rx_host_type_info(t, ctypes.byref(qk), ctypes.byref(ts), ctypes.byref(align),
                                     ctypes.byref(unit)) == 0, name
        suffix, _, bs, size, gemv_align = q._TYPES[t]
        assert (qk.value, ts.value, align.value) == (bs, size, gemv_align), name
        assert unit.value == q.lane_unit_elements(t), name
        assert suffix == name.lower()


def test_ksigns_table(lib):
    """The IQ2/IQ3 sign bytes the decoders compute (index | parity << 7) are gguf-py's table."""
    from gguf.quants import IQ2_XXS

    out = np.zeros(128, dtype=np.uint8)
    lib.rx_host_ksigns(_ptr(out))
    assert out.tobytes() == IQ2_XXS.ksigns


def test_mxfp4_every_scale_byte(lib):
    """Every E8M0 byte, the subnormal scales 0 and 1 and the overflowing 255 among them."""
    rng = np.random.default_rng(41)
    raw = random_blocks(rng, "MXFP4", 256 * 4)
    raw[:, 0] = np.repeat(np.arange(256, dtype=np.uint8), 4)
    want = ref_dequant("MXFP4", raw)
    per_e = np.abs(want.reshape(256, -1))
    assert np.isinf(per_e[255]).any() and (per_e[:2] > 0).any()  # overflow; subnormal scales
    for mode in (0, 1):
        assert_bits_equal(host_dequant(lib, "MXFP4", raw, want.size, mode), want, f"MXFP4 mode {mode}")


def test_f16_all_patterns(lib):
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    want = bits.view(np.float16).astype(np.float32)
    table = np.empty(65536, dtype=np.float32)
    lib.rx_host_f16_table(_ptr(table))
    finite = ~np.isnan(want)  # NaN payloads: NumPy keeps them too, but that is its business
    assert_bits_equal(table[finite], want[finite], "f16 -> f32 (all non-NaN patterns)")
    # the tensor path (dec1) on every non-NaN pattern, incl. subnormals, zeros and infinities
    raw = bits[finite].view(np.uint8)
    got = host_dequant(lib, "F16", raw, int(finite.sum()))
    assert_bits_equal(got, dequantize(raw, GGMLQuantizationType.F16).reshape(-1), "F16 dec1")
    got = host_dequant(lib, "F16", raw[: (raw.size // 16) * 16], (raw.size // 16) * 8, mode=1)
    assert_bits_equal(got, want[finite][: got.size], "F16 lane units")


def test_bf16_all_patterns(lib):
    raw = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.uint8)
    want = dequantize(raw, GGMLQuantizationType.BF16).reshape(-1)
    assert_bits_equal(host_dequant(lib, "BF16", raw, 65536), want, "BF16 dec1")
    assert_bits_equal(host_dequant(lib, "BF16", raw, 65536, mode=1), want, "BF16 lane units")


def test_f32_identity(lib):
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 2**32, size=4096, dtype=np.uint64).astype(np.uint32)
    raw = bits.view(np.uint8)
    for mode in (0, 1):
        got = host_dequant(lib, "F32", raw, 4096, mode=mode)
        assert np.array_equal(got.view(np.uint32), bits)


@pytest.mark.parametrize("name", QUANT)
def test_extreme_scales(lib, name):
    """Largest and subnormal d / dmin: still bit-exact (no overflow, no flush to zero)."""
    rng = np.random.default_rng(300 + TYPES[name])
    for lo, hi in ((30, 30), (0, 0), (0, 3)):
        raw = random_blocks(rng, name, 256, lo_exp=lo, hi_exp=hi)
        want = ref_dequant(name, raw)
        assert_bits_equal(host_dequant(lib, name, raw, want.size), want, f"{name} dec4 exp {lo}..{hi}")
        assert_bits_equal(host_dequant(lib, name, raw, want.size, mode=1), want,
                          f"{name} lane units exp {lo}..{hi}")


def test_tensor_of_several_rows(lib):
    """Blocks are addressed by flat index: a 3-row Q6_K tensor (odd 210-byte blocks)."""
    rng = np.random.default_rng(11)
    raw = random_blocks(rng, "Q6_K", 3 * 5).reshape(3, 5 * 210)
    want = dequantize(raw, GGMLQuantizationType.Q6_K).reshape(-1)
    assert_bits_equal(host_dequant(lib, "Q6_K", raw, want.size), want, "Q6_K 3x1280")


# ----------------------------------------------------------------------------------------------
# the GEMV lane loop (the kernels' code, 32 lanes summed on the CPU)


def _gemv_case(rng, name, n_in, n_out, T):
    if name in ("F32", "F16", "BF16"):
        w = rng.standard_normal((n_out, n_in)).astype(np.float32)
        raw = {"F32": w, "F16": w.astype(np.float16), "BF16": None}[name]
        if name == "BF16":
            raw = (w.view(np.uint32) >> 16).astype(np.uint16)
        raw = np.ascontiguousarray(raw).view(np.uint8).reshape(n_out, -1)
        wf = dequantize(raw, GGMLQuantizationType[name]).reshape(n_out, n_in)
    else:
        bs, ts = GGML_QUANT_SIZES[GGMLQuantizationType[name]]
        raw = random_blocks(rng, name, n_out * (n_in // bs), lo_exp=8, hi_exp=14)
        raw = raw.reshape(n_out, (n_in // bs) * ts)
        wf = dequantize(raw, GGMLQuantizationType[name]).reshape(n_out, n_in)
    x = rng.standard_normal((T, n_in)).astype(np.float32)
    return raw, wf, x


def _check_matmul(y, wf, x, what):
    ref = x.astype(np.float64) @ wf.astype(np.float64).T
    mag = np.abs(x).astype(np.float64) @ np.abs(wf).astype(np.float64).T
    n_in = x.shape[1]
    tol = 1e-5 * np.sqrt(n_in) * mag + 1e-30
    err = np.abs(y.astype(np.float64) - ref)
    assert not np.isnan(y).any(), f"{what}: NaN in output"
    i = np.unravel_index(np.argmax(err / tol), err.shape)
    assert (err <= tol).all(), f"{what}: err {err[i]:.3g} > tol {tol[i]:.3g} at {i}"


@pytest.mark.parametrize("name", list(TYPES))
def test_gemv_lane_loop(lib, name):
    rng = np.random.default_rng(400 + TYPES[name])
    bs = GGML_QUANT_SIZES[GGMLQuantizationType[name]][0]
    blk = max(bs, 8)
    # ks: warps splitting a row's units (more lanes than units leaves some idle)
    for n_blocks, n_out, T, tt, ks in ((1, 1, 1, 1, 1), (1, 33, 2, 2, 2), (3, 7, 3, 4, 4),
                                       (9, 5, 8, 8, 1), (40, 3, 1, 1, 4), (5, 4, 5, 8, 2),
                                       (70, 3, 2, 2, 2)):
        n_in = n_blocks * blk
        raw, wf, x = _gemv_case(rng, name, n_in, n_out, T)
        y = host_gemv(lib, name, tt, raw, x, n_in, n_out, ks)
        _check_matmul(y, wf, x, f"{name} n_in={n_in} n_out={n_out} T={T} (TT={tt}, ks={ks})")


def test_gemv_on_x_limbs(lib):
    """The one-token IQ4_XS GEMV on x limbs (rx_gemv_rows_xq, every lane run on the host) with
    limbs from the NumPy twin: the float64 product of the values the limbs stand for up to
    summation rounding, one and two warps a row pair, chunks cut short by n_in."""
    from reflex_core.testing.x_limbs import x_from_limbs, x_limbs

    rng = np.random.default_rng(1500)
    for n_in, n_out, ks in ((256, 3, 1), (768, 5, 1), (2048, 4, 2), (4864, 3, 2), (4864, 1, 1)):
        raw, wf, x = _gemv_case(rng, "IQ4_XS", n_in, n_out, 1)
        x[0, :32] *= 1e-3
        xq = x_limbs(x)
        y = np.full(n_out, np.nan, np.float32)
        raw = np.ascontiguousarray(raw)
        assert lib.rx_host_gemv_xq(_ptr(raw), _ptr(xq), _ptr(y), n_in, n_out, raw.shape[1], ks) == 0
        xr = x_from_limbs(xq, n_in)
        ref = wf.astype(np.float64) @ xr
        mag = np.abs(wf).astype(np.float64) @ np.abs(xr)
        err = np.abs(y - ref)
        assert (err <= 2e-6 * mag + 1e-30).all(), f"n_in={n_in} ks={ks}: {np.max(err / (mag + 1e-30)):.3g}"
        _check_matmul(y[None, :], wf, x, f"IQ4_XS limbs n_in={n_in} ks={ks}")


def _special_runs(rng, x):
    """x, then x with a run of zeros (and one half zero), then with a run of subnormals, then with
    a run of huge values. The bound is relative to sum |x| |w|, which the huge run dominates: so
    the other runs are checked without it first."""
    out = [x.copy()]
    x = x.copy()
    x[0, 16:48] = 0.0
    out.append(x.copy())
    x[0, 64:80] = rng.standard_normal(16) * 1e-40
    out.append(x.copy())
    x[0, 128:144] *= 1e30
    out.append(x)
    return out


@pytest.mark.parametrize("name", ["Q4_K", "Q5_K", "Q6_K"])
def test_staged_limbs_match_the_twin(lib, name):
    """rx_x_limb_run (the K-quants' staged x) against the x limbs' NumPy rule
    (testing.x_limbs.scaled_ints) per run of 16, bit for bit: every slot of every chunk of
    whole and partial chunks holds bytes 0-2 of its run's integers, the run's first slot its
    scale, its second the scale times the sum of its integers; runs past the row are zeros."""
    from reflex_core.cuda.quant_ops import x_staged_bytes
    from reflex_core.testing.x_limbs import inputs_of_every_kind, scaled_ints

    t = TYPES[name]
    rng = np.random.default_rng(1650 + t)
    for n_in in (256, 2304, 4096):
        x = inputs_of_every_kind(rng, n_in, 16)
        staged = np.full(x_staged_bytes(t, n_in) // 4, 0xDEADBEEF, np.uint32)
        assert lib.rx_host_stage_xs(t, _ptr(x), n_in, _ptr(staged)) == 0
        slots = staged.reshape(-1, 256, 4)  # [chunk][slot][word]
        seen = []
        for c in range(slots.shape[0]):
            for h in (0, 1):
                for lane in range(32):
                    e = lib.rx_host_xs_elem(t, c, 32 * h + lane)
                    run = slots[c, [32 * (2 * k + h) + lane for k in range(4)]]  # [step][word]
                    b = run[:, :3, None] >> np.array([0, 8, 16, 24], np.uint32) & np.uint32(0xFF)
                    hi = b[:, 2].astype(np.int64)
                    X = (np.where(hi >= 128, hi - 256, hi) * 65536 + b[:, 1].astype(np.int64) * 256
                         + b[:, 0].astype(np.int64)).reshape(-1)
                    want_x = x[e:e + 16] if e < n_in else np.zeros(16, np.float32)
                    s_bits, want = scaled_ints(want_x[None, :])
                    what = f"{name} n_in={n_in} chunk {c} run {h} lane {lane} (x[{e}:])"
                    assert (X == want[0]).all(), what
                    assert run[0, 3] == s_bits[0], what
                    sx = s_bits.view(np.float32)[0] * np.float32(want[0].sum())
                    assert run[1, 3:4].view(np.float32)[0].tobytes() == sx.tobytes(), what
                    assert (run[2:, 3] == 0).all(), what
                    seen += [e] if e < n_in else []
        assert sorted(seen) == list(range(0, n_in, 16)), f"{name} n_in={n_in}: the runs' starts"


@pytest.mark.parametrize("name", ["Q4_K", "Q5_K", "Q6_K"])
def test_gemv_on_staged_limbs(lib, name):
    """The K-quants' one-token GEMV on x limbs in the lanes' order (rx_x_limb_run writing every
    lane slot's runs, then rx_gemv_rows_limbs, on the host): within the float GEMV's bound of the
    float64 product, one and two warps a row pair, rows that end inside a chunk, x plain and
    with runs of zeros, of subnormals and of huge values (_special_runs); a NaN in x gives NaN."""
    from reflex_core.cuda.quant_ops import x_staged_bytes

    t = TYPES[name]
    rng = np.random.default_rng(1600 + t)
    for n_in, n_out, ks in ((256, 3, 1), (768, 5, 1), (2048, 4, 2), (4864, 3, 2), (12288, 2, 2)):
        raw, wf, plain = _gemv_case(rng, name, n_in, n_out, 1)
        raw = np.ascontiguousarray(raw)
        staged = np.zeros(x_staged_bytes(t, n_in) // 4, np.uint32)
        for x in _special_runs(rng, plain):
            y = np.full(n_out, np.nan, np.float32)
            assert lib.rx_host_gemv_xs(t, _ptr(raw), _ptr(x), _ptr(staged), _ptr(y), n_in, n_out,
                                       raw.shape[1], ks) == 0
            _check_matmul(y[None, :], wf, x, f"{name} staged limbs n_in={n_in} ks={ks}")
    x[0, 200] = np.nan
    assert lib.rx_host_gemv_xs(t, _ptr(raw), _ptr(x), _ptr(staged), _ptr(y), n_in, n_out,
                               raw.shape[1], 2) == 0
    assert np.isnan(y).all()


# ----------------------------------------------------------------------------------------------
# the launchers (reflex_core.cuda.quant_ops) and the module build, still without a GPU


class _FakeKernels:
    """Records launches, checking each one's arguments against the kernel's real signature (the
    build's parser on the preprocessed modules: what the manifest will hold)."""

    def __init__(self, signatures):
        self.signatures = signatures
        self.calls = []
        self.shmem = []  # each launch's dynamic shared memory, in calls' order
        self.allowed = {}  # allow_shmem: name -> bytes
        self.optin = 227 << 10  # the device's opt-in limit (an H100 / H200's)
        self.sms = 132  # an H100 / H200 SXM's multiprocessors
        # an sm_80 device's SASS unless a test says otherwise: no streamed GEMVs (sm_90+)
        self.cc = 80
        self.image = "sass"

    def sm(self):
        return self.cc

    def multiprocessors(self):
        return self.sms

    def blocks_per_sm(self, name, threads, shmem):
        """An sm_90 SM's occupancy count: 64K registers (the streamed kernels take 96 a thread
        or fewer, ptxas -v), 228 KB of shared memory (1 KB the driver's a block, 1312 bytes
        static)."""
        assert shmem <= self.allowed.get(name, 48 << 10)
        regs = 96
        return min(65536 // (regs * threads), (228 << 10) // (shmem + 1312 + 1024))

    def allow_shmem(self, name, nbytes):
        assert name in self.signatures
        if nbytes > self.optin:
            return False
        self.allowed[name] = max(nbytes, self.allowed.get(name, 0))
        return True

    def launch(self, name, grid, block, args, shmem=0):
        from reflex_core.cuda.modules import packer

        packer(self.signatures[name]).pack(args)  # struct.error on a count or type mismatch
        assert shmem <= self.allowed.get(name, 32 << 10), f"{name}: {shmem} bytes not allowed"
        # as Kernels.launch reads them: an int or (x[, y[, z]]), the missing sizes 1
        grid, block = ((v, 1, 1) if type(v) is int else (tuple(v) + (1, 1))[:3]
                       for v in (grid, block))
        self.calls.append((name, grid, block, tuple(args)))
        self.shmem.append(shmem)


@pytest.fixture(scope="module")
def quant_signatures():
    from reflex_core import _build

    nvcc = _nvcc("cannot preprocess cuda/quant.cu")
    sigs = {}
    for module in ("quant", "quant_lowbit", "core"):  # core: reflex_x_limbs, moe_schedule
        sigs.update(_build.module_signatures(nvcc, ROOT / "cuda" / f"{module}.cu", [INCLUDE], 90))
    return sigs


def _matmul(q, k, w_ptrs, t, x, ys, T, n_in, n_outs, swiglu=False):
    """Plan the weights and launch them as the CUDA backend does (CudaOps.matmul_many /
    matmul_swiglu)."""
    plans = [q.plan(t, (n_in, n), w) for w, n in zip(w_ptrs, n_outs)]
    pad = (0,) * (q.MAX_SEGMENTS - len(w_ptrs))
    outs = tuple(n_outs) + pad if not swiglu else (n_outs[0], 0, 0)
    q.matmul_planned(k, plans[0], x, T, tuple(w_ptrs) + pad,
                     tuple(ys) + (0,) * (q.MAX_SEGMENTS - len(ys)), outs, swiglu,
                     all(p.gemv_w_ok for p in plans))


def test_launcher_choices(quant_signatures):
    from reflex_core.cuda import quant_ops as q
    from reflex_core.errors import UnsupportedTensorType

    assert set(TYPES.values()) == set(q.SUPPORTED_TYPES)
    for name, t in TYPES.items():
        bs, ts = GGML_QUANT_SIZES[GGMLQuantizationType[name]]
        assert q.row_bytes(t, 4 * 256) == 4 * 256 // bs * ts
    k = _FakeKernels(quant_signatures)
    W, X, Y = 1 << 20, 2 << 20, 3 << 20
    for T, want in ((1, "gemv1"), (2, "gemv2"), (3, "gemv4"), (4, "gemv4"), (5, "gemv8"),
                    (8, "gemv8"), (9, "tiled"), (300, "tiled")):  # Q4_K, 1024: 32 lane units
        _matmul(q, k, [W], 12, X, [Y], T, 1024, [1000])
        name, grid, block, args = k.calls[-1]
        assert name == f"reflex_matmul_{want}_q4_k"
        if want == "tiled":
            assert grid == ((1000 + 63) // 64, (T + 63) // 64, 1) and block == (256, 1, 1)
        else:
            assert grid == (125, 1, 1) and block == (128, 1, 1)
        assert args == (W, 0, 0, X, Y, 0, 0, T, 1024, 1000, 0, 0, 576, 0)
    # one token, rows of >= 64 lane units: two warps a row pair (gemv1s), 4 rows a block
    _matmul(q, k, [W], 12, X, [Y], 1, 2048, [1000])
    assert k.calls[-1][:3] == ("reflex_matmul_gemv1s_q4_k", (250, 1, 1), (128, 1, 1))
    _matmul(q, k, [W], 12, X, [Y], 2, 2048, [1000])
    assert k.calls[-1][:2] == ("reflex_matmul_gemv2_q4_k", (125, 1, 1))
    _matmul(q, k, [W], 0, X, [Y], 1, 512, [1000])  # F32: 8 weights a unit
    assert k.calls[-1][:2] == ("reflex_matmul_gemv1s_f32", (250, 1, 1))
    _matmul(q, k, [W], 0, X, [Y], 1, 504, [1000])
    assert k.calls[-1][:2] == ("reflex_matmul_gemv1_f32", (125, 1, 1))
    assert [q.gemv_split(8, n) for n in (1008, 1024)] == [1, 2]  # Q8_0: 16 a unit
    # misaligned weights: Q4_K needs 16 bytes for the GEMV -> tiled; Q6_K only 2
    _matmul(q, k, [W + 2], 12, X, [Y], 1, 1024, [10])
    assert k.calls[-1][0] == "reflex_matmul_tiled_q4_k"
    _matmul(q, k, [W + 2], 14, X, [Y], 1, 1024, [10])
    assert k.calls[-1][0] == "reflex_matmul_gemv1_q6_k"
    _matmul(q, k, [W], 0, X, [Y], 1, 37, [10])  # float weights, n_in % 8 != 0
    assert k.calls[-1][0] == "reflex_matmul_tiled_f32"
    q.moe_matmul(k, W, 8, X, 4 << 20, Y, 70000, 8, 2048, 768, 128, x_per_expert=True)
    name, grid, block, args = k.calls[-1]
    assert name == "reflex_moe_matmul_q8_0" and grid == (48, 65535, 1)  # 16 rows a block
    assert args[1] == 0 and args[5:] == (70000, 8, 2048, 768, 2176, 768 * 2176, 1, 128, 0)
    q.moe_matmul(k, W, 8, X, 4 << 20, Y, 3, 8, 2048, 768, 128, up_ptr=W + 4096)  # SwiGLU
    name, grid, block, args = k.calls[-1]
    assert grid == (96, 24, 1) and args[1] == W + 4096 and args[-1] == 1  # 8 outputs a block
    # one token of a K-quant: on x limbs staged in shared memory (reflex_moe_matmulx_<t>), the
    # slots sharing x MOE_SLOTS_A_BLOCK (2) a block, those with an x each one a block
    q.moe_matmul(k, W, 12, X, 4 << 20, Y, 1, 8, 2048, 768, 128, up_ptr=W + 4096)
    name, grid, block, args = k.calls[-1]
    assert name == "reflex_moe_matmulx_q4_k" and grid == (96, 4, 1) and k.shmem[-1] == 4 * 2048
    q.moe_matmul(k, W, 12, X, 4 << 20, Y, 1, 7, 2048, 768, 128)
    assert k.calls[-1][:2] == ("reflex_moe_matmulx_q4_k", (48, 4, 1))
    q.moe_matmul(k, W, 14, X, 4 << 20, Y, 1, 8, 768, 2048, 128, x_per_expert=True)
    assert k.calls[-1][:2] == ("reflex_moe_matmulx_q6_k", (128, 8, 1)) and k.shmem[-1] == 4 * 1024
    q.moe_matmul(k, W, 8, X, 4 << 20, Y, 1, 8, 2048, 768, 128)  # no staged x: a slot a block
    assert k.calls[-1][:2] == ("reflex_moe_matmul_q8_0", (48, 8, 1))
    q.moe_matmul(k, W, 12, X, 4 << 20, Y, 2, 8, 2048, 768, 128)
    assert k.calls[-1][0] == "reflex_moe_matmul_q4_k" and k.shmem[-1] == 0
    q.moe_matmul(k, W, 8, X, 4 << 20, Y, 3, 8, 2048, 768, 128, up_ptr=W + 4096)
    name, grid, block, args = k.calls[-1]
    assert grid == (96, 24, 1) and args[1] == W + 4096 and args[-1] == 1  # 8 outputs a block
    # several weights per launch: GEMV blocks of 8 rows per segment, tiled blocks of 64
    _matmul(q, k, [W, W + 2, W + 4], 8, X, [Y, Y + 4, Y + 8], 5, 1024, [2048, 1024, 1000])
    name, grid, block, args = k.calls[-1]
    assert name == "reflex_matmul_gemv8_q8_0" and grid == (256 + 128 + 125, 1, 1)
    assert args == (W, W + 2, W + 4, X, Y, Y + 4, Y + 8, 5, 1024, 2048, 1024, 1000, 1088, 0)
    _matmul(q, k, [W, W + 2, W + 4], 8, X, [Y, Y + 4, Y + 8], 1, 1024, [600, 300, 100])
    assert k.calls[-1][:2] == ("reflex_matmul_gemv1s_q8_0", (150 + 75 + 25, 1, 1))
    _matmul(q, k, [W, W + 2], 8, X, [Y, Y + 4], 9, 1024, [2048, 1000])
    assert k.calls[-1][:2] == ("reflex_matmul_tiled_q8_0", (32 + 16, 1, 1))
    _matmul(q, k, [W, W + 16], 12, X, [Y], 1, 1024, [511, 511], swiglu=True)
    name, grid, block, args = k.calls[-1]
    assert name == "reflex_matmul_gemv1_q4_k" and grid == (128, 1, 1) and args[-1] == 1
    _matmul(q, k, [W, W + 16], 12, X, [Y], 1, 2048, [511, 511], swiglu=True)
    assert k.calls[-1][:2] == ("reflex_matmul_gemv1s_q4_k", (256, 1, 1))
    # GEMV_WIDE_MIN_ROWS weight rows or more in a two-warp launch: four rows a group (gemv1ws);
    # the K-quants (XS_CHUNK) on x limbs staged in shared memory, 8 warps a block (gemv1x)
    _matmul(q, k, [W, W + 16], 12, X, [Y], 1, 2048, [512, 512], swiglu=True)
    name, grid, block, args = k.calls[-1]
    assert name == "reflex_matmul_gemv1x_q4_k" and grid == (64, 1, 1) and args[-1] == 1
    assert block == (256, 1, 1) and k.shmem[-1] == 4 * 2048 == k.allowed[name]
    _matmul(q, k, [W], 12, X, [Y], 1, 2048, [1024])
    assert k.calls[-1][:2] == ("reflex_matmul_gemv1x_q4_k", (64, 1, 1))
    _matmul(q, k, [W], 14, X, [Y], 1, 12288 + 256, [1024])  # partial chunks: whole ones staged
    # (64 gemv1x blocks of rows of 392 units: the x4 shape, 8 rows a block)
    assert k.calls[-1][:3] == ("reflex_matmul_gemv1x4_q6_k", (128, 1, 1), (256, 1, 1))
    assert k.shmem[-1] == 4 * 13312
    _matmul(q, k, [W], 14, X, [Y], 1, 51200 + 256, [1024])  # more than XS_MAX_SHMEM
    assert k.calls[-1][0] == "reflex_matmul_gemv1ws_q6_k" and k.shmem[-1] == 0
    k.optin = 99 << 10  # a device that allows less (sm_86 / sm_89): the float GEMV
    _matmul(q, k, [W], 14, X, [Y], 1, 25600, [1024])
    assert k.calls[-1][0] == "reflex_matmul_gemv1ws_q6_k" and k.shmem[-1] == 0
    k.optin = 227 << 10
    q.GEMV_XS = False  # REFLEX_GEMV_XS=0
    try:
        _matmul(q, k, [W], 12, X, [Y], 1, 2048, [1024])
    finally:
        q.GEMV_XS = True
    assert k.calls[-1][:2] == ("reflex_matmul_gemv1ws_q4_k", (128, 1, 1))
    _matmul(q, k, [W], 12, X, [Y], 1, 2048, [1023])
    assert k.calls[-1][:2] == ("reflex_matmul_gemv1s_q4_k", (256, 1, 1))
    _matmul(q, k, [W], 12, X, [Y], 1, 1024, [4096])  # rows of < 64 units: one warp, two rows
    assert k.calls[-1][:2] == ("reflex_matmul_gemv1_q4_k", (512, 1, 1))
    _matmul(q, k, [W, W + 16], 12, X, [Y], 1, 2048, [3072, 3072], swiglu=True)
    assert k.calls[-1][:2] == ("reflex_matmul_gemv1x_q4_k", (384, 1, 1))
    _matmul(q, k, [W, W + 2, W + 4], 8, X, [Y, Y + 4, Y + 8], 1, 1024, [2048, 1024, 1024])
    assert k.calls[-1][:2] == ("reflex_matmul_gemv1ws_q8_0", (256 + 128 + 128, 1, 1))
    _matmul(q, k, [W, W + 2, W + 4], 8, X, [Y, Y + 4, Y + 8], 2, 1024, [2048, 1024, 1024])
    assert k.calls[-1][:2] == ("reflex_matmul_gemv2_q8_0", (256 + 128 + 128, 1, 1))
    _matmul(q, k, [W, W + 8], 12, X, [Y], 1, 1024, [3072, 3072], swiglu=True)  # misaligned up
    assert k.calls[-1][:2] == ("reflex_matmul_tiled_q4_k", (96, 1, 1))
    # one token of an XQ type with x limbs: the GEMV on them (x's pointer replaced); not for
    # more tokens, other types, or limbs that are not 16-byte aligned
    XQ = 5 << 20
    for n_in, want in ((1024, "gemvq1"), (2048, "gemvq1s")):  # IQ4_XS: 32 a unit
        q.matmul_planned(k, q.plan(23, (n_in, 1000), W), X, 1, (W, 0, 0), (Y, 0, 0), (1000, 0, 0),
                         False, True, XQ)
        name, grid, _, args = k.calls[-1]
        assert name == f"reflex_matmul_{want}_iq4_xs" and args[3] == XQ
        assert grid == ((125, 1, 1) if want == "gemvq1" else (250, 1, 1))
    for t, T, xq in ((23, 2, XQ), (12, 1, XQ), (23, 1, XQ + 8), (23, 1, 0)):
        q.matmul_planned(k, q.plan(t, (2048, 1000), W), X, T, (W, 0, 0), (Y, 0, 0), (1000, 0, 0),
                         False, True, xq)
        assert "gemvq" not in k.calls[-1][0] and k.calls[-1][3][3] == X
    q.matmul_planned(k, q.plan(23, (768, 64), W), X, 1, (W, W + 8, 0), (Y, 0, 0), (64, 0, 0), True,
                     True, XQ)  # SwiGLU: one warp a row pair (gate and up), one output row a warp
    assert k.calls[-1][:2] == ("reflex_matmul_gemvq1_iq4_xs", (16, 1, 1)) and k.calls[-1][3][-1] == 1
    assert q.plan(20, (96, 64), W).gemvq is None  # IQ4_NL: the limbs are in IQ4_XS's lane order
    assert [q.x_limbs_bytes(n) for n in (32, 512, 768)] == [2048, 2048, 4096]
    q.x_limbs(k, X, XQ, 4096 + 32)
    assert k.calls[-1] == ("reflex_x_limbs", (17, 1, 1), (256, 1, 1), (X, XQ, 4128))
    with pytest.raises(ValueError, match="multiple of 32"):
        q.x_limbs(k, X, XQ, 100)
    # more than 8 tokens with x halves: the xh tile of the XH types, the tiled grid, x = the
    # halves; without halves, or IQ4_NL (no xh kernel), the tiled kernel; 8 tokens, the GEMV
    for t, T, xq, want in ((12, 9, XQ, "xh_q4_k"), (8, 300, XQ, "xh_q8_0"), (12, 300, 0, "tiled_q4_k"),
                           (20, 300, XQ, "tiled_iq4_nl"), (12, 8, XQ, "gemv8_q4_k")):
        q.matmul_planned(k, q.plan(t, (1024, 1000), W), X, T, (W, 0, 0), (Y, 0, 0), (1000, 0, 0),
                         False, True, xq)
        name, grid, _, args = k.calls[-1]
        assert name == f"reflex_matmul_{want}"
        assert args[3] == (XQ if want.startswith("xh") else X)
        if T > 8:
            assert grid == (16, (T + 63) // 64, 1)
    assert q.x_halves_bytes(3, 64) == 4 * (3 * 64 + 3 + 3 * 2)
    q.x_halves(k, X, XQ, 3, 64)
    assert k.calls[-1] == ("reflex_x_halves", (3, 1, 1), (256, 1, 1), (X, XQ, XQ + 768, 3, 64))
    with pytest.raises(ValueError, match="multiple of 32"):
        q.x_halves(k, X, XQ, 2, 48)
    q.dequant(k, W, 14, 256 * 3, Y)
    assert k.calls[-1][:2] == ("reflex_dequant_q6_k", (1, 1, 1))
    q.embed(k, W, 2, X, Y, 5, 64, n_vocab=100)
    assert k.calls[-1][0] == "reflex_embed_q4_0" and k.calls[-1][3][5:] == (36, 100, 0, 0, 0)
    with pytest.raises(UnsupportedTensorType):
        q.plan(40, (256, 4), W)  # NVFP4
    assert "not a positive multiple of the block size 256" in q.plan(12, (1000, 4), W).error


def test_fused_norm_launches(quant_signatures):
    """The residual step's forms are those of the one-token GEMV the plain launch takes (same
    grid, block and shared memory; the norm's arguments after the matmul's): producer and reader
    of the wide GEMVs, the reader of the narrow gemv1s; none where the plain launch is another
    GEMV, the type has none, or (producer) more than one weight, SwiGLU or narrow rows."""
    from reflex_core.cuda import quant_ops as q

    k = _FakeKernels(quant_signatures)
    W, X, Y, R, WN, H, P = (i << 20 for i in range(1, 8))

    def both(t, n_in, ws, n_outs, swiglu, form):
        ps = [q.plan(t, (n_in, n), w) for w, n in zip(ws, n_outs)]
        pad = (0,) * (3 - len(ws))
        outs = tuple(n_outs) + pad if not swiglu else (n_outs[0], 0, 0)
        ys = (Y, 0, 0) if swiglu else tuple(Y + 4 * i for i in range(len(ws))) + pad
        ok = all(p.gemv_w_ok for p in ps)
        c = q.fused_norm_launch(k, ps[0], outs, swiglu, ok, X, form)
        if c is None:
            return None
        q.matmul_planned(k, ps[0], X, 1, tuple(ws) + pad, ys, outs, swiglu, ok)
        q.matmul_fused(k, c, ps[0], X, tuple(ws) + pad, ys, outs, swiglu, R, WN, H, P, c[1][0],
                       1e-6)
        return k.calls[-2], k.shmem[-2], k.calls[-1], k.shmem[-1]

    for t, n_in, ws, n_outs, swiglu, form, want in (
            (12, 2048, [W], [1024], False, "r", "gemv1x"),
            (12, 2048, [W], [1024], False, "n", "gemv1x"),
            (12, 2048, [W, W + 16], [512, 512], True, "n", "gemv1x"),
            (14, 12288 + 256, [W], [4096], False, "r", "gemv1x"),
            # at most one gemv1x block an SM (132 here), four warps' units a lane: x4
            (12, 4096, [W], [2048], False, "r", "gemv1x4"),
            (14, 4096, [W], [2112], False, "n", "gemv1x4"),
            (12, 4096, [W], [2113], False, "r", "gemv1x"),
            (12, 2048, [W], [2048], False, "r", "gemv1x"),  # a unit a lane for two warps only
            (12, 4096, [W, W + 16], [1056, 1056], True, "n", "gemv1x4"),
            # 12 waves of x1 blocks (32 rows): an LM head
            (14, 2048, [W], [151936], False, "n", "gemv1x1"),
            (14, 4096, [W], [12 * 132 * 32], False, "n", "gemv1x1"),
            (14, 4096, [W], [12 * 132 * 32 - 32], False, "n", "gemv1x"),
            (12, 4096, [W, W + 16], [12288, 12288], True, "n", "gemv1x"),
            (8, 1024, [W, W + 2, W + 4], [2048, 1024, 1024], False, "n", "gemv1ws"),
            (8, 2048, [W], [1024], False, "r", "gemv1ws"),
            (8, 1024, [W, W + 2], [3072, 3072], True, "n", "gemv1ws"),
            (0, 512, [W], [1024], False, "r", "gemv1ws"),
            (12, 2048, [W], [1023], False, "n", "gemv1s"),  # under GEMV_WIDE_MIN_ROWS
            (0, 2048, [W], [128], False, "n", "gemv1s"),  # a MoE router
            (14, 2048, [W, W + 210], [512, 256], False, "n", "gemv1s"),
            (8, 1024, [W, W + 2], [300, 300], True, "n", "gemv1s")):
        plain, plain_smem, fused, fused_smem = both(t, n_in, ws, n_outs, swiglu, form)
        suffix = q._TYPES[t][0]
        assert plain[0] == f"reflex_matmul_{want}_{suffix}"
        assert fused[0] == f"reflex_matmul_{want}{form}_{suffix}"
        assert fused[1:3] == plain[1:3] and fused_smem == plain_smem
        assert fused[3] == plain[3] + (R, WN, H, P, plain[1][0], 1e-6)
    for t, n_in, ws, n_outs, swiglu, form in (
            (12, 2048, [W], [1023], False, "r"),  # gemv1s: no producer form
            (14, 2048, [W], [151936], False, "r"),  # gemv1x1 (heads): none either
            (12, 1024, [W], [4096], False, "n"),  # gemv1 (rows of few lane units)
            (8, 1024, [W, W + 2], [3072, 3072], True, "r"),  # a producer has one weight
            (8, 1024, [W, W + 2], [2048, 2048], False, "r"),
            (2, 1024, [W], [4096], False, "n"),  # Q4_0: not in NORM_TYPES
            (23, 1024, [W], [4096], False, "n")):  # IQ4_XS (the low-bit module)
        assert both(t, n_in, ws, n_outs, swiglu, form) is None
    p = q.plan(12, (2048, 4096), W + 1)  # misaligned weights: the plain launch is the tiled one
    assert q.fused_norm_launch(k, p, (4096, 0, 0), False, p.gemv_w_ok, X, "n") is None
    p = q.plan(12, (2048, 4096), W)
    assert q.fused_norm_launch(k, p, (4096, 0, 0), False, True, X + 4, "n") is None


def test_stream_launches(quant_signatures, monkeypatch):
    """On sm_90+ SASS the SwiGLU reader and the producer (Q4_K, Q6_K) of gemv1x's shape, and
    the plain reader of one weight of gemv1x1's (a head), launch as the streamed forms: two
    blocks an SM where they fit, else one, the copies' warp beside 8 compute warps,
    gemv_stream_smem's shared memory (three slots where they fit), T the blocks of a row a slot
    holds, the producer's block sums one per 16-row tile. Not for gemv1x's plain readers (q/k/v),
    gemv1x4, rows or weights the copy engine cannot move, an older device, a PTX image or
    REFLEX_GEMV_STREAM=0."""
    from reflex_core.cuda import quant_ops as q

    k = _FakeKernels(quant_signatures)
    k.cc = 90
    W, X, Y, R, WN, H, P = (i << 20 for i in range(1, 8))
    W1, W2 = W + (1 << 28), W + (1 << 29)

    def launch(t, n_in, n_outs, swiglu, form, ws=None):
        p = q.plan(t, (n_in, n_outs[0]), W)
        n_outs = tuple(n_outs) + (0,) * (3 - len(n_outs))
        if ws is None:
            ws = (W, W1) if swiglu else (W, W1, W2)[:sum(1 for n in n_outs if n)]
        c = q.fused_norm_launch(k, p, n_outs, swiglu, True, X, form, w_ptrs=ws)
        q.matmul_fused(k, c, p, X, (tuple(ws) + (0, 0))[:3], (Y, 0, 0), n_outs, swiglu, R, WN,
                       H, P, q.resnorm_parts(c, n_outs[0]), 1e-6)
        return c, k.calls[-1]

    # two blocks an SM where two fit (the fake's occupancy count), with the most slots that do
    for t, n_in, n_outs, swiglu, form, cb, grid, stages in (
            (12, 4096, [12288], True, "n", 16, 264, 2),  # an 8B's gate/up: rows whole in a slot
            (12, 12288, [4096], False, "r", 16, 132, 3),  # its down: three chunks; 123 KB at 2
            (12, 4096, [4096], False, "r", 16, 256, 2),  # its output projection: 256 tiles
            (14, 4096, [151936], False, "n", 16, 132, 3),  # a Q6_K head: a tile in one 54 KB slot
            (12, 2048, [151937], False, "n", 8, 264, 3),  # a Q4_K one, a partial last tile
            (14, 4096, [12288], True, "n", 16, 132, 3),  # Q6_K rows of 16 blocks: one chunk
            (14, 12288, [4096], False, "r", 16, 132, 2),  # a Q6_K down: three chunks of 16
            (12, 2048, [1037], True, "n", 8, 130, 3)):  # fewer tiles than SMs
        c, (name, g, block, args) = launch(t, n_in, n_outs, swiglu, form)
        suffix = q._TYPES[t][0]
        assert c[0] == name == f"reflex_matmul_gemv1xs{form}_{suffix}"
        assert g == (grid, 1, 1) and block == (288, 1, 1)
        assert c[3] == q.gemv_stream_smem(t, n_in, stages) == k.shmem[-1] <= q.XS_MAX_SHMEM
        assert args[7] == cb and args[9:12] == tuple(n_outs) + (0,) * (3 - len(n_outs))
        assert args[13] == (1 if swiglu else 0)
        if form == "r":
            assert q.resnorm_parts(c, n_outs[0]) == -(-n_outs[0] // 16)
    # rows of 20 Q6_K blocks would end in a chunk of 4 * 210 bytes; gemv1x4;
    # gemv1x's plain readers (q/k/v, one weight); a head's launch of two weights
    for t, n_in, n_outs, swiglu, form, want in (
            (14, 5120, [3000], True, "n", "gemv1xn"),
            (12, 4096, [2048], False, "r", "gemv1x4r"),
            (12, 4096, [4096, 1024, 1024], False, "n", "gemv1xn"),
            (12, 4096, [12288], False, "n", "gemv1xn"),
            (14, 4096, [151936, 151936], False, "n", "gemv1x1n")):
        assert launch(t, n_in, n_outs, swiglu, form)[0][0] == \
            f"reflex_matmul_{want}_{q._TYPES[t][0]}"
    # a weight the copy engine cannot read (8-byte aligned: a GGUF of general.alignment 8), or
    # fewer given than the launch reads: gemv1x's forms
    assert launch(14, 4096, [12288], True, "n", ws=(W, W1 + 8))[0][0] == "reflex_matmul_gemv1xn_q6_k"
    p = q.plan(12, (12288, 4096), W)
    assert q.fused_norm_launch(k, p, (4096, 0, 0), False, True, X, "r")[0] == \
        "reflex_matmul_gemv1xr_q4_k"
    for setting in ("ptx", 80, "off"):
        k.cc, k.image = 90, "sass"
        monkeypatch.setattr(q, "GEMV_STREAM", setting != "off")
        if setting == "ptx":
            k.image = "ptx"
        elif setting == 80:
            k.cc = 80
        assert launch(12, 4096, [12288], True, "n")[0][0] == "reflex_matmul_gemv1xn_q4_k"
        assert launch(12, 12288, [4096], False, "r")[0][0] == "reflex_matmul_gemv1xr_q4_k"
        assert launch(14, 4096, [151936], False, "n")[0][0] == "reflex_matmul_gemv1x1n_q6_k"


def _fake_cuda_ops(quant_signatures, monkeypatch):
    """A CudaOps on fake kernels (launches recorded, arguments checked) and a fake allocator
    (256-byte aligned addresses from 1 GiB up, nothing freed), REFLEX_FUSE_NORM on:
    (kernels, ops, alloc)."""
    from reflex_core.backends import cuda_backend as cb
    from reflex_core.backends import device_array as da
    from reflex_core.cuda import quant_ops as q

    top = [1 << 30]

    def alloc(n):
        top[0] += (n + 255) & ~255
        return top[0] - ((n + 255) & ~255)

    monkeypatch.setattr(da, "_alloc", alloc)
    monkeypatch.setattr(da, "_free", lambda p: None)
    monkeypatch.setattr(cb, "FUSE_NORM", True)
    k = _FakeKernels(quant_signatures)
    ops = object.__new__(cb.CudaOps)
    ops.k, ops._quant_ops, ops._quant_k = k, q, {"quant": k, "quant_lowbit": k}
    return k, ops, alloc


def test_residual_step_runs_inside_the_gemvs(quant_signatures, monkeypatch):
    """CudaOps of one token: a matmul that the producer form fits is deferred; add_rmsnorm on it
    launches that form (h = a + W x, y = h * w, the block sums) and no norm kernel; the GEMVs
    that read y apply the scale themselves; any other reader of y gets reflex_norm_apply once,
    in place, and the deferred product itself is still launched for a reader of it."""
    from reflex_core.backends import cuda_backend as cb
    from reflex_core.backends import device_array as da
    from reflex_core.cuda import quant_ops as q
    from reflex_core.ops import Weight

    k, ops, alloc = _fake_cuda_ops(quant_signatures, monkeypatch)
    D, F = 4096, 12288

    def weight(name, n_in, n_out, at):
        return Weight(name, 12, (n_in, n_out), at, q.plan(12, (n_in, n_out), at))

    wo, wg, wu, wd = (weight(n, i, o, (j + 1) << 24) for j, (n, i, o) in enumerate(
        (("o", D, D), ("gate", D, F), ("up", D, F), ("down", F, D))))
    x = da.DeviceArray(alloc(4 * D), (1, D), None)
    resid = da.DeviceArray(alloc(4 * D), (1, D), None)
    o = ops.matmul(x, wo)
    assert type(o) is da.LazyArray and k.calls == []
    s, y = ops.add_rmsnorm(resid, o, None, 1e-6)
    (name, grid, block, args), = k.calls
    n_part = grid[0]
    assert name == "reflex_matmul_gemv1xr_q4_k" and n_part == D // 16 and block == (256, 1, 1)
    assert args[:5] == (wo.data, 0, 0, x.ptr, y.address) and args[9:11] == (D, 0)
    assert args[14:] == (resid.ptr, 0, s.ptr, args[17], n_part, 0.0)
    g = ops.matmul_swiglu(y, wg, wu)
    name, grid, block, args = k.calls[-1]
    assert name == "reflex_matmul_gemv1xn_q4_k" and args[3] == y.address
    assert args[-3:-1] == (s.ptr + 4 * D, n_part)  # the block sums after h (256-byte aligned)
    assert abs(args[-1] - 1e-6) < 1e-12 and len(k.calls) == 2
    assert type(g) is da.DeviceArray and type(y.pending) is cb._NormScale
    # a reader without a normed form (a view's pointer): the scale is applied once, in place
    assert ops.view(y, (D,)).ptr == y.address and y.pending is None
    assert k.calls[-1] == ("reflex_norm_apply", (16, 1, 1), (256, 1, 1),
                           (y.address, s.ptr + 4 * D, n_part, D, 1e-6))
    ops.matmul_swiglu(y, wg, wu)
    assert k.calls[-1][0] == "reflex_matmul_gemv1x_q4_k" and len(k.calls) == 4
    # the deferred product itself, read: the plain GEMV, once
    assert o.ptr == o.address and k.calls[-1][0] == "reflex_matmul_gemv1x_q4_k"
    assert k.calls[-1][3][3:5] == (x.ptr, o.address) and len(k.calls) == 5
    # two tokens, or a GEMV without the forms: nothing deferred
    x2 = da.DeviceArray(alloc(8 * D), (2, D), None)
    assert type(ops.matmul(x2, wo)) is da.DeviceArray and len(k.calls) == 6
    d = ops.matmul(da.DeviceArray(alloc(4 * F), (1, F), None), wd)
    s2, y2 = ops.add_rmsnorm(s, d, None, 1e-5)
    assert k.calls[-1][0] == "reflex_matmul_gemv1xr_q4_k" and k.calls[-1][3][14] == s.ptr
    monkeypatch.setattr(cb, "FUSE_NORM", False)
    o = ops.matmul(x, wo)
    assert type(o) is da.DeviceArray
    s3, y3 = ops.add_rmsnorm(resid, o, None, 1e-6)
    assert [c[0] for c in k.calls[-2:]] == ["reflex_matmul_gemv1x_q4_k", "reflex_add_rmsnorm"]


def test_first_norm_runs_inside_the_embedding(quant_signatures, monkeypatch):
    """CudaOps of one token: embed is deferred; an rmsnorm of it launches the embedding's norm
    form (the row, y = row * w, its block sums) and no norm kernel, and the GEMV that reads y
    applies the scale itself; a reader of the row gets the plain embedding once; two tokens or
    REFLEX_FUSE_NORM=0: no deferral."""
    from types import SimpleNamespace

    from reflex_core.backends import cuda_backend as cb
    from reflex_core.backends import device_array as da
    from reflex_core.cuda import quant_ops as q
    from reflex_core.ops import Weight

    k, ops, alloc = _fake_cuda_ops(quant_signatures, monkeypatch)
    D, V = 2048, 1000
    emb = Weight("token_embd", 14, (D, V), 1 << 24, q.plan(14, (D, V), 1 << 24))
    wq = Weight("q", 12, (D, 4096), 2 << 24, q.plan(12, (D, 4096), 2 << 24))
    ids = alloc(64)
    pb = SimpleNamespace(n_tokens=1, tok_min=5, tok_max=5, tokens=ids)
    x = ops.embed(emb, pb)
    assert type(x) is da.LazyArray and k.calls == []
    y = ops.rmsnorm(x, None, 1e-6)
    (name, grid, block, args), = k.calls
    n_part = q.embed_blocks(14, D)
    assert name == "reflex_embed_q6_k" and grid == (n_part, 1, 1) == (4, 1, 1)
    assert args[:3] == (emb.data, ids, x.address) and args[7:9] == (0, y.address)
    assert x.pending is None and type(y.pending) is cb._NormScale
    part = k.calls[0][3][9]
    assert part and y.address < part
    assert ops.matmul(y, wq).ptr  # read: its launch
    name, _, _, args = k.calls[-1]
    assert name == "reflex_matmul_gemv1xn_q4_k" and args[3] == y.address
    assert args[-3:-1] == (part, n_part) and len(k.calls) == 2
    # a reader of the row itself: the plain embedding, once
    x = ops.embed(emb, pb)
    assert ops.view(x, (D,)).ptr == x.address and x.pending is None
    assert k.calls[-1][0] == "reflex_embed_q6_k" and k.calls[-1][3][7:] == (0, 0, 0)
    assert len(k.calls) == 3
    # two tokens, or REFLEX_FUSE_NORM=0: launched at once, the norm its own launch
    x = ops.embed(emb, SimpleNamespace(n_tokens=2, tok_min=5, tok_max=9, tokens=ids))
    assert type(x) is da.DeviceArray and len(k.calls) == 4
    monkeypatch.setattr(cb, "FUSE_NORM", False)
    x = ops.embed(emb, pb)
    ops.rmsnorm(x, None, 1e-6)
    assert [c[0] for c in k.calls[-2:]] == ["reflex_embed_q6_k", "reflex_rmsnorm"]


def test_moe_combine_step_runs_in_one_launch(quant_signatures, monkeypatch):
    """CudaOps of one token: moe_combine is deferred; add_rmsnorm on it launches
    reflex_moe_combine_resnorm (s = a + the sum, y = s * w, a block sum per 256 values) and no
    norm kernel; a GEMV with a normed form reads y as after a residual-step GEMV; a reader of the
    sum itself gets reflex_moe_combine once; two tokens or REFLEX_FUSE_NORM=0: no deferral."""
    from reflex_core.backends import cuda_backend as cb
    from reflex_core.backends import device_array as da
    from reflex_core.cuda import quant_ops as q
    from reflex_core.ops import Weight

    k, ops, alloc = _fake_cuda_ops(quant_signatures, monkeypatch)
    D, K = 2048 + 256, 8  # 9 block sums
    y = da.DeviceArray(alloc(4 * K * D), (1, K, D), None)
    wts = da.DeviceArray(alloc(4 * K), (1, K), None)
    resid = da.DeviceArray(alloc(4 * D), (1, D), None)
    h = ops.moe_combine(y, wts)
    assert type(h) is da.LazyArray and ops.shape(h) == (1, D) and k.calls == []
    s, yn = ops.add_rmsnorm(resid, h, None, 1e-6)
    (name, grid, block, args), = k.calls
    n_part = -(-D // 256)
    assert name == "reflex_moe_combine_resnorm" and grid == (n_part, 1, 1) and block == (256, 1, 1)
    assert args[:3] == (y.ptr, wts.ptr, resid.ptr) and args[3] == 0
    assert args[4:6] == (s.ptr, yn.address) and args[7:] == (K, D)
    assert type(yn.pending) is cb._NormScale and yn.pending.n_part == n_part
    assert yn.pending.part == args[6] and type(s) is da.DeviceArray
    # the next layer's q/k/v read y in their normed form
    wq = Weight("q", 12, (D, 4096), 1 << 24, q.plan(12, (D, 4096), 1 << 24))
    ops.matmul_many(yn, [wq])
    name, _, _, margs = k.calls[-1]
    assert name == "reflex_matmul_gemv1xn_q4_k" and margs[3] == yn.address
    assert margs[-3:-1] == (args[6], n_part) and len(k.calls) == 2
    # the sum itself, read: reflex_moe_combine, once
    assert h.ptr == h.address and h.pending is None
    assert k.calls[-1] == ("reflex_moe_combine", (n_part, 1, 1), (256, 1, 1),
                           (y.ptr, wts.ptr, h.address, K, D))
    assert h.ptr == h.address and len(k.calls) == 3
    # two tokens, or the switch off: the plain launches
    y2 = da.DeviceArray(alloc(8 * K * D), (2, K, D), None)
    w2 = da.DeviceArray(alloc(8 * K), (2, K), None)
    assert type(ops.moe_combine(y2, w2)) is da.DeviceArray
    assert k.calls[-1][0] == "reflex_moe_combine" and k.calls[-1][1] == (n_part, 2, 1)
    monkeypatch.setattr(cb, "FUSE_NORM", False)
    h = ops.moe_combine(y, wts)
    assert type(h) is da.DeviceArray
    ops.add_rmsnorm(resid, h, None, 1e-6)
    assert [c[0] for c in k.calls[-2:]] == ["reflex_moe_combine", "reflex_add_rmsnorm"]


def test_moe_layer_reads_the_norm_unapplied(quant_signatures, monkeypatch):
    """CudaOps of one token: after a fused add_rmsnorm, the router's narrow GEMV and the experts'
    gate/up GEMV on staged x (a K-quant) apply the norm's scale themselves, so the MoE layer
    launches no reflex_norm_apply; experts without that form (Q8_0), x per expert, or two tokens
    take the plain kernels on x made ready once."""
    from reflex_core.backends import device_array as da
    from reflex_core.cuda import quant_ops as q
    from reflex_core.ops import Weight

    k, ops, alloc = _fake_cuda_ops(quant_signatures, monkeypatch)
    D, F, E, K = 2048, 768, 128, 8

    def weight(name, t, ne, at):
        return Weight(name, t, ne, at, q.plan(t, ne[:2], at) if len(ne) == 2 else None)

    wo = weight("o", 12, (D, D), 1 << 24)
    router = weight("router", 0, (D, E), 2 << 24)
    gate, up = (weight(n, 12, (D, F, E), (3 + i) << 28) for i, n in enumerate(("gate", "up")))
    gate8, up8 = (weight(n, 8, (D, F, E), (5 + i) << 28) for i, n in enumerate(("g8", "u8")))
    x = da.DeviceArray(alloc(4 * D), (1, D), None)
    resid = da.DeviceArray(alloc(4 * D), (1, D), None)
    s, y = ops.add_rmsnorm(resid, ops.matmul(x, wo), None, 1e-6)
    (_, grid, _, rargs), = k.calls
    part, n_part = rargs[17], grid[0]
    logits = ops.matmul(y, router)
    name, grid, block, args = k.calls[-1]
    assert name == "reflex_matmul_gemv1sn_f32" and args[3] == y.address and args[9] == E
    assert args[-3:-1] == (part, n_part) and grid == (E // 4, 1, 1) and block == (128, 1, 1)
    ids = da.DeviceArray(alloc(4 * K), (1, K), None, "i32")
    g = ops.moe_matmul_swiglu(y, gate, up, ids)
    name, grid, block, args = k.calls[-1]
    assert name == "reflex_moe_matmulxn_q4_k" and args[:5] == (gate.data, up.data, y.address,
                                                                ids.ptr, g.ptr)
    assert args[-4:-1] == (1, part, n_part) and abs(args[-1] - 1e-6) < 1e-12
    assert k.shmem[-1] == q.x_staged_bytes(12, D)
    assert grid == (F // 8, -(-K // q.MOE_SLOTS_A_BLOCK), 1)  # slots sharing x, 2 a block
    assert len(k.calls) == 3 and type(logits) is da.DeviceArray and y.pending is not None
    # Q8_0 experts have no staged form: x is normed once, in place, then the plain kernel
    ops.moe_matmul_swiglu(y, gate8, up8, ids)
    assert [c[0] for c in k.calls[-2:]] == ["reflex_norm_apply", "reflex_moe_matmul_q8_0"]
    assert y.pending is None and k.calls[-1][3][2] == y.address
    ops.moe_matmul_swiglu(y, gate, up, ids)  # x ready: the plain staged form
    assert k.calls[-1][0] == "reflex_moe_matmulx_q4_k" and len(k.calls) == 6
    with pytest.raises(ValueError, match="no normed form"):
        q.moe_matmul(k, gate.data, 12, y.address, ids.ptr, g.ptr, 2, K, D, F, E,
                     norm=(part, n_part, 1e-6))


def test_qkv_with_another_v_type_is_one_launch(quant_signatures, monkeypatch):
    """CudaOps.matmul_many of one token on a fused norm's output: q and k of Q4_K and v of Q6_K
    (an 8B Q4_K_M file's layer) in one reflex_matmul_gemv1xn_q4_k_q6_k launch, its grid the two
    types' gemv1xn grids end to end and its shared memory the larger; a v that alone would take
    the narrow gemv1sn (a 30B-A3B file's 512 rows) too (the launch's rows choose the form); q and
    k that alone would take the narrow form, or x made ready, keep a launch a type."""
    from reflex_core.backends import device_array as da
    from reflex_core.cuda import quant_ops as q
    from reflex_core.ops import Weight

    k, ops, alloc = _fake_cuda_ops(quant_signatures, monkeypatch)
    D = 4096

    def weight(name, t, n_out, at):
        return Weight(name, t, (D, n_out), at, q.plan(t, (D, n_out), at))

    x = da.DeviceArray(alloc(4 * D), (1, D), None)
    resid = da.DeviceArray(alloc(4 * D), (1, D), None)
    wo = weight("o", 12, D, 1 << 24)
    _, y = ops.add_rmsnorm(resid, ops.matmul(x, wo), None, 1e-6)
    (_, grid, _, rargs), = k.calls
    part, n_part = rargs[17], grid[0]
    wq, wk = weight("q", 12, 4096, 2 << 24), weight("k", 12, 1024, 3 << 24)
    wv = weight("v", 14, 1024, 4 << 24)
    qq, kk, vv = ops.matmul_many(y, [wq, wk, wv])
    name, grid, block, args = k.calls[-1]
    assert len(k.calls) == 2 and name == "reflex_matmul_gemv1xn_q4_k_q6_k"
    assert grid == (4096 // 16 + 1024 // 16 + 1024 // 16, 1, 1) and block == (256, 1, 1)
    assert k.shmem[-1] == max(q.x_staged_bytes(12, D), q.x_staged_bytes(14, D))
    assert args[:7] == (wq.data, wk.data, wv.data, y.address, qq.ptr, kk.ptr, vv.ptr)
    assert args[9:13] == (4096, 1024, 1024, wq.meta.row_bytes)
    assert args[-4:-2] == (part, n_part) and abs(args[-2] - 1e-6) < 1e-12
    assert args[-1] == wv.meta.row_bytes
    assert y.pending is not None  # the norm's scale still applied by the readers
    # a narrow v: still one launch, v's blocks of its type's gemv1xn
    wv2 = weight("v2", 14, 512, 5 << 24)
    n_calls = len(k.calls)
    ops.matmul_many(y, [wq, wk, wv2])
    name, grid, _, args = k.calls[-1]
    assert len(k.calls) == n_calls + 1 and name == "reflex_matmul_gemv1xn_q4_k_q6_k"
    assert grid == (4096 // 16 + 1024 // 16 + 512 // 16, 1, 1) and args[9:12] == (4096, 1024, 512)
    # narrow q and k: a launch a type
    wq3, wk3 = weight("q3", 12, 512, 6 << 24), weight("k3", 12, 256, 7 << 24)
    ops.matmul_many(y, [wq3, wk3, wv])
    # (v alone: 64 gemv1x blocks of 4096-wide rows, at most one an SM: the x4 shape)
    assert [c[0] for c in k.calls[-2:]] == ["reflex_matmul_gemv1sn_q4_k",
                                            "reflex_matmul_gemv1x4n_q6_k"]
    # q and k that alone would take the x4 shape: one launch, gemv1x's shape
    wq4, wk4 = weight("q4", 12, 1024, 8 << 24), weight("k4", 12, 512, 9 << 24)
    ops.matmul_many(y, [wq4, wk4, wv2])
    name, grid, _, _ = k.calls[-1]
    assert name == "reflex_matmul_gemv1xn_q4_k_q6_k" and grid == ((1024 + 512 + 512) // 16, 1, 1)
    # x ready: the plain launches, one a type
    x2 = da.DeviceArray(alloc(4 * D), (1, D), None)
    ops.matmul_many(x2, [wq, wk, wv])
    assert [c[0] for c in k.calls[-2:]] == ["reflex_matmul_gemv1x_q4_k",
                                            "reflex_matmul_gemv1x4_q6_k"]


def test_quant_ops_imports_no_numpy():
    code = ("import sys; import reflex_core.cuda.quant_ops; "
            "sys.exit(1 if 'numpy' in sys.modules else 0)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, "reflex_core.cuda.quant_ops imports numpy (cold path)" + r.stderr


def test_quant_module_builds_cleanly(tmp_path):
    """cuda/quant.cu compiles with the build's flags without a warning and defines every kernel
    the launchers use (one SASS target here; the package build does them all)."""
    from reflex_core.cuda import quant_ops as q

    nvcc = _nvcc("cannot compile cuda/quant.cu")
    out = tmp_path / "quant.cubin"
    cmd = [nvcc, "-cubin", "-O3", "-std=c++17", "-Xptxas=-O3", "-arch=sm_80", f"-I{INCLUDE}",
           str(ROOT / "cuda" / "quant.cu"), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout}{proc.stderr}"
    assert "warning" not in (proc.stdout + proc.stderr).lower(), proc.stdout + proc.stderr
    blob = out.read_bytes()
    missing = [n for n in q.kernel_names() if n.encode() + b"\0" not in blob]
    assert not missing, f"kernels missing from quant.cu: {missing}"


@pytest.mark.parametrize("n_rows,n_in,team", [
    (12288, 4096, 32),  # 8B gate/up: rows enough for a warp each
    (4096, 12288, 64),
    (1024, 3072, 256),  # few rows: the block's 8 warps on one
    (2048, 1024, 128),
    (7, 96, 32),  # no more threads than the row has runs of 8 values
    (7, 512, 64),
])
def test_unpack_team(n_rows, n_in, team):
    """Threads a row of reflex_unpack_pairs_<t>: more than a warp only for launches of few rows."""
    from reflex_core.cuda import quant_ops as q

    assert q.unpack_team(n_rows, n_in) == team


def test_pairs_launches(quant_signatures):
    """Long prompts, any weight type: each weight unpacked into float16 pairs in scratch
    (256-byte aligned slots in launch order: hi plane, row scales, lo plane for three terms),
    then the pairs GEMM of the launch's size; the 64 x 64 form for launches of too few wide
    blocks or a device that cannot give a wide block its shared memory."""
    from reflex_core.cuda import quant_ops as q

    k = _FakeKernels(quant_signatures)
    W, XP, Y, S = 1 << 20, 2 << 20, 3 << 20, 1 << 32
    p = q.plan(12, (1024, 1000), W)  # Q4_K
    T = q.PAIRS_MIN_T
    assert q.pairs_bytes(p, T - 1, (1000, 0, 0), False) == 0
    assert q.pairs_bytes(q.plan(0, (1000, 1000), W), T, (1000, 0, 0), False) == 0  # n_in % 32
    assert q.pairs_lo_offset(1000, 1024) == 2 * 1000 * 1024 + 4096
    assert q.pairs_bytes(p, T, (1000, 0, 0), False, 3) == 4 * 1000 * 1024 + 4096
    assert q.pairs_bytes(p, T, (1000, 0, 0), False, 1) == 2 * 1000 * 1024 + 4096
    assert q.pairs_bytes(q.plan(29, (1024, 1000), W), T, (1000, 0, 0), False, 3) > 0  # IQ1_M
    slots = [(4 * n * 1024 + ((4 * n + 255) & ~255) + 255) & ~255 for n in (2048, 1001, 7)]
    assert q.pairs_bytes(p, T, (2048, 1001, 7), False, 3) == sum(slots)
    big = q.PAIRS_MAX_BYTES // (4 * 1024) + 1
    assert q.pairs_bytes(p, T, (big, 0, 0), False, 3) == 0
    q.matmul_pairs(k, k, p, XP, 300, (W, W + 4096, W + 8192), (Y, Y + 4, Y + 8), (2048, 1001, 7),
                   False, S, terms=3)
    offs = [S, S + slots[0], S + slots[0] + slots[1]]
    assert [c[0] for c in k.calls] == ["reflex_unpack_pairs_q4_k"] * 3 + ["reflex_matmul_f16x3_64"]
    for c, w, n, o, team in zip(k.calls, (W, W + 4096, W + 8192), (2048, 1001, 7), offs,
                                (128, 128, 128)):
        assert c[3] == (w, o, n, 1024, p.row_bytes, q.pairs_lo_offset(n, 1024), team)
        assert c[1] == (-(-n // (256 // team)), 1, 1)  # 256 / team rows a block
    name, grid, block, args = k.calls[-1]
    assert grid == ((2048 // 64 + (1001 + 63) // 64 + 1) * ((300 + 63) // 64), 1, 1)
    assert block == (128, 1, 1) and k.shmem[-1] == q.pairs_smem_bytes("_64", 3) == 3 * 2 * 128 * 64
    assert args == (offs[0], offs[1], offs[2], XP, Y, Y + 4, Y + 8, 300, 1024, 2048, 1001, 7,
                    2 * 1024, 0)
    k.calls.clear()  # a 1518-token prompt over 4096 rows of 4096: 32 x 12 wide tiles
    p4 = q.plan(12, (4096, 4096), W)
    q.matmul_pairs(k, k, p4, XP, 1518, (W, 0, 0), (Y, 0, 0), (4096, 0, 0), False, S, terms=1)
    assert k.calls[0][:2] == ("reflex_unpack_pairs_q4_k", (1024, 1, 1))  # 64 threads a row
    assert k.calls[0][3][-2:] == (0, 64)  # one term: no lo plane
    name, grid, block, args = k.calls[-1]
    assert (name, grid, block) == ("reflex_matmul_f16x1", (32 * 12, 1, 1), (256, 1, 1))
    assert k.shmem[-1] == q.pairs_smem_bytes("", 1) == 4 * (128 * 132 + 256)
    k.optin = 64 << 10  # a device that cannot give a block the wide form's shared memory
    q.matmul_pairs(k, k, p4, XP, 1518, (W, 0, 0), (Y, 0, 0), (4096, 0, 0), False, S, terms=3)
    assert k.calls[-1][:3] == ("reflex_matmul_f16x3_64", (64 * 24, 1, 1), (128, 1, 1))
    k.optin = 227 << 10
    k.calls.clear()  # SwiGLU: gate and up unpacked, half a tile's rows each
    q6 = q.plan(14, (1024, 3072), W)
    q.matmul_pairs(k, k, q6, XP, 200, (W, W + 4096, 0), (Y, 0, 0), (3072, 0, 0), True, S, terms=3)
    up = S + ((4 * 3072 * 1024 + ((4 * 3072 + 255) & ~255) + 255) & ~255)
    assert [c[3][:2] for c in k.calls[:2]] == [(W, S), (W + 4096, up)]
    name, grid, block, args = k.calls[-1]
    assert name == "reflex_matmul_f16x3_64" and grid == (96 * 4, 1, 1)
    assert args[:3] == (S, up, 0) and args[-1] == 1
    q.matmul_pairs(k, k, q6, XP, 200, (W, W + 4096, 0), (Y, 0, 0), (3072, 0, 0), True, S,
                   form="", terms=3)
    assert k.calls[-1][:2] == ("reflex_matmul_f16x3", (48 * 2, 1, 1))
    assert k.shmem[-1] == q.pairs_smem_bytes("", 3) == 3 * 2 * 256 * 64


def test_moe_grouped_launches(quant_signatures):
    """Long prompts: a MoE matmul groups its slots by expert (the core module's schedule, then
    the grouped tiled kernel over a grid tall enough for every tile the schedule can cut)."""
    from reflex_core import _build
    from reflex_core.cuda import quant_ops as q

    nvcc = _nvcc("cannot preprocess cuda/core.cu")
    core = _FakeKernels(_build.module_signatures(nvcc, ROOT / "cuda" / "core.cu", [INCLUDE], 90))
    k = _FakeKernels(quant_signatures)
    T, kk, E = q.MOE_TILED_MIN_T, 8, 128
    assert not q.moe_tiled_ok(T - 1, kk, E) and q.moe_tiled_ok(T, kk, E)
    assert q.moe_max_tiles(T * kk, E) == (T * kk + 63) // 64 + E
    assert q.moe_max_tiles(100, 128) == 2 + 100  # at most one partial tile per slot
    W, U, X, I, Y, O, S, N = (i << 20 for i in range(1, 9))
    q.moe_matmul_grouped(k, core, W, 12, X, I, Y, T, kk, 2048, 768, E, O, S, N, up_ptr=U)
    assert core.calls == [("reflex_moe_schedule", (1, 1, 1), (1024, 1, 1),
                           (I, T * kk, E, 64, O, S, N, Y, 768))]
    rb = 2048 // 256 * 144
    assert k.calls == [("reflex_moe_tiled_q4_k", (768 // 32, q.moe_max_tiles(T * kk, E), 1),
                        (256, 1, 1), (W, U, X, O, S, N, Y, kk, 2048, 768, rb, 768 * rb, 0, 1))]
    k.calls.clear()
    q.moe_matmul_grouped(k, core, W, 12, X, I, Y, T, kk, 768, 2048, E, O, S, N, x_per_expert=True)
    assert k.calls[0][1][0] == 2048 // 64 and k.calls[0][3][-2:] == (1, 0)
    # on x halves (XH types): the grouped xh tile, x = the halves, and the x rows they hold
    H = 9 << 20
    k.calls.clear()
    q.moe_matmul_grouped(k, core, W, 12, X, I, Y, T, kk, 2048, 768, E, O, S, N, up_ptr=U, xh_ptr=H)
    assert k.calls == [("reflex_moe_xh_q4_k", (768 // 32, q.moe_max_tiles(T * kk, E), 1),
                        (256, 1, 1), (W, U, H, O, S, N, Y, kk, 2048, 768, rb, 768 * rb, 0, 1, T))]
    k.calls.clear()
    q.moe_matmul_grouped(k, core, W, 12, X, I, Y, T, kk, 768, 2048, E, O, S, N, x_per_expert=True,
                         xh_ptr=H)
    assert k.calls[0][0] == "reflex_moe_xh_q4_k" and k.calls[0][3][-3:] == (1, 0, T * kk)
    k.calls.clear()
    q.moe_matmul_grouped(k, core, W, 11, X, I, Y, T, kk, 768, 2048, E, O, S, N, xh_ptr=H)  # Q3_K
    assert k.calls[0][0] == "reflex_moe_tiled_q3_k" and k.calls[0][3][2] == X
    with pytest.raises(ValueError):
        q.moe_matmul_grouped(k, core, W, 12, X, I, Y, T - 1, kk, 768, 2048, E, O, S, N)
