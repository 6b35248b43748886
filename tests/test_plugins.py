"""The plugin contract: hooks, entry-point discovery, conflicts, unknown architectures, and a
third-party architecture plugin defined right here, run end to end through the engine."""

from __future__ import annotations

import os
import json
import shlex
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from reflex_core import hookspecs, registry
from reflex_core.errors import PluginConflict, ReflexError, UnsupportedArchitecture
from reflex_core.plugin_api import (ArchSpec, Batch, Meta, Model, OpDef, StateSpec, blocks,
                                    hookimpl)
from reflex_core.sampling import SamplingParams

# --------------------------------------------------------------------------------------------
# A third-party architecture, "toylm": embedding -> RMSNorm -> SwiGLU FFN (residual) -> LM head.
# Written only against reflex_core.plugin_api, as an out-of-tree plugin would be.

TOY = "toylm"


class ToyLM(Model):
    arch = TOY

    def __init__(self, gguf, ops):
        super().__init__(gguf, ops)
        meta = Meta(gguf, TOY)
        self.eps = meta.f32("attention.layer_norm_rms_epsilon")
        self.n_vocab = meta.u32("vocab_size")
        self.n_ctx_train = meta.u32("context_length")
        self.embd = ops.weight("token_embd.weight")
        self.ffn_norm = ops.weight("blk.0.ffn_norm.weight")
        self.gate = ops.weight("blk.0.ffn_gate.weight")
        self.up = ops.weight("blk.0.ffn_up.weight")
        self.down = ops.weight("blk.0.ffn_down.weight")
        self.out_norm = ops.weight("output_norm.weight")

    def state_spec(self):
        return StateSpec(())  # no attention, no recurrence: nothing to keep

    def forward(self, batch: Batch, state, out_rows):
        ops = self.ops
        pb = ops.prepare(batch)
        x = ops.embed(self.embd, pb)
        h = ops.rmsnorm(x, self.ffn_norm, self.eps)
        x = ops.add(x, blocks.swiglu_ffn(ops, h, self.gate, self.up, self.down))
        return blocks.lm_head(ops, x, self.out_norm, self.embd, self.eps, out_rows)


class ToyPlugin:
    @hookimpl
    def reflex_register_architectures(self, register):
        register(ArchSpec(name=TOY, model=f"{__name__}:ToyLM", description="test-only toy LM"))


