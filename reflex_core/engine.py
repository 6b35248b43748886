"""Load a model and run one job (generate, system1): the layer between the CLI and everything else.

The load path is the product's cold path. Its order is deliberate:

1. CUDA initialisation starts first, on a background thread (cuInit and the primary context
   through ctypes, GIL released, ~0.16 s; then the device's kernel cubins), started by the
   console entry point before the CLI is even imported; everything below overlaps with it;
2. the GGUF header, metadata and tensor directory are parsed (core reader, no numpy) -- or
   taken from the file's cached index (reflex_core.gguf_index);
3. the architecture's plugin is resolved and only that plugin is imported;
4. the tokenizer is built and the prompt encoded (prompt-scoped BPE; the index's tables);
5. while the driver is still starting, cuda-bindings and the CUDA backend are imported;
6. once CUDA is ready the weights go to the GPU from the mmap (pinned chunk by chunk on a few
   threads, each chunk copied as soon as it is pinned) while the model binds its weights;
7. the first forward pass runs.

Nothing here imports numpy, gguf or huggingface_hub unless the CPU backend is chosen.
"""

from __future__ import annotations

import collections
import itertools
import os
import random
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Iterator, Sequence

from .background import Background
from .cuda.start import start as start_cuda
from .errors import CudaUnavailable, ModelError, ReflexError, UnsupportedTensorType
from .sampling import SamplingParams
from .state import State
from .timing import Timings, since_process_start_ms

BACKENDS = ("auto", "cuda", "cpu")


@dataclass
class Loaded:
    path: str
    gguf: Any
    arch: str
    model: Any
    ops: Any
    tokenizer: Any
    backend: str
    device: str = ""
    notices: list[str] = field(default_factory=list)
    prefetch: Any = None  # the page-cache prefetch thread (Background), joined by close()
    # the merged LoRA adapters, as "<content fingerprint>*<scale>" (state files record them)
    lora: list[str] = field(default_factory=list)

    def close(self) -> None:
        """Free the model's backend resources (GPU weights, pinned pages) and unmap the file.
        The loaded model cannot run afterwards."""
        if self.prefetch is not None:  # it reads the mapping about to go away
            self.prefetch.wait()
            self.prefetch = None
        release = getattr(self.ops, "release", None)
        if release is not None:
            release()
        self.model = None
        self.gguf.close()

    def __enter__(self) -> "Loaded":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def require_tokenizer(self):
        if self.tokenizer is None:
            raise ReflexError(f"{self.path}: this model has no tokenizer "
                              "(tokenizer.ggml.model is 'none'); text prompts cannot be encoded")
        return self.tokenizer


def _tokenizer_or_none(g: Any) -> Any:
    model = g.get("tokenizer.ggml.model")
    if model in (None, "none"):
        return None
    from .modelfile import load_tokenizer

    return load_tokenizer(g)


def prefetch(g: Any, notes: dict[str, str] | None = None) -> Background:
    """Read the tensor data into the page cache on a background job (reflex_core.readahead: in
    the order the upload pins it, 2 MiB folios, 8 threads once a chunk is found not cached):
    with a cold page cache the disk reads overlap CUDA init and stay ahead of the upload; with
    a warm one one thread only maps the pages (~0.7 ms per GB on the dev VM), so the later
    cuMemHostRegister finds its page tables filled. ``notes`` (--timings) gets a "readahead"
    line, rewritten when the pass ends."""
    if notes is not None:
        notes["readahead"] = "still running"  # the key exists before the job rewrites it

    def run() -> None:
        from .cuda.upload import buffer_address  # plain ctypes; imports no CUDA
        from .readahead import Readahead

        base, total = buffer_address(g.mm)
        ra = Readahead(base + g.data_offset, base + total).run()
        if notes is not None:
            notes["readahead"] = ra.note()

    return Background(run)


def _preimport_cuda() -> None:
    from .cuda import driver

    try:
        driver.bindings()
    except CudaUnavailable:
        return  # the init thread reports it
    from .backends import cuda_backend  # noqa: F401
    from .cuda import quant_ops  # noqa: F401


