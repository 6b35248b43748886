"""The weight-side kernels (modules quant and quant_lowbit via reflex_core.cuda.quant_ops)
against NumPy. Each type's kernels come from the module quant_ops assigns it (module_of, a
MatPlan's module), as the CUDA backend takes them.

* the modules: each holds exactly its types' kernels (a kernel of the other module is not found);
* dequant: BIT-exact with gguf.quants.dequantize, every supported type (random blocks with
  extreme scales, every f16/bf16 pattern, every MXFP4 scale byte), also into a misaligned output;
* embed: bit-exact rows, repeated ids, an invalid id -> NaN row;
* matmul: vs a float64 NumPy matmul of the gguf-dequantized weights, for T in 1, 2, 7, 8, 9, 64,
  300 and n_out in 1, 33, 257, 1000 with one, three and many blocks per row; both paths (GEMV,
  tiled) forced explicitly too, and weight pointers off by 2 bytes (funnel-shifted loads /
  tiled fallback). Tolerance 1e-5 * sqrt(n_in) * (|x| . |W|^T);
* matmul_multi: 1-3 weights per launch bit-identical to the single matmuls (same path); the fused SwiGLU
  (gate/up) within a few ulp of silu(g) * u of the single matmuls;
* moe_matmul: repeated expert ids, x shared or per slot, T = 1, 4, 37, an invalid id -> NaN;
  the SwiGLU mode (gate and up experts in one launch) vs silu(g) * u of the two plain launches;
* large matrices (up to the LM head's 1024 x 151936): the GEMV and tiled results checked on
  sampled rows (the first, the last and 62 random ones), with a bandwidth report of the same
  launches (printed, never asserted: `-rP`).
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from reflex_core.cuda import quant_ops

pytestmark = pytest.mark.gpu

TYPES = {
    "F32": 0, "F16": 1, "BF16": 30, "Q8_0": 8, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7,
    "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "Q2_K": 10, "Q3_K": 11, "IQ2_XXS": 16, "IQ2_XS": 17,
    "IQ2_S": 22, "IQ3_XXS": 18, "IQ3_S": 21, "IQ1_S": 19, "IQ1_M": 29, "IQ4_NL": 20,
    "IQ4_XS": 23, "TQ1_0": 34, "TQ2_0": 35, "MXFP4": 39,
}
FLOAT_TYPES = ("F32", "F16", "BF16")
# byte offsets of the f16 fields inside a block; IQ1_M's d lies in the top nibbles of its 4
# scale u16s (byte 48), MXFP4's scale is an E8M0 byte (set_scales)
F16_FIELDS = {
    "Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2),
    "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "Q2_K": (80, 82), "Q3_K": (108,),
    "IQ2_XXS": (0,), "IQ2_XS": (0,), "IQ2_S": (0,), "IQ3_XXS": (0,), "IQ3_S": (0,),
    "IQ1_S": (0,), "IQ1_M": (), "IQ4_NL": (0,), "IQ4_XS": (0,), "TQ1_0": (52,), "TQ2_0": (64,),
    "MXFP4": (),
}


# ----------------------------------------------------------------------------------------------
# helpers


def qinfo(name):
    return GGML_QUANT_SIZES[GGMLQuantizationType[name]]


def random_f16_bits(rng, shape, lo_exp=0, hi_exp=30):
    sign = rng.integers(0, 2, size=shape, dtype=np.uint16) << 15
    exp = rng.integers(lo_exp, hi_exp + 1, size=shape, dtype=np.uint16) << 10
    man = rng.integers(0, 1024, size=shape, dtype=np.uint16)
    return (sign | exp | man).astype(np.uint16)


def set_scales(rng, blocks, name, lo_exp, hi_exp):
    """Overwrite the block scales of ``blocks`` (uint8 [n, type_size]) with finite values of
    f16 exponent field lo_exp .. hi_exp (MXFP4: the E8M0 bytes of the same magnitudes)."""
    nb = blocks.shape[0]
    for off in F16_FIELDS[name]:
        blocks[:, off:off + 2] = random_f16_bits(rng, (nb,), lo_exp, hi_exp).view(np.uint8) \
            .reshape(nb, 2)
    if name == "IQ1_M":
        d = random_f16_bits(rng, (nb,), lo_exp, hi_exp)
        sc = blocks[:, 48:56].copy().view(np.uint16)
        for k in range(4):
            sc[:, k] = (sc[:, k] & 0x0FFF) | (((d >> (4 * k)) & 15) << 12)
        blocks[:, 48:56] = sc.view(np.uint8)
    if name == "MXFP4":
        blocks[:, 0] = rng.integers(lo_exp + 113, hi_exp + 114, nb)  # 2^(e-128) vs 2^(x-15)


def dequantize_ref(raw, name):
    with np.errstate(over="ignore"):  # MXFP4's largest scales overflow to inf: so must we
        return dequantize(raw, GGMLQuantizationType[name])


def random_weights(rng, name, n_rows, n_in, lo_exp=8, hi_exp=14):
    """(raw uint8 [n_rows, row_bytes], float32 dequantized [n_rows, n_in]). Quantized types get
    random bytes with finite f16 scales in 2^(lo_exp-15) .. 2^(hi_exp-14)."""
    if name in FLOAT_TYPES:
        w = rng.standard_normal((n_rows, n_in)).astype(np.float32)
        if name == "F16":
            raw = w.astype(np.float16)
        elif name == "BF16":
            raw = (w.view(np.uint32) >> 16).astype(np.uint16)
        else:
            raw = w
        raw = np.ascontiguousarray(raw).view(np.uint8).reshape(n_rows, -1)
    else:
        bs, ts = qinfo(name)
        nb = n_rows * (n_in // bs)
        raw = rng.integers(0, 256, size=(nb, ts), dtype=np.uint8)
        set_scales(rng, raw, name, lo_exp, hi_exp)
        raw = raw.reshape(n_rows, (n_in // bs) * ts)
    wf = dequantize_ref(raw, name).reshape(n_rows, n_in).astype(np.float32)
    return raw, wf


def upload(ctx, arr, pad_front=0):
    """Device copy of ``arr`` at (allocation + pad_front); returns (base, ptr)."""
    b = np.ascontiguousarray(arr).tobytes()
    base = ctx.alloc(len(b) + pad_front + 16)
    ctx.htod(base + pad_front, b)
    return base, base + pad_front


def download(ctx, ptr, n, dtype=np.float32):
    dt = np.dtype(dtype)
    return np.frombuffer(ctx.dtoh(ptr, n * dt.itemsize), dtype=dt).copy()


def assert_bits_equal(got, want, what):
    got_u = np.ascontiguousarray(got).view(np.uint32).reshape(-1)
    want_u = np.ascontiguousarray(want).view(np.uint32).reshape(-1)
    bad = np.flatnonzero(got_u != want_u)
    assert bad.size == 0, (
        f"{what}: {bad.size} of {got_u.size} differ; first at {bad[0]}: got {got_u[bad[0]]:#010x}"
        f" want {want_u[bad[0]]:#010x}")


def check_matmul(y, wf, x, what):
    ref = x.astype(np.float64) @ wf.astype(np.float64).T
    mag = np.abs(x).astype(np.float64) @ np.abs(wf).astype(np.float64).T
    tol = 1e-5 * np.sqrt(x.shape[1]) * mag + 1e-30
    assert y.shape == ref.shape, f"{what}: shape {y.shape} != {ref.shape}"
    assert not np.isnan(y).any(), f"{what}: NaN at {np.argwhere(np.isnan(y))[0]}"
    err = np.abs(y.astype(np.float64) - ref)
    if not (err <= tol).all():
        i = np.unravel_index(np.argmax(err / tol), err.shape)
        raise AssertionError(f"{what}: {(err > tol).sum()} of {err.size} out of tolerance; "
                             f"worst at {i}: got {y[i]!r} want {ref[i]!r} tol {tol[i]:.3g}")


def matmul_multi(ctx, t, xp, T, n_in, w_ptrs, y_ptrs, n_outs, swiglu=False):
    """Up to three weights of type ``t`` against x in one launch, planned and launched as
    CudaOps.matmul_many / matmul_swiglu do (quant_ops.plan, the plan's module,
    quant_ops.matmul_planned)."""
    plans = [quant_ops.plan(t, (n_in, n), w) for w, n in zip(w_ptrs, n_outs)]
    pad = (0,) * (quant_ops.MAX_SEGMENTS - len(w_ptrs))
    outs = (n_outs[0], 0, 0) if swiglu else tuple(n_outs) + pad
    quant_ops.matmul_planned(ctx.kernels(plans[0].module), plans[0], xp, T, tuple(w_ptrs) + pad,
                             tuple(y_ptrs) + (0,) * (quant_ops.MAX_SEGMENTS - len(y_ptrs)),
                             outs, swiglu, all(p.gemv_w_ok for p in plans))


def matmul(ctx, wp, t, xp, yp, T, n_in, n_out):
    """``y [T, n_out] = x [T, n_in] . W^T``, one weight (CudaOps.matmul's launch)."""
    matmul_multi(ctx, t, xp, T, n_in, [wp], [yp], [n_out])


def mm_args(wp, xp, yp, T, n_in, n_out, rb):
    """Raw matmul kernel arguments for one weight (segments 1 and 2 empty, mode 0)."""
    return (wp, 0, 0, xp, yp, 0, 0, T, n_in, n_out, 0, 0, rb, 0)


def n_in_cases(name):
    """One block, three blocks, many blocks (several lane-loop iterations)."""
    bs = qinfo(name)[0]
    if name in FLOAT_TYPES:
        return [8, 24, 1032]
    if bs == 32:
        return [32, 96, 2048]
    return [256, 768, 4096]


@pytest.fixture
def qk(cuda_ctx):
    """(cuda_ctx, kernels_of): ``kernels_of(name)`` is the loaded module that serves GGML type
    ``name`` (quant_ops.module_of), the one the CUDA backend launches its kernels from."""
    return cuda_ctx, lambda name: cuda_ctx.kernels(quant_ops.module_of(TYPES[name]))


# ----------------------------------------------------------------------------------------------
# the modules themselves


def test_each_module_holds_its_types_kernels_only(qk):
    from reflex_core.errors import CudaError

    ctx, _ = qk
    assert {quant_ops.module_of(t) for t in TYPES.values()} == set(quant_ops.MODULES)
    problems = []
    for module in quant_ops.MODULES:
        kern = ctx.kernels(module)
        for other in quant_ops.MODULES:
            names = quant_ops.kernel_names(other)
            assert len(names) >= 8 * 11
            for name in names:
                try:
                    kern.function(name)
                    found = True
                except CudaError:
                    found = False
                if found != (other == module):
                    problems.append(f"{name} {'is' if found else 'is not'} in {module}")
    assert not problems, "\n".join(problems)


# ----------------------------------------------------------------------------------------------
# dequant


@pytest.mark.parametrize("name", list(TYPES))
def test_dequant_bit_exact(qk, name):
    ctx, kernels_of = qk
    kern = kernels_of(name)
    rng = np.random.default_rng(TYPES[name])
    cases = []
    if name == "F16":
        bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
        bits = bits[~np.isnan(bits.view(np.float16))]  # all non-NaN patterns
        cases.append(bits.view(np.uint8))
        cases.append(bits[:1001].view(np.uint8))  # odd count: scalar tail
    elif name == "BF16":
        cases.append(np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.uint8))
        cases.append(cases[0][:2 * 999])
    elif name == "F32":
        cases.append(rng.integers(0, 2**32, size=4099, dtype=np.uint64).astype(np.uint32)
                     .view(np.uint8))
    else:
        for lo, hi in ((0, 30), (30, 30), (0, 0)):  # any finite scale, largest, subnormal
            raw, _ = random_weights(rng, name, 1, qinfo(name)[0] * 1000, lo, hi)
            cases.append(raw.reshape(-1))
        if name == "MXFP4":  # every E8M0 byte: subnormal 2^-128, 2^-127 .. overflow to inf
            raw, _ = random_weights(rng, name, 1, 32 * 256 * 3)
            raw = raw.reshape(-1, 17)
            raw[:, 0] = np.repeat(np.arange(256, dtype=np.uint8), 3)
            cases.append(raw.reshape(-1))
    for raw in cases:
        want = dequantize_ref(raw, name).reshape(-1)
        n = want.size
        _, wp = upload(ctx, raw)
        for off in (0, 4):  # aligned (float4 stores) and misaligned output
            ob = ctx.alloc(4 * n + 16)
            quant_ops.dequant(kern, wp, TYPES[name], n, ob + off)
            got = download(ctx, ob + off, n)
            assert_bits_equal(got, want, f"{name} dequant n={n} out+{off}")


