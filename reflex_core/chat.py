"""Chat templates: a GGUF's ``tokenizer.chat_template`` rendered as transformers'
``apply_chat_template`` renders it, so a prompt built here is the text the model was tuned on.

The environment is transformers' (``chat_template_utils._compile_jinja_template``): an
immutable sandbox with ``trim_blocks`` and ``lstrip_blocks`` (without them a template's own
indentation lands in the prompt), the ``loopcontrols`` extension, the ``{% generation %}`` tag
(rendered as its body), a ``tojson`` filter that does not escape HTML and keeps non-ASCII text,
and the ``raise_exception`` and ``strftime_now`` globals. The variables are transformers' too:
``messages``, ``tools`` and ``documents`` (None), ``add_generation_prompt``, the special tokens
the tokenizer names (``bos_token``, ``eos_token``, ...; only those it has), then any extra
keyword (``enable_thinking``), which wins over a special token of the same name.

The rendered text carries the template's special tokens (``<|im_start|>``...) as text: it is
encoded with special-token parsing on and without the tokenizer's own BOS (the template writes
``bos_token`` where it wants one), as transformers encodes it.

jinja2 is imported inside the functions: a plain prompt never pays for it.
"""

from __future__ import annotations

import functools
from typing import Any

from .errors import ModelError, ReflexError, pip_install

TEMPLATE_KEY = "tokenizer.chat_template"

# transformers' special-token names -> the GGUF keys of their ids (llama.cpp spells "seperator")
SPECIAL_TOKEN_KEYS = (
    ("bos_token", "tokenizer.ggml.bos_token_id"),
    ("eos_token", "tokenizer.ggml.eos_token_id"),
    ("unk_token", "tokenizer.ggml.unknown_token_id"),
    ("sep_token", "tokenizer.ggml.seperator_token_id"),
    ("pad_token", "tokenizer.ggml.padding_token_id"),
    ("mask_token", "tokenizer.ggml.mask_token_id"),
)


class ChatTemplateError(ReflexError):
    """A chat template that does not compile or refuses to render the conversation."""


def chat_template(source: Any) -> str:
    """The default chat template of the GGUF ``source``; a one-line error naming the file when
    it has none."""
    path = getattr(source, "path", "the model file")
    template = source.get(TEMPLATE_KEY)
    if template is None:
        raise ReflexError(f"{path} has no chat template ({TEMPLATE_KEY}): it takes plain-text "
                          "prompts only")
    if not isinstance(template, str) or not template.strip():
        what = "empty" if isinstance(template, str) else "not a string"
        raise ModelError(f"{path}: {TEMPLATE_KEY} is {what}")
    return template


def special_tokens(source: Any) -> dict[str, str]:
    """The special tokens' texts the GGUF ``source`` names by id, under transformers' names
    (``{"bos_token": ..., "eos_token": ...}``): the variables a template sees besides the
    messages. A token the file does not name is left out (undefined in the template), as a
    tokenizer without it has none in transformers."""
    from .tokenizer.vocab import md_id

    tokens = source.get("tokenizer.ggml.tokens")
    if tokens is None:
        return {}
    out = {}
    for name, key in SPECIAL_TOKEN_KEYS:
        i = md_id(source, key, len(tokens))
        if i is not None:
            out[name] = tokens[i]
    return out


def render_chat(source: Any, prompt: str, system: str | None = None,
                add_generation_prompt: bool = True, enable_thinking: bool | None = None) -> str:
    """``prompt`` as one user message (after a ``system`` message when given), rendered with
    the chat template of the GGUF ``source`` (reflex_core.gguf / modelfile). ``enable_thinking``
    None leaves the variable undefined (the template's default). Errors name the file."""
    path = getattr(source, "path", "the model file")
    template = chat_template(source)
    messages = ([{"role": "system", "content": system}] if system is not None else [])
    messages.append({"role": "user", "content": prompt})
    try:
        extra: dict[str, Any] = special_tokens(source)
    except ModelError as e:
        raise ModelError(f"{path}: {e}") from None
    if enable_thinking is not None:
        extra["enable_thinking"] = enable_thinking
    try:
        return render_messages(template, messages, add_generation_prompt=add_generation_prompt,
                               **extra)
    except ChatTemplateError as e:
        raise ChatTemplateError(f"{path}: {e}") from None


def render_messages(template: str, messages: list[dict], bos_token: str | None = None,
                    eos_token: str | None = None, add_generation_prompt: bool = True,
                    **extra: Any) -> str:
    """Render ``messages`` (``{"role": ..., "content": ...}`` dicts) with ``template`` as
    transformers does. ``bos_token``/``eos_token`` None: left undefined. ``extra``: more
    variables (other special tokens, ``enable_thinking``, ...). ChatTemplateError when the
    template does not compile or fails while rendering (``raise_exception`` included)."""
    variables = {k: v for k, v in (("bos_token", bos_token), ("eos_token", eos_token))
                 if v is not None}
    variables.update(extra)
    compiled = _compile(template)
    import jinja2  # _compile has imported it

    try:
        return compiled.render(messages=messages, tools=None, documents=None,
                               add_generation_prompt=add_generation_prompt, **variables)
    except jinja2.TemplateError as e:  # raise_exception's message is the template's own words
        why = _first_line(e)
    except Exception as e:  # noqa: BLE001 - the template is the file's code: any failure is its
        why = f"{type(e).__name__}: {_first_line(e)}"
    raise ChatTemplateError(f"{TEMPLATE_KEY} failed to render: {why}")


@functools.lru_cache(maxsize=8)
def _compile(template: str):
    """The compiled template (cached: a server renders with the same one again and again)."""
    try:
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as e:
        spec = "'jinja2>=3.1'"  # quoted: the shell would take >= for a redirection
        raise ReflexError(f"chat templates need jinja2 ({e}): {pip_install(spec)}") from None

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_generation_tag(),
                                                    jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(template)
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(f"{TEMPLATE_KEY} does not compile: {_first_line(e)} "
                                f"(template line {e.lineno})") from None
    except Exception as e:  # noqa: BLE001 - see render_messages
        raise ChatTemplateError(f"{TEMPLATE_KEY} does not compile: {type(e).__name__}: "
                                f"{_first_line(e)}") from None


@functools.lru_cache(maxsize=None)
def _generation_tag() -> type:
    """transformers' ``{% generation %}...{% endgeneration %}`` tag (it marks the assistant's
    text for training masks): outside that tracking it renders its body unchanged, so that is
    all it does here; without it a template using the tag would not compile."""
    import jinja2.ext
    import jinja2.nodes

    class GenerationTag(jinja2.ext.Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body).set_lineno(lineno)

    return GenerationTag


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    # jinja's own tojson escapes <, >, & and ' for HTML; transformers' does not, and exposes
    # json.dumps' layout options
    import json

    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _raise_exception(message: str):
    import jinja2

    raise jinja2.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    from datetime import datetime

    return datetime.now().strftime(fmt)


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else ""
