"""engine.generate's loop on the CPU backend: a prompt fed in chunks (``on_prefill``) gives what
one batch gives, at every chunk boundary; generation ends at an end-of-generation token; stop
strings cut before the first of two that complete in one token, and before one that begins two
characters before the token that completes it; a stream never hands out the beginning of a stop
string that then completes."""

from __future__ import annotations

import pytest

from reflex_core import engine
from reflex_core.sampling import SamplingParams
from reflex_core.testing.modelwriter import ModelShape

SHAPE = ModelShape(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, head_dim=32, n_ff=96,
                   context_length=1024)
GREEDY = SamplingParams(0.0, 0, 1.0, None)
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def lm(model_files):
    path = model_files(SHAPE, weight_type="Q8_0", tokenizer="qwen3", seed=4)
    loaded = engine.load(str(path), "cpu")[0]
    yield loaded
    loaded.close()


@pytest.mark.parametrize("n_prompt", [engine.PREFILL_CHUNK - 1, engine.PREFILL_CHUNK,
                                      engine.PREFILL_CHUNK + 1, 2 * engine.PREFILL_CHUNK])
def test_chunked_prefill_equals_one_batch(lm, n_prompt):
    ids = [(7 * i + 3) % 500 + 10 for i in range(n_prompt)]
    whole = engine.generate(lm, ids, 4, GREEDY)
    calls = []
    chunked = engine.generate(lm, ids, 4, GREEDY, on_prefill=lambda d, t: calls.append((d, t)))
    assert chunked.token_ids == whole.token_ids
    # progress after each chunk but the last (which the prefill's logits come from)
    n_chunks = -(-n_prompt // engine.PREFILL_CHUNK)
    assert calls == [(engine.PREFILL_CHUNK * (i + 1), n_prompt) for i in range(n_chunks - 1)]


def test_generation_ends_at_an_end_of_generation_token(lm, monkeypatch):
    ids = lm.tokenizer.encode(PROMPT)
    whole = engine.generate(lm, ids, 8, GREEDY)
    assert whole.stop_reason == "length" and len(whole.token_ids) == 8
    # a token first generated after others (an earlier copy of it would end the run there)
    eog = next(t for t in whole.token_ids[3:] if whole.token_ids.index(t) > 0)
    first = whole.token_ids.index(eog)
    monkeypatch.setattr(lm.tokenizer, "eog_ids", frozenset({eog}))
    res = engine.generate(lm, ids, 8, GREEDY)
    assert res.stop_reason == "eog"
    assert res.token_ids == whole.token_ids[:first + 1]  # the end token is the last one kept
    # ... and none of the text (llama.cpp prints no piece of it), streamed or not, with stops
    want = lm.tokenizer.decode(whole.token_ids[:first])
    assert res.text == want and want
    for stop in ([], ["\uffff never"]):
        pieces, streamed = _stream(lm, ids, 8, stop)
        assert "".join(pieces) == streamed.text == want and streamed.stop_reason == "eog"


def _pieces(lm, n):
    """The greedy text of PROMPT token by token (each a whole character here)."""
    ids = lm.tokenizer.encode(PROMPT)
    whole = engine.generate(lm, ids, n, GREEDY)
    pieces = [lm.tokenizer.decode([t]) for t in whole.token_ids]
    assert "".join(pieces) == whole.text
    return ids, whole, pieces


def _stream(lm, ids, n, stop):
    gen = engine.generate_steps(lm, ids, n, GREEDY, stream=True, stop=stop)
    out = []
    try:
        while True:
            out.append(next(gen))
    except StopIteration as e:
        return out, e.value


def test_stop_strings_cut_at_the_earliest_and_span_tokens(lm):
    ids, whole, pieces = _pieces(lm, 16)
    # a token of 2+ characters followed by another: the stop takes its last two characters
    # and the next token's first, so it begins two characters before the token that ends it
    k = next(i for i in range(1, len(pieces) - 1) if len(pieces[i]) >= 2 and pieces[i + 1])
    stop = pieces[k][-2:] + pieces[k + 1][:1]
    cut = whole.text.find(stop)
    assert cut >= 0
    res = engine.generate(lm, ids, 16, GREEDY, stop=[stop])
    assert res.stop_reason == "stop" and res.text == whole.text[:cut]
    streamed, result = _stream(lm, ids, 16, [stop])
    assert "".join(streamed) == whole.text[:cut] and result.text == whole.text[:cut]
    # two stop strings that complete in the same token: the text ends before the one that
    # begins first, whichever is listed first
    starts = [sum(map(len, pieces[:i])) for i in range(len(pieces))]
    k = next(i for i in range(len(pieces)) if len(pieces[i]) >= 3
             and whole.text.find(pieces[i][:2]) == starts[i]
             and whole.text.find(pieces[i][1:3]) == starts[i] + 1)
    first, second = pieces[k][:2], pieces[k][1:3]
    for stops in ([first, second], [second, first]):
        res = engine.generate(lm, ids, 16, GREEDY, stop=stops)
        assert res.text == whole.text[:starts[k]], stops


def test_a_character_split_across_a_resume_is_whole_in_the_continuation(lm, monkeypatch):
    """A job stopped by -n inside a character leaves it, when its state is kept, to the job
    that continues the state with no prompt of its own: the two texts join to the one job's
    (llama.cpp prints each job's bytes), streamed or not. Without a kept state the job ends
    its text with U+FFFD, as before."""
    import types

    tok = lm.tokenizer
    b = {x: next(i for i in range(tok.n_vocab) if tok.token_bytes(i) == bytes([x]))
         for x in b"ab\xf0\x9f\x98\x80"}
    first = [b[ord("a")], b[0xF0], b[0x9F]]
    second = [b[0x98], b[0x80], b[ord("b")]]
    forced = iter(first + second + first + second)
    monkeypatch.setattr(type(lm.ops), "argmax", lambda self, logits: [next(forced)])
    ids = tok.encode(PROMPT)
    whole = engine.generate(lm, ids, 6, GREEDY)
    assert whole.token_ids == first + second and whole.text == "a\U0001F600b"
    for stream in (False, True):
        forced = iter(first + second)
        texts = []
        for job in range(2):
            steps = engine.generate_steps(lm, [] if job else ids, 3, GREEDY, stream=stream,
                                          resume=resume if job else None, keep_state=not job)
            pieces = []
            try:
                while True:
                    pieces.append(next(steps))
            except StopIteration as e:
                res = e.value
            assert "".join(pieces) == (res.text if stream else "")
            texts.append(res.text)
            resume = types.SimpleNamespace(tokens=res.fed, pending=res.pending,
                                           dumped=res.state.dump() if job == 0 else None,
                                           path="<memory>")
        assert texts == ["a", "\U0001F600b"]
    # not kept: the unfinished character shows as U+FFFD
    forced = iter(first)
    assert engine.generate(lm, ids, 3, GREEDY).text == "a\ufffd"
