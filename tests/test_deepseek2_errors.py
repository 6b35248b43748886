"""Bad deepseek2 files: tensors or metadata that contradict each other are a one-line error naming
the file and the key (or tensor), with exit status 1 and no traceback."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from reflex_core.errors import ModelError
from reflex_core.testing import oracle
from reflex_core.testing.modelwriter import tiny_deepseek2_shape, write_model

sys.path.insert(0, str(Path(__file__).resolve().parent / "fuzz"))
from craft import FLOAT32, UINT32, rewrite  # noqa: E402

sys.path.pop(0)


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("ds") / "good.gguf"
    write_model(path, tiny_deepseek2_shape(), weight_type="F32", seed=1)
    return path.read_bytes()


def edited(good: bytes, tmp_path, edit) -> str:
    return rewrite(good, tmp_path / "bad.gguf", edit)


BAD = {
    # 3 blocks is not a "lite" file: the query LoRA rank is required
    "no q_lora_rank": (lambda g: g.drop("deepseek2.attention.q_lora_rank"),
                       "deepseek2.attention.q_lora_rank"),
    "expert count vs tensors": (lambda g: g.set("deepseek2.expert_count", 16, UINT32),
                                "deepseek2.expert_count"),
    "groups do not divide experts": (lambda g: g.set("deepseek2.expert_group_count", 3, UINT32),
                                     "deepseek2.expert_group_count"),
    "no kv_lora_rank": (lambda g: g.drop("deepseek2.attention.kv_lora_rank"),
                        "deepseek2.attention.kv_lora_rank"),
    "half the MLA keys": (lambda g: g.drop("deepseek2.attention.value_length_mla"),
                          "deepseek2.attention.value_length_mla"),
    "MLA row size": (lambda g: g.set("deepseek2.attention.key_length", 100, UINT32),
                     "deepseek2.attention.key_length"),
    "no shared experts": (lambda g: g.set("deepseek2.expert_shared_count", 0, UINT32),
                          "deepseek2.expert_shared_count"),
    "gating func": (lambda g: g.set("deepseek2.expert_gating_func", 9, UINT32),
                    "deepseek2.expert_gating_func"),
    # llama.cpp aborts on a temperature without its length
    "temperature without length": (
        lambda g: g.set("deepseek2.attention.temperature_scale", 0.5, FLOAT32),
        "deepseek2.attention.temperature_length"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_load_error_names_the_key(good, tmp_path, case):
    edit, what = BAD[case]
    path = edited(good, tmp_path, edit)
    with pytest.raises(ModelError) as e:
        oracle.load_model(path)
    assert what in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("case", ["no q_lora_rank", "expert count vs tensors",
                                  "groups do not divide experts"])
def test_engine_error_names_the_file(good, tmp_path, case):
    """What the CLI prints (one line, tests/test_qwen35_errors.py runs the CLI itself): the
    engine's error starts with the file's path and names the key."""
    from reflex_core import engine

    edit, what = BAD[case]
    path = edited(good, tmp_path, edit)
    with pytest.raises(ModelError) as e:
        engine.load(path, "cpu")
    msg = str(e.value)
    assert msg.startswith(path) and what in msg and "\n" not in msg, msg
