"""The qwen3moe plugin without the oracle: the plugin contract (isolation from the qwen3 plugin),
the CLI on a qwen3moe file with the real Qwen3 tokenizer, system1 scores, the tree batch, and
one-line errors for malformed files."""

from __future__ import annotations

import ast
import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from reflex_core.errors import ModelError
from reflex_core.testing.modelwriter import ModelShape
from reflex_core.testing.oracle import load_model

ROOT = Path(__file__).resolve().parent.parent
# E=8, k=2, F_e=32: every ne0 a multiple of 32 (Q8_0)
SHAPE = ModelShape(arch="qwen3moe", n_layer=2, n_embd=64, n_head=4, n_head_kv=2, head_dim=32,
                   n_ff=96, n_expert=8, n_expert_used=2, n_ff_exp=32)


def reflex(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "reflex_core", *args], capture_output=True,
                          text=True, env=dict(os.environ), timeout=timeout)


def one_line_error(p: subprocess.CompletedProcess) -> str:
    assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    return lines[0]


@pytest.fixture(scope="module")
def tiny(model_files) -> Path:
    """A tiny qwen3moe model (Q8_0) with the real Qwen3 tokenizer."""
    return model_files(SHAPE, "Q8_0", seed=3, tokenizer="qwen3")


# --- the plugin contract ---------------------------------------------------------------------
def test_entry_point_and_reflex_plugins():
    p = reflex("plugins", "--json")
    assert p.returncode == 0, p.stderr
    data = {d["name"]: d for d in json.loads(p.stdout)}
    moe = data["reflex-infer-qwen3-moe"]
    assert moe["version"] and [a["name"] for a in moe["architectures"]] == ["qwen3moe"]
    assert [a["name"] for a in data["reflex-infer-qwen3"]["architectures"]] == ["qwen3"]
    from importlib.metadata import entry_points

    eps = {ep.name: ep.value for ep in entry_points(group="reflex")}
    assert eps["qwen3moe"] == "reflex_qwen3_moe.plugin"


@pytest.mark.parametrize("arch, loaded", [("qwen3moe", "reflex_qwen3_moe"),
                                          ("qwen3", "reflex_qwen3")])
def test_loading_a_file_imports_only_its_plugin(model_files, arch, loaded):
    """A qwen3moe file imports reflex_qwen3_moe and not reflex_qwen3, and vice versa."""
    shape = SHAPE if arch == "qwen3moe" else ModelShape()
    path = model_files(shape, "F32", seed=0)
    code = ("import sys; from reflex_core import engine\n"
            f"lm, _ = engine.load({str(path)!r}, 'cpu')\n"
            "print(type(lm.model).__module__)\n"
            "print(','.join(sorted({m.split('.')[0] for m in sys.modules"
            " if m.startswith('reflex_') and m.split('.')[0] != 'reflex_core'})))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    module, plugins = out.stdout.split()
    assert module == f"{loaded}.model" and plugins == loaded


@pytest.mark.parametrize("plugin", ["qwen3", "qwen3_moe"])
def test_plugins_import_only_the_plugin_api(plugin):
    """docs/internals.md: a plugin imports ``reflex_core.plugin_api`` only, never another
    plugin; what two plugins share lives in the core."""
    pkg = ROOT / "plugins" / plugin / f"reflex_{plugin}"
    files = sorted(pkg.glob("*.py"))
    assert files
    for f in files:
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""] if node.level == 0 else []
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                assert not (top.startswith("reflex_") and top != "reflex_core"), (f, name)
                assert top != "reflex_core" or name == "reflex_core.plugin_api", (f, name)


