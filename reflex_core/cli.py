"""The ``reflex`` command line (click). Thin: parse flags, call the engine, print.

Output contract: human-readable text on stdout, then one machine-readable status line
(``REFLEX_<COMMAND>_OK ...``); ``--json`` prints one JSON object instead. Errors are one line on
stderr (``error: ...``), exit status 1 (2 for usage), no traceback unless ``--debug``. What the
lines and objects say is reflex_core.render's; how the process ends, reflex_core.lifecycle's.
"""

from __future__ import annotations

import json
import os
import sys
from typing import NoReturn

import click

from . import lifecycle, mapguard, render
from .errors import ReflexError

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"]}


def echo_lines(lines: list[str], err: bool = False) -> None:
    for line in lines:
        click.echo(line, err=err)


def print_timings(t, total: tuple[str, float] | None = None) -> None:
    echo_lines(render.timings_lines(t, total), err=True)


class ReflexGroup(click.Group):
    """Core commands first; unknown names are looked up in plugins' commands (loaded lazily so
    that ordinary invocations import no plugin they do not need)."""

    _plugin_commands_loaded = False

    def _load_plugin_commands(self) -> None:
        if ReflexGroup._plugin_commands_loaded:
            return
        ReflexGroup._plugin_commands_loaded = True
        from .registry import get_host

        host = get_host()
        host.load_all()
        host.pm.hook.reflex_register_commands(cli=self)

    def get_command(self, ctx, cmd_name):
        cmd = super().get_command(ctx, cmd_name)
        if cmd is None:
            self._load_plugin_commands()
            cmd = super().get_command(ctx, cmd_name)
        return cmd

    def list_commands(self, ctx):
        try:
            self._load_plugin_commands()
        except ReflexError:
            pass
        return super().list_commands(ctx)


@click.group(cls=ReflexGroup, context_settings=CONTEXT_SETTINGS)
@click.version_option(package_name="reflex-infer", prog_name="reflex")
@click.option("--debug", is_flag=True, help="Show tracebacks on errors.")
def cli(debug: bool) -> None:
    """Reflex: the fastest way from a cold process to one token (GGUF models, NVIDIA GPUs)."""


backend_option = click.option(
    "--backend", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True,
    help="cuda: the GPU (default when one is present); cpu: the NumPy reference backend.")


def _lora_specs(ctx, param, values):
    from .lora import parse_lora_arg

    return [parse_lora_arg(v) for v in values]


lora_option = click.option(
    "--lora", multiple=True, metavar="ADAPTER.gguf[:SCALE]", callback=_lora_specs,
    help="A GGUF LoRA adapter merged into the weights at load, times SCALE (default 1); repeat "
         "to add several in order.")


def model_options(f):
    """[MODEL] [PROMPT] positionals, -p, and the model options shared by generate and system1."""
    f = click.option("-p", "--prompt", "prompt_opt", metavar="TEXT", default=None,
                     help="The prompt (instead of the PROMPT argument; may begin with '-'), "
                          "its escapes (\\n, \\t, ...) processed as llama.cpp's -p does. '-' "
                          "reads standard input.")(f)
    f = click.option("--no-escape", "no_escape", is_flag=True,
                     help="Take -p and --stop as written: no \\n, \\t, ... escapes.")(f)
    f = click.option("--revision", default=None,
                     help="With --model/--quickstart: a branch, tag or commit of the repository.")(f)
    f = click.option("-m", "--model", "hub_model", metavar="FILE|REPO[:FILE]", default=None,
                     help="The model instead of the MODEL argument: a local GGUF file, or one "
                          "from the Hugging Face Hub (ORG/NAME, optionally :FILE.gguf).")(f)
    f = click.option("--quickstart", is_flag=True,
                     help="Run the default model (Qwen3-0.6B Q8_0 from Qwen's GGUF repository).")(f)
    return click.argument("args", nargs=-1, metavar="[MODEL] [PROMPT]")(f)


PROMPT_IS_ARGUMENT = "reflex.prompt_is_argument"


def process_escapes(text: str) -> str:
    """llama.cpp's escapes of -p and -r (common's string_process_escapes): \\n \\r \\t \\'
    \\" \\\\ and \\xHH (a byte); any other backslash stays as written."""
    if "\\" not in text:
        return text
    src, out, i = text.encode("utf-8"), bytearray(), 0
    simple = {ord("n"): b"\n", ord("r"): b"\r", ord("t"): b"\t", ord("'"): b"'",
              ord('"'): b'"', ord("\\"): b"\\"}
    while i < len(src):
        c = src[i]
        if c != 0x5C or i + 1 == len(src):
            out.append(c)
            i += 1
            continue
        e = src[i + 1]
        byte = _hex_byte(src[i + 2:i + 4]) if e == ord("x") else None
        if e in simple:
            out += simple[e]
            i += 2
        elif byte is not None:
            out.append(byte)
            i += 4
        else:
            out += src[i:i + 2]
            i += 2
    return out.decode("utf-8", errors="replace")


