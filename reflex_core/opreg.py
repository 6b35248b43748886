"""The op registry: every op a forward pass calls, with its NumPy twin and its CUDA launcher.

An op is one :class:`OpDef`: a name, the NumPy twin (the reference, run by the CPU backend and
in CI), the CUDA launcher (run by the GPU backend; it launches kernels of ``package``'s kernel
modules ``kernels``), and ``cases``, random inputs for the generic test that runs every
registered op's CUDA launcher against its twin on the GPU machine
(tests/gpu/test_registered_ops_gpu.py) and every twin in CI (tests/test_op_registry.py). Functions are named by ``"module:attr"`` and
imported on first use, so registering an op imports nothing (no NumPy on the GPU path).

The core registers its own ops here (:data:`CORE_OPS`): their twin and launcher are the methods
of the same name of ``NumpyOps`` and ``CudaOps``, which forward passes call directly
(``ops.rmsnorm(...)``). A plugin registers its family's ops from its entry-point module::

    @hookimpl
    def reflex_register_ops(register):
        register(OpDef("sigmoid_mul", twin="reflex_x.ops:sigmoid_mul_twin",
                       cuda="reflex_x.ops:sigmoid_mul_cuda", package="reflex_x",
                       kernels=("x",), cases="reflex_x.ops:sigmoid_mul_cases"))

and its forward calls ``ops.sigmoid_mul(...)`` on any backend: :class:`~reflex_core.ops.Ops`
resolves an attribute it does not have through this registry (``twin(ops, *args)`` on the CPU,
``cuda(ops, *args)`` on the GPU). A plugin op can never replace a core op or another plugin's.

``cases(rng) -> list[OpCase]``: NumPy inputs. In ``args``, a :class:`WeightArg` stands for a
GGUF tensor (attached to both backends by the test), a :class:`BatchArg` for a prepared batch;
``compare`` lists the argument positions an in-place op writes (compared after the call);
``expect``, when given, is the result computed another way (the CI test holds the twin to it).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, NamedTuple

from .errors import PluginConflict, ReflexError

CORE_PACKAGE = "reflex_core"
# The types here are NamedTuples, not dataclasses: this module loads with the model, on the
# cold path, where building a (frozen) dataclass costs about a millisecond each.


class OpDef(NamedTuple):
    """One op. ``twin`` / ``cuda`` / ``cases``: ``"module:attr"`` (attr may be dotted, e.g. a
    method ``Class.name``); ``cuda`` None: no GPU implementation (the GPU backend refuses)."""

    name: str
    twin: str
    cuda: str | None = None
    package: str = CORE_PACKAGE
    kernels: tuple[str, ...] = ()
    cases: str | None = None
    doc: str = ""


class WeightArg(NamedTuple):
    """A weight argument of an :class:`OpCase`: float32 data (F32, NumPy shape = ne reversed) or
    raw GGML blocks ``(bytes, ne, ggml_type)``."""

    name: str
    data: Any


class BatchArg(NamedTuple):
    """A batch argument of an :class:`OpCase` (passed through ``ops.prepare``)."""

    batch: Any


class OpCase(NamedTuple):
    """Inputs of one run of an op (NumPy arrays, ints, floats, WeightArg, BatchArg)."""

    label: str
    args: tuple
    kwargs: dict = {}  # never mutated
    compare: tuple[int, ...] = ()  # argument positions written in place, compared too
    rtol: float = 1e-5
    atol: float = 1e-5
    result: bool = True  # compare the return value (False: in-place ops returning None)
    expect: Any = None  # the result by an independent formula, when the case gives one


def resolve(ref: str) -> Any:
    """The object named ``"module:attr.attr"``."""
    mod, _, attr = ref.partition(":")
    obj: Any = importlib.import_module(mod)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


_NP = "reflex_core.backends.numpy_backend:NumpyOps."
_CU = "reflex_core.backends.cuda_backend:CudaOps."
_CASES = "reflex_core.testing.op_cases:"


def _core(name: str, kernels: tuple[str, ...] = ("core",), doc: str = "") -> OpDef:
    return OpDef(name, _NP + name, _CU + name, CORE_PACKAGE, kernels, _CASES + name, doc)


# The core's ops (reflex_core.ops.Ops documents each). Weight ops launch the quant module.
CORE_OPS: tuple[OpDef, ...] = (
    _core("embed", ("quant", "quant_lowbit")),
    _core("matmul", ("quant", "quant_lowbit")),
    _core("matmul_many", ("quant", "quant_lowbit")),
    _core("matmul_swiglu", ("quant", "quant_lowbit")),
    _core("rmsnorm"),
    _core("add_rmsnorm"),
    _core("rope"),
    _core("kv_write"),
    _core("qk_norm_rope_store"),
    _core("attention"),
    _core("rope_attention"),
    _core("swiglu"),
    _core("add"),
    _core("add_bias"),
    _core("take_rows"),
    _core("moe_route"),
    _core("moe_matmul", ("quant", "quant_lowbit")),
    _core("moe_matmul_swiglu", ("quant", "quant_lowbit")),
    _core("moe_combine"),
    _core("argmax"),
    _core("token_logprobs"),
    _core("repeat_penalty"),
)

_ops: dict[str, OpDef] = {op.name: op for op in CORE_OPS}
_owner: dict[str, str] = {op.name: CORE_PACKAGE for op in CORE_OPS}
_funcs: dict[tuple[str, str], Callable] = {}


def register(op: OpDef, owner: str) -> None:
    """Add ``op`` (registered by plugin ``owner``). Re-registering the same definition is a
    no-op; another definition of a taken name is a :class:`PluginConflict`."""
    if not isinstance(op, OpDef):
        raise ReflexError(f"plugin {owner} registered {op!r}, not an OpDef")
    have = _ops.get(op.name)
    if have is not None:
        if have == op:
            return
        raise PluginConflict(f"op {op.name!r} of plugin {owner} is already registered by "
                             f"{_owner[op.name]}; rename it")
    _ops[op.name] = op
    _owner[op.name] = owner


def unregister(name: str) -> None:
    """Remove a plugin's op (tests); core ops stay."""
    if _owner.get(name) not in (None, CORE_PACKAGE):
        _ops.pop(name)
        _owner.pop(name)
        _funcs.pop((name, "twin"), None)
        _funcs.pop((name, "cuda"), None)


def get(name: str) -> OpDef | None:
    return _ops.get(name)


def all_ops() -> list[OpDef]:
    return list(_ops.values())


def kernel_packages() -> set[str]:
    """Packages other than the core whose kernel modules registered ops launch."""
    return {op.package for op in _ops.values() if op.cuda and op.package != CORE_PACKAGE}


def implementation(name: str, backend: str) -> Callable:
    """The function implementing op ``name`` on ``backend`` ("cpu" -> the twin, "cuda" -> the
    launcher), called as ``fn(ops, *args, **kwargs)``. AttributeError when no op has that name
    (so that ``getattr(ops, name, default)`` keeps working)."""
    op = _ops.get(name)
    if op is None:
        raise AttributeError(name)
    which = "cuda" if backend == "cuda" else "twin"
    fn = _funcs.get((name, which))
    if fn is None:
        ref = op.cuda if which == "cuda" else op.twin
        if ref is None:
            raise ReflexError(f"op {name!r} has no CUDA implementation",
                              cpu_hint="; use --backend cpu")
        fn = _funcs[(name, which)] = resolve(ref)
    return fn
