"""reflex_core.gguf against gguf-py's GGUFReader on files written by gguf-py's GGUFWriter."""

from __future__ import annotations

import json
import os
import random
import struct
import subprocess
import sys

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT, GGUFValueType as VT

from reflex_core import gguf as rg
from reflex_core.errors import GGUFError


# ------------------------------------------------------------------------------------------
# Fixtures


def qwen3_tokenizer():
    """(tokens, token_types, merges) of the real Qwen3 tokenizer (151,669 ids, no padding)."""
    from reflex_core.testing.modelwriter import qwen3_tokenizer_json_path

    tj = json.loads(qwen3_tokenizer_json_path().read_text(encoding="utf-8"))
    vocab = tj["model"]["vocab"]
    n = max(max(vocab.values()), max(t["id"] for t in tj["added_tokens"])) + 1
    tokens, types = [""] * n, [0] * n
    for tok, i in vocab.items():
        tokens[i], types[i] = tok, 1
    for t in tj["added_tokens"]:
        tokens[t["id"]], types[t["id"]] = t["content"], 3
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    return tokens, types, merges


def random_strings(rng: random.Random, n: int) -> list[str]:
    alphabet = "abcxyzĠĊ é日本語🙂\t\n"
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30))) for _ in range(n)]


SCALARS = [  # (key, value, type)
    ("t.u8", 255, VT.UINT8), ("t.i8", -128, VT.INT8), ("t.u16", 65535, VT.UINT16),
    ("t.i16", -32768, VT.INT16), ("t.u32", 2**32 - 1, VT.UINT32), ("t.i32", -2**31, VT.INT32),
    ("t.f32", 3.25, VT.FLOAT32), ("t.f32_eps", 1e-6, VT.FLOAT32), ("t.bool_t", True, VT.BOOL),
    ("t.bool_f", False, VT.BOOL), ("t.u64", 2**64 - 1, VT.UINT64), ("t.u64_big", 2**63 + 5, VT.UINT64),
    ("t.i64", -2**63, VT.INT64), ("t.f64", 3.141592653589793, VT.FLOAT64),
    ("t.str", "héllo wörld ✓ 日本語 🙂", VT.STRING), ("t.str_empty", "", VT.STRING),
]

RNG = random.Random(1234)
BIG_STRINGS = random_strings(RNG, 5000)
BIG_STRINGS[2500] = "x" * 300  # a length >= 256 breaks the fast check in one block ...
BIG_STRINGS[4000] = ""  # ... an empty string in another
SPECIAL_STRINGS = ["a", "", "b", "x\0y", "\0", "", "z" * 256, "y" * 255, "w" * 70000, "ü", "日本語",
                   "🙂" * 64, "end"]

ARRAYS = [  # (key, values, element type)
    ("a.u8", [0, 1, 255], VT.UINT8), ("a.i8", [-128, 0, 127], VT.INT8),
    ("a.u16", [0, 65535], VT.UINT16), ("a.i16", [-32768, 32767], VT.INT16),
    ("a.u32", [0, 2**32 - 1, 7], VT.UINT32), ("a.i32", [-2**31, 2**31 - 1, -1], VT.INT32),
    ("a.f32", [0.5, -1e-3, 1e30], VT.FLOAT32), ("a.bool", [True, False, True], VT.BOOL),
    ("a.u64", [2**64 - 1, 2**63 + 1, 0], VT.UINT64), ("a.i64", [-2**63, 2**63 - 1], VT.INT64),
    ("a.f64", [1.0 / 3, -2.5e-300], VT.FLOAT64),
    ("a.str_small", ["one", "two", "three"], VT.STRING),
    ("a.str_special", SPECIAL_STRINGS, VT.STRING),
    ("a.str_big", BIG_STRINGS, VT.STRING),
    ("a.str_single", ["only"], VT.STRING),
]


