"""Malformed GGUF files: each must raise a one-line GGUFError naming the file, quickly, without
a big allocation, and never another exception."""

from __future__ import annotations

import os
import random
import struct
import subprocess
import sys
import textwrap
import time

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT, GGUFValueType as VT

from reflex_core.errors import GGUFError
from reflex_core.gguf import open_gguf

TOKENS = [f"tok{i}" for i in range(50)]


def _build_base(path):
    w = gguf.GGUFWriter(str(path), "test")
    w.add_name("fuzz base")
    w.add_uint32("m.u32", 7)
    w.add_float32("m.f32", 0.5)
    w.add_uint32("dup.a", 1)
    w.add_uint32("dup.b", 2)
    w.add_array("tok.list", TOKENS)
    w.add_key_value("tok.type", list(range(50)), VT.ARRAY, sub_type=VT.INT32)
    w.add_bool("m.bool", True)
    w.add_tensor("blk.0.a", np.arange(64, dtype=np.float32).reshape(2, 32))
    w.add_tensor("blk.0.b", np.full((2, 34), 3, dtype=np.uint8), raw_dtype=QT.Q8_0)
    w.add_tensor("blk.0.c", np.ones(64, dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    path = tmp_path_factory.mktemp("base") / "base.gguf"
    _build_base(path)
    return path.read_bytes()


def key_end(data: bytes, key: str) -> int:
    """Offset just after a metadata key's bytes (where its value type u32 sits)."""
    k = key.encode()
    i = data.index(struct.pack("<Q", len(k)) + k)
    return i + 8 + len(k)


def patch(data: bytes, off: int, fmt: str, *vals) -> bytes:
    b = bytearray(data)
    struct.pack_into(fmt, b, off, *vals)
    return bytes(b)


# "Quickly" means work bounded by the file's size, not by the counts it claims (a parser that
# walked a claimed 2**40 entries would run for hours). Measured as this process's CPU time, which
# other processes on a loaded machine cannot inflate the way they inflate wall-clock time; the
# bounds are 25x (the 400-file fuzz) to 1000x (one file) what the parses take.
def expect_error(tmp_path, data: bytes, match: str = "", name: str = "bad.gguf") -> str:
    path = tmp_path / name
    path.write_bytes(data)
    t0 = time.process_time()
    with pytest.raises(GGUFError) as ei:
        g = open_gguf(path)
        try:  # lazily decoded parts count too
            for v in g.metadata.values():
                if hasattr(v, "tolist"):
                    v.tolist()
        finally:
            g.close()
    msg = str(ei.value)
    assert time.process_time() - t0 < 1.0
    assert "\n" not in msg and str(path) in msg, msg
    assert match.lower() in msg.lower(), msg
    return msg


def test_base_is_valid(tmp_path, base):
    p = tmp_path / "ok.gguf"
    p.write_bytes(base)
    with open_gguf(p) as g:
        assert g.metadata["tok.list"].tolist() == TOKENS
        assert [t.type_name for t in g.tensors.values()] == ["F32", "Q8_0", "F16"]


# ------------------------------------------------------------------------------------------
# Truncation


def test_truncations(tmp_path, base):
    p = tmp_path / "ok.gguf"
    p.write_bytes(base)
    with open_gguf(p) as g:
        data_offset = g.data_offset
        last_end = max(t.offset + t.nbytes for t in g.tensors.values())
    lengths = list(range(1, data_offset + 1))  # every byte of the header region
    lengths += list(range(data_offset + 1, last_end, 7))  # a sample into the data
    lengths.append(last_end - 1)  # one byte short of the last tensor's end
    path = tmp_path / "trunc.gguf"
    for n in lengths:
        path.write_bytes(base[:n])
        with pytest.raises(GGUFError) as ei:
            open_gguf(path).close()
        msg = str(ei.value)
        assert "\n" not in msg and str(path) in msg
        assert "truncated" in msg or n < 4, (n, msg)
    # only the trailing padding after the last tensor may go
    path.write_bytes(base[:last_end])
    open_gguf(path).close()


# ------------------------------------------------------------------------------------------
# Header


def test_empty_file(tmp_path):
    expect_error(tmp_path, b"", "empty")


def test_missing_and_directory(tmp_path):
    missing = tmp_path / "nope.gguf"
    with pytest.raises(GGUFError, match="^No such file: .*nope.gguf$"):
        open_gguf(missing)
    with pytest.raises(GGUFError, match="is a directory"):
        open_gguf(tmp_path)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs")
def test_fifo_does_not_block(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(GGUFError, match="not a regular file"):
        open_gguf(tmp_path / "fifo")


def test_bad_magic(tmp_path, base):
    expect_error(tmp_path, b"GGUX" + base[4:], "not a GGUF file")
    expect_error(tmp_path, b"\x7fELF" + b"\0" * 60, "not a GGUF file")
    expect_error(tmp_path, b"GG", "truncated")


@pytest.mark.parametrize("version,match", [
    (1, "version 1 is not supported"), (0, "unsupported GGUF version 0"),
    (4, "unsupported GGUF version 4"), (99, "unsupported GGUF version 99"),
    (0x03000000, "big-endian"), (0x02000000, "big-endian")])
def test_versions(tmp_path, base, version, match):
    expect_error(tmp_path, patch(base, 4, "<I", version), match)


def test_big_endian_file(tmp_path):
    path = tmp_path / "be.gguf"
    w = gguf.GGUFWriter(str(path), "test", endianess=gguf.GGUFEndian.BIG)
    w.add_uint32("x", 1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    expect_error(tmp_path, path.read_bytes(), "big-endian")


def test_huge_counts(tmp_path, base):
    expect_error(tmp_path, patch(base, 8, "<Q", 2**63), "tensors")
    expect_error(tmp_path, patch(base, 8, "<Q", 2**40), "tensors")
    expect_error(tmp_path, patch(base, 16, "<Q", 2**64 - 1), "metadata entries")
    expect_error(tmp_path, patch(base, 16, "<Q", 2**40), "metadata entries")
    expect_error(tmp_path, patch(base, 16, "<Q", 12))  # one more KV than there is


# ------------------------------------------------------------------------------------------
# Metadata


def test_huge_string_length(tmp_path, base):
    off = key_end(base, "general.name") + 4  # after the value type
    expect_error(tmp_path, patch(base, off, "<Q", 2**63), "truncated")
    expect_error(tmp_path, patch(base, off, "<Q", len(base)), "truncated")
    key_len_off = key_end(base, "m.u32") - len("m.u32") - 8
    expect_error(tmp_path, patch(base, key_len_off, "<Q", 2**64 - 1), "truncated")


def test_huge_array_counts(tmp_path, base):
    off = key_end(base, "tok.list") + 8  # type, element type, count
    expect_error(tmp_path, patch(base, off, "<Q", 2**62), "claims")
    expect_error(tmp_path, patch(base, off, "<Q", 2**64 - 1), "claims")
    expect_error(tmp_path, patch(base, off, "<Q", 10**6))  # within bounds, runs off the end
    off = key_end(base, "tok.type") + 8
    expect_error(tmp_path, patch(base, off, "<Q", 2**61), "claims")
    # the first string of the array claims too much
    off = key_end(base, "tok.list") + 16  # the first string's length
    assert struct.unpack_from("<Q", base, off)[0] == len(TOKENS[0])
    msg = expect_error(tmp_path, patch(base, off, "<Q", 2**40), "truncated")
    assert "'tok.list' string 0 (1099511627776 bytes) runs past the end" in msg


def test_unknown_value_types(tmp_path, base):
    expect_error(tmp_path, patch(base, key_end(base, "m.u32"), "<I", 77), "unknown value type 77")
    expect_error(tmp_path, patch(base, key_end(base, "m.u32"), "<I", 2**32 - 1), "unknown value type")
    off = key_end(base, "tok.type") + 4  # element type
    expect_error(tmp_path, patch(base, off, "<I", 13), "unknown value type 13")
    expect_error(tmp_path, patch(base, off, "<I", 9), "array of arrays")


def test_nested_array_from_writer(tmp_path):
    path = tmp_path / "nested.gguf"
    w = gguf.GGUFWriter(str(path), "test")
    w.add_key_value("nested", [[1, 2], [3]], VT.ARRAY, sub_type=VT.ARRAY)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    expect_error(tmp_path, path.read_bytes(), "array of arrays")


def test_duplicate_and_empty_keys(tmp_path, base):
    off = key_end(base, "dup.b") - 1
    expect_error(tmp_path, patch(base, off, "<c", b"a"), "duplicate metadata key 'dup.a'")
    kvs = struct.pack("<Q", 0) + struct.pack("<IB", 0, 1)
    expect_error(tmp_path, b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + kvs + b"\0" * 16, "empty key")


def test_invalid_utf8(tmp_path, base):
    off = key_end(base, "general.name") + 4 + 8  # the value's first byte
    expect_error(tmp_path, patch(base, off, "<B", 0xFF), "not valid UTF-8")
    off = key_end(base, "m.u32") - 1
    expect_error(tmp_path, patch(base, off, "<B", 0xC3), "not valid UTF-8")
    # a string array element: open succeeds, decoding names the key; raw bytes still work
    off = key_end(base, "tok.list") + 16 + 8  # first string's first byte
    path = tmp_path / "badtok.gguf"
    path.write_bytes(patch(base, off, "<B", 0x80))
    with open_gguf(path) as g:
        arr = g.metadata["tok.list"]
        assert arr.raw(0) == b"\x80ok0"
        with pytest.raises(GGUFError, match=r"tok\.list.*string 0 is not valid UTF-8"):
            arr.tolist()
        assert arr.raw(1) == b"tok1"


@pytest.mark.parametrize("vtype,fmt,value,match", [
    (4, "<I", 0, "power of two"), (4, "<I", 48, "power of two"), (5, "<i", 64, "unsigned"),
    (6, "<f", 32.0, "power of two")])
def test_bad_alignment(tmp_path, vtype, fmt, value, match):
    kv = struct.pack("<Q", 17) + b"general.alignment" + struct.pack("<I", vtype) + struct.pack(fmt, value)
    expect_error(tmp_path, b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + kv, match)


# ------------------------------------------------------------------------------------------
# Tensor directory


def tensor_field(data: bytes, name: str) -> int:
    """Offset of a tensor entry's n_dims (just after its name)."""
    n = name.encode()
    return data.index(struct.pack("<Q", len(n)) + n) + 8 + len(n)


def test_tensor_dims(tmp_path, base):
    off = tensor_field(base, "blk.0.a")  # F32, ne (32, 2)
    expect_error(tmp_path, patch(base, off, "<I", 5), "5 dimensions")
    expect_error(tmp_path, patch(base, off, "<I", 2**32 - 1), "dimensions")
    expect_error(tmp_path, patch(base, off + 4, "<Q", 0), "zero dimension")
    expect_error(tmp_path, patch(base, off + 4, "<QQ", 2**62, 2**62), "too many elements")
    expect_error(tmp_path, patch(base, off + 4, "<QQ", 2**40, 2**40))  # fits int64, not the file
    off = tensor_field(base, "blk.0.b")  # Q8_0, ne (32, 2)
    expect_error(tmp_path, patch(base, off + 4, "<Q", 48), "not a multiple of the block size 32")


@pytest.mark.parametrize("ggml_type", [4, 5, 31, 36, 43, 99, 2**32 - 1])
def test_unknown_ggml_type(tmp_path, base, ggml_type):
    off = tensor_field(base, "blk.0.a") + 4 + 16
    expect_error(tmp_path, patch(base, off, "<I", ggml_type), f"unknown GGML type id {ggml_type}")


def test_tensor_offsets(tmp_path, base):
    off = tensor_field(base, "blk.0.c") + 4 + 8 + 4  # F16, 1 dim: n_dims, ne0, type, offset
    (rel,) = struct.unpack_from("<Q", base, off)
    expect_error(tmp_path, patch(base, off, "<Q", rel + 1), "not a multiple of the alignment")
    expect_error(tmp_path, patch(base, off, "<Q", 2**40), "runs past the end")
    expect_error(tmp_path, patch(base, off, "<Q", 2**64 - 32), "runs past the end")
    expect_error(tmp_path, patch(base, off, "<Q", rel + 32), "runs past the end")


def test_duplicate_tensor_name(tmp_path, base):
    off = tensor_field(base, "blk.0.b") - 1
    expect_error(tmp_path, patch(base, off, "<c", b"a"), "duplicate tensor name 'blk.0.a'")


# ------------------------------------------------------------------------------------------
# No big allocation: the huge-count cases under an address-space limit


def test_huge_counts_under_memory_limit(tmp_path, base):
    cases = {
        "n_tensors": patch(base, 8, "<Q", 2**40),
        "n_kv": patch(base, 16, "<Q", 2**40),
        "str_len": patch(base, key_end(base, "general.name") + 4, "<Q", 2**62),
        "str_count": patch(base, key_end(base, "tok.list") + 8, "<Q", 2**62),
        "i32_count": patch(base, key_end(base, "tok.type") + 8, "<Q", 2**61),
        "str_count_fits": patch(base, key_end(base, "tok.list") + 8, "<Q", len(base) // 8 - 200),
        "ne": patch(base, tensor_field(base, "blk.0.a") + 4, "<QQ", 2**31, 2**31),
    }
    paths = []
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        paths.append(str(tmp_path / name))
    script = textwrap.dedent(f"""
        import resource, sys, time
        from reflex_core.errors import GGUFError
        from reflex_core.gguf import open_gguf
        resource.setrlimit(resource.RLIMIT_AS, (256 << 20, 256 << 20))
        for p in {paths!r}:
            t0 = time.process_time()
            try:
                open_gguf(p)
                print("NO ERROR", p)
            except GGUFError:
                pass
            if time.process_time() - t0 > 1.0:
                print("SLOW", p)
        print("done")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "done", out.stdout + out.stderr


# ------------------------------------------------------------------------------------------
# Fuzz


def test_random_byte_flips(tmp_path, base):
    p = tmp_path / "ok.gguf"
    p.write_bytes(base)
    with open_gguf(p) as g:
        data_offset = g.data_offset
    rng = random.Random(20261129)
    path = tmp_path / "fuzz.gguf"
    outcomes = {"ok": 0, "error": 0}
    t0 = time.process_time()
    for _ in range(400):
        b = bytearray(base)
        for _ in range(rng.choice((1, 1, 2, 4))):
            # mostly the header region; sometimes anywhere; sometimes a whole u64 replaced
            pos = rng.randrange(data_offset if rng.random() < 0.9 else len(b))
            if rng.random() < 0.2 and pos + 8 <= len(b):
                b[pos:pos + 8] = struct.pack("<Q", rng.choice((0, 1, 255, 256, 2**32, 2**63, 2**64 - 1)))
            else:
                b[pos] = rng.randrange(256)
        if rng.random() < 0.1:
            del b[rng.randrange(len(b)):]
        path.write_bytes(bytes(b))
        try:
            with open_gguf(path) as g:
                for v in g.metadata.values():
                    if hasattr(v, "tolist"):
                        v.tolist()
                        v.raw(0) if v.elem_type == 8 and len(v) else None
                for ti in g.tensors.values():
                    assert len(g.tensor_data(ti)) == ti.nbytes
            outcomes["ok"] += 1
        except GGUFError as e:
            assert "\n" not in str(e) and str(path) in str(e)
            outcomes["error"] += 1
    assert outcomes["error"] > 50 and outcomes["ok"] > 20, outcomes
    assert time.process_time() - t0 < 20
