"""The tokenizer, built from GGUF metadata with the ``tokenizers`` package (no numpy: cold path).

GGUF stores a byte-level BPE tokenizer as ``tokenizer.ggml.{tokens,token_type,merges}`` plus a
pre-tokenizer *name* (``tokenizer.ggml.pre``). We rebuild the Hugging Face pipeline from those
(see ../shared/notes/tokenizer-cold-start.md, path (ii); ~240 ms for Qwen3's 152k/151k):

* vocab = the NORMAL tokens (UNUSED "[PAD…]" fillers are left out: HF knows no such ids);
* merges = the "a b" strings split into pairs; ``models.BPE`` with HF's byte-level options;
* normalizer NFC where the HF tokenizer declares it (Qwen2/3/3.5; the GGUF cannot say so);
* pre-tokenizer = ``Split(regex, isolated)`` per regex of the ``pre`` type, then ``ByteLevel``;
* added tokens = CONTROL (special) and USER_DEFINED tokens, in one call, in id order.

Building that full BPE holds the GIL for ~200 ms (``BPE()`` alone ~100-190 ms in one call), so
it is not on the cold path. ``from_gguf`` only splits the token strings (undecoded bytes) and
builds the bytes -> id dict (~30 ms); the first ``encode`` checks the merges in bulk (~15-20 ms,
once) and, like every later one (or ``prepare`` for several texts), builds a *prompt-scoped* BPE
(notes, path (v); ~0.3-1 ms) and encodes with it:
BPE on a pre-tokenized word only ever applies merges whose result is a substring of that word,
and only the relative order of merge ranks matters. So a tiny ``models.BPE`` holding the vocab
tokens that are substrings of the text's words, plus the merges producing them in rank order,
gives exactly the full tokenizer's ids. Its words come from the same pipeline: split on the
added tokens (leftmost-longest, as HF), normalize and pre-tokenize each piece with the same
``tokenizers`` objects. Which merge produces a token: in convert_hf_to_gguf's layout merge i
produces token 256+i; that is checked on the whole file, in bulk, before the fast path is used.
Anything else (the check fails, an odd vocabulary layout, pathological texts with > 2e5 substring
look-ups, ``REFLEX_TOKENIZER=full``) builds the full tokenizer once, lazily, and uses it from then
on. ``last_path`` says which one encoded the last text, ``fast_reason`` why the fast path is off.
No step holds the GIL for more than a few ms at a time (bulk work goes in chunks).

Encoding follows llama.cpp's flags: ``parse_special=False`` leaves CONTROL tokens as text but still
matches USER_DEFINED ones (``<think>``). Decoding is pure Python over the byte-level table, so it is
exact per token (``token_bytes``), tolerates ids HF does not know, and never builds a BPE.
"""

from __future__ import annotations

import codecs
import gc
import os
import re
from dataclasses import dataclass
from bisect import bisect_right
from itertools import accumulate
from typing import Any, Iterable

from .errors import ModelError, ReflexError

__all__ = ["Tokenizer", "StreamDecoder", "PreTokenizerSpec", "PRETOKENIZERS"]

# llama.cpp token types (tokenizer.ggml.token_type)
TT_NORMAL, TT_UNKNOWN, TT_CONTROL, TT_USER_DEFINED, TT_UNUSED, TT_BYTE = 1, 2, 3, 4, 5, 6
_IN_BPE_VOCAB = frozenset((TT_NORMAL, TT_UNKNOWN, TT_BYTE))
_ADDED = frozenset((TT_CONTROL, TT_USER_DEFINED))


@dataclass(frozen=True)
class PreTokenizerSpec:
    """How to pre-tokenize for one ``tokenizer.ggml.pre`` value.

    regexes: applied in sequence; each splits every piece into its matches and the gaps between
    them (``Split(..., "isolated")``). Written with ``\\uXXXX`` / ``\\UXXXXXXXX`` escapes for
    non-ASCII characters (turned into literal characters for Oniguruma).
    normalizer: "NFC" or None. ignore_merges: BPE option (llama3-style vocabularies).
    add_bos_default: add_bos when ``tokenizer.ggml.add_bos_token`` is absent.
    """

    regexes: tuple[str, ...]
    normalizer: str | None = None
    ignore_merges: bool = False
    add_bos_default: bool = False


_QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
             r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN35_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
              r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_DEEPSEEK_V3_RES = (
    r"\p{N}{1,3}",
    r"[\u4E00-\u9FA5\u3040-\u309F\u30A0-\u30FF]+",
    r"[!" + '"' + r"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)
_DEEPSEEK_LLM_RES = (
    r"[\r\n]",
    r"\s?[A-Za-z\u00B5\u00C0-\u00D6\u00D8-\u00F6\u00F8-\u01BA\u01BC-\u01BF\u01C4-\u0293\u0295-\u02AF"
    r"\u0370-\u0373\u0376\u0377\u037B-\u037D\u037F\u0386\u0388-\u038A\u038C\u038E-\u03A1\u03A3-\u03F5"
    r"\u03F7-\u0481\u048A-\u052F\u0531-\u0556\u10A0-\u10C5\u13A0-\u13F5\u13F8-\u13FD\u1C90-\u1CBA"
    r"\u1CBD-\u1CBF\u1D00-\u1D2B\u1D6B-\u1D77\u1D79-\u1D9A\u1E00-\u1F15\u1F18-\u1F1D\u1F20-\u1F45"
    r"\u1F48-\u1F4D\u1F50-\u1F57\u1F59\u1F5B\u1F5D\u1F5F-\u1F7D\u1F80-\u1FB4\u1FB6-\u1FBC\u1FBE"
    r"\u1FC2-\u1FC4\u1FC6-\u1FCC\u1FD0-\u1FD3\u1FD6-\u1FDB\u1FE0-\u1FEC\u1FF2-\u1FF4\u1FF6-\u1FFC"
    r"\u2102\u2107\u210A-\u2113\u2115\u2119-\u211D\u2124\u2126\u2128\u212A-\u212D\u212F-\u2134\u2139"
    r"\u213C-\u213F\u2145-\u2149\u214E\u2183\u2184\u2C00-\u2C7B\u2C7E-\u2CE4\u2CEB-\u2CEE\u2CF2\u2CF3"
    r"\uA640-\uA66D\uA680-\uA69B\uA722-\uA76F\uA771-\uA787\uA78B-\uA78E\uAB70-\uABBF\uFB00-\uFB06"
    r"\uFB13-\uFB17\uFF21-\uFF3A\uFF41-\uFF5A\U00010400-\U0001044F\U000104B0-\U000104D3"
    r"\U000104D8-\U000104FB\U00010C80-\U00010CB2\U00010CC0-\U00010CF2\U000118A0-\U000118DF"
    r"\U0001E900-\U0001E943]+",
    r"\s?[!-/:-~\uFF01-\uFF0F\uFF1A-\uFF5E\u2018-\u201F\u3000-\u3002]+",
    r"\s+$",
    r"[\u4E00-\u9FA5\u0800-\u4E00\uAC00-\uD7FF]+",
    r"\p{N}+",
)

# Keyed by tokenizer.ggml.pre. An open table: a plugin may add entries for its own vocabularies.
PRETOKENIZERS: dict[str, PreTokenizerSpec] = {
    "qwen2": PreTokenizerSpec((_QWEN2_RE,), normalizer="NFC"),
    "deepseek-r1-qwen": PreTokenizerSpec((_QWEN2_RE,), normalizer="NFC"),
    "qwen35": PreTokenizerSpec((_QWEN35_RE,), normalizer="NFC"),
    "deepseek-v3": PreTokenizerSpec(_DEEPSEEK_V3_RES),
    "deepseek-llm": PreTokenizerSpec(_DEEPSEEK_LLM_RES),
}

SUPPORTED_MODELS = ("gpt2",)

# llama.cpp (llama-vocab.cpp): texts that make a token end-of-generation / the EOT / FIM tokens
_EOG_TEXTS = frozenset((
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
))
_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
              "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<\uff5cend\u2581of\u2581sentence\uff5c>",
              "<end_of_utterance>")

_FIM_PAD_TEXTS = ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")
_FIM_REP_TEXTS = ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")
_FIM_SEP_TEXTS = ("<|file_sep|>",)

_ESC = re.compile(r"\\u([0-9A-Fa-f]{4})|\\U([0-9A-Fa-f]{8})")


