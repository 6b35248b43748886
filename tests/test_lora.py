"""LoRA adapters (reflex_core.lora, ``--lora``): merged at load vs llama.cpp applying the same
adapter at run time, the merge's definition, and every refusal as one line.

Oracle bound. F32 base and F32 factors: llama.cpp computes ``W·x + s·B·(A·x)`` in float32, the
reference ``(W + s·B@A)·x`` in float32; only the rounding order differs. Measured (seeds 0-5 x
ranks 4 and 8, scale 0.8, adapters on every attention and FFN projection and token_embd):
dense qwen3 worst 7.9e-7, qwen3moe worst 9.2e-7 (no routing flip), against 5e-6, the bound of
the F32 oracle tests without adapters. With F16 factors llama.cpp rounds the activation it
multiplies A by to F16 (the factor's vec_dot_type), which the merge does not: dense worst
8.0e-4, bound 2e-3; in qwen3moe that rounding also moves router logits and flips near-tie
expert choices (up to 0.19 measured), so MoE is compared with F32 factors only. Each case also
shows the adapter matters: its logits differ from the base's by more than 100 times the bound
(measured >= 0.8).

Tied embeddings (spec §12): an adapter on token_embd.weight of a model without output.weight
is refused (llama.cpp aborts on it, so there is no reference; merging into the embedding alone
would need a second V x D copy for the head).

The oracle tests FAIL (never skip) when llama-cpp-python is missing (marker ``oracle``).
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from reflex_core import engine
from reflex_core.backends.numpy_backend import NumpyOps
from reflex_core.errors import ReflexError
from reflex_core.gguf import open_gguf
from reflex_core.lora import LoraError, open_adapter, open_adapters, parse_lora_arg
from reflex_core.testing import oracle
from reflex_core.testing.lorawriter import merged_reference, random_pairs, write_adapter
from reflex_core.testing.modelwriter import (ModelShape, tiny_deepseek2_legacy_shape,
                                             tiny_deepseek2_shape, tiny_qwen35_shape,
                                             tiny_qwen35moe_shape, write_model)

PROMPT, DECODE = 7, 3
DENSE = ModelShape(n_layer=2, n_embd=96, n_head=6, n_head_kv=2, head_dim=48, n_ff=160,
                   n_vocab=160, context_length=512, tied=False)
MOE = ModelShape(arch="qwen3moe", n_layer=2, n_embd=96, n_head=6, n_head_kv=2, head_dim=48,
                 n_ff=160, n_vocab=160, context_length=512, n_expert=8, n_expert_used=2,
                 n_ff_exp=64, tied=False)
ATTN = ("attn_q", "attn_k", "attn_v", "attn_output")
F32_BOUND = 5e-6
F16_BOUND = 2e-3
# llama.cpp multiplies Q8_0 factors at run time with its inputs rounded to Q8_0 too; the merge
# uses the factors' exact values (measured 1.0e-2 against the runtime, 7.5e-7 against llama.cpp
# given the same values as F32 factors)
Q8_0_RUNTIME_BOUND = 3e-2


def targets(shape: ModelShape, ffn: tuple[str, ...], embedding: bool = True) -> list[str]:
    names = [f"blk.{i}.{t}.weight" for i in range(shape.n_layer) for t in ATTN + ffn]
    return names + (["token_embd.weight"] if embedding else [])


DENSE_FFN = ("ffn_gate", "ffn_up", "ffn_down")
MOE_FFN = ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("lora") / "dense.gguf", DENSE, seed=3)


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("lora") / "moe.gguf", MOE, seed=4)


def merged_logits(path, lora, tokens) -> np.ndarray:
    lm, _ = engine.load(str(path), "cpu", lora=lora)
    with lm:
        return oracle.model_logits(lm.model, tokens, n_prompt=PROMPT)


# --------------------------------------------------------------------------------------------
# llama.cpp applying the adapter at run time (the oracle)


ORACLE_CASES = [
    pytest.param("dense", 4, "F32", (0.7,), F32_BOUND, id="qwen3-r4-f32"),
    pytest.param("dense", 8, "F32", (1.0, -0.5), F32_BOUND, id="qwen3-r8-two-adapters"),
    pytest.param("dense", 4, "F16", (1.0,), F16_BOUND, id="qwen3-r4-f16-factors"),
    pytest.param("moe", 8, "F32", (1.0,), F32_BOUND, id="qwen3moe-r8-f32"),
    pytest.param("moe", 4, "F32", (0.5, 1.5), F32_BOUND, id="qwen3moe-r4-two-adapters"),
]


@pytest.mark.oracle
@pytest.mark.parametrize("which, rank, ftype, scales, bound", ORACLE_CASES)
def test_merged_model_matches_llama_cpp_runtime_lora(request, tmp_path, which, rank, ftype,
                                                     scales, bound):
    shape, ffn = (DENSE, DENSE_FFN) if which == "dense" else (MOE, MOE_FFN)
    base = request.getfixturevalue(which)
    lora = []
    for k, scale in enumerate(scales):
        pairs = random_pairs(base, targets(shape, ffn), rank, seed=10 * k + rank)
        path = write_adapter(tmp_path / f"a{k}.gguf", shape.arch, pairs, alpha=2.0 * rank,
                             factor_type=ftype)
        lora.append((path, scale))
    tokens = oracle.random_tokens(shape.n_vocab, PROMPT + DECODE, seed=rank)
    ref = oracle.llama_logits(base, tokens, n_prompt=PROMPT, lora=lora)
    got = merged_logits(base, lora, tokens)
    oracle.check_logits(ref, got, bound, f"{which} with {len(lora)} adapter(s)")
    plain = oracle.llama_logits(base, tokens, n_prompt=PROMPT)
    assert oracle.compare(plain, ref)["rel"] > 100 * bound  # the adapter changes the logits


@pytest.mark.oracle
def test_q8_0_factors_merge_their_exact_values(dense, tmp_path):
    """convert_lora_to_gguf.py --outtype q8_0: the merge of the Q8_0 adapter is llama.cpp's
    result with the same values stored as F32 factors (to float32 rounding); against llama.cpp
    running the Q8_0 factors themselves the difference is its input rounding only."""
    targets_ = targets(DENSE, DENSE_FFN)
    pairs = random_pairs(dense, targets_, 32, seed=12)
    q8 = write_adapter(tmp_path / "q8.gguf", "qwen3", pairs, alpha=16.0, factor_type="Q8_0")
    same = write_adapter(tmp_path / "f32.gguf", "qwen3",
                         {n: (_stored(a, "Q8_0"), _stored(b, "Q8_0")) for n, (a, b) in pairs.items()},
                         alpha=16.0, factor_type="F32")
    tokens = oracle.random_tokens(DENSE.n_vocab, PROMPT + DECODE, seed=12)
    got = merged_logits(dense, [(q8, 0.9)], tokens)
    oracle.check_logits(oracle.llama_logits(dense, tokens, n_prompt=PROMPT, lora=[(same, 0.9)]),
                        got, F32_BOUND, "Q8_0 factors vs their values as F32")
    oracle.check_logits(oracle.llama_logits(dense, tokens, n_prompt=PROMPT, lora=[(q8, 0.9)]),
                        got, Q8_0_RUNTIME_BOUND, "Q8_0 factors vs llama.cpp's runtime")


# --------------------------------------------------------------------------------------------
# the merge itself


def _merged_weight(base_path, lora, name) -> np.ndarray:
    g = open_gguf(base_path)
    ops = NumpyOps()
    ops.attach(g)
    ads = open_adapters(lora, g)
    ops.merge_lora(ads)
    return ops.dequantize(ops.weight(name))


@pytest.mark.parametrize("ftype", ["F32", "F16", "BF16", "Q8_0"])
def test_merge_is_w_plus_scale_b_a_for_each_factor_type(dense, tmp_path, ftype):
    names = ["blk.1.attn_k.weight", "blk.0.ffn_down.weight", "token_embd.weight"]
    rank = 32 if ftype == "Q8_0" else 5  # Q8_0 blocks of 32 along every factor's rows
    pairs = random_pairs(dense, names, rank, seed=1)
    path = write_adapter(tmp_path / "a.gguf", "qwen3", pairs, alpha=10.0, factor_type=ftype)
    base = NumpyOps()
    base.attach(open_gguf(dense))
    for name, (a, b) in pairs.items():
        a, b = (_stored(x, ftype) for x in (a, b))
        want = merged_reference(base.dequantize(base.weight(name)), name, a, b,
                                0.3 * 10.0 / rank)
        got = _merged_weight(dense, [(path, 0.3)], name)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
        assert np.abs(got - base.dequantize(base.weight(name))).max() > 1e-2


def _stored(x: np.ndarray, ftype: str) -> np.ndarray:
    """The float32 values of ``x`` as the adapter writer stores them in ``ftype``."""
    if ftype == "BF16":  # round to nearest even
        return oracle.round_bf16(x)
    if ftype == "Q8_0":
        return gguf.quants.dequantize(gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0),
                                      gguf.GGMLQuantizationType.Q8_0).reshape(x.shape)
    return x.astype({"F32": np.float32, "F16": np.float16}[ftype]).astype(np.float32)


def test_expert_tensors_merge_per_expert(moe, tmp_path):
    name = "blk.0.ffn_up_exps.weight"
    (a, b), = random_pairs(moe, [name], 3, seed=2).values()
    path = write_adapter(tmp_path / "a.gguf", "qwen3moe", {name: (a, b)}, alpha=6.0)
    base = NumpyOps()
    base.attach(open_gguf(moe))
    w = base.dequantize(base.weight(name))
    got = _merged_weight(moe, [(path, 1.0)], name)
    for e in range(MOE.n_expert):
        np.testing.assert_allclose(got[e], w[e] + 2.0 * (b[e] @ a[e]), rtol=0, atol=1e-6)


def test_experts_read_before_the_merge_are_not_served_stale(moe, tmp_path):
    """An expert tensor whose experts a forward pass already read one by one (the backend's
    per-expert copies) gives the merged values after merge_lora."""
    name = "blk.0.ffn_up_exps.weight"
    (a, b), = random_pairs(moe, [name], 3, seed=4).values()
    path = write_adapter(tmp_path / "a.gguf", "qwen3moe", {name: (a, b)}, alpha=3.0)
    g = open_gguf(moe)
    ops = NumpyOps()
    ops.attach(g)
    w = ops.weight(name)
    n_in = w.ne[0]
    x = np.random.default_rng(5).standard_normal((2, n_in)).astype(np.float32)
    ids = np.array([[0, 3], [3, 5]], np.int32)
    before = ops.moe_matmul(x, w, ids)
    ops.merge_lora(open_adapters([(path, 1.0)], g))
    after = ops.moe_matmul(x, w, ids)
    merged = NumpyOps()
    merged.attach(open_gguf(moe))
    base = merged.dequantize(merged.weight(name))
    for t in range(2):
        for j, e in enumerate(ids[t]):
            want = (base[e] + 1.0 * (b[e] @ a[e])) @ x[t]
            np.testing.assert_allclose(after[t, j], want, rtol=1e-5, atol=1e-5)
    assert not np.allclose(after, before)


def test_two_adapters_add_in_sequence(dense, tmp_path):
    name = "blk.0.attn_q.weight"
    p1 = random_pairs(dense, [name], 4, seed=5)
    p2 = random_pairs(dense, [name], 6, seed=6)
    f1 = write_adapter(tmp_path / "a1.gguf", "qwen3", p1, alpha=4.0)
    f2 = write_adapter(tmp_path / "a2.gguf", "qwen3", p2, alpha=3.0)
    base = NumpyOps()
    base.attach(open_gguf(dense))
    want = merged_reference(base.dequantize(base.weight(name)), name, *p1[name], 2.0 * 4 / 4)
    want = merged_reference(want, name, *p2[name], -1.0 * 3 / 6)
    got = _merged_weight(dense, [(f1, 2.0), (f2, -1.0)], name)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("alpha", [0.0, None])
def test_alpha_zero_or_missing_means_the_user_scale_alone(dense, tmp_path, alpha):
    pairs = random_pairs(dense, ["blk.0.ffn_gate.weight"], 8, seed=7)
    path = write_adapter(tmp_path / "a.gguf", "qwen3", pairs, alpha=alpha)
    g = open_gguf(dense)
    ad = open_adapter(path, g, 0.25)
    assert ad.alpha == 0.0
    assert [m.scale for m in ad.merges] == [0.25]
    assert ad.merges[0].rank == 8
    ad.close()
    ad = open_adapter(write_adapter(tmp_path / "b.gguf", "qwen3", pairs, alpha=4.0), g, 0.25)
    assert [m.scale for m in ad.merges] == [0.25 * 4.0 / 8]


def test_norm_tensors_in_an_adapter_are_ignored(dense, tmp_path):
    pairs = random_pairs(dense, ["blk.0.attn_v.weight"], 2, seed=8)
    path = write_adapter(tmp_path / "a.gguf", "qwen3", pairs,
                         extra={"blk.0.attn_norm.weight": np.ones(DENSE.n_embd)})
    ad = open_adapter(path, open_gguf(dense))
    assert [m.name for m in ad.merges] == ["blk.0.attn_v.weight"]


@pytest.mark.parametrize("text, want", [
    ("a.gguf", ("a.gguf", 1.0)),
    ("a.gguf:0.5", ("a.gguf", 0.5)),
    ("dir/a.gguf:-1e-1", ("dir/a.gguf", -0.1)),
    ("odd:name.gguf", ("odd:name.gguf", 1.0)),
    ("C:/models/a.gguf:2", ("C:/models/a.gguf", 2.0)),
    ("a.gguf:", ("a.gguf:", 1.0)),
    ("a.gguf:+.5", ("a.gguf", 0.5)),
    ("a.gguf:1_0", ("a.gguf:1_0", 1.0)),  # no number as written: all path
    ("a.gguf: 2", ("a.gguf: 2", 1.0)),
])
def test_lora_argument_parsing(text, want):
    assert parse_lora_arg(text) == want


def test_lora_argument_with_a_non_finite_scale_is_refused():
    for scale in ("nan", "inf", "-Infinity", "1e999"):
        with pytest.raises(ReflexError, match="not a finite number"):
            parse_lora_arg(f"a.gguf:{scale}")


# --------------------------------------------------------------------------------------------
# refusals: one line each


def refused(base, path, match: str) -> str:
    with pytest.raises(LoraError) as ei:
        open_adapters([(str(path), 1.0)], open_gguf(base))
    msg = str(ei.value)
    assert "\n" not in msg and match in msg, msg
    return msg


def test_adapter_of_another_architecture(dense, tmp_path):
    pairs = random_pairs(dense, ["blk.0.attn_q.weight"], 4, seed=0)
    path = write_adapter(tmp_path / "a.gguf", "llama", pairs)
    refused(dense, path, "architecture 'llama', the model is 'qwen3'")


def test_adapter_tensor_missing_in_the_base(dense, tmp_path):
    a, b = random_pairs(dense, ["blk.0.attn_q.weight"], 4, seed=0)["blk.0.attn_q.weight"]
    path = write_adapter(tmp_path / "a.gguf", "qwen3", {"blk.7.attn_q.weight": (a, b)})
    refused(dense, path, "'blk.7.attn_q.weight', which the model does not have")


def test_rank_mismatch_between_a_and_b(dense, tmp_path):
    name = "blk.0.attn_q.weight"
    a, _ = random_pairs(dense, [name], 4, seed=0)[name]
    _, b = random_pairs(dense, [name], 5, seed=0)[name]
    path = write_adapter(tmp_path / "a.gguf", "qwen3", {name: (a, b)})
    refused(dense, path, "rank 4 in A and 5 in B")


def test_rank_mismatch_in_the_embedding(dense, tmp_path):
    name = "token_embd.weight"
    a, _ = random_pairs(dense, [name], 4, seed=0)[name]
    _, b = random_pairs(dense, [name], 3, seed=0)[name]
    path = write_adapter(tmp_path / "a.gguf", "qwen3", {name: (a, b)})
    refused(dense, path, "rank 4 in A and 3 in B")


def test_shape_mismatch_with_the_base(dense, tmp_path):
    a, b = random_pairs(dense, ["blk.0.ffn_down.weight"], 4, seed=0)["blk.0.ffn_down.weight"]
    path = write_adapter(tmp_path / "a.gguf", "qwen3", {"blk.0.ffn_up.weight": (a, b)})
    refused(dense, path, "needs A [96, r] and B [r, 160]")


def test_expert_count_mismatch(moe, tmp_path):
    name = "blk.0.ffn_gate_exps.weight"
    a, b = random_pairs(moe, [name], 4, seed=0)[name]
    path = write_adapter(tmp_path / "a.gguf", "qwen3moe", {name: (a[:5], b[:5])})
    refused(moe, path, "5 and 5 experts in A and B, the base 8")


def test_a_model_file_is_not_an_adapter(dense):
    refused(dense, dense, "general.type is None, not 'adapter'")


def test_an_adapter_of_another_kind(dense, tmp_path):
    pairs = random_pairs(dense, ["blk.0.attn_q.weight"], 4, seed=0)
    refused(dense, write_adapter(tmp_path / "a.gguf", "qwen3", pairs, general_type="model"),
            "general.type is 'model'")
    refused(dense, write_adapter(tmp_path / "b.gguf", "qwen3", pairs, adapter_type="cvec"),
            "adapter.type is 'cvec'")


def test_a_file_that_is_not_gguf(dense, tmp_path):
    p = tmp_path / "junk.gguf"
    p.write_bytes(b"not a gguf file at all, just bytes")
    msg = refused(dense, p, "LoRA adapter:")
    assert "junk.gguf" in msg


def test_unsupported_factor_type(dense, tmp_path):
    pairs = random_pairs(dense, ["blk.0.ffn_down.weight"], 32, seed=0)  # Q4_0 rows of 32
    path = write_adapter(tmp_path / "a.gguf", "qwen3", pairs, factor_type="Q4_0")
    refused(dense, path, "has type Q4_0; factors must be F32, F16, BF16, Q8_0")


def test_unpaired_and_unknown_tensors(dense, tmp_path):
    a, _ = random_pairs(dense, ["blk.0.attn_q.weight"], 4, seed=0)["blk.0.attn_q.weight"]
    path = write_adapter(tmp_path / "a.gguf", "qwen3", {},
                         extra={"blk.0.attn_q.weight.lora_a": a})
    refused(dense, path, "'blk.0.attn_q.weight' has lora_a but not its pair")
    path = write_adapter(tmp_path / "b.gguf", "qwen3", {}, extra={"blk.0.attn_q.weight": a})
    refused(dense, path, "is neither N.lora_a nor N.lora_b")


def test_token_embd_adapter_on_a_tied_model_is_refused(tmp_path):
    tied = write_model(tmp_path / "tied.gguf", DENSE.replace(tied=True), seed=1)
    pairs = random_pairs(tied, ["token_embd.weight", "blk.0.attn_q.weight"], 4, seed=0)
    path = write_adapter(tmp_path / "a.gguf", "qwen3", pairs)
    refused(tied, path, "also uses as its output head (tied embeddings)")


def test_engine_load_with_a_missing_adapter(dense, tmp_path):
    missing = tmp_path / "missing.gguf"
    with pytest.raises(LoraError) as ei:
        engine.load(str(dense), "cpu", lora=[(str(missing), 1.0)])
    assert str(ei.value) == f"LoRA adapter: No such file: {missing}"


# --------------------------------------------------------------------------------------------
# the command line, end to end


def test_cli_generate_with_lora(tmp_path):
    import json
    import subprocess
    import sys

    shape = ModelShape(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, head_dim=32, n_ff=96)
    model = write_model(tmp_path / "m.gguf", shape, tokenizer="qwen3", seed=2)
    pairs = random_pairs(model, targets(shape, DENSE_FFN, embedding=False), 4, seed=3, sigma=0.5)
    adapter = write_adapter(tmp_path / "a.gguf", "qwen3", pairs, alpha=4.0)
    prompt = "The capital of France is"

    def run(*extra):
        p = subprocess.run([sys.executable, "-m", "reflex_core", "generate", str(model), prompt,
                            "-n", "4", "--backend", "cpu", "--json", *extra],
                           capture_output=True, text=True, timeout=300)
        return p

    p = run("--lora", f"{adapter}:3")
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)["token_ids"]
    lm, ids = engine.load(str(model), "cpu", prompt=prompt, lora=[(adapter, 3.0)])
    with lm:
        want = engine.generate(lm, ids, 4, engine.SamplingParams()).token_ids
    lm, ids = engine.load(str(model), "cpu", prompt=prompt)
    with lm:
        plain = engine.generate(lm, ids, 4, engine.SamplingParams()).token_ids
    assert got == want != plain

    tied_adapter = write_adapter(tmp_path / "t.gguf", "qwen3",
                                 random_pairs(model, ["token_embd.weight"], 2, seed=4))
    p = run("--lora", tied_adapter)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1 and len(lines) == 1 and "tied embeddings" in lines[0], p.stderr


# --------------------------------------------------------------------------------------------
# Qwen3.5 and DeepSeek-V2/V3 against llama.cpp's runtime LoRA: every 2-D and 3-D tensor of the
# file targeted, those llama.cpp multiplies outside its LoRA path included (spec §7.8, §8.7)


def _every_matrix(path) -> list[str]:
    g = open_gguf(str(path))
    try:
        return [n for n, ti in g.tensors.items() if len(ti.ne) in (2, 3)]
    finally:
        g.close()


_MLA_UNAPPLIED = {"blk.0.attn_q_a.weight", "blk.0.attn_q_b.weight", "blk.0.attn_kv_a_mqa.weight",
                  "blk.0.attn_k_b.weight", "blk.0.attn_v_b.weight", "output.weight"}
FAMILY_CASES = [
    pytest.param(DENSE, set(), (), id="qwen3"),
    pytest.param(MOE, set(), (), id="qwen3moe"),
    pytest.param(tiny_qwen35_shape(tied=False), {"blk.0.ssm_conv1d.weight"}, (), id="qwen35"),
    pytest.param(tiny_qwen35moe_shape(tied=False), {"blk.0.ssm_conv1d.weight"}, (),
                 id="qwen35moe"),
    pytest.param(tiny_deepseek2_shape(tied=False), _MLA_UNAPPLIED, (), id="deepseek2-mla"),
    pytest.param(tiny_deepseek2_legacy_shape(tied=False), {"blk.1.attn_kv_b.weight"}, (),
                 id="deepseek2-legacy"),
    # adapters on fused tensors (tests/test_optional_tensors.py): merged into the whole tensor,
    # seen through its rows
    pytest.param(DENSE, set(), ("qkv",), id="qwen3-fused-qkv"),
    pytest.param(tiny_qwen35moe_shape(tied=False), {"blk.0.ssm_conv1d.weight"},
                 ("qkv", "gate_up_exps"), id="qwen35moe-fused"),
    pytest.param(tiny_deepseek2_shape(tied=False), _MLA_UNAPPLIED, ("gate_up_exps",),
                 id="deepseek2-fused-experts"),
]


@pytest.mark.oracle
@pytest.mark.parametrize("shape, unapplied, fuse", FAMILY_CASES)
def test_every_family_matches_llama_cpp_runtime_lora(tmp_path, capfd, shape, unapplied, fuse):
    base = write_model(tmp_path / "base.gguf", shape, seed=5, fuse=fuse)
    names = _every_matrix(base)
    assert unapplied <= set(names)
    pairs = random_pairs(base, names, 4, seed=6, sigma=0.05)
    path = write_adapter(tmp_path / "a.gguf", shape.arch, pairs, alpha=8.0)
    n_vocab = shape.n_vocab or 128
    tokens = oracle.random_tokens(n_vocab, PROMPT + DECODE, seed=7)
    ref = oracle.llama_logits(base, tokens, n_prompt=PROMPT, lora=[(path, 0.8)])
    lm, _ = engine.load(str(base), "cpu", lora=[(path, 0.8)])
    with lm:
        got = oracle.model_logits(lm.model, tokens, n_prompt=PROMPT)
        notices = " ".join(lm.notices)
        cls = type(lm.model)
    oracle.check_logits(ref, got, F32_BOUND, f"{shape.arch} with every matrix adapted")
    skipped = {n for n in names if not cls.lora_applies(n)}
    assert unapplied <= skipped
    if skipped:
        assert f"{len(skipped)} LoRA tensor(s) not applied" in notices
    else:
        assert "LoRA" not in notices
    # what is applied moves the logits (the skipped pairs alone would not)
    plain = oracle.llama_logits(base, tokens, n_prompt=PROMPT)
    assert oracle.compare(plain, ref)["rel"] > 100 * F32_BOUND
