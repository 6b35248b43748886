"""``reflex check``: the GPU against the NumPy reference on one model file.

Two comparisons, both on the file the user gives:

1. logits, position by position: the prompt as one batch (every position's logits), then a few
   single-token decode steps through each backend's own KV cache, feeding both the reference's
   greedy token. Reported per position: max |diff|, max |diff| / max |ref|, top-1 agreement and
   the reference's margin between its first and second logit.
2. dequantization: for every GGML type present in the file, the GPU's dequantization of tensors
   of that type against ``gguf.quants.dequantize``, bit for bit.

Bounds (why): both backends compute in float32 from identical weights but in different orders
(cuBLAS-free tiled kernels and block reductions on the GPU, BLAS on the CPU). Rounding differences
grow with depth and width; ``REL_BOUND`` = 1e-3 of the largest logit covers 36-layer 4096-wide
models with room to spare while catching any real error (a wrong op moves logits by O(1)). Top-1
must agree wherever the reference's margin exceeds the bound.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

REL_BOUND = 1e-3
DEFAULT_PROMPT = "The capital of France is"
DEFAULT_IDS = [785, 6722, 315, 9625, 374]  # the default prompt in Qwen3's vocabulary


@dataclass
class PositionRow:
    step: str
    position: int
    max_abs: float
    max_rel: float
    top1_ref: int
    top1_gpu: int
    margin: float

    @property
    def ok(self) -> bool:
        return self.max_rel <= REL_BOUND and (
            self.top1_ref == self.top1_gpu or self.margin <= REL_BOUND * 2)


@dataclass
class DequantRow:
    ggml_type: str
    tensor: str
    n_elements: int
    mismatches: int
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.mismatches == 0 and not self.note


@dataclass
class CheckResult:
    positions: list[PositionRow] = field(default_factory=list)
    dequant: list[DequantRow] = field(default_factory=list)
    device: str = ""
    reference_dequant: str = "gguf.quants"
    phase_s: dict[str, float] = field(default_factory=dict)  # where the check's time went
    notices: list[str] = field(default_factory=list)  # e.g. LoRA tensors llama.cpp leaves out

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.positions) and all(r.ok for r in self.dequant)


def _compare(step: str, pos0: int, ref: Any, gpu: Any, rows: list[PositionRow]) -> None:
    import numpy as np

    ref = np.asarray(ref, np.float64)
    gpu = np.asarray(gpu, np.float64)
    for i in range(ref.shape[0]):
        r, g = ref[i], gpu[i]
        diff = float(np.max(np.abs(r - g))) if np.all(np.isfinite(g)) else float("inf")
        scale = float(np.max(np.abs(r))) or 1.0
        top2 = np.partition(r, -2)[-2:]
        rows.append(PositionRow(step, pos0 + i, diff, diff / scale, int(np.argmax(r)),
                                int(np.argmax(g)) if np.all(np.isfinite(g)) else -1,
                                float(top2[1] - top2[0]) / scale))


def check_dequant(g: Any, gpu_ops: Any, max_per_type: int = 3,
                  max_elements: int = 1 << 24) -> list[DequantRow]:
    """GPU dequantization vs gguf.quants, bit for bit, for up to ``max_per_type`` tensors of each
    GGML type in the file: the smallest ones and the largest one up to ``max_elements`` (a
    4096 x 4096 matrix: every block layout and scale path, deep into the tensor), so host memory
    and gguf-py's single-threaded time stay bounded on 8B-class files."""
    import numpy as np
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from .ggml_types import GGML_TYPES

    by_type: dict[int, list[Any]] = {}
    for ti in g.tensors.values():
        if ti.n_elements <= max_elements:
            by_type.setdefault(ti.ggml_type, []).append(ti)
    rows = []
    for t, infos in sorted(by_type.items()):
        name = GGML_TYPES[t].name
        infos = sorted(infos, key=lambda ti: ti.nbytes)
        pick = infos if len(infos) <= max_per_type else infos[:max_per_type - 1] + infos[-1:]
        for ti in pick:
            try:
                got = gpu_ops.to_numpy(gpu_ops.dequantize(gpu_ops.weight(ti.name))).reshape(-1)
            except Exception as e:  # noqa: BLE001 - reported as a failed row
                rows.append(DequantRow(name, ti.name, ti.n_elements, -1, note=f"GPU: {e}"))
                continue
            raw = np.frombuffer(g.tensor_data(ti.name), dtype=np.uint8)
            if t == 0:
                want = raw.view(np.float32)
            else:
                want = dequantize(raw, GGMLQuantizationType(t)).reshape(-1).astype(np.float32)
            if got.shape != want.shape:
                rows.append(DequantRow(name, ti.name, ti.n_elements, -1,
                                       note=f"shape {got.shape} != {want.shape}"))
                continue
            got = np.ascontiguousarray(got, np.float32)
            mism = int(np.count_nonzero(got.view(np.uint32) != want.view(np.uint32)))
            rows.append(DequantRow(name, ti.name, ti.n_elements, mism))
    return rows


