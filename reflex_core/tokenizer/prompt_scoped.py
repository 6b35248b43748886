"""The prompt-scoped BPE (notes, path (v)): exact ids without building the full tokenizer.

BPE on a pre-tokenized word only ever applies merges whose result is a substring of that word,
and only the relative order of merge ranks matters. So a tiny ``models.BPE`` holding the vocab
tokens that are substrings of the text's words, plus the merges producing them in rank order,
gives exactly the full tokenizer's ids (~0.3-1 ms to build). Its words come from the same
pipeline: split on the added tokens (leftmost-longest, as HF), normalize and pre-tokenize each
piece with the same ``tokenizers`` objects. Vocabularies that skip the merges for a word that is
a token (``ignore_merges``: GLM, tekken) are served too: a word is one of its own substrings, so
it is in the mini vocabulary exactly when it is in the full one.

Which merge produces a token: the one whose "a b" is the token's text a+b. A trained BPE's
token ids follow its merge order, so the map is a few *runs*: merges r0.. make tokens t0, t0+1,
... (Qwen: one run, merge i -> token 256+i; DeepSeek-LLM/V2: one, merge i -> token 243+i, the 13
byte characters valid UTF-8 never holds being added tokens; DeepSeek-V3: one, 259+i, after its
3 special tokens at ids 0-2). ``check`` verifies that on the whole file, in bulk (~15-20 ms for
Qwen3, once): each block of ~1024 merges is compared, as one bytes object, with the tokens that
continue the current run; a block that does not is looked up merge by merge (C-speed ``map``)
and must still make BPE tokens in increasing id order, which also means no token is made by
two merges. The runs go into the tables (.tables), so a start served from them checks nothing.
The BPE vocabulary is the NORMAL tokens wherever they lie (the added tokens are pinned in every
mini BPE by their ids). Whatever it cannot serve exactly -- the check fails, an odd vocabulary
layout, a pathological text with > 2e5 substring look-ups, or about one full build's worth of
mini builds -- raises ``NotScoped``, and the tokenizer builds the full BPE instead. No step
holds the GIL for more than a few ms at a time.
"""

from __future__ import annotations

import re
from array import array
from bisect import bisect_right
from itertools import accumulate, islice
from operator import lt
from typing import Any

from .pretokenizers import PreTokenizerSpec, bpe_model, pipeline, with_pipeline
from .tables import Strings, export_tables
from .vocab import BYTE_OF_CHAR, TT_NORMAL, raw_strings

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
# Bytes valid UTF-8 never holds: their byte-level characters never occur in a pre-tokenized word
_NOT_IN_UTF8 = frozenset((0xC0, 0xC1, *range(0xF5, 0x100)))


class NotScoped(Exception):
    """The prompt-scoped path cannot be used; the message says why."""


def _may_be_in_a_word(text: str) -> bool:
    """Whether the one-character added token ``text`` can be a character of a pre-tokenized
    word. Such a word holds only byte-level characters, of the bytes of valid UTF-8. Each mini
    BPE pins the added tokens in its vocabulary, the full one only when their ids do not follow
    it, so the mini BPE would keep a character the full one drops as unknown."""
    b = BYTE_OF_CHAR.get(text)
    return b is not None and b not in _NOT_IN_UTF8


def _n_checks(n_chars: int, bound: int) -> int:
    """Substring look-ups for a word of n_chars characters when tokens have at most `bound`
    bytes (so at most `bound` characters): an upper bound on what _collect does."""
    if n_chars <= bound:
        return n_chars * (n_chars + 1) // 2
    return bound * (n_chars - bound) + bound * (bound + 1) // 2


