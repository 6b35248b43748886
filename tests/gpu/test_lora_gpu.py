"""LoRA on the GPU: CudaOps.merge_lora (dequantize + ``reflex_lora_add``) against its twin
NumpyOps.merge_lora on odd sizes, F32 and Q8_0 bases, F32/F16/BF16/Q8_0 factors, expert tensors, the
embedding's transposed convention and two adapters in sequence; the merged weights through the
matmul/embed/MoE kernels; and whole models with an adapter, GPU = CPU (generate, ``reflex
check --lora``)."""

from __future__ import annotations

import json
import subprocess
import sys

import gguf
import numpy as np
import pytest

from reflex_core import engine
from reflex_core.lora import close_all, open_adapters
from reflex_core.sampling import SamplingParams
from reflex_core.testing.lorawriter import random_pairs, write_adapter
from reflex_core.testing.modelwriter import ModelShape, write_model

# Both sides compute each merged value in float32 from the same dequantized base: sum over the
# rank in a different order (fmaf chain vs BLAS). 1e-5 of the tensor's scale leaves room.
REL = 1e-5
MODEL_REL = 1e-4  # whole models, as tests/gpu/test_models_gpu.py


def _q8(x: np.ndarray):
    return gguf.quants.quantize(x.astype(np.float32), gguf.GGMLQuantizationType.Q8_0), \
        tuple(reversed(x.shape)), 8


@pytest.mark.parametrize("ftype", ["F32", "F16", "BF16"])
def test_gpu_merge_equals_numpy_merge(attach_both, tmp_path, ftype):
    rng = np.random.default_rng(17)
    tensors = {
        "odd.weight": rng.normal(size=(53, 37)),  # F32, no size a multiple of the tile
        "q8.weight": _q8(rng.normal(size=(29, 64))),  # Q8_0 base: dequantized first
        "blk.0.ffn_up_exps.weight": rng.normal(size=(3, 29, 40)),  # 3 experts
        "token_embd.weight": rng.normal(size=(101, 48)),
        "output.weight": rng.normal(size=(101, 48)),  # untied: an embedding adapter is allowed
    }
    cuda, ref = attach_both(tensors)
    base = cuda.gguf.path
    names = [n for n in tensors if n != "output.weight"]
    ranks = {"odd.weight": 5, "q8.weight": 37, "blk.0.ffn_up_exps.weight": 6,
             "token_embd.weight": 7}  # 37: more than one rank tile
    adapters = []
    for k, scale in enumerate((0.7, -1.3)):
        pairs = {}
        for n in names:
            pairs.update(random_pairs(base, [n], ranks[n] + k, seed=30 + k, sigma=0.3))
        adapters.append((write_adapter(tmp_path / f"a{k}.gguf", "ops", pairs, alpha=4.0,
                                       factor_type=ftype), scale))
    ads = open_adapters(adapters, cuda.gguf)
    ref.merge_lora(ads)
    cuda.merge_lora(ads)
    close_all(ads)
    for n in names:
        w = cuda.weight(n)
        assert w.ggml_type == 0, n  # rebound to the F32 copy
        got = cuda.to_numpy(cuda.dequantize(w))
        want = ref.dequantize(ref.weight(n))
        assert got.shape == want.shape, n
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err < REL, f"{n}: {err:.3g}"
    # the kernels read the merged weights (and their fresh plans)
    x = rng.normal(size=(5, 37)).astype(np.float32)
    for n, xin in (("odd.weight", x), ("q8.weight", rng.normal(size=(3, 64)))):
        got = cuda.to_numpy(cuda.matmul(cuda.from_numpy(xin), cuda.weight(n)))
        want = ref.matmul(np.asarray(xin, np.float32), ref.weight(n))
        assert np.abs(got - want).max() / np.abs(want).max() < REL, n


