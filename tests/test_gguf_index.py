"""The per-file GGUF index (reflex_core.gguf_index, opened through reflex_core.modelfile): a file
opened from its index parses and tokenizes exactly like a fresh parse; a changed file, a corrupt
or foreign index, or REFLEX_NO_INDEX=1 falls back to the full parse; the CLI writes the index
once and uses it; ``python -m reflex_core.gguf_index`` writes it in a process of its own."""

from __future__ import annotations

import marshal
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tokenizers

from reflex_core import gguf_index
from reflex_core.gguf import GGUFFile, open_gguf
from reflex_core.modelfile import load_tokenizer, open_model_file
from reflex_core.testing.modelwriter import ModelShape, qwen3_tokenizer_json_path
from reflex_core.tokenizer import Tokenizer
from test_tokenizer_fast import CORPUS, fresh


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
    g = open_model_file(path)
    assert g.index_state == "miss" and gguf_index.pending()
    gguf_index.write_pending()
    assert not gguf_index.pending()
    assert os.path.exists(gguf_index.index_file(str(path)))
    h = open_model_file(path)
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
    assert h.tokenizer_tables is None


def test_tokenizer_from_index_equals_reference(cache, qwen_file, ref):
    g, h = indexed(qwen_file)
    slow = Tokenizer.from_gguf(g)
    tok = load_tokenizer(h)
    assert tok._scoped is not None and tok._scoped.checked  # really served by the index
    assert tok._scoped._merge_strs is not None
    for attr in ("n_vocab", "bos_id", "eos_id", "eot_id", "pad_id", "add_bos", "add_eos",
                 "eog_ids"):
        assert getattr(tok, attr) == getattr(slow, attr), attr
    bad = []
    for x in CORPUS:
        t = fresh(tok)
        ids = t.encode(x)
        assert t.last_path == "fast", (x, t.fast_reason)
        if ids != ref.encode(x).ids or t.decode(ids) != slow.decode(ids):
            bad.append(x)
    assert not bad, f"{len(bad)} mismatches, first {bad[0]!r}"
    rng = random.Random(5)
    for i in rng.sample(range(tok.n_vocab), 400) + [0, 255, 256, tok.n_vocab - 1]:
        assert tok.token_bytes(i) == slow.token_bytes(i)
    # the table finds every BPE token and nothing else
    vt = tok._scoped._vocab
    for i in rng.sample(range(tok._scoped._k), 2000):
        assert vt.get(tok._raw[i]) == i
    for _ in range(500):
        junk = bytes(rng.randrange(256) for _ in range(rng.randint(1, 12)))
        assert vt.get(junk) == slow._scoped._vocab.get(junk)


def test_fallback_vocabulary_records_no_tables(cache, tmp_path):
    # A vocabulary the prompt-scoped path refuses (two tokens' ids swapped: merge i no longer
    # makes token 256+i): the index keeps only the verdict, the tokenizer takes the full path.
    from test_tokenizer_fast import _qwen3_lists, _write_tokenizer_gguf

    tokens, types, merges = _qwen3_lists()
    tokens[12095], tokens[7148] = tokens[7148], tokens[12095]
    p = _write_tokenizer_gguf(tmp_path / "swapped.gguf", tokens, types, merges)
    g, h = indexed(p)
    assert h.tokenizer_tables["fast"] is False and "256+i" in h.tokenizer_tables["reason"]
    tok = load_tokenizer(h)
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
    assert open_model_file(p).index_state == "miss"


def test_changed_file_ignores_its_index(cache, qwen_file, tmp_path):
    p = tmp_path / "m.gguf"
    shutil.copy(qwen_file, p)
    indexed(p)
    st = p.stat()
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # touched
    g2 = open_model_file(p)  # kept open: pending indexes hold their files weakly
    assert g2.index_state == "miss"
    gguf_index.write_pending()
    assert open_model_file(p).index_state == "hit"
    q = tmp_path / "n.gguf"  # replaced by another file (new inode) under the same name
    shutil.copy(qwen_file, q)
    os.replace(q, p)
    assert open_model_file(p).index_state == "miss"


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
    h = open_model_file(p)
    if damage == "table size":  # the parse is fine; the tokenizer refuses the tables
        assert h.index_state == "hit"
        tok = load_tokenizer(h)
        assert tok._scoped._merge_strs is None  # built from the metadata
    else:
        assert h.index_state == "miss"
    same_parse(g, h)
    assert load_tokenizer(h).encode("The capital of France is") == \
        Tokenizer.from_gguf(g).encode("The capital of France is")


