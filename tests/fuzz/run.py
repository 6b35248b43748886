"""Run one fuzz target: under atheris (coverage-guided, libFuzzer), or over given inputs once.

    python tests/fuzz/run.py TARGET [--seconds 60] [--out DIR] [--seed N]   # fuzz (atheris)
    python tests/fuzz/run.py TARGET --replay PATH...   # each file (or folder's files) once

TARGET is one of reader, tokenizer, hparams, index (tests/fuzz/targets.py). The seeds are the
files in tests/fuzz/seeds/ (valid tiny models and the known-bad reproducers; ``make_seeds.py``
writes them) -- for ``index``, tests/fuzz/seeds-index/ plus the valid index the index writer
makes at start. New inputs go to ``--out``/corpus, findings to ``--out``/ (crash-*, timeout-*,
oom-*), a fresh temporary folder by default. ``--replay`` needs no atheris (the tests replay
the seeds with it).

A finding is:
* any exception other than a ReflexError (the project's one-line errors); for ``index``, any
  exception at all and any result that differs from the model's own (see targets.py);
* an input that runs longer than ``--timeout`` seconds (libFuzzer's -timeout; SIGALRM when
  replaying);
* an allocation over the memory bound: the address space is capped (RLIMIT_AS) at what the
  process has mapped after setup plus ``--headroom-mb`` (1 GiB: an input of at most 64 KB has
  no reason to need more), so an oversized allocation raises MemoryError (or aborts native
  code); libFuzzer's -rss_limit_mb catches slow growth.

Only reflex_core and the two plugins are instrumented for coverage. Exit status: 0 when nothing
was found (libFuzzer's own status otherwise: 1, or 77 for a Python exception); replay: 1.
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import sys
import tempfile
import traceback
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/: the package ``fuzz``

INSTRUMENTED = ["reflex_core", "reflex_qwen3", "reflex_qwen3_moe"]
MAX_LEN = 65536


def _vm_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def _cap_memory(headroom_mb: int) -> int:
    limit = _vm_bytes() + headroom_mb * 2 ** 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return limit


class Hang(Exception):
    pass


def replay(fn, paths: list[str], timeout: int, headroom_mb: int) -> int:
    """Run ``fn`` on every input once; print each finding; 1 if there was one."""
    files = []
    for p in paths:
        if os.path.isdir(p):
            files += sorted(os.path.join(p, n) for n in os.listdir(p))
        else:
            files.append(p)
    limit = _cap_memory(headroom_mb)

    def alarm(signum, frame):
        raise Hang(f"still running after {timeout} s")

    signal.signal(signal.SIGALRM, alarm)
    found = 0
    for path in files:
        with open(path, "rb") as f:
            data = f.read()
        signal.alarm(timeout)
        try:
            fn(data)
        except Exception:  # noqa: BLE001 - the target lets only findings through
            found += 1
            print(f"FINDING {path}:\n{traceback.format_exc()}", flush=True)
        finally:
            signal.alarm(0)
    print(f"replayed {len(files)} inputs (address space capped at {limit / 2 ** 30:.2f} GiB): "
          f"{found} findings", flush=True)
    return 1 if found else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("target", choices=["reader", "tokenizer", "hparams", "index"])
    ap.add_argument("--seconds", type=int, default=60, help="fuzzing time (default 60)")
    ap.add_argument("--out", help="folder for the new corpus and the findings (default: temp)")
    ap.add_argument("--seed", type=int, default=1, help="libFuzzer's random seed (default 1)")
    ap.add_argument("--timeout", type=int, default=10, help="seconds per input (default 10)")
    ap.add_argument("--headroom-mb", type=int, default=1024,
                    help="address space allowed above the set-up process (default 1024)")
    ap.add_argument("--seeds", help="seed folder instead of the repository's")
    ap.add_argument("--replay", nargs="+", metavar="PATH", help="run these inputs once")
    args = ap.parse_args(argv)
    # numbers overflowing in the forward pass of a mutated model are not findings; printing
    # each warning would only slow the run down
    warnings.simplefilter("ignore")

    if args.replay:
        from fuzz import targets

        targets.preload()
        fn = targets.TARGETS[args.target]
        if args.target == "index":
            targets.index_setup()
        try:
            return replay(fn, args.replay, args.timeout, args.headroom_mb)
        finally:
            targets.cleanup()

    import atheris

    with atheris.instrument_imports(include=INSTRUMENTED):
        from fuzz import mutate, targets

        targets.preload()
    fn = targets.TARGETS[args.target]

    out = args.out or tempfile.mkdtemp(prefix=f"reflex-fuzz-{args.target}-")
    corpus = os.path.join(out, "corpus")
    os.makedirs(corpus, exist_ok=True)
    targets.set_workdir(os.path.join(out, "work"))
    seeds = [args.seeds or os.path.join(HERE, "seeds-index" if args.target == "index" else
                                        "seeds")]
    if args.target == "index":
        with open(os.path.join(corpus, "valid-index"), "wb") as f:
            f.write(targets.index_setup())
    limit = _cap_memory(args.headroom_mb)

    def custom_mutator(data: bytes, max_size: int, seed: int) -> bytes:
        return mutate.mutate(data, max_size, seed, atheris.Mutate)

    lf = [sys.argv[0], f"-timeout={args.timeout}", "-rss_limit_mb=2048", f"-max_len={MAX_LEN}",
          f"-artifact_prefix={out}{os.sep}", "-print_final_stats=1",
          f"-max_total_time={args.seconds}", f"-seed={args.seed}", corpus, *seeds]
    print(f"fuzz {args.target}: {' '.join(lf[1:])} (address space capped at "
          f"{limit / 2 ** 30:.2f} GiB)", flush=True)
    atheris.Setup(lf, fn, custom_mutator=custom_mutator)
    atheris.Fuzz()  # libFuzzer exits the process itself
    return 0


if __name__ == "__main__":
    sys.exit(main())
