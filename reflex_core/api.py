"""The Python API: ``reflex_core.load(model)`` -> an :class:`Engine` that keeps the model loaded.

    import reflex_core

    with reflex_core.load("model.gguf") as eng:          # or "ORG/NAME[:FILE.gguf]" (the Hub)
        out = eng.generate("The capital of France is", max_tokens=8, stop=["\\n"])
        print(out.text, out.token_ids)
        for piece in eng.generate("Once upon a time", stream=True):
            print(piece, end="")
        best = eng.system1("2 + 2 =", [" 4", " 5"]).best_text

Results carry the fields of the CLI's ``--json`` objects (reflex_core.render.generate_json /
system1_json; ``to_dict()`` is that object) plus ``compute_ms``:
the time this call spent in the process (encoding, forward passes, decoding).

State: ``keep_state=True`` gives the result a :class:`SavedState` (generate: after the last
sampled token, which stays pending; system1: the prompt's prefix, its last token pending -- as
``--export-kv`` writes them); pass one back as ``state=`` to continue from it, write it with
:meth:`Engine.export_state`, read a file with :meth:`Engine.import_state` (or pass its path as
``state=``). A state is checked against the engine's model before use. A generation whose
state is kept and that ends inside a character (``max_tokens`` reached between its bytes) leaves
that character out of its text; a job continuing the state with an empty prompt begins its text
with it whole (as llama.cpp's two outputs join).

Loading is the CLI's cold path (reflex_core.engine.load: CUDA starts first, on a thread). An
engine is for one thread at a time; :meth:`Engine.close` (or leaving the ``with`` block) frees
the GPU memory and unmaps the file.
"""

from __future__ import annotations

import math
import os
import time
import weakref
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Iterator, Sequence, Union

from . import engine, render
from .errors import ReflexError
from .sampling import REPEAT_PENALTY_RANGE, SamplingParams
from .system1 import Candidate, evaluate, tokenize_candidates
from .timing import Timings, since_process_start_ms

PathLike = Union[str, "os.PathLike[str]"]
LoraSpec = Union[str, tuple[str, float]]


@dataclass(frozen=True)
class SavedState:
    """A model state to continue from: the tokens it has processed and ``pending``, the ones
    given to its job but not fed yet (fed first by the job that continues it). ``source``: the
    file it was read from, or ``"<memory>"``."""

    tokens: list[int]
    pending: list[int]
    dumped: dict = field(repr=False)  # State.dump() of one sequence
    source: str
    owner: Any = field(repr=False, compare=False)  # the engine whose model it belongs to

    @property
    def path(self) -> str:  # the name engine.generate's messages use
        return self.source

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)


@dataclass
class Generation:
    """What :meth:`Engine.generate` returns (``to_dict()``: the ``--json`` object)."""

    text: str
    token_ids: list[int]
    prompt_token_ids: list[int]
    n_prompt_tokens: int
    n_tokens: int
    process_start_to_first_token_ms: float
    backend: str
    seed: int | None
    n_prefill: int
    n_imported_tokens: int
    stop_reason: str  # "length", "eog" (end-of-generation token) or "stop" (a stop string)
    compute_ms: float
    state: SavedState | None = None  # with keep_state=True

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "state"}
        return {"status": "ok", **d}


@dataclass
class Scoring:
    """What :meth:`Engine.system1` returns (``to_dict()``: the ``--json`` object)."""

    candidates: list[Candidate]
    best_idx: int
    best_text: str
    entropy: float
    num_candidates: int
    normalize: bool
    backend: str
    n_prefill: int
    n_imported_tokens: int
    process_start_to_result_ms: float
    compute_ms: float
    state: SavedState | None = None  # with keep_state=True: the prompt's prefix

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "state"}
        d["candidates"] = [asdict(c) for c in self.candidates]
        return {"status": "ok", **d}


