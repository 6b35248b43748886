"""The full Hugging Face tokenizer of a GGUF vocabulary (notes path (ii); ~240 ms for Qwen3's
152k tokens / 151k merges, holding the GIL): built only when the prompt-scoped BPE cannot
serve a text, or when ``REFLEX_TOKENIZER=full`` asks for it.

* vocab = the NORMAL tokens (UNUSED "[PAD…]" fillers are left out: HF knows no such ids);
* merges = the "a b" strings split into pairs; ``models.BPE`` with HF's byte-level options;
* normalizer, pre-tokenizer, post-processor and decoder from the ``pre`` type's spec;
* added tokens = CONTROL (special) and USER_DEFINED tokens, in one call, in id order.
"""

from __future__ import annotations

from ..errors import ModelError
from .pretokenizers import PreTokenizerSpec, bpe_model, pipeline, with_pipeline
from .vocab import IN_BPE_VOCAB, TT_BYTE, TT_NORMAL, TT_UNKNOWN


def build_full(tokens: list[str], types, tb: bytes, added: list[tuple[int, str, bool]],
               merges: list[str], spec: PreTokenizerSpec):
    """The full tokenizer. Returns (hf, vocab str -> id)."""
    from tokenizers import AddedToken, Tokenizer as HFTokenizer

    n = len(tokens)
    # Fast path (Qwen layout): NORMAL tokens are ids 0..k-1, then the added tokens, then UNUSED.
    n_normal = tb.count(TT_NORMAL) + tb.count(TT_UNKNOWN) + tb.count(TT_BYTE)
    if tb[:n_normal].count(TT_NORMAL) == n_normal:
        k = n_normal
        vocab = dict(zip(tokens[:k], range(k)))
    else:
        vocab = {tokens[i]: i for i in range(n) if types[i] in IN_BPE_VOCAB}
        k = -1
    # HF gives an added token the id of an equal vocab entry, else the next free id; the ids
    # come out right only when the added tokens directly follow a 0..k-1 vocab. Otherwise pin
    # them by putting them into the BPE vocab (BPE never produces them: no merge makes them).
    contiguous = k >= 0 and len(vocab) == k and all(i == k + j for j, (i, _, _) in enumerate(added))
    if not contiguous:
        for i, text, _ in added:
            vocab.setdefault(text, i)

    pairs = _split_merges_fast(merges)
    try:
        try:
            bpe = bpe_model(vocab, pairs if pairs is not None else _split_merges(merges), spec)
        except Exception:
            if pairs is None:
                raise
            bpe = bpe_model(vocab, _split_merges(merges), spec)  # the fast split mis-paired
    except ModelError:
        raise
    except Exception as e:
        raise ModelError(f"the GGUF's BPE vocabulary/merges are inconsistent: {e}") from None

    hf = with_pipeline(HFTokenizer(bpe), pipeline(spec))
    if added:
        hf.add_tokens([AddedToken(text, normalized=False, special=ctl) for _, text, ctl in added])
        seen: set[str] = set()
        for i, text, _ in added:
            if text in seen:  # a duplicate text keeps its first id (HF cannot hold both)
                continue
            seen.add(text)
            got = hf.token_to_id(text)
            if got != i:
                raise ModelError(f"added token {text!r} has id {i} in the GGUF but {got} in the tokenizer "
                                 "(duplicate token text?)")
    return hf, vocab


def _split_merges(merges: list[str]) -> list[tuple[str, str]]:
    """llama.cpp's split: at the first space at index >= 1."""
    out = []
    for m in merges:
        i = m.find(" ", 1)
        if i < 0:
            raise ModelError(f"tokenizer.ggml.merges has a malformed entry {m!r} (no space)")
        out.append((m[:i], m[i + 1:]))
    return out


def _split_merges_fast(merges: list[str]) -> list[tuple[str, str]] | None:
    """One join + split (C speed) when every merge evidently has exactly one inner space."""
    parts = " ".join(merges).split(" ")
    if len(parts) != 2 * len(merges) or "" in parts:
        return None
    it = iter(parts)
    return list(zip(it, it))
