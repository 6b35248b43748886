"""System 1 scoring: every candidate continuation of a prompt scored in ONE forward pass.

The prompt's tokens and every candidate's tokens are packed into one batch. A tree attention
mask lets each candidate token see the whole prompt and its own earlier tokens, never another
candidate's, and each candidate's positions continue the prompt's. The score of a candidate is

    score = Σ_j log P(c_j | prompt, c_<j)        (natural log, full-vocabulary log-softmax)

``probability`` is the softmax of the scores over the candidate set (relative to the set, not to
the vocabulary); ``entropy`` is that distribution's entropy in nats. With ``normalize`` each score
is divided by the candidate's token count before the softmax (the reported score stays the sum).

A model whose state is recurrent (per-sequence buffers, :attr:`StateSpec.recurrent`) cannot attend
selectively: the prompt then runs once, each candidate gets its own sequence forked from the
prompt's state (device-side copies), and every candidate is scored in one second pass -- the same
numbers in two forward passes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from .errors import ReflexError


@dataclass
class Candidate:
    idx: int
    text: str
    token_ids: list[int]
    score: float = 0.0
    probability: float = 0.0


@dataclass
class System1Result:
    candidates: list[Candidate]
    best_idx: int
    entropy: float


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


def score(model: Any, ops: Any, prompt: Sequence[int],
          cands: Sequence[Sequence[int]]) -> list[float]:
    """Sum of log-probabilities of each candidate's tokens given the prompt.

    Attention-only state: ONE forward pass over the tree batch (the prompt as sequence 0, each
    candidate as its own sequence continuing it). Recurrent state: the prompt first, then every
    candidate from its own fork of the prompt's state, all candidates in one second pass."""
    if not prompt:
        raise ReflexError("empty prompt: system1 needs a prompt to condition on")
    P = len(prompt)
    total = P + sum(len(c) for c in cands)
    spec = model.state_spec()
    limit = model.n_ctx_train
    # the tree batch holds every candidate at once; forked sequences only one each
    need = P + max(map(len, cands)) if spec.recurrent else total
    if limit and need > limit:
        raise ReflexError(f"prompt + candidates ({total} tokens) exceed the model's context "
                          f"length ({limit} tokens)")
    state = model.new_state(total, 1 + len(cands))
    branches = {1 + i: list(c) for i, c in enumerate(cands)}
    # batch row whose logits predict each candidate token, in candidate order
    rows: list[int] = []
    targets: list[int] = []
    if not spec.recurrent:
        batch = state.append_tree(prompt, branches)
        start = P
        for c in cands:
            rows += [P - 1] + [start + j for j in range(len(c) - 1)]
            targets += c
            start += len(c)
        uniq = sorted(set(rows))
        where = {r: i for i, r in enumerate(uniq)}
        logits = model.forward(batch, state, uniq)
        lp = ops.token_logprobs(ops.take_rows(logits, [where[r] for r in rows]), targets)
    else:
        first = state.append(prompt, 0)
        last = model.forward(first, state, [P - 1])
        for seq in branches:
            state.fork(0, seq)
        first_lp = ops.token_logprobs(ops.take_rows(last, [0] * len(cands)), [c[0] for c in cands])
        rest = {seq: toks[:-1] for seq, toks in branches.items() if len(toks) > 1}
        later: list[float] = []
        if rest:
            batch = state.append_branches(rest)
            logits = model.forward(batch, state, list(range(batch.n_tokens)))
            later = ops.token_logprobs(logits, [t for toks in branches.values() for t in toks[1:]])
        lp, k = [], 0
        for i, c in enumerate(cands):
            lp.append(first_lp[i])
            lp += later[k:k + len(c) - 1]
            k += len(c) - 1
    scores, k = [], 0
    for c in cands:
        scores.append(float(sum(lp[k:k + len(c)])))
        k += len(c)
    return scores


def evaluate(model: Any, ops: Any, prompt: Sequence[int], texts: Sequence[str],
             cand_ids: Sequence[Sequence[int]], normalize: bool = False) -> System1Result:
    scores = score(model, ops, prompt, cand_ids)
    logits = [s / len(c) if normalize else s for s, c in zip(scores, cand_ids)]
    m = max(logits)
    exps = [math.exp(x - m) for x in logits]
    z = sum(exps)
    probs = [e / z for e in exps]
    entropy = -sum(p * math.log(p) for p in probs if p > 0.0)
    cands = [Candidate(i, t, list(c), s, p)
             for i, (t, c, s, p) in enumerate(zip(texts, cand_ids, scores, probs))]
    best = max(range(len(cands)), key=lambda i: (probs[i], -i))
    return System1Result(cands, best, entropy)
