"""DeepSeek-V2/V3 (deepseek2) on the GPU against the NumPy reference: MLA (with and without the
query LoRA), the legacy attn_kv_b path, DeepSeek's routing (sigmoid + bias + groups, softmax),
prefill of several lengths then decode over the latent cache, the query temperature, and
system1's tree batch."""

from __future__ import annotations

import pytest

from reflex_core import system1
from reflex_core.testing.modelwriter import (tiny_deepseek2_kquant_shape, tiny_deepseek2_legacy_shape,
                                             tiny_deepseek2_lite_shape, tiny_deepseek2_shape)

REL = 1e-4  # as tests/gpu/test_models_gpu.py

SHAPES = {
    "v3": tiny_deepseek2_shape(),
    "v2-lite": tiny_deepseek2_lite_shape(),
    "legacy": tiny_deepseek2_legacy_shape(),
    # the query temperature (Mistral-Large-3 files): a new factor every 5 positions
    "v3-temperature": tiny_deepseek2_shape(attn_temperature=(0.8, 5)),
    "legacy-temperature": tiny_deepseek2_legacy_shape(attn_temperature=(0.8, 5)),
}


@pytest.mark.parametrize("name,wtype", [(n, "F32") for n in SHAPES] +
                         [("v3", "Q8_0"), ("legacy", "Q8_0"), ("v3-kq", "Q4_K")])
@pytest.mark.parametrize("n_prompt", [1, 7, 64, 300])
def test_prefill_and_decode_match_reference(prefill_decode_vs_reference, model_files, name,
                                            wtype, n_prompt):
    shape = tiny_deepseek2_kquant_shape() if name == "v3-kq" else SHAPES[name]
    path = model_files(shape.replace(context_length=512), weight_type=wtype, seed=11)
    prefill_decode_vs_reference(path, n_prompt, REL, f"{name} {wtype}")


@pytest.mark.parametrize("name", ["v3", "legacy"])
def test_system1_tree_batch_same_on_gpu_and_cpu(gpu_and_reference, model_files, name):
    path = model_files(SHAPES[name], weight_type="F32", seed=12)
    load, _ = gpu_and_reference
    g, gm, rm = load(path)
    prompt = list(range(3, 20))
    cands = [[7], [11, 3, 100], [42, 42], [127, 0, 5, 6, 7]]
    got = system1.score(gm, gm.ops, prompt, cands)
    ref = system1.score(rm, rm.ops, prompt, cands)
    for a, b in zip(got, ref):
        assert abs(a - b) < 1e-3 * max(1.0, abs(b)), (got, ref)
    g.close()
