"""engine.decode_tokens' step order, on a fake decode graph (no GPU): the steps chained on the
device (DecodeGraph.queue) give the tokens one-step-at-a-time decoding gives, a chained step
that takes its token from the device always follows one queued before it, no step is queued
past the last token a job wants, and a caller that stops early leaves at most one step queued
past what it took; the same for a job fed from its prompt (engine.decode_fed: its first token
picked on the device, its first steps queued before the host waits for it), and which jobs are
(engine._feeds_from_prompt). Also cuda_graph's trace canonical form: prepared-buffer addresses."""

from __future__ import annotations

from itertools import islice
from types import SimpleNamespace

import pytest

from reflex_core import engine
from reflex_core.backends import cuda_graph


def after(t: int) -> int:  # the fake model: the token that follows t
    return (t * 7 + 3) % 101


class FakeState:
    def __init__(self) -> None:
        self.appended: list[list[int]] = []

    def append(self, tokens):
        self.appended.append(list(tokens))
        return SimpleNamespace(tokens=tuple(tokens), n_tokens=len(tokens), runs=((0, 0, 1),))


class FakeGraph:
    """forward: a one-token step waiting for the host ("logits" = the fed token); captured (so
    chainable) after ``capture_at`` of them; queue: a step whose token is the host's or, when
    None, the one the previous queued step picked into the device slot."""

    def __init__(self, capture_at: int) -> None:
        self.capture_at = capture_at
        self.forwards = 0
        self.slot: int | None = None  # the device's token slot
        self.queued: list[tuple[int | None, int]] = []  # (token given, token fed)
        self.picked: list[int] = []
        self.taken: list[int] = []

    def forward(self, batch, state):
        assert not self.queued, "a step waiting for the host after chained ones"
        self.forwards += 1
        return batch.tokens[-1]

    def can_chain(self) -> bool:
        return self.forwards >= self.capture_at

    def queue(self, batch, pick, token):
        assert pick == "pick"
        if token is None:
            assert self.slot is not None, "a device token read before any step picked one"
        fed = token if token is not None else self.slot
        self.slot = after(fed)
        self.queued.append((token, fed))
        self.picked.append(self.slot)
        return len(self.picked) - 1

    def result(self, ticket: int) -> int:
        assert ticket == len(self.taken), "results taken out of order"
        self.taken.append(ticket)
        return self.picked[ticket]


def expected(first: int, n: int) -> list[int]:
    out = [first]
    while len(out) < n:
        out.append(after(out[-1]))
    return out


@pytest.mark.parametrize("capture_at", [0, 1, 2, 5, 1000])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 9])
def test_chained_steps_give_the_same_tokens_and_no_extra_step(capture_at, n):
    g, st = FakeGraph(capture_at), FakeState()
    got = list(engine.decode_tokens(None, st, g, after, 5, n, "pick"))
    assert got == expected(5, n)
    assert g.forwards + len(g.queued) == n - 1  # one step per new token, none past the last
    assert len(st.appended) == n - 1
    if g.queued:
        assert g.queued[0][0] is not None  # the first chained step is fed by the host
        assert all(tok is None for tok, _ in g.queued[1:])
        assert [fed for _, fed in g.queued] == got[g.forwards:-1]


@pytest.mark.parametrize("take", [1, 2, 3, 6])
def test_a_caller_stopping_early_leaves_at_most_one_step_queued(take):
    g, st = FakeGraph(1), FakeState()
    tokens = engine.decode_tokens(None, st, g, after, 11, 20, "pick")
    got = list(islice(tokens, take))
    tokens.close()
    assert got == expected(11, take)
    steps = g.forwards + len(g.queued)
    assert take - 1 <= steps <= take


def test_without_a_chain_every_step_waits_for_the_host():
    g, st = FakeGraph(0), FakeState()
    assert list(engine.decode_tokens(None, st, g, after, 3, 6, None)) == expected(3, 6)
    assert g.forwards == 5 and not g.queued


class FakeFedGraph:
    """pick_first / queue_fed: every token is picked on the device; a step reads the slot."""

    def __init__(self, first: int) -> None:
        self.first = first
        self.slot: int | None = None
        self.picked: list[int] = []
        self.taken = 0
        self.events: list[str] = []  # "pick", "step", "result" in the host's order

    def pick_first(self, logits, pick, batch):
        assert pick == "pick" and logits == "logits" and not self.picked
        self.slot = self.first
        self.picked.append(self.slot)
        self.events.append("pick")
        return 0

    def queue_fed(self, batch, state, pick):
        assert self.slot is not None and batch.tokens == (0,)
        self.slot = after(self.slot)
        self.picked.append(self.slot)
        self.events.append("step")
        return len(self.picked) - 1

    def result(self, ticket: int) -> int:
        assert ticket == self.taken, "results taken out of order"
        self.taken += 1
        self.events.append("result")
        return self.picked[ticket]


