"""GGUF LoRA adapters (spec §12): read an adapter, check it against the base model, and describe
the merges a backend applies at load (``Ops.merge_lora``), so that the forward pass never sees
an adapter.

For a base tensor ``N`` the adapter holds ``N.lora_a`` / ``N.lora_b``; the merged weight is
``W' = W + scale · (B @ A)`` in NumPy shapes (per expert for 3-D ``*_exps`` tensors), and for
``token_embd.weight`` ``E' = E + scale · (A @ Bᵀ)``; ``scale = user_scale · alpha / rank``, or
``user_scale`` when alpha is 0. Several adapters merge in sequence.

Stdlib only: this runs on the GPU cold path when ``--lora`` is given. The factors stay where
they are in the adapter's mapping (F32, F16, BF16 or Q8_0); each backend converts them itself
(the CUDA backend on the device, where the F16 -> F32 conversion is one launch, not a Python
loop).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

from . import mapguard
from .errors import GGUFError, ReflexError
from .ggml_types import GGML_TYPES

# GGML types of A/B the backends convert: convert_lora_to_gguf.py --outtype f32/f16/bf16/q8_0
FACTOR_TYPES = {0: "F32", 1: "F16", 30: "BF16", 8: "Q8_0"}
_TIED_HEAD = "output.weight"
_EMBEDDING = "token_embd.weight"


class LoraError(ReflexError):
    """An adapter that cannot be merged into this base model."""


@dataclass(frozen=True)
class Factor:
    """One of a pair's tensors: GGUF ``ne``, GGML type, byte offset from the adapter's tensor
    data start (``Adapter.data_offset``), byte size."""

    name: str
    ne: tuple[int, ...]
    ggml_type: int
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Merge:
    """``W' = W + scale · (B @ A)`` (or ``A @ Bᵀ`` when ``embedding``) for base tensor ``name``
    (GGUF ``ne``; ``[n_in, n_out]`` or ``[n_in, n_out, n_expert]``) at ``rank``."""

    name: str
    ne: tuple[int, ...]
    rank: int
    scale: float
    embedding: bool
    a: Factor
    b: Factor

    @property
    def n_expert(self) -> int:
        return self.ne[2] if len(self.ne) == 3 else 1


@dataclass
class Adapter:
    """An opened, checked adapter file: its merges in file order and its mapping (``gguf``,
    closed by :meth:`close` once the backend has merged)."""

    path: str
    gguf: Any
    alpha: float
    user_scale: float
    merges: list[Merge]

    @property
    def data_offset(self) -> int:
        return int(self.gguf.data_offset)

    def factor_bytes(self, f: Factor) -> memoryview:
        start = self.data_offset + f.offset
        return memoryview(self.gguf.mm)[start:start + f.nbytes]

    def close(self) -> None:
        self.gguf.close()


# SCALE as a decimal number is written (Python's float() would also read "1_0" as 10, " 2" as 2)
_SCALE = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def parse_lora_arg(text: str) -> tuple[str, float]:
    """``FILE[:SCALE]`` -> (path, scale). A path that contains ':' with no number after its last
    ':' is all path (scale 1)."""
    head, sep, tail = text.rpartition(":")
    if sep and head:
        if tail.strip().lower().lstrip("+-") in ("nan", "inf", "infinity"):
            raise ReflexError(f"--lora {text}: the scale {tail!r} is not a finite number")
        if not _SCALE.fullmatch(tail):
            return text, 1.0
        scale = float(tail)
        if not math.isfinite(scale):  # 1e999
            raise ReflexError(f"--lora {text}: the scale {tail!r} is not a finite number")
        return head, scale
    return text, 1.0


def _shape_error(path: str, name: str, what: str) -> LoraError:
    return LoraError(f"{path}: LoRA tensor {name!r} {what} (is this adapter for this base "
                     f"model?)")


def _factor(g: Any, path: str, ti: Any) -> Factor:
    if ti.ggml_type not in FACTOR_TYPES:
        tname = GGML_TYPES[ti.ggml_type].name if ti.ggml_type in GGML_TYPES else ti.ggml_type
        raise LoraError(f"{path}: LoRA tensor {ti.name!r} has type {tname}; factors must be "
                        f"{', '.join(FACTOR_TYPES.values())} (re-export the adapter with "
                        f"--outtype f16)")
    rel = int(ti.offset) - int(g.data_offset)
    if rel % 4:  # the kernels read the factors in place as 4-byte (F32) or 2-byte words
        raise LoraError(f"{path}: LoRA tensor {ti.name!r} lies at a misaligned offset "
                        f"({rel} bytes into the tensor data)")
    return Factor(ti.name, tuple(int(n) for n in ti.ne), int(ti.ggml_type), rel, int(ti.nbytes))


def _pair_merge(path: str, base: Any, a: Factor, b: Factor, alpha: float,
                user_scale: float) -> Merge:
    """The checks of spec §12 (plus equal expert counts and ranks), then the pair's Merge."""
    name = base.name
    ne = tuple(int(n) for n in base.ne)
    if len(ne) not in (2, 3):
        raise LoraError(f"{path}: LoRA targets {name!r}, which has {len(ne)} dimension(s); "
                        "adapters apply to matrices and expert tensors")
    if len(a.ne) != len(ne) or len(b.ne) != len(ne):
        raise _shape_error(path, name, f"factors have {len(a.ne)} and {len(b.ne)} dimensions, "
                                       f"the base tensor {len(ne)}")
    embedding = name == _EMBEDDING
    if embedding:  # A ne [r, V], B ne [r, D] (llama.cpp flips them for the row lookup)
        D, V = ne[0], ne[1]
        if b.ne[1] != D or a.ne[1] != V:
            raise _shape_error(path, name, f"has A {list(a.ne)} and B {list(b.ne)}; the base "
                                           f"{list(ne)} needs A [r, {V}] and B [r, {D}]")
        if a.ne[0] != b.ne[0]:
            raise _shape_error(path, name, f"has rank {a.ne[0]} in A and {b.ne[0]} in B")
    else:
        n_in, n_out = ne[0], ne[1]
        if a.ne[0] != n_in or b.ne[1] != n_out:
            raise _shape_error(path, name, f"has A {list(a.ne)} and B {list(b.ne)}; the base "
                                           f"{list(ne)} needs A [{n_in}, r] and B [r, {n_out}]")
        if a.ne[1] != b.ne[0]:
            raise _shape_error(path, name, f"has rank {a.ne[1]} in A and {b.ne[0]} in B")
        if len(ne) == 3 and (a.ne[2] != ne[2] or b.ne[2] != ne[2]):
            raise _shape_error(path, name, f"has {a.ne[2]} and {b.ne[2]} experts in A and B, "
                                           f"the base {ne[2]}")
    rank = b.ne[0]
    if rank <= 0:
        raise _shape_error(path, name, "has rank 0")
    scale = user_scale * alpha / rank if alpha != 0 else user_scale
    return Merge(name, ne, rank, scale, embedding, a, b)


