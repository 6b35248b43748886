"""Wall-clock phases of one invocation, measured from the OS's process start time.

``process_start_to_*_ms`` figures count from when the kernel created this process (the
``starttime`` field of /proc/self/stat, clock ticks since boot, compared with CLOCK_BOOTTIME),
not from when Python got control, so interpreter start-up is included. The kernel records that
time in clock ticks (10 ms on common Linux builds); phases after it are measured with
``time.perf_counter`` against a single anchor taken at import.
"""

from __future__ import annotations

import os
import time

_ANCHOR_PERF = time.perf_counter()
_ANCHOR_BOOT = time.clock_gettime(time.CLOCK_BOOTTIME) if hasattr(time, "CLOCK_BOOTTIME") else None


def _process_start_boottime() -> float | None:
    """Seconds since boot at which this process started, or None if the OS does not say."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        # comm (field 2) may contain spaces and parentheses: split after the last ')'.
        fields = stat[stat.rindex(b")") + 2:].split()
        return int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 overall
    except (OSError, ValueError, IndexError):
        return None


_START_BOOT = _process_start_boottime()


def since_process_start_ms(perf: float | None = None) -> float:
    """Milliseconds from the OS process start to ``perf`` (a perf_counter value; default now)."""
    perf = time.perf_counter() if perf is None else perf
    if _START_BOOT is None or _ANCHOR_BOOT is None:
        return (perf - _ANCHOR_PERF) * 1000.0  # best effort: from this module's import
    return ((_ANCHOR_BOOT - _START_BOOT) + (perf - _ANCHOR_PERF)) * 1000.0


class Timings:
    """Named phases, each recorded as (start, end) perf_counter pairs. ``t_main``: when the
    command got control (this object was made), where the report's first row ends."""

    def __init__(self) -> None:
        self.t_main = time.perf_counter()
        self.phases: dict[str, tuple[float, float]] = {}
        self.notes: dict[str, str] = {}  # free-form details printed after the phases

    def phase(self, name: str, start: float, end: float | None = None) -> None:
        self.phases[name] = (start, time.perf_counter() if end is None else end)

    class _Span:
        def __init__(self, owner: "Timings", name: str):
            self.owner, self.name = owner, name

        def __enter__(self):
            self.t0 = time.perf_counter()
            return self

        def __exit__(self, *exc):
            self.owner.phase(self.name, self.t0)
            return False

    def span(self, name: str) -> "_Span":
        return Timings._Span(self, name)

    def report(self) -> list[tuple[str, float, float]]:
        """[(phase, start_ms_since_process_start, duration_ms)] in start order."""
        rows = [("interpreter start to main", 0.0, since_process_start_ms(self.t_main))]
        for name, (a, b) in sorted(self.phases.items(), key=lambda kv: kv[1][0]):
            rows.append((name, since_process_start_ms(a), (b - a) * 1000.0))
        return rows
