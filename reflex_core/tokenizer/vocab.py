"""A GGUF vocabulary as llama.cpp reads it: token types, which tokenizer a file declares, the
special ids and end-of-generation set, GPT-2's byte-level table, and the BPE vocabulary as a
bytes -> id table. Stdlib only (no ``tokenizers``): all of this is cheap and on the cold path.

Every ``tokenizer.ggml.*`` value is type-checked where it is read (``md_str``, ``md_bool``,
``md_id``, ``md_array``): a value of the wrong kind (an id stored as a string or a float,
``pre`` as an array, merges as integers, ``token_type`` as a scalar) or a special id outside
the vocabulary is a one-line ModelError naming the key. The metadata is the reader's: Python
kinds stand for the GGUF value types (int for the integer types, float for float32/64, str,
bool, and an array carrying its ``elem_type``).
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from ..errors import ModelError, ReflexError
from .pretokenizers import PRETOKENIZERS, PreTokenizerSpec

# llama.cpp token types (tokenizer.ggml.token_type)
TT_NORMAL, TT_UNKNOWN, TT_CONTROL, TT_USER_DEFINED, TT_UNUSED, TT_BYTE = 1, 2, 3, 4, 5, 6
IN_BPE_VOCAB = frozenset((TT_NORMAL, TT_UNKNOWN, TT_BYTE))
ADDED_TYPES = frozenset((TT_CONTROL, TT_USER_DEFINED))

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

_DICT_CHUNK = 16384  # tokens per dict.update in bpe_vocab
_NORMAL_RUN = re.compile(bytes((TT_NORMAL,)) + b"+")


# GGUF value types (spec §2), as an array's ``elem_type`` gives them: the tokenizer knows
# nothing of the reader's modules (tests/test_gguf_layers.py), so it names the few it checks.
_VALUE_TYPE_NAMES = ("uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool",
                     "string", "array", "uint64", "int64", "float64")
_STRINGS = frozenset((8,))
_INTEGERS = frozenset((0, 1, 2, 3, 4, 5, 10, 11))  # token types: any integer type (llama.cpp)


def declared_tokenizer(md: dict) -> tuple[PreTokenizerSpec, str, Any]:
    """(pre-tokenizer spec, ``pre`` name, the token array) of the tokenizer ``md`` declares;
    ModelError (one line) when there is none, it is not supported, or one of its arrays
    (tokens, token types, merges) is of the wrong type."""
    model = md_str(md, "tokenizer.ggml.model")
    if model is None or model in ("none", "no_vocab"):
        raise ModelError("this model has no tokenizer (tokenizer.ggml.model is "
                         f"{'missing' if model is None else repr(model)}); pass token ids instead of text")
    if model not in SUPPORTED_MODELS:
        raise ModelError(f"tokenizer.ggml.model {model!r} is not supported "
                         f"(supported: {', '.join(SUPPORTED_MODELS)})")
    pre = md_str(md, "tokenizer.ggml.pre")
    spec = PRETOKENIZERS.get(pre) if pre is not None else None
    if spec is None:
        known = ", ".join(sorted(PRETOKENIZERS))
        what = "is missing" if pre is None else f"{pre!r} is not supported"
        raise ModelError(f"tokenizer.ggml.pre {what} (known: {known})")
    src = md_array(md, "tokenizer.ggml.tokens", _STRINGS, "an array of strings")
    if src is None or len(src) == 0:
        raise ModelError("tokenizer.ggml.tokens is missing or empty")
    md_array(md, "tokenizer.ggml.token_type", _INTEGERS, "an array of integers")
    md_array(md, "tokenizer.ggml.merges", _STRINGS, "an array of strings")
    return spec, pre, src


class SpecialTokens(NamedTuple):
    bos_id: int | None
    eos_id: int | None
    eot_id: int | None
    pad_id: int | None
    add_bos: bool
    add_eos: bool
    eog_ids: frozenset[int]


def special_tokens(md: dict, spec: PreTokenizerSpec, added: list[tuple[int, str, bool]],
                   lookup, n: int) -> SpecialTokens:
    """The special ids and the end-of-generation set, as llama.cpp reads them. ``added``: the
    (id, text, is CONTROL) added tokens; ``lookup``: text -> BPE vocab id or None."""
    # BPE defaults: bos = eos = 11 (some pre types have no default BOS)
    bos = _opt_id(md, "tokenizer.ggml.bos_token_id", n, 11 if spec.gpt2_bos else None)
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
    add_bos = md_bool(md, "tokenizer.ggml.add_bos_token", spec.add_bos_default)
    add_eos = md_bool(md, "tokenizer.ggml.add_eos_token", False)
    return SpecialTokens(bos, eos, eot, pad, add_bos, add_eos, frozenset(eog))


def _opt_id(md: dict, key: str, n: int, default: int | None = None) -> int | None:
    v = md_id(md, key, n)
    if v is None:
        return default if default is not None and 0 <= default < n else None
    return v


# ---------------------------------------------------------------- typed metadata access


def _kind(v: Any) -> str:
    """The GGUF kind of a metadata value, for messages."""
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "float"
    if isinstance(v, (str, bytes)):
        return "string"
    elem = getattr(v, "elem_type", None)
    if elem is not None:
        name = _VALUE_TYPE_NAMES[elem] if 0 <= elem < len(_VALUE_TYPE_NAMES) else str(elem)
        return f"array of {name}"
    return "array" if hasattr(v, "__len__") else type(v).__name__


def wrong_type(key: str, v: Any, expected: str) -> ModelError:
    return ModelError(f"metadata key {key!r} has wrong type {_kind(v)} (expected {expected})")


def md_str(md: dict, key: str) -> str | None:
    """A string value, or None when absent."""
    v = md.get(key)
    if v is not None and not isinstance(v, str):
        raise wrong_type(key, v, "string")
    return v


def md_bool(md: dict, key: str, default: bool) -> bool:
    v = md.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise wrong_type(key, v, "bool")
    return v


def md_id(md: dict, key: str, n: int) -> int | None:
    """A token id of a vocabulary of ``n`` tokens, or None when absent. llama.cpp warns about
    an id outside the vocabulary and uses its default; a file naming a token it does not have
    is broken, and generation that cannot stop (a missing end-of-generation id) is worse than
    an error, so this refuses it."""
    v = md.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise wrong_type(key, v, "an unsigned integer token id")
    if not 0 <= v < n:
        raise ModelError(f"metadata key {key!r} = {v} is not a token id (the vocabulary has "
                         f"{n} tokens)")
    return v


def md_array(md: dict, key: str, elems: frozenset, expected: str) -> Any:
    """An array value whose elements are of one of the GGUF types ``elems``, or None when
    absent. (A plain list, as tests pass, has no element type to check.)"""
    v = md.get(key)
    if v is None:
        return None
    if isinstance(v, (str, bytes, bool, int, float)) or not hasattr(v, "__len__"):
        raise wrong_type(key, v, expected)
    elem = getattr(v, "elem_type", None)
    if elem is not None and elem not in elems:
        raise wrong_type(key, v, expected)
    return v


def md_list(md: dict, key: str) -> list | None:
    v = md.get(key)
    if v is None:
        return None
    return v.tolist() if hasattr(v, "tolist") else list(v)


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


BYTE_OF_CHAR: dict[str, int] = {c: b for b, c in _bytes_to_unicode().items()}


def normal_spans(tb: bytes) -> list[tuple[int, int]]:
    """[start, end) of each run of NORMAL tokens, in id order (Qwen: one, from 0; DeepSeek-V3:
    one, after its three special tokens). A regex over the types: C speed."""
    return [m.span() for m in _NORMAL_RUN.finditer(tb)]


def bpe_vocab(raw: list[bytes], tb: bytes) -> tuple[dict[bytes, int], int]:
    """The BPE vocab (NORMAL/UNKNOWN/BYTE tokens) as bytes -> id, and k, its number of
    tokens, when they are all NORMAL (else -1: the prompt-scoped path refuses). A repeated
    text keeps its last id, as in the full build."""
    if tb.count(TT_UNKNOWN) or tb.count(TT_BYTE):
        return {raw[i]: i for i in range(len(raw)) if tb[i] in IN_BPE_VOCAB}, -1
    vocab: dict[bytes, int] = {}
    for start, end in normal_spans(tb):
        for i in range(start, end, _DICT_CHUNK):  # in C-speed chunks, so that another thread
            j = min(i + _DICT_CHUNK, end)  # waiting for the GIL gets it within ~1 ms
            vocab.update(zip(raw[i:j], range(i, j)))
    return vocab, tb.count(TT_NORMAL)


def raw_strings(v: Any) -> list[bytes]:
    """The exact bytes of a string array's elements (GGUFArray: split in bulk, not decoded)."""
    raw_list = getattr(v, "raw_list", None)
    if raw_list is not None:
        return raw_list()
    return [s.encode("utf-8") for s in v]


def decode_all(raw: list[bytes]) -> list[str]:
    joined = b"\0".join(raw)
    if joined.count(b"\0") == len(raw) - 1:  # no NUL inside a string: one decode, one split
        return joined.decode("utf-8").split("\0")
    return [b.decode("utf-8") for b in raw]


def utf8_error(src: Any, key: str):
    if hasattr(src, "tolist"):
        src.tolist()  # the GGUF reader raises GGUFError naming the string
    raise ModelError(f"{key} is not valid UTF-8")


def check_unicode(texts) -> None:
    """A one-line error for text that is not valid Unicode (lone surrogates, e.g. from
    undecodable command-line bytes); neither BPE can encode it."""
    for text in texts:
        if isinstance(text, str):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as e:
                raise ReflexError(f"the text is not valid Unicode (a lone surrogate at index {e.start}, "
                                  "e.g. from undecodable bytes); it cannot be tokenized") from None