def _literal_escapes(pattern: str) -> str:
    """``\\uXXXX`` / ``\\UXXXXXXXX`` -> the character itself (Oniguruma has no ``\\U``)."""
    return _ESC.sub(lambda m: chr(int(m.group(1) or m.group(2), 16)), pattern)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table."""
    bs = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


_BYTE_OF_CHAR: dict[str, int] = {c: b for b, c in _bytes_to_unicode().items()}


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


def _md_list(md: dict, key: str) -> list | None:
    v = md.get(key)
    if v is None:
        return None
    return v.tolist() if hasattr(v, "tolist") else list(v)


def _opt_id(md: dict, key: str, n: int, default: int | None = None) -> int | None:
    v = md.get(key)
    if v is None:
        return default if default is not None and 0 <= default < n else None
    v = int(v)
    return v if 0 <= v < n else (default if default is not None and 0 <= default < n else None)


class StreamDecoder:
    """Incremental detokenizer: ``push(id)`` returns the newly completed text.

    Incomplete UTF-8 sequences at the end are held back until the next token completes them;
    ``flush()`` returns what is left (invalid bytes become U+FFFD, as ``decode`` does).
    """

    def __init__(self, tok: "Tokenizer", skip_special: bool = False):
        self._tok = tok
        self._skip = skip_special
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        if self._skip and self._tok.is_control(token_id):
            return ""
        return self._dec.decode(self._tok.token_bytes(token_id))

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)



# ------------------------------------------------------------------------------------------
# The prompt-scoped path

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
_DICT_CHUNK = 16384  # tokens per dict.update in _bpe_vocab
_DEL_ALL_BUT_SP_NUL = bytes(b for b in range(256) if b not in (0x20, 0x00))  # translate(None, _)


class _NotFast(Exception):
    """The prompt-scoped path cannot be used; the message says why."""


def _mode() -> str:
    """REFLEX_TOKENIZER=full builds the full tokenizer in from_gguf and always uses it."""
    return "full" if os.environ.get("REFLEX_TOKENIZER", "").strip().lower() == "full" else "auto"


def _raw_strings(v: Any) -> list[bytes]:
    """The exact bytes of a string array's elements (GGUFArray: split in bulk, not decoded)."""
    raw_list = getattr(v, "raw_list", None)
    if raw_list is not None:
        return raw_list()
    return [s.encode("utf-8") for s in v]


def _decode_all(raw: list[bytes]) -> list[str]:
    joined = b"\0".join(raw)
    if joined.count(b"\0") == len(raw) - 1:  # no NUL inside a string: one decode, one split
        return joined.decode("utf-8").split("\0")
    return [b.decode("utf-8") for b in raw]


def _check_unicode(texts) -> None:
    """A one-line error for text that is not valid Unicode (lone surrogates, e.g. from
    undecodable command-line bytes); neither tokenizer path can encode it."""
    for text in texts:
        if isinstance(text, str):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as e:
                raise ReflexError(f"the text is not valid Unicode (a lone surrogate at index {e.start}, "
                                  "e.g. from undecodable bytes); it cannot be tokenized") from None


def _utf8_error(src: Any, key: str):
    if hasattr(src, "tolist"):
        src.tolist()  # the GGUF reader raises GGUFError naming the string
    raise ModelError(f"{key} is not valid UTF-8")


