"""What a job's result looks like from outside: status lines, text tables and JSON objects.

Pure functions from result objects to ``str`` / ``list[str]`` / ``dict``, so the CLI (which only
prints them) and the IPC modes (one JSON object per line) say the same thing. Naming:
``<command>_status`` is the one machine-readable status line, ``<command>_lines`` the lines
printed in text mode (status line last), ``<command>_json`` the object printed with ``--json``.

Status lines: ``TAG key=value ...``; strings are JSON-quoted, floats have 3 decimals, scores and
probabilities 6 (:class:`Float6`), enum-like words are bare (:class:`Word`), lists are
``[1,2,3]``. Stdlib only, imported on the cold path.
"""

from __future__ import annotations

import json
from typing import Any, Sequence


class Float6(float):
    """A float printed with 6 decimals (scores, probabilities)."""


class Word(str):
    """A value printed bare (an enum-like token such as sass/ptx), not as a quoted string."""


def _fmt(v: Any) -> str:
    if isinstance(v, Float6):
        return f"{v:.6f}"
    if isinstance(v, Word):
        return str(v)
    if isinstance(v, float):
        return f"{v:.3f}"
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(str(x) for x in v) + "]"
    return str(v)


def status_line(tag: str, **fields: Any) -> str:
    return tag + "".join(f" {k}={_fmt(v)}" for k, v in fields.items())


# ----------------------------------------------------------------------------------------------
# generate: engine.GenerateResult


def generate_status(res: Any, backend: str) -> str:
    return status_line("REFLEX_GENERATE_OK", process_start_to_first_token_ms=res.first_token_ms,
                       n_prompt_tokens=len(res.prompt_ids), n_tokens=len(res.token_ids),
                       backend=backend)


def error_json(kind: str, message: str, exit_code: int) -> dict:
    """A command's failure under --json: ``kind`` is the error's class name (``GGUFError``,
    ``CudaUnavailable``...) or ``usage``, ``interrupted``, ``terminated``, ``internal``."""
    return {"error": {"type": kind, "message": message, "exit_code": exit_code}}


def generate_json(res: Any, backend: str) -> dict:
    return {
        "status": "ok", "text": res.text, "prompt_token_ids": res.prompt_ids,
        "token_ids": res.token_ids, "n_prompt_tokens": len(res.prompt_ids),
        "n_tokens": len(res.token_ids),
        "process_start_to_first_token_ms": round(res.first_token_ms, 3),
        "backend": backend, "seed": res.seed,
        "n_prefill": res.n_prefill, "n_imported_tokens": res.n_imported,
        "stop_reason": res.stop_reason,
    }


# ----------------------------------------------------------------------------------------------
# system1: system1.System1Result, ``ms`` = process start -> result


def system1_lines(res: Any, ms: float, backend: str) -> list[str]:
    lines = [status_line("REFLEX_SYSTEM1_CANDIDATE_OK", idx=c.idx, text=c.text,
                         token_ids=c.token_ids, score=Float6(c.score),
                         probability=Float6(c.probability))
             for c in res.candidates]
    lines.append(status_line("REFLEX_SYSTEM1_OK", process_start_to_result_ms=ms,
                             num_candidates=len(res.candidates), best_idx=res.best_idx,
                             best_text=res.candidates[res.best_idx].text,
                             entropy=Float6(res.entropy), backend=backend))
    return lines


def system1_json(res: Any, ms: float, normalize: bool, backend: str) -> dict:
    return {
        "status": "ok",
        "candidates": [{"idx": c.idx, "text": c.text, "token_ids": c.token_ids,
                        "score": c.score, "probability": c.probability, "logprob": c.logprob}
                       for c in res.candidates],
        "process_start_to_result_ms": round(ms, 3), "num_candidates": len(res.candidates),
        "best_idx": res.best_idx, "best_text": res.candidates[res.best_idx].text,
        "entropy": res.entropy, "normalize": normalize, "backend": backend,
        "n_prefill": res.n_prefill, "n_imported_tokens": res.n_imported,
    }


# ----------------------------------------------------------------------------------------------
# smoke: the dict of cuda.driver.smoke(), ``ms`` = process start -> result


def smoke_status(r: dict, ms: float) -> str:
    return status_line("REFLEX_SMOKE_OK", process_start_to_result_ms=ms, device=r["device"],
                       sm=r["sm"], image=Word(r["image"]))


def smoke_json(r: dict, ms: float) -> dict:
    return {"status": "ok", "process_start_to_result_ms": round(ms, 3), "device": r["device"],
            "sm": r["sm"], "image": r["image"]}


# ----------------------------------------------------------------------------------------------
# check: check.CheckResult


def _check_summary(res: Any) -> dict:
    from .check import REL_BOUND  # stdlib-only module; imported here to keep it off other paths

    return dict(device=res.device, reference_dequant=Word(res.reference_dequant),
                positions=len(res.positions),
                top1_agree=sum(r.top1_ref == r.top1_gpu for r in res.positions),
                max_rel=Float6(max((r.max_rel for r in res.positions), default=0.0)),
                rel_bound=Float6(REL_BOUND), dequant_tensors=len(res.dequant),
                dequant_mismatches=sum(max(r.mismatches, 0) for r in res.dequant),
                dequant_types=len({r.ggml_type for r in res.dequant}))


def check_status(res: Any) -> str:
    return status_line("REFLEX_CHECK_OK" if res.ok else "REFLEX_CHECK_FAIL",
                       **_check_summary(res))