class GenerationStream:
    """``generate(..., stream=True)``: iterate for the text pieces; once exhausted,
    :attr:`result` is the :class:`Generation`. The engine runs no other job until the stream is
    exhausted, closed or dropped."""

    def __init__(self, steps: Iterator[str], box: list):
        self._steps = steps
        self._box = box  # filled with the Generation at the end (no reference back to self)

    def __iter__(self) -> Iterator[str]:
        return self._steps

    @property
    def result(self) -> Generation | None:
        return self._box[0] if self._box else None

    @property
    def finished(self) -> bool:
        return bool(self._box)

    def close(self) -> None:
        """Stop generating (the result stays None); the engine is free again, whether the
        stream was started or not."""
        self._steps.close()  # type: ignore[attr-defined]


def load(model: PathLike | None = None, *, backend: str = "auto",
         lora: Sequence[LoraSpec] = (), revision: str | None = None,
         ctx_size: int = 0) -> "Engine":
    """Load ``model`` and return an :class:`Engine`.

    ``model``: a local GGUF path; or, when no such file exists, a Hugging Face repository
    ``"ORG/NAME"`` or ``"ORG/NAME:FILE.gguf"`` (fetched into the HF cache, as ``--model``
    does; ``revision`` a branch, tag or commit); None: the default model (``--quickstart``).
    ``backend``: "auto" (the GPU when there is one), "cuda" or "cpu". ``lora``: adapters merged
    at load, each ``"FILE.gguf[:SCALE]"`` or ``(path, scale)``. ``ctx_size``: the context every
    job must fit, in tokens (``-c``; 0: the model's context length; more than it runs, with a
    notice in :attr:`Engine.notices`)."""
    return load_for_process(model, backend=backend, lora=lora, revision=revision, one_shot=False,
                            ctx_size=ctx_size)


def load_for_process(model: PathLike | None, *, backend: str, lora: Sequence[LoraSpec],
                     revision: str | None, one_shot: bool, ctx_size: int = 0) -> "Engine":
    """:func:`load`; ``one_shot``: the engine lives as long as the process, which ends through
    reflex_core.lifecycle.finish (the CLI's servers): the weights' host pages stay pinned and
    the file's missing index is written at exit, as for a one-shot command."""
    _check(_is_int(ctx_size) and ctx_size >= 0, "ctx_size must be an integer >= 0")
    if isinstance(lora, (str, os.PathLike)):  # one adapter
        lora = [lora]
    _check(isinstance(lora, (list, tuple)), "lora must be a list of adapters")
    if backend in ("auto", "cuda"):  # first: the Hub look-up and the imports overlap with it
        from .cuda.start import start

        start()
    t = Timings()
    path = _resolve_model(model, revision, t)
    pairs = [_lora_pair(x) for x in lora]
    lm, _ = engine.load(path, backend, t, one_shot=one_shot, lora=pairs)
    return Engine(lm, t, int(ctx_size))


def _resolve_model(model: PathLike | None, revision: str | None, t: Timings) -> str:
    if model is None:
        from . import hub

        with t.span("resolve model on the Hub"):
            return hub.resolve(None, revision=revision, quickstart=True)
    path = _path_arg(model, "model", "a path or a Hub repository name")
    local = (os.path.exists(path) or os.path.isabs(path) or path.startswith((".", "~"))
             or path.partition(":")[0].lower().endswith(".gguf") or path.count("/") != 1)
    if local:
        if revision is not None:
            raise ReflexError("revision= applies to a Hub repository, not to a local file")
        return path
    from . import hub

    with t.span("resolve model on the Hub"):
        return hub.resolve(path, revision=revision)


def _lora_pair(x: LoraSpec) -> tuple[str, float]:
    if isinstance(x, (str, os.PathLike)):
        from .lora import parse_lora_arg

        return parse_lora_arg(_path_arg(x, "lora", "a path"))
    if (isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], (str, os.PathLike))
            and isinstance(x[1], (int, float)) and not isinstance(x[1], bool)
            and math.isfinite(x[1])):
        return _path_arg(x[0], "lora", "a path"), float(x[1])
    raise ParamError(f"lora: {x!r} is neither 'FILE.gguf[:SCALE]' nor (path, scale)")


def _path_arg(x: Any, name: str, what: str) -> str:
    """``x`` (a str or os.PathLike) as a path that the system calls take, else ParamError."""
    path = os.fspath(x) if isinstance(x, (str, os.PathLike)) else None
    if not isinstance(path, str):
        raise ParamError(f"{name} must be {what}, not {type(x).__name__}")
    if "\0" in path:
        raise ParamError(f"{name}: the path holds a NUL byte")
    try:
        os.fsencode(path)
    except UnicodeEncodeError:
        raise ParamError(f"{name}: {path!r} is not valid text for a path") from None
    return path