class PromptScopedBPE:
    """Builds, for the texts at hand, a mini BPE that encodes them exactly like the full one.

    ``raw``: every token's bytes; ``tb``: the token types; ``vocab``: bytes -> id over the BPE
    vocabulary, the k NORMAL tokens (k -1: other types in it, refused); ``added``: the (id,
    text, is CONTROL) added tokens; ``merges_src``: the merge strings (checked on first use).
    ``from_tables`` makes one whose check was done when the tables were exported."""

    def __init__(self, spec: PreTokenizerSpec, raw: Any, tb: bytes, vocab: Any, k: int,
                 added: list[tuple[int, str, bool]], merges_src: Any):
        self._spec, self._raw, self._tb, self._vocab, self._k = spec, raw, tb, vocab, k
        self._added, self._merges_src = added, merges_src
        self.checked = False  # the bulk check passed
        self._mblocks: list[bytes] = []  # merges, NUL-joined per chunk (after the bulk check)
        self._mstarts: list[int] = []  # rank of each chunk's first merge
        self._msplit: dict[int, list[bytes]] = {}  # chunks split so far
        self._m = 0
        # the runs (see the module's docstring): run j's merges, from rank _run_rank[j], make
        # the tokens from _run_tok[j] on, one each, up to the next run's rank (the last: _m)
        self._run_tok, self._run_rank = array("I"), array("I")
        self._merge_strs: Strings | None = None  # merges by rank, served from tables
        self._kb: int | None = None  # longest BPE token, bytes
        self._pins_checked = False
        self._comp: tuple | None = None
        self._added_at: tuple | None = None  # (all, non-special) _Literals, special texts
        self._pairs: dict[int, tuple[str, str]] = {}  # merge rank -> (a, b), decoded so far
        self._cost = 0.0  # of this path so far (see _MAX_FAST_COST)
        self.reset()

    @classmethod
    def from_tables(cls, spec: PreTokenizerSpec, raw: Strings, tb: bytes, vocab: Any, k: int,
                    added: list[tuple[int, str, bool]], merges: Strings, m: int, kb: int,
                    runs: tuple[array, array]) -> PromptScopedBPE:
        s = cls(spec, raw, tb, vocab, k, added, None)
        s.checked, s._m, s._merge_strs, s._kb = True, m, merges, kb
        s._run_tok, s._run_rank = runs
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
        The merge check covers every merge, in bulk (~15 ms for Qwen3's 151k), and finds the
        runs (see the module's docstring)."""
        if self._raw is None:
            raise NotScoped("no token bytes")
        k, vocab = self._k, self._vocab
        if k < 0:
            raise NotScoped("UNKNOWN or BYTE tokens in the BPE vocabulary")
        if len(vocab) != k:
            raise NotScoped("duplicate token texts in the BPE vocabulary")
        texts = [text for _, text, _ in self._added]
        if (len(set(texts)) != len(texts) or "" in texts
                or any(t.encode("utf-8") in vocab for t in texts)
                or any(len(t) == 1 and _may_be_in_a_word(t) for t in texts)):
            # duplicates / vocab-equal added tokens: HF's id rules get subtle. A one-character
            # one is fine when no word can hold it: DeepSeek-LLM adds the byte-level
            # characters of the bytes valid UTF-8 never holds ('ø' for 0xF8, ...), which its
            # BPE lacks; the split on added tokens takes them out of the text before BPE, in
            # the full tokenizer as in the mini one.
            raise NotScoped("unusual added tokens")
        src = self._merges_src
        if not src:
            chunks = ()
        elif hasattr(src, "raw_chunks"):
            chunks = src.raw_chunks()  # block by block: nothing big is allocated or kept
        else:
            chunks = (raw_strings(src),)
        raw, tb, blocks, starts, m = self._raw, self._tb, [], [], 0
        run_tok, run_rank = array("I"), array("I")
        nxt = -1  # the token the next merge makes if it continues the last run (-1: none yet)
        for chunk in chunks:
            c = len(chunk)
            if not c:
                continue
            joined = b"\0".join(chunk)
            # every merge has exactly one space and no NUL (so joined splits back exactly) ...
            if joined.translate(None, _DEL_ALL_BUT_SP_NUL) != b" \0" * (c - 1) + b" ":
                raise NotScoped(f"a merge in {m}..{m + c - 1} is not 'a b' with exactly one space")
            made = joined.replace(b" ", b"")  # what each merge makes, NUL-separated
            t0 = nxt if nxt >= 0 else vocab.get(made.partition(b"\0")[0], -1)
            # ... and the block continues a run: merge m+i makes NORMAL token t0+i (one bytes
            # comparison; tokens rise with the ranks, so no other merge makes these) ...
            if (t0 >= 0 and made == b"\0".join(raw[t0:t0 + c])
                    and tb.count(TT_NORMAL, t0, t0 + c) == c):
                if t0 != nxt:
                    run_tok.append(t0)
                    run_rank.append(m)
                nxt = t0 + c
            else:  # ... or its merges make BPE tokens in increasing id order, in new runs
                nxt = self._runs_of_block(made, m, nxt, run_tok, run_rank)
            blocks.append(joined)
            starts.append(m)
            m += c
        self._mblocks, self._mstarts, self._m = blocks, starts, m
        self._run_tok, self._run_rank = run_tok, run_rank
        self.checked = True

    def _runs_of_block(self, made: bytes, m: int, nxt: int, run_tok: array,
                       run_rank: array) -> int:
        """Append the runs of the merges from rank ``m`` that make ``made`` (their results,
        NUL-separated) to run_tok/run_rank; ``nxt`` continues the last run. Returns the token
        after the last one they make. NotScoped unless each is a BPE token, in increasing id
        order from the last run's."""
        ids = list(map(self._vocab.get, made.split(b"\0")))
        if None in ids:
            raise NotScoped(f"merge {m + ids.index(None)} does not make a token of the BPE "
                            "vocabulary")
        if ids[0] < nxt or not all(map(lt, ids, islice(ids, 1, None))):
            i = next(i for i in range(len(ids)) if ids[i] < (ids[i - 1] + 1 if i else nxt))
            raise NotScoped(f"merge {m + i} makes token {ids[i]}, not one after the previous "
                            "merge's: the fast path needs token ids in merge order (e.g. merge "
                            "i -> token 256+i)")
        # ids rise by at least 1 per merge, so ids[i] - i never falls: a run is where it stays
        # the same, found by bisection (a few steps per run, none per merge)
        c, i = len(ids), 0
        while i < c:
            j = bisect_right(range(c), ids[i] - i, lo=i, key=lambda x: ids[x] - x)
            if ids[i] != nxt:
                run_tok.append(ids[i])
                run_rank.append(m + i)
            nxt = ids[i] + (j - i)
            i = j
        return nxt

    def _rank(self, t: int) -> int | None:
        """The rank of the merge that makes token ``t`` (None: no merge makes it)."""
        tok, rank = self._run_tok, self._run_rank
        j = bisect_right(tok, t) - 1
        if j < 0:
            return None
        r = rank[j] + (t - tok[j])
        end = rank[j + 1] if j + 1 < len(rank) else self._m
        return r if r < min(end, self._m) else None  # (bounded whatever tables served them)

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
                             tokens_at=tokens_at, merges=merges, merges_at=merges_at,
                             runs=(self._run_tok, self._run_rank))

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
                bound = self._kb = max(map(len, self._vocab), default=0)  # (a dict here)
            est = sum(_n_checks(len(w), bound or len(w)) for w in new)
            if est > _MAX_CHECKS:
                raise NotScoped(f"a text needs {est} substring look-ups (> {_MAX_CHECKS})")
            self._charge(est * _COST_CHECK)
            fresh = self._collect(new, bound) - self._sub_ids
            if fresh:
                raw, rank, sub, ranks = self._raw, self._rank, self._sub, self._ranks
                for t in fresh:
                    try:
                        sub[raw[t].decode("utf-8")] = t
                    except UnicodeDecodeError:
                        raise NotScoped(f"token {t} is not valid UTF-8") from None
                    r = rank(t)
                    if r is not None:
                        ranks.add(r)
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
        if self._added_at is None:
            texts = {text: ctl for _, text, ctl in self._added if text}
            mk = lambda ts: _Literals(ts) if ts else None  # noqa: E731
            self._added_at = (mk(list(texts)), mk([t for t in texts if not texts[t]]),
                              {t for t in texts if texts[t]})
        lit = self._added_at[which]
        if lit is None or not text:
            return [text]
        skip = self._added_at[2] if (which == 0 and not parse_special) else ()
        segs, pos = [], 0
        for start, end in lit.matches(text):
            if skip and text[start:end] in skip:
                continue
            if start > pos:
                segs.append(text[pos:start])
            pos = end
        if pos < len(text):
            segs.append(text[pos:])
        return segs


class _Literals:
    """The non-overlapping leftmost-longest matches of a set of non-empty strings in a text,
    as ``re.finditer`` of their alternation (longest first) gives them, without compiling that
    alternation: for DeepSeek-LLM's 2,400 added tokens (2,387 "[PAD...]" fillers) the compile
    alone took 70-100 ms of the first encode. A small character class finds where a match can
    start; there each length a text starting with that character has is tried, longest first,
    as one slice and one set look-up."""

    def __init__(self, texts):
        self._texts = frozenset(texts)
        lens: dict[str, set[int]] = {}
        for t in self._texts:
            lens.setdefault(t[0], set()).add(len(t))
        self._lens = {c: sorted(ls, reverse=True) for c, ls in lens.items()}
        self._first = re.compile("[" + "".join(map(re.escape, sorted(lens))) + "]")

    def matches(self, text: str):
        """(start, end) of each match, left to right."""
        search, lens, texts, pos, end = self._first.search, self._lens, self._texts, 0, len(text)
        while (mt := search(text, pos)) is not None:
            i = pos = mt.start()
            for n in lens[text[i]]:
                if i + n <= end and text[i:i + n] in texts:  # (a cut slice may be another text)
                    yield i, i + n
                    pos = i + n
                    break
            else:
                pos = i + 1