def write_toy(path, d=16, ff=24, v=40, seed=0):
    import gguf

    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), TOY)
    w.add_uint32(f"{TOY}.vocab_size", v)
    w.add_uint32(f"{TOY}.context_length", 64)
    w.add_float32(f"{TOY}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_string("tokenizer.ggml.model", "none")
    t = {
        "token_embd.weight": rng.normal(0, 0.5, (v, d)),
        "blk.0.ffn_norm.weight": 1 + rng.normal(0, 0.1, d),
        "blk.0.ffn_gate.weight": rng.normal(0, 0.3, (ff, d)),
        "blk.0.ffn_up.weight": rng.normal(0, 0.3, (ff, d)),
        "blk.0.ffn_down.weight": rng.normal(0, 0.3, (d, ff)),
        "output_norm.weight": 1 + rng.normal(0, 0.1, d),
    }
    for name, a in t.items():
        w.add_tensor(name, a.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return t


def toy_reference(t, ids, eps=1e-6):
    def rms(x, wt):
        return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * wt

    x = t["token_embd.weight"][ids]
    h = rms(x, t["blk.0.ffn_norm.weight"])
    g, u = h @ t["blk.0.ffn_gate.weight"].T, h @ t["blk.0.ffn_up.weight"].T
    x = x + (g / (1 + np.exp(-g)) * u) @ t["blk.0.ffn_down.weight"].T
    return rms(x, t["output_norm.weight"]) @ t["token_embd.weight"].T


@pytest.fixture
def host():
    """A fresh plugin host (the process-wide one), with test plugins unregistered afterwards."""
    registry.reset_host()
    h = registry.get_host()
    yield h
    registry.reset_host()


def test_hookspecs_are_prefixed_typed_and_documented():
    names = [n for n in dir(hookspecs) if n.startswith("reflex_")]
    assert names == ["reflex_register_architectures", "reflex_register_commands",
                     "reflex_register_ops"]
    for n in names:
        fn = getattr(hookspecs, n)
        assert "Example::" in (fn.__doc__ or ""), n
        assert fn.__annotations__, n


def test_hook_reflex_register_architectures(host, tmp_path):
    """A third-party plugin registered at run time serves its architecture end to end."""
    from reflex_core import engine

    host.register(ToyPlugin(), name="undo-toy", version="9.9")
    path = tmp_path / "toy.gguf"
    t = write_toy(path)
    lm, _ = engine.load(str(path), "cpu")
    assert lm.arch == TOY and isinstance(lm.model, ToyLM)
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    st = lm.model.new_state(len(ids))
    logits = lm.model.forward(st.append(ids), st, range(len(ids)))
    np.testing.assert_allclose(lm.ops.to_numpy(logits), toy_reference(t, ids), rtol=1e-4, atol=1e-4)
    res = engine.generate(lm, ids, 5, SamplingParams())
    seq = list(ids)
    for _ in range(5):  # greedy continuation from the reference
        seq.append(int(np.argmax(toy_reference(t, seq)[-1])))
    assert res.token_ids == seq[len(ids):]
    info = {p.name: p for p in host.plugins()}["undo-toy"]
    assert info.version == "9.9" and [a.name for a in info.architectures] == [TOY]
    lm.close()  # frees the backend's weights and unmaps the file
    assert lm.gguf.closed and lm.model is None


def toy_scale_twin(ops, x, s):
    return (np.asarray(x, np.float32) * np.float32(s)).astype(np.float32)


class ToyOpsPlugin:
    @hookimpl
    def reflex_register_ops(self, register):
        register(OpDef("toy_scale", twin=f"{__name__}:toy_scale_twin"))


def test_hook_reflex_register_ops(host):
    """A plugin's op is called as ops.<name> on the CPU backend (its twin); a second definition
    of a taken name, or of a core op's name, is refused with one line."""
    from reflex_core import opreg
    from reflex_core.backends.numpy_backend import NumpyOps

    host.register(ToyOpsPlugin(), name="undo-toyops")
    try:
        host.register_ops()
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        np.testing.assert_array_equal(NumpyOps().toy_scale(x, 2.5), x * np.float32(2.5))
        host.register_ops()  # the same definitions again: fine
        with pytest.raises(PluginConflict, match="'toy_scale' of plugin other is already "
                                                 "registered by undo-toyops"):
            opreg.register(OpDef("toy_scale", twin="elsewhere:f"), "other")
        with pytest.raises(PluginConflict, match="'rmsnorm' of plugin other is already "
                                                 "registered by reflex_core"):
            opreg.register(OpDef("rmsnorm", twin="elsewhere:f"), "other")
        with pytest.raises(AttributeError):
            NumpyOps().no_such_op
    finally:
        opreg.unregister("toy_scale")
    assert opreg.get("toy_scale") is None


def test_hook_reflex_register_commands(host):
    import click

    from reflex_core.cli import ReflexGroup, cli

    class CommandPlugin:
        @hookimpl
        def reflex_register_commands(self, cli):
            @cli.command(name="toy-hello")
            def hello():
                click.echo("hello from a plugin")

    host.register(CommandPlugin(), name="undo-cmd")
    ReflexGroup._plugin_commands_loaded = False
    try:
        res = CliRunner().invoke(cli, ["toy-hello"])
        assert res.exit_code == 0, res.output
        assert res.output.strip() == "hello from a plugin"
    finally:
        cli.commands.pop("toy-hello", None)
        ReflexGroup._plugin_commands_loaded = False


def test_two_plugins_claiming_one_architecture_is_an_error_naming_both(host):
    class Other:
        @hookimpl
        def reflex_register_architectures(self, register):
            register(ArchSpec(name=TOY, model="x:Y"))

    host.register(ToyPlugin(), name="undo-toy-a")
    host.register(Other(), name="undo-toy-b")
    with pytest.raises(PluginConflict) as e:
        host.resolve(TOY)
    msg = str(e.value)
    assert "undo-toy-a" in msg and "undo-toy-b" in msg and TOY in msg and "\n" not in msg


def test_unknown_architecture_names_it_the_installed_plugins_and_what_to_install(monkeypatch):
    # every family's plugin is installed here: leave deepseek_mla out as if it were not
    found = [ep for ep in registry.discover_entry_points()
             if ep.dist != "reflex-infer-deepseek-mla"]
    monkeypatch.setattr(registry, "discover_entry_points", lambda: found)
    registry.reset_host()
    host = registry.get_host()
    with pytest.raises(UnsupportedArchitecture) as e:
        host.resolve("deepseek2")
    msg = str(e.value)
    assert "'deepseek2'" in msg and "qwen3" in msg and "pip install reflex-infer-deepseek-mla" in msg
    # the advice runs as printed: this interpreter's pip, the dist or the source-tree folder
    advice = msg.split("install the plugin for it: ", 1)[1]
    assert shlex.split(advice.split(" (or")[0]) == [sys.executable, "-m", "pip", "install",
                                                    "reflex-infer-deepseek-mla"], advice
    assert "-m pip install plugins/deepseek_mla)" in advice
    assert "\n" not in msg
    with pytest.raises(UnsupportedArchitecture) as e:
        host.resolve("mamba9")
    assert "'mamba9'" in str(e.value)
    registry.reset_host()


@pytest.mark.parametrize("var, value, why", [
    ("REFLEX_DISABLE_PLUGINS", "qwen3", "REFLEX_DISABLE_PLUGINS='qwen3' disables it"),
    ("REFLEX_DISABLE_PLUGINS", "Reflex_Infer_Qwen3", "disables it"),
    ("REFLEX_LOAD_PLUGINS", "qwen3moe,deepseek2", "it is not in REFLEX_LOAD_PLUGINS="),
])
def test_filters_take_architecture_or_distribution_names_and_say_when_a_plugin_is_off(
        monkeypatch, capsys, var, value, why):
    monkeypatch.setenv(var, value)
    registry.reset_host()
    host = registry.get_host()
    with pytest.raises(UnsupportedArchitecture) as e:
        host.resolve("qwen3")
    msg = str(e.value)
    assert "installed but not loaded" in msg and why in msg and "pip install" not in msg
    assert "\n" not in msg
    if var == "REFLEX_LOAD_PLUGINS":  # what the list names is served
        assert host.resolve("qwen3moe").name == "qwen3moe"
    else:  # only what the list names is off
        assert host.resolve("qwen35").name == "qwen35"
    assert capsys.readouterr().err == ""  # every name matched something
    registry.reset_host()


def test_a_filter_name_that_matches_nothing_gets_a_notice(monkeypatch, capsys):
    monkeypatch.setenv("REFLEX_DISABLE_PLUGINS", "qwen4,qwen3moe")
    registry.reset_host()
    host = registry.get_host()
    assert host.resolve("qwen3").name == "qwen3"
    err = capsys.readouterr().err
    assert err == ("notice: REFLEX_DISABLE_PLUGINS: 'qwen4' matches no installed plugin or "
                   "architecture\n")
    registry.reset_host()


def test_registering_something_that_is_not_an_archspec_fails_clearly(host):
    class Bad:
        @hookimpl
        def reflex_register_architectures(self, register):
            register(("qwen9", "x:Y"))

    host.register(Bad(), name="undo-bad")
    with pytest.raises(ReflexError, match="not an ArchSpec"):
        host.architectures()


def test_installed_plugins_are_discovered_by_entry_point(host):
    names = {ep.name: ep.value for ep in host.entry_points()}
    assert names.get("qwen3") == "reflex_qwen3.plugin"
    table = {}
    host.load_all()
    for info in host.plugins():
        for a in info.architectures:
            table[a.name] = info.name
    assert table["qwen3"] == "reflex-infer-qwen3"


def test_only_the_plugin_serving_the_file_is_imported(tmp_path):
    """Loading a qwen3 file imports reflex_qwen3 and no other installed plugin module."""
    from reflex_core.testing.modelwriter import ModelShape, write_model

    path = write_model(tmp_path / "q.gguf", ModelShape(), weight_type="F32")
    code = (
        "import sys; from reflex_core import engine\n"
        f"lm, _ = engine.load({str(path)!r}, 'cpu')\n"
        "mods = sorted(m for m in sys.modules if m.startswith('reflex_') and m != 'reflex_core'"
        " and not m.startswith('reflex_core.'))\n"
        "print(','.join(sorted({m.split('.')[0] for m in mods})))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "reflex_qwen3"


def test_load_plugins_allowlist_empty_loads_none(monkeypatch, host):
    monkeypatch.setenv("REFLEX_LOAD_PLUGINS", "")
    registry.reset_host()
    h = registry.get_host()
    assert h.entry_points() == []
    with pytest.raises(UnsupportedArchitecture,
                       match=r"not in REFLEX_LOAD_PLUGINS=.. \(enabled architectures: none\)"):
        h.resolve("qwen3")


def test_reflex_plugins_command_lists_versions_and_architectures(host):
    from reflex_core.cli import cli

    res = CliRunner().invoke(cli, ["plugins", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    q = [p for p in data if p["name"] == "reflex-infer-qwen3"][0]
    assert q["version"] and [a["name"] for a in q["architectures"]] == ["qwen3"]
    res = CliRunner().invoke(cli, ["plugins"])
    assert res.exit_code == 0 and "reflex-infer-qwen3" in res.output and "qwen3" in res.output


def test_entry_point_cache_is_used_and_invalidated(tmp_path, monkeypatch):
    """The discovery cache answers from disk while sys.path is unchanged, and rescans when a
    sys.path directory changes (an install/uninstall) or when disabled."""
    import importlib.metadata
    import os

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    first = registry.discover_entry_points()
    assert any(e.name == "qwen3" for e in first)
    assert (tmp_path / "cache" / "reflex" / "entry-points.json").exists()

    calls = []
    real = importlib.metadata.entry_points
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda **kw: calls.append(kw) or real(**kw))
    assert registry.discover_entry_points() == first and calls == []  # served from the cache
    (site / "new_dist-1.0.dist-info").mkdir()  # "pip install" into a sys.path directory
    st = os.stat(site)
    os.utime(site, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert registry.discover_entry_points() == first and len(calls) == 1  # rescanned
    monkeypatch.setenv("REFLEX_NO_PLUGIN_CACHE", "1")
    registry.discover_entry_points()
    assert len(calls) == 2


# --------------------------------------------------------------------------------------------
# The entry-point cache against a corrupt, crafted or stale file (finding "Plugin entry-point
# cache": `[]`/`null` in entry-points.json broke every command until deleted; the stamp only
# recorded sys.path directory mtimes, so an in-place edit of an entry_points.txt went unnoticed;
# a crafted cache file made Reflex import any module).


@pytest.fixture
def ep_cache(tmp_path, monkeypatch):
    """entry-points.json in a fresh cache (this process's and its subprocesses')."""
    from reflex_core import cachedir

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("REFLEX_NO_PLUGIN_CACHE", raising=False)
    monkeypatch.setattr(cachedir, "_refused", {}, raising=False)  # (raising: for old code)
    return tmp_path / "cache" / "reflex" / "entry-points.json"


@pytest.fixture
def scans(monkeypatch) -> list:
    """One item per full metadata scan (importlib.metadata.entry_points call)."""
    import importlib.metadata

    calls: list = []
    real = importlib.metadata.entry_points
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda **kw: calls.append(kw) or real(**kw))
    return calls


def pairs(entries) -> set:
    return {(e.name, e.value) for e in entries}


def valid_cache(ep_cache) -> dict:
    registry.discover_entry_points()
    return json.loads(ep_cache.read_bytes())


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize("content", [
    b"[]", b"null", b"{}", b"0", b'"x"', b"", b"\xff\xfe\x00", b"{not json", nested(100_000),
    b'{"stamp": null}', b'{"format": 2, "stamp": [], "entries": {}}',
], ids=lambda c: repr(c[:20]))
def test_a_malformed_entry_point_cache_is_discarded_rescanned_and_rewritten(
        ep_cache, scans, content):
    first = registry.discover_entry_points()
    ep_cache.write_bytes(content)
    assert registry.discover_entry_points() == first
    assert len(scans) == 2  # rescanned ...
    assert isinstance(json.loads(ep_cache.read_bytes()), dict)  # ... and rewritten
    assert registry.discover_entry_points() == first and len(scans) == 2  # a hit again


@pytest.mark.parametrize("entries", [
    [1], [[]], [["qwen3", "reflex_qwen3.plugin"]], [[1, 2, 3, 4, 5]], "entries", {"a": 1},
    [["qwen3", "reflex_qwen3.plugin", "reflex-infer-qwen3", "0.1.0", None, "extra"]],
])
def test_cache_entries_of_the_wrong_shape_are_discarded(ep_cache, scans, entries):
    data = valid_cache(ep_cache)
    data["entries"] = entries
    ep_cache.write_text(json.dumps(data))
    assert any(e.name == "qwen3" for e in registry.discover_entry_points()) and len(scans) == 2


@pytest.mark.parametrize("content", ["[]", "null"])
def test_reflex_plugins_works_with_a_broken_entry_point_cache(ep_cache, content):
    ep_cache.parent.mkdir(parents=True, mode=0o700)
    ep_cache.write_text(content)
    p = subprocess.run([sys.executable, "-m", "reflex_core", "plugins"], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert "reflex-infer-qwen3" in p.stdout


@pytest.fixture
def evil(tmp_path, monkeypatch):
    """A module on sys.path that records being imported: what a crafted cache points at."""
    folder = tmp_path / "evil"
    folder.mkdir()
    mark = tmp_path / "evil-was-imported"
    (folder / "evil_mod.py").write_text(f"open({str(mark)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(folder))
    yield mark
    sys.modules.pop("evil_mod", None)


def test_a_crafted_cache_cannot_make_reflex_import_another_module(ep_cache, evil, host):
    """Each cached entry's module swapped for one of the attacker's choosing (the stamp left
    valid): the cache is not trusted, the real plugins load, the crafted module is not
    imported."""
    data = valid_cache(ep_cache)
    for e in data["entries"]:
        e[1] = "evil_mod"
    ep_cache.write_text(json.dumps(data))
    registry.reset_host()
    h = registry.get_host()
    assert ("qwen3", "reflex_qwen3.plugin") in pairs(h.entry_points())
    h.resolve("qwen3")
    h.load_all()
    assert not evil.exists() and "evil_mod" not in sys.modules


def test_a_cached_entry_must_be_declared_by_its_installed_distribution(ep_cache, scans, tmp_path):
    """Entries that name a real module but a distribution, version or metadata folder that
    does not declare them are refused too: the cache only picks among installed entry points."""
    data = valid_cache(ep_cache)
    q = next(e for e in data["entries"] if e[0] == "qwen3")
    other = next(e for e in data["entries"] if e[0] == "qwen3moe")
    fake = tmp_path / "fake-1.0.dist-info"  # not in a sys.path folder
    fake.mkdir()
    (fake / "METADATA").write_text(f"Name: {q[2]}\nVersion: {q[3]}\n")
    (fake / "entry_points.txt").write_text("[reflex]\nqwen3 = evil_mod\n")
    for i, value in [(1, "reflex_qwen3_moe.plugin"), (2, "someone-else"), (3, "9.9"),
                     (4, other[4]), (4, str(fake)), (4, None)]:
        crafted = json.loads(json.dumps(data))
        next(e for e in crafted["entries"] if e[0] == "qwen3")[i] = value
        if i == 4 and value == str(fake):
            next(e for e in crafted["entries"] if e[0] == "qwen3")[1] = "evil_mod"
        ep_cache.write_text(json.dumps(crafted))
        n = len(scans)
        assert ("qwen3", "reflex_qwen3.plugin") in pairs(registry.discover_entry_points())
        assert len(scans) == n + 1, (i, value)  # not served from the crafted cache


def fake_dist(tmp_path, monkeypatch, name: str, entry_points: str):
    """A distribution ``name`` 1.0 on sys.path (a site folder of its own) with this
    entry_points.txt; returns the file."""
    site = tmp_path / "site"
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    dist = name.replace("_", "-")
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    ept = info / "entry_points.txt"
    ept.write_text(entry_points)
    monkeypatch.syspath_prepend(str(site))
    return ept


def edit_in_place(ept, mode: str, text: str) -> None:
    """Write ``text`` into ``ept`` (open mode "r+" or "a") in place: same inode, the folders'
    mtimes kept (not needed on Linux; makes "in place" explicit), the file's moved past a coarse
    clock's tick."""
    folders = [(p, os.stat(p)) for p in (ept.parent.parent, ept.parent)]
    with open(ept, mode) as f:
        f.write(text)
    for p, st in folders:
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    st = os.stat(ept)
    os.utime(ept, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


def test_an_entry_points_txt_edited_in_place_is_noticed(ep_cache, tmp_path, monkeypatch):
    ept = fake_dist(tmp_path, monkeypatch, "fake_dist", "[reflex]\nfakearch = fake_mod\n")
    assert ("fakearch", "fake_mod") in pairs(registry.discover_entry_points())
    assert ("fakearch", "fake_mod") in pairs(registry.discover_entry_points())  # cached
    edit_in_place(ept, "r+", "[reflex]\nfakearch = fake_mod.v2\n")
    assert ("fakearch", "fake_mod.v2") in pairs(registry.discover_entry_points())


def test_a_reflex_entry_added_in_place_to_another_distribution_is_noticed(ep_cache, tmp_path,
                                                                         monkeypatch):
    """A distribution with no reflex entry point, whose entry_points.txt gains one in place: the
    cache (which lists no entry of that folder to re-read) is stale by the file's stamp."""
    ept = fake_dist(tmp_path, monkeypatch, "other_dist",
                    "[console_scripts]\nother = other_mod:main\n")
    assert not any(e.name == "addedarch" for e in registry.discover_entry_points())
    registry.discover_entry_points()  # cached
    edit_in_place(ept, "a", "[reflex]\naddedarch = added_mod\n")
    assert ("addedarch", "added_mod") in pairs(registry.discover_entry_points())


def test_a_cache_written_by_another_interpreter_is_not_used(ep_cache, scans, monkeypatch):
    first = registry.discover_entry_points()
    assert registry.discover_entry_points() == first and len(scans) == 1  # a hit
    monkeypatch.setattr(sys, "executable", sys.executable + "-other")
    assert registry.discover_entry_points() == first and len(scans) == 2  # rescanned


def test_qwen35_plugin_alone_serves_qwen35_files_and_nothing_else(tmp_path):
    """With only reflex-infer-qwen35-hybrid loaded (as if installed alone): a qwen35 file loads,
    importing that plugin only; a qwen3 file is a one-line error naming what to install."""
    from reflex_core.testing.modelwriter import ModelShape, tiny_qwen35_shape, write_model

    q35 = write_model(tmp_path / "q35.gguf", tiny_qwen35_shape(), weight_type="F32")
    q3 = write_model(tmp_path / "q3.gguf", ModelShape(), weight_type="F32")
    code = (
        "import sys; from reflex_core import engine\n"
        f"lm, _ = engine.load({str(q35)!r}, 'cpu')\n"
        "mods = sorted(m for m in sys.modules if m.startswith('reflex_') and m != 'reflex_core'"
        " and not m.startswith('reflex_core.'))\n"
        "print(type(lm.model).__name__, ','.join(sorted({m.split('.')[0] for m in mods})))\n")
    env = dict(os.environ, REFLEX_LOAD_PLUGINS="reflex-infer-qwen35-hybrid")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "Qwen35 reflex_qwen35_hybrid"
    p = subprocess.run([sys.executable, "-m", "reflex_core", "generate", str(q3), "-n", "1",
                        "--backend", "cpu", "x"], capture_output=True, text=True, env=env)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1 and len(lines) == 1, p.stderr
    # (the other plugins are installed here, only left out: the error says so)
    assert "the plugin for architecture 'qwen3' is installed but not loaded" in lines[0], lines[0]
    assert "(enabled architectures: qwen35, qwen35moe)" in lines[0], lines[0]
    assert "Traceback" not in p.stderr
