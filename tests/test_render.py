"""Output rendering (reflex_core.render): fixed results -> the exact text and JSON the CLI prints.

The golden strings were captured from the CLI before its rendering moved into render.py (the
same fixed results, run through the commands with the engine stubbed out), so these tests pin
the output contract byte for byte: once on the pure functions, once through the click commands.
"""

from __future__ import annotations

import json
import types

import pytest
from click.testing import CliRunner

from reflex_core import render
from reflex_core.check import CheckResult, DequantRow, PositionRow
from reflex_core.engine import GenerateResult
from reflex_core.registry import ArchSpec, PluginInfo
from reflex_core.system1 import Candidate, System1Result

MS = 412.3456789  # a fixed "process start -> result" figure


def generate_result() -> GenerateResult:
    return GenerateResult(prompt_ids=[785, 6722, 315], token_ids=[12095, 13, 576],
                          text=' Paris. "Café"\u00e9', first_token_ms=MS, seed=7, n_prefill=3)


def system1_result() -> System1Result:
    return System1Result(
        # scores as --normalize ranks them: the 2-token candidate's is its logprob / 2
        candidates=[Candidate(0, " Paris", [12095], -0.123456789, 0.8765432109, -0.123456789),
                    Candidate(1, ' "Lon"don', [7148, 13], -2.5, 0.1, -5.0),
                    Candidate(2, " Zürich", [19846], -3.0000004, 0.0234567891, -3.0000004)],
        best_idx=0, entropy=0.4321098765, n_prefill=3)


def smoke_result() -> dict:
    return {"device": "NVIDIA H200", "sm": 90, "image": "sass"}


def check_result(ok: bool = True) -> CheckResult:
    pos = [PositionRow("prompt", 0, 1.25e-4, 3.5e-6, 785, 785, 2.5),
           PositionRow("decode 1", 5, 2.0e-3, 4.0e-4, 11, 11, 0.125)]
    if not ok:
        pos.append(PositionRow("decode 2", 6, 0.5, 0.25, 3, 4, 1.0))
    deq = [DequantRow("Q8_0", "blk.0.attn_q.weight", 4096, 0),
           DequantRow("Q4_K", "token_embd.weight", 155582464, 0 if ok else 12),
           DequantRow("F16", "output_norm.weight", 1024, -1, "no GPU dequant for F16")]
    return CheckResult(positions=pos, dequant=deq if not ok else deq[:2], device="NVIDIA H200",
                       reference_dequant="gpu",
                       phase_s={"open": 1.5, "dequant_check": 12.0, "load": 2.0,
                                "reference": 30.5, "gpu": 0.5})


def bench_warm() -> dict:
    def s(median, p90, n):
        return {"n": n, "median": median, "p90": p90, "min": median / 2, "max": p90 * 2}

    return {"mode": "warm", "model": "m.gguf", "backend": "cuda", "device": "NVIDIA H200",
            "n_prompt_tokens": 5, "n_decode": 32, "reps": 20, "candidates": [" Paris"],
            "prefill_ms": s(3.25, 3.5, 20), "decode_ms_per_token": s(1.0625, 1.25, 640),
            "system1_ms": s(4.5, 5.125, 20), "kernel_launches": {"prefill": 30}}


def bench_cold(gpu: bool) -> dict:
    def run(rc, wall, j):
        r = {"rc": rc, "wall_s": wall, "tail": ["REFLEX_GENERATE_OK ..."]}
        if gpu:
            r.update(gpu_j=j, gpu_j_minus_idle=j - 70.0)
        return r

    res = {"mode": "cold", "command": ["reflex", "generate"], "warmup": run(0, 1.5, 120.25),
           "runs": [run(0, 0.478, 99.94), run(0, 0.5012, 101.06)], "n_ok": 2,
           "wall_s": {"n": 2, "median": 0.4896, "p90": 0.5012, "min": 0.478, "max": 0.5012},
           "idle_w": 71.5 if gpu else None, "page_cache": "warm", "nvml": "ok"}
    if gpu:
        res["gpu_j"] = {"n": 2, "median": 100.5, "p90": 101.06, "min": 99.94, "max": 101.06}
        res["gpu_j_minus_idle"] = {"n": 2, "median": 30.5, "p90": 31.06, "min": 29.94,
                                   "max": 31.06}
    else:
        res["warmup"] = None
    return res


