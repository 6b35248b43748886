"""Entry point of the qwen35_hybrid plugin: declares the architectures and this family's ops;
imports nothing heavy (the model, the twins and the launchers load on first use)."""

from reflex_core.plugin_api import ArchSpec, OpDef, hookimpl

PKG = "reflex_qwen35_hybrid"
_OPS = PKG + ".ops:"

# name -> what it computes (reflex_qwen35_hybrid.ops documents each in full)
OPS = {
    "qwen35_conv": "causal depthwise conv1d over each sequence's window + SiLU, conv state "
                   "updated",
    "qwen35_delta_rule": "L2-normalised q/k, gates, gated delta rule over each sequence run, "
                         "SSM state updated",
    "qwen35_gated_norm": "per-head RMSNorm(o) * w * silu(z)",
    "qwen35_take_q": "the query halves of the per-head interleaved [q_h, gate_h] projection",
    "qwen35_gate_output": "attention output times sigmoid of the gate halves",
    "qwen35_shexp_combine": "routed experts + sigmoid(w . b) * shared expert",
}


@hookimpl
def reflex_register_architectures(register):
    register(ArchSpec(name="qwen35", model=PKG + ".model:Qwen35",
                      description="Qwen3.5 hybrid: Gated DeltaNet + gated attention, SwiGLU"))
    register(ArchSpec(name="qwen35moe", model=PKG + ".model:Qwen35MoE",
                      description="Qwen3.5 hybrid MoE: Gated DeltaNet + gated attention, "
                                  "routed experts with a gated shared expert"))


@hookimpl
def reflex_register_ops(register):
    for name, doc in OPS.items():
        short = name[len("qwen35_"):]
        register(OpDef(name, twin=f"{_OPS}{short}_twin", cuda=f"{_OPS}{short}_cuda",
                       package=PKG, kernels=("qwen35",), cases=f"{_OPS}{short}_cases", doc=doc))
