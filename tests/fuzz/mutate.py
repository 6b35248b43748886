"""A structure-aware mutation of GGUF inputs (the fuzzer's custom mutator).

Byte-level mutation of a GGUF mostly breaks its framing (lengths, counts), so the reader
refuses it before the metadata is ever interpreted. Half of the mutations here decode the input
(``craft.GGUF.from_bytes``), change one thing the way a careless converter or an attacker
would -- a value's type (an id as a string, ``pre`` as an array, ``token_type`` as a scalar), an
extreme number (2**31 - 1 blocks, inf, NaN), a key dropped or added, an array cut or grown, a
tensor's shape, type or offset -- and encode it again, so the input reaches the tokenizer, the
hyper-parameter readers and the weight binding. ``mutate(data, max_size, seed, byte_mutate)``
falls back to ``byte_mutate`` (libFuzzer's own mutator) for the other half and for inputs that
do not decode.
"""

from __future__ import annotations

import random
import struct
from typing import Callable

from .craft import (ARRAY, BOOL, FLOAT32, FLOAT64, GGUF, INT8, INT16, INT32, INT64, KV, STRING,
                    UINT8, UINT16, UINT32, UINT64, Tensor)

_INT_RANGE = {UINT8: (0, 2 ** 8 - 1), INT8: (-2 ** 7, 2 ** 7 - 1), UINT16: (0, 2 ** 16 - 1),
              INT16: (-2 ** 15, 2 ** 15 - 1), UINT32: (0, 2 ** 32 - 1),
              INT32: (-2 ** 31, 2 ** 31 - 1), UINT64: (0, 2 ** 64 - 1),
              INT64: (-2 ** 63, 2 ** 63 - 1)}
_SCALARS = list(_INT_RANGE) + [FLOAT32, FLOAT64, BOOL, STRING]
_INTS = (0, 1, 2, 3, 4, 7, 8, 16, 255, 256, 257, 261, 262, 263, 4096, 65535, 65536,
         2 ** 31 - 1, 2 ** 31, 2 ** 32 - 1, 2 ** 32, 2 ** 63 - 1, 2 ** 64 - 1, -1, -2, -2 ** 31)
_FLOATS = (0.0, -0.0, 1.0, -1.0, 0.5, 1e-6, 1e-45, 1e-30, 4.5e-5, 1e38, 3.5e38, 1e300,
           float("inf"), float("-inf"), float("nan"), 10000.0, 1e6)
_STRINGS = ("", "qwen3", "qwen3moe", "gpt2", "qwen2", "qwen35", "deepseek-v3", "none",
            "no_vocab", "llama", "yarn", "linear", "longrope", "\u0120 t", "\u0120t t", "a",
            "<|im_end|>", "<think>", "\xff", "a b c")
# every key the readers look at (tokenizer, hparams for both families, rope)
_KEYS = ["general.architecture", "general.alignment", "tokenizer.ggml.model",
         "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
         "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
         "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id",
         "tokenizer.ggml.padding_token_id", "tokenizer.ggml.fim_pad_token_id",
         "tokenizer.ggml.fim_rep_token_id", "tokenizer.ggml.fim_sep_token_id",
         "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token"]
_ARCH_KEYS = ["block_count", "nextn_predict_layers", "embedding_length", "attention.head_count",
              "attention.head_count_kv", "attention.key_length", "attention.value_length",
              "rope.dimension_count", "feed_forward_length", "context_length",
              "attention.layer_norm_rms_epsilon", "vocab_size", "expert_count",
              "expert_used_count", "expert_group_count", "expert_group_used_count",
              "expert_feed_forward_length", "rope.freq_base", "rope.scaling.type",
              "rope.scaling.factor", "rope.scale_linear", "rope.scaling.attn_factor",
              "rope.scaling.original_context_length"]
_GGML_TYPES = (0, 1, 2, 8, 12, 14, 30, 4, 99)


