"""The per-file GGUF index (reflex_core.gguf_index, opened through reflex_core.modelfile): a file
opened from its index parses and tokenizes exactly like a fresh parse; a changed file, a corrupt
or foreign index, or REFLEX_NO_INDEX=1 falls back to the full parse; the CLI writes the index
once and uses it; ``python -m reflex_core.gguf_index`` writes it in a process of its own."""

from __future__ import annotations

import struct
import os
import random
import shutil
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
import tokenizers

from reflex_core import gguf_index
from reflex_core.gguf import GGUFFile, open_gguf
from reflex_core.modelfile import load_tokenizer, open_model_file
from reflex_core.testing.modelwriter import ModelShape, qwen3_tokenizer_json_path
from reflex_core.tokenizer import Tokenizer, tables
from test_tokenizer_fast import CORPUS, fresh


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


def test_parse_from_index_equals_full_parse(index_cache, qwen_tok_file, model_files):
    same_parse(*indexed(qwen_tok_file))
    other = model_files(ModelShape(n_layer=2), weight_type="Q8_0", seed=3)  # no tokenizer
    g, h = indexed(other)
    same_parse(g, h)
    assert h.tokenizer_tables is None


def test_tokenizer_from_index_equals_reference(index_cache, qwen_tok_file, ref):
    g, h = indexed(qwen_tok_file)
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


def test_fallback_vocabulary_records_no_tables(index_cache, tmp_path):
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


def test_same_size_rewrite_with_mtime_kept(index_cache, qwen_tok_file, tmp_path):
    # Overwritten in place with the same size and its mtime kept (cp -p): same inode, size and
    # mtime. A change in the tensor data leaves the index valid (nothing of the data is in it:
    # the new bytes are read); a change anywhere in [0, data_offset) makes it a miss (the
    # stale-index findings: tests/test_index_hardening.py).
    p = tmp_path / "m.gguf"
    shutil.copy(qwen_tok_file, p)
    g, _ = indexed(p)
    st = p.stat()
    last = list(g.tensors)[-1]

    def rewrite(pos: int) -> None:
        data = bytearray(p.read_bytes())
        data[pos] ^= 0xFF
        with open(p, "r+b") as f:
            f.write(data)
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert (p.stat().st_ino, p.stat().st_mtime_ns) == (st.st_ino, st.st_mtime_ns)

    rewrite(p.stat().st_size - 1)  # the last tensor's last byte
    h = open_model_file(p)
    assert h.index_state == "hit"
    assert bytes(h.tensor_data(last)) == bytes(open_gguf(p).tensor_data(last))
    rewrite(g.data_offset - 1)  # the last byte the index was derived from (padding)
    assert open_model_file(p).index_state == "miss"


def test_changed_file_ignores_its_index(index_cache, qwen_tok_file, tmp_path):
    p = tmp_path / "m.gguf"
    shutil.copy(qwen_tok_file, p)
    indexed(p)
    st = p.stat()
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # touched
    g2 = open_model_file(p)  # kept open: pending indexes hold their files weakly
    assert g2.index_state == "miss"
    gguf_index.write_pending()
    assert open_model_file(p).index_state == "hit"
    q = tmp_path / "n.gguf"  # replaced by another file (new inode) under the same name
    shutil.copy(qwen_tok_file, q)
    os.replace(q, p)
    assert open_model_file(p).index_state == "miss"


def forge(path, tok=None, tok_raw=None, body=None, **fields) -> None:
    """Rewrite the index of ``path`` as someone who can write the cache would, with a correct
    CRC: ``fields`` replace the Record's, ``tok`` maps the decoded tables dict, ``tok_raw`` the
    tables' bytes, ``body`` the encoded index (its CRC recomputed after)."""
    f = Path(gguf_index.index_file(str(path)))
    rec = gguf_index.decode(f.read_bytes())
    assert rec is not None
    if tok is not None:
        fields["tok"] = tables.dumps(tok(tables.loads(rec.tok)))
    if tok_raw is not None:
        fields["tok"] = tok_raw(bytes(rec.tok))
    data = gguf_index.encode(rec._replace(**fields))
    if body is not None:
        data = with_crc(body(data))
    f.write_bytes(data)


def with_crc(data: bytes) -> bytes:
    """An encoded index with its header's CRC made right for its body."""
    return data[:12] + struct.pack("<I", zlib.crc32(data[16:])) + data[16:]


def _u32_at(b: bytes, pos: int, v: int = 0xFFFFFFFF) -> bytes:
    return b[:pos] + struct.pack("<I", v) + b[pos + 4:]