def _n_checks(n_chars: int, bound: int) -> int:
    """Substring look-ups for a word of n_chars characters when tokens have at most `bound`
    bytes (so at most `bound` characters): an upper bound on what _collect does."""
    if n_chars <= bound:
        return n_chars * (n_chars + 1) // 2
    return bound * (n_chars - bound) + bound * (bound + 1) // 2


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

    def __init__(self, *, spec: PreTokenizerSpec, pre: str, tb: bytes, raw: list[bytes] | None,
                 strs: list[str] | None, vocab_b: dict[bytes, int] | None, k: int,
                 added: list[tuple[int, str, bool]], merges_src: Any, hf: Any,
                 bos_id: int | None, eos_id: int | None, eot_id: int | None, pad_id: int | None,
                 add_bos: bool, add_eos: bool, eog_ids: frozenset[int]):
        self._spec = spec
        self._tb = tb  # token types, one byte each
        self._raw = raw  # token bytes (fast mode) ...
        self._strs = strs  # ... or token strings (full mode)
        self._vocab_b = vocab_b  # BPE vocab, bytes -> id (fast mode)
        self._k = k  # the BPE vocab is ids 0..k-1 (-1: another layout)
        self._added = added  # (id, text, is CONTROL) in id order
        self._merges_src = merges_src
        self._tokens_src = None
        self._hf_full = hf
        self._bytes_cache: dict[int, bytes] = {}
        self.n_vocab = len(tb)
        self.pre = pre
        self.bos_id, self.eos_id, self.eot_id, self.pad_id = bos_id, eos_id, eot_id, pad_id
        self.add_bos, self.add_eos = add_bos, add_eos
        self.eog_ids = eog_ids
        self.last_path = None
        # prompt-scoped state
        self._fast: bool | None = None if hf is None else False  # None: not checked yet
        self.fast_reason = None if hf is None else "REFLEX_TOKENIZER=full"
        self._mblocks: list[bytes] = []  # merges, NUL-joined per chunk (after the bulk check)
        self._mstarts: list[int] = []  # rank of each chunk's first merge
        self._msplit: dict[int, list[bytes]] = {}  # chunks split so far
        self._m = 0
        self._merges_ok = False  # the bulk merge check passed
        self._pins_checked = False
        self._kb: int | None = None  # longest BPE token, bytes
        self._merge_strs: Any = None  # merges by rank, from the file's index (gguf_index.Strings)
        self._comp: tuple | None = None
        self._added_rx: tuple | None = None
        self._pairs: dict[int, tuple[str, str]] = {}  # merge rank -> (a, b), decoded so far
        self._cost = 0.0  # of the fast path so far (see _MAX_FAST_COST)
        self._reset_mini()

    def _reset_mini(self) -> None:
        """Forget the prompt-scoped BPE (the next encode builds a new one)."""
        self._cov: set[str] = set()  # words the mini BPE covers
        self._sub: dict[str, int] = {}  # its vocab (without the added tokens)
        self._sub_ids: set[int] = set()
        self._ranks: set[int] = set()  # its merges
        self._mini: Any = None

    # ---------------------------------------------------------------- construction

    @classmethod
    def from_gguf(cls, g: Any, use_index: bool = True) -> "Tokenizer":
        """Read a parsed GGUF (``reflex_core.gguf.GGUFFile``); cheap, builds no BPE unless
        ``REFLEX_TOKENIZER=full``. With the file's cached index (``g.index``, see
        reflex_core.gguf_index) the token bytes, the vocabulary table and the merge check come
        from it instead of a pass over the arrays. Raises ModelError (one line)."""
        md = g.metadata
        model = md.get("tokenizer.ggml.model")
        if model is None or model in ("none", "no_vocab"):
            raise ModelError("this model has no tokenizer (tokenizer.ggml.model is "
                             f"{'missing' if model is None else repr(model)}); pass token ids instead of text")
        if model not in SUPPORTED_MODELS:
            raise ModelError(f"tokenizer.ggml.model {model!r} is not supported "
                             f"(supported: {', '.join(SUPPORTED_MODELS)})")
        pre = md.get("tokenizer.ggml.pre")
        spec = PRETOKENIZERS.get(pre) if pre is not None else None
        if spec is None:
            known = ", ".join(sorted(PRETOKENIZERS))
            what = "is missing" if pre is None else f"{pre!r} is not supported"
            raise ModelError(f"tokenizer.ggml.pre {what} (known: {known})")

        src = md.get("tokenizer.ggml.tokens")
        if src is None or len(src) == 0:
            raise ModelError("tokenizer.ggml.tokens is missing or empty")
        n = len(src)
        tix = (g.index or {}).get("tok") if use_index and getattr(g, "index", None) else None
        if isinstance(tix, dict) and tix.get("fast") and _mode() != "full":
            tok = cls._from_index(g, md, spec, pre, src, tix)
            if tok is not None:
                return tok
        types = _md_list(md, "tokenizer.ggml.token_type")
        if types is None:
            types = [TT_NORMAL] * n
        elif len(types) != n:
            raise ModelError(f"tokenizer.ggml.token_type has {len(types)} entries for {n} tokens")
        try:
            tb = bytes(types)  # C speed; token types are small ints
        except (ValueError, TypeError):
            tb = bytes(t if isinstance(t, int) and 0 <= t < 256 else 0 for t in types)
        merges_src = md.get("tokenizer.ggml.merges")
        full = _mode() == "full"

        was_enabled = gc.isenabled()
        gc.disable()  # ~150-300k small objects: GC passes would cost tens of ms here
        try:
            hf = raw = strs = vocab_b = None
            k = -1
            if full:  # the plain full build (the pre-fast-path behaviour; for debugging)
                strs = _md_list(md, "tokenizer.ggml.tokens")
                added = [(m.start(), strs[m.start()], tb[m.start()] == TT_CONTROL)
                         for m in re.finditer(b"[\x03\x04]", tb)]
                hf, vocab = _build_hf(strs, types, tb, added, _md_list(md, "tokenizer.ggml.merges") or [],
                                      spec)
                lookup = vocab.get
            else:  # token bytes, decoded only when used
                raw = _raw_strings(src)
                try:
                    added = [(m.start(), raw[m.start()].decode("utf-8"), tb[m.start()] == TT_CONTROL)
                             for m in re.finditer(b"[\x03\x04]", tb)]
                except UnicodeDecodeError:
                    _utf8_error(src, "tokenizer.ggml.tokens")
                vocab_b, k = _bpe_vocab(raw, tb)
                lookup = None  # _assemble looks texts up in vocab_b
        finally:
            if was_enabled:
                gc.enable()

        return cls._assemble(md, spec, pre, src, tb, raw, strs, vocab_b, k, added, hf, lookup, n)

    @classmethod
    def _assemble(cls, md: dict, spec: PreTokenizerSpec, pre: str, src: Any, tb: bytes, raw: Any,
                  strs: Any, vocab_b: Any, k: int, added: list, hf: Any, lookup: Any,
                  n: int) -> "Tokenizer":
        """The special ids and end-of-generation set (as llama.cpp reads them), then the
        Tokenizer. ``lookup``: text -> BPE id (None: through the bytes table ``vocab_b``)."""
        if lookup is None:
            lookup = lambda text: vocab_b.get(text.encode("utf-8"))  # noqa: E731
        # special ids, as llama.cpp reads them (BPE defaults: bos = eos = 11)
        bos = _opt_id(md, "tokenizer.ggml.bos_token_id", n, 11)
        eos = _opt_id(md, "tokenizer.ggml.eos_token_id", n, 11)
        pad = _opt_id(md, "tokenizer.ggml.padding_token_id", n)
        eot = _opt_id(md, "tokenizer.ggml.eot_token_id", n)
        eom = _opt_id(md, "tokenizer.ggml.eom_token_id", n)
        # llama.cpp also finds EOT / FIM tokens by their text and makes them end-of-generation
        special_texts: dict[str, int] = {}
        for i, text, _ in added:
            special_texts.setdefault(text, i)

        def by_text(texts) -> int | None:
            for text in texts:
                i = special_texts.get(text)
                if i is None:
                    i = lookup(text)
                if i is not None:
                    return i
            return None

        if eot is None:
            eot = by_text(_EOT_TEXTS)
        eog = {i for i in map(by_text, ((t,) for t in _EOG_TEXTS)) if i is not None}
        for key, texts in (("fim_pad", _FIM_PAD_TEXTS), ("fim_rep", _FIM_REP_TEXTS), ("fim_sep", _FIM_SEP_TEXTS)):
            i = _opt_id(md, f"tokenizer.ggml.{key}_token_id", n)
            if i is None:
                i = by_text(texts)
            if i is not None:
                eog.add(i)
        eog.update(i for i in (eos, eot, eom) if i is not None)
        add_bos = bool(md.get("tokenizer.ggml.add_bos_token", spec.add_bos_default))
        add_eos = bool(md.get("tokenizer.ggml.add_eos_token", False))
        tok = cls(spec=spec, pre=pre, tb=tb, raw=raw, strs=strs, vocab_b=vocab_b, k=k, added=added,
                  merges_src=md.get("tokenizer.ggml.merges"), hf=hf, bos_id=bos, eos_id=eos, eot_id=eot, pad_id=pad,
                  add_bos=add_bos, add_eos=add_eos, eog_ids=frozenset(eog))
        tok._tokens_src = src
        return tok

    @classmethod
    def _from_index(cls, g: Any, md: dict, spec: PreTokenizerSpec, pre: str, src: Any,
                    tix: dict) -> "Tokenizer | None":
        """The prompt-scoped tokenizer over the index's tables (None: they do not fit)."""
        from .gguf_index import Strings, VocabTable

        try:
            n = len(src)
            tb, k, added = tix["tb"], tix["k"], [tuple(a) for a in tix["added"]]
            raw = Strings(g.mm, tix["tokens"])
            mraw = Strings(g.mm, tix["merges"])
            if len(tb) != n or len(raw) != n or not 0 <= k <= n or len(mraw) < tix["m"]:
                return None
            vocab_b = VocabTable(tix["table"], tix["mask"], raw, k)
        except (KeyError, TypeError, ValueError):
            return None
        tok = cls._assemble(md, spec, pre, src, tb, raw, None, vocab_b, k, added, None, None, n)
        tok._fast, tok._merges_ok, tok._m = True, True, tix["m"]
        tok._merge_strs, tok._kb = mraw, tix["kb"]
        return tok

    # ---------------------------------------------------------------- encode / decode

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of ``text``. add_special: prepend BOS iff add_bos (append EOS iff add_eos).
        parse_special=False: CONTROL tokens in the text are encoded as plain text (USER_DEFINED
        ones such as ``<think>`` are still matched, like llama.cpp)."""
        try:
            hf = self._encoder((text,), parse_special)
            if parse_special:
                ids = hf.encode(text, add_special_tokens=False).ids
            else:
                hf.encode_special_tokens = True
                try:
                    ids = hf.encode(text, add_special_tokens=False).ids
                finally:
                    hf.encode_special_tokens = False
        except (UnicodeEncodeError, TypeError):
            _check_unicode((text,))
            raise
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
        try:
            self._encoder(texts, parse_special)
        except (UnicodeEncodeError, TypeError):
            _check_unicode(texts)
            raise
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
        elif tt in _ADDED:
            b = self._raw[token_id] if self._raw is not None else self._strs[token_id].encode("utf-8")
        else:
            text = self.token_text(token_id)
            m = _BYTE_OF_CHAR
            try:
                b = bytes([m[c] for c in text])
            except KeyError:  # a character outside the byte-level table: keep its UTF-8
                b = b"".join(bytes([m[c]]) if c in m else c.encode("utf-8") for c in text)
        self._bytes_cache[token_id] = b
        return b

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Text of ``ids`` (invalid UTF-8 -> U+FFFD). skip_special drops CONTROL tokens."""
        tb = self.token_bytes
        if skip_special:
            data = b"".join(tb(i) for i in ids if not self.is_control(i))
        else:
            data = b"".join(tb(i) for i in ids)
        return data.decode("utf-8", errors="replace")

    def streamer(self, skip_special: bool = False) -> StreamDecoder:
        return StreamDecoder(self, skip_special)

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
        if self._hf_full is None and self._fast is not False:
            was_enabled = gc.isenabled()
            gc.disable()
            try:
                hf = self._mini_for(texts, parse_special)
            except _NotFast as e:
                self._fast_off(str(e))
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
                    tokens = self._strs if self._strs is not None else _decode_all(self._raw)
                except UnicodeDecodeError:
                    _utf8_error(self._tokens_src, "tokenizer.ggml.tokens")
                src = self._merges_src
                try:
                    if self._merges_ok and self._m and self._mblocks:  # checked: one space, no NUL
                        merges = b"\0".join(self._mblocks).decode("utf-8").split("\0")
                    else:
                        merges = (src.tolist() if hasattr(src, "tolist") else list(src)) if src else []
                except UnicodeDecodeError:
                    _utf8_error(src, "tokenizer.ggml.merges")
                self._hf_full, _ = _build_hf(tokens, self._tb, self._tb, self._added, merges, self._spec)
            finally:
                if was_enabled:
                    gc.enable()
            self._fast_off("the full tokenizer is built", keep_reason=True)
            self._mblocks, self._mstarts, self._msplit = [], [], {}
            self._merge_strs = None
        return self._hf_full

    def _fast_off(self, reason: str, keep_reason: bool = False) -> None:
        self._fast = False
        if not (keep_reason and self.fast_reason):
            self.fast_reason = reason
        self._reset_mini()

    def _check_fast(self) -> None:
        """Whether a prompt-scoped BPE is exact for this vocabulary; raises _NotFast if not.
        The merge check covers every merge, in bulk (~15 ms for Qwen3's 151k)."""
        if self._raw is None:
            raise _NotFast("no token bytes")
        if self._spec.ignore_merges:
            raise _NotFast("ignore_merges vocabularies use the full tokenizer")
        k, vocab = self._k, self._vocab_b
        if k < 0:
            raise _NotFast("the BPE vocabulary is not ids 0..k-1")
        if len(vocab) != k:
            raise _NotFast("duplicate token texts in the BPE vocabulary")
        texts = [text for _, text, _ in self._added]
        if (len(set(texts)) != len(texts) or any(len(t) < 2 for t in texts)
                or any(t.encode("utf-8") in vocab for t in texts)):
            # duplicates / one-character / vocab-equal added tokens: HF's id rules get subtle
            raise _NotFast("unusual added tokens")
        src = self._merges_src
        if not src:
            chunks = ()
        elif hasattr(src, "raw_chunks"):
            chunks = src.raw_chunks()  # block by block: nothing big is allocated or kept
        else:
            chunks = (_raw_strings(src),)
        raw, blocks, starts, m = self._raw, [], [], 0
        for chunk in chunks:
            c = len(chunk)
            if not c:
                continue
            if 256 + m + c > k:
                raise _NotFast(f"more merges than tokens after the first 256 ({k})")
            joined = b"\0".join(chunk)
            # every merge has exactly one space and no NUL (so joined splits back exactly) ...
            if joined.translate(None, _DEL_ALL_BUT_SP_NUL) != b" \0" * (c - 1) + b" ":
                raise _NotFast(f"a merge in {m}..{m + c - 1} is not 'a b' with exactly one space")
            # ... and merge i without its space is token 256+i (so no other merge makes it)
            if joined.replace(b" ", b"") != b"\0".join(raw[256 + m:256 + m + c]):
                raise _NotFast(f"a merge in {m}..{m + c - 1} does not produce token 256+i")
            blocks.append(joined)
            starts.append(m)
            m += c
        self._mblocks, self._mstarts, self._m = blocks, starts, m
        self._fast = self._merges_ok = True

    def _mini_for(self, texts, parse_special: bool):
        if self._fast is None:
            self._check_fast()
        words: set[str] = set()
        for text in texts:
            self._words(text, parse_special, words)
        new = words - self._cov
        if new and len(self._sub_ids) > _UNION_MAX:  # start a fresh mini BPE for these texts
            self._reset_mini()
            new = words
        if new:
            bound = self._kb
            if bound is None and any(len(w) > _SHORT_WORD for w in new):
                bound = self._kb = max(map(len, self._raw[:self._k]))
            est = sum(_n_checks(len(w), bound or len(w)) for w in new)
            if est > _MAX_CHECKS:
                raise _NotFast(f"a text needs {est} substring look-ups (> {_MAX_CHECKS})")
            self._charge(est * _COST_CHECK)
            fresh = self._collect(new, bound) - self._sub_ids
            if fresh:
                raw, m, sub, ranks = self._raw, self._m, self._sub, self._ranks
                for t in fresh:
                    try:
                        sub[raw[t].decode("utf-8")] = t
                    except UnicodeDecodeError:
                        raise _NotFast(f"token {t} is not valid UTF-8") from None
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
        get = self._vocab_b.get
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
                        raise _NotFast(f"merge {r} has an empty side")
                    p = pairs[r] = (a, b)
                merges.append(p)
            self._charge(_COST_BUILD + _COST_ENTRY * (len(vocab) + len(merges)))
            *pipeline, added = self._components()
            hf = _with_pipeline(HFTokenizer(_bpe_model(vocab, merges, self._spec)), pipeline)
            if added:
                hf.add_tokens(added)
                if not self._pins_checked:  # first build: verify the pinned ids once
                    for i, text, _ in self._added:
                        if hf.token_to_id(text) != i:
                            raise _NotFast(f"added token {text!r} did not keep id {i}")
                    self._pins_checked = True
            return hf
        except _NotFast:
            raise
        except Exception as e:  # the full build reports an inconsistent file properly
            raise _NotFast(f"the prompt-scoped BPE failed: {e}") from None

    def _charge(self, cost: float) -> None:
        self._cost += cost
        if self._cost > _MAX_FAST_COST:
            raise _NotFast("the fast path has cost about one full build so far")

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

            normalizer, pre_tokenizer, post, dec = _pipeline(self._spec)
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