# Rates of the NumPy reference backend, measured on the 2-core dev VM with a Qwen3-0.6B-shaped
# Q8_0 file (0.60 G weights): its first forward dequantizes every weight to a float32 cache
# (~24-32 s: ~25 M weights/s), then each token reads that cache (~1.2 s: ~2.5 GB/s). Its peak
# memory was 3.47 GiB: the cache, the mapped file and the largest tensor's float32 copy in
# flight (2.24 + 0.60 + 0.58).
CPU_DEQUANT_WEIGHTS_PER_S = 25e6
CPU_READ_BYTES_PER_S = 2.5e9
CPU_NOTICE_MIN_S = 3.0  # smaller jobs are not worth a notice


def cpu_estimate(g: Any) -> str | None:
    """The CPU backend's one notice: it is the reference path, and roughly how slow and how
    large it will be for this file (None for a file that takes only seconds)."""
    n = sum(t.n_elements for t in g.tensors.values())
    first = n / CPU_DEQUANT_WEIGHTS_PER_S
    if first < CPU_NOTICE_MIN_S:
        return None
    per_token = 4 * n / CPU_READ_BYTES_PER_S
    largest = max(t.n_elements for t in g.tensors.values())
    memory = 4 * n + len(g.mm) + 4 * largest
    return (f"notice: the CPU backend is the NumPy reference path, for checking rather than "
            f"speed: for this file ({n / 1e9:.2f} G weights) expect roughly {first:.0f} s to "
            f"the first token, {per_token:.1f} s per token after it and {memory / 2**30:.1f} GiB "
            f"of memory (a 2-core machine's rates)")


