"""The Python API (reflex_core.load / reflex_core.api.Engine) on the CPU backend: results equal
the engine's and carry the CLI's --json fields, streaming, stop strings (also across token
boundaries and while streaming), states kept, exported and imported, argument checks, close(),
and that ``import reflex_core`` stays cheap."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import reflex_core
from reflex_core import api, engine, render, system1
from reflex_core.errors import ReflexError
from reflex_core.sampling import SamplingParams
from reflex_core.testing.modelwriter import ModelShape

SHAPE = ModelShape(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, head_dim=32, n_ff=96)
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def path(model_files) -> str:
    return str(model_files(SHAPE, weight_type="Q8_0", tokenizer="qwen3", seed=3))


@pytest.fixture(scope="module")
def eng(path):
    with reflex_core.load(path, backend="cpu") as e:
        yield e


def test_generate_is_the_engines_with_the_json_fields(eng):
    out = eng.generate(PROMPT, max_tokens=10)
    lm = eng._lm
    ref = engine.generate(lm, lm.tokenizer.encode(PROMPT), 10, SamplingParams(0.0, 0, 1.0, None))
    assert (out.token_ids, out.text, out.prompt_token_ids) == (ref.token_ids, ref.text,
                                                              ref.prompt_ids)
    d = out.to_dict()
    assert set(d) == set(render.generate_json(ref, "cpu")) | {"stop_reason", "compute_ms"}
    assert json.loads(json.dumps(d)) == d and d["status"] == "ok"
    assert out.stop_reason in ("length", "eog") and out.compute_ms > 0 and out.state is None
    sampled = [eng.generate(PROMPT, max_tokens=6, temperature=1.5, top_k=40, top_p=0.9, seed=5)
               for _ in range(2)]
    assert sampled[0].token_ids == sampled[1].token_ids and sampled[0].seed == 5
    # -1 is llama.cpp's "random": a fresh non-negative seed, reported (not Python's abs(-1) = 1)
    drawn = eng.generate(PROMPT, max_tokens=2, temperature=1.0, seed=-1).seed
    again = eng.generate(PROMPT, max_tokens=2, temperature=1.0, seed=drawn)
    assert drawn >= 0 and again.seed == drawn


def test_stream_yields_the_text_and_holds_the_engine(eng):
    whole = eng.generate(PROMPT, max_tokens=10)
    s = eng.generate(PROMPT, max_tokens=10, stream=True)
    it = iter(s)
    first = next(it)
    with pytest.raises(ReflexError, match="streamed generation .* still running"):
        eng.tokenize("x")
    pieces = [first, *it]
    assert "".join(pieces) == whole.text and len(pieces) > 1
    assert s.finished and s.result.token_ids == whole.token_ids
    eng.generate(PROMPT, max_tokens=2, stream=True)  # dropped unread: the engine is free
    abandoned = eng.generate(PROMPT, max_tokens=5, stream=True)
    next(iter(abandoned))
    abandoned.close()
    assert abandoned.result is None and eng.tokenize("Hello") == [9707]
    never_read = eng.generate(PROMPT, max_tokens=5, stream=True)
    never_read.close()  # closed before its first piece: the engine is free too
    assert never_read.result is None and eng.tokenize("Hello") == [9707]


def test_close_ends_a_running_stream(path):
    e = reflex_core.load(path, backend="cpu")
    s = iter(e.generate(PROMPT, max_tokens=8, stream=True))
    next(s)
    e.close()
    assert list(s) == [] and e.closed  # the stream ended with the engine, its result None


def test_tiny_temperature_is_greedy(eng):
    """2^-150 and less is 0 in llama.cpp's float32 temperature: greedy, never NaN draws."""
    greedy = eng.generate(PROMPT, max_tokens=4).token_ids
    for t in (1e-310, 2.0 ** -150):
        assert eng.generate(PROMPT, max_tokens=4, temperature=t, seed=1).token_ids == greedy


def test_stop_strings(eng):
    whole = eng.generate(PROMPT, max_tokens=12)
    text = whole.text
    pieces = list(eng.generate(PROMPT, max_tokens=12, stream=True))  # one per token here
    assert len(pieces) == 12 and all(pieces)
    stop = pieces[1][-1:] + pieces[2][:2]  # spans the second and third tokens
    cut = text.find(stop)
    res = eng.generate(PROMPT, max_tokens=12, stop=["never there", stop])
    assert res.text == text[:cut] and res.stop_reason == "stop"
    assert res.token_ids == whole.token_ids[:len(res.token_ids)]
    assert len(res.token_ids) < len(whole.token_ids)
    assert eng.detokenize(res.token_ids).startswith(text[:cut] + stop[:1])
    s = eng.generate(PROMPT, max_tokens=12, stop=stop, stream=True)
    pieces = list(s)
    assert "".join(pieces) == text[:cut] and s.result.stop_reason == "stop"
    assert not any(stop in p for p in pieces)
    same = eng.generate(PROMPT, max_tokens=12, stop=["never there"])
    assert same.text == text and same.stop_reason == whole.stop_reason
    with pytest.raises(api.ParamError, match="stop must be"):
        eng.generate(PROMPT, stop=[""])


