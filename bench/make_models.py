"""Write the synthetic benchmark GGUFs: real tokenizer, random weights, real shapes.

    python bench/make_models.py OUT_DIR [--which 0.6b,8b,30b,q35-0.8b,q35-35b,ds-v2-lite]

0.6b: Qwen3-0.6B-shaped, Q8_0 (~640 MB)      8b: Qwen3-8B-shaped, Q4_K_M mix (~5.0 GB)
8b-q3_k_m: Qwen3-8B-shaped, Q3_K_M mix (~4.1 GB)   8b-iq4_xs: the same, IQ4_XS mix (~4.6 GB)
30b: Qwen3-30B-A3B-shaped (qwen3moe), Q4_K_M mix (~18.5 GB)
30b-iq3_xxs: the same, IQ3_XXS mix (IQ3_XXS experts, IQ2_S attn_q/k, IQ3_S; ~11.8 GB)
30b-iq2_xxs: the same, IQ2_XXS mix (IQ2_XXS, Q2_K; ~8.2 GB)
q35-0.8b: Qwen3.5-0.8B-shaped (qwen35), Q8_0 (~0.8 GB)
q35-35b: Qwen3.5-35B-A3B-shaped (qwen35moe), Q4_K_M mix (~20 GB)
ds-v2-lite: DeepSeek-V2-Lite-shaped (deepseek2, MLA), Q4_K_M mix (~10.4 GB)

The Qwen3 files carry the Qwen3 tokenizer; the Qwen3.5 ones its token list under Qwen3.5's
pre-tokenizer ("qwen35"), padded to Qwen3.5's 248320 ids; the DeepSeek one the DeepSeek-LLM / V2
tokenizer (102400 tokens) copied from llama.cpp's ggml-vocab-deepseek-llm.gguf, found through
REFLEX_LLAMA_VOCAB_DIR (llama.cpp's models/ folder; scripts/test.sh fills one). Random weights make the text
meaningless but the work (bytes moved, kernels run) real. The mixes are llama-quantize's per-tensor
choices for the preset (modelwriter.preset_overrides; made with an importance matrix, as the
Hub's files are). Files that already exist with the right size are kept.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from reflex_core.testing.modelwriter import (PRESETS, deepseek_v2_lite_shape, preset_overrides,
                                             qwen3_0_6b_shape, qwen3_8b_shape, qwen3_30b_a3b_shape,
                                             qwen35_0_8b_shape, qwen35_35b_a3b_shape, write_model)

# name -> (file name, shape function, weight type or llama-quantize preset, tokenizer)
MODELS = {
    "0.6b": ("qwen3-0.6b-shaped-q8_0.gguf", qwen3_0_6b_shape, "Q8_0", "qwen3"),
    "8b": ("qwen3-8b-shaped-q4_k_m.gguf", qwen3_8b_shape, "Q4_K_M", "qwen3"),
    "8b-q3_k_m": ("qwen3-8b-shaped-q3_k_m.gguf", qwen3_8b_shape, "Q3_K_M", "qwen3"),
    "8b-iq4_xs": ("qwen3-8b-shaped-iq4_xs.gguf", qwen3_8b_shape, "IQ4_XS", "qwen3"),
    "30b": ("qwen3-30b-a3b-shaped-q4_k_m.gguf", qwen3_30b_a3b_shape, "Q4_K_M", "qwen3"),
    "30b-iq3_xxs": ("qwen3-30b-a3b-shaped-iq3_xxs.gguf", qwen3_30b_a3b_shape, "IQ3_XXS", "qwen3"),
    "30b-iq2_xxs": ("qwen3-30b-a3b-shaped-iq2_xxs.gguf", qwen3_30b_a3b_shape, "IQ2_XXS", "qwen3"),
    "q35-0.8b": ("qwen35-0.8b-shaped-q8_0.gguf", qwen35_0_8b_shape, "Q8_0", "qwen35"),
    "q35-35b": ("qwen35-35b-a3b-shaped-q4_k_m.gguf", qwen35_35b_a3b_shape, "Q4_K_M", "qwen35"),
    "ds-v2-lite": ("deepseek-v2-lite-shaped-q4_k_m.gguf", deepseek_v2_lite_shape, "Q4_K_M",
                   "deepseek-llm"),
}


def make(out: Path, which: str) -> Path:
    if which not in MODELS:
        raise SystemExit(f"unknown model {which!r} (choose from {', '.join(MODELS)})")
    name, shape_fn, quant, tokenizer = MODELS[which]
    path = out / name
    if path.exists() and path.stat().st_size > 0:
        return path
    shape = shape_fn()
    t0 = time.perf_counter()
    tmp = path.with_suffix(".partial")
    if quant in PRESETS:
        wtype, overrides = PRESETS[quant], preset_overrides(shape, quant)
    else:
        wtype, overrides = quant, None
    write_model(tmp, shape, weight_type=wtype, tokenizer=tokenizer, seed=1,
                type_overrides=overrides)
    tmp.rename(path)
    print(f"wrote {path} ({path.stat().st_size / 1e9:.2f} GB) in {time.perf_counter() - t0:.1f} s",
          flush=True)
    return path


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--which", default="0.6b,8b")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    for w in a.which.split(","):
        print(make(a.out, w.strip()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
