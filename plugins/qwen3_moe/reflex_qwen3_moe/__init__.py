"""Reflex plugin for Qwen3-MoE GGUF files (``general.architecture = "qwen3moe"``).

The entry point (``reflex_qwen3_moe.plugin``) only declares the architecture; the model class
(``reflex_qwen3_moe.model:Qwen3MoE``) is imported when a qwen3moe file is loaded. MoE routing and
the expert gather-matmul are core ops (``moe_route`` / ``moe_matmul`` / ``moe_combine``), so this
plugin ships no kernels of its own.
"""

__version__ = "0.1.0"