def open_adapter(path: str, base: Any, user_scale: float = 1.0) -> Adapter:
    """Open adapter ``path`` and check it against the base model file ``base`` (a parsed
    GGUFFile): metadata, pairs, names, shapes. Every problem is a one-line LoraError (or
    GGUFError for a file that is not GGUF)."""
    from .gguf import open_gguf

    path = os.fspath(path)
    try:
        g = open_gguf(path)
        mapguard.mapped(path)
    except GGUFError as e:
        raise LoraError(f"LoRA adapter: {e}") from None
    try:
        return _check(path, g, base, user_scale)
    except BaseException:
        g.close()
        raise


def _check(path: str, g: Any, base: Any, user_scale: float) -> Adapter:
    gtype = g.get("general.type")
    if gtype != "adapter":
        raise LoraError(f"{path}: general.type is {gtype!r}, not 'adapter'; this is not a LoRA "
                        "adapter GGUF")
    atype = g.get("adapter.type")
    if atype != "lora":
        raise LoraError(f"{path}: adapter.type is {atype!r}; only 'lora' adapters are supported")
    arch, base_arch = g.get("general.architecture"), base.get("general.architecture")
    if arch != base_arch:
        raise LoraError(f"{path}: the adapter is for architecture {arch!r}, the model is "
                        f"{base_arch!r}")
    if g.get("adapter.alora.invocation_tokens") is not None:
        raise LoraError(f"{path}: an activated LoRA (adapter.alora.invocation_tokens) applies "
                        "only after its invocation tokens and cannot be merged at load")
    alpha = g.get("adapter.lora.alpha", 0.0)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise LoraError(f"{path}: adapter.lora.alpha is {alpha!r}, not a finite number")

    pairs: dict[str, dict[str, Factor]] = {}
    for ti in g.tensors.values():
        name = ti.name
        for suffix in (".lora_a", ".lora_b"):
            if name.endswith(suffix):
                pairs.setdefault(name[:-len(suffix)], {})[suffix[-1]] = _factor(g, path, ti)
                break
        else:
            if not name.endswith("_norm.weight"):  # llama.cpp ignores these too
                raise LoraError(f"{path}: tensor {name!r} is neither N.lora_a nor N.lora_b")
    if not pairs:
        raise LoraError(f"{path}: the adapter has no LoRA tensors")
    merges = []
    for target, ab in pairs.items():
        if len(ab) != 2:
            have = "lora_a" if "a" in ab else "lora_b"
            raise LoraError(f"{path}: {target!r} has {have} but not its pair")
        info = base.tensors.get(target)
        if info is None:
            raise LoraError(f"{path}: LoRA targets {target!r}, which the model does not have "
                            "(is this adapter for this base model?)")
        if target == _EMBEDDING and _TIED_HEAD not in base.tensors:
            # The head of a tied model IS token_embd: merging would change the head too (which
            # llama.cpp does not do: it aborts on such an adapter), keeping the head apart would
            # cost a second V x D copy. Neither has a reference to match.
            raise LoraError(f"{path}: the adapter changes token_embd.weight, which this model "
                            "also uses as its output head (tied embeddings); such adapters are "
                            "not supported (llama.cpp aborts on them)")
        merges.append(_pair_merge(path, info, ab["a"], ab["b"], float(alpha), user_scale))
    return Adapter(path, g, float(alpha), user_scale, merges)