def _value(t: int, rng: random.Random, near=None):
    """A value that type ``t`` can hold: interesting numbers, or near ``near``."""
    if t in _INT_RANGE:
        lo, hi = _INT_RANGE[t]
        pool = list(_INTS)
        if isinstance(near, int) and not isinstance(near, bool):
            pool += [near - 1, near + 1, near * 2, near // 2, -near]
        return min(hi, max(lo, rng.choice(pool)))
    if t in (FLOAT32, FLOAT64):
        v = rng.choice(_FLOATS)
        if t == FLOAT32 and abs(v) > 3.4e38 and v == v and abs(v) != float("inf"):
            v = float("inf")
        return v
    if t == BOOL:
        return rng.random() < 0.5
    return rng.choice(_STRINGS)


def _convert(v, t: int, rng: random.Random):
    """``v`` as type ``t`` where it converts (keeps ids meaningful), else a fresh value."""
    try:
        if t in _INT_RANGE and isinstance(v, (int, float, bool)) and v == v and abs(v) < 2 ** 63:
            lo, hi = _INT_RANGE[t]
            if lo <= int(v) <= hi:
                return int(v)
        if t in (FLOAT32, FLOAT64) and isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
        if t == STRING and not isinstance(v, list):
            return str(v)
    except (OverflowError, ValueError):
        pass
    return _value(t, rng)


def _mutate_kv(g: GGUF, rng: random.Random) -> None:
    arch = g.get("general.architecture")
    arch = arch if isinstance(arch, str) else "qwen3"
    r = rng.random()
    if r < 0.15 or not g.kvs:  # add (or overwrite) a key the readers read
        key = rng.choice(_KEYS + [f"{arch}.{k}" for k in _ARCH_KEYS])
        t = rng.choice(_SCALARS + [ARRAY])
        if t == ARRAY:
            elem = rng.choice(_SCALARS)
            g.set(key, [_value(elem, rng) for _ in range(rng.choice((0, 1, 2, 3)))], ARRAY, elem)
        else:
            g.set(key, _value(t, rng), t)
        return
    kv: KV = rng.choice(g.kvs)
    if r < 0.22:
        g.kvs.remove(kv)
    elif kv.vtype == ARRAY:
        vals, elem = kv.value, kv.elem
        op = rng.randrange(7)
        if op == 0 and vals:  # cut
            del vals[rng.randrange(len(vals)):]
        elif op == 1 and vals:  # grow
            vals.extend(rng.choice(vals) for _ in range(rng.choice((1, 2, 16))))
        elif op == 2 and vals:  # one element changed
            i = rng.randrange(len(vals))
            vals[i] = _value(elem, rng, vals[i])
        elif op == 3:  # another element type
            new = rng.choice(_SCALARS)
            kv.value, kv.elem = [_convert(x, new, rng) for x in vals], new
        elif op == 4:  # the array becomes a scalar
            t = rng.choice(_SCALARS)
            kv.vtype, kv.value, kv.elem = t, _convert(vals[0] if vals else 0, t, rng), None
        elif op == 5 and len(vals) > 1:  # two elements swapped
            i, j = rng.randrange(len(vals)), rng.randrange(len(vals))
            vals[i], vals[j] = vals[j], vals[i]
        else:
            kv.value = []
    else:
        op = rng.randrange(3)
        if op == 0:  # same type, an extreme or nearby value
            kv.value = _value(kv.vtype, rng, kv.value)
        elif op == 1:  # another type
            t = rng.choice(_SCALARS)
            kv.vtype, kv.value = t, _convert(kv.value, t, rng)
        else:  # the scalar becomes an array of it
            elem = kv.vtype
            kv.vtype, kv.value, kv.elem = ARRAY, [kv.value] * rng.choice((1, 2, 3)), elem


def _mutate_tensor(g: GGUF, rng: random.Random) -> None:
    t: Tensor = rng.choice(g.tensors)
    op = rng.randrange(6)
    if op == 0 and t.ne:  # one dimension changed
        ne = list(t.ne)
        i = rng.randrange(len(ne))
        ne[i] = max(1, min(2 ** 40, rng.choice((1, 2, 4, 8, 16, 32, 262, 256, ne[i] * 2,
                                                  max(1, ne[i] // 2), ne[i] + 1))))
        t.ne = tuple(ne)
    elif op == 1:  # dimensions added or dropped (down to none: a scalar)
        t.ne = t.ne[:-1] if t.ne and rng.random() < 0.5 else t.ne + (1,)
    elif op == 2:
        t.ggml_type = rng.choice(_GGML_TYPES)
    elif op == 3 and g.blob is not None:  # another (aligned) offset
        t.offset = rng.choice((0, 32, 64, t.offset + 32, max(0, t.offset - 32), 2 ** 40))
    elif op == 4:  # another name (two tensors of one layer swapped, or a new block)
        other = rng.choice(g.tensors)
        if other is not t and rng.random() < 0.5:
            t.name, other.name = other.name, t.name
        else:
            t.name = t.name.replace("blk.0.", "blk.1.", 1)
    elif len(g.tensors) > 1:
        g.tensors.remove(t)


def structured(data: bytes, rng: random.Random) -> bytes | None:
    """``data`` with one structural change, or None when it does not decode."""
    g = GGUF.from_bytes(data)
    if g is None:
        return None
    for _ in range(1 + (rng.random() < 0.3)):
        if g.tensors and rng.random() < 0.25:
            _mutate_tensor(g, rng)
        else:
            _mutate_kv(g, rng)
    try:
        return g.to_bytes()
    except (struct.error, UnicodeEncodeError, OverflowError, TypeError):
        return None


def mutate(data: bytes, max_size: int, seed: int,
           byte_mutate: Callable[[bytes, int], bytes]) -> bytes:
    rng = random.Random(seed)
    if rng.random() < 0.5:
        out = structured(data, rng)
        if out is not None and len(out) <= max_size:
            return out
    return byte_mutate(data, max_size)