def plugin_infos() -> list[PluginInfo]:
    return [PluginInfo("reflex-infer-qwen3", "0.3.0", "reflex_qwen3",
                       [ArchSpec("qwen3", "reflex_qwen3.model:Qwen3", "Qwen3 dense"),
                        ArchSpec("qwen2", "reflex_qwen3.model:Qwen3")]),
            PluginInfo("toy", None, "toy_mod", [])]


class FakeTimings:
    def report(self):
        return [("interpreter start to main", 0.0, 61.25), ("parse gguf", 63.5, 4.125),
                ("first forward", 250.0, 1234.5678)]

    notes = {"gguf index": "hit (~/.cache/reflex/index/m.rxi)", "upload": "0.64 GB"}


# ----------------------------------------------------------------------------------------------
# golden output (captured from the CLI before the move)

GOLDEN = {  # name: (argv, stdout)
    'generate_text': (['generate', 'm.gguf', 'The capital', '--backend', 'cuda'],
        (' Paris. "Café"é\n'
         'REFLEX_GENERATE_OK process_start_to_first_token_ms=412.346 '
         'n_prompt_tokens=3 n_tokens=3 backend="cuda"\n')),
    'generate_json': (['generate', 'm.gguf', 'The capital', '--json'],
        ('{"status": "ok", "text": " Paris. \\"Café\\"é", "prompt_token_ids": [785, '
         '6722, 315], "token_ids": [12095, 13, 576], "n_prompt_tokens": 3, '
         '"n_tokens": 3, "process_start_to_first_token_ms": 412.346, "backend": '
         '"cuda", "seed": 7, "n_prefill": 3, "n_imported_tokens": 0, "stop_reason": "length"}\n')),
    'system1_text': (['system1', 'm.gguf', 'The capital', '-c', ' Paris', '-c', 'x', '-c', 'y'],
        ('REFLEX_SYSTEM1_CANDIDATE_OK idx=0 text=" Paris" token_ids=[12095] '
         'score=-0.123457 probability=0.876543\n'
         'REFLEX_SYSTEM1_CANDIDATE_OK idx=1 text=" \\"Lon\\"don" token_ids=[7148,13] '
         'score=-2.500000 probability=0.100000\n'
         'REFLEX_SYSTEM1_CANDIDATE_OK idx=2 text=" Zürich" token_ids=[19846] '
         'score=-3.000000 probability=0.023457\n'
         'REFLEX_SYSTEM1_OK process_start_to_result_ms=412.346 num_candidates=3 '
         'best_idx=0 best_text=" Paris" entropy=0.432110 backend="cuda"\n')),
    'system1_json': (['system1', 'm.gguf', 'The capital', '-c', ' Paris', '-c', 'x', '-c', 'y',
                      '--json', '--normalize'],
        ('{"status": "ok", "candidates": [{"idx": 0, "text": " Paris", "token_ids": '
         '[12095], "score": -0.123456789, "probability": 0.8765432109, "logprob": '
         '-0.123456789}, {"idx": 1, "text": " \\"Lon\\"don", "token_ids": [7148, 13], '
         '"score": -2.5, "probability": 0.1, "logprob": -5.0}, {"idx": 2, "text": '
         '" Zürich", "token_ids": [19846], "score": -3.0000004, "probability": '
         '0.0234567891, "logprob": -3.0000004}], '
         '"process_start_to_result_ms": 412.346, "num_candidates": 3, "best_idx": '
         '0, "best_text": " Paris", "entropy": 0.4321098765, "normalize": true, '
         '"backend": "cuda", "n_prefill": 3, "n_imported_tokens": 0}\n')),
    'smoke_text': (['smoke'],
        ('REFLEX_SMOKE_OK process_start_to_result_ms=412.346 device="NVIDIA H200" '
         'sm=90 image=sass\n')),
    'smoke_json': (['smoke', '--json'],
        ('{"status": "ok", "process_start_to_result_ms": 412.346, "device": "NVIDIA '
         'H200", "sm": 90, "image": "sass"}\n')),
    'check_ok': (['check', 'm.gguf'],
        ('step      pos    max_abs    max_rel  top1 ref  top1 gpu   margin  ok\n'
         'prompt      0  1.250e-04  3.500e-06       785       785   2.5000  ok\n'
         'decode 1    5  2.000e-03  4.000e-04        11        11   0.1250  ok\n'
         'type     tensor                                 elements  mismatches  ok\n'
         'Q8_0     blk.0.attn_q.weight                        4096           0  ok\n'
         'Q4_K     token_embd.weight                     155582464           0  ok\n'
         'time: open 1.5 s, dequant_check 12.0 s, load 2.0 s, reference 30.5 s, gpu 0.5 s\n'
         'REFLEX_CHECK_OK device="NVIDIA H200" reference_dequant=gpu positions=2 '
         'top1_agree=2 max_rel=0.000400 rel_bound=0.001000 dequant_tensors=2 '
         'dequant_mismatches=0 dequant_types=2\n')),
    'check_fail': (['check', 'm.gguf', 'fail'],
        ('step      pos    max_abs    max_rel  top1 ref  top1 gpu   margin  ok\n'
         'prompt      0  1.250e-04  3.500e-06       785       785   2.5000  ok\n'
         'decode 1    5  2.000e-03  4.000e-04        11        11   0.1250  ok\n'
         'decode 2    6  5.000e-01  2.500e-01         3         4   1.0000  FAIL\n'
         'type     tensor                                 elements  mismatches  ok\n'
         'Q8_0     blk.0.attn_q.weight                        4096           0  ok\n'
         'Q4_K     token_embd.weight                     155582464          12  FAIL\n'
         'F16      output_norm.weight                         1024          -1  '
         'FAIL  no GPU dequant for F16\n'
         'time: open 1.5 s, dequant_check 12.0 s, load 2.0 s, reference 30.5 s, gpu 0.5 s\n'
         'REFLEX_CHECK_FAIL device="NVIDIA H200" reference_dequant=gpu positions=3 '
         'top1_agree=2 max_rel=0.250000 rel_bound=0.001000 dequant_tensors=3 '
         'dequant_mismatches=12 dequant_types=3\n')),
    'check_fail_json': (['check', 'm.gguf', 'fail', '--json'],
        ('{\n'
         ' "status": "fail",\n'
         ' "device": "NVIDIA H200",\n'
         ' "reference_dequant": "gpu",\n'
         ' "positions": 3,\n'
         ' "top1_agree": 2,\n'
         ' "max_rel": 0.25,\n'
         ' "rel_bound": 0.001,\n'
         ' "dequant_tensors": 3,\n'
         ' "dequant_mismatches": 12,\n'
         ' "dequant_types": 3,\n'
         ' "phase_s": {\n'
         '  "open": 1.5,\n'
         '  "dequant_check": 12.0,\n'
         '  "load": 2.0,\n'
         '  "reference": 30.5,\n'
         '  "gpu": 0.5\n'
         ' },\n'
         ' "notices": [],\n'
         ' "positions_detail": [\n'
         '  {\n'
         '   "step": "prompt",\n'
         '   "position": 0,\n'
         '   "max_abs": 0.000125,\n'
         '   "max_rel": 3.5e-06,\n'
         '   "top1_ref": 785,\n'
         '   "top1_gpu": 785,\n'
         '   "margin": 2.5\n'
         '  },\n'
         '  {\n'
         '   "step": "decode 1",\n'
         '   "position": 5,\n'
         '   "max_abs": 0.002,\n'
         '   "max_rel": 0.0004,\n'
         '   "top1_ref": 11,\n'
         '   "top1_gpu": 11,\n'
         '   "margin": 0.125\n'
         '  },\n'
         '  {\n'
         '   "step": "decode 2",\n'
         '   "position": 6,\n'
         '   "max_abs": 0.5,\n'
         '   "max_rel": 0.25,\n'
         '   "top1_ref": 3,\n'
         '   "top1_gpu": 4,\n'
         '   "margin": 1.0\n'
         '  }\n'
         ' ],\n'
         ' "dequant_detail": [\n'
         '  {\n'
         '   "ggml_type": "Q8_0",\n'
         '   "tensor": "blk.0.attn_q.weight",\n'
         '   "n_elements": 4096,\n'
         '   "mismatches": 0,\n'
         '   "note": ""\n'
         '  },\n'
         '  {\n'
         '   "ggml_type": "Q4_K",\n'
         '   "tensor": "token_embd.weight",\n'
         '   "n_elements": 155582464,\n'
         '   "mismatches": 12,\n'
         '   "note": ""\n'
         '  },\n'
         '  {\n'
         '   "ggml_type": "F16",\n'
         '   "tensor": "output_norm.weight",\n'
         '   "n_elements": 1024,\n'
         '   "mismatches": -1,\n'
         '   "note": "no GPU dequant for F16"\n'
         '  }\n'
         ' ]\n'
         '}\n')),
    'bench_warm': (['bench', 'm.gguf'],
        ('prefill_ms             median     3.250  p90     3.500  (n=20)\n'
         'decode_ms_per_token    median     1.062  p90     1.250  (n=640)\n'
         'system1_ms             median     4.500  p90     5.125  (n=20)\n'
         'REFLEX_BENCH_OK backend="cuda" n_prompt_tokens=5 prefill_median_ms=3.250 '
         'decode_median_ms=1.062 system1_median_ms=4.500\n')),
    'bench_warm_json': (['bench', 'm.gguf', '--json'],
        ('{\n'
         ' "mode": "warm",\n'
         ' "model": "m.gguf",\n'
         ' "backend": "cuda",\n'
         ' "device": "NVIDIA H200",\n'
         ' "n_prompt_tokens": 5,\n'
         ' "n_decode": 32,\n'
         ' "reps": 20,\n'
         ' "candidates": [\n'
         '  " Paris"\n'
         ' ],\n'
         ' "prefill_ms": {\n'
         '  "n": 20,\n'
         '  "median": 3.25,\n'
         '  "p90": 3.5,\n'
         '  "min": 1.625,\n'
         '  "max": 7.0\n'
         ' },\n'
         ' "decode_ms_per_token": {\n'
         '  "n": 640,\n'
         '  "median": 1.0625,\n'
         '  "p90": 1.25,\n'
         '  "min": 0.53125,\n'
         '  "max": 2.5\n'
         ' },\n'
         ' "system1_ms": {\n'
         '  "n": 20,\n'
         '  "median": 4.5,\n'
         '  "p90": 5.125,\n'
         '  "min": 2.25,\n'
         '  "max": 10.25\n'
         ' },\n'
         ' "kernel_launches": {\n'
         '  "prefill": 30\n'
         ' }\n'
         '}\n')),
    'bench_cold_gpu': (['bench', 'm.gguf', '--cold'],
        ('warmup (not counted) rc=0 wall=1.500s gpu_j=120.2\n'
         'run rc=0 wall=0.478s gpu_j=99.9\n'
         'run rc=0 wall=0.501s gpu_j=101.1\n'
         'REFLEX_BENCH_COLD_OK runs=2 wall_median_s=0.490 wall_min_s=0.478 '
         'wall_max_s=0.501 page_cache="warm" gpu_j_median=100.500 '
         'gpu_j_minus_idle_median=30.500 idle_w=71.500\n')),
    'bench_cold_cpu': (['bench', 'm.gguf', '--cold', '--backend', 'cpu'],
        ('run rc=0 wall=0.478s\n'
         'run rc=0 wall=0.501s\n'
         'REFLEX_BENCH_COLD_OK runs=2 wall_median_s=0.490 wall_min_s=0.478 '
         'wall_max_s=0.501 page_cache="warm"\n')),
    'plugins': (['plugins'],
        ('reflex-infer-qwen3 0.3.0: qwen3, qwen2\n'
         'toy ?: (none)\n')),
    'plugins_json': (['plugins', '--json'],
        ('[\n'
         '  {\n'
         '    "name": "reflex-infer-qwen3",\n'
         '    "version": "0.3.0",\n'
         '    "module": "reflex_qwen3",\n'
         '    "architectures": [\n'
         '      {\n'
         '        "name": "qwen3",\n'
         '        "model": "reflex_qwen3.model:Qwen3",\n'
         '        "description": "Qwen3 dense"\n'
         '      },\n'
         '      {\n'
         '        "name": "qwen2",\n'
         '        "model": "reflex_qwen3.model:Qwen3",\n'
         '        "description": ""\n'
         '      }\n'
         '    ]\n'
         '  },\n'
         '  {\n'
         '    "name": "toy",\n'
         '    "version": null,\n'
         '    "module": "toy_mod",\n'
         '    "architectures": []\n'
         '  }\n'
         ']\n')),
}
TIMINGS_STDERR = ('timings (ms from process start | duration ms):\n'
                  '  interpreter start to main          0.0 |     61.2\n'
                  '  parse gguf                        63.5 |      4.1\n'
                  '  first forward                    250.0 |   1234.6\n'
                  '  total: first token                 0.0 |    412.3\n'
                  '  gguf index: hit (~/.cache/reflex/index/m.rxi)\n'
                  '  upload: 0.64 GB\n')