def load(path: str, backend: str = "auto", timings: Timings | None = None,
         prompt: str | None = None, texts: Sequence[str] = (),
         one_shot: bool = False,
         continuation: bool = False,
         lora: Sequence[tuple[str, float]] = (),
         chat: dict[str, Any] | None = None) -> tuple[Loaded, list[int] | None]:
    """Open ``path`` and build its model on ``backend``; also encode ``prompt`` when given.

    ``texts`` are other strings the job will encode (system1 candidates): the tokenizer prepares
    for them together with the prompt. ``one_shot``: the process exits after this job, so the
    GPU upload skips unpinning the mmap pages. ``continuation``: the prompt continues an
    imported state, so it gets no BOS. ``lora``: (adapter path, scale) pairs, merged into the
    weights in order once they are on the backend (reflex_core.lora). ``chat``: ``prompt`` is one
    user message, rendered with the file's chat template first (the dict: render_chat's keyword
    arguments, e.g. ``{"system": ...}``); the rendered text writes its own special tokens, so it
    gets no BOS from the tokenizer (reflex_core.chat). Returns (loaded, prompt_ids)."""
    t = timings or Timings()
    if backend not in BACKENDS:
        raise ReflexError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    # Python work on the main thread competes for the GIL with the CUDA init thread's short
    # Python steps between driver calls: hand the GIL over sooner than the default 5 ms.
    sys.setswitchinterval(0.0005)

    cuda_init = start_cuda() if backend in ("auto", "cuda") else None

    from .modelfile import open_model_file

    with t.span("parse gguf"):
        g = open_model_file(path)
    if one_shot and g.index_state == "miss":
        from . import gguf_index

        gguf_index.keep(g)  # its index is written at exit
    t.notes["gguf index"] = g.index_note  # which index: prebuilt, user cache, none
    # Only where the weights go to the GPU: the CPU backend reads them lazily, as it goes.
    pref = prefetch(g, t.notes) if cuda_init is not None else None
    arch = g.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        what = "missing" if arch is None else "not a string"
        raise ReflexError(f"{path}: general.architecture is {what}; is this a model GGUF?")
    adapters: list = []
    if lora:  # checked against the base before any weight moves
        from . import lora as lora_mod

        with t.span("open LoRA adapters"):
            adapters = lora_mod.open_adapters(lora, g)

    with t.span("resolve plugin"):
        from .registry import get_host

        spec = get_host().resolve(arch)
        model_cls = spec.load_model_class()
    lora_notices: list[str] = []
    if adapters:
        adapters, lora_notices = lora_mod.applied(adapters, model_cls.lora_applies)
    if cuda_init is not None:  # kernels of the plugin's own ops load on the CUDA thread too
        from . import opreg

        for package in sorted(opreg.kernel_packages()):
            cuda_init.load_package(package)

    # The tokenizer and the prompt's encoding: GIL-bound work, done while CUDA initialises.
    prompt_ids: list[int] | None = None
    with t.span("tokenizer"):
        tok = _tokenizer_or_none(g)
    if prompt is not None:
        if tok is None:
            raise ReflexError(f"{path}: this model has no tokenizer; text prompts cannot be "
                              "encoded")
        if chat is not None:
            from .chat import render_chat

            with t.span("render chat template"):
                prompt = render_chat(g, prompt, **chat)
        with t.span("encode prompt"):
            if hasattr(tok, "prepare"):
                tok.prepare([prompt, *texts])
            prompt_ids = tok.encode(prompt, add_special=not (continuation or chat is not None),
                                    parse_special=True)

    notices: list[str] = lora_notices
    device_name = ""
    chosen = backend
    if cuda_init is not None:
        if cuda_init.starting():
            # The driver is still starting on its thread (GIL released): import what the GPU
            # path needs next now, off that chain -- cuda-bindings (~20-40 ms of import work)
            # and the CUDA backend's modules.
            with t.span("import CUDA backend"):
                _preimport_cuda()
        with t.span("wait for CUDA context"):
            try:
                device = cuda_init.wait()
                chosen = "cuda"
                device_name = device.name
            except CudaUnavailable as e:
                if backend == "cuda":
                    raise
                chosen = "cpu"
                notices.append(f"notice: no usable GPU ({str(e).split(';')[0]}); "
                               "running on the CPU backend")
        t.phases.setdefault("CUDA init (thread)", cuda_init.span())

    from .backends import get_backend

    if chosen == "cpu":
        note = cpu_estimate(g)
        if note:
            notices.append(note)
    ops = get_backend(chosen)
    with t.span("weights to backend"):
        if chosen == "cuda":  # the copy runs on threads while the model binds its weights
            ops.attach(g, keep_pinned=one_shot, wait=False)
        else:
            ops.attach(g)
    lora_ids: list[str] = []
    if adapters:  # before binding, so the model binds the merged weights
        from .statefile import fingerprint

        lora_ids = [f"{fingerprint(a.gguf)}*{a.user_scale!r}" for a in adapters]
        try:
            with t.span("merge LoRA adapters"):  # on the GPU: after the upload
                ops.merge_lora(adapters)
        finally:
            lora_mod.close_all(adapters)
    with t.span("bind weights"):
        try:
            model = model_cls.load(g, ops)
        except (ModelError, UnsupportedTensorType) as e:
            # a tensor's error names the tensor; the user also needs to know which file
            if not str(e).startswith((str(path), str(getattr(g, "path", path)))):
                raise type(e)(f"{path}: {e.without_cpu_hint()}", cpu_hint=e.cpu_hint) from None
            raise
    if chosen == "cuda":
        # The whole upload, before any forward: a forward queued beside it (each launch waiting on
        # the device for its chunks) gained nothing on the H200, whose driver stalls that
        # forward's calls behind the upload's page pinning (BENCHMARKS.md, twentieth session).
        with t.span("wait for the upload"):
            try:
                ops.wait_attached()
            except ReflexError:
                # the driver pins the pages in the kernel: a file cut short under us is an
                # error code there, not a SIGBUS (reflex_core.mapguard)
                from .mapguard import check_unchanged

                check_unchanged(g.path, len(g.mm))
                raise
    if cuda_init is not None and chosen == "cuda":
        from .cuda.driver import INIT_STEPS

        t.phases.setdefault("CUDA modules (thread)", cuda_init.modules_span())
        t.notes["CUDA init"] = ", ".join(f"{k} {v:.1f}" for k, v in INIT_STEPS.items())
        if cuda_init.loaded_on:
            t.notes["plugin kernels"] = ", ".join(f"{p} (loaded on the {w})"
                                                  for p, w in cuda_init.loaded_on.items())
    info = getattr(ops, "upload_info", None)
    if info:
        t.notes["upload"] = ", ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
                                      for k, v in info.items())
    sys.setswitchinterval(0.005)
    # The prefetch is not joined here: its pass over pages the upload has already pinned grows
    # with the file and would sit on the first token's path. It only reads the mapping, which
    # stays until Loaded.close() joins it (a one-shot process exits with os._exit, ending it).
    return (Loaded(path, g, arch, model, ops, tok, chosen, device_name, notices, pref, lora_ids),
            prompt_ids)


