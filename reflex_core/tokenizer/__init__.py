"""The tokenizer, built from GGUF metadata with the ``tokenizers`` package (no numpy: cold path).

GGUF stores a byte-level BPE tokenizer as ``tokenizer.ggml.{tokens,token_type,merges}`` plus a
pre-tokenizer *name* (``tokenizer.ggml.pre``); see ../shared/notes/tokenizer-cold-start.md.
Building the full Hugging Face BPE from those (``bpe_full``) holds the GIL for ~200 ms, so it is
not on the cold path. ``from_gguf`` only splits the token strings (undecoded bytes) and builds
the bytes -> id dict (~30 ms); ``encode`` (or ``prepare`` for several texts) builds a
*prompt-scoped* BPE for the texts at hand (``prompt_scoped``; ~0.3-1 ms) that gives exactly the
full tokenizer's ids, and falls back to the full build, once, for anything it cannot serve.
``last_path`` says which one encoded the last text, ``fast_reason`` why the fast path is off.

``tables()`` exports what the prompt-scoped path needs as plain data and ``from_tables`` serves
a tokenizer from it over the same file, without a pass over the vocabulary: the tokenizer's
only contract with a cache of them (reflex_core.gguf_index keeps them per file).

Encoding follows llama.cpp's flags: ``parse_special=False`` leaves CONTROL tokens as text but still
matches USER_DEFINED ones (``<think>``). Decoding is pure Python over the byte-level table, so it is
exact per token (``token_bytes``), tolerates ids HF does not know, and never builds a BPE.

Modules: ``pretokenizers`` (the ``pre`` table and the HF pipeline), ``vocab`` (what llama.cpp
reads from the metadata), ``bpe_full``, ``prompt_scoped``, ``tables``; ``tokenizers`` is imported
only when a BPE is built.
"""

from __future__ import annotations

import codecs
import gc
import os
import re
from typing import Any, Callable, Iterable, Sequence

from ..errors import ModelError, ReflexError
from .bpe_full import build_full
from .pretokenizers import PRETOKENIZERS, PreTokenizerSpec
from .prompt_scoped import NotScoped, PromptScopedBPE
from .tables import import_tables, refusal
from .vocab import (ADDED_TYPES, BYTE_OF_CHAR, SUPPORTED_MODELS, TT_CONTROL, TT_NORMAL,
                    TT_UNUSED, SpecialTokens, bpe_vocab, check_unicode, declared_tokenizer,
                    decode_all, md_list, raw_strings, special_tokens, utf8_error)

__all__ = ["Tokenizer", "StreamDecoder", "PreTokenizerSpec", "PRETOKENIZERS", "SUPPORTED_MODELS"]


def _mode() -> str:
    """REFLEX_TOKENIZER=full builds the full tokenizer in from_gguf and always uses it."""
    return "full" if os.environ.get("REFLEX_TOKENIZER", "").strip().lower() == "full" else "auto"


def _added_tokens(tb: bytes, text_of) -> list[tuple[int, str, bool]]:
    """(id, text, is CONTROL) of the CONTROL and USER_DEFINED tokens, in id order."""
    return [(m.start(), text_of(m.start()), tb[m.start()] == TT_CONTROL)
            for m in re.finditer(b"[\x03\x04]", tb)]


def _string_starts(g: Any) -> tuple[int, int | None] | None:
    """Where the token and merge strings start in the file ``g`` maps (None: not a file)."""
    span = getattr(g, "array_span", None)
    if span is None:
        return None
    tokens, merges = span("tokenizer.ggml.tokens"), span("tokenizer.ggml.merges")
    return None if tokens is None else (tokens[0], merges[0] if merges else None)


def utf8_unfinished(data: bytes) -> bytes:
    """The bytes at the end of ``data`` that begin a UTF-8 character without finishing it (b""
    where the last character is whole, or its bytes are invalid anyway)."""
    d = codecs.getincrementaldecoder("utf-8")(errors="replace")
    d.decode(data[-3:])  # an unfinished character has at most 3 of its bytes
    return d.getstate()[0]


