"""The per-file GGUF index (reflex_core.gguf_index): a file opened from its index parses and
tokenizes exactly like a fresh parse; a changed file, a corrupt or foreign index, or
REFLEX_NO_INDEX=1 falls back to the full parse; the CLI writes the index once and uses it."""

from __future__ import annotations

import copy
import marshal
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tokenizers

from reflex_core import gguf_index
from reflex_core.gguf import open_gguf
from reflex_core.testing.modelwriter import ModelShape, qwen3_tokenizer_json_path
from reflex_core.tokenizer import Tokenizer
from test_tokenizer_fast import CORPUS


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    d = tmp_path / "xdg"
    monkeypatch.setenv("XDG_CACHE_HOME", str(d))
    monkeypatch.delenv("REFLEX_NO_INDEX", raising=False)
    gguf_index._pending.clear()
    yield d
    gguf_index._pending.clear()


@pytest.fixture(scope="module")
def qwen_file(model_files):
    return model_files(ModelShape(n_layer=1), tokenizer="qwen3")


@pytest.fixture(scope="module")
def ref():
    return tokenizers.Tokenizer.from_file(str(qwen3_tokenizer_json_path()))


def indexed(path) -> tuple:
    """(the slow parse, the same file opened from the index just written)."""
    g = open_gguf(path)
    assert g.index_state == "miss" and gguf_index.pending()
    gguf_index.write_pending()
    assert not gguf_index.pending()
    assert os.path.exists(gguf_index.index_file(str(path)))
    h = open_gguf(path)
    assert h.index_state == "hit"
    return g, h


def same_parse(g, h) -> None:
    assert (g.version, g.alignment, g.data_offset, g.file_size) == \
        (h.version, h.alignment, h.data_offset, h.file_size)
    assert list(g.metadata) == list(h.metadata) and g.value_types == h.value_types
    for k, v in g.metadata.items():
        w = h.metadata[k]
        if hasattr(v, "tolist"):
            assert type(w) is type(v) and v.tolist() == w.tolist(), k
            if v.elem_type == 8:
                assert v.raw_list() == w.raw_list(), k
        else:
            assert type(v) is type(w) and v == w, k
    assert [(t.name, t.ne, t.ggml_type, t.offset, t.nbytes) for t in g.tensors.values()] == \
        [(t.name, t.ne, t.ggml_type, t.offset, t.nbytes) for t in h.tensors.values()]
    for name in list(g.tensors)[:3]:
        assert bytes(g.tensor_data(name)) == bytes(h.tensor_data(name))


def test_parse_from_index_equals_full_parse(cache, qwen_file, model_files):
    same_parse(*indexed(qwen_file))
    other = model_files(ModelShape(n_layer=2), weight_type="Q8_0", seed=3)  # no tokenizer
    g, h = indexed(other)
    same_parse(g, h)
    assert h.index["tok"] is None


def test_tokenizer_from_index_equals_reference(cache, qwen_file, ref):
    g, h = indexed(qwen_file)
    slow = Tokenizer.from_gguf(g, use_index=False)
    tok = Tokenizer.from_gguf(h)
    assert tok._merge_strs is not None and tok._fast  # really served by the index
    for attr in ("n_vocab", "bos_id", "eos_id", "eot_id", "pad_id", "add_bos", "add_eos",
                 "eog_ids"):
        assert getattr(tok, attr) == getattr(slow, attr), attr
    bad = []
    for x in CORPUS:
        t = copy.copy(tok)
        t._reset_mini()
        ids = t.encode(x)
        assert t.last_path == "fast", (x, t.fast_reason)
        if ids != ref.encode(x).ids or t.decode(ids) != slow.decode(ids):
            bad.append(x)
    assert not bad, f"{len(bad)} mismatches, first {bad[0]!r}"
    rng = random.Random(5)
    for i in rng.sample(range(tok.n_vocab), 400) + [0, 255, 256, tok.n_vocab - 1]:
        assert tok.token_bytes(i) == slow.token_bytes(i)
    # the table finds every BPE token and nothing else
    vt = tok._vocab_b
    for i in rng.sample(range(tok._k), 2000):
        assert vt.get(tok._raw[i]) == i
    for _ in range(500):
        junk = bytes(rng.randrange(256) for _ in range(rng.randint(1, 12)))
        assert vt.get(junk) == slow._vocab_b.get(junk)


def test_fallback_vocabulary_records_no_tables(cache, tmp_path):
    # A vocabulary the prompt-scoped path refuses (two tokens' ids swapped: merge i no longer
    # makes token 256+i): the index keeps only the verdict, the tokenizer takes the full path.
    from test_tokenizer_fast import _qwen3_lists, _write_tokenizer_gguf

    tokens, types, merges = _qwen3_lists()
    tokens[12095], tokens[7148] = tokens[7148], tokens[12095]
    p = _write_tokenizer_gguf(tmp_path / "swapped.gguf", tokens, types, merges)
    g, h = indexed(p)
    assert h.index["tok"]["fast"] is False and "256+i" in h.index["tok"]["reason"]
    tok = Tokenizer.from_gguf(h)
    assert tok.encode(" Paris") == [7148] and tok.last_path == "full"