# --------------------------------------------------------------------------------------------
# generate


@dataclass
class GenerateResult:
    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    first_token_ms: float  # process start -> first generated token id on the host (-n 0: prefill done)
    seed: int | None
    n_prefill: int = 0  # tokens fed in the first forward (an imported file's pending ones included)
    n_imported: int = 0  # tokens already in the imported state
    # with keep_state: what --export-kv writes (the state, every token id it has processed, and
    # those given to the job but not fed: the last sampled one, or with -n 0 the prompt's last)
    state: Any = None
    fed: list[int] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)
    # why decoding ended: "length" (n_new tokens), "eog" (an end-of-generation token), "stop" (a
    # stop string; ``text`` ends before it, ``token_ids`` include the token that completed it)
    stop_reason: str = "length"


def context_notice(lm: Loaded, ctx_size: int, what: str) -> str | None:
    """The notice for a context size (``what``, as the user gave it) above the model's training
    context, which runs as llama.cpp runs it, with a warning; None when it is not above."""
    if not ctx_size:
        return None
    trained = int(lm.model.n_ctx_train or 0)
    if not (trained and ctx_size > trained):
        return None
    return (f"notice: {what} is larger than the model's context length ({trained} tokens): "
            f"positions past it are ones the model was not trained on")


def fit_context(lm: Loaded, prompt_ids: Sequence[int], n_new: int, ctx_size: int = 0,
                truncate: bool = False, resume: Any = None) -> tuple[list[int], int, list[str]]:
    """Size a generate job to its context: (prompt ids, tokens to generate, notices).

    The context is ``ctx_size`` tokens (0: the model's training context; more than it runs, with
    a notice, as llama.cpp runs with a warning). ``n_new`` -1 means "until the end of the text or
    of the context": every cell left after the prompt. A prompt that does not fit with ``n_new``
    tokens after it is an error, or with ``truncate`` loses its oldest tokens (a leading BOS is
    kept: the model was trained with it in front). Pass ``ctx_size`` on to :func:`generate`."""
    trained = int(lm.model.n_ctx_train or 0)
    notices = []
    note = context_notice(lm, ctx_size, f"-c {ctx_size}")
    if note:
        notices.append(note)
    limit = ctx_size or trained
    n_past = len(resume.tokens) if resume is not None else 0
    n_pending = len(resume.pending) if resume is not None else 0
    prompt = list(prompt_ids)
    if limit == 0:
        if n_new < 0:
            raise ReflexError(f"{lm.path}: the file states no context length; -n -1 needs "
                              "-c/--ctx-size")
        return prompt, n_new, notices
    where = "the context size (-c)" if ctx_size else "the model's context length"
    used = n_past + n_pending + len(prompt)
    want = max(n_new, 1)  # -n -1 wants room for one token at least
    if used + want > limit:
        past = f"the imported state ({n_past + n_pending} tokens) + " if resume is not None else ""
        if not truncate or n_past + n_pending + want >= limit:
            if n_past + n_pending + want >= limit:  # no cut of the prompt makes room
                hint = "; ask for fewer new tokens (-n) or a larger context (-c)"
            else:
                hint = "; shorten the prompt or give --truncate"
            raise ReflexError(f"{past}prompt ({len(prompt)} tokens) + {want} new tokens exceeds "
                              f"{where} ({limit} tokens){hint}")
        tok = lm.tokenizer
        bos = tok.bos_id if tok is not None else None
        head = prompt[:1] if prompt and bos is not None and prompt[0] == bos else []
        keep = limit - want - n_past - n_pending - len(head)
        dropped = len(prompt) - len(head) - keep
        prompt = head + prompt[len(prompt) - keep:]
        notices.append(f"notice: the prompt ({used - n_past - n_pending} tokens) was cut to its "
                       f"last {keep}{' after the BOS' if head else ''} ({dropped} dropped) to "
                       f"fit {where} ({limit} tokens)")
        used = n_past + n_pending + len(prompt)
    return prompt, (limit - used if n_new < 0 else n_new), notices


