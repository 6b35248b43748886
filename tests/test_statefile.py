"""State files (--export-kv / --import-kv, reflex_core.statefile) on the CPU backend: a resumed
job is the uninterrupted one for every family, prefix files prefill only the new tokens, system1
continues an imported prefix, and every bad file or target is refused in one line with nothing
changed on disk. Cross-backend files: tests/gpu/test_statefile_gpu.py."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

from reflex_core import engine, statefile, system1
from reflex_core.errors import ReflexError
from reflex_core.sampling import SamplingParams
from reflex_core.testing.modelwriter import (ModelShape, tiny_deepseek2_shape, tiny_qwen35_shape,
                                             tiny_qwen35moe_shape)

from test_cli import one_line_error, reflex

GREEDY = SamplingParams(0.0, 0, 1.0, None)
PROMPT = [5, 9, 17, 3, 44, 12, 7]
# seeds whose greedy continuation of PROMPT is not one token repeated
FAMILIES = {
    "qwen3": (ModelShape(n_vocab=200), 1),
    "qwen3moe": (ModelShape(arch="qwen3moe", n_expert=8, n_expert_used=2, n_ff_exp=64,
                            n_vocab=200), 3),
    "qwen35": (tiny_qwen35_shape(), 1),
    "qwen35moe": (tiny_qwen35moe_shape(), 3),
    "deepseek2": (tiny_deepseek2_shape(), 2),
}


@pytest.fixture(scope="module")
def loaded(model_files):
    cache: dict = {}

    def get(family: str, seed: int | None = None):
        shape, default_seed = FAMILIES[family]
        key = (family, seed)
        if key not in cache:
            path = model_files(shape, seed=default_seed if seed is None else seed)
            cache[key] = engine.load(str(path), "cpu")[0]
        return cache[key]

    return get


def export(lm, path, res) -> None:
    statefile.write(str(path), lm, res.state.dump(), res.fed, res.pending)


def imported(lm, path) -> statefile.Saved:
    saved = statefile.read(str(path))
    statefile.check_model(saved, lm)
    return saved


def assert_states_close(a, b) -> None:
    da, db = a.dump(), b.dump()
    assert {k: v for k, v in da.items() if k != "data"} == \
           {k: v for k, v in db.items() if k != "data"}
    for name in da["data"]:
        np.testing.assert_allclose(np.frombuffer(da["data"][name], np.float32),
                                   np.frombuffer(db["data"][name], np.float32),
                                   rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_resume_equals_uninterrupted(loaded, tmp_path, family):
    lm = loaded(family)
    full = engine.generate(lm, PROMPT, 8, GREEDY, keep_state=True)
    assert len(set(full.token_ids)) > 1, full.token_ids  # a continuation worth comparing
    first = engine.generate(lm, PROMPT, 4, GREEDY, keep_state=True)
    assert first.pending == first.token_ids[-1:] and first.fed == PROMPT + first.token_ids[:3]
    f = tmp_path / "s.rxs"
    export(lm, f, first)
    saved = imported(lm, f)
    assert (saved.tokens, saved.pending) == (first.fed, first.pending)
    rest = engine.generate(lm, [], 4, GREEDY, resume=saved, keep_state=True)
    assert first.token_ids + rest.token_ids == full.token_ids
    assert (rest.n_prefill, rest.n_imported) == (1, len(PROMPT) + 3)
    assert_states_close(rest.state, full.state)  # the whole state, not only the argmax


@pytest.mark.parametrize("family", ["qwen3", "qwen35", "deepseek2"])
def test_prefix_file_then_prompt(loaded, tmp_path, family):
    lm = loaded(family)
    whole = engine.generate(lm, PROMPT, 5, GREEDY)
    k = 4
    pre = engine.generate(lm, PROMPT[:k], 0, GREEDY, keep_state=True)
    assert pre.token_ids == [] and pre.n_prefill == k - 1
    assert (pre.fed, pre.pending) == (PROMPT[:k - 1], PROMPT[k - 1:k])
    f = tmp_path / "prefix.rxs"
    export(lm, f, pre)
    res = engine.generate(lm, PROMPT[k:], 5, GREEDY, resume=imported(lm, f))
    assert res.token_ids == whole.token_ids
    assert (res.n_prefill, res.n_imported) == (1 + len(PROMPT) - k, k - 1)
    with pytest.raises(ReflexError, match="-n must be at least 1"):
        engine.generate(lm, PROMPT, 0, GREEDY)  # -n 0 is for export only


@pytest.mark.parametrize("family", ["qwen3", "qwen35"])
def test_system1_with_an_imported_prefix(loaded, tmp_path, family):
    lm = loaded(family)
    cands = [[7], [11, 3, 50], [42, 42], [99, 0, 5, 6]]
    whole = system1.score(lm.model, lm.ops, PROMPT, cands)
    k = 3
    pre = engine.generate(lm, PROMPT[:k], 0, GREEDY, keep_state=True)
    f = tmp_path / "prefix.rxs"
    export(lm, f, pre)
    saved = imported(lm, f)
    # system1's prompt = the file's pending tokens + the new prompt's
    got = system1.score(lm.model, lm.ops, saved.pending + PROMPT[k:], cands, saved.dumped)
    np.testing.assert_allclose(got, whole, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["qwen3", "qwen35"])
def test_system1_exports_the_prompts_prefix(loaded, tmp_path, family):
    """system1 --export-kv writes the state before the prompt's last token: generating from
    that file is generating from the whole prompt, and the scores are system1's own."""
    lm = loaded(family)
    cands = [[7], [11, 3, 50]]
    got: list[dict] = []
    scores = system1.score(lm.model, lm.ops, PROMPT, cands, on_prefix=got.append)
    np.testing.assert_allclose(scores, system1.score(lm.model, lm.ops, PROMPT, cands),
                               rtol=1e-5, atol=1e-5)
    f = tmp_path / "s1.rxs"
    statefile.write(str(f), lm, got[0], PROMPT[:-1], PROMPT[-1:])
    res = engine.generate(lm, [], 5, GREEDY, resume=imported(lm, f))
    assert res.token_ids == engine.generate(lm, PROMPT, 5, GREEDY).token_ids


