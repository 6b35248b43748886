"""A plugin's own kernel, end to end: the test plugin (tests/plugins/testop) serves architecture
``testgated`` whose forward calls the plugin's op ``testop_sigmoid_mul``; on the GPU that op
launches the plugin's kernel, whose module the CUDA init thread loads as soon as the engine has
resolved the file's plugin. Logits match the CPU backend (the op's NumPy twin)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from reflex_core.testing.modelwriter import ModelShape, write_model


PROMPT = [3, 17, 5, 99, 42, 7, 1]
TESTOP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "plugins", "testop")


def _file(tmp_path):
    return write_model(tmp_path / "testgated.gguf", ModelShape(), weight_type="Q8_0", seed=4,
                       arch_name="testgated")


def test_plugin_op_runs_its_kernel_in_a_model(testop_plugin, tmp_path):
    from reflex_core import engine
    from reflex_core.cuda import modules

    path = _file(tmp_path)
    out = {}
    for backend in ("cpu", "cuda"):
        lm, _ = engine.load(str(path), backend)
        st = lm.model.new_state(len(PROMPT))
        out[backend] = lm.ops.to_numpy(lm.model.forward(st.append(PROMPT), st,
                                                        list(range(len(PROMPT)))))
        lm.close()
    assert ("reflex_testop", "testop") in modules._modules  # the plugin's module is loaded
    s = np.abs(out["cpu"]).max()
    np.testing.assert_allclose(out["cuda"] / s, out["cpu"] / s, rtol=0, atol=2e-4)


SCRIPT = r"""
import json, sys
from reflex_core.cuda.start import start
cuda = start()  # first, as the console entry point does
sys.path.insert(0, sys.argv[2])
from reflex_core import engine
from reflex_core.registry import get_host
from reflex_core.timing import Timings
from reflex_testop import plugin
get_host().register(plugin, name="reflex-infer-testop")
t = Timings()
lm, _ = engine.load(sys.argv[1], "cuda", t)
st = lm.model.new_state(4)
logits = lm.model.forward(st.append([1, 2, 3, 4]), st, [3])
print(json.dumps({"loaded_on": cuda.loaded_on, "top": lm.ops.argmax(logits),
                  "notes": t.notes.get("plugin kernels", "")}))
"""


def test_plugin_kernels_load_on_the_cuda_init_thread(testop_plugin, tmp_path):
    path = _file(tmp_path)
    env = dict(os.environ, REFLEX_KERNEL_DIR_REFLEX_TESTOP=str(testop_plugin))
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(path), str(TESTOP)],
                       capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout.strip().splitlines()[-1])
    assert d["loaded_on"] == {"reflex_testop": "init thread"}, d
    assert "reflex_testop (loaded on the init thread)" in d["notes"]
