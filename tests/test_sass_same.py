"""bench/sass_same.py: two builds of the same code are the same cubin; a change of one kernel's
code, or of a constant it reads, is named as that kernel's or the module's (nvcc, no GPU)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("sass_same", ROOT / "bench" / "sass_same.py")
sass_same = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sass_same)

SRC = """
__constant__ float table[2] = {1.0f, %s};
// %s
extern "C" __global__ void k_scale(float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = y[i] * %s + table[1];
}
extern "C" __global__ void k_copy(float* y, const float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}
"""


def _cubin(tmp_path: Path, name: str, text: str) -> bytes:
    build = sass_same._load_build()
    (tmp_path / f"{name}.cu").write_text(text)
    out = tmp_path / f"{name}.cubin"
    err = sass_same.compile_cubin(build, build.find_nvcc(), tmp_path, f"{name}.cu", [], 90, out)
    assert err is None, err
    return out.read_bytes()


def test_same_code_same_cubin_and_changes_are_named(tmp_path):
    base = _cubin(tmp_path, "base", SRC % ("2.0f", "a comment", "3.0f"))
    assert _cubin(tmp_path, "comment", SRC % ("2.0f", "another comment", "3.0f")) == base

    code = _cubin(tmp_path, "code", SRC % ("2.0f", "a comment", "5.0f"))
    assert code != base
    report = sass_same.section_report(base, code)
    assert any(line.startswith("kernel k_scale:") and ".text" in line for line in report), report
    assert not any("k_copy" in line for line in report), report

    const = _cubin(tmp_path, "const", SRC % ("7.0f", "a comment", "3.0f"))
    report = sass_same.section_report(base, const)
    assert any(line.startswith("module sections:") for line in report), report


def test_new_and_gone_kernels(tmp_path):
    base = _cubin(tmp_path, "base", SRC % ("2.0f", "", "3.0f"))
    more = _cubin(tmp_path, "more", SRC % ("2.0f", "", "3.0f")
                  + 'extern "C" __global__ void k_zero(float* y) { y[threadIdx.x] = 0.0f; }\n')
    assert "new kernel k_zero" in sass_same.section_report(base, more)
    assert "kernel gone k_zero" in sass_same.section_report(more, base)


def test_elf_sections_refuses_what_is_not_a_cubin():
    with pytest.raises(ValueError, match="ELF"):
        sass_same.elf_sections(b"not an elf file at all")
