"""One cold invocation through the Python API (issue 16): import reflex_core, load the model,
generate N tokens (default 1), exit -- to time against ``reflex generate`` (bench/coldstart.py
--extra).

    python bench/api_once.py MODEL.gguf PROMPT [N]
"""

import sys

import reflex_core

n = int(sys.argv[3]) if len(sys.argv) > 3 else 1
with reflex_core.load(sys.argv[1], backend="cuda") as engine:
    out = engine.generate(sys.argv[2], max_tokens=n)
print(repr(out.text))
print("REFLEX_API_OK")
