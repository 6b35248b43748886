"""Prebuilt indexes (``reflex index``, reflex_core.gguf_index "Prebuilt indexes"): an index made
once and carried with the model -- copied with it into another folder (an image layer, a
volume: another path, mtime and inode) or put in ``$REFLEX_INDEX_DIR`` -- serves the cold path
before the user cache, exactly like a fresh parse; a stale, foreign, damaged, special or
untrusted one is ignored, never deleted, and said so by ``--timings``; a cache folder that
cannot be written never fails a run."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

import pytest

from reflex_core import gguf_index
from reflex_core.gguf import open_gguf
from reflex_core.modelfile import load_tokenizer, open_model_file
from reflex_core.tokenizer import Tokenizer
from test_cli import one_line_error, reflex
from test_gguf_index import same_parse

PROMPT = "The capital of France is"


@pytest.fixture()
def cache(index_cache, monkeypatch):
    """index_cache, with no prebuilt index folder inherited from the environment."""
    monkeypatch.delenv(gguf_index.PREBUILT_DIR_ENV, raising=False)
    return index_cache


def model_in(folder: Path, src, index: bytes | None = None) -> Path:
    """``src`` copied to ``folder/m.gguf`` (with ``index`` as its prebuilt index beside it)."""
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / "m.gguf"
    shutil.copyfile(src, p)
    if index is not None:
        Path(f"{p}.rxi").write_bytes(index)
    return p


@pytest.fixture(scope="module")
def prebuilt(qwen_tok_file, tmp_path_factory) -> bytes:
    """The prebuilt index of ``m.gguf`` = qwen_tok_file, made once (it depends on the model's
    name and bytes only: tests copy it with the model, as an image or a volume would)."""
    p = model_in(tmp_path_factory.mktemp("prebuilt"), qwen_tok_file)
    return Path(gguf_index.write_prebuilt(str(p))[0]).read_bytes()


def same_as_plain_parse(path) -> None:
    """The file opened as the cold path opens it parses and tokenizes as the plain parse."""
    g, h = open_gguf(path), open_model_file(path)
    same_parse(g, h)
    assert load_tokenizer(h).encode(PROMPT) == Tokenizer.from_gguf(g).encode(PROMPT)


def test_index_copied_with_the_model_is_used(cache, qwen_tok_file, tmp_path):
    a = model_in(tmp_path / "build", qwen_tok_file)
    fn, size, tables = gguf_index.write_prebuilt(str(a))
    assert fn == f"{a}.rxi" and tables and os.path.getsize(fn) == size
    assert stat.S_IMODE(os.stat(fn).st_mode) == 0o644
    time.sleep(0.01)  # the copies get other mtimes (and inodes, and a folder of another name)
    b = model_in(tmp_path / "image" / "models", a)
    shutil.copyfile(fn, f"{b}.rxi")
    h = open_model_file(b)
    assert h.index_state == "prebuilt" and h.index_file == f"{b}.rxi"
    assert h.tokenizer_tables is not None and h.region_crc is not None
    assert load_tokenizer(h)._scoped.checked  # served by the index's tables
    assert not gguf_index.pending()  # nothing to write to the user cache ...
    assert not cache.exists()  # ... which is not even created
    same_as_plain_parse(b)
    assert "prebuilt" in h.index_note and str(b) in h.index_note


def test_index_depends_on_the_model_name_and_bytes_only(cache, qwen_tok_file, tmp_path):
    a = model_in(tmp_path / "a", qwen_tok_file)
    b = model_in(tmp_path / "b", qwen_tok_file)
    os.utime(b, ns=(1, 1))
    fa, _, _ = gguf_index.write_prebuilt(str(a))
    fb, _, _ = gguf_index.write_prebuilt(str(b), str(tmp_path / "out"))
    assert Path(fa).read_bytes() == Path(fb).read_bytes()  # a reproducible image layer


def test_index_dir_comes_first_then_beside_the_model(cache, qwen_tok_file, prebuilt, tmp_path,
                                                     monkeypatch):
    p = model_in(tmp_path / "models", qwen_tok_file)
    out = tmp_path / "indexes"
    fn, _, _ = gguf_index.write_prebuilt(str(p), str(out))
    assert fn == str(out / "m.gguf.rxi")
    assert open_model_file(p).index_state == "miss"  # not looked for without the variable
    gguf_index._pending.clear()
    monkeypatch.setenv(gguf_index.PREBUILT_DIR_ENV, str(out))
    h = open_model_file(p)
    assert (h.index_state, h.index_file) == ("prebuilt", fn)
    same_as_plain_parse(p)
    # the folder's index no good, one beside the model valid: the folder's is ignored, the one
    # beside is used
    Path(fn).write_bytes(prebuilt[:-1])
    Path(f"{p}.rxi").write_bytes(prebuilt)
    h = open_model_file(p)
    assert (h.index_state, h.index_file) == ("prebuilt", f"{p}.rxi")


def test_prebuilt_index_comes_before_the_user_cache(cache, qwen_tok_file, prebuilt, tmp_path):
    p = model_in(tmp_path, qwen_tok_file)
    g = open_model_file(p)  # held: the pending index holds its file weakly
    assert g.index_state == "miss"
    gguf_index.write_pending()
    assert open_model_file(p).index_state == "hit"  # the user cache's
    Path(f"{p}.rxi").write_bytes(prebuilt)
    assert open_model_file(p).index_state == "prebuilt"


def rename_model(p: Path) -> None:
    """Change the model's name in its metadata, same length: its header's bytes differ (a
    stale index), its size and everything else the same."""
    data = bytearray(p.read_bytes())
    at = data.index(b"reflex-random-qwen3")
    data[at:at + 6] = b"REFLEX"
    p.write_bytes(data)


def _stale(p: Path, fn: Path) -> None:
    rename_model(p)


def _other_size(p: Path, fn: Path) -> None:
    with open(p, "ab") as f:  # one more alignment block after the data: same header
        f.write(bytes(32))


def _damaged(p: Path, fn: Path) -> None:
    data = bytearray(fn.read_bytes())
    data[len(data) // 2] ^= 0x10
    fn.write_bytes(data)


def _truncated(p: Path, fn: Path) -> None:
    fn.write_bytes(fn.read_bytes()[:1000])


def _group_writable(p: Path, fn: Path) -> None:
    fn.chmod(0o664)


IGNORED = {  # how the prebuilt index goes wrong -> what --timings says about it
    "stale": (_stale, "made from other bytes (a stale or foreign index)"),
    "another size": (_other_size, "made for a file of another size"),
    "damaged": (_damaged, "not an index of this format"),
    "truncated": (_truncated, "not an index of this format"),
    "group-writable": (_group_writable, "writable by group or others (mode 664)"),
}


@pytest.mark.parametrize("what", sorted(IGNORED))
def test_wrong_prebuilt_index_is_ignored_and_kept(cache, qwen_tok_file, prebuilt, tmp_path,
                                                  what):
    p = model_in(tmp_path, qwen_tok_file, prebuilt)
    fn = Path(f"{p}.rxi")
    assert open_model_file(p).index_state == "prebuilt"
    spoil, why = IGNORED[what]
    spoil(p, fn)
    kept = fn.read_bytes()
    h = open_model_file(p)
    assert h.index_state == "miss" and h.index_ignored == f"{fn}: {why}"
    assert why in h.index_note
    assert fn.read_bytes() == kept  # not ours to delete or rewrite
    gguf_index.write_pending()  # the user cache takes over
    h = open_model_file(p)
    assert h.index_state == "hit" and why in h.index_note  # --timings still says why
    assert fn.read_bytes() == kept


@pytest.mark.parametrize("what", ["fifo", "symlink", "directory"])
def test_special_file_at_the_prebuilt_path_is_ignored(cache, qwen_tok_file, prebuilt, tmp_path,
                                                      what):
    p = model_in(tmp_path / "m", qwen_tok_file)
    valid = tmp_path / "valid.rxi"
    valid.write_bytes(prebuilt)
    fn = Path(f"{p}.rxi")
    if what == "fifo":  # opening it would block: it must be refused unopened
        os.mkfifo(fn)
    elif what == "symlink":  # even to a valid index: never followed
        fn.symlink_to(valid)
    else:
        fn.mkdir()
    h = open_model_file(p)
    assert h.index_state == "miss" and h.index_ignored == f"{fn}: not a readable regular file"
    assert os.path.lexists(fn)


def test_trust_follows_the_model(tmp_path):
    me, model_owner, other = os.geteuid(), 4242, 4343
    model = os.stat_result((0o100644, 0, 0, 1, model_owner, 0, 10, 0, 0, 0))

    def index(uid: int, mode: int = 0o644) -> os.stat_result:
        return os.stat_result((0o100000 | mode, 0, 0, 1, uid, 0, 10, 0, 0, 0))

    for uid in (0, me, model_owner):
        assert gguf_index._trusted(index(uid), model, read_only=False) is None
    assert "owned by uid 4343" in gguf_index._trusted(index(other), model, read_only=False)
    assert "mode 646" in gguf_index._trusted(index(me, 0o646), model, read_only=False)
    # on a read-only mount nobody can change it, whoever owns it
    assert gguf_index._trusted(index(other, 0o666), model, read_only=True) is None


def test_no_index_env_ignores_prebuilt_indexes(cache, qwen_tok_file, prebuilt, tmp_path,
                                               monkeypatch):
    p = model_in(tmp_path, qwen_tok_file, prebuilt)
    monkeypatch.setenv("REFLEX_NO_INDEX", "1")
    assert open_model_file(p).index_state == "off"


# ----------------------------------------------------------------------------------------------
# The command, and the runs after it


def generate(model, env: dict) -> subprocess.CompletedProcess:
    r = reflex("generate", str(model), PROMPT, "-n", "3", "--backend", "cpu", "--json",
               "--timings", env=env)
    assert r.returncode == 0, r.stderr
    return r


def index_line(r: subprocess.CompletedProcess) -> str:
    return next(line for line in r.stderr.splitlines() if "gguf index:" in line).strip()


def test_reflex_index_then_runs_use_it(qwen_tok_file, tmp_path):
    import json

    p = model_in(tmp_path / "models", qwen_tok_file)
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg"), "REFLEX_NO_INDEX": "",
           gguf_index.PREBUILT_DIR_ENV: ""}
    plain = generate(p, {**env, "REFLEX_NO_INDEX": "1"})
    r = reflex("index", str(p), env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1].startswith("REFLEX_INDEX_OK n_indexes=1 bytes=")
    run = generate(p, env)
    assert index_line(run) == f"gguf index: hit, prebuilt {p}.rxi (parse and tokenizer tables)"
    keep = ("text", "token_ids", "prompt_token_ids")
    assert {k: json.loads(run.stdout)[k] for k in keep} == \
        {k: json.loads(plain.stdout)[k] for k in keep}
    time.sleep(0.5)  # a detached index writer would have been started at exit: there is none
    assert not (tmp_path / "xdg" / "reflex" / "index").exists()
    # into a folder, named to runs by the variable the command prints
    r = reflex("index", str(p), "--out", str(tmp_path / "idx"), "--json", env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)["indexes"][0]
    assert out["index"] == str(tmp_path / "idx" / "m.gguf.rxi") and out["tokenizer_tables"]
    os.unlink(f"{p}.rxi")
    run = generate(p, {**env, **out["env"]})
    assert index_line(run) == f"gguf index: hit, prebuilt {out['index']} (parse and tokenizer " \
                              "tables)"
    # the model replaced: the index is ignored, and --timings says why
    rename_model(p)
    run = generate(p, {**env, **out["env"]})
    assert index_line(run) == (f"gguf index: miss, no index (full parse; the user cache's is "
                               f"written at exit; prebuilt {out['index']}: made from other bytes "
                               f"(a stale or foreign index))")


def test_unwritable_cache_never_fails_a_run(qwen_tok_file, tmp_path):
    # Every folder of the cache fails to be created (its parent is a file: ENOTDIR, as a
    # read-only root file system's EROFS): the run works without a cache.
    p = model_in(tmp_path / "models", qwen_tok_file)
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    env = {"XDG_CACHE_HOME": str(blocker / "cache"), "REFLEX_NO_INDEX": "",
           gguf_index.PREBUILT_DIR_ENV: ""}
    assert index_line(generate(p, env)).startswith("gguf index: miss, no index")
    assert reflex("index", str(p), env=env).returncode == 0
    assert index_line(generate(p, env)).startswith("gguf index: hit, prebuilt")


def test_index_command_errors_are_one_line(tmp_path, qwen_tok_file):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + bytes(20))
    assert one_line_error(reflex("index", str(bad))).startswith("error: ")
    assert not Path(f"{bad}.rxi").exists()
    p = model_in(tmp_path / "models", qwen_tok_file)
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    line = one_line_error(reflex("index", str(p), "--out", str(blocker / "idx")))
    assert line.startswith(f"error: cannot write the index {blocker / 'idx' / 'm.gguf.rxi'}: ")
    assert "REFLEX_INDEX_DIR" in line
    # two models of one file name would share --out's NAME.rxi: refused before either is written
    q = model_in(tmp_path / "other", qwen_tok_file)
    line = one_line_error(reflex("index", str(p), str(q), "--out", str(tmp_path / "idx")))
    assert "would share --out's index m.gguf.rxi" in line
    assert not (tmp_path / "idx").exists()
