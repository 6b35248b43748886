"""The pre-tokenizer table (one ``PreTokenizerSpec`` per ``tokenizer.ggml.pre`` value) and the
Hugging Face objects a spec stands for: normalizer, pre-tokenizer, BPE model options,
post-processor, decoder. Both BPE builds (the full one and the prompt-scoped one) take their
pipeline from here, so they tokenize alike. ``tokenizers`` is imported only when a pipeline
is built.
"""

from __future__ import annotations

import functools
import operator
import re
from dataclasses import dataclass
from itertools import starmap

from ..errors import ModelError


@dataclass(frozen=True)
class PreTokenizerSpec:
    """How to pre-tokenize for one ``tokenizer.ggml.pre`` value.

    regexes: applied in sequence; each splits every piece into its matches and the gaps between
    them (``Split(..., "isolated")``). Written with ``\\uXXXX`` / ``\\UXXXXXXXX`` escapes for
    non-ASCII characters (turned into literal characters for Oniguruma); ``\\p{L}``, ``\\p{N}``,
    ``\\p{M}``, ``\\p{P}`` and ``\\p{S}`` are llama.cpp's categories (``unicode_classes``), not
    those of the regex engine's Unicode version.
    normalizer: "NFC" or None. ignore_merges: BPE option (llama3-style vocabularies).
    add_bos_default: add_bos when ``tokenizer.ggml.add_bos_token`` is absent.
    gpt2_bos: a file without ``tokenizer.ggml.bos_token_id`` has BOS = EOS = 11 (llama.cpp's BPE
    default); False: no BOS then (llama.cpp's GLM vocabularies).
    """

    regexes: tuple[str, ...]
    normalizer: str | None = None
    ignore_merges: bool = False
    add_bos_default: bool = False
    gpt2_bos: bool = True


_GPT2_RE = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
             r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# llama3's regex (llama.cpp matches it by hand): qwen2's with digits in runs of up to three
_LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
              r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# GPT-4o's regex as llama.cpp spells it (its letters-case classes as look-aheads: a letter that
# is not a-z, then letters that are not A-Z), matched by its generic regex path
_CONTRACTION = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
_GPT4O_RE = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+" + _CONTRACTION
             + r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*" + _CONTRACTION
             + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Mistral's tekken: GPT-4o's case runs without the contractions, digits one by one
_TEKKEN_RE = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
              r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
              r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Kimi-K2's regex as llama.cpp matches it by hand: Han runs (its ranges, assigned or not), then