PREFILL_CHUNK = 256  # tokens per forward when a prefill reports its progress


def check_context(lm: Loaded, n_prompt: int, n_new: int, n_imported: int = 0,
                  ctx_size: int = 0) -> None:
    """The job must fit ``ctx_size`` tokens (:func:`fit_context`'s), else the model's context
    length."""
    limit = ctx_size or lm.model.n_ctx_train
    if limit and n_imported + n_prompt + n_new > limit:
        past = f"the imported state ({n_imported} tokens) + " if n_imported else ""
        where = "the context size (-c)" if ctx_size else "the model's context length"
        raise ReflexError(f"{past}prompt ({n_prompt} tokens) + {n_new} new tokens exceeds "
                          f"{where} ({limit} tokens)")


def generate(lm: Loaded, prompt_ids: Sequence[int], n_new: int, sampling: SamplingParams,
             on_text: Callable[[str], None] | None = None,
             timings: Timings | None = None, resume: Any = None,
             keep_state: bool = False, stop: Sequence[str] = (),
             on_prefill: Callable[[int, int], None] | None = None,
             ctx_size: int = 0) -> GenerateResult:
    """Prefill the prompt as one batch, then decode up to ``n_new`` tokens (stopping at an
    end-of-generation token, or once the text contains one of ``stop``: the text then ends
    before it). ``on_text`` receives text as soon as it is complete UTF-8 (and, with ``stop``,
    as soon as it cannot be the start of a stop string).

    ``resume`` (a statefile.Saved, checked against the model): start from its state and feed
    its pending tokens + ``prompt_ids`` as the first batch. ``keep_state``: the result carries
    the final state and its token ids (for --export-kv); ``n_new`` may then be 0: the prompt
    but its last token is fed and that token stays pending (a prefix file).

    ``on_prefill(done, total)``: a prompt longer than PREFILL_CHUNK tokens is fed in chunks of
    that many, and this is called after each (progress for a slow backend; the chunks' results
    equal one batch's up to float rounding).

    ``ctx_size``: the job's context as :func:`fit_context` sized it (0: the model's context
    length), which it must fit."""
    steps = generate_steps(lm, prompt_ids, n_new, sampling, on_text is not None, timings, resume,
                           keep_state, stop, on_prefill, ctx_size)
    while True:
        try:
            piece = next(steps)
        except StopIteration as done:
            return done.value
        on_text(piece)  # type: ignore[misc]  # pieces come only when on_text is given


