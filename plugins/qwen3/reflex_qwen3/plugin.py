"""Entry point of the qwen3 plugin: declares the architecture; imports nothing heavy."""

from reflex_core.plugin_api import ArchSpec, hookimpl


@hookimpl
def reflex_register_architectures(register):
    register(ArchSpec(name="qwen3", model="reflex_qwen3.model:Qwen3",
                      description="dense Qwen3 (GQA, q/k RMSNorm, NEOX RoPE, SwiGLU)"))