# ----------------------------------------------------------------------------------------------
# refusals: one line, the file unchanged, nothing left behind


@pytest.fixture()
def good_file(loaded, tmp_path):
    lm = loaded("qwen3")
    f = tmp_path / "good.rxs"
    export(lm, f, engine.generate(lm, PROMPT, 3, GREEDY, keep_state=True))
    return lm, f


def snapshot_dir(d):
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in d.iterdir() if p.is_file()}


def refused(d, match: str, fn, *args, **kw):
    before = snapshot_dir(d)
    with pytest.raises(ReflexError, match=match) as e:
        fn(*args, **kw)
    assert "\n" not in str(e.value)
    assert snapshot_dir(d) == before  # same names (no temp file), bytes and mtimes
    return str(e.value)


def test_other_model_or_architecture_is_refused(loaded, good_file, tmp_path):
    _, f = good_file
    saved = statefile.read(str(f))
    refused(tmp_path, "written for another model file", statefile.check_model, saved,
            loaded("qwen3", seed=5))
    msg = refused(tmp_path, "a state of a qwen3 model; this model is qwen35",
                  statefile.check_model, saved, loaded("qwen35"))
    assert str(f) in msg


def test_damaged_files_are_refused(good_file, tmp_path):
    _, f = good_file
    data = f.read_bytes()
    body_end = len(data) - 4 * ((len(data) + statefile.CHUNK - 1) // statefile.CHUNK)
    cases = {
        "version": (data[:8] + struct.pack("<I", 1) + data[12:], "format version 1; this "
                    "Reflex reads version 2"),
        "magic": (b"NOTSTATE" + data[8:], "not a Reflex state file"),
        "truncated": (data[:-7], "truncated or damaged"),
        "longer": (data + b"\0", "truncated or damaged"),
        "empty": (b"", "not a Reflex state file"),
        "flip in data": (data[:body_end - 5] + bytes([data[body_end - 5] ^ 4])
                         + data[body_end - 4:], "checksum does not match"),
        "flip in header": (data[:40] + bytes([data[40] ^ 1]) + data[41:],
                           "checksum does not match"),
        "flip in checksum": (data[:-1] + bytes([data[-1] ^ 0x80]), "checksum does not match"),
    }
    for name, (blob, match) in cases.items():
        bad = tmp_path / f"bad-{name.replace(' ', '-')}.rxs"
        bad.write_bytes(blob)
        msg = refused(tmp_path, match, statefile.read, str(bad))
        assert str(bad) in msg, name
    refused(tmp_path, "No such file", statefile.read, str(tmp_path / "missing.rxs"))
    refused(tmp_path, "not a regular file", statefile.read, str(tmp_path))


def test_a_consistent_but_lying_header_is_refused(good_file, tmp_path):
    """A header whose sizes disagree with its bookkeeping, its checksum recomputed (a forged or
    buggy writer): refused before any buffer is used."""
    lm, f = good_file
    saved = statefile.read(str(f))
    d = dict(saved.dumped)
    d["data"] = {k: bytes(v) for k, v in d["data"].items()}
    bad = tmp_path / "lying.rxs"
    statefile.write(str(bad), lm, d, saved.tokens[:-1], saved.pending)  # one token short
    refused(tmp_path, "bookkeeping does not match its tokens", statefile.read, str(bad))


def forged(src, dst, edit=None, extra_data=b"", halve=False):
    """``src``'s state file written again to ``dst`` with its checksums recomputed: the header
    through ``edit(header)``, each buffer's bytes cut to half with ``halve`` (a 2-byte dtype's
    size), ``extra_data`` appended to the data section."""
    blob = src.read_bytes()
    magic, version, hlen, dlen = statefile._PREFIX.unpack_from(blob)
    base = statefile._PREFIX.size
    h = json.loads(blob[base:base + hlen])
    data = blob[base + hlen:base + hlen + dlen]
    if halve:
        parts, off = [], 0
        for entry in h["data"]:
            parts.append(data[entry[1]:entry[1] + entry[2] // 2])
            entry[1], entry[2] = off, entry[2] // 2
            off += entry[2]
        data = b"".join(parts)
    if edit:
        edit(h)
    data += extra_data
    head = json.dumps(h).encode()
    pieces = [statefile._PREFIX.pack(magic, version, len(head), len(data)), head, data]
    crcs = statefile._chunk_crcs(pieces)
    dst.write_bytes(b"".join(pieces) + struct.pack(f"<{len(crcs)}I", *crcs))
    return dst


def test_forged_headers_are_refused(good_file, tmp_path):
    """Headers that pass the checksum (recomputed) but not the checks: the bookkeeping of more
    than the one sequence, data bytes no buffer holds, another state dtype than the backend's,
    a token id at the vocabulary's size."""
    lm, f = good_file
    assert statefile.read(str(forged(f, tmp_path / "same.rxs"))).tokens == \
        statefile.read(str(f)).tokens  # the forger itself changes nothing

    def seqs(h):
        h["seqs"] = [h["seqs"][0][:3] + [h["seqs"][0][3] - 1]]
    refused(tmp_path, "bookkeeping does not match", statefile.read,
            str(forged(f, tmp_path / "seqs.rxs", seqs)))
    refused(tmp_path, "data bytes, the buffers need", statefile.read,
            str(forged(f, tmp_path / "extra.rxs", extra_data=bytes(64))))
    saved = statefile.read(str(forged(f, tmp_path / "f16.rxs", lambda h: h.update(dtype="f16"),
                                      halve=True)))
    refused(tmp_path, "holds f16 state; the cpu backend keeps f32", statefile.check_model,
            saved, lm)

    def vocab_id(h):
        h["tokens"][-1] = lm.model.n_vocab
    saved = statefile.read(str(forged(f, tmp_path / "vocab.rxs", vocab_id)))
    refused(tmp_path, "outside this model's vocabulary", statefile.check_model, saved, lm)


def test_prefix_longer_than_the_context_is_refused(model_files, tmp_path):
    path = model_files(ModelShape(n_vocab=200, context_length=12), seed=1)
    lm = engine.load(str(path), "cpu")[0]
    f = tmp_path / "p.rxs"
    export(lm, f, engine.generate(lm, PROMPT + PROMPT[:3], 0, GREEDY, keep_state=True))
    saved = imported(lm, f)
    refused(tmp_path, r"the imported state \(9 tokens\) \+ prompt \(3 tokens\) \+ 1 new tokens "
                      r"exceeds the model's context length \(12 tokens\)",
            engine.generate, lm, [1, 2], 1, GREEDY, resume=saved)
    with pytest.raises(ReflexError, match="imported state .* exceed the model's context"):
        system1.score(lm.model, lm.ops, saved.pending + [1], [[2, 3, 4]], saved.dumped)


def test_empty_prompt_with_nothing_pending_is_refused(good_file, tmp_path):
    lm, f = good_file
    saved = statefile.read(str(f))
    saved = saved._replace(tokens=saved.tokens, pending=[])
    refused(tmp_path, "has no pending token and the prompt is empty", engine.generate, lm, [],
            2, GREEDY, resume=saved)


def test_export_targets_that_cannot_be_written(good_file, tmp_path):
    lm, f = good_file
    saved = statefile.read(str(f))
    missing = tmp_path / "no-such-folder" / "s.rxs"
    refused(tmp_path, "the folder .*no-such-folder does not exist", statefile.check_target,
            str(missing))
    refused(tmp_path, "it is a directory", statefile.check_target, str(tmp_path))
    if os.geteuid() == 0:  # root writes through mode bits: sysfs refuses any new file
        ro = "/sys/kernel"
        with pytest.raises(ReflexError, match="cannot write the state file"):
            statefile.write(f"{ro}/s.rxs", lm, saved.dumped, saved.tokens, saved.pending)
        assert not os.path.exists(f"{ro}/s.rxs")
    else:
        ro_dir = tmp_path / "ro"
        ro_dir.mkdir()
        ro_dir.chmod(0o555)
        refused(ro_dir, "is not writable", statefile.check_target, str(ro_dir / "s.rxs"))
        with pytest.raises(ReflexError, match="Permission denied"):
            statefile.write(str(ro_dir / "s.rxs"), lm, saved.dumped, saved.tokens, saved.pending)
        assert list(ro_dir.iterdir()) == []


def test_export_into_streams_links_and_odd_paths(good_file, tmp_path):
    """A character device or a FIFO is written into (llama.cpp's fopen does the same), never
    replaced by a regular file; a symlink's file is replaced and the link stays; a socket and
    paths no system call takes are refused in one line."""
    import socket
    import threading

    lm, f = good_file
    saved = statefile.read(str(f))
    data = f.read_bytes()

    def write(path):
        statefile.check_target(str(path))
        return statefile.write(str(path), lm, saved.dumped, saved.tokens, saved.pending)

    assert write("/dev/null") == len(data)
    assert os.path.exists("/dev/null") and not os.path.isfile("/dev/null")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(ReflexError, match="a FIFO with no reader"):  # at once, no hang
        write(fifo)
    got: list = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    for _ in range(1000):  # until the reader's open has begun
        try:
            write(fifo)
            break
        except ReflexError as e:
            assert "no reader" in str(e)
            time.sleep(0.01)
    reader.join(30)
    assert got == [data] and fifo.is_fifo()
    real = tmp_path / "real.rxs"
    real.write_bytes(b"old")
    link = tmp_path / "link.rxs"
    link.symlink_to(real)
    write(link)
    assert link.is_symlink() and real.read_bytes() == data
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(tmp_path / "s.sock"))
        refused(tmp_path, "it is a socket", statefile.check_target, str(tmp_path / "s.sock"))
    finally:
        sock.close()
    refused(tmp_path, "NUL byte", statefile.check_target, str(tmp_path / "a\0b"))
    refused(tmp_path, "not valid text", statefile.check_target, str(tmp_path / "\ud800"))


def test_a_fine_tune_of_the_same_layout_is_another_model(loaded, tmp_path):
    """Files alike but for one tensor's values (a fine-tune, or a merged LoRA that keeps the
    header): whichever tensor it is, the fingerprint differs, so a state of one is refused by
    the other."""
    from reflex_core.gguf import open_gguf

    lm = loaded("qwen3")
    base = open(lm.path, "rb").read()
    g = open_gguf(lm.path)
    fa = statefile.fingerprint(g)
    for ti in g.tensors.values():
        raw = bytearray(base)
        raw[ti.offset:ti.offset + ti.nbytes] = bytes(x ^ 0x01 for x in
                                                     raw[ti.offset:ti.offset + ti.nbytes])
        b = tmp_path / "b.gguf"
        b.write_bytes(bytes(raw))
        fb = statefile.fingerprint(open_gguf(str(b)))
        assert fb.split(":")[:2] == fa.split(":")[:2]  # the same header and directory
        assert fb != fa, ti.name


def test_large_state_round_trip_over_several_checksum_chunks(good_file, tmp_path, monkeypatch):
    """Chunks split inside buffers and across them; every one is checked."""
    lm, f = good_file
    saved = statefile.read(str(f))
    monkeypatch.setattr(statefile, "CHUNK", 1000)
    g = tmp_path / "chunked.rxs"
    statefile.write(str(g), lm, saved.dumped, saved.tokens, saved.pending)
    assert g.stat().st_size > 5 * 1000
    back = statefile.read(str(g))
    assert back.tokens == saved.tokens
    assert {k: bytes(v) for k, v in back.dumped["data"].items()} == \
           {k: bytes(v) for k, v in saved.dumped["data"].items()}
    data = bytearray(g.read_bytes())
    data[5000] ^= 1
    g.write_bytes(bytes(data))
    with pytest.raises(ReflexError, match="checksum"):
        statefile.read(str(g))


# ----------------------------------------------------------------------------------------------
# the command line


def run_json(*args):
    p = reflex(*args, "--backend", "cpu", "--json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout), p.stderr


def test_cli_resume_prefix_and_system1(qwen_tok_file, tmp_path):
    m = str(qwen_tok_file)
    text = "The capital of France is"
    full, _ = run_json("generate", m, text, "-n", "6")
    f = tmp_path / "a.rxs"
    a, _ = run_json("generate", m, text, "-n", "3", "--export-kv", str(f))
    b, err = run_json("generate", m, "", "-n", "3", "--import-kv", str(f), "--timings")
    assert a["token_ids"] + b["token_ids"] == full["token_ids"]
    assert (b["n_prefill"], b["n_imported_tokens"]) == (1, 5 + 2)
    assert "read state file" in err and "prefill: 1 tokens after 7 imported" in err

    pre = tmp_path / "prefix.rxs"
    p0, err = run_json("generate", m, "The capital of", "-n", "0", "--export-kv", str(pre),
                       "--timings")
    assert p0["token_ids"] == [] and p0["n_prefill"] == 2 and "write state file" in err
    c, _ = run_json("generate", m, " France is", "-n", "6", "--import-kv", str(pre))
    assert p0["prompt_token_ids"] + c["prompt_token_ids"] == full["prompt_token_ids"]
    assert c["token_ids"] == full["token_ids"] and c["n_prefill"] == 1 + 2

    cands = ["-c", " Paris", "-c", " London", "-c", " a big city"]
    s_full, _ = run_json("system1", m, text, *cands)
    s_imp, _ = run_json("system1", m, " France is", *cands, "--import-kv", str(pre))
    np.testing.assert_allclose([x["score"] for x in s_imp["candidates"]],
                               [x["score"] for x in s_full["candidates"]], rtol=1e-5, atol=1e-5)
    assert s_imp["n_prefill"] == 3 and s_imp["n_imported_tokens"] == 2
    s1f = tmp_path / "s1.rxs"
    run_json("system1", m, text, *cands, "--export-kv", str(s1f))
    d, _ = run_json("generate", m, "", "-n", "6", "--import-kv", str(s1f))
    assert d["token_ids"] == full["token_ids"] and d["n_prefill"] == 1


def test_cli_refusals(qwen_tok_file, model_files, tmp_path):
    m = str(qwen_tok_file)
    f = tmp_path / "a.rxs"
    assert reflex("generate", m, "Hello", "-n", "2", "--backend", "cpu", "--export-kv",
                  str(f)).returncode == 0
    other = str(model_files(ModelShape(n_layer=1), tokenizer="qwen3", seed=9))
    before = snapshot_dir(tmp_path)
    line = one_line_error(reflex("generate", other, "x", "--backend", "cpu", "--import-kv",
                                 str(f)))
    assert "written for another model file" in line and str(f) in line
    line = one_line_error(reflex("generate", m, "x", "--backend", "cpu", "--import-kv",
                                 str(tmp_path / "nope.rxs")))
    assert "cannot read the state file" in line
    line = one_line_error(reflex("generate", m, "x", "--backend", "cpu", "--export-kv",
                                 str(tmp_path / "no" / "s.rxs")))
    assert "does not exist" in line
    p = reflex("generate", m, "x", "-n", "0", "--backend", "cpu")
    assert p.returncode == 2 and "0 only with --export-kv" in p.stderr
    assert snapshot_dir(tmp_path) == before


def test_state_of_other_lora_adapters_is_refused(model_files, tmp_path):
    """The state depends on the weights: a file written with an adapter merged is refused
    without it, with another scale, and the other way round."""
    from reflex_core.testing.lorawriter import random_pairs, write_adapter

    shape, seed = FAMILIES["qwen3"]
    base = str(model_files(shape, seed=seed))
    ad = write_adapter(tmp_path / "a.gguf", "qwen3",
                       random_pairs(base, ["blk.0.attn_q.weight"], rank=4, seed=1))
    with_a = engine.load(base, "cpu", lora=[(ad, 1.0)])[0]
    half = engine.load(base, "cpu", lora=[(ad, 0.5)])[0]
    plain = engine.load(base, "cpu")[0]
    for writer, reader in ((with_a, plain), (with_a, half), (plain, with_a)):
        res = engine.generate(writer, PROMPT, 2, GREEDY, keep_state=True)
        f = tmp_path / "s.rxs"
        export(writer, f, res)
        saved = statefile.read(str(f))
        refused(tmp_path, "LoRA adapter", statefile.check_model, saved, reader)
        statefile.check_model(saved, writer)  # its own job accepts it
        f.unlink()


def test_an_interrupt_during_the_write_leaves_no_temporary_file(tmp_path):
    """Ctrl-C while a state file is written (the signal handler ends the process at once with
    os._exit, so no ``finally`` runs): exit 130, no target, no hidden temporary file."""
    script = f"""
import os, signal
from reflex_core import lifecycle, statefile
lifecycle.handle_signals()
def interrupted(fd):
    os.kill(os.getpid(), signal.SIGINT)
    raise AssertionError("the handler did not end the process")
statefile.os.fsync = interrupted
statefile._write_atomic({str(tmp_path / "s.rxs")!r}, [b"x" * 1000])
"""
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=60, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert p.returncode == 130 and p.stderr == "error: interrupted\n", p.stderr
    assert list(tmp_path.iterdir()) == []
