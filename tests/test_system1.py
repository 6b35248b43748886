"""system1: one tree-masked forward pass scores every candidate; checked against llama.cpp.

For each candidate, llama.cpp (the oracle) runs prompt + that candidate as its own sequence with
every position's logits; the candidate's score is the sum over its tokens of the full-vocabulary
log-softmax at the preceding position. Reflex computes all candidates at once under the tree
mask. With F32 weights and llama.cpp's KV cache in F32 both sides compute in float32: measured
differences of the sums were <= 5e-6 (2026-11-29, sums of -7 to -37 over 1-5 tokens; float32
rounding of logits of magnitude ~10 before the log-softmax). The bound is 1e-4 per token.

The tests that run llama.cpp are marked ``oracle``: they FAIL (never skip) when llama-cpp-python
is missing (tests/conftest.py).
"""

from __future__ import annotations


import numpy as np
import pytest

from reflex_core import system1
from reflex_core.errors import ReflexError
from reflex_core.testing import oracle
from reflex_core.testing.modelwriter import ModelShape

PER_TOKEN = 1e-4

SHAPES = {
    "qwen3": ModelShape(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, head_dim=32, n_ff=96,
                        n_vocab=200),
    "qwen3moe": ModelShape(arch="qwen3moe", n_layer=2, n_embd=64, n_head=4, n_head_kv=2,
                           head_dim=32, n_ff=96, n_expert=8, n_expert_used=2, n_ff_exp=64,
                           n_vocab=200),
}

CANDS = [[7], [11, 3, 150], [42, 42], [199, 0, 5, 6, 7]]


@pytest.mark.oracle
@pytest.mark.parametrize("arch", ["qwen3", "qwen3moe"])
def test_scores_match_llama_cpp(model_files, arch):
    path = model_files(SHAPES[arch], weight_type="F32", seed=21)
    prompt = oracle.random_tokens(200, 9, seed=5)
    model = oracle.load_model(path)
    ours = system1.score(model, model.ops, prompt, CANDS)
    ref = oracle.llama_candidate_scores(path, prompt, CANDS)
    for c, a, b in zip(CANDS, ours, ref):
        assert abs(a - b) <= PER_TOKEN * len(c), (c, a, b)
    # the candidate ranking is the oracle's
    assert np.argsort(ours).tolist() == np.argsort(ref).tolist()


@pytest.mark.oracle
def test_recurrent_path_forked_scores_equal_tree_scores(model_files):
    """A model whose state has a per-sequence buffer (as a recurrent model's does) is scored
    through forks of the prompt's state in two passes: the same numbers as the tree batch."""
    from reflex_core.state import BufferSpec, StateSpec

    path = model_files(SHAPES["qwen3"], weight_type="F32", seed=21)
    prompt = oracle.random_tokens(200, 9, seed=5)
    model = oracle.load_model(path)
    tree = system1.score(model, model.ops, prompt, CANDS)
    kv = model.state_spec()
    model.state_spec = lambda: StateSpec(kv.buffers + (BufferSpec("slot", (3,), False),))
    assert model.state_spec().recurrent
    forked = system1.score(model, model.ops, prompt, CANDS)
    np.testing.assert_allclose(forked, tree, rtol=1e-5, atol=1e-5)
    ref = oracle.llama_candidate_scores(path, prompt, CANDS)
    for c, a, b in zip(CANDS, forked, ref):
        assert abs(a - b) <= PER_TOKEN * len(c)


@pytest.mark.parametrize("recurrent", [False, True])
def test_many_candidates_are_scored_in_bounded_groups(model_files, monkeypatch, recurrent):
    """Candidates past GROUP_TOKENS tokens go in groups (the prompt run again for each) and
    their log-probabilities LOGPROB_ROWS rows at a time: the scores of one batch, the prefix
    handed out once and the same; the groups keep to the bound."""
    from reflex_core.state import BufferSpec, StateSpec

    path = model_files(SHAPES["qwen3"], weight_type="F32", seed=21)
    prompt = oracle.random_tokens(200, 9, seed=5)
    model = oracle.load_model(path)
    if recurrent:
        kv = model.state_spec()
        model.state_spec = lambda: StateSpec(kv.buffers + (BufferSpec("slot", (3,), False),))
    cands = CANDS * 3 + [[1]] * 7
    prefixes: list = []
    whole = system1.score(model, model.ops, prompt, cands, on_prefix=prefixes.append)
    monkeypatch.setattr(system1, "GROUP_TOKENS", 5)
    monkeypatch.setattr(system1, "LOGPROB_ROWS", 2)
    groups = system1._groups(cands)
    assert [c for g in groups for c in g] == cands and len(groups) > 4
    assert all(sum(map(len, g)) <= 5 or len(g) == 1 for g in groups)
    grouped = system1.score(model, model.ops, prompt, cands, on_prefix=prefixes.append)
    np.testing.assert_allclose(grouped, whole, rtol=1e-5, atol=1e-5)
    assert len(prefixes) == 2 and prefixes[0]["n_cells_used"] == prefixes[1]["n_cells_used"]