def _bpe_vocab(raw: list[bytes], tb: bytes) -> tuple[dict[bytes, int], int]:
    """The BPE vocab (NORMAL/UNKNOWN/BYTE tokens) as bytes -> id, and k when it is ids 0..k-1
    (else -1). A repeated text keeps its last id, as in _build_hf."""
    n_in = tb.count(TT_NORMAL) + tb.count(TT_UNKNOWN) + tb.count(TT_BYTE)
    if tb[:n_in].count(TT_NORMAL) == n_in:
        vocab: dict[bytes, int] = {}
        for i in range(0, n_in, _DICT_CHUNK):  # in C-speed chunks, so that another thread
            j = min(i + _DICT_CHUNK, n_in)  # waiting for the GIL gets it within ~1 ms
            vocab.update(zip(raw[i:j], range(i, j)))
        return vocab, n_in
    return {raw[i]: i for i in range(len(raw)) if tb[i] in _IN_BPE_VOCAB}, -1


def _bpe_model(vocab: dict[str, int], merges: list[tuple[str, str]], spec: PreTokenizerSpec):
    from tokenizers import models

    return models.BPE(vocab, merges, dropout=None, unk_token=None, continuing_subword_prefix="",
                      end_of_word_suffix="", fuse_unk=False, byte_fallback=False,
                      ignore_merges=spec.ignore_merges)