@pytest.mark.parametrize("n", [2, 3, 4, 9])
def test_steps_fed_from_the_prompt_give_the_same_tokens_and_no_extra_step(n):
    g, st = FakeFedGraph(5), FakeState()
    got = list(engine.decode_fed(st, g, "logits", n, "pick"))
    assert got == expected(5, n)
    assert g.events.count("step") == n - 1 and len(st.appended) == n - 1
    # the first steps are queued before the host waits for the first token, later ones one
    # ahead of the token waited for
    ahead = min(n - 1, engine.FED_AHEAD)
    assert g.events[:2 + ahead] == ["pick"] + ["step"] * ahead + ["result"]
    for i, e in enumerate(g.events):
        if e == "result":
            steps_before = g.events[:i].count("step")
            taken_before = g.events[:i].count("result")
            assert steps_before == min(n - 1, max(taken_before + 1, engine.FED_AHEAD))


@pytest.mark.parametrize("take", [1, 2, 3, 6])
def test_a_caller_stopping_a_fed_job_leaves_at_most_the_first_steps_queued(take):
    g, st = FakeFedGraph(11), FakeState()
    tokens = engine.decode_fed(st, g, "logits", 20, "pick")
    got = list(islice(tokens, take))
    tokens.close()
    assert got == expected(11, take)
    assert take - 1 <= g.events.count("step") <= max(take, engine.FED_AHEAD)


def test_trace_canonical_form_names_prepared_buffers_and_numbers_the_rest():
    fixed = {0x1000: 40}
    temps = {0x1000: 512, 0x9000: 512, 0x5000: 1024}  # the prepared buffer made in this step
    launches = [("k", (1, 1, 1, 32, 1, 1, 0), "PPi", (0x1004, 0x5010, 7)),
                ("k", (1, 1, 1, 32, 1, 1, 0), "PPi", (0x9000, 0x20000, 7))]
    copies = [("htod", 0x1000, 40)]
    got_l, got_c = cuda_graph._canonical(launches, copies, temps, fixed)
    # 0x5000 and 0x9000 are the step's 1st and 2nd allocations (the prepared buffer not counted)
    assert got_l[0][3] == (("prepared", 4), ("tmp", 1, 0x10), 7)
    assert got_l[1][3] == (("tmp", 0, 0), 0x20000, 7)
    assert got_c == [("htod", ("prepared", 0), 40)]
    # the same step where the prepared buffer already existed: the same form
    again = cuda_graph._canonical(launches, copies, {0x9000: 512, 0x5000: 1024}, fixed)
    assert again == (got_l, got_c)


class FeedGraph:
    def __init__(self, ok: bool) -> None:
        self.ok = ok

    def can_feed(self, logits) -> bool:
        return self.ok


@pytest.mark.parametrize("env, gb, n_prompt, ok, want", [
    ("", 2, 1518, True, True),     # 1518 tokens x 2 GB: past both bounds
    ("", 2, 1000, True, False),    # 1000 x 2 GB: too little work (a short prefill)
    ("", 50, 100, True, False),    # work enough, but too few tokens
    ("", 2, 1518, False, False),   # logits that are not ids (or steps already run)
    ("0", 2, 1518, True, False),
    ("1", 2, 100, True, True),
    ("1", 2, 100, False, False),
])
def test_which_jobs_chain_from_their_prompt(tmp_path, monkeypatch, env, gb, n_prompt, ok, want):
    f = tmp_path / "m.gguf"
    with open(f, "wb") as fh:  # a sparse file: only its size is read
        fh.truncate(gb * 10**9)
    monkeypatch.setenv("REFLEX_DECODE_FED", env)
    lm = SimpleNamespace(path=str(f))
    assert engine._feeds_from_prompt(lm, n_prompt, "logits", FeedGraph(ok)) is want


def test_a_file_gone_from_under_its_mapping_leaves_the_job_host_fed(tmp_path, monkeypatch):
    monkeypatch.delenv("REFLEX_DECODE_FED", raising=False)
    lm = SimpleNamespace(path=str(tmp_path / "gone.gguf"))
    assert engine._feeds_from_prompt(lm, 10**6, "logits", FeedGraph(True)) is False
