"""Entry point of the test plugin: its architecture and its op; imports nothing heavy."""

from reflex_core.plugin_api import ArchSpec, OpDef, hookimpl


@hookimpl
def reflex_register_architectures(register):
    register(ArchSpec(name="testgated", model="reflex_testop.model:TestGated",
                      description="test only: Qwen3 with sigmoid-gated FFN outputs"))


@hookimpl
def reflex_register_ops(register):
    register(OpDef("testop_sigmoid_mul", twin="reflex_testop.ops:sigmoid_mul_twin",
                   cuda="reflex_testop.ops:sigmoid_mul_cuda", package="reflex_testop",
                   kernels=("testop",), cases="reflex_testop.ops:sigmoid_mul_cases",
                   doc="x * sigmoid(g), elementwise"))
