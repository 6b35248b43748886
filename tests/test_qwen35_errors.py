"""Bad qwen35 files: tensors or metadata that contradict each other are a one-line error naming
the file and the key (or tensor), with exit status 1 and no traceback -- never wrong output."""

from __future__ import annotations

import subprocess
import sys

import pytest

from reflex_core.errors import ModelError
from reflex_core.testing import oracle
from reflex_core.testing.modelwriter import tiny_qwen35_shape, write_model

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent / "fuzz"))
from craft import ARRAY, BOOL, INT32, UINT32, rewrite  # noqa: E402

sys.path.pop(0)


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> bytes:
    """A tiny qwen35 file with a tokenizer (the CLI encodes a prompt before the model loads)."""
    path = tmp_path_factory.mktemp("q35") / "good.gguf"
    write_model(path, tiny_qwen35_shape(), weight_type="F32", seed=1, tokenizer="qwen35")
    return path.read_bytes()


def edited(good: bytes, tmp_path, edit) -> str:
    return rewrite(good, tmp_path / "bad.gguf", edit)


BAD = {
    "missing ssm_a": (lambda g: g.drop_tensor("blk.0.ssm_a"), "blk.0.ssm_a"),
    "missing ssm_conv1d": (lambda g: g.drop_tensor("blk.1.ssm_conv1d.weight"),
                           "blk.1.ssm_conv1d.weight"),
    "d_k != d_v": (lambda g: g.set("qwen35.ssm.inner_size", 80, UINT32), "qwen35.ssm.inner_size"),
    "H_v % H_k": (lambda g: g.set("qwen35.ssm.time_step_rank", 3, UINT32),
                  "qwen35.ssm.time_step_rank"),
    "recurrent_layers length": (
        lambda g: g.set("qwen35.attention.recurrent_layers", [True, True, False], ARRAY, BOOL),
        "qwen35.attention.recurrent_layers"),
    "sections length": (lambda g: g.set("qwen35.rope.dimension_sections", [2, 1, 1], ARRAY, INT32),
                        "qwen35.rope.dimension_sections"),
    "sections leave pairs unrotated": (
        lambda g: g.set("qwen35.rope.dimension_sections", [2, 0, 1, 1], ARRAY, INT32),
        "qwen35.rope.dimension_sections"),
    "interval 0": (lambda g: g.set("qwen35.full_attention_interval", 0, UINT32),
                   "qwen35.full_attention_interval"),
    "conv kernel 1": (lambda g: g.set("qwen35.ssm.conv_kernel", 1, UINT32),
                      "qwen35.ssm.conv_kernel"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_load_error_names_the_key(good, tmp_path, case):
    edit, what = BAD[case]
    path = edited(good, tmp_path, edit)
    with pytest.raises(ModelError) as e:
        oracle.load_model(path)
    assert what in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("case", ["missing ssm_a", "d_k != d_v", "recurrent_layers length"])
def test_cli_one_line_error(good, tmp_path, case):
    edit, what = BAD[case]
    path = edited(good, tmp_path, edit)
    p = subprocess.run([sys.executable, "-m", "reflex_core", "generate", path, "--backend", "cpu",
                        "-n", "1", "hello"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    assert path in lines[0] and what in lines[0], lines[0]
    assert "Traceback" not in p.stderr
