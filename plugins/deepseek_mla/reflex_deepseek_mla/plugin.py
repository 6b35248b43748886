"""Entry point of the deepseek_mla plugin: declares the architecture and this family's ops;
imports nothing heavy (the model, the twins and the launchers load on first use)."""

from reflex_core.plugin_api import ArchSpec, OpDef, hookimpl

PKG = "reflex_deepseek_mla"
_OPS = PKG + ".ops:"

# name -> what it computes (reflex_deepseek_mla.ops documents each in full)
OPS = {
    "mla_split_heads": "split every head's row in two at a column",
    "mla_concat_heads": "join two per-head tensors along the head dimension (the second may "
                        "have one head, shared by all)",
    "mla_store_rows": "write the batch's rows into the cells of a per-token state buffer",
    "mla_attention": "attention of every head over the shared latent rows; V = the first "
                     "columns of each row",
    "mla_query_temperature": "scale each token's query by ln(floor(position / length) + 1) * "
                             "scale + 1 (Llama-4-style temperature)",
    "mla_head_ids": "ids[t, h] = h: selects head h's slice of a per-head weight in moe_matmul",
}


@hookimpl
def reflex_register_architectures(register):
    register(ArchSpec(name="deepseek2", model=PKG + ".model:DeepSeek2",
                      description="DeepSeek-V2/V2-Lite/V3: MLA latent KV, grouped routing, "
                                  "shared experts"))


@hookimpl
def reflex_register_ops(register):
    for name, doc in OPS.items():
        short = name[len("mla_"):]
        register(OpDef(name, twin=f"{_OPS}{short}_twin", cuda=f"{_OPS}{short}_cuda",
                       package=PKG, kernels=("mla",), cases=f"{_OPS}{short}_cases", doc=doc))