def _tensors(rng: np.random.Generator):
    """(name, array, raw_dtype) covering F32, F16, Q8_0, Q4_K, I32 and a 3-D tensor."""
    return [
        ("f32.weight", rng.standard_normal((3, 64)).astype(np.float32), None),
        ("f16.weight", rng.standard_normal((5, 32)).astype(np.float16), None),
        ("q8_0.weight", rng.integers(0, 256, (4, 2 * 34), dtype=np.uint8), QT.Q8_0),
        ("q4_k.weight", rng.integers(0, 256, (2, 144), dtype=np.uint8), QT.Q4_K),
        ("i32.bias", rng.integers(-1000, 1000, (7,), dtype=np.int32), None),
        ("f32.3d", rng.standard_normal((2, 3, 32)).astype(np.float32), None),
        ("f32.odd", rng.standard_normal((1, 5)).astype(np.float32), None),
    ]


def write_gguf(path, *, alignment=None, qwen=None, arrays=True):
    w = gguf.GGUFWriter(str(path), "test")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for key, val, vt in SCALARS:
        w.add_key_value(key, val, vt)  # add_key_value: add_string() would drop ""
    if arrays:
        for key, vals, vt in ARRAYS:
            w.add_key_value(key, vals, VT.ARRAY, sub_type=vt)
    if qwen is not None:
        tokens, types, merges = qwen
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
    for name, arr, raw in _tensors(np.random.default_rng(7)):
        w.add_tensor(name, arr, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def small_file(tmp_path_factory):
    return write_gguf(tmp_path_factory.mktemp("gguf") / "small.gguf")


@pytest.fixture(scope="module")
def qwen():
    return qwen3_tokenizer()


@pytest.fixture(scope="module")
def qwen_file(tmp_path_factory, qwen):
    return write_gguf(tmp_path_factory.mktemp("gguf") / "qwen.gguf", qwen=qwen, arrays=False)


# ------------------------------------------------------------------------------------------
# Comparison with GGUFReader


def compare_with_reader(path):
    ref = gguf.GGUFReader(str(path))
    with rg.open_gguf(path) as g:
        fields = [f for f in ref.fields.values() if not f.name.startswith("GGUF.")]
        assert list(g.metadata) == [f.name for f in fields]
        assert g.version == int(ref.fields["GGUF.version"].contents())
        assert g.alignment == ref.alignment
        assert g.data_offset == ref.data_offset
        assert g.file_size == os.path.getsize(path)
        for f in fields:
            ours = g.metadata[f.name]
            assert g.value_types[f.name] == int(f.types[0]), f.name
            if f.types[0] == VT.ARRAY:
                assert isinstance(ours, rg.GGUFArray)
                assert ours.elem_type == int(f.types[-1]), f.name
                assert len(ours) == len(f.data)
                assert ours.tolist() == f.contents(), f.name
            else:
                assert ours == f.contents(), f.name
                assert type(ours) is type(f.contents()), f.name
        assert list(g.tensors) == [t.name for t in ref.tensors]
        for t in ref.tensors:
            ti = g.tensors[t.name]
            assert ti.ne == tuple(int(d) for d in t.shape)  # ReaderTensor.shape is ne order
            assert ti.ggml_type == int(t.tensor_type)
            assert ti.type_name == t.tensor_type.name
            assert ti.offset == t.data_offset  # absolute
            assert ti.nbytes == t.n_bytes == rg.tensor_nbytes(ti.ne, ti.ggml_type)
            assert ti.n_elements == t.n_elements
            mv = g.tensor_data(t.name)
            assert mv.readonly and mv.nbytes == ti.nbytes
            assert np.array_equal(np.frombuffer(mv, np.uint8), np.asarray(t.data).view(np.uint8).ravel())
            del mv
        return g


def test_matches_gguf_reader(small_file):
    compare_with_reader(small_file)


def test_values(small_file):
    with rg.open_gguf(small_file) as g:
        for key, val, vt in SCALARS:
            if vt == VT.FLOAT32:
                assert g.metadata[key] == struct.unpack("<f", struct.pack("<f", val))[0]
            else:
                assert g.metadata[key] == val and type(g.metadata[key]) is type(val), key
            assert g.value_types[key] == vt
        assert g.get("t.u32") == 2**32 - 1 and g.get("missing", 5) == 5
        for key, vals, vt in ARRAYS:
            arr = g.metadata[key]
            if vt == VT.FLOAT32:
                vals = [struct.unpack("<f", struct.pack("<f", v))[0] for v in vals]
            assert arr.elem_type == vt and len(arr) == len(vals)
            assert arr.tolist() == vals and arr == vals and list(arr) == vals, key
            assert arr[0] == vals[0] and arr[-1] == vals[-1] and arr[1:3] == vals[1:3]
            assert type(arr[0]) is type(vals[0])
            if vt == VT.STRING:
                assert [arr.raw(i) for i in range(len(arr))] == [v.encode() for v in vals]
        assert g.metadata["a.bool"][1:] == [False, True]


def fast_blocks(arr) -> list[bool]:
    """Which 1024-string blocks of a not yet decoded string array took the bulk path (white box)."""
    return [fast for _, _, fast in arr._blocks]


def test_string_array_blocks(small_file):
    """The bulk path covers most blocks; the blocks with a 300-byte / empty string fall back."""
    with rg.open_gguf(small_file) as g:
        arr = g.metadata["a.str_big"]
        assert fast_blocks(arr) == [True, True, False, False, True]
        assert arr.raw(2500) == b"x" * 300  # raw before decode
        assert arr.tolist() == BIG_STRINGS
        assert arr.raw(4000) == b"" and arr.raw(17) == BIG_STRINGS[17].encode()
        assert not any(fast_blocks(g.metadata["a.str_special"]))


def test_alignment_64(tmp_path):
    path = write_gguf(tmp_path / "a64.gguf", alignment=64)
    g = compare_with_reader(path)
    assert g.alignment == 64 and g.value_types["general.alignment"] == rg.GGUF_TYPE_UINT32
    assert g.data_offset % 64 == 0
    assert all(ti.offset % 64 == 0 for ti in g.tensors.values())


def test_version_2(tmp_path, small_file):
    data = bytearray(small_file.read_bytes())
    assert data[4:8] == struct.pack("<I", 3)
    data[4:8] = struct.pack("<I", 2)  # v2 and v3 have the same layout (v3 added big-endian)
    path = tmp_path / "v2.gguf"
    path.write_bytes(bytes(data))
    g = compare_with_reader(path)
    assert g.version == 2


def test_qwen3_tokenizer(qwen_file, qwen):
    tokens, types, merges = qwen
    with rg.open_gguf(qwen_file) as g:
        toks, mer, tt = (g.metadata[k] for k in
                         ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type"))
        # the bulk check covers all but the block holding token 56940 (256 bytes of 'Ġ'x128)
        assert fast_blocks(toks).count(False) == 1
        assert fast_blocks(mer).count(False) == 1  # merge 56684 is 257 bytes
        assert toks.raw(56940) == ("Ġ" * 128).encode()
        assert toks.tolist() == tokens
        assert mer.tolist() == merges
        assert tt.elem_type == rg.GGUF_TYPE_INT32 and tt.tolist() == types
        assert toks[151645] == "<|im_end|>" and toks.raw(151645) == b"<|im_end|>"
        assert g.value_types["tokenizer.ggml.tokens"] == rg.GGUF_TYPE_ARRAY


def test_qwen3_matches_gguf_reader(qwen_file):
    """GGUFReader itself takes several seconds here (two numpy arrays per string)."""
    compare_with_reader(qwen_file)


def test_arrays_survive_close(small_file):
    g = rg.open_gguf(small_file)
    arr = g.metadata["a.str_big"]
    g.close()
    g.close()  # idempotent
    assert arr.tolist() == BIG_STRINGS
    with pytest.raises(ValueError):
        g.tensor_data("f32.weight")


def test_close_with_live_views(small_file):
    g = rg.open_gguf(small_file)
    mv = g.tensor_data("f32.weight")
    g.close()  # the mapping stays until the view goes
    assert mv.nbytes == 3 * 64 * 4
    mv.release()


def test_mm_and_info(small_file):
    with rg.open_gguf(small_file) as g:
        assert not g.mm.closed
        ti = g.tensors["q8_0.weight"]
        assert ti.ne == (64, 4) and ti.type_name == "Q8_0" and ti.nbytes == 4 * 2 * 34
        assert g.tensor_data(ti) == g.mm[ti.offset:ti.offset + ti.nbytes]
        assert "q8_0.weight" in repr(ti) and "small.gguf" in repr(g)
        with pytest.raises(TypeError):
            g.metadata["a.u8"].raw(0)


def test_type_table():
    ref = gguf.GGML_QUANT_SIZES
    for qt, (block, size) in ref.items():
        if qt == QT.Q8_1:  # gguf 0.19.0 says 40 bytes; ggml's block_q8_1 is 36
            assert rg.GGML_TYPES[9] == ("Q8_1", 32, 36)
            continue
        assert rg.GGML_TYPES[int(qt)] == (qt.name, block, size), qt
    assert rg.GGML_TYPE_IDS["BF16"] == 30 and rg.GGML_TYPE_IDS["MXFP4"] == 39
    assert rg.GGML_TYPE_IDS["NVFP4"] == 40 and rg.GGML_TYPES[40].block_size == 64
    assert rg.VALUE_TYPES["UINT32"] == rg.GGUF_TYPE_UINT32 == int(VT.UINT32)
    assert all(rg.VALUE_TYPES[vt.name] == int(vt) for vt in VT)
    assert rg.tensor_nbytes((256, 3), rg.GGML_TYPE_IDS["Q4_K"]) == 3 * 144
    with pytest.raises(GGUFError):
        rg.tensor_nbytes((100,), rg.GGML_TYPE_IDS["Q8_0"])
    with pytest.raises(GGUFError):
        rg.tensor_nbytes((32,), 4)


# ------------------------------------------------------------------------------------------
# Hand-built files: what GGUFWriter cannot write


def _s(b: bytes) -> bytes:
    return struct.pack("<Q", len(b)) + b


def hand_file(kvs: bytes, n_kv: int, tensors: bytes = b"", n_tensors: int = 0, data: bytes = b"",
              align: int = 32) -> bytes:
    head = b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + kvs + tensors
    return head + b"\0" * (-len(head) % align) + data


def test_empty_arrays_and_alignment_types(tmp_path):
    kvs = (_s(b"e.str") + struct.pack("<IIQ", 9, 8, 0) + _s(b"e.u32") + struct.pack("<IIQ", 9, 4, 0)
           + _s(b"general.alignment") + struct.pack("<IQ", 10, 16))  # u64 alignment accepted
    tensors = _s(b"t") + struct.pack("<IQIQ", 1, 4, 0, 0)
    p = tmp_path / "e.gguf"
    p.write_bytes(hand_file(kvs, 3, tensors, 1, b"\1\2\3\4" * 4, align=16))
    with rg.open_gguf(p) as g:
        assert g.metadata["e.str"].tolist() == [] and len(g.metadata["e.u32"]) == 0
        assert g.alignment == 16 and g.value_types["general.alignment"] == rg.GGUF_TYPE_UINT64
        assert g.data_offset % 16 == 0 and bytes(g.tensor_data("t")) == b"\1\2\3\4" * 4
        assert g.tensors["t"].ne == (4,)


def test_zero_dim_tensor_and_no_tensors(tmp_path):
    p = tmp_path / "z.gguf"
    p.write_bytes(hand_file(b"", 0, _s(b"scalar") + struct.pack("<IIQ", 0, 0, 0), 1, b"\0\0\x80?"))
    with rg.open_gguf(p) as g:
        ti = g.tensors["scalar"]
        assert ti.ne == () and ti.n_elements == 1 and ti.nbytes == 4
        assert struct.unpack("<f", g.tensor_data(ti))[0] == 1.0
    p.write_bytes(hand_file(_s(b"k") + struct.pack("<IB", 0, 7), 1))
    with rg.open_gguf(p) as g:
        assert g.metadata == {"k": 7} and g.tensors == {}


def test_no_numpy_or_gguf_import(small_file):
    code = (
        "import sys\n"
        "from reflex_core.gguf import open_gguf\n"
        f"g = open_gguf({str(small_file)!r})\n"
        "g.metadata['a.str_big'].tolist(); g.metadata['a.f32'].tolist()\n"
        "bytes(g.tensor_data('f32.weight'))\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'gguf'))\n"
        "print(repr(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