def generate_steps(lm: Loaded, prompt_ids: Sequence[int], n_new: int, sampling: SamplingParams,
                   stream: bool = False, timings: Timings | None = None, resume: Any = None,
                   keep_state: bool = False, stop: Sequence[str] = (),
                   on_prefill: Callable[[int, int], None] | None = None, ctx_size: int = 0
                   ) -> Generator[str, None, GenerateResult]:
    """:func:`generate` as a generator: yields the text pieces (when ``stream``) and returns
    the GenerateResult, so that a caller can iterate over the text (the Python API's
    ``stream=True``) with the decode loop still on its own thread, where the backend lives."""
    t = timings or Timings()
    past = list(resume.tokens) if resume is not None else []
    feed = (list(resume.pending) if resume is not None else []) + list(prompt_ids)
    if not feed:
        if resume is not None:
            raise ReflexError(f"{resume.path} has no pending token and the prompt is empty: "
                              "give a prompt to continue with")
        raise ReflexError("empty prompt: give at least one character of text")
    if n_new < 0 or (n_new == 0 and not keep_state):
        raise ReflexError("-n must be at least 1")
    stops = list(stop)
    if any(not isinstance(s, str) or not s for s in stops):
        raise ReflexError("every stop string must be a non-empty string")
    tok = lm.tokenizer
    if stops and tok is None:
        raise ReflexError(f"{lm.path}: this model has no tokenizer, so its output has no text "
                          "to look for stop strings in")
    check_context(lm, len(feed), n_new, len(past), ctx_size)
    model, ops = lm.model, lm.ops
    seed = sampling.seed
    if not sampling.greedy and (seed is None or seed < 0):  # -1: random, as llama.cpp's
        seed = random.SystemRandom().randrange(2**31)
    rng = random.Random(seed)
    # A job that continues a state with no prompt of its own continues its text too: where that
    # ended inside a character (a job stopped by -n between its tokens' bytes), this job's first
    # bytes finish it, and a job whose state is kept leaves such an end to the one continuing.
    lead = (tok.unfinished(past + feed) if tok is not None and resume is not None
            and not prompt_ids else b"")
    # Text is decoded as it comes when someone reads it: the caller, or the stop-string check.
    text_out = (_TextOut(tok, stops, stream, lead) if tok is not None and (stream or stops)
                else None)
    eog = tok.eog_ids if tok is not None else frozenset()

    def pick(logits) -> int:
        # the penalty window: the context so far (imported, fed, generated), oldest first
        penalised = sampling.penalised_ids(past, feed, out)
        if penalised:  # none when the penalty is off: no launch
            ops.repeat_penalty(logits, penalised, sampling.repeat_penalty)
        if sampling.greedy:
            return ops.argmax(logits)[-1]
        return ops.sample(logits, sampling.temperature, sampling.top_k, sampling.top_p,
                          rng.random(), sampling.min_p)

    n_cells = len(past) + len(feed) + n_new
    state = (model.new_state(n_cells) if resume is None
             else State.load(model.state_spec(), ops, resume.dumped, n_cells))
    t.notes["prefill"] = (f"{len(feed) if n_new else len(feed) - 1} tokens"
                          + (f" after {len(past)} imported" if resume is not None else ""))
    if n_new == 0:
        with t.span("first forward"):
            if len(feed) > 1:
                batch = state.append(feed[:-1])
                model.forward(batch, state, [batch.n_tokens - 1])
        return GenerateResult(list(prompt_ids), [], "", since_process_start_ms(), seed,
                              len(feed) - 1, len(past), state, past + feed[:-1], feed[-1:])
    out: list[int] = []
    graph = fed = None
    try:
        with t.span("first forward"):
            done = 0
            while on_prefill is not None and len(feed) - done > PREFILL_CHUNK:
                batch = state.append(feed[done:done + PREFILL_CHUNK])
                model.forward(batch, state, [batch.n_tokens - 1])
                done += PREFILL_CHUNK
                on_prefill(done, len(feed))
            batch = state.append(feed[done:])
            logits = model.forward(batch, state, [batch.n_tokens - 1])
            graph = decode_graph(lm) if n_new > 1 else None
            # Steps chain on the device (the host one step ahead) when no pick needs the host:
            # no penalty window, and no state kept (a step queued past the last token is never
            # undone); from the prompt on when its prefill gives the host time to spare.
            chain = None
            if graph is not None and not keep_state and not sampling.penalty_on:
                chain = graph.device_pick(sampling.temperature, sampling.top_k, sampling.top_p,
                                          sampling.min_p, rng)
            if chain is not None and _feeds_from_prompt(lm, len(feed), logits, graph):
                fed = decode_fed(state, graph, logits, n_new, chain)
                nxt = next(fed)
            else:
                nxt = pick(logits)
        first_ms = since_process_start_ms()
        tokens = (decode_tokens(model, state, graph, pick, nxt, n_new, chain) if fed is None
                  else itertools.chain((nxt,), fed))
        with t.span("decode"):
            stop_reason = yield from _decode(tokens, out, text_out, eog)
    finally:
        if fed is not None:
            fed.close()
        if graph is not None:
            t.notes["decode"] = f"{graph.note}, {graph.steps} steps"
            graph.close()
    held = keep_state and stop_reason == "length"  # the text may go on in another job
    if text_out is not None:
        tail = text_out.flush(final=not held)
        if tail:
            yield tail
        if text_out.stopped:
            stop_reason = "stop"
    if stop_reason == "stop":
        text = text_out.text
    elif tok is None:
        text = ""
    else:  # an end-of-generation token ends the ids, not the text (llama.cpp prints no piece)
        text = tok.decode(out[:-1] if stop_reason == "eog" else out, lead=lead, final=not held)
    res = GenerateResult(list(prompt_ids), out, text, first_ms, seed, len(feed), len(past),
                         stop_reason=stop_reason)
    if keep_state:
        res.state, res.fed, res.pending = state, past + feed + out[:-1], out[-1:]
    return res