def _hex_byte(two: bytes) -> int | None:
    """The byte of ``\\x`` + ``two`` as llama.cpp reads it: strtol(two, 16) must take both
    characters, so a leading space or sign counts (``\\x 9`` is a tab, ``\\x-1`` 0xff);
    None where it does not take both."""
    if len(two) != 2:
        return None
    s = two.decode("latin-1")
    body = s[1:] if s[0] in " \t\n\v\f\r+-" else s
    if not body or any(c not in "0123456789abcdefABCDEF" for c in body):
        return None
    return (-int(body, 16) if s[0] == "-" else int(body, 16)) & 0xFF


class PromptCommand(click.Command):
    """A command whose prompt may begin with '-': a positional argument that starts with '-'
    but is text rather than an option (it holds a space or a character no option name has,
    e.g. ``-"c...`` or ``-5 degrees``) is read as ``-p`` ARG. Option values are skipped, so
    ``-n -1`` stays a number. Anything option-like that matches no option is still a usage
    error, whose message says how to give such a prompt."""

    def parse_args(self, ctx, args):
        takes_value, names = set(), set()
        for p in self.get_params(ctx):
            if isinstance(p, click.Option):
                names.update(p.opts + p.secondary_opts)
                if not p.is_flag and not p.count:
                    takes_value.update(p.opts)
        out, i = [], 0
        while i < len(args):
            a = args[i]
            if a == "--":
                out.extend(args[i:])
                break
            if a in takes_value and i + 1 < len(args):
                out.extend(args[i:i + 2])
                i += 2
                continue
            if (len(a) > 1 and a.startswith("-") and a.split("=", 1)[0] not in names
                    and not _looks_like_option(a)):
                out.extend(["-p", a])
                ctx.meta[PROMPT_IS_ARGUMENT] = True  # PROMPT's text as written: no escapes
            else:
                out.append(a)
            i += 1
        try:
            return super().parse_args(ctx, out)
        except click.NoSuchOption as e:
            e.message += (" (a prompt that begins with '-': give it with -p TEXT, or after --)")
            raise


class FiniteRange(click.FloatRange):
    """click's FloatRange, less nan and inf: "nan" passes its bounds (every comparison with it
    is false), and a NaN temperature or penalty makes every logit NaN."""

    name = "finite float range"

    def convert(self, value, param, ctx):
        rv = super().convert(value, param, ctx)
        if rv != rv or rv in (float("inf"), float("-inf")):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return rv


def _looks_like_option(arg: str) -> bool:
    if any(c.isspace() for c in arg):  # "--color=auto makes ls colourful": text, whole
        return False
    body = arg.lstrip("-").split("=", 1)[0]
    return bool(body) and all(c.isascii() and (c.isalnum() or c in "-_") for c in body)


def prompt_options(f):
    """--chat / --system / -f, shared by generate and system1 (reflex_core.chat)."""
    f = click.option("-f", "--file", "prompt_file", metavar="FILE", default=None,
                     help="Read PROMPT from FILE ('-': standard input; one trailing newline is "
                          "dropped); PROMPT is then not given.")(f)
    f = click.option("--system", metavar="TEXT", default=None,
                     help="With --chat: a system message before the user's.")(f)
    return click.option("--chat", is_flag=True,
                        help="Send PROMPT as a user message through the model's chat template "
                             "(tokenizer.chat_template), ready for the assistant's reply.")(f)


