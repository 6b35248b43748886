"""bench/phase_trace.py's analysis of a trace build's records (no GPU): launches are told apart
by kind, width and time (the GEMVs' and the decode attention's records together), and each phase
is the median over a launch's blocks."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("phase_trace", ROOT / "bench" / "phase_trace.py")
phase_trace = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(phase_trace)

MHZ = 1980.0
# (kind, width, type, blocks, us from its wait to its median block's end, tiles a block)
LAYER = [(320, 4096, 12, 300, 6.0, 0), (401, 128, 0, 32, 3.0, 0), (110, 4096, 12, 256, 4.0, 1),
         (121, 4096, 12, 264, 20.0, 6), (110, 12288, 12, 132, 13.0, 2)]


def stamps_3(kind: int) -> bool:
    """Whether a kind records its fourth stamp: the streamed GEMVs (their first slot landed) and
    the attention (the batch's rows loaded)."""
    return kind < 200 or kind >= 400


def records(steps: int, layers: int, seed: int = 7) -> np.ndarray:
    """Records as a trace build writes them: each launch's blocks start 2 us before the launch
    ahead ends, wait until 0.5 us after it, stage x for 0.7 us (1.5 us for the 12288-wide),
    see their first slot 0.25 us later (stamps_3 kinds), end their first tile 1.25 us after
    staging; block b of B ends b / B us after the first block (so the tail is 0.5 us)."""
    rng = np.random.default_rng(seed)
    out = []
    end = 1000.0  # us
    for _ in range(steps):
        for _ in range(layers):
            for kind, width, ty, blocks, dur, tiles in LAYER:
                wait = end + 0.5
                stage = 1.5 if width == 12288 else 0.7
                for b in range(blocks):
                    g = [end - 2.0 + rng.random() * 0.1, wait, wait + stage,
                         wait + stage + 0.25 if stamps_3(kind) else 0.0, wait + stage + 1.25,
                         wait + dur + b / blocks]
                    r = np.zeros(16, np.uint64)
                    r[0] = (kind << 32) | b
                    r[1] = ((b % 132) << 32) | blocks
                    r[2:8] = [int(round(t * 1000)) for t in g]
                    r[8:14] = [int(round(t * MHZ)) if t else 0 for t in g]
                    r[14] = width | (ty << 24) | (tiles << 16 if kind < 200 else 0)
                    out.append(r)
                end = wait + dur + (blocks - 1) / blocks
    return np.array(out, dtype=np.uint64)


def test_phases_of_each_launch(capsys):
    rows = phase_trace.analyze(records(2, 3), 2)
    assert sorted(rows) == [(110, 4096), (110, 12288), (121, 4096), (320, 4096), (401, 128)]
    for (kind, width), rs in rows.items():
        assert len(rs) == 6  # one launch a layer and step
        blocks = next(b for kd, w, _, b, _, _ in LAYER if (kd, w) == (kind, width))
        assert all(r["blocks"] == blocks for r in rs)
        stage = np.median([r["stage_us"] for r in rs])
        assert stage == pytest.approx(1.5 if width == 12288 else 0.7, abs=0.01)
        # from the first slot's landing (streamed) or from x staged (the row loop)
        tile1 = 1.0 if stamps_3(kind) else 1.25
        assert np.median([r["tile1_us"] for r in rs]) == pytest.approx(tile1, abs=0.01)
        if stamps_3(kind):
            assert np.median([r["land_us"] for r in rs]) == pytest.approx(0.25, abs=0.01)
        else:
            assert np.isnan(rs[0]["land_us"])
        # every launch after the first waits until 0.5 us after the one ahead ends
        assert all(r["release_us"] == pytest.approx(0.5, abs=0.01) for r in rs if "release_us" in r)
        # its blocks start 2.0-1.9 us before the one ahead ends: the first and the last of them
        after = [r for r in rs if "early_us" in r]
        assert after and all(1.899 <= r["early_us"] <= 2.001 for r in after)
        assert all(-2.001 <= r["late_us"] <= -1.899 and r["late_us"] >= -r["early_us"]
                   for r in after)
        assert np.median([r["tail_us"] for r in rs]) == pytest.approx(0.5, abs=0.02)
    out = capsys.readouterr().out
    assert "30 launches" in out and "stream SwiGLU reader" in out
    assert "RoPE + attention | - | 128 |" in out  # the attention: no weight type