def _decode(tokens: Iterator[int], out: list[int], text_out: Any,
            eog: Any) -> Generator[str, None, str]:
    """The decode loop of :func:`generate_steps` over ``tokens`` (from the first sampled one):
    appends to ``out`` (empty at the start), yields text pieces when streaming, returns the stop
    reason. An end-of-generation token is the last id, and none of the text."""
    for tok in tokens:
        out.append(tok)
        if tok in eog:
            return "eog"
        if text_out is not None:
            piece = text_out.push(tok)
            if piece:
                yield piece
            if text_out.stopped:
                return "stop"
    return "length"


def decode_tokens(model: Any, state: Any, graph: Any, pick: Callable[[Any], int], nxt: int,
                  n: int, chain: Any = None) -> Iterator[int]:
    """The ``n`` tokens from ``nxt`` (already picked: the first one) on, each picked by ``pick``
    from the logits of a one-token step fed the one before; the caller stops iterating at a
    stop. ``graph``: a cuda_graph.DecodeGraph that runs the steps, or None. ``chain`` (a
    cuda_graph.DevicePick, with a graph): once the graph is captured the steps chain on the
    device (DecodeGraph.queue) -- step k + 1 reads its token from the slot where step k's pick
    put it and is queued before the host waits for that token, so the GPU never idles between
    steps; ``pick`` then goes unused. A stop leaves at most one step queued past the last
    token: its cell is written, so a caller chains only when the state is not kept."""
    yield nxt
    ticket = None
    for k in range(1, n):
        if chain is not None and graph.can_chain():
            if ticket is None:
                ticket = graph.queue(state.append([nxt]), chain, nxt)
            after = None
            if k + 1 < n:  # the token this ticket brings is not the last one wanted
                after = graph.queue(state.append([0]), chain, None)  # 0: its id is on the device
            nxt = graph.result(ticket)
            ticket = after
        else:
            nxt = pick(decode_step(model, graph, state, nxt))
        yield nxt


# A job chains from its prompt on (decode_fed) when its prefill is long enough for the GPU to
# be still busy with it while the host queues the first steps (the eager one and the capture:
# 15-45 ms of host time on the benchmark files, BENCHMARKS.md 2026-12-07), so that the first
# token comes no later: at least FED_MIN_TOKENS prompt tokens and FED_MIN_WORK prompt tokens x
# bytes of the model file. Dense prefills run at about 5e13 of the latter a second (a 1518-token
# prompt: 8B Q4_K_M 152 ms, 0.6B Q8_0 22 ms on an H100), so that is about 50 ms of prefill;
# a MoE file's prefill runs faster than its size says (the 30B-A3B's ~1.2e14 a second), and
# the token count keeps its short prompts host-fed: its first steps take the longest (17 + 26 ms
# on an H200, BENCHMARKS.md 2026-12-03).
# Forced on for the 0.6B's 1518 tokens (1e12) the first token came 3-17 ms later.
# REFLEX_DECODE_FED=0 never chains from the prompt, =1 whenever it may.
FED_MIN_TOKENS = 512
FED_MIN_WORK = 2.5e12
# steps queued before the host waits for the first token: the eager one and the capture
FED_AHEAD = 2