def read_prompt_file(path: str) -> str:
    """The prompt in ``path`` ('-': stdin), UTF-8, less one trailing newline (the one an editor
    or ``echo`` adds, which is not part of the prompt; llama.cpp's -f drops it too)."""
    where = "standard input" if path == "-" else path
    try:
        if path == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(path, "rb") as f:
                data = f.read()
    except OSError as e:
        raise ReflexError(f"{where}: cannot read the prompt: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ReflexError(f"{where}: the prompt is not UTF-8 text (byte {e.start} is "
                          f"0x{data[e.start]:02x})") from None
    return text[:-1] if text.endswith("\n") else text


def chat_request(chat: bool, system: str | None) -> dict | None:
    """engine.load's ``chat`` argument from --chat / --system."""
    if system is not None and not chat:
        raise click.UsageError("--system applies to --chat only")
    return {"system": system} if chat else None


def state_file_options(f):
    """--export-kv / --import-kv, shared by generate and system1 (reflex_core.statefile)."""
    f = click.option("--import-kv", "import_kv", metavar="FILE", default=None,
                     help="Continue from a state file written by --export-kv: PROMPT (which may "
                          "be empty) is appended to it.")(f)
    return click.option("--export-kv", "export_kv", metavar="FILE", default=None,
                        help="Write the model state after the job to FILE (generate -n 0: the "
                             "prompt alone, a prefix file to --import-kv later).")(f)


def open_state_files(import_kv: str | None, export_kv: str | None, backend: str):
    """Before the model loads: refuse an export that cannot be written, and start reading the
    import (its checksum and structure) on a thread, beside the model's load. Returns that
    read's Background (None without --import-kv): :func:`saved_state` waits for it."""
    from . import statefile

    if export_kv is not None:
        statefile.check_target(export_kv)
    if import_kv is None:
        return None
    from .background import Background

    return Background(lambda: _read_state(import_kv, backend))


def _read_state(path: str, backend: str):
    """statefile.read, then -- on the GPU, once CUDA is up -- the mapped buffers page-locked, so
    that their upload after the model's load is a DMA and not a pageable copy (REFLEX_PIN_STATE=0:
    not). Returns (Saved, a note on the pinning for --timings). The registration is never
    released: a command's process ends after its one job (its weights' pages stay pinned too)."""
    from . import statefile

    saved = statefile.read(path)
    if backend == "cpu" or os.environ.get("REFLEX_PIN_STATE", "1") == "0":
        return saved, "pageable (not pinned)"
    from .cuda.start import current

    start = current()
    if start is None or not start.ready():
        return saved, "pageable (no CUDA)"
    from .cuda.upload import pin_views

    try:
        reg, why = pin_views(list(saved.dumped["data"].values()))
    except Exception as e:  # noqa: BLE001 - the pageable copy still works
        reg, why = None, str(e)
    if reg is None:
        return saved, f"pageable (pinning refused: {why})"
    _PINNED.append(reg)
    return saved, f"pinned ({reg.length / 1e6:.0f} MB)"


_PINNED: list = []  # the state files' registrations, for the life of the process


def saved_state(reading, lm, t):
    """The state file being read by ``reading`` (open_state_files), checked against the loaded
    model ``lm``; None when there is none."""
    if reading is None:
        return None
    from .statefile import check_model

    with t.span("wait for the state file"):
        saved, pinning = reading.wait()
    t.phase("read state file (thread)", *reading.span())
    t.notes["state upload"] = pinning
    check_model(saved, lm)
    return saved


def write_state_file(path: str, lm, dumped: dict, tokens, pending, t) -> None:
    from . import statefile

    with t.span("write state file"):
        n = statefile.write(path, lm, dumped, tokens, pending)
    t.notes["state file"] = f"{path}: {n} bytes, {len(tokens)} tokens + {len(pending)} pending"


def local_or_hub(spec: str) -> tuple[str | None, str | None]:
    """-m/--model's value as (local path, None) or (None, Hub spec): an existing file, or a
    name ending in .gguf without a ':' (a Hub file is named after the ':'), is a local path."""
    if os.path.isfile(spec) or (":" not in spec and spec.lower().endswith(".gguf")):
        return spec, None
    return None, spec


def model_source(quickstart: bool, model_opt: str | None,
                 revision: str | None) -> tuple[str | None, str | None]:
    """--quickstart, -m/--model and --revision, checked, as (local path, Hub spec): at most one
    of --quickstart and -m, and --revision only with a Hub model."""
    local, hub_spec = local_or_hub(model_opt) if model_opt is not None else (None, None)
    if quickstart and model_opt is not None:
        raise click.UsageError("give --quickstart or -m/--model, not both")
    if revision and hub_spec is None and not quickstart:
        raise click.UsageError("--revision applies to a Hub model (-m ORG/NAME, --quickstart)")
    return local, hub_spec


def resolve_model_prompt(args, quickstart: bool, hub_model: str | None, revision: str | None,
                         t, prompt_file: str | None = None, prompt_opt: str | None = None,
                         escape: bool = True) -> tuple[str, str]:
    """(local GGUF path, prompt) from the positionals, the model options, -p and -f. The
    prompt '-' (as PROMPT or -p) is read from standard input. ``escape``: -p TEXT's escapes
    are processed (llama.cpp's default); PROMPT (llama-simple's) and files are taken as
    written."""
    local, hub_model = model_source(quickstart, hub_model, revision)
    if prompt_file is not None and prompt_opt is not None:
        raise click.UsageError("give the prompt once: -p or -f, not both")
    given_model = quickstart or hub_model is not None or local is not None
    given_prompt = prompt_file is not None or prompt_opt is not None
    want = (0 if given_model else 1) + (0 if given_prompt else 1)
    if len(args) != want:
        what = ([] if given_model else ["MODEL"]) + ([] if given_prompt else ["PROMPT"])
        where = " (the model comes from -m/--model/--quickstart)" if given_model else ""
        where += " (the prompt comes from -p/-f)" if given_prompt else ""
        raise click.UsageError(f"expected {' '.join(what) or 'no argument'}{where}, got "
                               f"{len(args)} argument(s)")
    if prompt_file is not None:
        prompt = read_prompt_file(prompt_file)
    elif prompt_opt is not None:
        if prompt_opt == "-":
            prompt = read_prompt_file("-")
        elif escape and not click.get_current_context().meta.get(PROMPT_IS_ARGUMENT):
            prompt = process_escapes(prompt_opt)
        else:
            prompt = prompt_opt
    else:
        prompt = read_prompt_file("-") if args[-1] == "-" else args[-1]
    if local is not None:
        return local, prompt
    if quickstart or hub_model is not None:
        from . import hub

        with t.span("resolve model on the Hub"):
            path = hub.resolve(hub_model, revision=revision, quickstart=quickstart)
        return path, prompt
    return args[0], prompt


def prefill_progress(lm, quiet: bool):
    """The CPU backend's progress line for a long prefill, on stderr when it is a terminal."""
    if lm.backend != "cpu" or quiet or not sys.stderr.isatty():
        return None
    import time

    from .engine import PREFILL_CHUNK

    t0 = time.perf_counter()

    def show(done: int, total: int) -> None:
        s = time.perf_counter() - t0
        left = s / done * (total - done)
        sys.stderr.write(f"\rprefill: {done}/{total} tokens, {s:.0f} s (~{left:.0f} s left)"
                         + ("\n" if total - done <= PREFILL_CHUNK else ""))  # the last chunk next
        sys.stderr.flush()

    return show


def quiet_option(f):
    return click.option("-q", "--quiet", is_flag=True,
                        help="Print only the answer on stdout: no status line, no notices.")(f)


@cli.command(cls=PromptCommand)
@model_options
@click.option("-n", "n_tokens", type=click.IntRange(min=-1), default=32, show_default=True,
              help="Tokens to generate (stops early at an end-of-generation token or a stop "
                   "string); -1: until the end of the text or of the context; 0 only with "
                   "--export-kv.")
@click.option("--stop", "stops", multiple=True, metavar="TEXT",
              help="Stop before TEXT once the output contains it (repeat for several); its "
                   "escapes (\\n, ...) processed as llama.cpp's -r.")
@click.option("-c", "--ctx-size", type=click.IntRange(min=0), default=0,
              help="Context size in tokens: the prompt and the new tokens must fit (default "
                   "0: the model's context length; more than that runs, with a notice).")
@click.option("--truncate", is_flag=True,
              help="Drop the prompt's oldest tokens when it does not fit the context, instead "
                   "of failing.")
@click.option("--temp", "temperature", type=FiniteRange(min=0.0), default=0.0,
              show_default=True, help="Sampling temperature; 0 = greedy.")
@click.option("--top-k", type=click.IntRange(min=0), default=0, show_default=True,
              help="Keep the k most likely tokens (0 = all).")
@click.option("--top-p", type=FiniteRange(min=0.0, max=1.0, min_open=True), default=1.0,
              show_default=True, help="Nucleus sampling threshold.")
@click.option("--min-p", type=FiniteRange(min=0.0, max=1.0), default=0.0, show_default=True,
              help="Keep tokens at least this fraction as likely as the most likely (0 = off).")
@click.option("--repeat-penalty", type=FiniteRange(min=0.0, min_open=True), default=1.0,
              show_default=True,
              help="Penalise tokens seen in the last --repeat-last-n tokens (1 = off).")
@click.option("--repeat-last-n", type=click.IntRange(min=-1), default=64, show_default=True,
              help="How many recent tokens (prompt included) --repeat-penalty looks at; -1: "
                   "the whole context.")
@click.option("--seed", type=click.IntRange(min=-1), default=-1, show_default=True,
              help="Sampling seed; -1: a random one (reported by --json).")
@backend_option
@lora_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@quiet_option
@click.option("--timings", is_flag=True, help="Print each cold-path phase to stderr.")
@state_file_options
@prompt_options
def generate(args, quickstart, hub_model, revision, prompt_opt, no_escape, n_tokens, stops,
             ctx_size, truncate, temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n,
             seed, backend, lora, as_json, quiet, timings, import_kv, export_kv, chat, system,
             prompt_file):
    """Generate text continuing PROMPT with MODEL (a local GGUF file, or -m/--quickstart)."""
    from . import engine
    from .timing import Timings

    t = Timings()
    chat_args = chat_request(chat, system)
    model, prompt = resolve_model_prompt(args, quickstart, hub_model, revision, t, prompt_file,
                                         prompt_opt, escape=not no_escape)
    if n_tokens == 0 and export_kv is None:
        raise click.BadParameter("0 is not allowed (0 only with --export-kv)",
                                 param_hint="'-n'")
    if n_tokens < 0 and export_kv is not None:
        raise click.BadParameter("-1 is not allowed with --export-kv", param_hint="'-n'")
    stops = [s if no_escape else process_escapes(s) for s in stops]
    if not all(stops):
        raise click.BadParameter("a stop string is empty", param_hint="'--stop'")
    from .sampling import REPEAT_PENALTY_RANGE

    if not REPEAT_PENALTY_RANGE[0] <= repeat_penalty <= REPEAT_PENALTY_RANGE[1]:
        raise click.BadParameter(f"{repeat_penalty!r} is not in the range [%g, %g]"
                                 % REPEAT_PENALTY_RANGE, param_hint="'--repeat-penalty'")
    if not prompt and (import_kv is None or chat):
        raise ReflexError("empty prompt: give at least one character of text")
    reading = open_state_files(import_kv, export_kv, backend)
    lm, ids = engine.load(model, backend, t, prompt=prompt or None, one_shot=True,
                          continuation=reading is not None, lora=lora, chat=chat_args)
    saved = saved_state(reading, lm, t)
    ids, n_new, fitted = engine.fit_context(lm, ids or [], n_tokens, ctx_size, truncate, saved)
    if not quiet:
        for note in lm.notices + fitted:
            engine.warn(note)
    from .sampling import SamplingParams

    sampling = SamplingParams(temperature, top_k, top_p, None if seed < 0 else seed,
                              min_p=min_p, repeat_penalty=repeat_penalty,
                              repeat_last_n=repeat_last_n)

    def on_text(s: str) -> None:
        sys.stdout.write(s)
        sys.stdout.flush()

    res = engine.generate(lm, ids, n_new, sampling, None if as_json else on_text, t,
                          resume=saved, keep_state=export_kv is not None, stop=stops,
                          on_prefill=prefill_progress(lm, quiet), ctx_size=ctx_size)
    if export_kv is not None:
        write_state_file(export_kv, lm, res.state.dump(), res.fed, res.pending, t)
    if as_json:
        click.echo(json.dumps(render.generate_json(res, lm.backend), ensure_ascii=False))
    elif not quiet:
        click.echo()  # ends the streamed text
        click.echo(render.generate_status(res, lm.backend))
    elif sys.stdout.isatty():
        click.echo()  # the shell prompt on a line of its own; a file gets the text exactly
    if timings:
        print_timings(t, ("first token", res.first_token_ms))


@cli.command(cls=PromptCommand)
@model_options
@click.option("--candidate", "-c", "candidates", multiple=True,
              help="A candidate continuation (repeat for each).")
@click.option("--normalize", is_flag=True,
              help="Divide each score by its token count before the softmax over candidates.")
@click.option("--ctx-size", type=click.IntRange(min=0), default=0,
              help="Context size in tokens: the prompt with each candidate must fit, each "
                   "scored as if alone (default 0: the model's context length; more than that "
                   "runs, with a notice).")
@backend_option
@lora_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of lines.")
@quiet_option
@click.option("--timings", is_flag=True, help="Print each cold-path phase to stderr.")
@state_file_options
@prompt_options
def system1(args, quickstart, hub_model, revision, prompt_opt, no_escape, candidates, normalize,
            ctx_size, backend, lora, as_json, quiet, timings, import_kv, export_kv, chat, system,
            prompt_file):
    """Score each --candidate continuation of PROMPT in one forward pass (no decode loop); with
    --chat the candidates continue the rendered chat, i.e. they are the assistant's reply."""
    from . import engine, system1 as s1
    from .timing import Timings, since_process_start_ms

    t = Timings()
    chat_args = chat_request(chat, system)
    model, prompt = resolve_model_prompt(args, quickstart, hub_model, revision, t, prompt_file,
                                         prompt_opt, escape=not no_escape)
    if not prompt and (import_kv is None or chat):
        raise ReflexError("empty prompt: system1 needs a prompt to condition on")
    if not candidates:
        raise ReflexError("no candidates: give at least one --candidate TEXT")
    for i, c in enumerate(candidates):
        if c == "":
            raise ReflexError(f"candidate {i} is empty: every --candidate needs some text")
    reading = open_state_files(import_kv, export_kv, backend)
    lm, ids = engine.load(model, backend, t, prompt=prompt or None, texts=candidates,
                          one_shot=True, continuation=reading is not None, lora=lora,
                          chat=chat_args)
    saved = saved_state(reading, lm, t)
    if not quiet:
        for note in lm.notices + [engine.context_notice(lm, ctx_size, f"--ctx-size {ctx_size}")]:
            if note:
                engine.warn(note)
    tok = lm.require_tokenizer()
    past: list[int] = []
    if saved is not None:
        past, ids = saved.tokens, saved.pending + (ids or [])
    with t.span("encode candidates"):
        cand_ids = s1.tokenize_candidates(tok, candidates)
    prefix: list[dict] = []  # the state before the prompt's last token, for --export-kv
    with t.span("score (one forward)"):
        res = s1.evaluate(lm.model, lm.ops, ids or [], candidates, cand_ids, normalize,
                          None if saved is None else saved.dumped,
                          prefix.append if export_kv is not None else None, ctx_size)
    ms = since_process_start_ms()
    t.notes["prefill"] = (f"{res.n_prefill} tokens"
                          + (f" after {res.n_imported} imported" if saved is not None else ""))
    if export_kv is not None:
        write_state_file(export_kv, lm, prefix[0], past + ids[:-1], ids[-1:], t)
    if as_json:
        click.echo(json.dumps(render.system1_json(res, ms, normalize, lm.backend),
                              ensure_ascii=False))
    elif quiet:
        click.echo(res.candidates[res.best_idx].text)
    else:
        echo_lines(render.system1_lines(res, ms, lm.backend))
    if timings:
        print_timings(t, ("result", ms))


def server_options(f):
    """The loading options of the servers: the model (a positional or --model/--quickstart),
    --backend, --lora, -c/--ctx-size."""
    f = click.option("-c", "--ctx-size", type=click.IntRange(min=0), default=0,
                     help="Context size in tokens that every request must fit (default 0: the "
                          "model's context length; more than that runs, with a notice).")(f)
    f = lora_option(backend_option(f))
    f = click.option("--revision", default=None,
                     help="With --model/--quickstart: a branch, tag or commit of the repository.")(f)
    f = click.option("-m", "--model", "hub_model", metavar="FILE|REPO[:FILE]", default=None,
                     help="The model instead of the MODEL argument: a local GGUF file, or one "
                          "from the Hugging Face Hub (ORG/NAME, optionally :FILE.gguf).")(f)
    return click.option("--quickstart", is_flag=True,
                        help="Serve the default model (Qwen3-0.6B Q8_0).")(f)


# What states kept in the servers' slots may hold together, MiB (reflex_core.ipc.Handler): they
# are host bytes, hundreds of KB a token for an 8B model, so a client that never frees them
# would otherwise grow the server until the system kills it.
SLOT_MEMORY_MIB = 4096


def slot_memory_option(f):
    return click.option(
        "--slot-memory", metavar="MIB", type=click.IntRange(min=0), default=SLOT_MEMORY_MIB,
        show_default=True,
        help="Memory that states kept in slots ({\"slot\": NAME}) may hold together: a request "
             "that would keep one more once they hold it is refused (0: no slots).")(f)


def load_server_engine(model: str | None, quickstart: bool, hub_model: str | None,
                       revision: str | None, backend: str, lora, ctx_size: int = 0):
    """The servers' engine: loaded as a one-shot command's (the process ends through
    lifecycle.finish), its notices on stderr."""
    from . import api, engine

    local, hub_model = model_source(quickstart, hub_model, revision)
    if local is not None:
        if model is not None:
            raise click.UsageError("give MODEL or -m/--model, not both")
        model = local
    remote = quickstart or hub_model is not None
    if remote == (model is not None):
        raise click.UsageError("give MODEL, or -m/--model/--quickstart" if not remote else
                               "MODEL comes from -m/--model/--quickstart: drop the MODEL argument")
    if remote and not quickstart:
        from . import hub

        hub.parse_spec(hub_model)
        model = hub_model
    eng = api.load_for_process(None if quickstart else model, backend=backend, lora=lora,
                               revision=revision, one_shot=True, ctx_size=ctx_size)
    for note in eng.notices:
        engine.warn(note)
    return eng


@cli.command()
@click.argument("model", required=False)
@server_options
@slot_memory_option
def stdio(model, quickstart, hub_model, revision, backend, lora, ctx_size, slot_memory):
    """Serve MODEL over stdin/stdout: one JSON request per line, one JSON reply per line
    (docs/ipc.md). Ends at the end of stdin (0) or on SIGINT/SIGTERM (130/143) once the request
    under way is answered."""
    from . import ipc

    eng = load_server_engine(model, quickstart, hub_model, revision, backend, lora, ctx_size)
    click.echo(f"reflex stdio: serving {eng.path} ({eng.backend})", err=True)
    raise click.exceptions.Exit(ipc.run_stdio(eng, slot_memory << 20))


@cli.command()
@click.argument("args", nargs=-1, metavar="[MODEL] PATH")
@server_options
@slot_memory_option
def uds(args, quickstart, hub_model, revision, backend, lora, ctx_size, slot_memory):
    """Serve MODEL on the Unix socket PATH (created 0600), the stdio protocol, one connection
    at a time (docs/ipc.md). Ends on SIGINT/SIGTERM (130/143) once the request under way is
    answered, or on a "shutdown" request (0)."""
    from . import ipc

    want = 1 if (quickstart or hub_model is not None) else 2
    if len(args) != want:
        raise click.UsageError(f"expected {'PATH' if want == 1 else 'MODEL PATH'}, got "
                               f"{len(args)} argument(s)")
    path = args[-1]
    sock = ipc.bind_socket(path)  # before the load: a taken path fails at once
    # a signal before run_uds takes the signals over ends us with os._exit: the socket too
    lifecycle.remove_on_signal(path)
    try:
        eng = load_server_engine(args[0] if want == 2 else None, quickstart, hub_model,
                                 revision, backend, lora, ctx_size)
    except BaseException:
        sock.close()
        os.unlink(path)
        raise
    click.echo(f"reflex uds: serving {eng.path} ({eng.backend}) on {path}", err=True)
    raise click.exceptions.Exit(ipc.run_uds(eng, sock, path, slot_memory << 20))


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def smoke(as_json):
    """Load the core kernels, run one on the GPU and check its result exactly."""
    from .cuda.smoke import smoke as run_smoke
    from .timing import since_process_start_ms

    r = run_smoke()  # waits for the CUDA start (reflex_core.cuda.start), begun at launch
    ms = since_process_start_ms()
    if as_json:
        click.echo(json.dumps(render.smoke_json(r, ms)))
    else:
        click.echo(render.smoke_status(r, ms))


@cli.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.argument("prompt", required=False)
@click.option("--steps", default=4, show_default=True, type=click.IntRange(min=0),
              help="Single-token decode steps after the prompt batch.")
@click.option("--reference-dequant", type=click.Choice(["auto", "cpu", "gpu"]), default="auto",
              show_default=True,
              help="How the NumPy reference gets float weights: gguf.quants (cpu), or the GPU's "
                   "dequantization, itself checked bit for bit in the same run (gpu; auto picks "
                   "it for files over 2 GiB, where gguf.quants would take minutes).")
@lora_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def check(model, prompt, steps, reference_dequant, lora, as_json):
    """Compare the GPU forward with the NumPy reference (logits at every position) and the GPU
    dequantization of every tensor type in MODEL with gguf.quants (bit for bit)."""
    from . import check as chk, engine

    res = chk.run_check(model, prompt, steps, reference_dequant, lora=lora)
    for note in res.notices:
        engine.warn(note)
    if as_json:
        click.echo(json.dumps(render.check_json(res), indent=1))
    else:
        echo_lines(render.check_lines(res))
    if not res.ok:
        raise click.exceptions.Exit(1)


@cli.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--cold", is_flag=True,
              help="Fresh processes: launch -> first token wall time and GPU joules (NVML).")
