"""Benchmark: GGUF header + metadata + tensor directory parse on a Qwen3-0.6B-shaped file.

    python bench/bench_parse.py [--path FILE] [--runs 5] [--gguf-reader]

The file is written once (cached at --path) with gguf-py's GGUFWriter: the real Qwen3
tokenizer (151,936 tokens, 151,387 merges, token_type) and the 310 tensors of Qwen3-0.6B
(Q8_0 matrices, F32 norms). The tensor data is all zero bytes (a sparse file); only the
directory and the sizes matter here.

Timed:
  * fresh process: `import reflex_core.gguf`, `open_gguf` (header + metadata + directory),
    decoding all tokens and all merges; median of --runs processes;
  * in-process: the same steps repeated in one warm process (median);
  * optionally (--gguf-reader) gguf.GGUFReader once, for comparison (several seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_PATH = os.path.join("/tmp", "reflex_bench", "qwen3-0.6b-shaped-q8_0.gguf")

# Qwen3-0.6B shape
N_LAYER, D, N_HEAD, N_HEAD_KV, HEAD_DIM, FF, N_VOCAB = 28, 1024, 16, 8, 128, 3072, 151936


def qwen3_tokenizer():
    """(tokens, token_types, merges) of the real Qwen3 tokenizer, padded to N_VOCAB."""
    from reflex_core.testing.modelwriter import qwen3_tokenizer_json_path

    tj = json.loads(qwen3_tokenizer_json_path().read_text(encoding="utf-8"))
    vocab = tj["model"]["vocab"]
    tokens = [""] * N_VOCAB
    types = [0] * N_VOCAB
    for tok, i in vocab.items():
        tokens[i], types[i] = tok, 1  # NORMAL
    for at in tj["added_tokens"]:
        content = at["content"]
        # convert_hf_to_gguf's rule: special or "<|...|>"-looking -> CONTROL, else USER_DEFINED
        control = at["special"] or (content.startswith("<|") and content.endswith("|>"))
        tokens[at["id"]], types[at["id"]] = content, 3 if control else 4
    for i in range(N_VOCAB):
        if types[i] == 0:
            tokens[i], types[i] = f"[PAD{i}]", 5  # UNUSED
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    return tokens, types, merges


def qwen3_tensors():
    """[(name, numpy-order shape, 'Q8_0' | 'F32')] in llama.cpp's order."""
    out = [("token_embd.weight", (N_VOCAB, D), "Q8_0")]
    q, kv = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
    for i in range(N_LAYER):
        p = f"blk.{i}."
        out += [
            (p + "attn_norm.weight", (D,), "F32"),
            (p + "attn_q.weight", (q, D), "Q8_0"),
            (p + "attn_k.weight", (kv, D), "Q8_0"),
            (p + "attn_v.weight", (kv, D), "Q8_0"),
            (p + "attn_output.weight", (D, q), "Q8_0"),
            (p + "attn_q_norm.weight", (HEAD_DIM,), "F32"),
            (p + "attn_k_norm.weight", (HEAD_DIM,), "F32"),
            (p + "ffn_norm.weight", (D,), "F32"),
            (p + "ffn_gate.weight", (FF, D), "Q8_0"),
            (p + "ffn_up.weight", (FF, D), "Q8_0"),
            (p + "ffn_down.weight", (D, FF), "Q8_0"),
        ]
    out.append(("output_norm.weight", (D,), "F32"))
    return out