# ----------------------------------------------------------------------------------------------
# the commands, engine stubbed: what each prints for the fixed results


def run_cli(monkeypatch, argv: list[str]) -> str:
    """stdout of ``reflex ARGV`` with every job stubbed to return the fixed results above."""
    from reflex_core import bench, check, engine, registry, system1, timing
    from reflex_core.cli import cli

    lm = types.SimpleNamespace(notices=[], backend="cuda", model=None, ops=None,
                               require_tokenizer=lambda: None)
    monkeypatch.setattr(engine, "load", lambda *a, **k: (lm, [1, 2, 3]))

    def fake_generate(lm, ids, n, sampling, on_text, t, **kw):
        res = generate_result()
        if on_text is not None:
            on_text(res.text)
        return res

    monkeypatch.setattr(engine, "generate", fake_generate)
    monkeypatch.setattr(engine, "fit_context", lambda lm, ids, n, *a: (list(ids), n, []))
    monkeypatch.setattr(system1, "tokenize_candidates", lambda tok, c: [[1]] * len(c))
    monkeypatch.setattr(system1, "evaluate", lambda *a, **k: system1_result())
    monkeypatch.setattr(timing, "since_process_start_ms", lambda perf=None: MS)
    fake_smoke = types.SimpleNamespace(smoke=smoke_result)
    import reflex_core.cuda as cuda_pkg

    monkeypatch.setitem(__import__("sys").modules, "reflex_core.cuda.smoke", fake_smoke)
    monkeypatch.setattr(cuda_pkg, "smoke", fake_smoke, raising=False)
    monkeypatch.setattr(check, "run_check",
                        lambda model, prompt, steps, rd, **k: check_result(ok=(prompt != "fail")))
    monkeypatch.setattr(bench, "warm", lambda *a, **k: bench_warm())
    from reflex_core.cuda import driver

    monkeypatch.setattr(driver, "probe", lambda ordinal=0: None)  # auto picks the GPU
    monkeypatch.setattr(bench, "cold", lambda *a, **k: bench_cold(gpu=a[5] == "cuda"))
    host = types.SimpleNamespace(load_all=lambda: None, plugins=plugin_infos, filtered=dict,
                                 architectures=lambda: None)
    monkeypatch.setattr(registry, "get_host", lambda: host)
    res = CliRunner().invoke(cli, argv, catch_exceptions=False)
    return res.stdout


