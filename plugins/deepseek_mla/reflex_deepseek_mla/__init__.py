"""Reflex plugin for DeepSeek-V2 / V2-Lite / V3 GGUF files (``general.architecture`` ``deepseek2``):
multi-head latent attention over a compressed KV cache, DeepSeek's MoE routing, shared experts.

The entry point (``reflex_deepseek_mla.plugin``) declares the architecture and this family's ops;
the model (``reflex_deepseek_mla.model``) is imported when such a file is loaded, the ops' NumPy
twins and CUDA launchers (``reflex_deepseek_mla.ops``) on first use.
"""

__version__ = "0.1.0"