GPU_DEQUANT_ABOVE = 2 << 30  # bytes of tensor data


def _gpu_dequantizer(gpu_ops: Any):
    """A NumpyOps dequantizer backed by the GPU kernels (bit-exact with gguf.quants: the
    dequantization check of this same run verifies it on every type in the file)."""
    from .ops import Weight

    def dq(w: Any, expert: int | None) -> Any:
        gw = gpu_ops.weight(w.name)
        if expert is not None:
            gw = Weight(gw.name, gw.ggml_type, tuple(gw.ne[:2]),
                        gw.data + expert * gw.meta.expert_bytes)
        return gpu_ops.to_numpy(gpu_ops.dequantize(gw))

    return dq


def run_check(path: str, prompt: str | None = None, n_decode: int = 4,
              reference_dequant: str = "auto",
              lora: Sequence[tuple[str, float]] = ()) -> CheckResult:
    """``lora``: (adapter path, scale) pairs merged into both backends' weights (the
    dequantization rows still compare the file's own tensors, checked before the merge)."""
    from .backends import get_backend
    from .cuda.start import start
    from .engine import _tokenizer_or_none
    from .modelfile import open_model_file
    from .registry import get_host

    t0 = time.perf_counter()
    phases = {}

    def phase(name: str) -> None:
        nonlocal t0
        t = time.perf_counter()
        phases[name] = round(t - t0, 3)
        t0 = t

    dev = start().wait()
    g = open_model_file(path)
    arch = g.get("general.architecture")
    spec = get_host().resolve(arch)
    cls = spec.load_model_class()
    tok = _tokenizer_or_none(g)
    if tok is not None:
        ids = tok.encode(prompt or DEFAULT_PROMPT)
    else:
        ids = list(DEFAULT_IDS)
    if not ids:
        from .errors import ReflexError

        raise ReflexError("empty prompt")
    res = CheckResult(device=f"{dev.name} (sm_{dev.sm})", phase_s=phases)
    gpu_ops = get_backend("cuda")
    gpu_ops.attach(g)
    ref_ops = get_backend("cpu")
    ref_ops.attach(g)
    phase("open")
    total = sum(ti.nbytes for ti in g.tensors.values())
    if reference_dequant not in ("auto", "cpu", "gpu"):
        raise ValueError(f"reference_dequant must be auto, cpu or gpu, not {reference_dequant!r}")
    if reference_dequant == "gpu" or (reference_dequant == "auto" and total > GPU_DEQUANT_ABOVE):
        ref_ops.dequantizer = _gpu_dequantizer(gpu_ops)
        res.reference_dequant = "gpu"
    res.dequant = check_dequant(g, gpu_ops)
    phase("dequant_check")
    if lora:
        from .lora import applied, close_all, open_adapters

        adapters, res.notices = applied(open_adapters(lora, g), cls.lora_applies)
        try:  # the reference first: with the GPU dequantizer it reads the unmerged GPU weights
            ref_ops.merge_lora(adapters)
            gpu_ops.merge_lora(adapters)
        finally:
            close_all(adapters)
    gpu_m, ref_m = cls.load(g, gpu_ops), cls.load(g, ref_ops)
    phase("load")
    ids = [i % ref_m.n_vocab for i in ids]
    n = len(ids) + n_decode
    gs, rs = gpu_m.new_state(n), ref_m.new_state(n)
    batch = rs.append(ids)
    if gs.append(ids) != batch:  # pragma: no cover - the two states are the same bookkeeping
        raise AssertionError("GPU and reference states disagree")
    rows = list(range(batch.n_tokens))
    spent = {"reference": 0.0, "gpu": 0.0}

    def both(b, st_ref, st_gpu, out_rows):
        t = time.perf_counter()
        r = ref_ops.to_numpy(ref_m.forward(b, st_ref, out_rows))
        t1 = time.perf_counter()
        o = gpu_ops.to_numpy(gpu_m.forward(b, st_gpu, out_rows))
        spent["reference"] += t1 - t
        spent["gpu"] += time.perf_counter() - t1
        return r, o

    ref, gpu = both(batch, rs, gs, rows)
    _compare("prefill", 0, ref, gpu, res.positions)
    nxt = int(ref[-1].argmax())
    for _ in range(n_decode):
        b = rs.append([nxt])
        gs.append([nxt])
        ref, gpu = both(b, rs, gs, [0])
        _compare("decode", b.cell0, ref, gpu, res.positions)
        nxt = int(ref[-1].argmax())
    # the reference's time includes its dequantization (on first use of each weight)
    phases.update({k: round(v, 3) for k, v in spent.items()})
    return res