def _pipeline(spec: PreTokenizerSpec):
    """(normalizer or None, pre-tokenizer, post-processor, decoder) of a ``pre`` type."""
    from tokenizers import Regex, decoders, normalizers, pre_tokenizers, processors

    if spec.normalizer == "NFC":
        normalizer = normalizers.NFC()
    elif spec.normalizer is None:
        normalizer = None
    else:
        raise ModelError(f"unknown normalizer {spec.normalizer!r} in the pre-tokenizer table")
    pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(_literal_escapes(r)), "isolated", invert=False) for r in spec.regexes]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    return normalizer, pre_tokenizer, processors.ByteLevel(trim_offsets=False), decoders.ByteLevel()


def _with_pipeline(hf, pipeline):
    """``hf`` with the (normalizer or None, pre-tokenizer, post-processor, decoder) of
    :func:`_pipeline` installed."""
    normalizer, pre_tokenizer, post, dec = pipeline
    if normalizer is not None:
        hf.normalizer = normalizer
    hf.pre_tokenizer = pre_tokenizer
    hf.post_processor = post
    hf.decoder = dec
    return hf


def _build_hf(tokens: list[str], types, tb: bytes, added: list[tuple[int, str, bool]],
              merges: list[str], spec: PreTokenizerSpec):
    """The full tokenizer (notes path (ii)). Returns (hf, vocab str -> id)."""
    from tokenizers import AddedToken, Tokenizer as HFTokenizer

    n = len(tokens)
    # Fast path (Qwen layout): NORMAL tokens are ids 0..k-1, then the added tokens, then UNUSED.
    n_normal = tb.count(TT_NORMAL) + tb.count(TT_UNKNOWN) + tb.count(TT_BYTE)
    if tb[:n_normal].count(TT_NORMAL) == n_normal:
        k = n_normal
        vocab = dict(zip(tokens[:k], range(k)))
    else:
        vocab = {tokens[i]: i for i in range(n) if types[i] in _IN_BPE_VOCAB}
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
            bpe = _bpe_model(vocab, pairs if pairs is not None else _split_merges(merges), spec)
        except Exception:
            if pairs is None:
                raise
            bpe = _bpe_model(vocab, _split_merges(merges), spec)  # the fast split mis-paired
    except ModelError:
        raise
    except Exception as e:
        raise ModelError(f"the GGUF's BPE vocabulary/merges are inconsistent: {e}") from None

    hf = _with_pipeline(HFTokenizer(bpe), _pipeline(spec))
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
