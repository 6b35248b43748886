"""What a package's build shipped: its ``kernels/manifest.json`` and which GPUs it covers.

Written by ``reflex_core/_build.py`` beside the fatbins: each module's sha256, the SASS targets,
the PTX target, the nvcc version, each kernel's launch signature (``"kernels"``) and the
``REFLEX_*`` size limits of the CUDA sources (``"limits"``). Standard library only: the driver
checks coverage with it before cuda-bindings is imported.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import CudaUnavailable

CORE_PACKAGE = "reflex_core"
SKIP_HINT = "reinstall without REFLEX_SKIP_CUDA with nvcc available"
# ReflexError.cpu_hint of the errors that end in SKIP_HINT
CPU_HINT = " (or use --backend cpu)"

# folder -> manifest, successful reads only (a test or a failed build may fix the file later)
_cache: dict[Path, dict] = {}


def kernels_dir(package: str = CORE_PACKAGE) -> Path:
    """Folder of ``package``'s fatbins. ``REFLEX_KERNEL_DIR`` overrides the core's (dev loop:
    ``python reflex_core/_build.py cuda /tmp/kout cuda/include`` then REFLEX_KERNEL_DIR=/tmp/kout);
    ``REFLEX_KERNEL_DIR_<PACKAGE>`` (upper case) overrides a plugin's."""
    env = os.environ.get("REFLEX_KERNEL_DIR" if package == CORE_PACKAGE
                         else f"REFLEX_KERNEL_DIR_{package.upper()}")
    if env:
        return Path(env)
    if package == CORE_PACKAGE:
        return Path(__file__).resolve().parent.parent / "kernels"
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise CudaUnavailable(f"package {package!r} (kernels) is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / "kernels"


def has_kernels(package: str) -> bool:
    """Whether ``package`` ships a kernels manifest at all (a plugin without CUDA sources has
    none; one built with REFLEX_SKIP_CUDA has a "skipped" one, which :func:`read_manifest`
    refuses)."""
    return (kernels_dir(package) / "manifest.json").is_file()


def read_manifest(package: str = CORE_PACKAGE) -> dict:
    """The package's kernels/manifest.json; CudaUnavailable when the build shipped no kernels."""
    folder = kernels_dir(package)
    manifest = _cache.get(folder)
    if manifest is not None:
        return manifest
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except FileNotFoundError:
        raise CudaUnavailable(
            f"{package} has no CUDA kernels ({folder}/manifest.json is missing: it was built "
            f"with REFLEX_SKIP_CUDA=1 or without nvcc); {SKIP_HINT}",
            cpu_hint=CPU_HINT) from None
    except (OSError, ValueError) as e:
        raise CudaUnavailable(f"{package}: unreadable {folder}/manifest.json ({e}); "
                              f"{SKIP_HINT}", cpu_hint=CPU_HINT) from None
    if manifest.get("skipped") or not manifest.get("modules"):
        raise CudaUnavailable(f"{package} was built with REFLEX_SKIP_CUDA=1, so it has no CUDA "
                              f"kernels; {SKIP_HINT}", cpu_hint=CPU_HINT)
    _cache[folder] = manifest
    return manifest


def _sm_num(s: str) -> int:
    return int("".join(ch for ch in s.split("_", 1)[-1] if ch.isdigit()))


def _best_sass(sm: int, manifest: dict) -> int | None:
    """The shipped SASS target the driver runs on compute capability ``sm`` (same major, the
    highest minor not above the device's), or None."""
    fits = [t for t in map(_sm_num, manifest.get("sass", []))
            if t // 10 == sm // 10 and t % 10 <= sm % 10]
    return max(fits) if fits else None


def image_for(sm: int, manifest: dict) -> str | None:
    """'sass' when a shipped SASS target runs on compute capability ``sm`` (same major, minor
    not above the device's), 'ptx' when the driver can JIT the shipped PTX (PTX target <= sm),
    None when neither."""
    if _best_sass(sm, manifest) is not None:
        return "sass"
    ptx = manifest.get("ptx")
    if ptx and _sm_num(ptx) <= sm:
        return "ptx"
    return None


def best_cubin(sm: int, manifest: dict) -> int | None:
    """The SASS target whose cubin to load on compute capability ``sm`` -- the one the driver
    would pick from the fatbin -- or None (no cubins shipped, or none fits: the fatbin's PTX)."""
    return _best_sass(sm, manifest) if manifest.get("cubins") else None


def coverage_error(sm: int, manifest: dict, package: str = CORE_PACKAGE) -> str | None:
    """None when ``package``'s kernels can run on sm_XX, else the one-line reason."""
    if image_for(sm, manifest) is not None:
        return None
    sass = sorted(_sm_num(t) for t in manifest.get("sass", []))
    shipped = (f"sm_{sass[0]}..sm_{sass[-1]}" if len(sass) > 1 else
               f"sm_{sass[0]}" if sass else "no SASS")
    ptx = manifest.get("ptx", "none")
    return (f"{package} was built for {shipped} (PTX {ptx}); this GPU is sm_{sm}; "
            f"rebuild with REFLEX_CUDA_ARCH=sm_{sm}")