def _model_pair(tmp_path, arch):
    if arch == "qwen3moe":
        shape = ModelShape(arch="qwen3moe", n_layer=2, n_embd=64, n_head=4, n_head_kv=2,
                           head_dim=32, n_ff=96, n_expert=8, n_expert_used=2, n_ff_exp=64,
                           tied=False)
        ffn = ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
    else:
        shape = ModelShape(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, head_dim=32, n_ff=96,
                           tied=False)
        ffn = ("ffn_gate", "ffn_up", "ffn_down")
    model = write_model(tmp_path / f"{arch}.gguf", shape, weight_type="Q8_0",
                        tokenizer="qwen3", seed=5)
    names = [f"blk.{i}.{t}.weight" for i in range(shape.n_layer)
             for t in ("attn_q", "attn_k", "attn_v", "attn_output") + ffn]
    pairs = random_pairs(model, names + ["token_embd.weight"], 16, seed=6, sigma=0.2)
    return model, write_adapter(tmp_path / f"{arch}-lora.gguf", arch, pairs, alpha=32.0,
                                factor_type="F16")


@pytest.mark.parametrize("arch", ["qwen3", "qwen3moe"])
def test_generate_with_an_adapter_same_on_gpu_and_cpu(cuda_device, tmp_path, arch):
    model, adapter = _model_pair(tmp_path, arch)
    prompt = "The capital of France is"
    out = {}
    for backend in ("cuda", "cpu"):
        lm, ids = engine.load(str(model), backend, prompt=prompt, lora=[(adapter, 1.5)])
        with lm:
            out[backend] = engine.generate(lm, ids, 12, SamplingParams()).token_ids
    lm, ids = engine.load(str(model), "cuda", prompt=prompt)
    with lm:
        plain = engine.generate(lm, ids, 12, SamplingParams()).token_ids
    assert out["cuda"] == out["cpu"] != plain


def test_gpu_merge_of_q8_0_factors_equals_numpy_merge(attach_both, tmp_path):
    """convert_lora_to_gguf.py --outtype q8_0: each factor dequantized alone on the device (its
    34-byte blocks do not fit the region-wide conversion of the 16-bit types), beside F32 ones."""
    rng = np.random.default_rng(19)
    tensors = {
        "a.weight": rng.normal(size=(40, 96)),
        "q8.weight": _q8(rng.normal(size=(29, 64))),
        "blk.0.ffn_up_exps.weight": rng.normal(size=(3, 29, 64)),
        "token_embd.weight": rng.normal(size=(101, 64)),
        "output.weight": rng.normal(size=(101, 64)),
    }
    cuda, ref = attach_both(tensors)
    names = [n for n in tensors if n != "output.weight"]
    adapters = []
    for k, (ftype, rank) in enumerate((("Q8_0", 32), ("Q8_0", 64), ("F32", 5))):
        pairs = random_pairs(cuda.gguf.path, names, rank, seed=40 + k, sigma=0.3)
        adapters.append((write_adapter(tmp_path / f"a{k}.gguf", "ops", pairs, alpha=8.0,
                                       factor_type=ftype), 0.5 + k))
    ads = open_adapters(adapters, cuda.gguf)
    ref.merge_lora(ads)
    cuda.merge_lora(ads)
    close_all(ads)
    for n in names:
        got = cuda.to_numpy(cuda.dequantize(cuda.weight(n)))
        want = ref.dequantize(ref.weight(n))
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err < REL, f"{n}: {err:.3g}"


def test_reflex_check_with_lora(cuda_device, tmp_path):
    model, adapter = _model_pair(tmp_path, "qwen3")
    p = subprocess.run([sys.executable, "-m", "reflex_core", "check", str(model), "--lora",
                        f"{adapter}:0.8", "--json"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-2000:])
    res = json.loads(p.stdout)
    rows = res["positions_detail"]
    assert res["status"] == "ok" and rows, res
    assert all(r["max_rel"] <= MODEL_REL for r in rows), rows
    assert all(r["mismatches"] == 0 for r in res["dequant_detail"]), res["dequant_detail"]
