"""One cold invocation through the Python API (issue 16): import reflex_core, load the model,
generate N tokens (default 1), exit -- to time against ``reflex generate`` (bench/coldstart.py
--extra).

    python bench/api_once.py MODEL.gguf PROMPT [N]

REFLEX_API_TIMINGS=1: the load's phases (Engine.timings, ms from process start | duration) on
stderr, and the time to the generated result.
"""

import os
import sys
import time

import reflex_core

n = int(sys.argv[3]) if len(sys.argv) > 3 else 1
with reflex_core.load(sys.argv[1], backend="cuda") as engine:
    out = engine.generate(sys.argv[2], max_tokens=n)
    if os.environ.get("REFLEX_API_TIMINGS"):
        from reflex_core.timing import since_process_start_ms

        for name, start, dur in engine.timings:
            print(f"  {name:32s} {start:8.1f} | {dur:8.1f}", file=sys.stderr)
        print(f"  result at {since_process_start_ms():.1f} ms; {engine.timing_notes}",
              file=sys.stderr)
        t_close = time.perf_counter()
if os.environ.get("REFLEX_API_TIMINGS"):
    print(f"  close {(time.perf_counter() - t_close) * 1e3:.1f} ms", file=sys.stderr)
print(repr(out.text))
print("REFLEX_API_OK")