def golden_lines(name: str) -> list[str]:
    return GOLDEN[name][1].splitlines()


@pytest.mark.parametrize("name", list(GOLDEN))
def test_each_command_prints_its_golden_output(monkeypatch, name):
    argv, stdout = GOLDEN[name]
    assert run_cli(monkeypatch, argv) == stdout


# ----------------------------------------------------------------------------------------------
# the pure functions, against the same golden text (what an IPC mode reuses)


def test_generate():
    res = generate_result()
    assert render.generate_status(res, "cuda") == golden_lines("generate_text")[-1]
    assert json.dumps(render.generate_json(res, "cuda"), ensure_ascii=False) + "\n" == \
        GOLDEN["generate_json"][1]


def test_system1():
    res = system1_result()
    assert render.system1_lines(res, MS, "cuda") == golden_lines("system1_text")
    d = render.system1_json(res, MS, True, "cuda")
    assert json.dumps(d, ensure_ascii=False) + "\n" == GOLDEN["system1_json"][1]
    assert d["best_text"] == res.candidates[res.best_idx].text


def test_smoke():
    assert render.smoke_status(smoke_result(), MS) == golden_lines("smoke_text")[0]
    assert json.dumps(render.smoke_json(smoke_result(), MS)) + "\n" == GOLDEN["smoke_json"][1]


