"""The ``reflex`` console entry point: take over SIGINT/SIGTERM, start CUDA, then import the CLI.

The signal handlers come first (reflex_core.lifecycle.handle_signals): a Ctrl-C during the
imports below is one line and exit status 130, not a KeyboardInterrupt traceback.

cuInit and the primary context take ~0.2-0.3 s and release the GIL. Starting them on a thread
before click and the CLI are even imported hides that import time under the driver's work. Only
commands that will use the GPU start it (not ``--backend cpu``, not ``--help``, not ``plugins``).
"""

import sys

GPU_COMMANDS = {"generate", "system1", "smoke", "check", "bench", "stdio", "uds"}


def _wants_gpu(argv: list) -> bool:
    if not argv or argv[0] not in GPU_COMMANDS:
        return False
    if any(a in ("-h", "--help") for a in argv):
        return False
    for i, a in enumerate(argv):
        if a == "--backend" and i + 1 < len(argv) and argv[i + 1] == "cpu":
            return False
        if a == "--backend=cpu":
            return False
    return argv[0] != "bench" or "--cold" not in argv  # bench --cold only spawns processes


def main() -> None:
    from .lifecycle import handle_signals

    handle_signals()
    argv = sys.argv[1:]
    if _wants_gpu([a for a in argv if a != "--debug"]):
        from .cuda.start import start

        start()
    from .cli import main as cli_main

    cli_main()
