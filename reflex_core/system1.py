"""System 1 scoring: every candidate continuation of a prompt scored in ONE forward pass.

The prompt's tokens and every candidate's tokens are packed into one batch. A tree attention
mask lets each candidate token see the whole prompt and its own earlier tokens, never another
candidate's, and each candidate's positions continue the prompt's. The score of a candidate is

    score = Σ_j log P(c_j | prompt, c_<j)        (natural log, full-vocabulary log-softmax)

``probability`` is the softmax of the scores over the candidate set (relative to the set, not to
the vocabulary); ``entropy`` is that distribution's entropy in nats. With ``normalize`` each score
is divided by the candidate's token count before the softmax (the reported score stays the sum).

A model whose state is recurrent cannot attend selectively (``Model.supports_tree_mask`` False):
the prompt then runs once, its state is snapshotted, and each candidate is scored from a restored
snapshot — same numbers, one prompt pass plus one short pass per candidate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from .errors import ReflexError
from .ops import AttnMask, Batch


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


def tree_batch(prompt: Sequence[int], cands: Sequence[Sequence[int]]) -> tuple[Batch, list[int], list[int]]:
    """Pack prompt + candidates into one batch under the tree mask.

    Returns (batch, out_rows, targets): ``out_rows[r]`` is the batch row whose logits predict
    ``targets[r]``. Rows are ordered candidate by candidate, token by token.
    """
    P = len(prompt)
    tokens = list(prompt)
    positions = list(range(P))
    prefix_end = list(range(1, P + 1))
    own_start = [0] * P
    own_end = [0] * P
    out_rows: list[int] = []
    targets: list[int] = []
    for ids in cands:
        start = len(tokens)
        for j, tok in enumerate(ids):
            tokens.append(tok)
            positions.append(P + j)
            prefix_end.append(P)
            own_start.append(start)
            own_end.append(start + j + 1)
            out_rows.append(P - 1 if j == 0 else start + j - 1)
            targets.append(tok)
    mask = AttnMask(tuple(prefix_end), tuple(own_start), tuple(own_end))
    return Batch(tuple(tokens), tuple(positions), 0, mask), out_rows, targets


def score(model: Any, ops: Any, prompt: Sequence[int], cands: Sequence[Sequence[int]]) -> list[float]:
    """Sum of log-probabilities of each candidate's tokens given the prompt (one pass)."""
    if not prompt:
        raise ReflexError("empty prompt: system1 needs a prompt to condition on")
    total = len(prompt) + sum(len(c) for c in cands)
    limit = model.n_ctx_train
    if limit and (total if model.supports_tree_mask else len(prompt) + max(map(len, cands))) > limit:
        raise ReflexError(f"prompt + candidates ({total} tokens) exceed the model's context "
                          f"length ({limit} tokens)")
    if model.supports_tree_mask:
        batch, rows, targets = tree_batch(prompt, cands)
        uniq = sorted(set(rows))
        where = {r: i for i, r in enumerate(uniq)}
        cache = model.new_cache(batch.n_tokens)
        logits = model.forward(batch, cache, uniq)
        lp = ops.token_logprobs(ops.take_rows(logits, [where[r] for r in rows]), targets)
        scores, k = [], 0
        for c in cands:
            scores.append(float(sum(lp[k:k + len(c)])))
            k += len(c)
        return scores
    # Recurrent state: prompt once, then each candidate from a restored snapshot.
    cache = model.new_cache(len(prompt) + max(len(c) for c in cands))
    first = Batch.causal(prompt, 0)
    last_logits = model.forward(first, cache, [first.n_tokens - 1])
    cache.n_used = first.n_kv
    snap = model.snapshot(cache)
    scores = []
    for c in cands:
        model.restore(cache, snap)
        lp = ops.token_logprobs(last_logits, [c[0]])
        if len(c) > 1:
            b = Batch.causal(c[:-1], cache.n_used)
            logits = model.forward(b, cache, list(range(b.n_tokens)))
            lp += ops.token_logprobs(logits, c[1:])
        scores.append(float(sum(lp)))
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