@click.option("--system1", "do_system1", is_flag=True,
              help="With --cold: time `reflex system1` (3 candidates) instead of generate.")
@click.option("--prompt", default="The capital of France is", show_default=True)
@click.option("--candidate", "candidates", multiple=True,
              help="system1 candidates (default: ' Paris', ' London', ' Berlin').")
@click.option("-r", "--repeat", type=click.IntRange(min=1), default=None,
              help="Repetitions (warm: 20, cold: 5).")
@click.option("--decode", "n_decode", type=click.IntRange(min=1), default=32, show_default=True,
              help="Warm: decode steps timed after each prefill.")
@click.option("--drop-cache", is_flag=True,
              help="With --cold: drop the page cache before every launch.")
@click.option("--no-warmup", is_flag=True,
              help="With --cold: time the first launch too (by default one untimed launch "
                   "first fills the page cache and writes the file's index).")
@backend_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def bench(model, cold, do_system1, prompt, candidates, repeat, n_decode, drop_cache, no_warmup,
          backend, as_json):
    """Benchmark MODEL: warm latencies (prefill, decode, system1) or --cold launches."""
    from . import bench as b

    if not prompt:
        raise ReflexError("empty prompt: give at least one character of text")
    if prompt == "-":  # generate's PROMPT '-' reads standard input; bench's --prompt is text
        raise click.BadParameter("'-' is no prompt text here (bench reads no standard input)",
                                 param_hint="'--prompt'")
    cands = tuple(candidates) or b.DEFAULT_CANDIDATES
    if cold:
        if backend == "auto":  # the launches get the backend auto would pick here
            from .cuda.driver import probe
            from .engine import warn

            why = probe()
            backend = "cuda" if why is None else "cpu"
            if why is not None:
                warn(f"notice: no usable GPU ({why.without_cpu_hint().split(';')[0]}); "
                     "timing the CPU backend")
        res = b.cold(model, repeat or 5, prompt, do_system1, cands, backend, drop_cache,
                     warmup=not no_warmup)
        if res["n_ok"] == 0:
            tail = " / ".join(res["runs"][0]["tail"]) if res["runs"] else ""
            raise ReflexError(f"every cold run failed; last output: {tail}")
    else:
        if do_system1 or drop_cache or no_warmup:
            raise click.UsageError("--system1, --drop-cache and --no-warmup apply to --cold only")
        res = b.warm(model, backend, prompt, repeat or 20, n_decode, cands)
    if as_json:
        click.echo(json.dumps(res, indent=1))
    else:
        echo_lines(render.bench_lines(res))