def build_file(path: str) -> None:
    import numpy as np
    import gguf

    tokens, types, merges = qwen3_tokenizer()
    tmp = path + ".tmp"
    w = gguf.GGUFWriter(tmp, "qwen3")
    w.add_name("Qwen3-0.6B-shaped benchmark file")
    w.add_block_count(N_LAYER)
    w.add_context_length(40960)
    w.add_embedding_length(D)
    w.add_feed_forward_length(FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(7)  # MOSTLY_Q8_0
    w.add_quantization_version(2)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(151645)
    w.add_pad_token_id(151643)
    w.add_bos_token_id(151643)
    w.add_add_bos_token(False)
    w.add_chat_template("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n'"
                        " + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}" * 20)
    sizes = []
    for name, shape, kind in qwen3_tensors():
        n = 1
        for s in shape:
            n *= s
        if kind == "F32":
            nbytes = n * 4
            w.add_tensor_info(name, shape, np.dtype(np.float32), nbytes)
        else:
            nbytes = n // 32 * 34
            w.add_tensor_info(name, shape, np.dtype(np.float32), nbytes,
                              raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        sizes.append(nbytes)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    f = w.fout[0]
    align = w.data_alignment
    pos = f.tell()
    pos += -pos % align
    for nbytes in sizes:
        pos += nbytes + (-nbytes % align)
    f.truncate(pos)  # zero tensor data, sparse on disk (the parse never reads it)
    w.close()
    os.replace(tmp, path)


CHILD = r"""
import sys, time, gc
t0 = time.perf_counter()
from reflex_core.gguf import open_gguf
t1 = time.perf_counter()
g = open_gguf(sys.argv[1])
t2 = time.perf_counter()
toks = g.metadata["tokenizer.ggml.tokens"].tolist()
t3 = time.perf_counter()
merges = g.metadata["tokenizer.ggml.merges"].tolist()
t4 = time.perf_counter()
assert len(toks) == 151936 and len(merges) == 151387 and len(g.tensors) == 310
print((t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3, (t4 - t3) * 1e3)
"""


def fresh_runs(path: str, runs: int):
    # bytecode cached (as in an installed package), outside the repo
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONPYCACHEPREFIX=os.path.join(os.path.dirname(path), "pycache"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    subprocess.run([sys.executable, "-c", "import reflex_core.gguf"], env=env, check=True)
    rows = []
    for _ in range(runs):
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", CHILD, path], env=env, check=True,
                             capture_output=True, text=True).stdout
        wall = (time.perf_counter() - t0) * 1e3
        rows.append([float(x) for x in out.split()] + [wall])
    return rows


def in_process(path: str, runs: int):
    sys.path.insert(0, REPO)
    from reflex_core.gguf import open_gguf

    rows = []
    for _ in range(runs):
        t0 = time.perf_counter()
        g = open_gguf(path)
        t1 = time.perf_counter()
        g.metadata["tokenizer.ggml.tokens"].tolist()
        t2 = time.perf_counter()
        g.metadata["tokenizer.ggml.merges"].tolist()
        t3 = time.perf_counter()
        g.close()
        rows.append([(t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--path", default=DEFAULT_PATH, help="cached benchmark GGUF (written if missing)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rebuild", action="store_true", help="rewrite the file even if it exists")
    ap.add_argument("--gguf-reader", action="store_true", help="also time gguf.GGUFReader once (slow)")
    args = ap.parse_args()

    if args.rebuild or not os.path.exists(args.path):
        os.makedirs(os.path.dirname(os.path.abspath(args.path)), exist_ok=True)
        t0 = time.perf_counter()
        build_file(args.path)
        print(f"wrote {args.path} ({os.path.getsize(args.path) / 1e6:.0f} MB) in "
              f"{time.perf_counter() - t0:.1f} s")

    fr = fresh_runs(args.path, args.runs)
    ip = in_process(args.path, max(args.runs, 5))
    med = lambda rows, i: statistics.median(r[i] for r in rows)  # noqa: E731
    lo_hi = lambda rows, i: (min(r[i] for r in rows), max(r[i] for r in rows))  # noqa: E731

    print(f"\nfile: {args.path}  ({os.path.getsize(args.path) / 1e6:.0f} MB, "
          f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]})")
    print(f"{'step (ms)':<44}{'median':>9}{'min':>9}{'max':>9}")
    table = [
        (f"fresh process ({args.runs}x): import reflex_core.gguf", fr, 0),
        ("fresh process: open_gguf (hdr+meta+dir)", fr, 1),
        ("fresh process: tokens .tolist()", fr, 2),
        ("fresh process: merges .tolist()", fr, 3),
        ("fresh process: whole child, launch->exit", fr, 4),
        (f"in-process ({len(ip)}x): open_gguf", ip, 0),
        ("in-process: tokens .tolist()", ip, 1),
        ("in-process: merges .tolist()", ip, 2),
    ]
    for label, rows, i in table:
        lo, hi = lo_hi(rows, i)
        print(f"{label:<44}{med(rows, i):>9.1f}{lo:>9.1f}{hi:>9.1f}")

    if args.gguf_reader:
        import gguf

        t0 = time.perf_counter()
        gguf.GGUFReader(args.path)
        print(f"{'gguf.GGUFReader(path), once (numpy imported)':<44}"
              f"{(time.perf_counter() - t0) * 1e3:>9.1f}")


if __name__ == "__main__":
    main()