def check_lines(res: Any) -> list[str]:
    """The per-position and per-tensor tables, then the status line."""
    lines = [f"{'step':<8} {'pos':>4} {'max_abs':>10} {'max_rel':>10} {'top1 ref':>9} "
             f"{'top1 gpu':>9} {'margin':>8}  ok"]
    for r in res.positions:
        lines.append(f"{r.step:<8} {r.position:>4} {r.max_abs:10.3e} {r.max_rel:10.3e} "
                     f"{r.top1_ref:>9} {r.top1_gpu:>9} {r.margin:8.4f}  "
                     f"{'ok' if r.ok else 'FAIL'}")
    lines.append(f"{'type':<8} {'tensor':<34} {'elements':>12} {'mismatches':>11}  ok")
    for r in res.dequant:
        note = f"  {r.note}" if r.note else ""
        lines.append(f"{r.ggml_type:<8} {r.tensor:<34} {r.n_elements:>12} {r.mismatches:>11}  "
                     f"{'ok' if r.ok else 'FAIL'}{note}")
    if res.phase_s:
        lines.append("time: " + ", ".join(f"{k} {v:.1f} s" for k, v in res.phase_s.items()))
    lines.append(check_status(res))
    return lines


def check_json(res: Any) -> dict:
    summary = {k: (float(v) if isinstance(v, float) else v)
               for k, v in _check_summary(res).items()}
    return {"status": "ok" if res.ok else "fail", **summary, "phase_s": dict(res.phase_s),
            "notices": list(res.notices),
            "positions_detail": [vars(r) for r in res.positions],
            "dequant_detail": [vars(r) for r in res.dequant]}


# ----------------------------------------------------------------------------------------------
# bench: the dicts of bench.warm() / bench.cold(), printed as they are with --json


def bench_lines(res: dict) -> list[str]:
    if res["mode"] == "cold":
        return _bench_cold_lines(res)
    lines = [f"{k:<22} median {res[k]['median']:9.3f}  p90 {res[k]['p90']:9.3f}  "
             f"(n={res[k]['n']})"
             for k in ("prefill_ms", "decode_ms_per_token", "system1_ms")]
    if res.get("decode", "eager") != "eager":
        lines.append(f"decode steps: {res['decode']}")
    lines.append(status_line(
        "REFLEX_BENCH_OK", backend=res["backend"], n_prompt_tokens=res["n_prompt_tokens"],
        prefill_median_ms=res["prefill_ms"]["median"],
        decode_median_ms=res["decode_ms_per_token"]["median"],
        system1_median_ms=res["system1_ms"]["median"]))
    return lines


def _bench_cold_lines(res: dict) -> list[str]:
    w = res["wall_s"]
    fields = dict(runs=res["n_ok"], wall_median_s=w["median"], wall_min_s=w["min"],
                  wall_max_s=w["max"], page_cache=res["page_cache"])
    if "gpu_j" in res:
        fields.update(gpu_j_median=res["gpu_j"]["median"])
    if "gpu_j_minus_idle" in res:
        fields.update(gpu_j_minus_idle_median=res["gpu_j_minus_idle"]["median"],
                      idle_w=res["idle_w"])
    lines = []
    for r in ([res["warmup"]] if res.get("warmup") else []) + res["runs"]:
        j = f" gpu_j={r['gpu_j']:.1f}" if "gpu_j" in r else ""
        tag = "warmup (not counted)" if r is res.get("warmup") else "run"
        lines.append(f"{tag} rc={r['rc']} wall={r['wall_s']:.3f}s{j}")
    lines.append(status_line("REFLEX_BENCH_COLD_OK", **fields))
    return lines


# ----------------------------------------------------------------------------------------------
# plugins: registry.PluginInfo list


def plugins_json(infos: Sequence[Any]) -> list[dict]:
    return [{"name": p.name, "version": p.version, "module": p.module,
             "architectures": [{"name": a.name, "model": a.model, "description": a.description}
                               for a in p.architectures]}
            for p in infos]


def plugins_lines(infos: Sequence[Any], filtered: dict[str, str] | None = None) -> list[str]:
    """One line per loaded plugin; then one per architecture whose installed plugin the
    environment leaves out (``filtered``: architecture -> why)."""
    left_out = [f"{arch}: installed, not loaded: {why}" for arch, why in
                sorted((filtered or {}).items())]
    if not infos and not left_out:
        return ["no architecture plugins installed (from Reflex's source tree: pip install "
                "./plugins/qwen3 ...; README 'Install only some plugins')"]
    return [f"{p.name} {p.version or '?'}: {', '.join(a.name for a in p.architectures) or '(none)'}"
            for p in infos] + left_out


# ----------------------------------------------------------------------------------------------
# --timings: a timing.Timings


def timings_lines(t: Any, total: tuple[str, float] | None = None) -> list[str]:
    """Every phase (ms from process start | duration ms), then ``total`` -- (what, ms since
    process start), the number the status line reports -- then the free-form notes."""
    lines = ["timings (ms from process start | duration ms):"]
    lines += [f"  {name:<28} {start:9.1f} | {dur:8.1f}" for name, start, dur in t.report()]
    if total is not None:
        lines.append(f"  {'total: ' + total[0]:<28} {0.0:9.1f} | {total[1]:8.1f}")
    lines += [f"  {name}: {text}" for name, text in t.notes.items()]
    return lines
