"""Reflex plugin for dense Qwen3 GGUF files (``general.architecture = "qwen3"``).

The entry point (``reflex_qwen3.plugin``) only declares the architecture; the model class
(``reflex_qwen3.model:Qwen3``) is imported when a qwen3 file is loaded.
"""

__version__ = "0.1.0"
