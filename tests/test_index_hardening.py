"""The GGUF index is a index_cache, never an authority (issue 12, requirements 1 and 2's eviction).

One test per finding of the hardening pass, written against the public surface only
(``open_model_file``, ``load_tokenizer``, ``gguf_index.index_file`` / ``write_pending``, the
``python -m reflex_core.gguf_index`` helper) so that each runs unchanged on the code before the
fix, and failed there:

- stale index served: a model overwritten in place with its size and mtime kept, a changed eos id
  in the middle of the metadata and attn_k / attn_v's names swapped in the tensor directory;
- corrupt index never discarded: 300 seeded random bit flips of a valid index;
- crafted index trusted: a 5-byte index, a FIFO and a symlink to /dev/zero at the index path
  (run in a child with an address-space limit and a timeout: the old code hung or allocated GBs);
- indexes of deleted models never evicted.

The format-specific crafted cases (huge counts, a table without an empty slot, ...) are in
tests/test_gguf_index.py.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reflex_core import gguf_index
from reflex_core.gguf import open_gguf
from reflex_core.modelfile import load_tokenizer, open_model_file
from reflex_core.tokenizer import Tokenizer
from test_tokenizer_fast import _qwen3_lists, _write_tokenizer_gguf

TEXTS = ["The capital of France is", " Paris<|im_end|>", "naïve café 東京 123,456 \n\t x",
         "<think>ok</think> def f(x): return x**2"]


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory) -> Path:
    """A tokenizer-only GGUF with the first 2000 Qwen3 tokens, their merges and Qwen3's added
    tokens (ids 2000..): served by the prompt-scoped path, and an index small enough that 300
    flips spread over all of its parts."""
    tokens, types, merges = _qwen3_lists()
    first = next(i for i, t in enumerate(types) if t != 1)
    keep = list(range(2000)) + list(range(first, len(tokens)))
    path = tmp_path_factory.mktemp("small") / "small-vocab.gguf"
    return _write_tokenizer_gguf(path, [tokens[i] for i in keep], [types[i] for i in keep],
                                 merges[:2000 - 256], bos=2000, eos=2002)


def snapshot(g, tok) -> tuple:
    """Everything a run takes from a file's parse and tokenizer, as plain data."""
    meta = {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in g.metadata.items()}
    tensors = [(t.name, t.ne, t.ggml_type, t.offset, t.nbytes) for t in g.tensors.values()]
    toks = [tok.encode(x) for x in TEXTS] + [tok.encode(x, parse_special=False) for x in TEXTS]
    specials = (tok.n_vocab, tok.bos_id, tok.eos_id, tok.eot_id, tok.pad_id, tok.add_bos,
                sorted(tok.eog_ids))
    return (g.version, g.alignment, g.data_offset, meta, g.value_types, tensors, toks, specials,
            [tok.token_bytes(i) for i in range(0, tok.n_vocab, 97)])


def reference(path) -> tuple:
    g = open_gguf(path)
    try:
        return snapshot(g, Tokenizer.from_gguf(g))
    finally:
        g.close()


def index_now(path) -> Path:
    g = open_model_file(path)
    assert g.index_state == "miss"
    gguf_index.write_pending()
    f = Path(gguf_index.index_file(str(path)))
    assert f.is_file() and open_model_file(path).index_state == "hit"
    return f


# ----------------------------------------------------------------------------------------------
# Stale index served


def test_same_size_same_mtime_overwrite_is_not_served_from_the_old_index(index_cache, qwen_tok_file,
                                                                        tmp_path):
    p = tmp_path / "m.gguf"
    shutil.copy(qwen_tok_file, p)
    index_now(p)
    st = p.stat()
    data = bytearray(p.read_bytes())
    # the eos id (tokenizer.ggml.eos_token_id, u32), after the token and merge arrays: in the
    # middle of the metadata, neither the file's first nor its last MiB
    key = b"tokenizer.ggml.eos_token_id"
    at = data.index(key) + len(key) + 4
    assert 1 << 20 < at < len(data) - (1 << 20)
    old_eos = int.from_bytes(data[at:at + 4], "little")
    data[at:at + 4] = (old_eos - 2).to_bytes(4, "little")
    # attn_k and attn_v (same shape) swap names in the tensor directory
    k, v = b"blk.0.attn_k.weight", b"blk.0.attn_v.weight"
    ik, iv = data.index(k), data.index(v)
    assert data.count(k) == data.count(v) == 1 and 1 << 20 < min(ik, iv)
    data[ik:ik + len(k)], data[iv:iv + len(v)] = v, k
    with open(p, "r+b") as f:  # in place: same inode, same size
        f.write(data)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    now = p.stat()
    assert (now.st_ino, now.st_size, now.st_mtime_ns) == (st.st_ino, st.st_size, st.st_mtime_ns)

    h = open_model_file(p)
    got = snapshot(h, load_tokenizer(h))
    want = reference(p)
    assert want[7][2] == old_eos - 2  # the new file's eos id ...
    assert got[7] == want[7]  # ... is what the run uses
    assert got[5] == want[5]  # attn_k's bytes are read where the new directory says
    assert got == want
    assert h.index_state == "miss"