def test_states_kept_exported_imported(eng, path, tmp_path):
    whole = eng.generate(PROMPT, max_tokens=8)
    first = eng.generate(PROMPT, max_tokens=3, keep_state=True)
    st = first.state
    assert st.pending == first.token_ids[-1:] and st.source == "<memory>"
    rest = eng.generate("", max_tokens=5, state=st)
    assert first.token_ids + rest.token_ids == whole.token_ids
    f = tmp_path / "s.rxs"
    assert eng.export_state(st, f) == f.stat().st_size
    assert eng.generate("", max_tokens=5, state=str(f)).token_ids == rest.token_ids
    back = eng.import_state(f)
    assert (back.tokens, back.pending) == (st.tokens, st.pending)
    # system1's kept state is the prompt's prefix: generating from it = from the prompt
    sc = eng.system1(PROMPT, [" Paris", " Rome"], keep_state=True)
    assert sc.state.pending == eng.tokenize(PROMPT)[-1:]
    assert eng.generate("", max_tokens=8, state=sc.state).token_ids == whole.token_ids
    # and system1 continuing a prefix scores as system1 on the whole prompt
    pre = eng.generate(PROMPT, max_tokens=0, keep_state=True).state
    full = eng.system1(PROMPT, [" Paris", " Rome"])
    cont = eng.system1("", [" Paris", " Rome"], state=pre)
    assert [c.score for c in cont.candidates] == pytest.approx([c.score for c in
                                                                full.candidates], rel=1e-5)
    with reflex_core.load(path, backend="cpu") as other:
        with pytest.raises(ReflexError, match="belongs to another engine"):
            other.generate("", state=st)
        assert other.generate("", max_tokens=5, state=other.import_state(f)).token_ids == \
            rest.token_ids


def test_system1_is_the_engines_with_the_json_fields(eng):
    cands = [" Paris", " Rome", " a very long candidate"]
    sc = eng.system1(PROMPT, cands, normalize=True)
    lm = eng._lm
    ids = system1.tokenize_candidates(lm.tokenizer, cands)
    ref = system1.evaluate(lm.model, lm.ops, lm.tokenizer.encode(PROMPT), cands, ids, True)
    assert [c.score for c in sc.candidates] == [c.score for c in ref.candidates]
    assert sc.best_idx == ref.best_idx and sc.best_text == cands[ref.best_idx]
    d = sc.to_dict()
    assert set(d) == set(render.system1_json(ref, 1.0, True, "cpu")) | {"compute_ms"}
    assert d["candidates"] == render.system1_json(ref, 1.0, True, "cpu")["candidates"]


def test_chat_renders_the_template_first(eng):
    from reflex_core.chat import render_chat

    lm = eng._lm
    text = render_chat(lm.gguf, "Capital of France?", system="Answer in one word.")
    assert "<|im_start|>" in text
    want = lm.tokenizer.encode(text, add_special=False)
    out = eng.generate("Capital of France?", max_tokens=3, chat=True, system="Answer in one word.")
    assert out.prompt_token_ids == want
    assert out.token_ids == eng.generate(text, max_tokens=3).token_ids  # Qwen3 adds no BOS
    sc = eng.system1("Capital of France?", ["Paris", "Rome"], chat=True)
    ref = eng.system1(render_chat(lm.gguf, "Capital of France?"), ["Paris", "Rome"])
    assert [c.score for c in sc.candidates] == [c.score for c in ref.candidates]


