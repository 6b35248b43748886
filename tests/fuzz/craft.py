"""Tiny GGUF files built field by field (stdlib only), for the metadata tests and the fuzz harness.

gguf-py's GGUFWriter writes what a converter writes; here any key may hold any value type (an
id as a string, ``pre`` as an array, ``token_type`` as a scalar), which is what the tests of
malformed metadata and the fuzzer's structure-aware mutator need. ``GGUF.to_bytes()`` writes
version 3, little-endian; ``GGUF.from_bytes()`` reads one back (None where it cannot: the
mutator then falls back to byte mutations).

    g = tiny_model("qwen3", tokenizer=True)
    g.set("tokenizer.ggml.eos_token_id", "7", STRING)
    path.write_bytes(g.to_bytes())

The tiny models are shaped like reflex's qwen3 / qwen3moe (D=8, one block, 4-wide heads, a
262-token byte-level vocabulary) so every layer of the loader runs on them in ~1 ms; their
tensors hold small deterministic numbers.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

(UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64,
 FLOAT64) = range(13)
_SCALAR = {UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i",
           FLOAT32: "<f", BOOL: "<B", UINT64: "<Q", INT64: "<q", FLOAT64: "<d"}
F32, F16 = 0, 1  # GGML types used here
ALIGN = 32


@dataclass
class KV:
    key: str
    vtype: int
    value: Any  # scalar, str, or a list (ARRAY)
    elem: int | None = None  # the element type of an ARRAY


@dataclass
class Tensor:
    name: str
    ne: tuple
    ggml_type: int
    data: bytes
    offset: int | None = None  # relative offset as written; None: laid out in order


@dataclass
class GGUF:
    kvs: list = field(default_factory=list)
    tensors: list = field(default_factory=list)
    version: int = 3
    blob: bytes | None = None  # the data region as read (from_bytes): tensors keep their offsets

    # --- editing ------------------------------------------------------------------------
    def find(self, key: str) -> KV | None:
        return next((kv for kv in self.kvs if kv.key == key), None)

    def get(self, key: str) -> Any:
        kv = self.find(key)
        return None if kv is None else kv.value

    def set(self, key: str, value: Any, vtype: int, elem: int | None = None) -> "GGUF":
        """Set (or add) ``key``; an ARRAY needs ``elem``."""
        kv = self.find(key)
        if kv is None:
            self.kvs.append(KV(key, vtype, value, elem))
        else:
            kv.vtype, kv.value, kv.elem = vtype, value, elem
        return self

    def drop(self, key: str) -> "GGUF":
        self.kvs = [kv for kv in self.kvs if kv.key != key]
        return self

    def tensor(self, name: str) -> Tensor | None:
        return next((t for t in self.tensors if t.name == name), None)

    def drop_tensor(self, name: str) -> "GGUF":
        """Remove tensor ``name`` (it must be there) from the directory; the data region is
        kept as read, so the other tensors keep their offsets."""
        if self.tensor(name) is None:
            raise KeyError(name)
        self.tensors = [t for t in self.tensors if t.name != name]
        return self

    # --- bytes ----------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        out = bytearray(struct.pack("<4sIQQ", b"GGUF", self.version, len(self.tensors),
                                    len(self.kvs)))
        for kv in self.kvs:
            out += _str(kv.key) + struct.pack("<I", kv.vtype)
            if kv.vtype == ARRAY:
                out += struct.pack("<IQ", kv.elem, len(kv.value))
                for v in kv.value:
                    out += _value(kv.elem, v)
            else:
                out += _value(kv.vtype, kv.value)
        align = self.get("general.alignment") or ALIGN
        if not isinstance(align, int) or not 0 < align <= 65536 or align & (align - 1):
            align = ALIGN  # (a mutated alignment of 2**63 would pad the file to match)
        rel, offsets = 0, []
        for t in self.tensors:
            offsets.append(rel if t.offset is None else t.offset)
            if self.blob is None:
                rel += len(t.data) + (-len(t.data) % align)
        for t, off in zip(self.tensors, offsets):
            out += _str(t.name) + struct.pack(f"<I{len(t.ne)}QIQ", len(t.ne), *t.ne, t.ggml_type,
                                              off)
        out += b"\0" * (-len(out) % align)
        if self.blob is not None:
            return bytes(out) + self.blob
        for t in self.tensors:
            out += t.data + b"\0" * (-len(t.data) % align)
        return bytes(out)

    @classmethod
    def from_bytes(cls, data: bytes, max_items: int = 100_000) -> "GGUF | None":
        """The file ``data`` holds, or None when it does not parse (any malformation)."""
        try:
            return _read(data, max_items)
        except (struct.error, UnicodeDecodeError, ValueError, IndexError, KeyError):
            return None


def _str(s: str | bytes) -> bytes:
    b = s.encode("utf-8", "surrogatepass") if isinstance(s, str) else bytes(s)
    return struct.pack("<Q", len(b)) + b


def _value(vtype: int, v: Any) -> bytes:
    if vtype == STRING:
        return _str(v)
    return struct.pack(_SCALAR[vtype], v)


def _read(data: bytes, max_items: int) -> GGUF:
    magic, version, n_t, n_kv = struct.unpack_from("<4sIQQ", data, 0)
    if magic != b"GGUF" or n_t + n_kv > max_items:
        raise ValueError("not a small GGUF")
    pos = 24

    def rstr() -> str:
        nonlocal pos
        (n,) = struct.unpack_from("<Q", data, pos)
        if n > len(data):
            raise ValueError("string")
        s = data[pos + 8:pos + 8 + n].decode("utf-8")
        pos += 8 + n
        return s

    def rval(t: int) -> Any:
        nonlocal pos
        if t == STRING:
            return rstr()
        fmt = _SCALAR[t]
        (v,) = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return v

    g = GGUF(version=version)
    for _ in range(n_kv):
        key = rstr()
        (t,) = struct.unpack_from("<I", data, pos)
        pos += 4
        if t == ARRAY:
            elem, n = struct.unpack_from("<IQ", data, pos)
            pos += 12
            if n > max_items or elem == ARRAY:
                raise ValueError("array")
            g.kvs.append(KV(key, t, [rval(elem) for _ in range(n)], elem))
        else:
            g.kvs.append(KV(key, t, rval(t)))
    align = g.get("general.alignment") or ALIGN
    if not isinstance(align, int) or align <= 0 or align & (align - 1):
        raise ValueError("alignment")
    infos = []
    for _ in range(n_t):
        name = rstr()
        (nd,) = struct.unpack_from("<I", data, pos)
        if nd > 4:
            raise ValueError("dims")
        ne = struct.unpack_from(f"<{nd}Q", data, pos + 4)
        t, off = struct.unpack_from("<IQ", data, pos + 4 + 8 * nd)
        pos += 4 + 8 * nd + 12
        infos.append((name, ne, t, off))
    g.tensors = [Tensor(name, tuple(ne), t, b"", off) for name, ne, t, off in infos]
    g.blob = bytes(data[pos + (-pos % align):])
    return g


# ------------------------------------------------------------------------------------------
# The tiny models


def rewrite(data: bytes, path: Any, edit: Any) -> str:
    """Parse the GGUF ``data`` (a written model file), apply ``edit(gguf)``, write the result to
    ``path``; returns the path as a string."""
    g = GGUF.from_bytes(data, max_items=1 << 20)
    if g is None:
        raise ValueError("not a GGUF this module can read")
    edit(g)
    with open(path, "wb") as f:
        f.write(g.to_bytes())
    return str(path)


def byte_vocab() -> list[str]:
    """GPT-2's 256 byte-level characters, in byte order (Qwen's ids 0..255)."""
    from reflex_core.tokenizer.vocab import BYTE_OF_CHAR

    return [c for c, _ in sorted(BYTE_OF_CHAR.items(), key=lambda kv: kv[1])]


# id 256 = " t", 257 = " tt", then the added tokens (Qwen's layout: vocab, merges, added)
TOKENS_EXTRA = ["\u0120t", "\u0120tt", "<think>", "<|endoftext|>", "<|im_end|>", "[PAD261]"]
TYPES_EXTRA = [1, 1, 4, 3, 3, 5]
MERGES = ["\u0120 t", "\u0120t t"]
EOS_ID = 260  # <|im_end|>
N_VOCAB = 256 + len(TOKENS_EXTRA)


def _f32(n: int, seed: int) -> bytes:
    # small deterministic values (a cheap LCG): no NaNs, no dependence on numpy
    vals, x = [], seed * 2654435761 % 2 ** 32 or 1
    for _ in range(n):
        x = (1103515245 * x + 12345) % 2 ** 31
        vals.append((x / 2 ** 31 - 0.5) * 0.5)
    return struct.pack(f"<{n}f", *vals)


def tiny_model(arch: str = "qwen3", tokenizer: bool = True) -> GGUF:
    """A complete tiny ``qwen3`` or ``qwen3moe`` model (1 block, D=8, H=2, H_kv=1, d_h=4,
    F=8; moe: E=2, k=1, F_e=8); with ``tokenizer`` the 262-token byte-level vocabulary above
    (else ``tokenizer.ggml.model = none`` and 64 tokens)."""
    D, H, Hkv, dh, F, E, Fe = 8, 2, 1, 4, 8, 2, 8
    V = N_VOCAB if tokenizer else 64
    g = GGUF()
    a = arch
    g.set("general.architecture", a, STRING)
    g.set("general.name", "reflex-fuzz-tiny", STRING)
    for k, v in (("block_count", 1), ("context_length", 64), ("embedding_length", D),
                 ("feed_forward_length", F), ("attention.head_count", H),
                 ("attention.head_count_kv", Hkv), ("attention.key_length", dh),
                 ("attention.value_length", dh)):
        g.set(f"{a}.{k}", v, UINT32)
    g.set(f"{a}.rope.freq_base", 1e6, FLOAT32)
    g.set(f"{a}.attention.layer_norm_rms_epsilon", 1e-6, FLOAT32)
    if arch == "qwen3moe":
        g.set(f"{a}.expert_count", E, UINT32)
        g.set(f"{a}.expert_used_count", 1, UINT32)
        g.set(f"{a}.expert_feed_forward_length", Fe, UINT32)
    if tokenizer:
        g.set("tokenizer.ggml.model", "gpt2", STRING)
        g.set("tokenizer.ggml.pre", "qwen2", STRING)
        g.set("tokenizer.ggml.tokens", byte_vocab() + TOKENS_EXTRA, ARRAY, STRING)
        g.set("tokenizer.ggml.token_type", [1] * 256 + TYPES_EXTRA, ARRAY, INT32)
        g.set("tokenizer.ggml.merges", list(MERGES), ARRAY, STRING)
        g.set("tokenizer.ggml.eos_token_id", EOS_ID, UINT32)
        g.set("tokenizer.ggml.padding_token_id", 259, UINT32)
        g.set("tokenizer.ggml.bos_token_id", 259, UINT32)
        g.set("tokenizer.ggml.add_bos_token", False, BOOL)
    else:
        g.set("tokenizer.ggml.model", "none", STRING)
        g.set(f"{a}.vocab_size", V, UINT32)

    def t(name: str, *ne: int) -> None:
        n = 1
        for d in ne:
            n *= d
        g.tensors.append(Tensor(name, tuple(ne), F32, _f32(n, len(g.tensors) + 1)))

    t("token_embd.weight", D, V)
    t("output_norm.weight", D)
    p = "blk.0."
    t(p + "attn_norm.weight", D)
    t(p + "attn_q.weight", D, H * dh)
    t(p + "attn_k.weight", D, Hkv * dh)
    t(p + "attn_v.weight", D, Hkv * dh)
    t(p + "attn_output.weight", H * dh, D)
    t(p + "attn_q_norm.weight", dh)
    t(p + "attn_k_norm.weight", dh)
    t(p + "ffn_norm.weight", D)
    if arch == "qwen3moe":
        t(p + "ffn_gate_inp.weight", D, E)
        t(p + "ffn_gate_exps.weight", D, Fe, E)
        t(p + "ffn_up_exps.weight", D, Fe, E)
        t(p + "ffn_down_exps.weight", Fe, D, E)
    else:
        t(p + "ffn_gate.weight", D, F)
        t(p + "ffn_up.weight", D, F)
        t(p + "ffn_down.weight", F, D)
    return g


# ------------------------------------------------------------------------------------------
# Known-bad variants (issue 12's findings and more of their kinds): name -> (architecture,
# with a tokenizer, the key, its new value, its value type, the element type of an array).
# Each must be refused with a one-line ModelError naming the key. The findings first.

BAD = {
    "eos-id-string": ("qwen3", True, "tokenizer.ggml.eos_token_id", "260", STRING, None),
    "eos-id-inf": ("qwen3", True, "tokenizer.ggml.eos_token_id", float("inf"), FLOAT32, None),
    "eos-id-out-of-range": ("qwen3", True, "tokenizer.ggml.eos_token_id", 151645, UINT32, None),
    "pre-array": ("qwen3", True, "tokenizer.ggml.pre", ["qwen2"], ARRAY, STRING),
    "merges-ints": ("qwen3", True, "tokenizer.ggml.merges", [1, 2], ARRAY, INT32),
    "token-type-scalar": ("qwen3", True, "tokenizer.ggml.token_type", 1, INT32, None),
    "block-count-2g": ("qwen3", True, "qwen3.block_count", 2 ** 31 - 1, UINT32, None),
    "eos-id-nan64": ("qwen3", True, "tokenizer.ggml.eos_token_id", float("nan"), FLOAT64, None),
    "bos-id-negative": ("qwen3", True, "tokenizer.ggml.bos_token_id", -1, INT32, None),
    "model-array": ("qwen3", True, "tokenizer.ggml.model", ["gpt2"], ARRAY, STRING),
    "tokens-ints": ("qwen3", True, "tokenizer.ggml.tokens", [1, 2, 3], ARRAY, INT32),
    "token-type-floats": ("qwen3", True, "tokenizer.ggml.token_type", [1.0] * N_VOCAB, ARRAY,
                          FLOAT32),
    "add-bos-string": ("qwen3", True, "tokenizer.ggml.add_bos_token", "true", STRING, None),
    "architecture-array": ("qwen3", False, "general.architecture", ["qwen3"], ARRAY, STRING),
    "head-count-2g": ("qwen3", False, "qwen3.attention.head_count", 2 ** 31, UINT32, None),
    "head-count-bool": ("qwen3", False, "qwen3.attention.head_count", True, BOOL, None),
    "experts-4g": ("qwen3moe", False, "qwen3moe.expert_count", 2 ** 32 - 1, UINT32, None),
    "vocab-size-4g": ("qwen3", False, "qwen3.vocab_size", 2 ** 32 - 1, UINT32, None),
    "eps-nan": ("qwen3", False, "qwen3.attention.layer_norm_rms_epsilon", float("nan"), FLOAT32,
                None),
    "freq-base-zero": ("qwen3", False, "qwen3.rope.freq_base", 0.0, FLOAT32, None),
    "freq-base-f64-huge": ("qwen3", False, "qwen3.rope.freq_base", 1e300, FLOAT64, None),
    "rope-factor-inf": ("qwen3", False, "qwen3.rope.scaling.factor", float("inf"), FLOAT32, None),
    # a valid key whose value Reflex does not run (bidirectional attention): refused, not
    # run causally with other logits than llama.cpp's
    "attention-not-causal": ("qwen3", False, "qwen3.attention.causal", False, BOOL, None),
    # found by the fuzzer: "a b" with "a" and "b" in the vocabulary but not "ab" (tokenizers
    # panics on it)
    "merge-result-missing": ("qwen3", True, "tokenizer.ggml.merges", MERGES + ["a b"], ARRAY,
                             STRING),
}


def bad_model(name: str) -> GGUF:
    """The tiny model of ``BAD[name]`` with its key changed."""
    arch, tok, key, value, vtype, elem = BAD[name]
    return tiny_model(arch, tokenizer=tok).set(key, value, vtype, elem)


# Known-bad tensor directories: name -> (architecture, tensor, its new shape). The reader
# accepts them (the byte sizes follow the shapes); the weight binding must refuse them. The
# first and the last were found by the fuzzer.
BAD_TENSORS = {
    "tensor-no-dims": ("qwen3", "output_norm.weight", ()),
    "tensor-wrong-rows": ("qwen3", "blk.0.attn_k.weight", (8, 2)),
    "expert-tensor-4d": ("qwen3moe", "blk.0.ffn_up_exps.weight", (8, 8, 2, 1)),
}


def bad_tensor_model(name: str) -> GGUF:
    arch, tname, ne = BAD_TENSORS[name]
    g = tiny_model(arch, tokenizer=False)
    t = g.tensor(tname)
    n = 4
    for d in ne:
        n *= d
    t.ne, t.data = ne, t.data[:n]
    return g