class StreamDecoder:
    """Incremental detokenizer: ``push(id)`` returns the newly completed text.

    Incomplete UTF-8 sequences at the end are held back until the next token completes them;
    ``flush()`` returns what is left (invalid bytes become U+FFFD, as ``decode`` does), or with
    ``final=False`` nothing, the unfinished character left out. ``lead``: the unfinished
    character the text before these tokens ended with (:func:`utf8_unfinished`), completed by
    their first bytes.
    """

    def __init__(self, tok: "Tokenizer", skip_special: bool = False, lead: bytes = b""):
        self._tok = tok
        self._skip = skip_special
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._dec.decode(lead)  # no text: an unfinished character only

    def push(self, token_id: int) -> str:
        if self._skip and self._tok.is_control(token_id):
            return ""
        return self._dec.decode(self._tok.token_bytes(token_id))

    def flush(self, final: bool = True) -> str:
        return self._dec.decode(b"", final=True) if final else ""


class Tokenizer:
    """A GGUF model's tokenizer. Build with ``Tokenizer.from_gguf(open_gguf(path))``.

    ``encode`` uses a prompt-scoped BPE when it can (``last_path == "fast"``), else the full
    tokenizer, built once on first need (``last_path == "full"``); both give the same ids.
    ``prepare(texts)`` builds one prompt-scoped BPE covering several texts (a prompt and its
    candidates) so that encoding each of them afterwards costs only the encode itself.
    """

    n_vocab: int
    bos_id: int | None
    eos_id: int | None
    eot_id: int | None
    pad_id: int | None
    add_bos: bool
    add_eos: bool
    eog_ids: frozenset[int]
    pre: str
    last_path: str | None  # "fast" or "full": which tokenizer encoded the last text
    fast_reason: str | None  # why the prompt-scoped path is off (None while it is usable)

    def __init__(self, *, spec: PreTokenizerSpec, pre: str, tb: bytes, raw: Any, strs: Any,
                 added: list[tuple[int, str, bool]], tokens_src: Any, merges_src: Any, hf: Any,
                 scoped: PromptScopedBPE | None, specials: SpecialTokens,
                 starts: tuple[int, int | None] | None):
        self._spec = spec
        self._tb = tb  # token types, one byte each
        self._raw = raw  # token bytes (list, or tables.Strings) ...
        self._strs = strs  # ... or token strings (REFLEX_TOKENIZER=full)
        self._added = added  # (id, text, is CONTROL) in id order
        self._tokens_src, self._merges_src = tokens_src, merges_src  # the metadata arrays
        self._hf_full = hf
        self._scoped = scoped  # None: the prompt-scoped path is off
        self._starts = starts  # where the token / merge strings start in the file (tables())
        self._bytes_cache: dict[int, bytes] = {}
        self.n_vocab = len(tb)
        self.pre = pre
        self.bos_id, self.eos_id = specials.bos_id, specials.eos_id
        self.eot_id, self.pad_id = specials.eot_id, specials.pad_id
        self.add_bos, self.add_eos = specials.add_bos, specials.add_eos
        self.eog_ids = specials.eog_ids
        self.last_path = None
        self.fast_reason = None if scoped is not None else "REFLEX_TOKENIZER=full"

    # ---------------------------------------------------------------- construction

    @classmethod
    def from_gguf(cls, g: Any) -> "Tokenizer":
        """Read a parsed GGUF (``reflex_core.gguf.GGUFFile``, or anything with its
        ``metadata``); cheap, builds no BPE unless ``REFLEX_TOKENIZER=full``. Raises
        ModelError (one line)."""
        md = g.metadata
        spec, pre, src = declared_tokenizer(md)
        n = len(src)
        types = md_list(md, "tokenizer.ggml.token_type")
        if types is None:
            types = [TT_NORMAL] * n
        elif len(types) != n:
            raise ModelError(f"tokenizer.ggml.token_type has {len(types)} entries for {n} tokens")
        try:
            tb = bytes(types)  # C speed; token types are small ints
        except (ValueError, TypeError):
            tb = bytes(t if isinstance(t, int) and 0 <= t < 256 else 0 for t in types)
        merges_src = md.get("tokenizer.ggml.merges")

        was_enabled = gc.isenabled()
        gc.disable()  # ~150-300k small objects: GC passes would cost tens of ms here
        try:
            hf = raw = strs = scoped = None
            if _mode() == "full":  # the plain full build (the pre-fast-path behaviour; for debugging)
                strs = md_list(md, "tokenizer.ggml.tokens")
                added = _added_tokens(tb, strs.__getitem__)
                hf, vocab = build_full(strs, types, tb, added, md_list(md, "tokenizer.ggml.merges") or [],
                                       spec)
                lookup = vocab.get
            else:  # token bytes, decoded only when used
                raw = raw_strings(src)
                try:
                    added = _added_tokens(tb, lambda i: raw[i].decode("utf-8"))
                except UnicodeDecodeError:
                    utf8_error(src, "tokenizer.ggml.tokens")
                vocab_b, k = bpe_vocab(raw, tb)
                lookup = lambda text: vocab_b.get(text.encode("utf-8"))  # noqa: E731
                scoped = PromptScopedBPE(spec, raw, tb, vocab_b, k, added, merges_src)
        finally:
            if was_enabled:
                gc.enable()
        return cls(spec=spec, pre=pre, tb=tb, raw=raw, strs=strs, added=added, tokens_src=src,
                   merges_src=merges_src, hf=hf, scoped=scoped,
                   specials=special_tokens(md, spec, added, lookup, n), starts=_string_starts(g))

    @classmethod
    def from_tables(cls, g: Any, tables: Any) -> "Tokenizer | None":
        """The tokenizer of the GGUFFile ``g`` served from ``tables`` (what ``tables()``
        exported for this same file): no pass over the vocabulary, the merge check already
        done. None when the tables refuse the prompt-scoped path, do not fit ``g``, or
        ``REFLEX_TOKENIZER=full``: then ``from_gguf`` builds it. ModelError as from_gguf."""
        md = g.metadata
        spec, pre, src = declared_tokenizer(md)
        if _mode() == "full":
            return None
        n = len(src)
        served = import_tables(g.mm, tables, n)
        if served is None:
            return None
        vocab = served.vocab
        scoped = PromptScopedBPE.from_tables(spec, served.tokens, served.tb, vocab, served.k,
                                             served.added, served.merges, served.m, served.kb,
                                             served.runs)
        specials = special_tokens(md, spec, served.added,
                                  lambda text: vocab.get(text.encode("utf-8")), n)
        return cls(spec=spec, pre=pre, tb=served.tb, raw=served.tokens, strs=None,
                   added=served.added, tokens_src=src, merges_src=md.get("tokenizer.ggml.merges"),
                   hf=None, scoped=scoped, specials=specials, starts=_string_starts(g))

    def tables(self) -> dict:
        """What the prompt-scoped path needs to serve this vocabulary, as plain data (ints,
        bytes, strings, tuples, lists: marshal-able), for ``from_tables`` over the same file:
        the token types and added tokens, where every token and merge string lies in the file,
        which merge makes which token, and a bytes -> id table. Checks the vocabulary first
        (~15 ms for Qwen3); for one the path cannot serve exactly, the dict only says why
        ({"fast": False, "reason": ...})."""
        if self._starts is None:
            return refusal("the tokenizer was not read from a GGUF file")
        s = self._scoped
        if s is None:  # off for this process (a text, REFLEX_TOKENIZER): judge the vocabulary
            raw = self._raw if self._raw is not None else raw_strings(self._tokens_src)
            vocab, k = bpe_vocab(raw, self._tb)
            s = PromptScopedBPE(self._spec, raw, self._tb, vocab, k, self._added,
                                self._merges_src)
        try:
            return s.export(self._tb, *self._starts)
        except NotScoped as e:
            if s is self._scoped:
                self._scoped_off(str(e))
            return refusal(str(e))

    # ---------------------------------------------------------------- encode / decode

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of ``text``. add_special: prepend BOS iff add_bos (append EOS iff add_eos).
        parse_special=False: CONTROL tokens in the text are encoded as plain text (USER_DEFINED
        ones such as ``<think>`` are still matched, like llama.cpp)."""
        def run() -> list[int]:
            hf = self._encoder((text,), parse_special)
            if parse_special:
                return hf.encode(text, add_special_tokens=False).ids
            hf.encode_special_tokens = True
            try:
                return hf.encode(text, add_special_tokens=False).ids
            finally:
                hf.encode_special_tokens = False

        ids = _guarded((text,), run)
        if add_special:
            if self.add_bos and self.bos_id is not None:
                ids = [self.bos_id] + ids
            if self.add_eos and self.eos_id is not None:
                ids.append(self.eos_id)
        return ids

    def prepare(self, texts: Iterable[str], parse_special: bool = True) -> str:
        """Build one prompt-scoped BPE covering all ``texts`` (e.g. a prompt and its
        candidates), so that encoding any of them next reuses it. Optional: ``encode`` extends
        the coverage by itself, at ~0.3 ms per new text. Returns "fast" or "full"."""
        texts = list(texts)
        _guarded(texts, lambda: self._encoder(texts, parse_special))
        return self.last_path

    @property
    def full_built(self) -> bool:
        """Whether the full tokenizer has been built (then every encode uses it)."""
        return self._hf_full is not None

    def is_control(self, token_id: int) -> bool:
        return 0 <= token_id < self.n_vocab and self._tb[token_id] == TT_CONTROL

    def token_bytes(self, token_id: int) -> bytes:
        """The exact bytes of one token; b"" for UNUSED ([PAD…]) and out-of-range ids."""
        b = self._bytes_cache.get(token_id)
        if b is not None:
            return b
        if not (0 <= token_id < self.n_vocab):
            return b""
        tt = self._tb[token_id]
        if tt == TT_UNUSED:
            b = b""
        elif tt in ADDED_TYPES:
            b = self._raw[token_id] if self._raw is not None else self._strs[token_id].encode("utf-8")
        else:
            text = self.token_text(token_id)
            m = BYTE_OF_CHAR
            try:
                b = bytes([m[c] for c in text])
            except KeyError:  # a character outside the byte-level table: keep its UTF-8
                b = b"".join(bytes([m[c]]) if c in m else c.encode("utf-8") for c in text)
        self._bytes_cache[token_id] = b
        return b

    def decode(self, ids: Iterable[int], skip_special: bool = False, lead: bytes = b"",
               final: bool = True) -> str:
        """Text of ``ids`` (invalid UTF-8 -> U+FFFD). skip_special drops CONTROL tokens.
        ``lead`` and ``final`` as :class:`StreamDecoder`'s: the text's unfinished start, and
        whether an unfinished character at its end is shown (U+FFFD) or left out."""
        tb = self.token_bytes
        if skip_special:
            data = b"".join(tb(i) for i in ids if not self.is_control(i))
        else:
            data = b"".join(tb(i) for i in ids)
        data = lead + data
        if not final:
            data = data[:len(data) - len(utf8_unfinished(data))]
        return data.decode("utf-8", errors="replace")

    def unfinished(self, ids: Sequence[int]) -> bytes:
        """The unfinished UTF-8 character that the text of ``ids`` ends with
        (:func:`utf8_unfinished`): a job continuing from them completes it."""
        return utf8_unfinished(b"".join(self.token_bytes(i) for i in ids[-4:]))

    def streamer(self, skip_special: bool = False, lead: bytes = b"") -> StreamDecoder:
        return StreamDecoder(self, skip_special, lead)

    def token_text(self, token_id: int) -> str | None:
        """The token's string as stored in the GGUF (byte-level encoded), or None."""
        if not (0 <= token_id < self.n_vocab):
            return None
        if self._raw is not None:  # (a corrupt file's invalid UTF-8 shows as U+FFFD)
            return self._raw[token_id].decode("utf-8", errors="replace")
        return self._strs[token_id]

    def __repr__(self) -> str:
        return (f"Tokenizer(pre={self.pre!r}, n_vocab={self.n_vocab}, bos={self.bos_id}, "
                f"eos={self.eos_id}, add_bos={self.add_bos})")

    # ---------------------------------------------------------------- which BPE encodes

    def _encoder(self, texts, parse_special: bool):
        """The HF tokenizer that encodes ``texts`` exactly: the prompt-scoped one when it
        can, else the full one. Sets last_path."""
        if self._hf_full is None and self._scoped is not None:
            was_enabled = gc.isenabled()
            gc.disable()
            try:
                hf = self._scoped.encoder(texts, parse_special)
            except NotScoped as e:
                self._scoped_off(str(e))
            else:
                self.last_path = "fast"
                return hf
            finally:
                if was_enabled:
                    gc.enable()
        self.last_path = "full"
        return self._full()

    @property
    def _hf(self):
        """The full ``tokenizers.Tokenizer`` (built on first use)."""
        return self._full()

    def _full(self):
        if self._hf_full is None:
            was_enabled = gc.isenabled()
            gc.disable()
            try:
                try:
                    tokens = self._strs if self._strs is not None else decode_all(self._raw)
                except UnicodeDecodeError:
                    utf8_error(self._tokens_src, "tokenizer.ggml.tokens")
                src = self._merges_src
                try:
                    merges = self._scoped.merge_texts() if self._scoped is not None else None
                    if merges is None:
                        merges = (src.tolist() if hasattr(src, "tolist") else list(src)) if src else []
                except UnicodeDecodeError:
                    utf8_error(src, "tokenizer.ggml.merges")
                self._hf_full, _ = build_full(tokens, self._tb, self._tb, self._added, merges, self._spec)
            finally:
                if was_enabled:
                    gc.enable()
            self._scoped_off("the full tokenizer is built", keep_reason=True)
        return self._hf_full

    def _scoped_off(self, reason: str, keep_reason: bool = False) -> None:
        self._scoped = None
        if not (keep_reason and self.fast_reason):
            self.fast_reason = reason


