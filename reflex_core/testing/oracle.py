"""llama.cpp as the oracle: logits of a GGUF for a token sequence, via llama-cpp-python's C API.

    from reflex_core.testing.oracle import llama_logits, model_logits
    ref = llama_logits(path, tokens, n_prompt=8, kv_type="f32")     # [len(tokens), V]
    got = model_logits(model, tokens, n_prompt=8)                   # same batching, Reflex

Both process ``tokens[:n_prompt]`` as ONE batch (one ubatch, one graph), then the remaining
tokens one at a time through the KV cache, and return the logits of every position as a float32
NumPy array ``[len(tokens), V]``. Works for files whose tokenizer model is ``none`` (llama.cpp
then uses ``{arch}.vocab_size`` dummy tokens); ids are fed directly, never text.

Also here: ``check_logits`` (the oracle tests' error bound and top-1 rule), ``load_model`` /
``reflex_logits`` (a file's model through the plugin registry), ``record_routing`` /
``first_routing_difference`` (which experts a MoE run selected, to tell a near-tie routing flip
from an error) and ``llama_cpu_numerics_ops`` (NumpyOps with llama.cpp's CPU activation rounding).

llama.cpp is quiet here: its log callback is replaced by a no-op and anything it still writes to
stderr while loading is captured (and included in the error message if loading fails).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

KV_TYPES = {"f32": 0, "f16": 1}  # GGML_TYPE_F32, GGML_TYPE_F16

_STATE: dict[str, Any] = {}


class OracleUnavailable(RuntimeError):
    """llama-cpp-python is not installed (the oracle tests need it; they must not skip)."""


def import_llama_cpp():
    """``llama_cpp`` (the low-level ctypes module), initialised once and silenced."""
    if "lib" in _STATE:
        return _STATE["lib"]
    try:
        import llama_cpp  # noqa: F401
        from llama_cpp import llama_cpp as L
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise OracleUnavailable(
            "llama-cpp-python is not importable; the oracle tests need it: pip install "
            "llama-cpp-python==0.3.36 (CPU build from the sdist)") from e

    @L.llama_log_callback
    def _quiet(level, text, user_data):  # noqa: ARG001 - C callback signature
        return None

    _STATE["log_cb"] = _quiet  # keep the callback alive for the life of the process
    L.llama_log_set(_quiet, ctypes.c_void_p())
    L.llama_backend_init()
    _STATE["lib"] = L
    return L


@contextlib.contextmanager
def _captured_stderr() -> Iterator[list[str]]:
    """Redirect fd 2 to a temp file for the block; the captured text lands in the yielded list."""
    out: list[str] = []
    try:
        fd = os.dup(2)
    except OSError:  # pragma: no cover
        yield out
        return
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        try:
            os.dup2(tmp.fileno(), 2)
            yield out
        finally:
            os.dup2(fd, 2)
            os.close(fd)
            tmp.seek(0)
            out.append(tmp.read().decode("utf-8", errors="replace"))


def llama_logits(path: str | os.PathLike, tokens: Sequence[int], n_prompt: int | None = None,
                 kv_type: str = "f32", n_threads: int = 2, flash_attn: bool = False,
                 repack: bool = False, lora: Sequence[tuple[str, float]] = ()) -> np.ndarray:
    """llama.cpp's logits for every position of ``tokens`` (float32 ``[len(tokens), V]``).

    ``tokens[:n_prompt]`` (default: all but the last 4, at least 1) go in one batch, the rest one
    token per ``llama_decode``. ``kv_type`` is "f32" or "f16" (llama.cpp's default). ``flash_attn``
    and ``repack`` (CPU weight repacking into interleaved layouts) are off by default: the plain
    kernels are the reference. ``lora``: (adapter path, scale) pairs llama.cpp applies at run
    time (``llama_adapter_lora_init`` + ``llama_set_adapters_lora``; freed with the model).
    """
    L = import_llama_cpp()
    tokens = [int(t) for t in tokens]
    n = len(tokens)
    if n == 0:
        raise ValueError("no tokens")
    if n_prompt is None:
        n_prompt = max(1, n - 4)
    if not 0 < n_prompt <= n:
        raise ValueError(f"n_prompt={n_prompt} must be in [1, {n}]")
    if kv_type not in KV_TYPES:
        raise ValueError(f"kv_type must be one of {sorted(KV_TYPES)}")
    path = str(Path(path))

    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    mp.load_mode = L.LLAMA_LOAD_MODE_NONE  # read into memory: no mmap of a file tests may delete
    mp.use_extra_bufts = bool(repack)
    with _captured_stderr() as err:
        model = L.llama_model_load_from_file(path.encode(), mp)
    if not model:
        raise RuntimeError(f"llama.cpp could not load {path}: {''.join(err).strip()[-2000:]}")
    ctx = None
    batch = None
    try:
        cp = L.llama_context_default_params()
        cp.n_ctx = max(n, 8)
        cp.n_batch = max(n_prompt, 1)
        cp.n_ubatch = max(n_prompt, 1)
        cp.n_seq_max = 1
        cp.n_threads = n_threads
        cp.n_threads_batch = n_threads
        cp.type_k = KV_TYPES[kv_type]
        cp.type_v = KV_TYPES[kv_type]
        cp.flash_attn_type = (L.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn
                              else L.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        cp.no_perf = True
        with _captured_stderr() as err:
            ctx = L.llama_init_from_model(model, cp)
        if not ctx:
            raise RuntimeError(f"llama.cpp could not create a context for {path}: "
                               f"{''.join(err).strip()[-2000:]}")
        if lora:
            handles = []
            for lpath, _ in lora:
                with _captured_stderr() as err:
                    h = L.llama_adapter_lora_init(model, str(lpath).encode())
                if not h:
                    raise RuntimeError(f"llama.cpp could not load the adapter {lpath}: "
                                       f"{''.join(err).strip()[-2000:]}")
                handles.append(h)
            arr = (L.llama_adapter_lora_p_ctypes * len(handles))(*handles)
            scales = (ctypes.c_float * len(handles))(*(float(sc) for _, sc in lora))
            if L.llama_set_adapters_lora(ctx, arr, len(handles), scales) != 0:
                raise RuntimeError(f"llama_set_adapters_lora failed for {path}")
        n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
        if n_vocab <= 0:
            raise RuntimeError(f"llama.cpp reports {n_vocab} tokens for {path}")
        out = np.empty((n, n_vocab), np.float32)
        batch = L.llama_batch_init(max(n_prompt, 1), 0, 1)

        def decode(start: int, stop: int) -> None:
            batch.n_tokens = stop - start
            for j, pos in enumerate(range(start, stop)):
                batch.token[j] = tokens[pos]
                batch.pos[j] = pos
                batch.n_seq_id[j] = 1
                batch.seq_id[j][0] = 0
                batch.logits[j] = 1
            rc = L.llama_decode(ctx, batch)
            if rc != 0:
                raise RuntimeError(f"llama_decode failed with status {rc} at tokens "
                                   f"[{start}, {stop})")
            for j in range(stop - start):
                ptr = L.llama_get_logits_ith(ctx, j)
                if not ptr:
                    raise RuntimeError(f"llama.cpp returned no logits for batch row {j}")
                out[start + j] = np.ctypeslib.as_array(ptr, shape=(n_vocab,))

        decode(0, n_prompt)
        for pos in range(n_prompt, n):
            decode(pos, pos + 1)
        return out
    finally:
        if batch is not None:
            L.llama_batch_free(batch)
        if ctx:
            L.llama_free(ctx)
        L.llama_model_free(model)


def model_logits(model: Any, tokens: Sequence[int], n_prompt: int | None = None,
                 n_cells: int | None = None) -> np.ndarray:
    """A Reflex model's logits with the same batching as :func:`llama_logits`."""
    tokens = [int(t) for t in tokens]
    n = len(tokens)
    if n_prompt is None:
        n_prompt = max(1, n - 4)
    ops = model.ops
    state = model.new_state(n_cells or n)
    rows = []
    batch = state.append(tokens[:n_prompt])
    rows.append(ops.to_numpy(model.forward(batch, state, list(range(n_prompt)))))
    for pos in range(n_prompt, n):
        rows.append(ops.to_numpy(model.forward(state.append([tokens[pos]]), state, [0])))
    return np.concatenate(rows, axis=0).astype(np.float32)


def compare(ref: np.ndarray, got: np.ndarray) -> dict[str, float]:
    """Error figures of ``got`` against ``ref`` (both ``[n, V]``).

    rel: max|got - ref| / max|ref| over all positions; rel_pos: the worst per-position
    max|diff| / max|ref row|; margin_min: the smallest top-1/top-2 gap of ``ref``.
    """
    ref = np.asarray(ref, np.float64)
    got = np.asarray(got, np.float64)
    if ref.shape != got.shape:
        raise ValueError(f"shapes differ: {ref.shape} vs {got.shape}")
    diff = np.abs(got - ref)
    top2 = np.sort(ref, axis=-1)[:, -2:]
    return {
        "rel": float(diff.max() / np.abs(ref).max()),
        "rel_pos": float((diff.max(axis=-1) / np.abs(ref).max(axis=-1)).max()),
        "max_abs": float(diff.max()),
        "margin_min": float((top2[:, 1] - top2[:, 0]).min()),
    }


def check_logits(ref: np.ndarray, got: np.ndarray, bound: float, what: str) -> dict[str, float]:
    """Assert ``got`` matches the oracle's ``ref`` (both ``[n, V]``) the way the oracle tests do;
    returns :func:`compare`'s figures.

    * ``rel = max|got - ref| / max|ref|`` over all positions and the whole vocabulary <= bound;
    * top-1: wherever the reference's gap between its first and second logit exceeds
      ``bound · max|ref row|``, the two argmaxes agree.
    """
    c = compare(ref, got)
    assert c["rel"] <= bound, f"{what}: max|diff|/max|ref| = {c['rel']:.3g} > {bound:.3g} ({c})"
    row_max = np.abs(ref).max(axis=-1)
    top2 = np.sort(ref, axis=-1)[:, -2:]
    margin = top2[:, 1] - top2[:, 0]
    decisive = margin > bound * row_max
    same = ref.argmax(-1) == got.argmax(-1)
    bad = np.flatnonzero(decisive & ~same)
    assert bad.size == 0, (f"{what}: top-1 differs at positions {bad.tolist()} although the "
                           f"reference margin there is {margin[bad].tolist()}")
    return c


def llama_candidate_scores(path: str | os.PathLike, prompt: Sequence[int],
                           cands: Sequence[Sequence[int]]) -> list[float]:
    """System1's scores as llama.cpp gives them: each candidate run after the prompt as its own
    sequence (F32 KV), the sum over its tokens of the full-vocabulary log-softmax (float64) at
    the preceding position."""
    out = []
    for c in cands:
        seq = list(prompt) + list(c)
        logits = llama_logits(path, seq, n_prompt=len(seq), kv_type="f32")
        total = 0.0
        for j, tok in enumerate(c):
            row = logits[len(prompt) - 1 + j].astype(np.float64)
            m = row.max()
            total += float(row[tok] - m - np.log(np.exp(row - m).sum()))
        out.append(total)
    return out


def check_system1(path: str | os.PathLike, prompt: Sequence[int],
                  cands: Sequence[Sequence[int]]) -> list[int]:
    """Assert that Reflex's system1 scores (reference backend) of ``cands`` after ``prompt``
    are llama.cpp's (:func:`llama_candidate_scores`) within 1e-4 a token; returns the token
    count of each forward pass the scoring ran (one tree pass, or the prompt then the forks)."""
    from reflex_core import system1

    model = load_model(path)
    calls = count_forwards(model)
    ours = system1.score(model, model.ops, prompt, cands)
    for c, score, ref in zip(cands, ours, llama_candidate_scores(path, prompt, cands)):
        assert abs(score - ref) <= 1e-4 * len(c), (c, score, ref)
    return calls


def count_forwards(model: Any) -> list[int]:
    """From now on, ``model.forward`` appends each batch's token count to the returned list
    (then runs as before): how many forward passes a caller ran, and how large."""
    calls: list[int] = []
    real = model.forward

    def counting(batch, state, rows):
        calls.append(batch.n_tokens)
        return real(batch, state, rows)

    model.forward = counting
    return calls


@functools.lru_cache(maxsize=None)
def _llama_vocab(path: str) -> tuple[Any, Any]:
    """(model, vocab) of llama.cpp's vocab-only load of ``path``, kept for the process."""
    L = import_llama_cpp()
    mp = L.llama_model_default_params()
    mp.vocab_only = True
    model = L.llama_model_load_from_file(path.encode(), mp)
    if not model:
        raise RuntimeError(f"llama.cpp could not load {path}")
    return model, L.llama_model_get_vocab(model)


def llama_tokenize(path: str | os.PathLike, text: str, add_special: bool = False,
                   parse_special: bool = False) -> list[int]:
    """llama.cpp's ``llama_tokenize`` of ``text`` with the vocabulary of ``path``."""
    L = import_llama_cpp()
    _, vocab = _llama_vocab(str(Path(path)))
    data = text.encode("utf-8")
    cap = len(data) + 8
    buf = (L.llama_token * cap)()
    n = L.llama_tokenize(vocab, data, len(data), buf, cap, add_special, parse_special)
    if n < 0:
        raise RuntimeError(f"llama_tokenize needs {-n} slots for {text!r}")
    return list(buf[:n])


def llama_bos(path: str | os.PathLike) -> int | None:
    """llama.cpp's BOS id of the vocabulary of ``path`` (None: it has none)."""
    L = import_llama_cpp()
    _, vocab = _llama_vocab(str(Path(path)))
    bos = int(L.llama_vocab_bos(vocab))
    return None if bos < 0 else bos


def random_tokens(n_vocab: int, n: int, seed: int) -> list[int]:
    """``n`` token ids drawn uniformly from ``[0, n_vocab)`` (generator seeded ``1000 + seed``)."""
    rng = np.random.default_rng(1000 + seed)
    return rng.integers(0, n_vocab, n).tolist()


def load_model(path: str | os.PathLike, ops: Any = None) -> Any:
    """The model of a GGUF on ``ops`` (default: a fresh NumpyOps), built by the plugin the
    registry resolves for the file's ``general.architecture`` (as the engine does)."""
    from ..backends.numpy_backend import NumpyOps
    from ..gguf import open_gguf
    from ..registry import get_host

    g = open_gguf(path)
    ops = NumpyOps() if ops is None else ops
    ops.attach(g)
    cls = get_host().resolve(g.get("general.architecture")).load_model_class()
    return cls.load(g, ops)


def reflex_logits(path: str | os.PathLike, tokens: Sequence[int], n_prompt: int | None = None,
                  ops: Any = None) -> np.ndarray:
    """:func:`model_logits` of the file's model on ``ops`` (default NumpyOps)."""
    return model_logits(load_model(path, ops), tokens, n_prompt=n_prompt)


# --------------------------------------------------------------------------------------------
# MoE routing: which experts each token took, to tell a routing flip from an error


class Route:
    """One ``moe_route`` call: the selected experts of each token (sorted: the order within the
    selection does not matter) and the selection margin, the gap between the k-th and the
    (k+1)-th largest router logit (every gating function is monotone in the logit)."""

    __slots__ = ("ids", "margin", "logits")

    def __init__(self, ids: np.ndarray, margin: np.ndarray, logits: np.ndarray):
        self.ids, self.margin, self.logits = ids, margin, logits


def record_routing(ops: Any) -> list[Route]:
    """Wrap ``ops.moe_route`` (NumPy backends) so that every call appends a :class:`Route` to the
    returned list, in call order (batch by batch, layer by layer)."""
    log: list[Route] = []
    inner = ops.moe_route

    def moe_route(logits, k, *args, **kw):
        ids, weights = inner(logits, k, *args, **kw)
        z = np.asarray(logits, np.float64)
        zs = -np.sort(-z, axis=-1)
        margin = zs[:, k - 1] - zs[:, k] if k < z.shape[-1] else np.full(z.shape[0], np.inf)
        log.append(Route(np.sort(np.asarray(ids), axis=-1), margin, z))
        return ids, weights

    ops.moe_route = moe_route
    return log


def first_routing_difference(a: Sequence[Route], b: Sequence[Route]
                             ) -> tuple[int, list[int]] | None:
    """The first call (index into both logs) where two runs of the same tokens selected different
    experts, and the tokens that differ there; None when every selection agrees. Only that first
    call compares like with like: its inputs are still unaffected by a different selection."""
    if len(a) != len(b):
        raise ValueError(f"routing logs of {len(a)} and {len(b)} calls")
    for c, (ra, rb) in enumerate(zip(a, b)):
        if ra.ids.shape != rb.ids.shape:
            raise ValueError(f"moe_route call {c}: shapes {ra.ids.shape} and {rb.ids.shape}")
        rows = np.flatnonzero((ra.ids != rb.ids).any(axis=-1))
        if rows.size:
            return c, rows.tolist()
    return None


# --------------------------------------------------------------------------------------------
# llama.cpp's CPU rounding of activations, on top of the NumPy reference


def round_q8_0(x: np.ndarray) -> np.ndarray:
    """Rows of ``x`` as llama.cpp's CPU ``quantize_row_q8_0`` leaves them, dequantized:
    per 32 values ``d = amax/127`` (stored as F16), ``q = rint(x·127/amax)``; value = f16(d)·q."""
    T, n = x.shape
    b = x.reshape(T, n // 32, 32).astype(np.float32)
    amax = np.abs(b).max(-1, keepdims=True)
    nz = amax != 0
    d = (amax / np.float32(127)).astype(np.float16).astype(np.float32)
    inv = np.where(nz, np.float32(127) / np.where(nz, amax, 1), 0).astype(np.float32)
    return (d * np.rint(b * inv)).reshape(T, n).astype(np.float32)


def round_q8_K(x: np.ndarray) -> np.ndarray:
    """Rows of ``x`` as ``quantize_row_q8_K_ref`` leaves them, dequantized: per 256 values
    ``iscale = -127/max`` (max = the value of largest magnitude, with its sign),
    ``q = min(127, rint(iscale·x))``, value = (1/iscale)·q (F32 scale)."""
    T, n = x.shape
    b = x.reshape(T, n // 256, 256).astype(np.float32)
    mx = np.take_along_axis(b, np.abs(b).argmax(-1)[..., None], -1)
    nz = mx != 0
    iscale = (np.float32(-127) / np.where(nz, mx, 1)).astype(np.float32)
    q = np.minimum(127, np.rint(iscale * b))
    d = (np.float32(1) / iscale).astype(np.float32)
    return np.where(nz, d * q, 0).reshape(T, n).astype(np.float32)


def round_f16(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def round_bf16(x: np.ndarray) -> np.ndarray:
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    u = (u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return u.view(np.float32)


# GGML weight type -> how llama.cpp's CPU backend rounds the activation it multiplies
# (ggml-cpu type_traits_cpu[type].vec_dot_type: F16 -> F16, BF16 -> BF16, Q4_0/Q5_0/Q8_0 -> Q8_0,
# K-quants -> Q8_K). Q4_1/Q5_1 (Q8_1) are not emulated.
ACTIVATION_ROUNDING = {1: round_f16, 30: round_bf16, 2: round_q8_0, 6: round_q8_0, 8: round_q8_0,
                       10: round_q8_K, 11: round_q8_K, 12: round_q8_K, 13: round_q8_K,
                       14: round_q8_K}


def llama_cpu_numerics_ops(kv_type: str = "f32", **options: Any):
    """A NumpyOps that rounds like llama.cpp's CPU backend (plain kernels, no flash attention):
    the activation of every matmul as the weight's ``vec_dot_type``, and with an F16 KV cache,
    K/V stored as F16, q rounded to F16 for q·k and the attention probabilities to F16 for the
    V sum. Tests use it to show that the reference differs from llama.cpp by exactly these
    roundings (agreement ~1e-7 where the plain reference differs by 1e-3..1e-2)."""
    from ..backends.numpy_backend import NumpyOps

    class LlamaCpuNumerics(NumpyOps):
        name = "cpu-llama-numerics"

        def matmul(self, x, w):
            f = ACTIVATION_ROUNDING.get(w.ggml_type)
            if f is not None:
                x = np.asarray(x, np.float32)
                x = f(x.reshape(-1, x.shape[-1])).reshape(x.shape)
            return super().matmul(x, w)

        def moe_matmul(self, x, w, ids):
            # ggml's mul_mat_id rounds each src1 row (a token's input, or one token-expert row of
            # the down projection's input) to the expert tensor's vec_dot_type, as mul_mat does
            f = ACTIVATION_ROUNDING.get(w.ggml_type)
            if f is not None:
                x = np.asarray(x, np.float32)
                x = f(x.reshape(-1, x.shape[-1])).reshape(x.shape)
            return super().moe_matmul(x, w, ids)

        def kv_write(self, k_cache, v_cache, k, v, pb):
            if kv_type == "f16":
                k, v = round_f16(k), round_f16(v)
            super().kv_write(k_cache, v_cache, k, v, pb)

        def attention(self, q, k_cache, v_cache, pb, scale):
            if kv_type != "f16":
                return super().attention(q, k_cache, v_cache, pb, scale)
            q = round_f16(q)
            T, H, dk = q.shape
            Hkv = k_cache.shape[1]
            G = H // Hkv
            K = k_cache[:pb.n_kv]
            V = v_cache[:pb.n_kv]
            qh = q.reshape(T, Hkv, G, dk).transpose(1, 2, 0, 3).reshape(Hkv, G * T, dk)
            s = np.matmul(qh, K.transpose(1, 2, 0)).astype(np.float64) * scale
            s = np.where(np.tile(pb.mask, (G, 1))[None], s, -np.inf)
            e = np.exp(s - s.max(-1, keepdims=True))
            a = round_f16(e / e.sum(-1, keepdims=True))
            o = np.matmul(a, V.transpose(1, 0, 2))
            return np.ascontiguousarray(
                o.reshape(Hkv, G, T, -1).transpose(2, 0, 1, 3).reshape(T, -1), np.float32)

    return LlamaCpuNumerics(**options)
