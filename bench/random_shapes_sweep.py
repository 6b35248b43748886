"""Every family on many random hyper-parameters (the generators of
tests/test_oracle_random_shapes.py), the GPU against the NumPy reference: logits of a prompt of
1-17 or 60-600 tokens and six decode steps (within 1e-4 of the reference's scale for F32 weights,
3e-3 for the others), and 12 greedy tokens with decode graphs equal to eager steps. Prints each
draw that fails (BAD, or ERR with the error) and a count. Runs on the GPU machine; tests/gpu
holds a fixed-seed sample of it (test_random_shapes_gpu.py).

usage: python3 bench/random_shapes_sweep.py DRAWS_A_FAMILY [--kquant] [--first SEED]
--kquant: dimensions made multiples of 256 (where a shape allows), weights Q4_K / Q5_K / Q6_K /
Q4_0 in turn (a draw the writer cannot quantize is skipped and counted); otherwise F32 / F16 /
BF16 / Q8_0 in turn (F32 where Q8_0's blocks do not fit).
2026-12-05, H200, the same sweep as an ad-hoc script before it became this file: 750 draws (70 s)
and 200 `--kquant --first 500` draws (36 s), nothing found but legacy DeepSeek draws with
query-key heads over 256, which the CUDA attention refuses in one line.
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from test_oracle_random_shapes import FAMILIES  # noqa: E402

from reflex_core import engine  # noqa: E402
from reflex_core.sampling import SamplingParams  # noqa: E402
from reflex_core.testing import oracle  # noqa: E402
from reflex_core.testing.modelwriter import write_model  # noqa: E402

GREEDY = SamplingParams(0.0, 0, 1.0, None)


def rel(a, b) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def kquant(fam, s, r):
    """``s`` with the dimensions that are some tensor's rows made multiples of 256."""
    c = dict(n_embd=r.choice([256, 512]), n_ff=r.choice([256, 512, 768]))
    if fam in ("qwen3", "qwen3moe"):
        c.update(head_dim=r.choice([64, 128, 256]))
        if (s.n_head * c["head_dim"]) % 256:
            c["n_head"] = s.n_head_kv * 4
    if fam.endswith("moe") or fam == "deepseek2":
        c.update(n_ff_exp=r.choice([256, 512]))
    if fam.startswith("qwen35"):
        c.update(head_dim=r.choice([128, 256]), ssm_state_size=r.choice([64, 128]))
        c["n_rot"] = min(s.n_rot, c["head_dim"])
        if fam == "qwen35moe":
            c.update(n_ff=0, n_ff_shexp=r.choice([256, 512]))
    if fam == "deepseek2":
        c.update(q_lora_rank=256, kv_lora_rank=256, qk_nope_head_dim=256,
                 v_head_dim=r.choice([128, 256]), n_ff=256)
    return s.replace(**c)


def main() -> int:
    draws = int(sys.argv[1])
    kq = "--kquant" in sys.argv
    first = int(sys.argv[sys.argv.index("--first") + 1]) if "--first" in sys.argv else 100
    types = ["Q4_K", "Q5_K", "Q6_K", "Q4_0"] if kq else ["F32", "F16", "BF16", "Q8_0"]
    d = tempfile.mkdtemp()
    bad = checked = skipped = 0
    for fam in sorted(FAMILIES):
        for seed in range(first, first + draws):
            r = random.Random(f"{fam}-{seed}")
            s = FAMILIES[fam](r)
            if kq:
                s = kquant(fam, s, r)
            s = s.replace(context_length=1024)
            wt = types[seed % 4]
            p = os.path.join(d, "m.gguf")
            try:
                write_model(p, s, weight_type=wt, seed=seed)
            except ValueError:
                if kq:
                    skipped += 1
                    continue
                wt = "F32"
                write_model(p, s, weight_type=wt, seed=seed)
            n_prompt = r.choice([r.randint(1, 17), r.randint(60, 400 if kq else 600)])
            toks = oracle.random_tokens(s.n_vocab, n_prompt + 6, seed)
            try:
                ref = oracle.reflex_logits(p, toks, n_prompt=n_prompt)
                lm = engine.load(p, "cuda")[0]
                try:
                    got = oracle.model_logits(lm.model, toks, n_prompt=n_prompt)
                    outs = {}
                    for graphs in ("0", "1"):
                        os.environ["REFLEX_CUDA_GRAPHS"] = graphs
                        outs[graphs] = engine.generate(lm, toks[:n_prompt], 12, GREEDY).token_ids
                finally:
                    lm.close()
                e = rel(got, ref)
                checked += 1
                if not (e < (1e-4 if wt == "F32" else 3e-3) and outs["0"] == outs["1"]):
                    bad += 1
                    print("BAD", fam, seed, wt, n_prompt, f"{e:.2e}", outs["0"] == outs["1"], s,
                          flush=True)
            except Exception as ex:  # a draw's error is a finding: print it and go on
                bad += 1
                print("ERR", fam, seed, wt, n_prompt, type(ex).__name__, str(ex)[:300], s,
                      flush=True)
    print("checked", checked, "bad", bad, "skipped", skipped)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
