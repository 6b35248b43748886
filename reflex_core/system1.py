"""System 1 scoring: every candidate continuation of a prompt scored in ONE forward pass.

The prompt's tokens and every candidate's tokens are packed into one batch. A tree attention
mask lets each candidate token see the whole prompt and its own earlier tokens, never another
candidate's, and each candidate's positions continue the prompt's. The score of a candidate is

    score = Σ_j log P(c_j | prompt, c_<j)        (natural log, full-vocabulary log-softmax)

``probability`` is the softmax of the scores over the candidate set (relative to the set, not to
the vocabulary); ``entropy`` is that distribution's entropy in nats. With ``normalize`` each score
is divided by the candidate's token count (the mean log-probability per token) and that is the
score ranked, softmaxed and reported; ``logprob`` is always the sum.

A model whose state is recurrent (per-sequence buffers, :attr:`StateSpec.recurrent`) cannot attend
selectively: the prompt then runs once, each candidate gets its own sequence forked from the
prompt's state (device-side copies), and every candidate is scored in one second pass -- the same
numbers in two forward passes. (When the prompt's state is exported, the prompt's last token runs
with each candidate instead, so that the state before it can be written.)

The prompt may continue an imported state (``--import-kv``), and the state before the prompt's
last token can be handed out as a prefix file (``--export-kv``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from .errors import ReflexError
from .state import State


@dataclass
class Candidate:
    idx: int
    text: str
    token_ids: list[int]
    score: float = 0.0  # what is ranked: logprob, or logprob / tokens with normalize
    probability: float = 0.0
    logprob: float = 0.0  # Σ_j log P(c_j | prompt, c_<j)


@dataclass
class System1Result:
    candidates: list[Candidate]
    best_idx: int
    entropy: float
    n_prefill: int = 0  # prompt tokens this job fed (an imported state's pending ones included)
    n_imported: int = 0  # tokens already in the imported state


def tokenize_candidates(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    if not texts:
        raise ReflexError("no candidates: give at least one --candidate TEXT")
    out = []
    for i, text in enumerate(texts):
        if text == "":
            raise ReflexError(f"candidate {i} is empty: every --candidate needs some text")
        ids = tokenizer.encode(text, add_special=False)
        if not ids:
            raise ReflexError(f"candidate {i} ({text!r}) tokenizes to no tokens")
        out.append(ids)
    return out


def score(model: Any, ops: Any, prompt: Sequence[int], cands: Sequence[Sequence[int]],
          start: Mapping | None = None,
          on_prefix: Callable[[dict], None] | None = None, ctx_size: int = 0) -> list[float]:
    """Sum of log-probabilities of each candidate's tokens given the prompt.

    Attention-only state: ONE forward pass over the tree batch (the prompt as sequence 0, each
    candidate as its own sequence continuing it). Recurrent state: the prompt first, then every
    candidate from its own fork of the prompt's state, all candidates in one second pass.

    ``start``: a one-sequence :meth:`State.dump` (an imported state file) the prompt continues.
    ``on_prefix`` receives the state after the prompt but its last token (a one-sequence dump:
    what ``--export-kv`` writes, with the last token pending). ``ctx_size``: the context the
    job must fit (0: the model's context length).

    Candidates of more than GROUP_TOKENS tokens in all are scored in groups of at most that
    many (the prompt run again for each), so that memory follows the group, not the request."""
    if not prompt:
        raise ReflexError("empty prompt: system1 needs a prompt to condition on")
    groups = _groups(cands)
    if len(groups) > 1:
        scores: list[float] = []
        for g, group in enumerate(groups):
            scores += score(model, ops, prompt, group, start, on_prefix if g == 0 else None,
                            ctx_size)
        return scores
    P = len(prompt)
    K = 0 if start is None else int(start["n_cells_used"])
    total = P + sum(len(c) for c in cands)
    spec = model.state_spec()
    limit = ctx_size or model.n_ctx_train
    # Each candidate continues the prompt alone, as if scored by a job of its own: the context
    # must hold the prompt and the longest candidate (the positions they reach), not all of
    # them together, though the tree batch gives every candidate its own cells at once.
    longest = max(map(len, cands))
    if limit and K + P + longest > limit:
        past = f"the imported state ({K} tokens) + " if K else ""
        where = "the context size" if ctx_size else "the model's context length"
        raise ReflexError(f"{past}prompt + longest candidate ({P + longest} tokens) exceed "
                          f"{where} ({limit} tokens)")
    n_seqs = 1 + len(cands)
    state = (model.new_state(total, n_seqs) if start is None
             else State.load(spec, ops, start, K + total, n_seqs))
    branches = {1 + i: list(c) for i, c in enumerate(cands)}
    targets = [t for c in cands for t in c]
    if not spec.recurrent:
        batch = state.append_tree(prompt, branches)
        # batch row whose logits predict each candidate token, in candidate order
        rows: list[int] = []
        row = P
        for c in cands:
            rows += [P - 1] + [row + j for j in range(len(c) - 1)]
            row += len(c)
        uniq = sorted(set(rows))
        where = {r: i for i, r in enumerate(uniq)}
        logits = model.forward(batch, state, uniq)
        if on_prefix is not None:  # cells are append-only: the prompt's are final already
            on_prefix(state.dump_prefix(K + P - 1))
        lp = _logprobs(ops, logits, [where[r] for r in rows], targets)
    else:
        # The prompt runs once and each candidate from its own fork of the prompt's state. To
        # export a prefix (the state before the prompt's last token, that token pending), the
        # last token goes with each candidate instead: the same numbers, still two passes.
        split = on_prefix is not None
        head = list(prompt[:-1]) if split else list(prompt)
        last = model.forward(state.append(head, 0), state, [len(head) - 1]) if head else None
        if split:
            on_prefix(state.dump_prefix(K + P - 1))
        for seq in branches:
            state.fork(0, seq)
        if split:
            batch = state.append_branches({seq: [prompt[-1]] + toks[:-1]
                                           for seq, toks in branches.items()})
            lp = ops.token_logprobs(model.forward(batch, state, list(range(batch.n_tokens))),
                                    targets)
        else:
            lp = _forked_logprobs(model, ops, state, last, branches)
    scores, k = [], 0
    for c in cands:
        scores.append(float(sum(lp[k:k + len(c)])))
        k += len(c)
    return scores


# Candidate tokens scored in one batch at most: the batch's cells, its attention (the reference
# holds a cells x cells mask) and its logit rows grow with them, and a request of 20000
# one-token candidates (100 KB of JSON) took a server past the machine's memory.
GROUP_TOKENS = 1024


def _groups(cands: Sequence[Sequence[int]]) -> list[list[Sequence[int]]]:
    """``cands`` in order, in groups of at most GROUP_TOKENS tokens (a longer candidate alone)."""
    groups: list[list[Sequence[int]]] = [[]]
    n = 0
    for c in cands:
        if groups[-1] and n + len(c) > GROUP_TOKENS:
            groups.append([])
            n = 0
        groups[-1].append(c)
        n += len(c)
    return groups


# Logit rows a log-probability call takes at a time: a row the candidates share (every first
# token's is the prompt's last) is copied once a target, and the reference works in float64,
# so thousands of one-token candidates at once took gigabytes (a server killed by the system).
LOGPROB_ROWS = 32


def _logprobs(ops: Any, logits: Any, rows: Sequence[int], targets: Sequence[int]) -> list[float]:
    """log_softmax(logits[rows[i]])[targets[i]] for every i, LOGPROB_ROWS rows at a time."""
    out: list[float] = []
    for i in range(0, len(rows), LOGPROB_ROWS):
        part = ops.take_rows(logits, list(rows[i:i + LOGPROB_ROWS]))
        out += ops.token_logprobs(part, list(targets[i:i + LOGPROB_ROWS]))
    return out


def _forked_logprobs(model: Any, ops: Any, state: State, last: Any,
                     branches: Mapping[int, Sequence[int]]) -> list[float]:
    """Candidate token log-probabilities, candidate by candidate: each first token from the
    prompt's last logits ``last``, the others from one pass over every fork's tokens."""
    first = _logprobs(ops, last, [0] * len(branches), [toks[0] for toks in branches.values()])
    rest = {seq: toks[:-1] for seq, toks in branches.items() if len(toks) > 1}
    later: list[float] = []
    if rest:
        batch = state.append_branches(rest)
        logits = model.forward(batch, state, list(range(batch.n_tokens)))
        later = ops.token_logprobs(logits, [t for toks in branches.values() for t in toks[1:]])
    lp, k = [], 0
    for i, toks in enumerate(branches.values()):
        lp.append(first[i])
        lp += later[k:k + len(toks) - 1]
        k += len(toks) - 1
    return lp


def evaluate(model: Any, ops: Any, prompt: Sequence[int], texts: Sequence[str],
             cand_ids: Sequence[Sequence[int]], normalize: bool = False,
             start: Mapping | None = None,
             on_prefix: Callable[[dict], None] | None = None,
             ctx_size: int = 0) -> System1Result:
    """Score the candidates (:func:`score`; ``start``/``on_prefix``/``ctx_size`` as there) and
    rank them."""
    scores = score(model, ops, prompt, cand_ids, start, on_prefix, ctx_size)
    logits = [s / len(c) if normalize else s for s, c in zip(scores, cand_ids)]
    m = max(logits)
    exps = [math.exp(x - m) for x in logits]
    z = sum(exps)
    probs = [e / z for e in exps]
    entropy = -sum(p * math.log(p) for p in probs if p > 0.0) + 0.0  # one candidate: 0, not -0
    cands = [Candidate(i, t, list(c), x, p, s)
             for i, (t, c, x, p, s) in enumerate(zip(texts, cand_ids, logits, probs, scores))]
    best = max(range(len(cands)), key=lambda i: (probs[i], -i))
    return System1Result(cands, best, entropy, len(prompt),
                         0 if start is None else int(start["n_cells_used"]))