# ----------------------------------------------------------------------------------------------
# embed


@pytest.mark.parametrize("name", list(TYPES))
def test_embed(qk, name):
    ctx, kernels_of = qk
    kern = kernels_of(name)
    rng = np.random.default_rng(50 + TYPES[name])
    n_embd = 37 if name in FLOAT_TYPES else 2 * qinfo(name)[0]
    V = 41
    raw, wf = random_weights(rng, name, V, n_embd, 0, 30)
    _, wp = upload(ctx, raw)
    ids = np.array([5, 0, 40, 5, 17, 40, 3], dtype=np.int32)
    _, ip = upload(ctx, ids)
    out = ctx.alloc(4 * len(ids) * n_embd)
    quant_ops.embed(kern, wp, TYPES[name], ip, out, len(ids), n_embd, n_vocab=V)
    got = download(ctx, out, len(ids) * n_embd).reshape(len(ids), n_embd)
    assert_bits_equal(got, wf[ids], f"{name} embed")
    # out-of-range ids give NaN rows, the others stay exact
    bad = np.array([1, -1, V, 2], dtype=np.int32)
    _, bp = upload(ctx, bad)
    quant_ops.embed(kern, wp, TYPES[name], bp, out, 4, n_embd, n_vocab=V)
    got = download(ctx, out, 4 * n_embd).reshape(4, n_embd)
    assert np.isnan(got[1]).all() and np.isnan(got[2]).all()
    assert_bits_equal(got[[0, 3]], wf[[1, 2]], f"{name} embed around invalid ids")


