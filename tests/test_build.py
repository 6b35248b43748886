"""The AOT build helper (reflex_core/_build.py): nvcc discovery, target selection, skip mode.

The real compile of every kernel happens when scripts/test.sh installs the package (a compile
error fails CI there); these tests cover the switches around it.
"""

from __future__ import annotations

import json

import pytest

from reflex_core import _build


def test_missing_nvcc_is_a_clear_build_error(monkeypatch, tmp_path):
    for var in ("REFLEX_NVCC", "CUDA_HOME", "CUDA_PATH", "REFLEX_SKIP_CUDA"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(_build.Path, "exists", lambda self: False)
    with pytest.raises(_build.BuildError) as e:
        _build.find_nvcc()
    msg = str(e.value)
    assert "nvcc not found" in msg and "REFLEX_SKIP_CUDA=1" in msg and "CUDA_HOME" in msg


def test_skip_writes_a_skipped_manifest_and_no_kernels(monkeypatch, tmp_path):
    monkeypatch.setenv("REFLEX_SKIP_CUDA", "1")
    src = tmp_path / "src"
    src.mkdir()
    (src / "k.cu").write_text('extern "C" __global__ void k() {}\n')
    assert _build.build_kernels(src, tmp_path / "out", log=lambda m: None) is None
    assert json.loads((tmp_path / "out" / "manifest.json").read_text()) == {
        "skipped": True, "modules": {}}
    assert not list((tmp_path / "out").glob("*.fatbin"))


def test_one_target_with_reflex_cuda_arch(monkeypatch):
    monkeypatch.setenv("REFLEX_CUDA_ARCH", "sm_90")
    assert _build.sass_targets("nvcc") == ([90], 90)
    monkeypatch.setenv("REFLEX_CUDA_ARCH", "ampere")
    with pytest.raises(_build.BuildError, match="sm_XX"):
        _build.sass_targets("nvcc")


def test_default_targets_cover_sm80_to_sm90_and_newer(monkeypatch):
    monkeypatch.delenv("REFLEX_CUDA_ARCH", raising=False)
    monkeypatch.setattr(_build, "toolkit_sms", lambda nvcc: [75, 80, 86, 87, 89, 90, 100, 120])
    sms, ptx = _build.sass_targets("nvcc")
    assert sms == [80, 86, 89, 90, 100, 120] and ptx == 120


def test_compiles_a_module_into_a_fatbin_with_a_manifest(monkeypatch, tmp_path):
    """nvcc is installed here and in CI: a one-kernel module compiles for one target."""
    monkeypatch.delenv("REFLEX_SKIP_CUDA", raising=False)
    monkeypatch.setenv("REFLEX_CUDA_ARCH", "sm_80")
    src = tmp_path / "src"
    src.mkdir()
    (src / "tiny.cu").write_text(
        'extern "C" __global__ void reflex_tiny(float* y) { y[threadIdx.x] = 1.0f; }\n')
    m = _build.build_kernels(src, tmp_path / "out", log=lambda s: None)
    assert m["sass"] == ["sm_80"] and m["ptx"] == "compute_80" and "tiny" in m["modules"]
    assert (tmp_path / "out" / "tiny.fatbin").stat().st_size > 0
    # the device's cubin, kept from the same nvcc run: an ELF, its kernel named inside
    cubin = (tmp_path / "out" / "tiny.sm_80.cubin").read_bytes()
    assert m["cubins"] is True and cubin[:4] == b"\x7fELF" and b"reflex_tiny" in cubin
    assert sorted(x.name for x in (tmp_path / "out").iterdir()) == [
        "manifest.json", "tiny.fatbin", "tiny.sm_80.cubin"]
    (src / "broken.cu").write_text("this is not C++\n")
    with pytest.raises(_build.BuildError, match="nvcc failed on"):
        _build.build_kernels(src, tmp_path / "out2", log=lambda s: None)


def test_a_plugin_kernel_compiles_against_the_core_headers(monkeypatch, tmp_path):
    """What plugin_cmdclass does for a plugin's cuda/*.cu: compile with the core's headers."""
    monkeypatch.delenv("REFLEX_SKIP_CUDA", raising=False)
    monkeypatch.setenv("REFLEX_CUDA_ARCH", "sm_90")
    (tmp_path / "cuda").mkdir()
    (tmp_path / "cuda" / "moe_extra.cu").write_text(
        '#include "reflex/common.cuh"\n'
        'extern "C" __global__ void myplugin_half(const unsigned short* h, float* y) {\n'
        '    y[threadIdx.x] = rx_f16_to_f32(h[threadIdx.x]);\n}\n')
    inc = _build.core_include_dir()
    assert (inc / "reflex" / "quants.cuh").exists()
    m = _build.build_kernels(tmp_path / "cuda", tmp_path / "pkg" / "kernels",
                             [inc, tmp_path / "cuda"], log=lambda s: None)
    assert "moe_extra" in m["modules"]
    cmd = _build.plugin_cmdclass(tmp_path, "pkg")
    assert "build_py" in cmd
