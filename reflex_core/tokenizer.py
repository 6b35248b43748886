"""The tokenizer, built from GGUF metadata with the ``tokenizers`` package (no numpy: cold path).

GGUF stores a byte-level BPE tokenizer as ``tokenizer.ggml.{tokens,token_type,merges}`` plus a
pre-tokenizer *name* (``tokenizer.ggml.pre``). We rebuild the Hugging Face pipeline from those
(see ../shared/notes/tokenizer-cold-start.md, path (ii); ~240 ms for Qwen3's 152k/151k):

* vocab = the NORMAL tokens (UNUSED "[PAD…]" fillers are left out: HF knows no such ids);
* merges = the "a b" strings split into pairs; ``models.BPE`` with HF's byte-level options;
* normalizer NFC where the HF tokenizer declares it (Qwen2/3/3.5; the GGUF cannot say so);
* pre-tokenizer = ``Split(regex, isolated)`` per regex of the ``pre`` type, then ``ByteLevel``;
* added tokens = CONTROL (special) and USER_DEFINED tokens, in one call, in id order.

Encoding follows llama.cpp's flags: ``parse_special=False`` leaves CONTROL tokens as text but still
matches USER_DEFINED ones (``<think>``). Decoding is pure Python over the byte-level table, so it is
exact per token (``token_bytes``) and tolerates ids HF does not know.
"""

from __future__ import annotations

import codecs
import gc
import re
from dataclasses import dataclass
from typing import Any, Iterable

from .errors import ModelError

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


class Tokenizer:
    """A GGUF model's tokenizer. Build with ``Tokenizer.from_gguf(open_gguf(path))``."""

    n_vocab: int
    bos_id: int | None
    eos_id: int | None
    eot_id: int | None
    pad_id: int | None
    add_bos: bool
    add_eos: bool
    eog_ids: frozenset[int]
    pre: str

    def __init__(self, hf: Any, tokens: list[str], types: list[int], *, pre: str,
                 bos_id: int | None, eos_id: int | None, eot_id: int | None, pad_id: int | None,
                 add_bos: bool, add_eos: bool, eog_ids: frozenset[int]):
        self._hf = hf
        self._tokens = tokens
        self._types = types
        self._bytes_cache: dict[int, bytes] = {}
        self.n_vocab = len(tokens)
        self.pre = pre
        self.bos_id, self.eos_id, self.eot_id, self.pad_id = bos_id, eos_id, eot_id, pad_id
        self.add_bos, self.add_eos = add_bos, add_eos
        self.eog_ids = eog_ids

    # ---------------------------------------------------------------- construction

    @classmethod
    def from_gguf(cls, g: Any) -> "Tokenizer":
        """Build from a parsed GGUF (``reflex_core.gguf.GGUFFile``). Raises ModelError (one line)."""
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

        tokens = _md_list(md, "tokenizer.ggml.tokens")
        if not tokens:
            raise ModelError("tokenizer.ggml.tokens is missing or empty")
        n = len(tokens)
        types = _md_list(md, "tokenizer.ggml.token_type")
        if types is None:
            types = [TT_NORMAL] * n
        elif len(types) != n:
            raise ModelError(f"tokenizer.ggml.token_type has {len(types)} entries for {n} tokens")
        merges = _md_list(md, "tokenizer.ggml.merges") or []

        try:
            tb = bytes(types)  # C speed; token types are small ints
        except (ValueError, TypeError):
            tb = bytes(t if isinstance(t, int) and 0 <= t < 256 else 0 for t in types)
        # (id, text, is CONTROL) of the added tokens, found at C speed
        added = [(m.start(), tokens[m.start()], tb[m.start()] == TT_CONTROL)
                 for m in re.finditer(b"[\x03\x04]", tb)]

        was_enabled = gc.isenabled()
        gc.disable()  # ~300k small objects: GC passes would cost 50-100 ms here
        try:
            hf, vocab = _build_hf(tokens, types, tb, added, merges, spec)
        finally:
            if was_enabled:
                gc.enable()

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
                i = special_texts.get(text, vocab.get(text))
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
        return cls(hf, tokens, types, pre=pre, bos_id=bos, eos_id=eos, eot_id=eot, pad_id=pad,
                   add_bos=add_bos, add_eos=add_eos, eog_ids=frozenset(eog))

    # ---------------------------------------------------------------- encode / decode

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of ``text``. add_special: prepend BOS iff add_bos (append EOS iff add_eos).
        parse_special=False: CONTROL tokens in the text are encoded as plain text (USER_DEFINED
        ones such as ``<think>`` are still matched, like llama.cpp)."""
        hf = self._hf
        if parse_special:
            ids = hf.encode(text, add_special_tokens=False).ids
        else:
            hf.encode_special_tokens = True
            try:
                ids = hf.encode(text, add_special_tokens=False).ids
            finally:
                hf.encode_special_tokens = False
        if add_special:
            if self.add_bos and self.bos_id is not None:
                ids = [self.bos_id] + ids
            if self.add_eos and self.eos_id is not None:
                ids.append(self.eos_id)
        return ids

    def is_control(self, token_id: int) -> bool:
        return 0 <= token_id < self.n_vocab and self._types[token_id] == TT_CONTROL

    def token_bytes(self, token_id: int) -> bytes:
        """The exact bytes of one token; b"" for UNUSED ([PAD…]) and out-of-range ids."""
        b = self._bytes_cache.get(token_id)
        if b is not None:
            return b
        if not (0 <= token_id < self.n_vocab):
            return b""
        tt = self._types[token_id]
        text = self._tokens[token_id]
        if tt == TT_UNUSED:
            b = b""
        elif tt in _ADDED:
            b = text.encode("utf-8")
        else:
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
        return self._tokens[token_id] if 0 <= token_id < self.n_vocab else None

    def __repr__(self) -> str:
        return (f"Tokenizer(pre={self.pre!r}, n_vocab={self.n_vocab}, bos={self.bos_id}, "
                f"eos={self.eos_id}, add_bos={self.add_bos})")


def _build_hf(tokens: list[str], types: list[int], tb: bytes, added: list[tuple[int, str, bool]],
              merges: list[str], spec: PreTokenizerSpec):
    from tokenizers import AddedToken, Regex, Tokenizer as HFTokenizer
    from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

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

    def make_bpe(pairs):
        return models.BPE(vocab, pairs, dropout=None, unk_token=None, continuing_subword_prefix="",
                          end_of_word_suffix="", fuse_unk=False, byte_fallback=False,
                          ignore_merges=spec.ignore_merges)

    try:
        try:
            bpe = make_bpe(pairs if pairs is not None else _split_merges(merges))
        except Exception:
            if pairs is None:
                raise
            bpe = make_bpe(_split_merges(merges))  # the fast split mis-paired: do it exactly
    except ModelError:
        raise
    except Exception as e:
        raise ModelError(f"the GGUF's BPE vocabulary/merges are inconsistent: {e}") from None

    hf = HFTokenizer(bpe)
    if spec.normalizer == "NFC":
        hf.normalizer = normalizers.NFC()
    elif spec.normalizer is not None:
        raise ModelError(f"unknown normalizer {spec.normalizer!r} in the pre-tokenizer table")
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(_literal_escapes(r)), "isolated", invert=False) for r in spec.regexes]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    hf.post_processor = processors.ByteLevel(trim_offsets=False)
    hf.decoder = decoders.ByteLevel()
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
