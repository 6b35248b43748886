"""The prompt-scoped BPE (notes, path (v)): exact ids without building the full tokenizer.

BPE on a pre-tokenized word only ever applies merges whose result is a substring of that word,
and only the relative order of merge ranks matters. So a tiny ``models.BPE`` holding the vocab
tokens that are substrings of the text's words, plus the merges producing them in rank order,
gives exactly the full tokenizer's ids (~0.3-1 ms to build). Its words come from the same
pipeline: split on the added tokens (leftmost-longest, as HF), normalize and pre-tokenize each
piece with the same ``tokenizers`` objects. Which merge produces a token: in convert_hf_to_gguf's
layout merge i produces token 256+i; ``check`` verifies that on the whole file, in bulk
(~15-20 ms for Qwen3, once), before the path is used. Whatever it cannot serve exactly -- the
check fails, an odd vocabulary layout, a pathological text with > 2e5 substring look-ups, or
about one full build's worth of mini builds -- raises ``NotScoped``, and the tokenizer builds
the full BPE instead. No step holds the GIL for more than a few ms at a time.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from itertools import accumulate
from typing import Any

from .pretokenizers import PreTokenizerSpec, bpe_model, pipeline, with_pipeline
from .tables import Strings, export_tables
from .vocab import raw_strings

_MAX_CHECKS = 200_000  # substring look-ups for one call; beyond, the full build is cheaper
_UNION_MAX = 1024  # new texts join the current mini BPE while it has at most this many tokens;
#                    past that the next uncovered text starts a fresh one (rebuilds stay small)
# Cost model of the fast path, in microseconds (measured: a mini BPE build ~40 us + ~0.5 us per
# vocab/merge entry; a substring look-up ~0.1 us). Once the fast path has cost about one full
# build (~200-250 ms for Qwen3), the full tokenizer is built: a long-running process that
# encodes many different texts then pays for it once, and at most twice the cheaper choice.
_COST_BUILD, _COST_ENTRY, _COST_CHECK = 40.0, 0.5, 0.1
_MAX_FAST_COST = 200_000.0
_SHORT_WORD = 32  # words up to this many bytes need no max-token-length bound
_DEL_ALL_BUT_SP_NUL = bytes(b for b in range(256) if b not in (0x20, 0x00))  # translate(None, _)


class NotScoped(Exception):
    """The prompt-scoped path cannot be used; the message says why."""


def _n_checks(n_chars: int, bound: int) -> int:
    """Substring look-ups for a word of n_chars characters when tokens have at most `bound`
    bytes (so at most `bound` characters): an upper bound on what _collect does."""
    if n_chars <= bound:
        return n_chars * (n_chars + 1) // 2
    return bound * (n_chars - bound) + bound * (bound + 1) // 2


class PromptScopedBPE:
    """Builds, for the texts at hand, a mini BPE that encodes them exactly like the full one.

    ``raw``: every token's bytes; ``vocab``: bytes -> id over the BPE vocabulary, ids 0..k-1;
    ``added``: the (id, text, is CONTROL) added tokens; ``merges_src``: the merge strings
    (checked on first use). ``from_tables`` makes one whose check was done when the tables
    were exported."""

    def __init__(self, spec: PreTokenizerSpec, raw: Any, vocab: Any, k: int,
                 added: list[tuple[int, str, bool]], merges_src: Any):
        self._spec, self._raw, self._vocab, self._k, self._added = spec, raw, vocab, k, added
        self._merges_src = merges_src
        self.checked = False  # the bulk check passed
        self._mblocks: list[bytes] = []  # merges, NUL-joined per chunk (after the bulk check)
        self._mstarts: list[int] = []  # rank of each chunk's first merge
        self._msplit: dict[int, list[bytes]] = {}  # chunks split so far
        self._m = 0
        self._merge_strs: Strings | None = None  # merges by rank, served from tables
        self._kb: int | None = None  # longest BPE token, bytes
        self._pins_checked = False
        self._comp: tuple | None = None
        self._added_rx: tuple | None = None
        self._pairs: dict[int, tuple[str, str]] = {}  # merge rank -> (a, b), decoded so far
        self._cost = 0.0  # of this path so far (see _MAX_FAST_COST)
        self.reset()

    @classmethod
    def from_tables(cls, spec: PreTokenizerSpec, raw: Strings, vocab: Any, k: int,
                    added: list[tuple[int, str, bool]], merges: Strings, m: int,
                    kb: int) -> PromptScopedBPE:
        s = cls(spec, raw, vocab, k, added, None)
        s.checked, s._m, s._merge_strs, s._kb = True, m, merges, kb
        return s

    def reset(self) -> None:
        """Forget the mini BPE (the next encode builds a new one)."""
        self._cov: set[str] = set()  # words the mini BPE covers
        self._sub: dict[str, int] = {}  # its vocab (without the added tokens)
        self._sub_ids: set[int] = set()
        self._ranks: set[int] = set()  # its merges
        self._mini: Any = None

    # ---------------------------------------------------------------- the vocabulary check

    def check(self) -> None:
        """Whether a prompt-scoped BPE is exact for this vocabulary; raises NotScoped if not.
        The merge check covers every merge, in bulk (~15 ms for Qwen3's 151k)."""
        if self._raw is None:
            raise NotScoped("no token bytes")
        if self._spec.ignore_merges:
            raise NotScoped("ignore_merges vocabularies use the full tokenizer")
        k, vocab = self._k, self._vocab
        if k < 0:
            raise NotScoped("the BPE vocabulary is not ids 0..k-1")
        if len(vocab) != k:
            raise NotScoped("duplicate token texts in the BPE vocabulary")
        texts = [text for _, text, _ in self._added]
        if (len(set(texts)) != len(texts) or any(len(t) < 2 for t in texts)
                or any(t.encode("utf-8") in vocab for t in texts)):
            # duplicates / one-character / vocab-equal added tokens: HF's id rules get subtle
            raise NotScoped("unusual added tokens")
        src = self._merges_src
        if not src:
            chunks = ()
        elif hasattr(src, "raw_chunks"):
            chunks = src.raw_chunks()  # block by block: nothing big is allocated or kept
        else:
            chunks = (raw_strings(src),)
        raw, blocks, starts, m = self._raw, [], [], 0
        for chunk in chunks:
            c = len(chunk)
            if not c:
                continue
            if 256 + m + c > k:
                raise NotScoped(f"more merges than tokens after the first 256 ({k})")
            joined = b"\0".join(chunk)
            # every merge has exactly one space and no NUL (so joined splits back exactly) ...
            if joined.translate(None, _DEL_ALL_BUT_SP_NUL) != b" \0" * (c - 1) + b" ":
                raise NotScoped(f"a merge in {m}..{m + c - 1} is not 'a b' with exactly one space")
            # ... and merge i without its space is token 256+i (so no other merge makes it)
            if joined.replace(b" ", b"") != b"\0".join(raw[256 + m:256 + m + c]):
                raise NotScoped(f"a merge in {m}..{m + c - 1} does not produce token 256+i")
            blocks.append(joined)
            starts.append(m)
            m += c
        self._mblocks, self._mstarts, self._m = blocks, starts, m
        self.checked = True

    def merge_texts(self) -> list[str] | None:
        """Every merge string, decoded from the checked blocks (one join, one decode, one
        split); None when they are not at hand (not checked, or served from tables).
        UnicodeDecodeError for invalid UTF-8."""
        if not (self.checked and self._m and self._mblocks):
            return None
        return b"\0".join(self._mblocks).decode("utf-8").split("\0")

    def export(self, tb: bytes, tokens_at: int, merges_at: int | None) -> dict:
        """The tables that serve this vocabulary (see .tables), checking it first if needed
        (NotScoped if it fails). ``tb``: the token types; ``*_at``: where the token and merge
        strings start in the file."""
        if not self.checked:
            self.check()
        if self._merge_strs is not None:
            merges = self._merge_strs[:self._m]
        else:
            merges = [b for blk in self._mblocks for b in blk.split(b"\0")]
        return export_tables(tb=tb, added=self._added, k=self._k, tokens=self._raw,
                             tokens_at=tokens_at, merges=merges, merges_at=merges_at)

    # ---------------------------------------------------------------- the mini BPE

    def encoder(self, texts, parse_special: bool):
        """A mini BPE that encodes every one of ``texts`` exactly (NotScoped: it cannot)."""
        if not self.checked:
            self.check()
        words: set[str] = set()
        for text in texts:
            self._words(text, parse_special, words)
        new = words - self._cov
        if new and len(self._sub_ids) > _UNION_MAX:  # start a fresh mini BPE for these texts
            self.reset()
            new = words
        if new:
            bound = self._kb
            if bound is None and any(len(w) > _SHORT_WORD for w in new):
                bound = self._kb = max(map(len, self._raw[:self._k]))
            est = sum(_n_checks(len(w), bound or len(w)) for w in new)
            if est > _MAX_CHECKS:
                raise NotScoped(f"a text needs {est} substring look-ups (> {_MAX_CHECKS})")
            self._charge(est * _COST_CHECK)
            fresh = self._collect(new, bound) - self._sub_ids
            if fresh:
                raw, m, sub, ranks = self._raw, self._m, self._sub, self._ranks
                for t in fresh:
                    try:
                        sub[raw[t].decode("utf-8")] = t
                    except UnicodeDecodeError:
                        raise NotScoped(f"token {t} is not valid UTF-8") from None
                    if 256 <= t < 256 + m:
                        ranks.add(t - 256)
                self._sub_ids |= fresh
                self._mini = None
            if self._mini is None:
                self._mini = self._build_mini()
            self._cov |= new
        elif self._mini is None:
            self._mini = self._build_mini()
        return self._mini

    def _collect(self, words, bound: int | None) -> set[int]:
        """Ids of the BPE vocab tokens that are substrings of ``words`` (at most ``bound``
        bytes long; None: no bound needed, every word is short)."""
        get = self._vocab.get
        found: set[int] = set()
        add = found.add
        for w in words:
            wb = w.encode("utf-8")
            nb = len(wb)
            if nb == len(w):
                offs = range(nb + 1)
            else:
                offs = list(accumulate((len(c.encode("utf-8")) for c in w), initial=0))
            kb = nb if bound is None else bound
            last = len(offs)
            for i in range(last - 1):
                s = offs[i]
                for j in range(i + 1, last):
                    e = offs[j]
                    if e - s > kb:
                        break
                    t = get(wb[s:e])
                    if t is not None:
                        add(t)
        return found

    def _build_mini(self):
        try:
            from tokenizers import Tokenizer as HFTokenizer

            vocab = dict(self._sub)
            for i, text, _ in self._added:  # pinned: BPE never makes them (checked above)
                vocab[text] = i
            pairs = self._pairs
            merges = []
            for r in sorted(self._ranks):
                p = pairs.get(r)
                if p is None:
                    a, _, b = self._merge_raw(r).decode("utf-8").partition(" ")
                    if not a or not b:
                        raise NotScoped(f"merge {r} has an empty side")
                    p = pairs[r] = (a, b)
                merges.append(p)
            self._charge(_COST_BUILD + _COST_ENTRY * (len(vocab) + len(merges)))
            *pipe, added = self._components()
            hf = with_pipeline(HFTokenizer(bpe_model(vocab, merges, self._spec)), pipe)
            if added:
                hf.add_tokens(added)
                if not self._pins_checked:  # first build: verify the pinned ids once
                    for i, text, _ in self._added:
                        if hf.token_to_id(text) != i:
                            raise NotScoped(f"added token {text!r} did not keep id {i}")
                    self._pins_checked = True
            return hf
        except NotScoped:
            raise
        except Exception as e:  # the full build reports an inconsistent file properly
            raise NotScoped(f"the prompt-scoped BPE failed: {e}") from None

    def _charge(self, cost: float) -> None:
        self._cost += cost
        if self._cost > _MAX_FAST_COST:
            raise NotScoped("the fast path has cost about one full build so far")

    def _merge_raw(self, r: int) -> bytes:
        if self._merge_strs is not None:
            return self._merge_strs[r]
        i = bisect_right(self._mstarts, r) - 1
        parts = self._msplit.get(i)
        if parts is None:
            parts = self._msplit[i] = self._mblocks[i].split(b"\0")
        return parts[r - self._mstarts[i]]

    def _components(self):
        if self._comp is None:
            from tokenizers import AddedToken

            normalizer, pre_tokenizer, post, dec = pipeline(self._spec)
            added = [AddedToken(text, normalized=False, special=ctl) for _, text, ctl in self._added]
            self._comp = (normalizer, pre_tokenizer, post, dec, added)
        return self._comp

    def _words(self, text: str, parse_special: bool, out: set[str]) -> None:
        """Add the pre-tokenized words HF's BPE will see for ``text`` to ``out``."""
        normalizer, pre_tokenizer = self._components()[:2]
        segs = self._segments(text, parse_special, 0)
        if not parse_special:  # either way HF may treat a skipped special token: cover both
            segs += self._segments(text, parse_special, 1)
        for seg in segs:
            if seg and normalizer is not None:
                seg = normalizer.normalize_str(seg)
            if seg:
                out.update(w for w, _ in pre_tokenizer.pre_tokenize_str(seg))

    def _segments(self, text: str, parse_special: bool, which: int) -> list[str]:
        """``text`` split at the added tokens, leftmost-longest like HF's Aho-Corasick; with
        parse_special=False CONTROL (special) tokens stay text: which=0 finds all matches and
        skips the special ones, which=1 matches only the non-special tokens."""
        if self._added_rx is None:
            texts = {text: ctl for _, text, ctl in self._added if text}
            alts = sorted(texts, key=len, reverse=True)
            plain = [t for t in alts if not texts[t]]
            mk = lambda ts: re.compile("|".join(map(re.escape, ts))) if ts else None  # noqa: E731
            self._added_rx = (mk(alts), mk(plain), {t for t in alts if texts[t]})
        rx = self._added_rx[which]
        if rx is None or not text:
            return [text]
        skip = self._added_rx[2] if (which == 0 and not parse_special) else ()
        segs, pos = [], 0
        for mt in rx.finditer(text):
            if skip and mt.group() in skip:
                continue
            if mt.start() > pos:
                segs.append(text[pos:mt.start()])
            pos = mt.end()
        if pos < len(text):
            segs.append(text[pos:])
        return segs