def test_tree_batch_layout():
    from reflex_core.state import State, attention_kv_spec
    from reflex_core.backends.numpy_backend import NumpyOps

    st = State(attention_kv_spec(1, 1, 2), NumpyOps(), 6, 3)
    b = st.append_tree([10, 11, 12], {1: [20], 2: [30, 31]})
    assert b.tokens == (10, 11, 12, 20, 30, 31)
    assert b.positions == (0, 1, 2, 3, 3, 4)  # each candidate continues the prompt
    assert b.seq_ids == (0, 0, 0, 1, 2, 2)
    # candidate tokens see the prompt and their own earlier tokens, never another candidate's
    assert b.mask.visible(3) == [0, 1, 2, 3]
    assert b.mask.visible(4) == [0, 1, 2, 4]
    assert b.mask.visible(5) == [0, 1, 2, 4, 5]
    assert b.mask.visible(1) == [0, 1]
    assert st.n_used == 6 and [st.position(s) for s in range(3)] == [3, 4, 5]


def test_probabilities_entropy_and_normalize(model_files):
    path = model_files(SHAPES["qwen3"], weight_type="F32", seed=21)
    model = oracle.load_model(path)
    prompt = oracle.random_tokens(200, 6, seed=1)
    texts = [f"c{i}" for i in range(len(CANDS))]
    r = system1.evaluate(model, model.ops, prompt, texts, CANDS)
    scores = np.array([c.score for c in r.candidates])
    p = np.exp(scores - scores.max())
    p /= p.sum()
    np.testing.assert_allclose([c.probability for c in r.candidates], p, rtol=1e-12)
    assert r.best_idx == int(np.argmax(p))
    assert abs(r.entropy - float(-(p * np.log(p)).sum())) < 1e-12
    n = system1.evaluate(model, model.ops, prompt, texts, CANDS, normalize=True)
    # the sums stay as logprob; the score is what was ranked: the mean per token
    assert [c.logprob for c in n.candidates] == [c.logprob for c in r.candidates]
    assert [c.logprob for c in r.candidates] == [c.score for c in r.candidates]
    z = scores / np.array([len(c) for c in CANDS])
    np.testing.assert_allclose([c.score for c in n.candidates], z, rtol=1e-15)
    q = np.exp(z - z.max())
    q /= q.sum()
    np.testing.assert_allclose([c.probability for c in n.candidates], q, rtol=1e-12)
    # one candidate: entropy 0, printed as 0 (the sum's negation gave -0.0)
    one = system1.evaluate(model, model.ops, prompt, texts[:1], CANDS[:1])
    assert one.entropy == 0.0 and str(one.entropy) == "0.0"


def test_equal_candidates_rank_the_first(model_files):
    """Candidates of the same tokens score alike; the best is the first of them."""
    path = model_files(SHAPES["qwen3"], weight_type="F32", seed=21)
    model = oracle.load_model(path)
    prompt = oracle.random_tokens(200, 6, seed=1)
    r = system1.evaluate(model, model.ops, prompt, ["a", "b", "c"], [[7, 9], [7, 9], [7, 9]])
    assert len({c.score for c in r.candidates}) == 1
    assert r.best_idx == 0


def test_errors(model_files):
    class Tok:
        def encode(self, text, add_special=True):
            return [] if text == "nothing" else [1]

    with pytest.raises(ReflexError, match="no candidates"):
        system1.tokenize_candidates(Tok(), [])
    with pytest.raises(ReflexError, match="candidate 1 is empty"):
        system1.tokenize_candidates(Tok(), ["a", ""])
    with pytest.raises(ReflexError, match="tokenizes to no tokens"):
        system1.tokenize_candidates(Tok(), ["a", "nothing"])
    path = model_files(SHAPES["qwen3"], weight_type="F32", seed=21)
    model = oracle.load_model(path)
    limit = model.n_ctx_train
    with pytest.raises(ReflexError, match=r"prompt \+ longest candidate \(%d tokens\) exceed "
                       r"the model's context length" % (limit + 1)):
        system1.score(model, model.ops, [1] * (limit - 2), [[1, 2, 3], [3]])
    # the prompt with each candidate fits, all of them together would not: scored, each as
    # if alone
    prompt, cands = [1] * (limit - 4), [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15]]
    together = system1.score(model, model.ops, prompt, cands)
    assert together == pytest.approx([system1.score(model, model.ops, prompt, [c])[0]
                                      for c in cands], rel=1e-5)
    with pytest.raises(ReflexError, match="empty prompt"):
        system1.score(model, model.ops, [], [[1]])


def test_one_forward_pass(model_files):
    """Scoring runs exactly one model forward, whatever the number of candidates."""
    path = model_files(SHAPES["qwen3"], weight_type="F32", seed=21)
    model = oracle.load_model(path)
    calls = oracle.count_forwards(model)
    system1.score(model, model.ops, [1, 2, 3], CANDS)
    assert calls == [3 + sum(map(len, CANDS))]