@pytest.mark.parametrize("ok, name", [(True, "check_ok"), (False, "check_fail")])
def test_check(ok, name):
    res = check_result(ok)
    assert res.ok is ok
    assert render.check_lines(res) == golden_lines(name)
    assert render.check_status(res) == golden_lines(name)[-1]


def test_check_notices_go_to_stderr_and_into_the_json(monkeypatch):
    """`reflex check --lora`'s notices (LoRA tensors the architecture leaves out) are on stderr,
    and in the --json object, never in the text on stdout."""
    from reflex_core import check
    from reflex_core.cli import cli

    note = "notice: a.gguf: 1 LoRA tensor(s) not applied, as in llama.cpp"
    res = check_result()
    res.notices = [note]
    monkeypatch.setattr(check, "run_check", lambda *a, **k: res)
    for argv in (["check", "m.gguf"], ["check", "m.gguf", "--json"]):
        out = CliRunner().invoke(cli, argv, catch_exceptions=False)
        assert out.exit_code == 0 and out.stderr == note + "\n", argv
        if "--json" in argv:
            assert json.loads(out.stdout)["notices"] == [note]
        else:
            assert note not in out.stdout


def test_check_json_has_plain_values():
    d = render.check_json(check_result(ok=False))
    assert json.dumps(d, indent=1) + "\n" == GOLDEN["check_fail_json"][1]
    # the status line's number types (Float6, Word) do not leak into the object
    assert type(d["max_rel"]) is float and type(d["rel_bound"]) is float
    assert d["status"] == "fail" and d["reference_dequant"] == "gpu"


