"""Errors a user can act on. The CLI prints ``error: <message>`` (one line) and exits 1."""


class ReflexError(Exception):
    """A problem with the user's input or environment, described in one line."""

    exit_code = 1


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