class Engine:
    """A loaded model. Make it with :func:`load`."""

    def __init__(self, lm: engine.Loaded, load_timings: Timings, ctx_size: int = 0):
        self._lm: engine.Loaded | None = lm
        self._load_timings = load_timings
        # the generator of the last GenerationStream: the engine is its until it is exhausted,
        # closed or dropped (the generator itself, which a caller's iter() may outlive the
        # stream object with)
        self._stream: weakref.ref | None = None
        self.path: str = lm.path
        self.arch: str = lm.arch
        self.backend: str = lm.backend  # "cuda" or "cpu" (what "auto" chose)
        self.device: str = lm.device
        self.notices: list[str] = list(lm.notices)  # e.g. the fall back to the CPU
        self.lora: list[str] = list(lm.lora)
        self.n_ctx_train: int = int(lm.model.n_ctx_train or 0)
        # the context each job must fit (load's ctx_size; 0: the model's context length)
        self.ctx_size: int = ctx_size
        self.n_vocab: int = int(lm.model.n_vocab or 0)
        note = engine.context_notice(lm, ctx_size, f"ctx_size {ctx_size}")
        if note:
            self.notices.append(note)

    # ---------------------------------------------------------------------------- life

    def close(self) -> None:
        """Free the GPU memory (weights, pinned pages) and unmap the file; idempotent. A stream
        still running is closed first (its result stays None)."""
        steps = self._stream() if self._stream is not None else None
        if steps is not None:
            steps.close()
        lm, self._lm = self._lm, None
        if lm is not None:
            lm.close()

    @property
    def closed(self) -> bool:
        return self._lm is None

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def timings(self) -> list[tuple[str, float, float]]:
        """The load's phases: (name, ms from the process start, duration ms), in start order
        (what ``--timings`` prints)."""
        return self._load_timings.report()

    @property
    def timing_notes(self) -> dict[str, str]:
        """Details of the load (index hit or miss, CUDA init steps, upload figures)."""
        return dict(self._load_timings.notes)

    def _loaded(self) -> engine.Loaded:
        if self._lm is None:
            raise ReflexError("this engine is closed")
        steps = self._stream() if self._stream is not None else None
        if steps is not None and steps.gi_frame is not None:  # started or not, still open
            raise ReflexError("a streamed generation of this engine is still running: "
                              "exhaust or close() it first")
        return self._lm

    # ---------------------------------------------------------------------------- text

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        """Token ids of ``text`` (``add_special``: with BOS where the model adds one)."""
        _check(isinstance(text, str), "text must be a string")
        _check(isinstance(add_special, bool), "add_special must be true or false")
        return self._loaded().require_tokenizer().encode(text, add_special=add_special)

    def detokenize(self, token_ids: Sequence[int]) -> str:
        """The text of ``token_ids`` (invalid UTF-8 becomes U+FFFD)."""
        tok = self._loaded().require_tokenizer()
        _check(isinstance(token_ids, (list, tuple)), "token_ids must be a list of integers")
        ids = list(token_ids)
        _check(all(_is_int(i) and 0 <= i < tok.n_vocab for i in ids),
               f"token_ids must be integers in [0, {tok.n_vocab})")
        return tok.decode(ids)

    # ---------------------------------------------------------------------------- jobs

    def generate(self, prompt: str, max_tokens: int = 32, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
                 stop: str | Sequence[str] | None = None, stream: bool = False, *,
                 state: SavedState | PathLike | None = None, keep_state: bool = False,
                 chat: bool = False, system: str | None = None, min_p: float = 0.0,
                 repeat_penalty: float = 1.0, repeat_last_n: int = 64
                 ) -> Generation | GenerationStream:
        """Continue ``prompt`` by up to ``max_tokens`` tokens (fewer at an end-of-generation
        token or a ``stop`` string, which the text then ends before). ``temperature`` 0 is
        greedy; ``seed`` makes sampling reproducible (None or negative: a random one, reported);
        ``min_p`` (0 = off), ``repeat_penalty`` (1 = off) over the last ``repeat_last_n`` tokens
        (-1 = all) as llama.cpp's (:mod:`reflex_core.sampling`). ``stream``: return a
        :class:`GenerationStream` of text pieces instead. ``state``: continue a saved state
        (``prompt`` may then be empty); ``keep_state``: the result carries the state after the
        job (``max_tokens`` may then be 0: the prompt alone, a prefix). ``chat``: ``prompt``
        (and ``system``) go through the model's chat template first."""
        t0 = time.perf_counter()
        lm = self._loaded()
        _check(isinstance(prompt, str), "prompt must be a string")
        _check(_is_int(max_tokens) and max_tokens >= (0 if keep_state else 1),
               "max_tokens must be an integer >= 1 (0 only with keep_state)")
        _check(_is_num(temperature) and temperature >= 0, "temperature must be a number >= 0")
        _check(_is_int(top_k) and top_k >= 0, "top_k must be an integer >= 0")
        _check(_is_num(top_p) and 0 < top_p <= 1, "top_p must be a number in (0, 1]")
        _check(seed is None or _is_int(seed), "seed must be an integer or None")
        _check(_is_num(min_p) and 0 <= min_p <= 1, "min_p must be a number in [0, 1]")
        lo, hi = REPEAT_PENALTY_RANGE
        _check(_is_num(repeat_penalty) and lo <= repeat_penalty <= hi,
               f"repeat_penalty must be a number in [{lo:g}, {hi:g}]")
        _check(_is_int(repeat_last_n) and repeat_last_n >= -1,
               "repeat_last_n must be an integer >= -1")
        _check(isinstance(stream, bool), "stream must be true or false")
        _check(isinstance(keep_state, bool), "keep_state must be true or false")
        _check(stop is None or isinstance(stop, (str, list, tuple)),
               "stop must be a non-empty string or a list of them")
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        _check(all(isinstance(s, str) and s for s in stops),
               "stop must be a non-empty string or a list of them")
        saved = self._state(state)
        text = self._chat(prompt, chat, system)
        if not text and saved is None:
            raise ReflexError("empty prompt: give at least one character of text")
        # a chat template writes its own BOS where it wants one
        ids = (lm.require_tokenizer().encode(text, add_special=saved is None and not chat)
               if text else [])
        sampling = SamplingParams(float(temperature), top_k, float(top_p), seed, float(min_p),
                                  float(repeat_penalty), repeat_last_n)
        steps = engine.generate_steps(lm, ids, max_tokens, sampling, stream, resume=saved,
                                      keep_state=keep_state, stop=stops, ctx_size=self.ctx_size)
        if not stream:
            while True:
                try:
                    next(steps)
                except StopIteration as done:
                    return self._generation(done.value, keep_state, t0)
        box: list = []
        gen = self._streamed(steps, box, keep_state, t0)
        self._stream = weakref.ref(gen)
        return GenerationStream(gen, box)

    def _streamed(self, steps, box: list, keep_state: bool, t0: float) -> Iterator[str]:
        try:
            res = yield from steps
            box.append(self._generation(res, keep_state, t0))
        finally:  # exhausted, failed, closed or dropped: the engine is free again
            self._stream = None

    def _generation(self, res: engine.GenerateResult, keep_state: bool, t0: float) -> Generation:
        lm = self._lm
        assert lm is not None
        d = render.generate_json(res, lm.backend)
        del d["status"]
        kept = (SavedState(res.fed, res.pending, res.state.dump(), "<memory>", self)
                if keep_state else None)
        return Generation(**d, compute_ms=(time.perf_counter() - t0) * 1e3, state=kept)

    def system1(self, prompt: str, candidates: Sequence[str], normalize: bool = False, *,
                state: SavedState | PathLike | None = None, keep_state: bool = False,
                chat: bool = False, system: str | None = None) -> Scoring:
        """Score each candidate continuation of ``prompt`` (log-probability sums, their softmax
        over the candidates) in one forward pass. ``normalize``: divide by the token count
        before the softmax. ``state``/``keep_state``/``chat``: as for :meth:`generate` (the
        kept state is the prompt's prefix, its last token pending)."""
        t0 = time.perf_counter()
        lm = self._loaded()
        _check(isinstance(prompt, str), "prompt must be a string")
        _check(isinstance(candidates, (list, tuple))
               and all(isinstance(c, str) for c in candidates),
               "candidates must be a list of strings")
        _check(isinstance(normalize, bool), "normalize must be true or false")
        _check(isinstance(keep_state, bool), "keep_state must be true or false")
        cands = list(candidates)
        saved = self._state(state)
        text = self._chat(prompt, chat, system)
        if not text and saved is None:
            raise ReflexError("empty prompt: system1 needs a prompt to condition on")
        tok = lm.require_tokenizer()
        cand_ids = tokenize_candidates(tok, cands)  # refuses an empty list or candidate first
        if text and hasattr(tok, "prepare"):
            tok.prepare([text, *cands])
        ids = tok.encode(text, add_special=saved is None and not chat) if text else []
        past: list[int] = []
        if saved is not None:
            past, ids = list(saved.tokens), list(saved.pending) + ids
        prefix: list[dict] = []
        res = evaluate(lm.model, lm.ops, ids, cands, cand_ids, bool(normalize),
                       None if saved is None else saved.dumped,
                       prefix.append if keep_state else None, self.ctx_size)
        d = render.system1_json(res, since_process_start_ms(), bool(normalize), lm.backend)
        del d["status"]
        d["candidates"] = list(res.candidates)
        kept = (SavedState(past + ids[:-1], ids[-1:], prefix[0], "<memory>", self)
                if keep_state else None)
        return Scoring(**d, compute_ms=(time.perf_counter() - t0) * 1e3, state=kept)

    # ---------------------------------------------------------------------------- state

    def import_state(self, path: PathLike) -> SavedState:
        """Read a state file (``--export-kv``, :meth:`export_state`), checked against this
        engine's model (architecture, file fingerprint, LoRA adapters, state dtype)."""
        from . import statefile

        lm = self._loaded()
        saved = statefile.read(_path_arg(path, "state", "a state file's path"))
        statefile.check_model(saved, lm)
        return SavedState(list(saved.tokens), list(saved.pending), saved.dumped, saved.path,
                          self)

    def export_state(self, state: SavedState, path: PathLike) -> int:
        """Write ``state`` to the file ``path`` (atomically; ``--import-kv`` reads it).
        Returns the file's size in bytes."""
        from . import statefile

        lm = self._loaded()
        self._check_owner(state)
        target = _path_arg(path, "path", "a file path")
        statefile.check_target(target)
        return statefile.write(target, lm, state.dumped, state.tokens, state.pending)

    def _state(self, state: SavedState | PathLike | None) -> SavedState | None:
        if state is None:
            return None
        if isinstance(state, SavedState):
            self._check_owner(state)
            return state
        if isinstance(state, (str, os.PathLike)):
            return self.import_state(state)
        raise ParamError("state must be a SavedState, a state file's path or None")

    def _check_owner(self, state: SavedState) -> None:
        if not isinstance(state, SavedState):
            raise ParamError("state must be a SavedState (from keep_state=True or "
                              "import_state)")
        if state.owner is not self:
            raise ReflexError("this state belongs to another engine: export it to a file and "
                              "import that (the file is checked against this model)")

    def _chat(self, prompt: str, chat: bool, system: str | None) -> str:
        _check(isinstance(chat, bool), "chat must be true or false")
        _check(system is None or isinstance(system, str), "system must be a string")
        if not chat:
            _check(system is None, "system= applies with chat=True only")
            return prompt
        from .chat import render_chat

        return render_chat(self._loaded().gguf, prompt, system=system)

    def __repr__(self) -> str:
        return (f"<reflex Engine {self.path} arch={self.arch} backend={self.backend}"
                f"{' closed' if self.closed else ''}>")


class ParamError(ReflexError):
    """An argument of the wrong type or out of range."""


def _check(ok: bool, msg: str) -> None:
    if not ok:
        raise ParamError(msg)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x: Any) -> bool:
    if not isinstance(x, (int, float)) or isinstance(x, bool):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:  # an integer past the float range
        return False
