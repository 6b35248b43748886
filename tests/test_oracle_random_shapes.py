"""Every family on hyper-parameters drawn at random (fixed seeds), F32 weights, the NumPy
reference against llama.cpp (the oracle), logits at every position.

The hand-picked shapes of test_oracle_*.py cover the configurations each family's real models
use; these draws cover the rest of what a file may say: head counts and GQA ratios, head sizes
apart from D / H, one to six blocks, tied and untied heads, YaRN or none, rope bases, expert
counts and top-k up to E, Qwen3.5's layer patterns (interval or explicit array, MTP blocks),
partial-RoPE sizes and IMROPE sections, GDN group and value-head counts, convolution widths,
shared-expert gate shapes, DeepSeek's query LoRA ranks, latent sizes, MLA or legacy files,
dense lead counts, gating functions, group-limited routing, weight normalisation and scale,
selection bias. Each draw also picks the prompt length (one batch) and the decode steps after it,
and, from a generator of its own (``optional_tensors``), the optional tensors of spec §4.7: q/k/v
biases, fused ``attn_qkv`` weights and biases, fused ``ffn_gate_up_exps``.

The draws stay inside what llama.cpp 0.3.36 loads and what Reflex supports: a Qwen3.5 file
keeps at least one attention and one GDN block (llama.cpp aborts on a hybrid file without
either), IMROPE sections that cover every rotary pair (Reflex refuses the others), DeepSeek MoE
blocks with a shared expert (llama.cpp requires its tensors). Bound: F32 on both sides, as in
the hand-picked tests (measured 2e-7 .. 1.1e-5 over about 130 draws of these generators,
2026-12-05; the largest on qwen35moe after 16 prompt tokens). bench/oracle_sweep.py runs many
more: of 25,000 draws (seeds 4-5003), four qwen35 ones exceed it (to 1.4e-4), each as
ill-conditioned as that (one-ulp noise in its weights moves the reference as far).

These tests FAIL (never skip) when llama-cpp-python is missing (marker ``oracle``).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from reflex_core.testing import oracle

from reflex_core.testing.modelwriter import DeepSeek2Shape, ModelShape, Qwen35Shape, write_model

pytestmark = pytest.mark.oracle

BOUND = 5e-5
SEEDS = range(4)


def _heads(r: random.Random) -> tuple[int, int]:
    kv = r.choice([1, 2, 3, 4])
    return kv * r.choice([1, 2, 3, 4]), kv


def qwen3(r: random.Random, moe: bool) -> ModelShape:
    h, kv = _heads(r)
    s = ModelShape(arch="qwen3moe" if moe else "qwen3", n_layer=r.randint(1, 3),
                   n_embd=r.choice([32, 48, 64, 96, 128, 160]), n_head=h, n_head_kv=kv,
                   head_dim=r.choice([16, 32, 64, 80, 128]), n_ff=r.choice([32, 64, 96, 200]),
                   n_vocab=r.choice([64, 130, 257]), context_length=r.choice([64, 256, 4096]),
                   rope_freq_base=r.choice([1e4, 1e6, 5e5]), rms_eps=r.choice([1e-6, 1e-5]),
                   tied=r.random() < 0.5)
    if moe:
        e = r.choice([2, 4, 8, 16])
        s = s.replace(n_expert=e, n_expert_used=r.randint(1, min(e, 8)),
                      n_ff_exp=r.choice([16, 32, 48]))
    if r.random() < 0.3:
        s = s.replace(rope_scaling={"type": "yarn", "factor": r.choice([2.0, 4.0]),
                                    "original_context_length": r.choice([8, 16, 32])})
    return s


def qwen35(r: random.Random, moe: bool) -> Qwen35Shape:
    h, kv = _heads(r)
    hd = r.choice([32, 64, 128, 256])
    hk = r.choice([1, 2, 4])
    nl = r.randint(2, 6)
    s = Qwen35Shape(arch="qwen35moe" if moe else "qwen35", n_layer=nl,
                    n_embd=r.choice([32, 64, 96]), n_head=h, n_head_kv=kv, head_dim=hd,
                    n_rot=r.choice([x for x in (4, 8, 16, 32, 64) if x <= hd]),
                    n_ff=r.choice([32, 64, 96]), n_vocab=r.choice([64, 130]),
                    rope_freq_base=r.choice([1e7, 1e4]), tied=r.random() < 0.5,
                    ssm_conv_kernel=r.choice([2, 3, 4]), ssm_state_size=r.choice([16, 32, 64]),
                    ssm_group_count=hk, ssm_time_step_rank=hk * r.choice([1, 2, 3]),
                    full_attention_interval=r.choice([1, 2, 3, 4, None]),
                    nextn_predict_layers=r.choice([0, 0, 1]))
    flags = s.recurrent_flags()[:nl]
    if r.random() < 0.3 or all(flags) or not any(flags):
        rec = [r.random() < 0.6 for _ in range(nl)]
        a, b = r.sample(range(nl), 2)
        rec[a], rec[b] = False, True
        s = s.replace(recurrent_layers=tuple(rec) + (False,) * s.nextn_predict_layers)
    if r.random() < 0.3:  # sections covering every pair: t, h, w take pairs 3i, 3i+1, 3i+2
        half = s.n_rot // 2
        need = [(half + 2 - m) // 3 for m in range(3)]
        s = s.replace(rope_sections=tuple(n + r.randint(0, 3) for n in need)
                      + (r.choice([0, 0, 2]),))
    if moe:
        e = r.choice([2, 4, 8])
        s = s.replace(n_ff=0, n_expert=e, n_expert_used=r.randint(1, e),
                      n_ff_exp=r.choice([16, 32]), n_ff_shexp=r.choice([16, 32, 64]),
                      shexp_gate_2d=r.random() < 0.5)
    return s


def deepseek2(r: random.Random) -> DeepSeek2Shape:
    e = r.choice([2, 4, 8])
    groups = r.choice([None, 1] + [g for g in (2, 4) if e % g == 0 and e // g >= 2])
    nl = r.randint(1, 4)
    s = DeepSeek2Shape(n_layer=nl, n_embd=r.choice([32, 64, 96]), n_head=r.choice([1, 2, 4]),
                       n_ff=r.choice([32, 64]), n_vocab=r.choice([64, 130]),
                       q_lora_rank=r.choice([16, 32]), kv_lora_rank=r.choice([16, 32, 64]),
                       qk_nope_head_dim=r.choice([16, 32]), n_rot=r.choice([8, 16, 32]),
                       v_head_dim=r.choice([16, 32, 48]), mla=r.random() < 0.7,
                       n_dense_lead=r.randint(0, nl), n_expert=e, n_expert_used=1,
                       n_ff_exp=r.choice([16, 32]), n_expert_shared=r.choice([1, 2]),
                       expert_gating_func=r.choice([None, 1, 2]),
                       expert_weights_norm=r.random() < 0.5,
                       expert_weights_scale=r.choice([None, 1.0, 2.5]),
                       expert_group_count=groups,
                       expert_group_used_count=(None if groups in (None, 1)
                                                else r.randint(1, groups - 1)),
                       exp_probs_bias=r.random() < 0.5, tied=r.random() < 0.5,
                       rope_freq_base=r.choice([1e4, 1e6]))
    used = e if groups in (None, 1) else s.expert_group_used_count * (e // groups)
    s = s.replace(n_expert_used=r.randint(1, used))
    if r.random() < 0.4:
        return s.replace(rope_scaling=None, yarn_mscale_all_dim=None)
    return s.replace(rope_scaling={"type": "yarn", "factor": r.choice([4.0, 40.0]),
                                   "original_context_length": r.choice([16, 64])},
                     yarn_mscale_all_dim=r.choice([None, 0.707, 1.0]))


def optional_tensors(family: str, shape: Any, seed: int) -> tuple[Any, tuple[str, ...]]:
    """(shape, fusions for ``write_model``): the draw's q/k/v biases and fused tensors, each where
    llama.cpp's graph for the family takes them, drawn apart from the draws above so that those
    stay what they were."""
    o = random.Random(f"{family}-{seed}-optional")
    fuse = []
    if family != "deepseek2":
        if o.random() < 0.4:
            shape = shape.replace(qkv_bias=True)
        if o.random() < 0.4:
            fuse.append("qkv")
            if shape.qkv_bias and o.random() < 0.5:
                fuse.append("qkv_bias")
    if family in ("qwen35moe", "deepseek2") and seed % 2:  # fused experts on every other draw
        if family == "qwen35moe" or shape.n_dense_lead < shape.n_layer:
            fuse.append("gate_up_exps")
    return shape, tuple(fuse)


FAMILIES = {
    "qwen3": lambda r: qwen3(r, False),
    "qwen3moe": lambda r: qwen3(r, True),
    "qwen35": lambda r: qwen35(r, False),
    "qwen35moe": lambda r: qwen35(r, True),
    "deepseek2": deepseek2,
}


class Draw(NamedTuple):
    shape: Any
    fuse: tuple[str, ...]
    n_prompt: int
    n_decode: int
    path: Path  # the model file
    tokens: list[int]  # the prompt's, then the decode steps'

    def __str__(self) -> str:
        return (f"{self.shape} fused {self.fuse} ({self.n_prompt} prompt tokens, "
                f"{self.n_decode} steps)")


def make_draw(family: str, seed: int, directory: Path) -> Draw:
    """Draw ``seed`` of ``family``: its shape, optional tensors, prompt length and decode steps,
    the model written to ``directory``/m.gguf, the tokens (bench/oracle_sweep.py draws by the
    thousand with it)."""
    r = random.Random(f"{family}-{seed}")
    shape = FAMILIES[family](r)
    n_prompt, n_decode = r.randint(1, 17), r.randint(0, 5)
    shape, fuse = optional_tensors(family, shape, seed)
    path = write_model(directory / "m.gguf", shape, seed=seed, fuse=fuse)
    tokens = oracle.random_tokens(shape.n_vocab, n_prompt + n_decode, seed)
    return Draw(shape, fuse, n_prompt, n_decode, path, tokens)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_random_shape_matches_llama_cpp(tmp_path, family, seed):
    d = make_draw(family, seed, tmp_path)
    ref = oracle.llama_logits(d.path, d.tokens, n_prompt=d.n_prompt, kv_type="f32")
    got = oracle.reflex_logits(d.path, d.tokens, n_prompt=d.n_prompt)
    oracle.check_logits(ref, got, BOUND, str(d))