# ----------------------------------------------------------------------------------------------
# Corrupt index never discarded


def test_random_bit_flips_of_an_index_never_change_the_output(index_cache, small_vocab, tmp_path):
    p = tmp_path / "v.gguf"
    shutil.copy(small_vocab, p)
    want = reference(p)
    f = index_now(p)
    good = f.read_bytes()
    h = open_model_file(p)
    assert snapshot(h, load_tokenizer(h)) == want
    rng = random.Random(12)
    bad = []
    for trial in range(300):
        flipped = bytearray(good)
        bit = rng.randrange(8 * len(flipped))
        flipped[bit // 8] ^= 1 << (bit % 8)
        f.write_bytes(flipped)
        try:
            h = open_model_file(p)
            got = snapshot(h, load_tokenizer(h))
        except Exception as e:  # noqa: BLE001 - the run failed because of the index
            got = f"{type(e).__name__}: {e}"
        if got != want:
            bad.append((trial, bit, got if isinstance(got, str) else "different output"))
        gguf_index._pending.clear()
    assert not bad, f"{len(bad)} of 300 flips changed the output or failed, first {bad[:3]}"


# ----------------------------------------------------------------------------------------------
# Crafted index trusted: what sits at the index path


_CHILD = r"""
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
from reflex_core.modelfile import load_tokenizer, open_model_file
g = open_model_file(sys.argv[1])
print(g.index_state, load_tokenizer(g).encode("The capital of France is"))
"""


def _run_child(path, env, timeout=60):
    try:
        return subprocess.run([sys.executable, "-c", _CHILD, str(path)], capture_output=True,
                              text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"opening the model hung (> {timeout} s) on what sits at its index path")


@pytest.mark.parametrize("what", ["five bytes", "fifo", "symlink to /dev/zero"])
def test_special_or_crafted_file_at_the_index_path_is_a_miss(index_cache, qwen_tok_file, tmp_path, what):
    p = tmp_path / "m.gguf"
    shutil.copy(qwen_tok_file, p)
    env = dict(os.environ)
    f = Path(gguf_index.index_file(str(p)))
    f.parent.mkdir(parents=True, exist_ok=True)
    if what == "five bytes":  # marshal: a list of 2^31 - 1 items
        f.write_bytes(b"\xdb\xff\xff\xff\x7f")
    elif what == "fifo":
        os.mkfifo(f)
    else:
        f.symlink_to("/dev/zero")
    t0 = time.monotonic()
    r = _run_child(p, env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split(" ", 1)[0] == "miss"
    assert r.stdout.split(" ", 1)[1].strip() == "[785, 6722, 315, 9625, 374]"
    assert time.monotonic() - t0 < 30
    assert not (f.is_symlink() or f.is_fifo())  # removed (the symlink's target untouched)


# ----------------------------------------------------------------------------------------------
# Indexes of deleted models are never evicted


def test_indexes_of_deleted_models_are_evicted(tmp_path, small_vocab):
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "xdg"))
    env.pop("REFLEX_NO_INDEX", None)
    models = []
    for name in "abcd":
        models.append(tmp_path / f"{name}.gguf")
        shutil.copy(small_vocab, models[-1])
    helper = [sys.executable, "-m", "reflex_core.gguf_index"]
    # the folder a reflex command makes before it hands the write to the helper
    (tmp_path / "xdg" / "reflex" / "index").mkdir(parents=True, mode=0o700)
    os.chmod(tmp_path / "xdg" / "reflex", 0o700)
    r = subprocess.run(helper + [str(m) for m in models[:3]], env=env, capture_output=True,
                       timeout=300)
    assert r.returncode == 0
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = env["XDG_CACHE_HOME"]
    try:
        files = [Path(gguf_index.index_file(str(m))) for m in models]
    finally:
        if old is None:
            del os.environ["XDG_CACHE_HOME"]
        else:
            os.environ["XDG_CACHE_HOME"] = old
    assert all(f.is_file() for f in files[:3])
    models[0].unlink()
    models[1].unlink()
    r = subprocess.run(helper + [str(models[3])], env=env, capture_output=True, timeout=300)
    assert r.returncode == 0
    assert [f.is_file() for f in files] == [False, False, True, True]


def test_eviction_removes_temp_files_left_by_killed_writers(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    from reflex_core import cachedir

    folder = Path(cachedir.cache_dir(gguf_index.INDEX_DIR))
    old, fresh = folder / ".m.rxi.0123456789abcdef.tmp", folder / ".n.rxi.fedcba9876543210.tmp"
    for f in (old, fresh):
        f.write_bytes(b"partial")
    t = time.time() - 2 * 3600
    os.utime(old, (t, t))
    gguf_index.evict()
    assert not old.exists() and fresh.exists()  # a writer may still be renaming the fresh one
