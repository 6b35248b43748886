"""Entry point of the qwen3moe plugin: declares the architecture; imports nothing heavy."""

from reflex_core.plugin_api import ArchSpec, hookimpl


@hookimpl
def reflex_register_architectures(register):
    register(ArchSpec(name="qwen3moe", model="reflex_qwen3_moe.model:Qwen3MoE",
                      description="Qwen3-MoE (GQA, q/k RMSNorm, NEOX RoPE, softmax top-k experts)"))