@pytest.mark.parametrize("res, name", [(bench_warm(), "bench_warm"),
                                       (bench_cold(gpu=True), "bench_cold_gpu"),
                                       (bench_cold(gpu=False), "bench_cold_cpu")])
def test_bench(res, name):
    assert render.bench_lines(res) == golden_lines(name)


def test_plugins():
    assert render.plugins_lines(plugin_infos()) == golden_lines("plugins")
    assert json.dumps(render.plugins_json(plugin_infos()), indent=2) + "\n" == \
        GOLDEN["plugins_json"][1]
    assert render.plugins_lines([]) == [
        "no architecture plugins installed (from Reflex's source tree: pip install "
        "./plugins/qwen3 ...; README 'Install only some plugins')"]
    # installed but left out by the environment: said so, not "install it"
    assert render.plugins_lines([], {"qwen3": "REFLEX_DISABLE_PLUGINS='qwen3' disables it"}) == [
        "qwen3: installed, not loaded: REFLEX_DISABLE_PLUGINS='qwen3' disables it"]


def test_timings():
    assert render.timings_lines(FakeTimings(), ("first token", 412.3456)) == \
        TIMINGS_STDERR.splitlines()
    without_total = render.timings_lines(FakeTimings())
    assert without_total == [x for x in TIMINGS_STDERR.splitlines() if "total:" not in x]


@pytest.mark.parametrize("value, text", [
    (render.Float6(0.1234564), "0.123456"), (render.Float6(-3), "-3.000000"),
    (1.0005, "1.000"), (2, "2"), (True, "True"), (render.Word("ptx"), "ptx"),
    ('a "b" \\ é\n', '"a \\"b\\" \\\\ é\\n"'), ([1, 2, 3], "[1,2,3]"), ((), "[]"),
])
def test_status_line_values(value, text):
    assert render.status_line("T", k=value) == f"T k={text}"


def test_status_line_keeps_field_order():
    assert render.status_line("T") == "T"
    assert render.status_line("T", b=1, a=render.Word("x")) == "T b=1 a=x"


def test_render_imports_no_click():
    import subprocess
    import sys

    code = ("import sys, reflex_core.render; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('click', 'numpy')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
