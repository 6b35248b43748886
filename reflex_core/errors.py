"""Errors a user can act on. The CLI prints ``error: <message>`` (one line) and exits 1."""


class ReflexError(Exception):
    """A problem with the user's input or environment, described in one line.

    ``cpu_hint`` is the part of the advice that names ``--backend cpu`` (with its joining
    punctuation, e.g. ``", or use --backend cpu"``), kept apart so that a command without that
    option can print the message without it (:meth:`without_cpu_hint`)."""

    exit_code = 1

    def __init__(self, *args: object, cpu_hint: str = "") -> None:
        super().__init__(*args)
        self.cpu_hint = cpu_hint

    def __str__(self) -> str:
        return super().__str__() + self.cpu_hint

    def without_cpu_hint(self) -> str:
        return super().__str__()


def pip_install(what: str) -> str:
    """The command that installs ``what`` into the environment running Reflex, as a shell
    takes it: this interpreter's pip (a bare ``pip`` may be another Python's, or not on PATH
    when the venv is not activated)."""
    import shlex
    import sys

    return f"{shlex.quote(sys.executable)} -m pip install {what}"


class UsageError(ReflexError):
    """Bad command-line usage (exit status 2)."""

    exit_code = 2


class GGUFError(ReflexError):
    """The file is not a readable GGUF (missing, truncated, corrupt, unsupported version)."""


class UnsupportedArchitecture(ReflexError):
    """No installed plugin serves the file's general.architecture."""


class PluginConflict(ReflexError):
    """Two installed plugins claim one architecture."""


class UnsupportedTensorType(ReflexError):
    """A tensor uses a GGML type the chosen backend cannot compute with."""


class ModelError(ReflexError):
    """The GGUF has the right architecture but missing/inconsistent hyper-parameters or tensors."""


class CudaUnavailable(ReflexError):
    """No driver, no GPU, no kernels for this GPU, or the package was built with REFLEX_SKIP_CUDA."""


class CudaError(ReflexError):
    """A CUDA driver call failed."""