def test_no_index_env(cache, qwen_file, monkeypatch):
    monkeypatch.setenv("REFLEX_NO_INDEX", "1")
    g = open_model_file(qwen_file)
    assert g.index_state == "off" and not gguf_index.pending()
    assert not cache.exists()


def test_pending_holds_files_weakly(cache, qwen_file):
    g = open_model_file(qwen_file)
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
    runs = [subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)]
    # the index is written after exit, by a detached helper: wait for it (bounded)
    index = Path(env["XDG_CACHE_HOME"]) / "reflex" / "index"
    deadline = time.monotonic() + 60
    while not (index.is_dir() and any(index.glob("*.rxi"))) and time.monotonic() < deadline:
        time.sleep(0.1)
    runs.append(subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300))
    for r in runs:
        assert r.returncode == 0, r.stderr
    assert "gguf index: miss" in runs[0].stderr, runs[0].stderr
    assert "gguf index: hit" in runs[1].stderr, runs[1].stderr
    import re

    def same(out: str) -> str:
        return re.sub(r"process_start_to_first_token_ms=[0-9.]+", "", out)

    assert same(runs[0].stdout) == same(runs[1].stdout)


def test_open_gguf_is_the_plain_parse(cache, qwen_file, tmp_path):
    p = tmp_path / "m.gguf"
    shutil.copy(qwen_file, p)
    g = open_gguf(p)  # neither reads nor schedules an index
    assert type(g) is GGUFFile and not gguf_index.pending() and not cache.exists()
    _, h = indexed(p)
    same_parse(open_gguf(p), h)
    assert open_model_file(p, use_index=False).index_state == "off"


def test_pending_paths(cache, qwen_file, tmp_path):
    p, q = tmp_path / "a.gguf", tmp_path / "b.gguf"
    shutil.copy(qwen_file, p)
    shutil.copy(qwen_file, q)
    g, h = open_model_file(p), open_model_file(q)
    assert sorted(gguf_index.pending_paths()) == sorted([str(p), str(q)])
    h.close()  # a closed file is no longer pending
    assert gguf_index.pending_paths() == [str(p)]
    assert g.index_state == "miss"


def test_entry_point_writes_the_index_the_next_open_hits(cache, qwen_file, tmp_path):
    p = tmp_path / "m.gguf"
    shutil.copy(qwen_file, p)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all" * 4)
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    cmd = [sys.executable, "-m", "reflex_core.gguf_index", str(tmp_path / "missing.gguf"),
           str(junk), str(tmp_path), str(p)]
    r = subprocess.run(cmd, capture_output=True, cwd=elsewhere, timeout=300)
    assert (r.returncode, r.stdout, r.stderr) == (0, b"", b"")  # bad paths: silently skipped
    f = Path(gguf_index.index_file(str(p)))
    assert f.exists() and not os.path.exists(gguf_index.index_file(str(junk)))
    h = open_model_file(p)
    assert h.index_state == "hit" and not gguf_index.pending()
    tok = load_tokenizer(h)
    assert tok._scoped._merge_strs is not None  # served by the tables the entry point wrote
    assert tok.encode(" Paris", add_special=False) == [12095]
    # a valid index is left alone; a stale one is rewritten
    before = f.stat().st_mtime_ns
    assert subprocess.run(cmd, capture_output=True, timeout=300).returncode == 0
    assert f.stat().st_mtime_ns == before
    st = p.stat()
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert open_model_file(p).index_state == "miss"
    gguf_index._pending.clear()
    assert subprocess.run(cmd, capture_output=True, timeout=300).returncode == 0
    assert open_model_file(p).index_state == "hit"


def test_entry_point_does_nothing_with_no_index_env(cache, qwen_file):
    env = dict(os.environ, REFLEX_NO_INDEX="1")
    r = subprocess.run([sys.executable, "-m", "reflex_core.gguf_index", str(qwen_file)],
                       capture_output=True, env=env, timeout=300)
    assert (r.returncode, r.stdout, r.stderr) == (0, b"", b"")
    assert not cache.exists()
