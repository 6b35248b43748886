"""Side-by-side cold start: reflex vs llama-simple vs llama-cpp-python, same GGUF, same prompt.

    python bench/coldstart.py --models M1.gguf[,M2.gguf] --llama-simple PATH --out DIR
                              [--runs 5] [--drop-cache] [--system1] [--workloads W1,W2,W3,W4]

Engines alternate run by run (reflex, llama-simple, llama-cpp-python, reflex, ...) so drift in
clocks or caches hits all of them alike. Each run is a fresh process; wall time is launch -> exit
measured here; GPU energy is NVML's counter before/after, raw and minus the idle power measured
at the start of the same run. With --drop-cache the page cache is dropped before EVERY launch
(echo 3 > /proc/sys/vm/drop_caches as root, else fadvise DONTNEED on the model file).
Writes DIR/coldstart.json and prints a markdown table with medians and ratios.

--workloads runs issue 17's jobs instead of the one-token default: W1 the 5-token prompt -> 1
token, W2 a ~1500-token prompt -> 1 token, W3 the same prompt -> 128 tokens (greedy; every
engine stops at 128 or at an end-of-generation token: compare the token counts in the runs'
tails -- reflex's status line has n_tokens), W4 reflex system1 with 3 candidates after the long
prompt (the peers have no single-pass scorer).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from pathlib import Path

from reflex_core import bench as rb

PROMPT = "The capital of France is"
# ~1500 tokens with the Qwen3 tokenizer (1518): a document an agent's prompt would carry
LONG_PROMPT = (("The history of the river valley begins with small farming villages that traded "
                "grain, salt and pottery along the water. Over centuries the villages grew into "
                "towns, the towns built bridges and mills, and the mills brought merchants from "
                "distant cities. ") * 33).strip()
HERE = Path(__file__).resolve().parent
# name -> (prompt, tokens to generate, system1)
WORKLOADS = {"W1": (PROMPT, 1, False), "W2": (LONG_PROMPT, 1, False),
             "W3": (LONG_PROMPT, 128, False), "W4": (LONG_PROMPT, 0, True)}


def engines(model: str, llama_simple: str | None, system1: bool,
            extra: list[str] = (), prompt: str = PROMPT, n: int = 1) -> dict[str, list[str]]:
    e = {}
    if system1:  # the peers have no single-pass scorer: reflex system1 (and --extra) alone
        e["reflex system1"] = rb.reflex_cmd() + [
            "system1", model, "-p", prompt, "--backend", "cuda", "--candidate", " Paris",
            "--candidate", " London", "--candidate", " Berlin"]
    else:
        e["reflex"] = rb.reflex_cmd() + ["generate", model, "-p", prompt, "-n", str(n),
                                         "--backend", "cuda"]
        if llama_simple:
            e["llama-simple"] = [llama_simple, "-m", model, "-n", str(n), prompt]
        try:
            import llama_cpp  # noqa: F401

            e["llama-cpp-python"] = [sys.executable, str(HERE / "llama_cpp_python_once.py"),
                                     model, prompt, str(n)]
        except ImportError:
            pass
    for spec in extra:  # NAME=COMMAND LINE with {model}, {prompt} and {n}
        name, line = spec.split("=", 1)
        e[name] = [w.format(model=model, prompt=prompt, n=n) for w in shlex.split(line)]
    return e


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", required=True)
    ap.add_argument("--llama-simple", default=None)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--drop-cache", action="store_true")
    ap.add_argument("--both-caches", action="store_true", help="warm and dropped, one after the other")
    ap.add_argument("--system1", action="store_true")
    ap.add_argument("--workloads", default=None, metavar="W1,W2,W3,W4",
                    help="issue 17's jobs (module docstring) instead of prompt -> 1 token")
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--idle-s", type=float, default=3.0)
    ap.add_argument("--extra", action="append", default=[], metavar="NAME=CMD",
                    help="another engine: a command line with {model}, {prompt} and {n} (the "
                         "tokens to generate; A/B runs: 'reflex venv=/venv/bin/reflex generate "
                         "{model} -p {prompt} -n {n}')")
    ap.add_argument("--only-extra", action="store_true", help="run only the --extra engines")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    energy = rb.Energy()
    idle = rb.idle_watts(energy, a.idle_s)
    print(f"idle GPU power: {idle if idle is None else round(idle, 1)} W ({energy.error or 'NVML ok'})",
          flush=True)
    results = []
    modes = [False, True] if a.both_caches else [a.drop_cache]
    jobs = ([(w, *WORKLOADS[w]) for w in a.workloads.split(",")] if a.workloads
            else [("", PROMPT, 1, a.system1)])
    for model in a.models.split(","):
        for (job, prompt, n, system1), drop in [(j, d) for j in jobs for d in modes]:
            eng = engines(model, a.llama_simple, system1, a.extra, prompt, n)
            if a.only_extra:
                eng = {k: v for k, v in eng.items() if any(x.startswith(k + "=") for x in a.extra)}
            runs: dict[str, list[dict]] = {k: [] for k in eng}
            method = ""
            for i in range(a.runs):
                for name, cmd in eng.items():
                    def before():
                        nonlocal method
                        if drop:
                            method = rb.drop_page_cache([model])
                    r = rb.measure(cmd, energy, idle, before=before)
                    runs[name].append(r)
                    j = f" gpuJ={r['gpu_j']:.1f}" if "gpu_j" in r else ""
                    print(f"{Path(model).name} {job} {'dropped' if drop else 'warm'} {name} run{i} "
                          f"rc={r['rc']} wall={r['wall_s']:.3f}s{j} | {' / '.join(r['tail'])[:160]}",
                          flush=True)
            results.append({"model": model, "workload": job,
                            "page_cache": f"dropped ({method})" if drop else "warm",
                            "idle_w": idle, "runs": runs})
    (a.out / "coldstart.json").write_text(json.dumps(results, indent=1))
    print()
    print("| model | page cache | engine | wall median s (min-max) | ratio vs reflex | GPU J median | GPU J - idle |")
    print("|---|---|---|---|---|---|---|")
    for res in results:
        label = Path(res["model"]).name + (f" {res['workload']}" if res["workload"] else "")
        ok = {k: [r for r in v if r["rc"] == 0] for k, v in res["runs"].items()}
        med = {k: statistics.median(r["wall_s"] for r in v) for k, v in ok.items() if v}
        base = med.get("reflex") or med.get("reflex system1") or next(iter(med.values()), None)
        for k, v in ok.items():
            if not v:
                print(f"| {label} | {res['page_cache']} | {k} | all runs failed | | | |")
                continue
            w = [r["wall_s"] for r in v]
            j = [r["gpu_j"] for r in v if "gpu_j" in r]
            ji = [r["gpu_j_minus_idle"] for r in v if "gpu_j_minus_idle" in r]
            ratio = f"{med[k] / base:.2f}x" if base else ""
            print(f"| {label} | {res['page_cache']} | {k} | {med[k]:.3f} "
                  f"({min(w):.3f}-{max(w):.3f}) | {ratio} | "
                  f"{statistics.median(j):.1f} | {statistics.median(ji):.1f} |" if j else
                  f"| {label} | {res['page_cache']} | {k} | {med[k]:.3f} "
                  f"({min(w):.3f}-{max(w):.3f}) | {ratio} | n/a | n/a |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
