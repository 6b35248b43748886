"""Greedy decoding of a GGUF file with decode graphs against eager steps, on the GPU: prints
whether the token ids are the same (tests/gpu checks this on tiny models; this runs it on the
shaped files, whose kernels are large enough for launch overlap to matter).

usage: python3 bench/graph_equal.py MODEL.gguf [N_TOKENS [PROMPT_TOKENS]]
PROMPT_TOKENS (default 10) repeats the prompt's ids to that length: from 512 cells of cache the
decode attention runs in slices (cuda_backend.attention_splits). Exit status 1 when the two
differ."""

from __future__ import annotations

import os
import sys

from reflex_core import engine
from reflex_core.sampling import SamplingParams
from reflex_core.timing import Timings

GREEDY = SamplingParams(0.0, 0, 1.0, None)
PROMPT = [5, 9, 17, 3, 44, 12, 7, 1000, 2000, 31]


def main() -> int:
    path = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 48
    n_prompt = int(sys.argv[3]) if len(sys.argv) > 3 else len(PROMPT)
    prompt = (PROMPT * (n_prompt // len(PROMPT) + 1))[:n_prompt]
    lm = engine.load(path, "cuda")[0]
    try:
        out = {}
        for graphs in ("0", "1"):
            os.environ["REFLEX_CUDA_GRAPHS"] = graphs
            t = Timings()
            res = engine.generate(lm, prompt, n, GREEDY, timings=t)
            out[graphs] = (res.token_ids, t.notes.get("decode", ""))
    finally:
        lm.close()
    same = out["0"][0] == out["1"][0]
    print(f"{os.path.basename(path)}: {n_prompt}-token prompt, {n} greedy tokens, graphs "
          f"({out['1'][1]}) {'equal to' if same else 'DIFFER from'} eager")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
