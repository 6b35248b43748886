"""Hook specifications: the contract between the Reflex core and architecture plugins.

A plugin is a module with functions marked ``@hookimpl``, published in the entry-point group
``reflex``. **The entry point's name is the GGUF ``general.architecture`` it serves** (a plugin
serving two architectures publishes two entry points to the same module), so the core can import
only the plugin that serves the file in hand::

    # pyproject.toml of a plugin
    [project.entry-points.reflex]
    mamba9 = "reflex_mamba9.plugin"

    # reflex_mamba9/plugin.py -- imports nothing heavy
    from reflex_core.plugin_api import ArchSpec, hookimpl

    @hookimpl
    def reflex_register_architectures(register):
        register(ArchSpec(name="mamba9", model="reflex_mamba9.model:Mamba9"))

Every hook is prefixed ``reflex_``; pluggy ignores anything else in the module.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import pluggy

from .errors import ReflexError

if TYPE_CHECKING:  # pragma: no cover
    import click

    from .opreg import OpDef

hookspec = pluggy.HookspecMarker("reflex")
hookimpl = pluggy.HookimplMarker("reflex")


@dataclass(frozen=True)
class ArchSpec:
    """One GGUF ``general.architecture`` a plugin serves.

    name:  the exact architecture string (``qwen3``, ``qwen3moe``, ...)
    model: ``"module:Class"`` of the model class; imported only when a file of ``name`` loads
    description: one line for ``reflex plugins``
    """

    name: str
    model: str
    description: str = ""

    def load_model_class(self) -> Any:
        mod_name, _, attr = self.model.partition(":")
        try:
            return getattr(importlib.import_module(mod_name), attr)
        except (ImportError, AttributeError) as e:
            raise ReflexError(f"architecture {self.name!r}: cannot import {self.model} ({e})") from e


@hookspec
def reflex_register_architectures(register: "Callable[[ArchSpec], None]") -> None:
    """Declare the GGUF architectures this plugin serves: call ``register`` once per string.

    ``ArchSpec.name`` is exactly the file's ``general.architecture``; ``ArchSpec.model`` is the
    ``"module:Class"`` path of the model class, imported only when a file of that architecture
    is loaded.

    Example::

        @hookimpl
        def reflex_register_architectures(register):
            register(ArchSpec(name="qwen3", model="reflex_qwen3.model:Qwen3",
                              description="dense Qwen3"))
    """


@hookspec
def reflex_register_ops(register: "Callable[[OpDef], None]") -> None:
    """Declare the ops of this plugin's family (:class:`~reflex_core.opreg.OpDef`: the NumPy
    twin, the CUDA launcher and its kernel modules, random test cases); the forward pass then
    calls ``ops.<name>(...)`` on any backend. Called when the plugin is loaded.

    Example::

        @hookimpl
        def reflex_register_ops(register):
            register(OpDef("sigmoid_mul", twin="reflex_x.ops:sigmoid_mul_twin",
                           cuda="reflex_x.ops:sigmoid_mul_cuda", package="reflex_x",
                           kernels=("x",), cases="reflex_x.ops:sigmoid_mul_cases"))
    """


@hookspec
def reflex_register_commands(cli: "click.Group") -> None:
    """Add subcommands to the ``reflex`` command line (called when the CLI is built).

    Example::

        @hookimpl
        def reflex_register_commands(cli):
            @cli.command(name="qwen3-info")
            def qwen3_info():
                click.echo("dense Qwen3, spec section 5")
    """