def _tokens_span_at(t: dict) -> int:
    """Where the tokens' (lo, hi, count) lie in tables.dumps(t)."""
    return 6 + 20 + 4 + len(t["tb"]) + sum(9 + len(x.encode()) for _, x, _ in t["added"])


def _short_region(path, rec) -> tuple[int, int]:
    n = rec.region[0] - 8
    return n, zlib.crc32(Path(path).read_bytes()[:n])


def _hints(rec, fn):
    """A parse record whose string-array blocks went through ``fn([(cnt, end, fast)])``."""
    raw = bytes(rec.gguf)
    (n,), pos, out = struct.unpack_from("<I", raw, 0), 4, [raw[:4]]
    for _ in range(n):
        start, count, nb = struct.unpack_from("<QQI", raw, pos)
        pos += 20
        blocks = [struct.unpack_from("<IQB", raw, pos + 13 * i) for i in range(nb)]
        pos += 13 * nb
        blocks = fn(blocks)
        out.append(struct.pack("<QQI", start, count, len(blocks)))
        out += [struct.pack("<IQB", *b) for b in blocks]
    return b"".join(out)


def _no_empty_slot(t):
    t["table"] = b"\0\0\0\0" * (len(t["table"]) // 4)
    return t


def _shifted_tokens(t):
    lo, hi, rel, lens = t["tokens"]
    t["tokens"] = (lo + 8, hi + 8, rel, lens)
    return t


def _control_token(t):  # a NORMAL token made CONTROL: the added tokens no longer agree
    t["tb"] = t["tb"][:9707] + b"\x03" + t["tb"][9708:]
    return t


def _put(p, data: bytes) -> None:
    Path(gguf_index.index_file(str(p))).write_bytes(data)


DAMAGE = {
    "garbage": lambda p, raw: _put(p, b"\0junk" * 10),
    "truncated": lambda p, raw: _put(p, raw[:len(raw) // 2]),
    "five bytes": lambda p, raw: _put(p, b"\xdb\xff\xff\xff\x7f"),
    "empty": lambda p, raw: _put(p, b""),
    "format": lambda p, raw: _put(p, raw[:8] + struct.pack("<I", 2) + raw[12:]),
    "crc": lambda p, raw: _put(p, raw[:-1] + bytes([raw[-1] ^ 1])),
    "identity": lambda p, raw: forge(p, model=b"/elsewhere/m.gguf"),
    "mtime": lambda p, raw: forge(p, stat=(lambda s: (s[0], s[1] + 1, s[2], s[3]))(
        gguf_index.decode(raw).stat)),
    "region crc": lambda p, raw: forge(p, region=(gguf_index.decode(raw).region[0],
                                                  gguf_index.decode(raw).region[1] ^ 1)),
    "region past the end": lambda p, raw: forge(p, region=(1 << 62, 0)),
    # the CRC of the bytes it names is right, but they end before the tensor directory does
    "region short": lambda p, raw: forge(p, region=_short_region(p, gguf_index.decode(raw))),
    "path length huge": lambda p, raw: forge(p, body=lambda d: _u32_at(d, 60)),
    "sections past the end": lambda p, raw: forge(p, body=lambda d: _u32_at(d, 64)),
    "hint count huge": lambda p, raw: forge(p, gguf=struct.pack("<I", 0xFFFFFFFF)
                                            + bytes(gguf_index.decode(raw).gguf)[4:]),
    "hint block moved": lambda p, raw: forge(p, gguf=_hints(
        gguf_index.decode(raw), lambda bl: [(bl[0][0], bl[0][1] + 8, bl[0][2])] + bl[1:])),
    "hint block count": lambda p, raw: forge(p, gguf=_hints(
        gguf_index.decode(raw), lambda bl: [(bl[0][0] + 1, bl[0][1], bl[0][2])] + bl[1:])),
    "hint missing": lambda p, raw: forge(p, gguf=struct.pack("<I", 0)),
    "tables garbage": lambda p, raw: forge(p, tok_raw=lambda b: b"RXTB\x01\x01" + b"\xff" * 50),
    "tables truncated": lambda p, raw: forge(p, tok_raw=lambda b: b[:-1]),
    "added count huge": lambda p, raw: forge(p, tok_raw=lambda b: _u32_at(b, 22)),
    "types length huge": lambda p, raw: forge(p, tok_raw=lambda b: _u32_at(b, 26)),
    "token count huge": lambda p, raw: forge(p, tok_raw=lambda b: _u32_at(
        b, _tokens_span_at(tables.loads(b)) + 16)),
    "no empty slot": lambda p, raw: forge(p, tok=_no_empty_slot),
    "table size": lambda p, raw: forge(p, tok=lambda t: {**t, "table": t["table"][:-4]}),
    "probe unbounded": lambda p, raw: forge(p, tok=lambda t: {**t, "probe": 1 << 20}),
    "tokens elsewhere": lambda p, raw: forge(p, tok=_shifted_tokens),
    "token types": lambda p, raw: forge(p, tok=_control_token),
    "k": lambda p, raw: forge(p, tok=lambda t: {**t, "k": t["k"] - 1}),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_bad_index_is_a_miss_deleted_and_rebuilt(index_cache, qwen_tok_file, tmp_path, damage):
    p = tmp_path / "m.gguf"
    shutil.copy(qwen_tok_file, p)
    g, _ = indexed(p)
    f = Path(gguf_index.index_file(str(p)))
    DAMAGE[damage](p, f.read_bytes())
    h = open_model_file(p)
    assert h.index_state == "miss"
    assert not f.exists()  # deleted ...
    same_parse(g, h)
    assert load_tokenizer(h).encode("The capital of France is") == \
        Tokenizer.from_gguf(g).encode("The capital of France is")
    gguf_index.write_pending()  # ... and rebuilt
    assert open_model_file(p).index_state == "hit"


def test_no_index_env(index_cache, qwen_tok_file, monkeypatch):
    monkeypatch.setenv("REFLEX_NO_INDEX", "1")
    g = open_model_file(qwen_tok_file)
    assert g.index_state == "off" and not gguf_index.pending()
    assert not index_cache.exists()


def test_pending_holds_files_weakly(index_cache, qwen_tok_file):
    g = open_model_file(qwen_tok_file)
    assert gguf_index.pending()
    g.close()
    del g
    import gc

    gc.collect()
    assert not gguf_index.pending()
    gguf_index.write_pending()
    assert not os.path.exists(gguf_index.index_file(str(qwen_tok_file)))


def test_cli_writes_the_index_then_uses_it(tmp_path, qwen_tok_file):
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "xdg"))
    env.pop("REFLEX_NO_INDEX", None)
    cmd = [sys.executable, "-m", "reflex_core", "generate", str(qwen_tok_file),
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


def test_open_gguf_is_the_plain_parse(index_cache, qwen_tok_file, tmp_path):
    p = tmp_path / "m.gguf"
    shutil.copy(qwen_tok_file, p)
    g = open_gguf(p)  # neither reads nor schedules an index
    assert type(g) is GGUFFile and not gguf_index.pending() and not index_cache.exists()
    _, h = indexed(p)
    same_parse(open_gguf(p), h)
    assert open_model_file(p, use_index=False).index_state == "off"


def test_pending_paths(index_cache, qwen_tok_file, tmp_path):
    p, q = tmp_path / "a.gguf", tmp_path / "b.gguf"
    shutil.copy(qwen_tok_file, p)
    shutil.copy(qwen_tok_file, q)
    g, h = open_model_file(p), open_model_file(q)
    assert sorted(gguf_index.pending_paths()) == sorted([str(p), str(q)])
    h.close()  # a closed file is no longer pending
    assert gguf_index.pending_paths() == [str(p)]
    assert g.index_state == "miss"


def test_entry_point_writes_the_index_the_next_open_hits(index_cache, qwen_tok_file, tmp_path):
    p = tmp_path / "m.gguf"
    shutil.copy(qwen_tok_file, p)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all" * 4)
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    cmd = [sys.executable, "-m", "reflex_core.gguf_index", str(tmp_path / "missing.gguf"),
           str(junk), str(tmp_path), str(p)]
    # the entry point never creates the cache folder (a reflex command makes it before it
    # hands the write over): without it nothing is written
    r = subprocess.run(cmd, capture_output=True, cwd=elsewhere, timeout=300)
    assert r.returncode == 0 and not os.path.exists(gguf_index.cache_dir())
    from reflex_core import cachedir

    assert cachedir.cache_dir(gguf_index.INDEX_DIR) == gguf_index.cache_dir()
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


def test_entry_point_does_nothing_with_no_index_env(index_cache, qwen_tok_file):
    env = dict(os.environ, REFLEX_NO_INDEX="1")
    r = subprocess.run([sys.executable, "-m", "reflex_core.gguf_index", str(qwen_tok_file)],
                       capture_output=True, env=env, timeout=300)
    assert (r.returncode, r.stdout, r.stderr) == (0, b"", b"")
    assert not index_cache.exists()


def test_evict_removes_what_is_not_an_index_of_a_live_model_then_the_oldest(index_cache, tmp_path,
                                                                           qwen_tok_file):
    models = []
    for name in "abcd":
        models.append(tmp_path / f"{name}.gguf")
        shutil.copy(qwen_tok_file, models[-1])
        g = open_model_file(models[-1])
        gguf_index.write_pending()
        g.close()
    files = [Path(gguf_index.index_file(str(m))) for m in models]
    for i, f in enumerate(files):  # a oldest ... d newest
        os.utime(f, ns=(10 ** 18 + i * 10 ** 9,) * 2)
    d = Path(gguf_index.cache_dir())
    link = d / "link.rxi"
    link.symlink_to(files[3])
    (d / "old-format.rxi").write_bytes(b"\xfb" + b"\0" * 100)  # an earlier FORMAT (marshal)
    (d / "notes.txt").write_bytes(b"not ours")
    st = models[1].stat()  # b changed: its index can never be used again
    os.utime(models[1], ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    size = files[0].stat().st_size
    gguf_index.evict(keep=frozenset([str(files[0])]), max_bytes=2 * size)
    assert [f.exists() for f in files] == [True, False, False, True]  # b stale; c oldest left
    assert not link.exists() and not (d / "old-format.rxi").exists()
    assert (d / "notes.txt").exists() and models[3].exists()
    gguf_index.evict()  # under the cap, every model as indexed: nothing to do
    assert [f.exists() for f in files] == [True, False, False, True]


def test_vocab_table_lookups_are_bounded_whatever_the_table_holds():
    raw = tables.Strings(b"\0" * 8 + b"ab" + b"\0" * 8 + b"cd", (0, 20, struct.pack("<II", 8, 18),
                                                               struct.pack("<II", 2, 2)))
    assert list(raw) == [b"ab", b"cd"]
    full = struct.pack("<i", 7) * 16  # no empty slot, ids >= k: each lookup stops after 3 probes
    vt = tables.VocabTable(full, 15, 3, raw, 2)
    assert vt.get(b"ab") is None and vt.get(b"zz", 5) == 5
    good = bytearray(b"\xff" * 64)
    for i, key in enumerate((b"ab", b"cd")):
        h = zlib.crc32(key) & 15
        while good[4 * h:4 * h + 4] != b"\xff" * 4:
            h = (h + 1) & 15
        good[4 * h:4 * h + 4] = struct.pack("<i", i)
    vt = tables.VocabTable(bytes(good), 15, 2, raw, 2)
    assert (vt.get(b"ab"), vt.get(b"cd"), vt.get(b"ef")) == (0, 1, None)
    with pytest.raises(ValueError):
        tables.VocabTable(bytes(good), 15, tables.MAX_PROBE + 1, raw, 2)


def test_decode_takes_exactly_one_record(index_cache, qwen_tok_file, tmp_path):
    """A record with a byte more or less than its counts say is refused, its CRC made right:
    with and without tokenizer tables (whose section runs to the end)."""
    p = tmp_path / "m.gguf"
    shutil.copy(qwen_tok_file, p)
    indexed(p)
    rec = gguf_index.decode(Path(gguf_index.index_file(str(p))).read_bytes())
    for r in (rec, rec._replace(tok=None)):
        data = gguf_index.encode(r)
        assert gguf_index.decode(data) is not None
        for bad in (data + b"\0", data[:-1]):
            assert gguf_index.decode(with_crc(bad)) is None


def test_truncated_or_damaged_sections_never_raise(index_cache, qwen_tok_file, tmp_path):
    # every prefix length and many single-byte changes of both sections: decoded or refused,
    # never an exception, never an allocation beyond the section's own size
    p = tmp_path / "m.gguf"
    shutil.copy(qwen_tok_file, p)
    g, _ = indexed(p)
    rec = gguf_index.decode(Path(gguf_index.index_file(str(p))).read_bytes())
    tok, hints = bytes(rec.tok), bytes(rec.gguf)
    assert tables.loads(tok) is not None
    rng = random.Random(3)
    t = tables.loads(tok)
    at = _tokens_span_at(t)
    fields = list(range(40)) + list(range(at, at + 20)) + list(range(at + 20 + 8 * len(t["tb"]),
                                                                     at + 40 + 8 * len(t["tb"])))
    for n in fields + rng.sample(range(len(tok)), 200):
        assert tables.loads(tok[:n]) is None
    for i in fields * 8 + rng.sample(range(len(tok)), 300):
        b = bytearray(tok)
        b[i] = rng.randrange(256)
        t = tables.loads(bytes(b))
        if t is not None:
            assert tables.fits(t, g) in (True, False)
    from reflex_core.gguf import GGUFFile, from_record

    for n in range(len(hints)):
        assert not from_record(GGUFFile(g.path, g.mm), hints[:n])
    for _ in range(500):
        b = bytearray(hints)
        b[rng.randrange(len(b))] = rng.randrange(256)
        from_record(GGUFFile(g.path, g.mm), bytes(b))