# words of letters that are not Han (no case split, no marks) with an optional leading character
# and contraction, digits in threes, then qwen2's punctuation and whitespace rules
_HAN = r"\u3400-\u4DBF\u4E00-\u9FFF\uF900-\uFAFF\U00020000-\U0002A6DF\U0002A700-\U0002EBEF\U0002F800-\U0002FA1F"
_KIMI_K2_RE = (r"[" + _HAN + r"]+|[^\r\n\p{L}\p{N}]?(?:(?![" + _HAN + r"])\p{L})+"
               r"(?:'[sS]|'[tT]|'[mM]|'[dD]|'[rR][eE]|'[vV][eE]|'[lL][lL])?"
               r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN35_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
              r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_DEEPSEEK_V3_RES = (
    r"\p{N}{1,3}",
    r"[\u4E00-\u9FA5\u3040-\u309F\u30A0-\u30FF]+",
    r"[!" + '"' + r"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)
# Regexes 3 and 5 differ from the spec's text (llama-vocab.cpp's) in one way: llama.cpp runs the
# regexes without a \p{..} class through std::wregex with every non-ASCII whitespace character
# replaced by a vertical tab, so U+3000 and the other Unicode spaces match \s there and never a
# literal class. Here they are left out of those classes (U+3000 from regex 3's \u3000-\u3002,
# llama.cpp's whitespace set from regex 5's \u0800-\u4E00), which gives llama.cpp's pieces.
# deepseek-coder's regex 4 is deepseek-llm's regex 5.
_CJK_HANGUL_RE = (r"[\u4E00-\u9FA5\u0800-\u167F\u1681-\u1FFF\u200B-\u2027\u202A-\u202E"
                  r"\u2030-\u205E\u2060-\u2FFF\u3001-\u4E00\uAC00-\uD7FF]+")
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
    r"\s?[!-/:-~\uFF01-\uFF0F\uFF1A-\uFF5E\u2018-\u201F\u3001-\u3002]+",
    r"\s+$",
    _CJK_HANGUL_RE,
    r"\p{N}+",
)
_DEEPSEEK_CODER_RES = (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK_HANGUL_RE, r"\p{N}")

# Keyed by tokenizer.ggml.pre. An open table: a plugin may add entries for its own vocabularies.
PRETOKENIZERS: dict[str, PreTokenizerSpec] = {
    "qwen2": PreTokenizerSpec((_QWEN2_RE,), normalizer="NFC"),
    "deepseek-r1-qwen": PreTokenizerSpec((_QWEN2_RE,), normalizer="NFC"),
    "kormo": PreTokenizerSpec((_QWEN2_RE,), normalizer="NFC"),
    "f2llmv2": PreTokenizerSpec((_QWEN2_RE,), normalizer="NFC"),
    # No NFC for qwen35: its regex takes combining marks (\p{M}) into words instead, and
    # llama.cpp's vocab test vectors (from Qwen3.5's own tokenizer) keep NFD input decomposed.
    "qwen35": PreTokenizerSpec((_QWEN35_RE,)),
    "deepseek-v3": PreTokenizerSpec(_DEEPSEEK_V3_RES),
    "deepseek-llm": PreTokenizerSpec(_DEEPSEEK_LLM_RES),
    "deepseek-coder": PreTokenizerSpec(_DEEPSEEK_CODER_RES),
    # GPT-2's regex; GigaChat3 (a deepseek2 "lite" file) declares it as "gigachat"
    "gpt-2": PreTokenizerSpec((_GPT2_RE,)),
    "gigachat": PreTokenizerSpec((_GPT2_RE,)),
    # GPT-4o's regex; Kanana-2 (a deepseek2 "lite" file) declares it as "kanana2"
    "gpt-4o": PreTokenizerSpec((_GPT4O_RE,)),
    "kanana2": PreTokenizerSpec((_GPT4O_RE,)),
    # Kimi-K2 and Moonlight (deepseek2 files)
    "kimi-k2": PreTokenizerSpec((_KIMI_K2_RE,)),
    # Mistral-Large-3 (a deepseek2 file)
    "tekken": PreTokenizerSpec((_TEKKEN_RE,), ignore_merges=True, add_bos_default=True),
    # GLM-4.5 / 4.7 vocabularies (GLM-4.7-Flash is a deepseek2 file): whole words that are
    # tokens skip the merges, and no BOS unless the file names one
    "glm4": PreTokenizerSpec((_LLAMA3_RE,), ignore_merges=True, gpt2_bos=False),
    "glm5": PreTokenizerSpec((_LLAMA3_RE,), ignore_merges=True, gpt2_bos=False),
}

_ESC = re.compile(r"\\u([0-9A-Fa-f]{4})|\\U([0-9A-Fa-f]{8})")


def _literal_escapes(pattern: str) -> str:
    """``\\uXXXX`` / ``\\UXXXXXXXX`` -> the character itself (Oniguruma has no ``\\U``)."""
    return _ESC.sub(lambda m: chr(int(m.group(1) or m.group(2), 16)), pattern)


@functools.lru_cache(maxsize=None)
def category_class(cat: str) -> str:
    """The members of llama.cpp's category ``cat`` written for a character class: ASCII as
    ``\\xNN`` (so that no class syntax character appears bare), the rest as itself."""
    from .unicode_classes import CLASSES

    def ch(c: int) -> str:
        return f"\\x{c:02X}" if c < 0x80 else chr(c)

    out = []
    for r in CLASSES[cat].split():
        a, _, b = r.partition("-")
        out.append(ch(int(a, 16)) + (f"-{ch(int(b, 16))}" if b else ""))
    return "".join(out)


_CATEGORY = re.compile(r"\\p\{([LNMPS])\}")


def llama_categories(pattern: str) -> str:
    """``pattern`` with each ``\\p{X}`` of L, N, M, P, S spelled out as llama.cpp's table has it
    (inside a character class its members, outside one a class of them). llama.cpp's table is of
    Unicode 15.1; the regex engine's may be newer, and a character assigned since (a new emoji,
    a letter of a new script) would otherwise split differently."""
    out, depth, i = [], 0, 0
    while i < len(pattern):
        m = _CATEGORY.match(pattern, i)
        if m:
            body = category_class(m.group(1))
            out.append(body if depth else f"[{body}]")
            i = m.end()
            continue
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if c == "[":
            depth += 1
        elif c == "]" and depth:
            depth -= 1
        out.append(c)
        i += 1
    return "".join(out)


def bpe_model(vocab: dict[str, int], merges: list[tuple[str, str]], spec: PreTokenizerSpec):
    """A ``models.BPE`` with HF's byte-level options over ``vocab`` and ``merges``. ModelError
    for a merge whose result is not in the vocabulary: ``tokenizers`` (0.23) panics on that one
    (a PanicException, and a Rust panic message on stderr) where it reports the other
    inconsistencies as errors. (The check is C-speed iteration, ~35 ms on this 2-core VM for
    Qwen3's 151k merges in the full build, which takes ~10x that; the prompt-scoped BPE on the
    cold path passes only the few merges a prompt uses.)"""
    from tokenizers import models

    if not all(map(vocab.__contains__, starmap(operator.add, merges))):
        for a, b in merges:
            if a + b not in vocab and a in vocab and b in vocab:
                raise ModelError(f"tokenizer.ggml.merges has the merge {a + ' ' + b!r} whose "
                                 f"result {a + b!r} is not in the vocabulary")

    return models.BPE(vocab, merges, dropout=None, unk_token=None, continuing_subword_prefix="",
                      end_of_word_suffix="", fuse_unk=False, byte_fallback=False,
                      ignore_merges=spec.ignore_merges)


def pipeline(spec: PreTokenizerSpec):
    """(normalizer or None, pre-tokenizer, post-processor, decoder) of a ``pre`` type."""
    from tokenizers import Regex, decoders, normalizers, pre_tokenizers, processors

    if spec.normalizer == "NFC":
        normalizer = normalizers.NFC()
    elif spec.normalizer is None:
        normalizer = None
    else:
        raise ModelError(f"unknown normalizer {spec.normalizer!r} in the pre-tokenizer table")
    pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(llama_categories(_literal_escapes(r))), "isolated", invert=False)
         for r in spec.regexes]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    return normalizer, pre_tokenizer, processors.ByteLevel(trim_offsets=False), decoders.ByteLevel()


def with_pipeline(hf, pipe):
    """``hf`` with the (normalizer or None, pre-tokenizer, post-processor, decoder) of
    :func:`pipeline` installed."""
    normalizer, pre_tokenizer, post, dec = pipe
    if normalizer is not None:
        hf.normalizer = normalizer
    hf.pre_tokenizer = pre_tokenizer
    hf.post_processor = post
    hf.decoder = dec
    return hf