def test_bad_arguments_are_one_line_errors(eng):
    cases = [
        (lambda: eng.generate(5), "prompt must be a string"),
        (lambda: eng.generate(PROMPT, max_tokens=0), "max_tokens must be"),
        (lambda: eng.generate(PROMPT, max_tokens=True), "max_tokens must be"),
        (lambda: eng.generate(PROMPT, temperature=float("nan")), "temperature must be"),
        (lambda: eng.generate(PROMPT, top_p=0), "top_p must be"),
        (lambda: eng.generate(PROMPT, top_k=-1), "top_k must be"),
        (lambda: eng.generate(PROMPT, seed=1.5), "seed must be"),
        (lambda: eng.generate(PROMPT, system="be brief"), "chat=True only"),
        (lambda: eng.generate(PROMPT, state=42), "state must be"),
        (lambda: eng.generate(""), "empty prompt"),
        (lambda: eng.generate(PROMPT, max_tokens=10**6), "context length"),
        (lambda: eng.system1(PROMPT, " Paris"), "candidates must be a list"),
        (lambda: eng.system1(PROMPT, []), "no candidates"),
        (lambda: eng.system1(PROMPT, [" a", ""]), "candidate 1 is empty"),
        (lambda: eng.detokenize([eng.n_vocab]), "token_ids must be"),
        (lambda: eng.tokenize(b"x"), "text must be a string"),
    ]
    # arguments of the wrong type or value: a ParamError (IPC's invalid_params), never a
    # TypeError or ValueError from inside
    params = [
        (lambda: reflex_core.load(5, backend="cpu"), "model must be a path"),
        (lambda: eng.generate(PROMPT, stop=5), "stop must be"),
        (lambda: eng.generate(PROMPT, stream="no"), "stream must be true or false"),
        (lambda: eng.generate(PROMPT, keep_state=1), "keep_state must be true or false"),
        (lambda: eng.generate(PROMPT, repeat_penalty=1e-45), "repeat_penalty must be"),
        (lambda: eng.generate(PROMPT, temperature=10**309), "temperature must be"),
        (lambda: eng.generate(PROMPT, state="a\0b"), "NUL byte"),
        (lambda: eng.generate(PROMPT, state="/tmp/\ud800"), "not valid text"),
        (lambda: eng.system1(PROMPT, None), "candidates must be a list"),
        (lambda: eng.system1(PROMPT, [" a"], normalize="no"), "normalize must be"),
        (lambda: eng.detokenize(None), "token_ids must be"),
        (lambda: eng.tokenize("x", add_special=None), "add_special must be"),
        (lambda: eng.import_state(5), "state must be a state file's path"),
        (lambda: reflex_core.load(PROMPT, backend="cpu", lora=5), "lora must be a list"),
    ]
    for call, match in cases + params:
        with pytest.raises(api.ParamError if (call, match) in params else ReflexError,
                           match=match) as e:
            call()
        assert "\n" not in str(e.value)
    assert eng.generate(PROMPT, max_tokens=1).n_tokens == 1  # still usable


def test_load_and_close(path, tmp_path, monkeypatch):
    e = reflex_core.load(path, backend="cpu", lora=())
    assert (e.arch, e.backend, e.n_ctx_train, e.path) == ("qwen3", "cpu", SHAPE.context_length, path)
    assert [name for name, _, _ in e.timings][:2] == ["interpreter start to main", "parse gguf"]
    assert "gguf index" in e.timing_notes
    e.close()
    e.close()  # idempotent
    with pytest.raises(ReflexError, match="closed"):
        e.generate(PROMPT)
    with pytest.raises(ReflexError, match="unknown backend"):
        reflex_core.load(path, backend="tpu")
    with pytest.raises(ReflexError, match="missing.gguf"):
        reflex_core.load(str(tmp_path / "missing.gguf"), backend="cpu")
    with pytest.raises(ReflexError, match="revision= applies to a Hub repository"):
        reflex_core.load(path, backend="cpu", revision="main")
    # ORG/NAME that is no local file goes to the Hub; offline and not cached: one line
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(ReflexError, match="hf download nobody/nothing") as err:
        reflex_core.load("nobody/nothing", backend="cpu")
    assert "\n" not in str(err.value)


def test_context_size(path, eng):
    """ctx_size is the CLI's -c: jobs must fit it, and above the model's context length they run
    with a notice, as llama.cpp runs them."""
    n = len(eng.tokenize(PROMPT))
    with reflex_core.load(path, backend="cpu", ctx_size=n + 2) as small:
        assert small.ctx_size == n + 2 and not small.notices
        with pytest.raises(ReflexError, match=rf"exceeds the context size \(-c\) \({n + 2} "):
            small.generate(PROMPT, max_tokens=3)
        assert small.generate(PROMPT, max_tokens=2).n_tokens == 2
        with pytest.raises(ReflexError, match=rf"exceed the context size \({n + 2} tokens\)"):
            small.system1(PROMPT, [" a b c"])
    trained = SHAPE.context_length
    long = PROMPT * 53
    assert trained < len(eng.tokenize(long)) + 1 <= trained + 40
    with pytest.raises(ReflexError, match="context length"):
        eng.generate(PROMPT, max_tokens=trained)
    with pytest.raises(ReflexError, match="context length"):
        eng.system1(long, [" x"])
    with reflex_core.load(path, backend="cpu", ctx_size=trained + 40) as big:
        assert big.notices == [f"notice: ctx_size {trained + 40} is larger than the model's "
                               f"context length ({trained} tokens): positions past it are ones "
                               f"the model was not trained on"]
        out = big.generate(PROMPT, max_tokens=trained - n + 8)
        assert out.n_prompt_tokens + out.n_tokens == trained + 8
        assert len(big.system1(long, [" x"]).candidates) == 1
    for bad in (-1, 1.5, True):
        with pytest.raises(ReflexError, match="ctx_size must be an integer >= 0"):
            reflex_core.load(path, backend="cpu", ctx_size=bad)


def test_importing_the_package_stays_cheap():
    code = ("import sys, reflex_core; heavy = [m for m in ('reflex_core.api', 'reflex_core.engine',"
            " 'numpy', 'click') if m in sys.modules]; print(heavy); "
            "assert callable(reflex_core.load)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"