# Whitespace runs from this length on are refused before the regex engine sees them: Qwen's
# pre-tokenizer backtracks once a character of a run, and Oniguruma gives up (a panic, with a
# Rust message on stderr) at about ten million; llama.cpp's own regex takes them.
LONGEST_WHITESPACE_RUN = 1 << 22


def _check_runs(text: str) -> None:
    if len(text) < LONGEST_WHITESPACE_RUN:
        return
    for m in re.finditer(r"\s+", text):  # whole runs, no overlap: linear in the text
        if m.end() - m.start() >= LONGEST_WHITESPACE_RUN:
            raise ReflexError(f"the text holds a run of {m.end() - m.start()} whitespace "
                              f"characters at character {m.start()}; the tokenizer takes runs "
                              f"of fewer than {LONGEST_WHITESPACE_RUN}")


def _guarded(texts: Sequence[str], run: Callable[[], Any]) -> Any:
    """``run()``, an encoding of ``texts``, with what the encoder fails on as one line: a text
    that is not valid Unicode (check_unicode names it), a whitespace run past
    LONGEST_WHITESPACE_RUN (refused first), and any panic of ``tokenizers`` (a BaseException,
    with a Rust message on stderr, where its regex engine gives up)."""
    for text in texts:
        _check_runs(text)
    try:
        return run()
    except (UnicodeEncodeError, TypeError):
        check_unicode(texts)
        raise
    except BaseException as e:
        if type(e).__name__ != "PanicException":
            raise
        msg = (str(e).splitlines() or [""])[0][:200]
        raise ReflexError(f"the tokenizer cannot encode this text ({msg})") from None