@cli.command()
@click.option("--json", "as_json", is_flag=True,
              help="Print a JSON array: one object per plugin.")
def plugins(as_json):
    """List installed architecture plugins, their versions and the architectures they serve."""
    from .registry import get_host

    host = get_host()
    host.load_all()
    infos = host.plugins()
    host.architectures()  # raises on conflicts
    if as_json:
        click.echo(json.dumps(render.plugins_json(infos), indent=2))
    else:
        echo_lines(render.plugins_lines(infos, host.filtered()))


@cli.command("index")
@click.argument("models", nargs=-1, required=True, metavar="MODEL...",
                type=click.Path(dir_okay=False))
@click.option("--out", "out_dir", metavar="DIR", default=None,
              help="Write NAME.rxi into DIR (runs find it with REFLEX_INDEX_DIR=DIR) instead of "
                   "MODEL.rxi beside the model.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def index(models, out_dir, as_json):
    """Precompute each MODEL's index (its parse and tokenizer tables) where an image or a
    read-only model volume carries it: a fresh container's first run is then as fast as its
    second. Runs ignore an index made from other bytes."""
    from . import index_command

    res = index_command.run(list(models), out_dir)
    if as_json:
        click.echo(json.dumps(index_command.as_json(res), indent=1))
    else:
        echo_lines(index_command.lines(res))


# Commands that run on the GPU only: an error's "--backend cpu" advice does not apply to them.
GPU_ONLY = {"smoke": "reflex smoke tests the GPU",
            "check": "reflex check compares the GPU with the CPU reference"}


def error_message(e: ReflexError, argv: list[str]) -> str:
    command = next((a for a in argv if not a.startswith("-")), None)
    if e.cpu_hint and command in GPU_ONLY:
        return f"{e.without_cpu_hint()} ({GPU_ONLY[command]}: it needs an NVIDIA GPU)"
    return str(e)


def wants_json(argv: list[str]) -> bool:
    """--json among the options (not in what follows a ``--``)."""
    return "--json" in (argv[:argv.index("--")] if "--" in argv else argv)


def utf8_stdout() -> None:
    """Text and JSON go out as UTF-8 whatever the stream's encoding (PYTHONIOENCODING, a
    non-UTF-8 locale): a model's text is UTF-8, which llama.cpp prints as it is, and JSON
    between programs is UTF-8 (RFC 8259). In another encoding the first character it lacks
    ended the job with a UnicodeEncodeError and lost its output."""
    enc = (getattr(sys.stdout, "encoding", None) or "").lower().replace("-", "").replace("_", "")
    if enc != "utf8" and hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(encoding="utf-8", errors="replace")


def main(argv: list[str] | None = None) -> NoReturn:
    """Console entry point: run the CLI, map errors to one line + exit status, then end the
    process the fast way (lifecycle.finish: no teardown waited for). Under --json an error is
    also one JSON object on stdout, ``{"error": {"type", "message", "exit_code"}}``."""
    lifecycle.handle_signals()  # done already when started by the console script (_launch)
    mapguard.enable()
    utf8_stdout()
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv or os.environ.get("REFLEX_DEBUG") not in (None, "", "0")
    argv = [a for a in argv if a != "--debug"]  # accepted anywhere on the line
    as_json = wants_json(argv)
    if as_json:
        lifecycle.json_errors()
    code, kind, message = 0, "", ""
    try:
        rv = cli.main(args=argv, prog_name="reflex", standalone_mode=False)
        code = rv if isinstance(rv, int) else 0
    except click.exceptions.Exit as e:
        code = e.exit_code
    except click.ClickException as e:  # usage errors: click's own message, exit 2
        e.show()
        code, kind, message = e.exit_code, "usage", e.format_message()
    except click.exceptions.Abort:
        click.echo("error: aborted", err=True)
        code, kind, message = 1, "aborted", "aborted"
    except ReflexError as e:
        if debug:
            import traceback

            traceback.print_exc()
        message = error_message(e, argv)
        click.echo(f"error: {message}", err=True)
        code, kind = e.exit_code, type(e).__name__
    except KeyboardInterrupt:
        click.echo("error: interrupted", err=True)
        code, kind, message = 130, "interrupted", "interrupted"
    except BrokenPipeError:
        code = 1
    except Exception as e:  # noqa: BLE001 - last line of defence: still one line
        if debug:
            import traceback

            traceback.print_exc()
        msg = str(e).splitlines()[0] if str(e) else ""
        message = (f"internal error: {type(e).__name__}: {msg} "
                   "(rerun with --debug for the traceback)")
        click.echo(f"error: {message}", err=True)
        code, kind = 1, "internal"
    if as_json and kind:
        try:
            click.echo(json.dumps(render.error_json(kind, message, code), ensure_ascii=False))
        except OSError:
            pass
    lifecycle.finish(code)


if __name__ == "__main__":
    main()