@pytest.mark.parametrize("name", list(TYPES))
def test_embed_norm_form(qk, name):
    """One token's embedding with the first RMSNorm's residual-step outputs (quant_ops.embed
    ``norm``): the row bit for bit, y = row * w (and the row itself without w) bit for bit, and
    embed_blocks block sums of row^2 in the kernel's order (each thread's elements in order, the
    warps' butterfly sums in order), for rows of one block and of several (a partial last one)."""
    ctx, kernels_of = qk
    kern = kernels_of(name)
    t = TYPES[name]
    rng = np.random.default_rng(60 + t)
    f = np.float32
    qk_ = 1 if name in FLOAT_TYPES else qinfo(name)[0]
    for n_embd in sorted({max(qk_, 8) * (1 + 32 // max(qk_, 8)), qk_ * (2048 // qk_ + 1)}):
        V = 9
        raw, wf = random_weights(rng, name, V, n_embd, 0, 20)
        _, wp = upload(ctx, raw)
        _, ip = upload(ctx, np.array([7], np.int32))
        nw = (rng.standard_normal(n_embd) * 0.5 + 1).astype(np.float32)
        _, nwp = upload(ctx, nw)
        nb = quant_ops.embed_blocks(t, n_embd)
        for wptr in (nwp, 0):
            out, yp, pp = (upload(ctx, np.full(n, np.nan, np.float32))[1]
                           for n in (n_embd, n_embd, nb))
            quant_ops.embed(kern, wp, t, ip, out, 1, n_embd, V, (wptr, yp, pp))
            h = wf[7].astype(np.float32)
            assert_bits_equal(download(ctx, out, n_embd), h, f"{name} embed row n={n_embd}")
            want_y = h * nw if wptr else h
            assert_bits_equal(download(ctx, yp, n_embd), want_y, f"{name} embed y n={n_embd}")
            # the kernel's order: thread i of block b takes groups g = b * 128 + i + k * stride
            per = 1 if qk_ == 1 else 4
            stride = nb * 128
            want = []
            for b in range(nb):
                warps = []
                for w0 in range(0, 128, 32):
                    lanes = []
                    for i in range(w0, w0 + 32):
                        s = f(0.0)
                        for g in range(b * 128 + i, n_embd // per, stride):
                            for c in range(per):
                                v = h[g * per + c]
                                s = f(s + f(v * v))  # the kernel fuses it: a few ulp
                        lanes.append(s)
                    for o in (16, 8, 4, 2, 1):
                        lanes = [f(lanes[j] + lanes[j ^ o]) for j in range(32)]
                    warps.append(lanes[0])
                tot = f(0.0)
                for v in warps:
                    tot = f(tot + v)
                want.append(tot)
            got = download(ctx, pp, nb)
            np.testing.assert_allclose(got, np.array(want, np.float32), rtol=2e-6,
                                       err_msg=f"{name} embed block sums n={n_embd}")
            np.testing.assert_allclose(np.sum(got, dtype=np.float64),
                                       np.sum(h.astype(np.float64) ** 2), rtol=1e-5)
    with pytest.raises(ValueError, match="one token"):
        quant_ops.embed(kern, wp, t, ip, out, 2, n_embd, V, (0, yp, pp))


# ----------------------------------------------------------------------------------------------
# matmul

T_CASES = (1, 2, 7, 8, 9, 64, 300)
N_OUT_CASES = (1, 33, 257, 1000)


@pytest.mark.parametrize("name", list(TYPES))
def test_matmul(qk, name):
    ctx, _ = qk
    rng = np.random.default_rng(100 + TYPES[name])
    for n_in in n_in_cases(name):
        for n_out in N_OUT_CASES:
            if n_in >= 1000 and n_out in (1, 257):
                continue
            raw, wf = random_weights(rng, name, n_out, n_in)
            _, wp = upload(ctx, raw)
            x = rng.standard_normal((max(T_CASES), n_in)).astype(np.float32)
            _, xp = upload(ctx, x)
            yp = ctx.alloc(4 * max(T_CASES) * n_out)
            for T in T_CASES:
                matmul(ctx, wp, TYPES[name], xp, yp, T, n_in, n_out)
                y = download(ctx, yp, T * n_out).reshape(T, n_out)
                check_matmul(y, wf, x[:T], f"{name} n_in={n_in} n_out={n_out} T={T}")


@pytest.mark.parametrize("name", list(TYPES))
def test_matmul_forced_paths(qk, name):
    """Each kernel on its own (GEMV variants at their max T and below; tiled at small T), and
    weights at an address 2 bytes off (2-aligned types keep the GEMV; others fall back)."""
    ctx, kernels_of = qk
    kern = kernels_of(name)
    rng = np.random.default_rng(200 + TYPES[name])
    suffix = quant_ops._TYPES[TYPES[name]][0]
    n_in = n_in_cases(name)[1]
    n_out = 45
    raw, wf = random_weights(rng, name, n_out, n_in)
    rb = raw.shape[1]
    x = rng.standard_normal((8, n_in)).astype(np.float32)
    _, xp = upload(ctx, x)
    yp = ctx.alloc(4 * 8 * n_out)
    for off in (0, 2):
        _, wp = upload(ctx, raw, pad_front=off)
        for tt in (1, 2, 4, 8, "1s"):
            for T in sorted({1, tt // 2 or 1, tt} if tt != "1s" else {1}):
                if off == 0:
                    rows = 4 if tt == "1s" else 8  # a block: 4 (2) row groups of 2 rows
                    kern.launch(f"reflex_matmul_gemv{tt}_{suffix}", ((n_out + rows - 1) // rows, 1, 1),
                                (128, 1, 1), mm_args(wp, xp, yp, T, n_in, n_out, rb))
                    y = download(ctx, yp, T * n_out).reshape(T, n_out)
                    check_matmul(y, wf, x[:T], f"{name} gemv{tt} T={T}")
                matmul(ctx, wp, TYPES[name], xp, yp, T, n_in, n_out)
                y = download(ctx, yp, T * n_out).reshape(T, n_out)
                check_matmul(y, wf, x[:T], f"{name} matmul T={T} w+{off}")
        for T in (1, 5):
            kern.launch(f"reflex_matmul_tiled_{suffix}", ((n_out + 63) // 64, 1, 1), (256, 1, 1),
                        mm_args(wp, xp, yp, T, n_in, n_out, rb))
            y = download(ctx, yp, T * n_out).reshape(T, n_out)
            check_matmul(y, wf, x[:T], f"{name} tiled T={T} w+{off}")


@pytest.mark.parametrize("name", list(TYPES))
def test_gemv_wide_bit_identical(qk, name):
    """The one-token GEMV with four rows a row group (gemv1ws) gives the same bits as the two-row
    kernel (gemv1s): each row's arithmetic is the same. Three segments with odd row counts (a
    group's last rows past n), and SwiGLU with an odd output count."""
    ctx, kernels_of = qk
    kern = kernels_of(name)
    rng = np.random.default_rng(250 + TYPES[name])
    suffix = quant_ops._TYPES[TYPES[name]][0]
    n_in = n_in_cases(name)[2]
    n_outs = (45, 3, 70)
    raws = [random_weights(rng, name, n, n_in)[0] for n in n_outs]
    rb = raws[0].shape[1]
    wps = [upload(ctx, r)[1] for r in raws]
    x = rng.standard_normal((1, n_in)).astype(np.float32)
    _, xp = upload(ctx, x)

    def run(kname, ks, rows, swiglu):  # into fresh NaN outputs: a row left unwritten shows
        yps = [upload(ctx, np.full(n, np.nan, np.float32))[1] for n in n_outs]
        outs = (n_outs[0], 0, 0) if swiglu else n_outs
        gx = quant_ops._gemv_grid_x(ks, outs, swiglu, rows)
        kern.launch(kname, (gx, 1, 1), (128, 1, 1),
                    (wps[0], wps[2] if swiglu else wps[1], wps[2], xp, yps[0], yps[1], yps[2], 1,
                     n_in, *outs, rb, 1 if swiglu else 0))
        return [download(ctx, yp, n) for yp, n in zip(yps, n_outs)][:1 if swiglu else 3]

    for swiglu in (False, True):
        for ks, base, wide in ((2, "gemv1s", "gemv1ws"),):
            want = run(f"reflex_matmul_{base}_{suffix}", ks, 2, swiglu)
            got = run(f"reflex_matmul_{wide}_{suffix}", ks, 4, swiglu)
            for i, (g, w) in enumerate(zip(got, want)):
                assert_bits_equal(g, w, f"{name} {wide} swiglu={swiglu} segment {i}")


@pytest.mark.parametrize("name", [n for n in TYPES if TYPES[n] in quant_ops.XS_CHUNK])
def test_gemv_staged_limbs(qk, name):
    """The one-token GEMV on x limbs staged in shared memory in its three block shapes (gemv1x:
    two warps a row group of 4, gemv1x4: four, gemv1x1: one) against the float64 matmul, for rows
    of whole and partial chunks of the staged order (2048, 2304, 3328, 12288 elements), three
    segments with odd row counts, x with a zero run, a run of subnormals and (a second x) one of
    huge values; SwiGLU within a few ulp of silu(y) * y of its own plain launch (gate and up the
    same weight); and the backend's launch is the shape quant_ops._gemv1_wide picks, bit for
    bit."""
    ctx, kernels_of = qk
    kern = kernels_of(name)
    t = TYPES[name]
    rng = np.random.default_rng(260 + t)
    suffix = quant_ops._TYPES[t][0]
    for n_in in (2048, 2304, 3328, 12288):
        p = quant_ops.plan(t, (n_in, 1), 0)
        assert p.gemv1x == f"reflex_matmul_gemv1x_{suffix}" and p.split == 2
        n_outs = (1100, 45, 70)
        pairs = [random_weights(rng, name, n, n_in) for n in n_outs]
        rb = pairs[0][0].shape[1]
        wps = [upload(ctx, raw)[1] for raw, _ in pairs]
        x = rng.standard_normal((1, n_in)).astype(np.float32)
        x[0, 16:48] = 0.0  # a zero run (and a run half zero)
        x[0, 256:272] = rng.standard_normal(16) * 1e-40  # subnormals
        big = x.copy()
        big[0, 512:528] *= 1e30
        shapes = ((p.gemv1x, 2), (p.gemv1x4, 4), (p.gemv1x1, 1))
        for kname, _ in shapes:
            assert kern.allow_shmem(kname, p.x_staged)

        def run(kname, ks, xv, swiglu):  # into fresh NaN outputs: a row left unwritten shows
            _, xp = upload(ctx, xv)
            yps = [upload(ctx, np.full(n, np.nan, np.float32))[1] for n in n_outs]
            outs = (n_outs[0], 0, 0) if swiglu else n_outs
            kern.launch(kname, (quant_ops._gemv_grid_x(ks, outs, swiglu, 4, 8), 1, 1), (256, 1, 1),
                        (wps[0], wps[0] if swiglu else wps[1], wps[2], xp, *yps, 1, n_in, *outs, rb,
                         1 if swiglu else 0), p.x_staged)
            return xp, [download(ctx, yp, n) for yp, n in zip(yps, n_outs)]

        plain = {}
        for kname, ks in shapes:
            for xv in (x, big):
                _, ys = run(kname, ks, xv, False)
                for i, ((_, wf), y) in enumerate(zip(pairs, ys)):
                    check_matmul(y.reshape(1, -1), wf, xv, f"{kname} n_in={n_in} segment {i}")
            xp, g = run(kname, ks, x, True)  # gate and up both segment 0's weight: silu(y0) * y0
            _, ys = run(kname, ks, x, False)
            plain[kname] = ys[0]
            y0 = ys[0].astype(np.float64)
            want = y0 / (1 + np.exp(-y0)) * y0
            np.testing.assert_allclose(g[0], want, rtol=4e-6, atol=1e-6 * (np.abs(want).max() + 1),
                                       err_msg=f"{kname} swiglu n_in={n_in}")
        yp = ctx.alloc(4 * 1100)
        matmul(ctx, wps[0], t, xp, yp, 1, n_in, 1100)
        picked = quant_ops._gemv1_wide(kern, p, (1100, 0, 0), False, True, xp)[0]
        assert picked == (p.gemv1x4 if n_in >= quant_ops.GEMVX4_MIN_IN else p.gemv1x), picked
        assert_bits_equal(download(ctx, yp, 1100), plain[picked], f"{name} matmul T=1 n_in={n_in}")


@pytest.mark.parametrize("name", [n for n in TYPES if TYPES[n] in quant_ops.XS_CHUNK])
def test_gemv_staged_limbs_head_shape(qk, name):
    """A launch of GEMVX1_MIN_WAVES waves of 32-row blocks (an LM head) takes gemv1x1, plain and
    as the norm's reader: against the float64 matmul (every row: a partial last block), the
    reader the plain launch's bits times rx_norm_scale."""
    ctx, kernels_of = qk
    kern = kernels_of(name)
    t = TYPES[name]
    rng = np.random.default_rng(280 + t)
    n_in = 2048
    n_out = quant_ops.GEMVX1_MIN_WAVES * kern.multiprocessors() * 32 - 13
    raw, wf = random_weights(rng, name, n_out, n_in)
    _, wp = upload(ctx, raw)
    p = quant_ops.plan(t, (n_in, n_out), wp)
    x = rng.standard_normal((1, n_in)).astype(np.float32)
    _, xp = upload(ctx, x)
    yp = upload(ctx, np.full(n_out, np.nan, np.float32))[1]
    matmul(ctx, wp, t, xp, yp, 1, n_in, n_out)
    y = download(ctx, yp, n_out)
    check_matmul(y.reshape(1, -1), wf, x, f"{name} head-shaped launch")
    part = (rng.random(40) * 50).astype(np.float32)
    _, pp = upload(ctx, part)
    c = quant_ops.fused_norm_launch(kern, p, (n_out, 0, 0), False, True, xp, "n")
    assert c is not None and c[0] == f"reflex_matmul_gemv1x1n_{quant_ops._TYPES[t][0]}", c
    assert quant_ops.fused_norm_launch(kern, p, (n_out, 0, 0), False, True, xp, "r") is None
    np_ = upload(ctx, np.full(n_out, np.nan, np.float32))[1]
    quant_ops.matmul_fused(kern, c, p, xp, (wp, 0, 0), (np_, 0, 0), (n_out, 0, 0), False, 0, 0, 0,
                           pp, 40, 1e-6)
    assert_bits_equal(download(ctx, np_, n_out), y * norm_scale_ref(part, n_in, 1e-6),
                      f"{name} head-shaped reader")
    # one block fewer than the waves: gemv1x
    c = quant_ops.fused_norm_launch(kern, p, (n_out - 32 * 20, 0, 0), False, True, xp, "n")
    assert c[0] == f"reflex_matmul_gemv1xn_{quant_ops._TYPES[t][0]}", c


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K"])
def test_gemv_stream_forms(qk, name):
    """The streamed residual-step GEMVs (reflex_matmul_gemv1xs{n,r}_<t>, the types
    quant_ops.STREAM_FORMS gives each form): on sm_90 the launcher picks them where the wide GEMV
    is gemv1x's shape (the SwiGLU reader, the producer) or, for one weight's plain reader, gemv1x1's
    (a head), and their outputs are gemv1xn's (mode 1 and 0) and gemv1xr's (h, h * w, the block
    sums), bit for bit: odd row counts
    (a partial last tile), rows in one ring slot and in several chunks (a short last one), 2 and
    3 ring slots, grids small enough that every block goes round its ring several times, a NaN in
    x (the outputs it reaches are NaN in both); rows the copy engine cannot move in chunks keep
    gemv1x's forms."""
    ctx, kernels_of = qk
    kern = kernels_of(name)
    if kern.sm() < 90 or kern.image != "sass":
        pytest.skip("the streamed forms are for sm_90+ SASS")
    t = TYPES[name]
    suffix = quant_ops._TYPES[t][0]
    rng = np.random.default_rng(290 + t)
    shapes = ((2048, 1037), (4096, 6001), (5120, 3000), (12288, 2200))
    for n_in, n_out in shapes:
        raw_g, _ = random_weights(rng, name, n_out, n_in)
        raw_u, _ = random_weights(rng, name, n_out, n_in)
        _, gwp = upload(ctx, raw_g)
        _, uwp = upload(ctx, raw_u)
        p = quant_ops.plan(t, (n_in, n_out), gwp)
        n_part = 200
        _, pp = upload(ctx, (rng.random(n_part) * 50).astype(np.float32))
        resid = rng.standard_normal(n_out).astype(np.float32)
        nw = (rng.standard_normal(n_out) * 0.5 + 1).astype(np.float32)
        _, rsp = upload(ctx, resid)
        _, nwp = upload(ctx, nw)
        tiles = -(-n_out // 16)
        for nan in (False, True):
            x = rng.standard_normal((1, n_in)).astype(np.float32)
            if nan:
                x[0, 300] = np.nan
            _, xp = upload(ctx, x)

            def reader(launch):
                yp = upload(ctx, np.full(n_out, np.nan, np.float32))[1]
                quant_ops.matmul_fused(kern, launch, p, xp, (gwp, uwp, 0), (yp, 0, 0),
                                       (n_out, 0, 0), True, 0, 0, 0, pp, n_part, 1e-6)
                return download(ctx, yp, n_out)

            def plain_reader(launch):
                yp = upload(ctx, np.full(n_out, np.nan, np.float32))[1]
                quant_ops.matmul_fused(kern, launch, p, xp, (gwp, 0, 0), (yp, 0, 0),
                                       (n_out, 0, 0), False, 0, 0, 0, pp, n_part, 1e-6)
                return download(ctx, yp, n_out)

            def producer(launch):
                yp, hp, qp = (upload(ctx, np.full(n, np.nan, np.float32))[1]
                              for n in (n_out, n_out, tiles))
                quant_ops.matmul_fused(kern, launch, p, xp, (gwp, 0, 0), (yp, 0, 0), (n_out, 0, 0),
                                       False, rsp, nwp, hp, qp, tiles, 0.0)
                return np.concatenate([download(ctx, yp, n_out), download(ctx, hp, n_out),
                                       download(ctx, qp, tiles)])

            for form, run, outs, rows in (("n", reader, True, -(-n_out // 8)),
                                          ("n", plain_reader, False, tiles),
                                          ("r", producer, False, tiles)):
                kname, plain = (f"reflex_matmul_gemv1x{s}{form}_{suffix}" for s in ("s", ""))
                assert kern.allow_shmem(plain, p.x_staged)
                want = run((plain, (rows, 1, 1), (256, 1, 1), p.x_staged))
                assert np.isnan(want).any() == nan
                ws = (gwp, uwp) if outs else (gwp,)
                if run is plain_reader:
                    # a head's rows take it (gemv1x1's shape); these few rows take gemv1xn, so
                    # it runs here on the streamed form's own launch of them
                    hp_ = quant_ops.plan(t, (n_in, 151936), gwp)
                    c = quant_ops.fused_norm_launch(kern, hp_, (151936, 0, 0), False, True, xp,
                                                    "n", w_ptrs=ws)
                    if c[0] == kname:
                        c = (kname, (min(tiles, kern.multiprocessors()), 1, 1), c[2], c[3])
                else:
                    c = quant_ops.fused_norm_launch(kern, p, (n_out, 0, 0), outs, True, xp, form,
                                                    w_ptrs=ws)
                # Q6_K rows of 20 blocks: a last chunk of 4 * 210 bytes, not a multiple of 16
                if t not in quant_ops.STREAM_FORMS[form] or (name == "Q6_K" and n_in == 5120):
                    keep = f"reflex_matmul_gemv1x1n_{suffix}" if run is plain_reader else plain
                    assert c is not None and c[0] == keep, c
                    continue
                assert c is not None and c[0] == kname, c
                if form == "r":
                    assert quant_ops.resnorm_parts(c, n_out) == tiles
                what = f"{kname} ({run.__name__}) n_in={n_in} n_out={n_out} NaN {nan}"
                assert_bits_equal(run(c), want, f"{what} as launched")
                for stages in (2, 3):
                    smem = quant_ops.gemv_stream_smem(t, n_in, stages)
                    if not kern.allow_shmem(kname, smem):
                        continue
                    for grid in (5, 37):
                        assert_bits_equal(run((kname, (grid, 1, 1), c[2], smem)), want,
                                          f"{what}, {stages} slots, {grid} blocks")
    # fewer rows than the wide GEMVs take: the narrow reader, as before
    narrow = quant_ops.fused_norm_launch(kern, p, (300, 0, 0), True, True, xp, "n")
    assert narrow is not None and narrow[0] == f"reflex_matmul_gemv1sn_{suffix}", narrow


def norm_scale_ref(part, n, eps):
    """rx_norm_scale's arithmetic in float32: lane l adds part[l], part[l + 32], ... in turn, the
    lanes' butterfly sum, then 1 / sqrt(sum / n + eps)."""
    f = np.float32
    lanes = [f(0.0)] * 32
    for i, v in enumerate(part.astype(np.float32)):
        lanes[i % 32] = f(lanes[i % 32] + v)
    for o in (16, 8, 4, 2, 1):
        lanes = [f(lanes[i] + lanes[i ^ o]) for i in range(32)]
    return f(f(1.0) / np.sqrt(f(f(lanes[0] / f(n)) + f(eps))))


@pytest.mark.parametrize("name", [n for n in TYPES if TYPES[n] in quant_ops.NORM_TYPES])
def test_residual_step_forms(qk, cuda_ctx, name):
    """The residual step inside the wide one-token GEMVs. Producer ("r"): h = resid + W x with
    the plain GEMV's bits plus the add, y = h * w, the block sums of h^2 in the kernel's order
    (rows in order within a group of 4, groups in order), an odd row count. Reader ("n"): the
    plain GEMV's bits on the same x times rx_norm_scale of the block sums (256 and 300 of them:
    the preloaded terms and the loop after them), three segments; SwiGLU within a few ulp of
    silu(g * r) * (u * r); reflex_norm_apply: x * r, bit for bit."""
    ctx, kernels_of = qk
    kern = kernels_of(name)
    t = TYPES[name]
    rng = np.random.default_rng(270 + t)
    f = np.float32
    for n_in in (2048, 4096):
        n_out = 1037
        raw, wf = random_weights(rng, name, n_out, n_in)
        _, wp = upload(ctx, raw)
        p = quant_ops.plan(t, (n_in, n_out), wp)
        x = rng.standard_normal((1, n_in)).astype(np.float32)
        _, xp = upload(ctx, x)
        resid = rng.standard_normal(n_out).astype(np.float32)
        nw = (rng.standard_normal(n_out) * 0.5 + 1).astype(np.float32)
        _, rp = upload(ctx, resid)
        _, nwp = upload(ctx, nw)
        c = quant_ops.fused_norm_launch(kern, p, (n_out, 0, 0), False, True, xp, "r")
        assert c is not None, f"{name} n_in={n_in}: no producer form"
        n_part = quant_ops.resnorm_parts(c, n_out)
        rows_per_block = -(-n_out // n_part)
        assert rows_per_block in (8, 16)
        yp, hp, pp = (upload(ctx, np.full(n, np.nan, np.float32))[1]
                      for n in (n_out, n_out, n_part))
        quant_ops.matmul_fused(kern, c, p, xp, (wp, 0, 0), (yp, 0, 0), (n_out, 0, 0), False, rp,
                               nwp, hp, pp, n_part, 0.0)
        bp = upload(ctx, np.full(n_out, np.nan, np.float32))[1]
        matmul(ctx, wp, t, xp, bp, 1, n_in, n_out)
        b = download(ctx, bp, n_out)
        check_matmul(b.reshape(1, -1), wf, x, f"{name} plain n_in={n_in}")
        h = (resid + b).astype(np.float32)
        assert_bits_equal(download(ctx, hp, n_out), h, f"{name} producer h n_in={n_in}")
        assert_bits_equal(download(ctx, yp, n_out), h * nw, f"{name} producer y n_in={n_in}")
        want = []
        for blk in range(n_part):
            s = f(0.0)
            for g0 in range(blk * rows_per_block, (blk + 1) * rows_per_block, 4):
                gs = f(0.0)
                for r in range(g0, g0 + 4):
                    gs = f(gs + (f(h[r] * h[r]) if r < n_out else f(0.0)))
                s = f(s + gs)
            want.append(s)
        assert_bits_equal(download(ctx, pp, n_part), np.array(want, np.float32),
                          f"{name} producer block sums n_in={n_in}")
        np.testing.assert_allclose(np.sum(want, dtype=np.float64),
                                   np.sum(h.astype(np.float64) ** 2), rtol=1e-5)

    # the reader: x = some h * w, random block sums
    n_in = 4096
    n_outs = (1100, 45, 70)
    pairs = [random_weights(rng, name, n, n_in) for n in n_outs]
    wps = [upload(ctx, raw)[1] for raw, _ in pairs]
    x = rng.standard_normal((1, n_in)).astype(np.float32)
    _, xp = upload(ctx, x)
    for n_part in (256, 300):
        part = (rng.random(n_part) * 50).astype(np.float32)
        _, pp = upload(ctx, part)
        r = norm_scale_ref(part, n_in, 1e-6)
        p = quant_ops.plan(t, (n_in, n_outs[0]), wps[0])

        def reader(outs, what):
            """The reader form of the launch of wps with these rows: the plain launch's bits times
            r, three segments. Returns its kernel and the plain outputs."""
            c = quant_ops.fused_norm_launch(kern, p, outs, False, True, xp, "n")
            assert c is not None, f"{name}: no {what} form"
            yps = [upload(ctx, np.full(n, np.nan, np.float32))[1] for n in outs]
            quant_ops.matmul_fused(kern, c, p, xp, tuple(wps), tuple(yps), outs, False, 0, 0, 0,
                                   pp, n_part, 1e-6)
            plain = [upload(ctx, np.full(n, np.nan, np.float32))[1] for n in outs]
            matmul_multi(ctx, t, xp, 1, n_in, wps, plain, list(outs))
            for i, (yp, pl, n) in enumerate(zip(yps, plain, outs)):
                assert_bits_equal(download(ctx, yp, n), download(ctx, pl, n) * r,
                                  f"{name} {what} n_part={n_part} segment {i}")
            return c[0], plain

        _, plain = reader(n_outs, "reader")
        # SwiGLU: gate = segment 0's weight, up = its first rows again (another weight's rows)
        c = quant_ops.fused_norm_launch(kern, p, (1100, 0, 0), True, True, xp, "n")
        gp = upload(ctx, np.full(1100, np.nan, np.float32))[1]
        quant_ops.matmul_fused(kern, c, p, xp, (wps[0], wps[0], 0), (gp, 0, 0), (1100, 0, 0), True,
                               0, 0, 0, pp, n_part, 1e-6)
        g = download(ctx, plain[0], 1100).astype(np.float64) * float(r)
        want = g / (1 + np.exp(-g)) * g
        np.testing.assert_allclose(download(ctx, gp, 1100), want, rtol=4e-6,
                                   atol=1e-6 * (np.abs(want).max() + 1),
                                   err_msg=f"{name} reader swiglu n_part={n_part}")
        # the narrow reader (gemv1sn: fewer rows than the wide forms take)
        kname, _ = reader((300, 45, 70), "narrow reader")
        assert kname == p.gemv1s.replace("gemv1s_", "gemv1sn_"), f"{name}: {kname}"
        # reflex_norm_apply, in place
        _, ap = upload(ctx, x)
        cuda_ctx.kernels("core").launch("reflex_norm_apply", ((n_in + 255) // 256, 1, 1),
                                        (256, 1, 1), (ap, pp, n_part, n_in, 1e-6))
        assert_bits_equal(download(ctx, ap, n_in), x[0] * r, f"norm_apply n_part={n_part}")


@pytest.mark.parametrize("name", FLOAT_TYPES)
def test_matmul_float_odd_n_in(qk, name):
    """Float weights with n_in not a multiple of 8 (GEMV not applicable: tiled for every T)."""
    ctx, _ = qk
    rng = np.random.default_rng(300 + TYPES[name])
    for n_in in (1, 37, 131):
        raw, wf = random_weights(rng, name, 19, n_in)
        _, wp = upload(ctx, raw)
        x = rng.standard_normal((70, n_in)).astype(np.float32)
        _, xp = upload(ctx, x)
        yp = ctx.alloc(4 * 70 * 19)
        for T in (1, 3, 70):
            matmul(ctx, wp, TYPES[name], xp, yp, T, n_in, 19)
            y = download(ctx, yp, T * 19).reshape(T, 19)
            check_matmul(y, wf, x[:T], f"{name} n_in={n_in} T={T}")


# ----------------------------------------------------------------------------------------------
# several weights per launch (q/k/v) and the fused SwiGLU (gate/up)


def _silu_mul(g, u):
    g = g.astype(np.float32)
    with np.errstate(over="ignore"):
        return (g / (np.float32(1.0) + np.exp(-g)) * u).astype(np.float32)


@pytest.mark.parametrize("name", list(TYPES))
def test_matmul_multi_and_swiglu(qk, name):
    """matmul_multi: every output bit-identical to the matmul of its weight alone (same
    per-row arithmetic), GEMV and tiled, odd row counts, 1-3 segments, a weight 2 bytes off
    (funnel-shifted loads or the tiled fallback). swiglu: bit-identical to silu(g) * u of the
    single matmuls for the GEMV path; the tiled path within float rounding of them."""
    ctx, _ = qk
    rng = np.random.default_rng(500 + TYPES[name])
    t = TYPES[name]
    n_in = n_in_cases(name)[1]
    n_outs = [37, 9, 70]
    ws = []
    for i, n in enumerate(n_outs):
        raw, wf = random_weights(rng, name, n, n_in)
        _, wp = upload(ctx, raw, pad_front=2 if i == 1 else 0)
        ws.append((wp, wf, n))
    x = rng.standard_normal((70, n_in)).astype(np.float32)
    _, xp = upload(ctx, x)
    for T in (1, 2, 5, 8, 9, 70):
        singles = []
        for wp, wf, n in ws:
            yp = ctx.alloc(4 * T * n)
            matmul(ctx, wp, t, xp, yp, T, n_in, n)
            singles.append(download(ctx, yp, T * n).reshape(T, n))
            check_matmul(singles[-1], wf, x[:T], f"{name} single T={T}")
        for segs in ([0], [0, 2], [0, 1, 2], [2, 1]):
            yps = [ctx.alloc(4 * T * n_outs[i]) for i in segs]
            matmul_multi(ctx, t, xp, T, n_in, [ws[i][0] for i in segs], yps,
                                   [n_outs[i] for i in segs])
            small = T <= quant_ops.GEMV_MAX_T
            group_gemv = small and all(quant_ops._gemv_ok(t, ws[i][0], xp, n_in) for i in segs)
            for i, yp in zip(segs, yps):
                y = download(ctx, yp, T * n_outs[i]).reshape(T, n_outs[i])
                if group_gemv == (small and quant_ops._gemv_ok(t, ws[i][0], xp, n_in)):
                    assert_bits_equal(y, singles[i], f"{name} multi {segs} seg {i} T={T}")
                else:  # a misaligned weight sends the whole group to the tiled kernel
                    check_matmul(y, ws[i][1], x[:T], f"{name} multi {segs} seg {i} T={T}")
        # swiglu: gate = weight 0, up = the first 37 rows of weight 2 (same n_out)
        yp = ctx.alloc(4 * T * 37)
        matmul_multi(ctx, t, xp, T, n_in, [ws[0][0], ws[2][0]], [yp], [37, 37],
                               swiglu=True)
        y = download(ctx, yp, T * 37).reshape(T, 37)
        # same g and u bits as the single matmuls; silu's expf vs NumPy's exp: a few ulp
        want = _silu_mul(singles[0], singles[2][:, :37])
        np.testing.assert_allclose(y, want, rtol=4e-6, atol=1e-6 * (np.abs(want).max() + 1),
                                   err_msg=f"{name} swiglu T={T}")
    # a misaligned gate in swiglu: both weights must be eligible, else the tiled kernel runs
    yp = ctx.alloc(4 * 3 * 9)
    matmul_multi(ctx, t, xp, 3, n_in, [ws[1][0], ws[1][0]], [yp], [9, 9], swiglu=True)
    yq = ctx.alloc(4 * 3 * 9)
    matmul(ctx, ws[1][0], t, xp, yq, 3, n_in, 9)
    y1 = download(ctx, yq, 27).reshape(3, 9)
    np.testing.assert_allclose(download(ctx, yp, 27).reshape(3, 9), _silu_mul(y1, y1),
                               rtol=4e-6, atol=1e-6 * (np.abs(y1).max() ** 2 + 1))


# ----------------------------------------------------------------------------------------------
# the one-token GEMV on x limbs (quant_ops.XQ_TYPES)


def test_x_limbs_kernel(cuda_ctx):
    """reflex_x_limbs == its NumPy twin bit for bit (every slot a group fills), one row, partial
    chunks, many rows back to back."""
    from reflex_core.testing.x_limbs import inputs_of_every_kind, slot, x_limbs

    core = cuda_ctx.kernels("core")
    rng = np.random.default_rng(1200)
    for n in (32, 96, 288, 4096, 12288 * 3):
        x = inputs_of_every_kind(rng, n, 32)
        _, xp = upload(cuda_ctx, x)
        out = cuda_ctx.alloc(quant_ops.x_limbs_bytes(n))
        quant_ops.x_limbs(core, xp, out, n)
        filled = slot(np.arange(n // 4))
        got = download(cuda_ctx, out, quant_ops.x_limbs_bytes(n) // 4, np.uint32).reshape(-1, 4)
        got = got[filled].reshape(-1)
        want = x_limbs(x).reshape(-1, 4)[filled].reshape(-1)
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, (f"n={n}: {bad.size} words differ; first {bad[0]}: got "
                               f"{got[bad[0]]:#010x} want {want[bad[0]]:#010x}")


@pytest.mark.parametrize("name", ["IQ4_XS"])
def test_matmul_xq(qk, name):
    """The GEMV on x limbs (one and two warps a row pair; 1-3 segments; SwiGLU): against the
    float64 product with the values the limbs stand for (summation rounding only), against x
    itself within the float GEMV's bound, and each output of a multi-weight launch bit-identical
    to its weight's own launch."""
    from reflex_core.testing.x_limbs import x_from_limbs, x_limbs

    ctx, kernels_of = qk
    kern, core = kernels_of(name), ctx.kernels("core")
    t = TYPES[name]
    rng = np.random.default_rng(1300 + t)
    bs = qinfo(name)[0]
    for n_in in sorted({bs, 3 * bs, 2048, 4096 + 3 * bs}):
        n_outs = (33, 1, 257)
        ws = [random_weights(rng, name, n, n_in) for n in n_outs]
        wps = [upload(ctx, raw)[1] for raw, _ in ws]
        x = rng.standard_normal((1, n_in)).astype(np.float32)
        x[0, :32] *= 1e-3  # a block far smaller than the rest
        _, xp = upload(ctx, x)
        xq = ctx.alloc(quant_ops.x_limbs_bytes(n_in))
        quant_ops.x_limbs(core, xp, xq, n_in)
        xr = x_from_limbs(x_limbs(x), n_in)[None, :]
        p = quant_ops.plan(t, (n_in, n_outs[0]), wps[0])
        assert p.gemvq is not None
        singles = []
        for wp, (raw, wf), n in zip(wps, ws, n_outs):
            yp = ctx.alloc(4 * n)
            quant_ops.matmul_planned(kern, quant_ops.plan(t, (n_in, n), wp), xp, 1, (wp, 0, 0),
                                     (yp, 0, 0), (n, 0, 0), False, True, xq)
            y = download(ctx, yp, n).reshape(1, n)
            what = f"{name} n_in={n_in} n_out={n} split={p.split}"
            ref = xr @ wf.astype(np.float64).T
            mag = np.abs(xr) @ np.abs(wf).astype(np.float64).T
            err = np.abs(y - ref)
            assert (err <= 2e-6 * mag + 1e-30).all(), f"{what}: worst {np.max(err / (mag + 1e-30)):.3g}"
            check_matmul(y, wf, x, what)
            singles.append(y)
        yps = [ctx.alloc(4 * n) for n in n_outs]
        quant_ops.matmul_planned(kern, p, xp, 1, tuple(wps), tuple(yps), n_outs, False, True, xq)
        for i, (yp, n) in enumerate(zip(yps, n_outs)):
            assert_bits_equal(download(ctx, yp, n), singles[i], f"{name} n_in={n_in} multi seg {i}")
        # swiglu: gate = weight 0, up = the first 33 rows of weight 2
        yp = ctx.alloc(4 * 33)
        quant_ops.matmul_planned(kern, p, xp, 1, (wps[0], wps[2], 0), (yp, 0, 0), (33, 0, 0), True,
                                 True, xq)
        want = _silu_mul(singles[0], singles[2][:, :33])
        np.testing.assert_allclose(download(ctx, yp, 33).reshape(1, 33), want, rtol=4e-6,
                                   atol=1e-6 * (np.abs(want).max() + 1), err_msg=f"{name} swiglu")


def _rows_of_every_kind(rng, T, n_in):
    """T float32 rows of n_in, cycling through normal, wide-ranging, tiny, huge, subnormal, zero,
    NaN and inf rows (the activation converters' inputs)."""
    kinds = [lambda n: rng.standard_normal(n),
             lambda n: rng.standard_normal(n) * np.exp2(rng.integers(-30, 30, n)),
             lambda n: rng.standard_normal(n) * 1e-36,
             lambda n: rng.standard_normal(n) * 1e30,
             lambda n: np.full(n, 1e-44) * rng.integers(-3, 4, n),
             lambda n: np.zeros(n),
             lambda n: np.r_[np.nan, rng.standard_normal(n - 1)],
             lambda n: np.r_[rng.standard_normal(n - 1), -np.inf]]
    return np.stack([kinds[t % len(kinds)](n_in) for t in range(T)]).astype(np.float32)


def test_x_halves_kernel(cuda_ctx):
    """reflex_x_halves == its NumPy twin bit for bit (halves, row scales, block sums): one block,
    odd block counts, many rows, rows of every kind (tiny, huge, subnormal, zero, NaN, inf)."""
    from reflex_core.testing.x_halves import x_halves

    core = cuda_ctx.kernels("core")
    rng = np.random.default_rng(1250)
    for T, n_in in ((1, 32), (3, 96), (8, 288), (65, 4096)):
        x = _rows_of_every_kind(rng, T, n_in)
        _, xp = upload(cuda_ctx, x)
        out = cuda_ctx.alloc(quant_ops.x_halves_bytes(T, n_in))
        quant_ops.x_halves(core, xp, out, T, n_in)
        nb = n_in // 32
        words = download(cuda_ctx, out, T * n_in + T + T * nb, np.uint32)
        H, s, sums = x_halves(x)
        got = words[:T * n_in]
        bad = np.flatnonzero(got != H.reshape(-1))
        assert bad.size == 0, (f"T={T} n_in={n_in}: {bad.size} half words differ; first {bad[0]}: "
                               f"got {got[bad[0]]:#010x} want {H.reshape(-1)[bad[0]]:#010x}")
        got_s = words[T * n_in:T * n_in + T].view(np.float32)
        assert np.array_equal(np.isnan(got_s), np.isnan(s)), f"T={T} n_in={n_in} NaN scales"
        assert_bits_equal(got_s[~np.isnan(s)], s[~np.isnan(s)], f"T={T} n_in={n_in} scales")
        assert_bits_equal(words[T * n_in + T:].view(np.float32), sums.reshape(-1),
                          f"T={T} n_in={n_in} block sums")


def _xh_x(rng, T, n_in):
    """x for the prefill matmul tests: normal rows, a block far smaller than the rest, a
    wide-ranging row."""
    x = rng.standard_normal((T, n_in)).astype(np.float32)
    x[0, :32] *= 1e-3
    x[-1] *= np.exp2(rng.integers(-12, 12, n_in)).astype(np.float32)
    return x


@pytest.mark.parametrize("name", sorted(n for n, t in TYPES.items() if t in quant_ops.XH_TYPES))
def test_matmul_xh(qk, name):
    """The float16 tensor-core tile on x halves (partial token and row tiles, odd block counts,
    1-3 segments, SwiGLU): against the float64 product with the values the halves stand for
    (f32 summation rounding only), against x itself within the float kernels' bound, and each
    output of a multi-weight launch bit-identical to its weight's own launch."""
    from reflex_core.testing.x_halves import x_from_halves, x_halves

    ctx, kernels_of = qk
    kern, core = kernels_of(name), ctx.kernels("core")
    t = TYPES[name]
    rng = np.random.default_rng(1400 + t)
    bs = qinfo(name)[0]
    for n_in, T in ((bs, 9), (3 * bs, 64), (max(2048, bs), 65), (4096 + 3 * bs, 130)):
        n_outs = (33, 1, 130)
        ws = [random_weights(rng, name, n, n_in) for n in n_outs]
        wps = [upload(ctx, raw)[1] for raw, _ in ws]
        x = _xh_x(rng, T, n_in)
        _, xp = upload(ctx, x)
        xq = ctx.alloc(quant_ops.x_halves_bytes(T, n_in))
        quant_ops.x_halves(core, xp, xq, T, n_in)
        H, s, _ = x_halves(x)
        xr = x_from_halves(H, s)
        p = quant_ops.plan(t, (n_in, n_outs[0]), wps[0])
        assert p.xh == f"reflex_matmul_xh_{name.lower()}"
        nb = n_in // 32
        singles = []
        for wp, (raw, wf), n in zip(wps, ws, n_outs):
            yp = ctx.alloc(4 * T * n)
            quant_ops.matmul_planned(kern, quant_ops.plan(t, (n_in, n), wp), xp, T, (wp, 0, 0),
                                     (yp, 0, 0), (n, 0, 0), False, True, xq)
            y = download(ctx, yp, T * n).reshape(T, n)
            what = f"{name} T={T} n_in={n_in} n_out={n}"
            ref = xr @ wf.astype(np.float64).T
            mag = np.abs(xr) @ np.abs(wf).astype(np.float64).T
            err = np.abs(y - ref)
            tol = 1e-6 * (nb + 2) * mag + 1e-30
            assert (err <= tol).all(), f"{what}: worst {np.max(err / tol):.3g} of the bound"
            check_matmul(y, wf, x, what)
            singles.append(y)
        yps = [ctx.alloc(4 * T * n) for n in n_outs]
        quant_ops.matmul_planned(kern, p, xp, T, tuple(wps), tuple(yps), n_outs, False, True, xq)
        for i, (yp, n) in enumerate(zip(yps, n_outs)):
            assert_bits_equal(download(ctx, yp, T * n).reshape(T, n), singles[i],
                              f"{name} T={T} n_in={n_in} multi seg {i}")
        # swiglu: gate = weight 0, up = the first 33 rows of weight 2
        yp = ctx.alloc(4 * T * 33)
        quant_ops.matmul_planned(kern, p, xp, T, (wps[0], wps[2], 0), (yp, 0, 0), (33, 0, 0), True,
                                 True, xq)
        want = _silu_mul(singles[0], singles[2][:, :33])
        np.testing.assert_allclose(download(ctx, yp, T * 33).reshape(T, 33), want, rtol=4e-6,
                                   atol=1e-6 * (np.abs(want).max() + 1), err_msg=f"{name} swiglu")


def test_x_pairs_kernel(cuda_ctx):
    """reflex_x_pairs == its NumPy twin bit for bit (hi and lo planes, row scales): rows of every
    kind (tiny, huge, subnormal, zero, NaN, inf), one row to many, odd widths."""
    from reflex_core.testing.f16_pairs import pairs

    core = cuda_ctx.kernels("core")
    rng = np.random.default_rng(1260)
    for T, n_in in ((1, 4), (3, 96), (9, 292), (130, 4096)):
        x = _rows_of_every_kind(rng, T, n_in)
        _, xp = upload(cuda_ctx, x)
        out = cuda_ctx.alloc(quant_ops.x_pairs_bytes(T, n_in))
        quant_ops.x_pairs(core, xp, out, T, n_in)
        got = download(cuda_ctx, out, 2 * T * n_in, np.uint16)
        hi, lo, s = pairs(x)
        what = f"T={T} n_in={n_in}"
        assert np.array_equal(got[:T * n_in], hi.view(np.uint16).reshape(-1)), f"{what}: hi plane"
        assert np.array_equal(got[T * n_in:], lo.view(np.uint16).reshape(-1)), f"{what}: lo plane"
        got_s = download(cuda_ctx, out + 4 * T * n_in, T)
        assert np.array_equal(np.isnan(got_s), np.isnan(s)), f"{what}: NaN scales"
        assert_bits_equal(got_s[~np.isnan(s)], s[~np.isnan(s)], f"{what}: scales")


@pytest.mark.parametrize("name", list(TYPES))
def test_unpack_pairs(qk, name, monkeypatch):
    """reflex_unpack_pairs_<t> == the twin's pairs of the exactly dequantized rows, bit for bit
    (hi plane, scales, lo plane): rows with one block and with many, the launcher's team of
    threads a row and each team size (32 to 256) over a row count that leaves a block's last
    teams without a row."""
    from reflex_core.testing.f16_pairs import pairs

    ctx, kernels_of = qk
    kern = kernels_of(name)
    t = TYPES[name]
    rng = np.random.default_rng(1600 + t)
    bs = qinfo(name)[0]
    launcher_team = quant_ops.unpack_team
    cases = [(None, 1, max(bs, 32)), (None, 7, 3 * max(bs, 32)), (None, 300, 4096 + max(bs, 32)),
             (None, 2001, 96)] + [(team, 131, 5 * max(bs, 32)) for team in (32, 64, 128, 256)]
    for team, n_rows, n_in in cases:
        n_in -= n_in % 32
        if n_in % bs:
            continue
        monkeypatch.setattr(quant_ops, "unpack_team",
                            launcher_team if team is None else lambda r, n, team=team: team)
        raw, wf = random_weights(rng, name, n_rows, n_in)
        _, wp = upload(ctx, raw)
        lo_off = quant_ops.pairs_lo_offset(n_rows, n_in)
        nbytes = lo_off + 2 * n_rows * n_in
        out = upload(ctx, np.full(nbytes // 4, np.nan, np.float32))[1]
        quant_ops.unpack_pairs(kern, wp, t, out, n_rows, n_in)
        hi, lo, s = pairs(wf)
        what = f"{name} {n_rows} x {n_in}, team {team or launcher_team(n_rows, n_in)}"
        assert np.array_equal(download(ctx, out, n_rows * n_in, np.uint16),
                              hi.view(np.uint16).reshape(-1)), f"{what}: hi plane"
        assert np.array_equal(download(ctx, out + lo_off, n_rows * n_in, np.uint16),
                              lo.view(np.uint16).reshape(-1)), f"{what}: lo plane"
        got_s = download(ctx, out + 2 * n_rows * n_in, n_rows)
        assert np.array_equal(np.isnan(got_s), np.isnan(s)), f"{what}: NaN scales"
        assert_bits_equal(got_s[~np.isnan(s)], s[~np.isnan(s)], f"{what}: scales")


@pytest.mark.parametrize("terms", (3, 1))
@pytest.mark.parametrize("name", ["F32", "F16", "Q8_0", "Q4_K", "Q6_K", "Q3_K", "IQ4_XS", "MXFP4"])
def test_matmul_pairs(qk, name, terms):
    """The prefill GEMM on float16 pairs (reflex_x_pairs, reflex_unpack_pairs_<t>,
    reflex_matmul_f16x{terms}{,_64}): against the twin's float64 sum of the same products (f32
    summation rounding only); three terms also against x . W within the float kernels' bound;
    both forms bit-identical, 1-3 segments each bit-identical to its weight alone, SwiGLU within
    float rounding of silu(g) * u of those; partial row and token tiles, more row tiles than a
    raster group; every output written (they start as NaN)."""
    from reflex_core.testing.f16_pairs import pairs, pairs_magnitude, pairs_product

    ctx, kernels_of = qk
    kern, core, common = kernels_of(name), ctx.kernels("core"), ctx.kernels("quant")
    t = TYPES[name]
    rng = np.random.default_rng(1700 + t + terms)
    bs = max(qinfo(name)[0], 32)
    for n_in, T, n_outs in ((bs, 1, (33, 1, 130)), (3 * bs, 129, (33, 1, 130)),
                            (4096 + bs, 200, (33, 64, 130)), (2 * bs, 300, (1100, 1, 130))):
        ws = [random_weights(rng, name, n, n_in) for n in n_outs]
        wps = [upload(ctx, raw)[1] for raw, _ in ws]
        x = _xh_x(rng, T, n_in)
        _, xp = upload(ctx, x)
        xq = ctx.alloc(quant_ops.x_pairs_bytes(T, n_in))
        quant_ops.x_pairs(core, xp, xq, T, n_in)
        xpr = pairs(x)
        p = quant_ops.plan(t, (n_in, n_outs[0]), wps[0])
        n_sw = min(n_outs[0], n_outs[2])

        def run(segs, swiglu, form):
            w3 = tuple(wps[i] for i in segs) + (0,) * (3 - len(segs))
            outs = ((n_sw, 0, 0) if swiglu else
                    tuple(n_outs[i] for i in segs) + (0,) * (3 - len(segs)))
            yps = [upload(ctx, np.full(T * n, np.nan, np.float32))[1] if n else 0 for n in outs]
            nbytes = quant_ops.pairs_bytes(p, max(T, quant_ops.PAIRS_MIN_T), outs, swiglu, terms)
            scratch = upload(ctx, np.full(nbytes // 4, np.nan, np.float32))[1]
            quant_ops.matmul_pairs(kern, common, p, xq, T, w3, tuple(yps), outs, swiglu, scratch,
                                   form=form, terms=terms)
            return [download(ctx, yp, T * n).reshape(T, n) for yp, n in zip(yps, outs) if n]

        singles = []
        for i, (raw, wf) in enumerate(ws):
            y, = run((i,), False, "")
            what = f"{name} f16x{terms} T={T} n_in={n_in} n_out={n_outs[i]}"
            wpr = pairs(wf)
            ref, mag = pairs_product(xpr, wpr, terms), pairs_magnitude(xpr, wpr)
            err = np.abs(y - ref)
            tol = 1e-6 * (n_in // 32 + 2) * mag + 1e-30
            assert (err <= tol).all(), f"{what}: worst {np.max(err / tol):.3g} of the bound"
            if terms == 3:
                check_matmul(y, wf, x, what)
            assert_bits_equal(run((i,), False, "_64")[0], y, f"{what}: the 64 x 64 form")
            singles.append(y)
        for segs in ((0, 1, 2), (2, 0)):
            for form in ("", "_64"):
                for k, g in zip(segs, run(segs, False, form)):
                    assert_bits_equal(g, singles[k], f"{name} f16x{terms} T={T} segs={segs} "
                                                     f"form={form!r} out {k}")
        want = _silu_mul(singles[0][:, :n_sw], singles[2][:, :n_sw])
        sw = run((0, 2), True, "")[0]
        np.testing.assert_allclose(sw, want, rtol=4e-6, atol=1e-6 * (np.abs(want).max() + 1),
                                   err_msg=f"{name} f16x{terms} T={T} swiglu")
        assert_bits_equal(run((0, 2), True, "_64")[0], sw, f"{name} f16x{terms} T={T} swiglu _64")
    assert quant_ops.pairs_bytes(p, quant_ops.PAIRS_MIN_T, (33, 0, 0), False) > 0
    assert quant_ops.pairs_bytes(p, quant_ops.PAIRS_MIN_T - 1, (33, 0, 0), False) == 0


# ----------------------------------------------------------------------------------------------
# MoE


@pytest.mark.parametrize("name", list(TYPES))
def test_moe_matmul(qk, name):
    ctx, kernels_of = qk
    kern = kernels_of(name)
    rng = np.random.default_rng(400 + TYPES[name])
    E, k, n_out = 5, 3, 37
    n_in = n_in_cases(name)[1]
    raw, wf = random_weights(rng, name, E * n_out, n_in)  # E matrices back to back
    wf = wf.reshape(E, n_out, n_in)
    _, wp = upload(ctx, raw)
    for T in (1, 4, 37):
        ids = rng.integers(0, E, size=(T, k)).astype(np.int32)
        ids[0] = [2, 2, 4][:k]  # repeated expert within a token
        _, ip = upload(ctx, ids)
        for per_expert in (False, True):
            x = rng.standard_normal((T, k, n_in) if per_expert else (T, n_in)).astype(np.float32)
            _, xp = upload(ctx, x)
            yp = ctx.alloc(4 * T * k * n_out)
            quant_ops.moe_matmul(kern, wp, TYPES[name], xp, ip, yp, T, k, n_in, n_out, E,
                                 x_per_expert=per_expert)
            y = download(ctx, yp, T * k * n_out).reshape(T, k, n_out)
            for t in range(T):
                for j in range(k):
                    xr = x[t, j] if per_expert else x[t]
                    check_matmul(y[t, j][None], wf[ids[t, j]], xr[None],
                                 f"{name} moe T={T} t={t} j={j} per_expert={per_expert}")
    # SwiGLU mode: gate = these experts, up = a second expert tensor; one launch
    raw_u, wf_u = random_weights(rng, name, E * n_out, n_in)
    wf_u = wf_u.reshape(E, n_out, n_in)
    _, up = upload(ctx, raw_u)
    # (T = 1 of the XS_CHUNK types: the GEMV on staged x limbs, reflex_moe_matmulx_<t>)
    for T, (bt, bj) in ((6, (1, 0)), (1, (0, 1))):
        ids = rng.integers(0, E, size=(T, k)).astype(np.int32)
        ids[bt, bj] = E  # invalid: a NaN row
        _, ip = upload(ctx, ids)
        for per_expert in (False, True):
            x = rng.standard_normal((T, k, n_in) if per_expert else (T, n_in)).astype(np.float32)
            _, xp = upload(ctx, x)
            outs = []
            for wptr, upp in ((wp, 0), (up, 0), (wp, up)):
                yp = ctx.alloc(4 * T * k * n_out)
                quant_ops.moe_matmul(kern, wptr, TYPES[name], xp, ip, yp, T, k, n_in, n_out, E,
                                     x_per_expert=per_expert, up_ptr=upp)
                outs.append(download(ctx, yp, T * k * n_out).reshape(T, k, n_out))
            g, u, y = outs
            bad = bt * k + bj
            assert np.isnan(y[bt, bj]).all()
            assert not np.isnan(np.delete(y.reshape(T * k, -1), bad, 0)).any()
            ok = ~np.isnan(g)
            want = _silu_mul(g, u)
            np.testing.assert_allclose(y[ok], want[ok], rtol=4e-6,
                                       atol=1e-6 * (np.abs(want[ok]).max() + 1),
                                       err_msg=f"{name} moe swiglu T={T} per_expert={per_expert}")
    # an invalid id: NaN for that slot only
    ids = np.array([[1, E, 0]], dtype=np.int32)[:, :k]
    _, ip = upload(ctx, ids)
    x = rng.standard_normal((1, n_in)).astype(np.float32)
    _, xp = upload(ctx, x)
    yp = ctx.alloc(4 * k * n_out)
    quant_ops.moe_matmul(kern, wp, TYPES[name], xp, ip, yp, 1, k, n_in, n_out, E)
    y = download(ctx, yp, k * n_out).reshape(k, n_out)
    assert np.isnan(y[1]).all()
    check_matmul(y[0][None], wf[1], x, f"{name} moe next to an invalid id")


@pytest.mark.parametrize("name", [n for n in TYPES if TYPES[n] in quant_ops.XS_CHUNK
                                  and TYPES[n] in quant_ops.NORM_TYPES])
def test_moe_matmul_normed(qk, name):
    """One token's MoE GEMV on the output of a residual-step GEMV (reflex_moe_matmulxn_<t>): the
    plain launch's bits on the same x times rx_norm_scale of the block sums (9 and 300 of them),
    SwiGLU within a few ulp of silu(g * r) * (u * r), with a repeated expert, an odd row count
    and an invalid id (NaN rows); x is left as it was."""
    ctx, kernels_of = qk
    kern = kernels_of(name)
    t = TYPES[name]
    rng = np.random.default_rng(430 + t)
    E, k, n_out = 6, 4, 77
    for n_in in (768, 2048):
        assert quant_ops.moe_normed_ok(kern, t, n_in), f"{name} n_in={n_in}: no normed form"
        gate, up = (upload(ctx, random_weights(rng, name, E * n_out, n_in)[0])[1] for _ in "gu")
        ids = np.array([[3, 3, 0, E]], np.int32)  # a repeated expert, an invalid id
        _, ip = upload(ctx, ids)
        x = (rng.standard_normal((1, n_in)) * 3).astype(np.float32)
        for n_part in (9, 300):
            part = (rng.random(n_part) * 50 * n_in / 2048).astype(np.float32)
            _, pp = upload(ctx, part)
            r = norm_scale_ref(part, n_in, 1e-6)
            _, xp = upload(ctx, x)
            outs = {}
            for key, w_up, norm in (("n", 0, (pp, n_part, 1e-6)), ("n_swiglu", up, (pp, n_part, 1e-6)),
                                    ("g", 0, None), ("u", up, None)):
                yp = upload(ctx, np.full(k * n_out, np.nan, np.float32))[1]
                if key == "u":  # the up experts alone
                    quant_ops.moe_matmul(kern, up, t, xp, ip, yp, 1, k, n_in, n_out, E)
                else:
                    quant_ops.moe_matmul(kern, gate, t, xp, ip, yp, 1, k, n_in, n_out, E,
                                         up_ptr=w_up, norm=norm)
                outs[key] = download(ctx, yp, k * n_out)
            what = f"{name} n_in={n_in} n_part={n_part}"
            assert_bits_equal(download(ctx, xp, n_in), x[0], f"{what}: x left as it was")
            for key in outs:
                assert np.isnan(outs[key][3 * n_out:]).all(), f"{what} {key}: the invalid id"
                assert not np.isnan(outs[key][:3 * n_out]).any(), f"{what} {key}"
            ok = slice(0, 3 * n_out)
            assert_bits_equal(outs["n"][ok], outs["g"][ok] * r, what)
            g = outs["g"][ok].astype(np.float64) * float(r)
            u = outs["u"][ok].astype(np.float64) * float(r)
            want = g / (1 + np.exp(-g)) * u
            np.testing.assert_allclose(outs["n_swiglu"][ok], want, rtol=4e-6,
                                       atol=1e-6 * (np.abs(want).max() + 1),
                                       err_msg=f"{what} swiglu")


@pytest.mark.parametrize("a,b", [(a, b) for a in TYPES for b in TYPES
                                 if quant_ops.MIXED_XS.get(TYPES[a], {}).get(TYPES[b])])
def test_gemv1xn_mixed(qk, a, b):
    """One token's q/k/v on a normed x whose v is another K-quant, in one launch
    (reflex_matmul_gemv1xn_<a>_<b>): each output has the bits of its weight's own gemv1xn launch,
    with odd row counts (a partial last block in each type's blocks), v's too where it alone
    would take the narrow gemv1sn (the launch's rows choose the form); none where q and k would."""
    ctx, kernels_of = qk
    kern = kernels_of(a)
    assert kernels_of(b) is kern, "both types in one module"
    ta, tb = TYPES[a], TYPES[b]
    rng = np.random.default_rng(490 + ta)
    n_in = 2048
    part = (rng.random(33) * 50).astype(np.float32)
    _, pp = upload(ctx, part)
    _, xp = upload(ctx, rng.standard_normal((1, n_in)).astype(np.float32))
    for n_outs in ((1027, 45, 1029), (2048, 512, 1024), (2048, 512, 512), (1027, 45, 301)):
        raws = [random_weights(rng, a if i < 2 else b, n, n_in)[0] for i, n in enumerate(n_outs)]
        wps = tuple(upload(ctx, raw)[1] for raw in raws)
        pa = quant_ops.plan(ta, (n_in, n_outs[0]), wps[0])
        pb = quant_ops.plan(tb, (n_in, n_outs[2]), wps[2])
        c = quant_ops.mixed_norm_launch(kern, pa, pb, n_outs, True, True, xp)
        assert c is not None and c[0] == f"reflex_matmul_gemv1xn_{a.lower()}_{b.lower()}"
        yps = tuple(upload(ctx, np.full(n, np.nan, np.float32))[1] for n in n_outs)
        quant_ops.matmul_mixed(kern, c, pa, pb, xp, wps, yps, n_outs, pp, 33, 1e-6)
        # each type alone, its own reader launch
        want = [upload(ctx, np.full(n, np.nan, np.float32))[1] for n in n_outs]
        for p, ws, ys, outs in ((pa, (wps[0], wps[1], 0), (want[0], want[1], 0),
                                 (n_outs[0], n_outs[1], 0)),
                                (pb, (wps[2], 0, 0), (want[2], 0, 0), (n_outs[2], 0, 0))):
            one = quant_ops.fused_norm_launch(kern, p, outs, False, True, xp, "n")
            if p is pb and sum(outs) < quant_ops.GEMV_WIDE_MIN_ROWS:  # v's gemv1xn all the same
                wide = quant_ops._gemv1_wide(kern, p, outs, False, True, xp,
                                             quant_ops.GEMV_WIDE_MIN_ROWS, shared=True)
                one = (p.fused[p.gemv1x]["n"],) + wide[1:]
            assert one is not None and "gemv1xn_" in one[0]
            quant_ops.matmul_fused(kern, one, p, xp, ws, ys, outs, False, 0, 0, 0, pp, 33, 1e-6)
        for i, n in enumerate(n_outs):
            got = download(ctx, yps[i], n)
            assert not np.isnan(got).any(), f"{a}/{b} {n_outs} segment {i}"
            assert_bits_equal(got, download(ctx, want[i], n), f"{a}/{b} {n_outs} segment {i}")
    # q and k of fewer rows than the wide forms take: no mixed launch
    pa = quant_ops.plan(ta, (n_in, 512), 0)
    assert quant_ops.mixed_norm_launch(kern, pa, pb, (512, 256, 1024), True, True, xp) is None


@pytest.mark.parametrize("name", [n for n in TYPES if TYPES[n] in quant_ops.XS_CHUNK])
def test_moe_matmul_slots_a_block(qk, name, monkeypatch):
    """One token's MoE GEMV on staged x whose k slots share x, a block taking 1, 2, 3 or all of
    them (quant_ops.MOE_SLOTS_A_BLOCK; x staged once a block): the same bits every way, the
    plain, SwiGLU and normed forms, with a repeated expert and an invalid id among the slots."""
    ctx, kernels_of = qk
    kern = kernels_of(name)
    t = TYPES[name]
    rng = np.random.default_rng(450 + t)
    E, k, n_out, n_in = 9, 8, 45, 2048
    gate, up = (upload(ctx, random_weights(rng, name, E * n_out, n_in)[0])[1] for _ in "gu")
    ids = np.array([[4, 1, 4, 8, E, 0, 7, 2]], np.int32)
    _, ip = upload(ctx, ids)
    _, xp = upload(ctx, rng.standard_normal((1, n_in)).astype(np.float32))
    part = (rng.random(33) * 50).astype(np.float32)
    _, pp = upload(ctx, part)
    normed = quant_ops.moe_normed_ok(kern, t, n_in)
    forms = [("plain", 0, None), ("swiglu", up, None)] + (
        [("normed", up, (pp, 33, 1e-6))] if normed else [])
    first = {}
    for spb in (1, 2, 3, 8):
        monkeypatch.setattr(quant_ops, "MOE_SLOTS_A_BLOCK", spb)
        for key, w_up, norm in forms:
            yp = upload(ctx, np.zeros(k * n_out, np.float32))[1]
            quant_ops.moe_matmul(kern, gate, t, xp, ip, yp, 1, k, n_in, n_out, E, up_ptr=w_up,
                                 norm=norm)
            y = download(ctx, yp, k * n_out).reshape(k, n_out)
            assert np.isnan(y[4]).all() and not np.isnan(np.delete(y, 4, 0)).any(), f"{key} {spb}"
            if spb == 1:
                first[key] = y
            else:
                assert_bits_equal(y, first[key], f"{name} {key}: {spb} slots a block")


@pytest.mark.parametrize("name,xh", [("F32", False), ("Q8_0", False), ("Q8_0", True),
                                     ("Q4_K", False), ("Q4_K", True), ("Q6_K", False), ("Q6_K", True),
                                     ("Q3_K", False), ("IQ4_XS", False), ("IQ4_XS", True),
                                     ("IQ2_XXS", False)])
def test_moe_matmul_grouped(qk, name, xh):
    """Long prompts: the slots grouped by expert (reflex_moe_schedule, then the grouped tiled
    kernel, or with ``xh`` the grouped tile on x halves) give each slot W_e . x_row, with an
    expert no token picked, one picked by more than 64 slots (two tiles), a repeated expert
    within a token, an invalid id (a NaN row), x shared or per slot, and the SwiGLU mode."""
    ctx, kernels_of = qk
    kern, core = kernels_of(name), ctx.kernels("core")
    rng = np.random.default_rng(450 + TYPES[name])
    E, k, n_out = 6, 3, 45
    n_in = n_in_cases(name)[1]
    raw, wf = random_weights(rng, name, E * n_out, n_in)
    wf = wf.reshape(E, n_out, n_in)
    _, wp = upload(ctx, raw)
    raw_u, wf_u = random_weights(rng, name, E * n_out, n_in)
    wf_u = wf_u.reshape(E, n_out, n_in)
    _, up = upload(ctx, raw_u)
    for T in (quant_ops.MOE_TILED_MIN_T, 131):
        assert quant_ops.moe_tiled_ok(T, k, E)
        ids = rng.choice([0, 1, 2, 4, 5], size=(T, k), p=[0.5, 0.2, 0.1, 0.1, 0.1]).astype(np.int32)
        ids[0] = [2, 2, 4]  # repeated expert within a token; expert 3 never picked
        ids[1, 1] = E  # invalid
        _, ip = upload(ctx, ids)
        n_slots = T * k
        order = ctx.alloc(4 * n_slots)
        tiles = ctx.alloc(4 * 3 * quant_ops.moe_max_tiles(n_slots, E))
        n_tiles = ctx.alloc(4)
        valid = ids.reshape(-1) < E
        for per_expert in (False, True):
            x = rng.standard_normal((T, k, n_in) if per_expert else (T, n_in)).astype(np.float32)
            _, xp = upload(ctx, x)
            xh_ptr = 0
            if xh:
                rows = n_slots if per_expert else T
                xh_ptr = ctx.alloc(quant_ops.x_halves_bytes(rows, n_in))
                quant_ops.x_halves(core, xp, xh_ptr, rows, n_in)
            outs = []
            for wptr, upp in ((wp, 0), (up, 0), (wp, up)):
                yp = ctx.alloc(4 * n_slots * n_out)
                quant_ops.moe_matmul_grouped(kern, core, wptr, TYPES[name], xp, ip, yp, T, k, n_in,
                                             n_out, E, order, tiles, n_tiles,
                                             x_per_expert=per_expert, up_ptr=upp, xh_ptr=xh_ptr)
                outs.append(download(ctx, yp, n_slots * n_out).reshape(n_slots, n_out))
            g, u, y = outs
            for out in (g, u, y):
                assert np.isnan(out[~valid]).all() and not np.isnan(out[valid]).any()
            xr = x.reshape(n_slots, n_in) if per_expert else np.repeat(x, k, axis=0)
            for e in range(E):
                sel = np.flatnonzero(valid & (ids.reshape(-1) == e))
                if sel.size:
                    check_matmul(g[sel], wf[e], xr[sel], f"{name} grouped T={T} e={e} "
                                 f"per_expert={per_expert}")
                    check_matmul(u[sel], wf_u[e], xr[sel], f"{name} grouped up T={T} e={e}")
            want = _silu_mul(g[valid], u[valid])
            np.testing.assert_allclose(y[valid], want, rtol=4e-6,
                                       atol=1e-6 * (np.abs(want).max() + 1),
                                       err_msg=f"{name} grouped swiglu T={T} per_expert={per_expert}")
        counts = np.bincount(ids.reshape(-1)[valid], minlength=E)
        want_tiles = sum((c + 63) // 64 for c in counts)
        assert int(download(ctx, n_tiles, 1, np.int32)[0]) == want_tiles


# ----------------------------------------------------------------------------------------------
# large matrices: results checked on sampled rows; bandwidth printed, not asserted


def check_sampled_rows(ctx, yp, raw, name, x, n_out, rng, what):
    """The [T, n_out] result at yp against float64 NumPy on a sample of output rows: the first,
    the last (the grid's edge) and 62 random ones; dequantizing all of a 150k-row matrix on the
    host would cost more than the whole GPU test."""
    rows = np.unique(np.concatenate([[0, n_out - 1], rng.integers(0, n_out, 62)]))
    y = download(ctx, yp, x.shape[0] * n_out).reshape(x.shape[0], n_out)[:, rows]
    wf = dequantize(np.ascontiguousarray(raw.reshape(n_out, -1)[rows]),
                    GGMLQuantizationType[name]).reshape(len(rows), -1)
    check_matmul(y, wf, x, f"{what} (rows {rows[0]}..{rows[-1]}, {len(rows)} sampled)")


def large_weights(rng, name, n_in, n_out):
    """Raw bytes [n_out, row_bytes] of a large random matrix: finite values for float types,
    random blocks with finite f16 scales for quantized ones (as random_weights, without the
    full dequantized copy)."""
    if name in FLOAT_TYPES:
        w = rng.standard_normal((n_out, n_in), dtype=np.float32)
        if name == "F16":
            w = w.astype(np.float16)
        elif name == "BF16":
            w = (w.view(np.uint32) >> 16).astype(np.uint16)
        return w.view(np.uint8)
    bs, ts = qinfo(name)
    blocks = rng.integers(0, 256, size=(n_out * (n_in // bs), ts), dtype=np.uint8)
    set_scales(rng, blocks, name, 8, 14)
    return blocks.reshape(n_out, -1)


def test_large_matrices_and_bandwidth_report(qk, rng):
    from reflex_core.cuda import driver, memory

    ctx, _ = qk
    lines = []
    shapes = [(1024, 3072), (4096, 12288), (1024, 151936)]  # (n_in, n_out)
    for name in ("Q8_0", "Q4_K", "Q5_K", "Q6_K", "Q4_0", "F16", "BF16", "F32", "Q3_K", "Q2_K",
                 "IQ4_XS", "IQ4_NL", "IQ3_XXS", "IQ3_S", "IQ2_XXS", "IQ2_S", "IQ1_S", "MXFP4"):
        bs, ts = qinfo(name)
        for n_in, n_out in shapes:
            nbytes = n_in // bs * ts * n_out
            if nbytes > 1.5e9:
                continue
            raw = large_weights(rng, name, n_in, n_out)
            wbase, wp = upload(ctx, raw)
            x = rng.standard_normal((8, n_in)).astype(np.float32)
            _, xp = upload(ctx, x)
            yp = ctx.alloc(4 * 8 * n_out)
            for T in (1, 8):
                matmul(ctx, wp, TYPES[name], xp, yp, T, n_in, n_out)
                reps = 20
                e0, e1 = memory.Event(), memory.Event()
                e0.record()
                for _ in range(reps):
                    matmul(ctx, wp, TYPES[name], xp, yp, T, n_in, n_out)
                e1.record()
                ms = memory.elapsed_ms(e0, e1) / reps
                check_sampled_rows(ctx, yp, raw, name, x[:T], n_out, rng,
                                   f"{name} {n_in}x{n_out} T={T}")
                lines.append(f"{name:5s} n_in={n_in:5d} n_out={n_out:6d} T={T}: {ms * 1e3:8.1f} us "
                             f"{nbytes / ms / 1e6:7.0f} GB/s")
            ctx.free(wbase)
    # prefill: the tiled kernel
    for name in ("Q8_0", "Q4_K", "Q6_K", "Q3_K", "IQ4_XS", "IQ3_XXS", "IQ2_XXS"):
        n_in, n_out = 4096, 4096
        raw = large_weights(rng, name, n_in, n_out)
        _, wp = upload(ctx, raw)
        for T in (20, 300):
            x = rng.standard_normal((T, n_in)).astype(np.float32)
            _, xp = upload(ctx, x)
            yp = ctx.alloc(4 * T * n_out)
            matmul(ctx, wp, TYPES[name], xp, yp, T, n_in, n_out)
            driver.synchronize()
            e0, e1 = memory.Event(), memory.Event()
            e0.record()
            for _ in range(5):
                matmul(ctx, wp, TYPES[name], xp, yp, T, n_in, n_out)
            e1.record()
            ms = memory.elapsed_ms(e0, e1) / 5
            check_sampled_rows(ctx, yp, raw, name, x, n_out, rng, f"{name} tiled T={T}")
            lines.append(f"{name:5s} tiled 4096x4096 T={T}: {ms * 1e3:8.1f} us "
                         f"{2 * T * n_in * n_out / ms / 1e9:7.2f} TFLOP/s")
            if T == 20:  # the alternative for short prompts: GEMV passes of <= 8 tokens
                ctx.htod(yp, bytes(4 * T * n_out))  # so a pass that wrote nothing shows
                e0, e1 = memory.Event(), memory.Event()
                e0.record()
                for _ in range(5):
                    for t0 in range(0, T, 8):
                        matmul(ctx, wp, TYPES[name], xp + 4 * t0 * n_in,
                                         yp + 4 * t0 * n_out, min(8, T - t0), n_in, n_out)
                e1.record()
                ms = memory.elapsed_ms(e0, e1) / 5
                check_sampled_rows(ctx, yp, raw, name, x, n_out, rng, f"{name} gemv passes T={T}")
                lines.append(f"{name:5s} gemv passes 4096x4096 T={T}: {ms * 1e3:8.1f} us")
    print("\nquant GEMV/tiled report\n" + "\n".join(lines))