def _feeds_from_prompt(lm: Loaded, n_prompt: int, logits: Any, graph: Any) -> bool:
    mode = os.environ.get("REFLEX_DECODE_FED", "")
    if mode == "0" or not graph.can_feed(logits):
        return False
    if mode == "1":
        return True
    if n_prompt < FED_MIN_TOKENS:
        return False
    try:
        return n_prompt * os.path.getsize(lm.path) >= FED_MIN_WORK
    except OSError:  # the file went away under its mapping: the job still runs, host-fed
        return False


def decode_fed(state: Any, graph: Any, logits: Any, n: int, chain: Any) -> Iterator[int]:
    """The ``n`` (2 or more) tokens of a job whose first one is picked on the device from
    ``logits`` (the prompt's last row, launched, not waited for): every step takes its token
    from the device slot the pick before it filled (DecodeGraph.pick_first, queue_fed). The
    first FED_AHEAD steps are queued before the host waits for the first token, so their host
    time (the eager, traced step and the capture) runs beside the prefill on the GPU; after
    that one step is queued ahead of the token waited for, as :func:`decode_tokens`' chain
    does. A caller that stops leaves at most FED_AHEAD steps queued past what it took."""
    first = state.append([0])  # 0: its id is on the device
    tickets = collections.deque([graph.pick_first(logits, chain, first)])
    queued = 0
    for k in range(n):
        while queued < min(n - 1, max(k + 1, FED_AHEAD)):
            tickets.append(graph.queue_fed(first if queued == 0 else state.append([0]), state,
                                           chain))
            queued += 1
        yield graph.result(tickets.popleft())


def decode_step(model: Any, graph: Any, state: Any, token: int) -> Any:
    """One decode step: ``token`` appended to ``state`` and the logits of that position, through
    ``graph`` (a cuda_graph.DecodeGraph, :func:`decode_graph`) when there is one."""
    batch = state.append([token])
    return graph.forward(batch, state) if graph is not None else model.forward(batch, state, [0])


def decode_graph(lm: Loaded) -> Any:
    """A cuda_graph.DecodeGraph for one job's one-token steps on the GPU (unless
    REFLEX_CUDA_GRAPHS=0), else None; whoever makes one closes it when the job ends."""
    if lm.backend != "cuda":
        return None
    from .backends import cuda_graph

    return cuda_graph.DecodeGraph(lm.ops, lm.model) if cuda_graph.enabled() else None


class _TextOut:
    """The generated text, decoded token by token, cut before the first stop string. ``push``
    returns the text that can be handed out now (when streaming): what is complete UTF-8 and
    cannot be the beginning of a stop string any more."""

    def __init__(self, tok: Any, stops: Sequence[str], stream: bool, lead: bytes = b""):
        self._dec = tok.streamer(lead=lead)
        self._stops = stops
        self._longest = max(map(len, stops), default=0)
        self._stream = stream
        self.text = ""
        self._given = 0  # characters of self.text handed out
        self.stopped = False

    def push(self, token_id: int) -> str:
        return self._add(self._dec.push(token_id))

    def flush(self, final: bool = True) -> str:
        """The rest of the text; ``final`` False leaves an unfinished character out."""
        piece = "" if self.stopped else self._add(self._dec.flush(final))
        return piece + self._release(len(self.text))

    def _add(self, piece: str) -> str:
        if not piece:
            return ""
        # a stop string can only end in the new piece: search from where one could start
        start = max(0, len(self.text) - self._longest + 1)
        self.text += piece
        cut = min((i for i in (self.text.find(s, start) for s in self._stops) if i >= 0),
                  default=-1)
        if cut >= 0:
            self.text, self.stopped = self.text[:cut], True
            return self._release(cut)
        return self._release(len(self.text) - self._held_back())

    def _held_back(self) -> int:
        """Characters at the end of the text that begin some stop string."""
        for n in range(min(self._longest - 1, len(self.text)), 0, -1):
            tail = self.text[-n:]
            if any(s.startswith(tail) for s in self._stops):
                return n
        return 0

    def _release(self, upto: int) -> str:
        if not self._stream or upto <= self._given:
            return ""
        piece, self._given = self.text[self._given:upto], upto
        return piece


def warn(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
