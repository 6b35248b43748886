"""Reflex plugin for Qwen3.5 hybrid GGUF files (``general.architecture`` ``qwen35`` and
``qwen35moe``): Gated DeltaNet (recurrent) layers interleaved with gated full-attention layers.

The entry point (``reflex_qwen35_hybrid.plugin``) declares the architectures and this family's
ops; the model (``reflex_qwen35_hybrid.model``) is imported when such a file is loaded, the ops'
NumPy twins and CUDA launchers (``reflex_qwen35_hybrid.ops``) on first use.
"""

__version__ = "0.1.0"