def applied(adapters: Sequence[Adapter], applies: Callable[[str], bool]
            ) -> tuple[list[Adapter], list[str]]:
    """``adapters`` without the merges whose target ``applies`` (the model class's
    ``lora_applies``) rejects, and a notice for each adapter that loses some."""
    kept: list[Adapter] = []
    notices: list[str] = []
    for ad in adapters:
        skip = [m.name for m in ad.merges if not applies(m.name)]
        if skip:
            ad = replace(ad, merges=[m for m in ad.merges if applies(m.name)])
            shown = ", ".join(skip[:3]) + (f" and {len(skip) - 3} more" if len(skip) > 3 else "")
            notices.append(f"notice: {ad.path}: {len(skip)} LoRA tensor(s) not applied, as in "
                           f"llama.cpp, which applies no LoRA to {shown} in this architecture")
        kept.append(ad)
    return kept, notices


def open_adapters(specs: Sequence[tuple[str, float]], base: Any) -> list[Adapter]:
    """:func:`open_adapter` for each ``(path, scale)``, in order; all closed on an error."""
    out: list[Adapter] = []
    try:
        for path, scale in specs:
            out.append(open_adapter(path, base, float(scale)))
    except BaseException:
        close_all(out)
        raise
    return out


def close_all(adapters: Sequence[Adapter]) -> None:
    for ad in adapters:
        ad.close()