def test_same_size_rewrite_with_mtime_kept_is_caught(cache, qwen_file, tmp_path):
    # cp -p of another same-size file over this one: same inode, size and mtime; the probe
    # (CRC of the first and last MiB) sees the new content
    p = tmp_path / "m.gguf"
    shutil.copy(qwen_file, p)
    indexed(p)
    st = p.stat()
    data = bytearray(p.read_bytes())
    data[-1] ^= 0xFF  # the last tensor's last byte
    with open(p, "r+b") as f:
        f.write(data)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert p.stat().st_ino == st.st_ino and p.stat().st_mtime_ns == st.st_mtime_ns
    assert open_gguf(p).index_state == "miss"


def test_changed_file_ignores_its_index(cache, qwen_file, tmp_path):
    p = tmp_path / "m.gguf"
    shutil.copy(qwen_file, p)
    indexed(p)
    st = p.stat()
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # touched
    g2 = open_gguf(p)  # kept open: pending indexes hold their files weakly
    assert g2.index_state == "miss"
    gguf_index.write_pending()
    assert open_gguf(p).index_state == "hit"
    q = tmp_path / "n.gguf"  # replaced by another file (new inode) under the same name
    shutil.copy(qwen_file, q)
    os.replace(q, p)
    assert open_gguf(p).index_state == "miss"


@pytest.mark.parametrize("damage", ["garbage", "truncated", "format", "identity", "header",
                                    "tensor past the end", "table size"])
def test_bad_index_is_ignored(cache, qwen_file, tmp_path, damage):
    p = tmp_path / "m.gguf"
    shutil.copy(qwen_file, p)
    g, _ = indexed(p)
    f = Path(gguf_index.index_file(str(p)))
    raw = f.read_bytes()
    rec = marshal.loads(raw)
    if damage == "garbage":
        f.write_bytes(b"\x00not marshal" * 10)
    elif damage == "truncated":
        f.write_bytes(raw[:len(raw) // 2])
    else:
        if damage == "format":
            rec["format"] = -1
        elif damage == "identity":
            rec["identity"] = ("/elsewhere",) + tuple(rec["identity"][1:])
        elif damage == "header":
            rec["gguf"]["header"] = b"GGUF" + b"\xff" * 20
        elif damage == "tensor past the end":
            t = rec["gguf"]["tensors"]
            t[0] = (t[0][0], t[0][1], t[0][2], 10 ** 12, t[0][4])
        elif damage == "table size":
            rec["tok"]["table"] = rec["tok"]["table"][:-4]
        f.write_bytes(marshal.dumps(rec))
    h = open_gguf(p)
    if damage == "table size":  # the parse is fine; the tokenizer refuses the tables
        assert h.index_state == "hit"
        tok = Tokenizer.from_gguf(h)
        assert tok._merge_strs is None
    else:
        assert h.index_state == "miss"
    same_parse(g, h)
    assert Tokenizer.from_gguf(h).encode("The capital of France is") == \
        Tokenizer.from_gguf(g, use_index=False).encode("The capital of France is")


def test_no_index_env(cache, qwen_file, monkeypatch):
    monkeypatch.setenv("REFLEX_NO_INDEX", "1")
    g = open_gguf(qwen_file)
    assert g.index_state == "off" and not gguf_index.pending()
    assert not cache.exists()


def test_pending_holds_files_weakly(cache, qwen_file):
    g = open_gguf(qwen_file)
    assert gguf_index.pending()
    g.close()
    del g
    import gc

    gc.collect()
    assert not gguf_index.pending()
    gguf_index.write_pending()
    assert not os.path.exists(gguf_index.index_file(str(qwen_file)))


def test_cli_writes_the_index_then_uses_it(tmp_path, qwen_file):
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "xdg"))
    env.pop("REFLEX_NO_INDEX", None)
    cmd = [sys.executable, "-m", "reflex_core", "generate", str(qwen_file),
           "The capital of France is", "-n", "3", "--backend", "cpu", "--timings"]
    runs = [subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
            for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr
    assert "gguf index: miss" in runs[0].stderr, runs[0].stderr
    assert "gguf index: hit" in runs[1].stderr, runs[1].stderr
    import re

    def same(out: str) -> str:
        return re.sub(r"process_start_to_first_token_ms=[0-9.]+", "", out)

    assert same(runs[0].stdout) == same(runs[1].stdout)