def test_model_module_is_cold_path_clean():
    """The GPU cold path imports the model class: no numpy, gguf or huggingface_hub."""
    code = ("import sys\n"
            "for m in ('numpy', 'gguf', 'huggingface_hub'): sys.modules[m] = None\n"
            "from reflex_core.registry import get_host\n"
            "cls = get_host().resolve('qwen3moe').load_model_class()\n"
            "print(cls.__module__, cls.__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["reflex_qwen3_moe.model", "Qwen3MoE"]


# --- the model on NumpyOps -------------------------------------------------------------------
def test_rows_and_tree_batch(model_files):
    """Logits of selected rows equal the full computation's; a tree batch (prompt + two
    candidates) gives each candidate the logits of its own causal run (routing is per token)."""
    m = load_model(model_files(SHAPE.replace(n_vocab=97), "F32", seed=3))
    assert not m.state_spec().recurrent and m.n_vocab == 97
    prompt, c1, c2 = [5, 9, 1, 44], [7, 8], [30, 31, 32]

    def causal(tokens):
        st = m.new_state(16)
        return m.forward(st.append(tokens), st, list(range(len(tokens))))

    full = causal(prompt + c1)
    st = m.new_state(8)
    np.testing.assert_allclose(m.forward(st.append(prompt + c1), st, [5, 1]),
                               full[[5, 1]], rtol=1e-6, atol=1e-6)
    st = m.new_state(16, 3)
    tree = m.forward(st.append_tree(prompt, {1: c1, 2: c2}), st, list(range(9)))
    np.testing.assert_allclose(tree[:6], full, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(tree[6:], causal(prompt + c2)[4:], rtol=1e-5, atol=1e-5)


# --- the CLI with the real tokenizer ---------------------------------------------------------
def test_generate(tiny):
    p = reflex("generate", str(tiny), "The capital of France is", "-n", "6", "--backend", "cpu")
    assert p.returncode == 0, p.stderr
    last = p.stdout.rstrip("\n").split("\n")[-1]
    m = re.fullmatch(r"REFLEX_GENERATE_OK process_start_to_first_token_ms=(\d+\.\d+) "
                     r"n_prompt_tokens=5 n_tokens=(\d+) backend=\"cpu\"", last)
    assert m and 1 <= int(m.group(2)) <= 6, last

    # greedy --json: every generated token is the argmax after its prefix (one causal pass)
    d = json.loads(reflex("generate", str(tiny), "The capital of France is", "-n", "6",
                          "--backend", "cpu", "--json").stdout)
    assert d["status"] == "ok" and d["n_prompt_tokens"] == 5 and d["backend"] == "cpu"
    model = load_model(tiny)
    ids, gen = d["prompt_token_ids"], d["token_ids"]
    seq = ids + gen[:-1]
    P = len(ids)
    st = model.new_state(len(seq))
    logits = model.forward(st.append(seq), st, list(range(P - 1, len(seq))))
    assert np.asarray(logits).argmax(-1).tolist() == gen


def test_system1_scores_are_the_separate_log_prob_sums(tiny):
    from reflex_core.gguf import open_gguf
    from reflex_core.tokenizer import Tokenizer

    prompt = "The capital of France is"
    cands = [" Paris", " London", " Berlin, of course", " a city"]
    args = ["system1", str(tiny), prompt, "--backend", "cpu"]
    for c in cands:
        args += ["--candidate", c]
    p = reflex(*args, "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["num_candidates"] == len(cands) and d["backend"] == "cpu"
    assert abs(sum(c["probability"] for c in d["candidates"]) - 1) < 1e-9
    assert max(len(c["token_ids"]) for c in d["candidates"]) > 1  # a multi-token candidate

    model = load_model(tiny)
    ops = model.ops
    ids = Tokenizer.from_gguf(open_gguf(tiny)).encode(prompt)
    P = len(ids)
    for c in d["candidates"]:
        toks = c["token_ids"]
        seq = ids + toks
        st = model.new_state(len(seq))
        logits = model.forward(st.append(seq), st, list(range(P - 1, len(seq) - 1)))
        want = sum(ops.token_logprobs(logits, toks))
        assert c["score"] == pytest.approx(want, rel=1e-5, abs=1e-4), (c, want)

    lines = reflex(*args).stdout.strip().splitlines()
    assert len(lines) == len(cands) + 1 and lines[-1].startswith("REFLEX_SYSTEM1_OK ")
    assert f"best_idx={d['best_idx']} " in lines[-1]


# --- malformed files: one-line ModelErrors ---------------------------------------------------
def _patch_tensor(data: bytearray, name: str, new_name: str | None = None,
                  ne: tuple[int, ...] | None = None) -> None:
    """Rename a tensor (same length) or rewrite its ne (same element count) in the directory."""
    key = name.encode()
    at = data.index(struct.pack("<Q", len(key)) + key) + 8
    if new_name is not None:
        assert len(new_name) == len(name)
        data[at:at + len(key)] = new_name.encode()
    at += len(key)
    n_dims = struct.unpack_from("<I", data, at)[0]
    if ne is not None:
        assert len(ne) == n_dims
        struct.pack_into(f"<{n_dims}Q", data, at + 4, *ne)


def _patch_u32(data: bytearray, key: str, value: int) -> None:
    k = key.encode()
    at = data.index(struct.pack("<Q", len(k)) + k) + 8 + len(k)
    assert struct.unpack_from("<I", data, at)[0] == 4  # GGUF UINT32
    struct.pack_into("<I", data, at + 4, value)


BROKEN = [
    pytest.param(lambda d: _patch_tensor(d, "blk.1.ffn_up_exps.weight", "blk.1.ffn_up_exps.weighx"),
                 r"tensor 'blk\.1\.ffn_up_exps\.weight' is missing", id="missing-expert-tensor"),
    pytest.param(lambda d: _patch_tensor(d, "blk.0.ffn_gate_exps.weight", ne=(32, 64, 8)),
                 r"'blk\.0\.ffn_gate_exps\.weight' has shape \[32, 64, 8\], expected \[64, 32, 8\]",
                 id="expert-shape"),
    pytest.param(lambda d: _patch_tensor(d, "blk.0.ffn_gate_inp.weight", ne=(32, 16)),
                 r"'blk\.0\.ffn_gate_inp\.weight' has shape \[32, 16\], expected \[64, 8\]",
                 id="router-shape"),
    pytest.param(lambda d: _patch_u32(d, "qwen3moe.expert_used_count", 9),
                 r"qwen3moe\.expert_used_count = 9 exceeds qwen3moe\.expert_count = 8",
                 id="k-greater-than-E"),
    pytest.param(lambda d: _patch_u32(d, "qwen3moe.expert_count", 0),
                 r"qwen3moe\.expert_count must be > 0", id="no-experts"),
    pytest.param(lambda d: _patch_u32(d, "qwen3moe.expert_feed_forward_length", 48),
                 r"'blk\.0\.ffn_gate_exps\.weight' has shape \[64, 32, 8\], expected \[64, 48, 8\]",
                 id="F_e-mismatch"),
]


@pytest.mark.parametrize("patch, msg", BROKEN)
def test_malformed_file_is_a_one_line_model_error(tiny, tmp_path, patch, msg):
    data = bytearray(tiny.read_bytes())
    patch(data)
    f = tmp_path / "broken.gguf"
    f.write_bytes(bytes(data))
    with pytest.raises(ModelError, match=msg):
        load_model(f)
    line = one_line_error(reflex("generate", str(f), "hi", "--backend", "cpu"))
    assert line.startswith("error: ") and re.search(msg, line), line
