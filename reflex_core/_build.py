"""Ahead-of-time CUDA build: every ``*.cu`` of a source folder becomes one fatbin.

Used at package build time only (``setup.py`` of the core and of each plugin), never when
``reflex`` runs. It has no dependency beyond the standard library, so a plugin's ``setup.py``
can load it by file path from the source tree or import it from an installed core.

Each module ``NAME.cu`` is compiled by ``nvcc -fatbin`` into ``NAME.fatbin`` holding SASS for
every target in :func:`sass_targets` and PTX of the newest one (the driver JIT-compiles that PTX
only on a GPU newer than every SASS target); the same nvcc run's per-target cubins are kept as
``NAME.sm_XX.cubin`` (the loader maps just the device's one). ``manifest.json`` beside the
fatbins records each module's sha256, the SASS targets, the PTX target and the nvcc version, so
the loader can tell a user which GPUs a package was built for, and two things the Python side
would otherwise restate by hand:

* ``"kernels"``: every ``extern "C" __global__`` kernel's parameter signature, one char per
  parameter (``P`` pointer, ``i`` int32, ``I`` uint32, ``q`` int64, ``Q`` uint64, ``f`` float,
  ``d`` double), read from the module's preprocessed source (``nvcc -E``), so kernels that a
  macro generates are seen as the compiler sees them; ``Kernels.launch`` packs by it;
* ``"limits"``: every ``#define REFLEX_<NAME> <int>`` of the ``.cu`` files and of the ``.cuh``
  headers under the source folder, as ``{NAME: int}`` (``reflex_core.cuda.modules.limit``).

Environment:
  REFLEX_SKIP_CUDA=1     compile nothing (GPU commands then fail with a clear error)
  REFLEX_CUDA_ARCH=sm_XX SASS for that one target only (plus its PTX)
  REFLEX_NVCC=/path      the nvcc to use (default: $CUDA_HOME/bin/nvcc, $CUDA_PATH/bin/nvcc, PATH)
  REFLEX_NVCC_THREADS=N  nvcc --threads (default: number of CPUs)
  REFLEX_CUDA_LINEINFO=1 keep source-line info for profilers (fatbins ~4x larger)
  REFLEX_CUDA_TRACE=1    the one-token GEMVs record per-block phase stamps (bench/phase_trace.py)
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

# The GPU generations we ship SASS for when the toolkit knows them (sm_80 Ampere and newer).
MIN_SM = 80
# Jetson-only targets: nobody runs Reflex there yet; leaving them out halves nothing but saves time.
SKIP_SMS = {87, 88}
# SASS targets built in their arch-specific form (sm_90a: Hopper's wgmma, which the prefill GEMM
# uses where __CUDA_ARCH_FEAT_SM90_ALL is defined). The cubin still serves every sm_90 device and
# keeps the plain name (NAME.sm_90.cubin); the PTX target stays the portable compute_XX.
ARCH_SPECIFIC = {90: "90a"}


def _sass_arch(sm: int) -> str:
    """The arch name nvcc builds SASS target sm_XX as ("90a" for 90, else "XX")."""
    return ARCH_SPECIFIC.get(sm, str(sm))


class BuildError(RuntimeError):
    pass


def skip_requested() -> bool:
    return os.environ.get("REFLEX_SKIP_CUDA", "").strip() not in ("", "0")


def find_nvcc() -> str:
    explicit = os.environ.get("REFLEX_NVCC")
    if explicit:
        return explicit
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(var)
        if root and (Path(root) / "bin" / "nvcc").exists():
            return str(Path(root) / "bin" / "nvcc")
    found = shutil.which("nvcc") or (
        "/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None
    )
    if not found:
        raise BuildError(
            "nvcc not found: Reflex compiles its CUDA kernels when the package is built. "
            "Install the CUDA toolkit (or set CUDA_HOME / REFLEX_NVCC), or set REFLEX_SKIP_CUDA=1 "
            "to build without kernels (GPU commands will then refuse to run)."
        )
    return found


def nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    m = re.search(r"release ([0-9.]+), V([0-9.]+)", out)
    return m.group(2) if m else out.strip().splitlines()[-1]


def toolkit_sms(nvcc: str) -> list[int]:
    out = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True)
    sms = sorted({int(m) for m in re.findall(r"compute_(\d+)", out.stdout)})
    if out.returncode != 0 or not sms:  # very old nvcc: fall back to the set every 12.x/13.x has
        sms = [80, 86, 89, 90]
    return sms


def sass_targets(nvcc: str) -> tuple[list[int], int]:
    """(SASS targets, PTX target) for this build."""
    given = os.environ.get("REFLEX_CUDA_ARCH", "").replace(",", " ").split()
    if given:
        sms = set()
        for one in given:
            m = re.fullmatch(r"(?:sm_|compute_)?(\d+)a?", one)
            if not m:
                raise BuildError(f"REFLEX_CUDA_ARCH: {one!r} is not of the form sm_XX "
                                 "(e.g. sm_90, or a list: sm_80,sm_90)")
            sms.add(int(m.group(1)))
        return sorted(sms), max(sms)  # PTX of the newest, as by default
    sms = [s for s in toolkit_sms(nvcc) if s >= MIN_SM and s not in SKIP_SMS]
    if not sms:
        raise BuildError(f"{nvcc} supports no GPU target >= sm_{MIN_SM}")
    return sms, max(sms)


def code_flags(includes: list[Path]) -> list[str]:
    """The nvcc flags that decide a module's machine code, whatever the output (the build's
    fatbin, bench/sass_same.py's cubin): optimisation, language and the include folders."""
    flags = ["-O3", "-std=c++17", "-Xptxas=-O3"]
    if os.environ.get("REFLEX_CUDA_LINEINFO", "") not in ("", "0"):
        flags.append("-lineinfo")  # source lines for profilers; ~4x larger fatbins
    if os.environ.get("REFLEX_CUDA_TRACE", "") not in ("", "0"):
        flags.append("-DRX_TRACE")  # per-block phase stamps (bench/phase_trace.py); not for release
    return flags + [f"-I{inc}" for inc in includes]


def compile_module(nvcc: str, src: Path, out: Path, includes: list[Path], sms: list[int],
                   ptx_sm: int, threads: int) -> None:
    """``out`` (NAME.fatbin), and beside it each SASS target's cubin (NAME.sm_XX.cubin) kept
    from the same nvcc run: the loader maps the device's cubin alone (~4x faster to load than
    the whole fatbin) and falls back to the fatbin (PTX) for a GPU no cubin fits."""
    import tempfile

    cmd = [nvcc, "-fatbin", *code_flags(includes), f"--threads={threads}"]
    for sm in sms:
        cmd.append(f"-gencode=arch=compute_{_sass_arch(sm)},code=sm_{_sass_arch(sm)}")
    cmd.append(f"-gencode=arch=compute_{ptx_sm},code=compute_{ptx_sm}")
    with tempfile.TemporaryDirectory(prefix="reflex-nvcc-") as keep:
        cmd += ["--keep", f"--keep-dir={keep}", "-o", str(out), str(src)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(f"nvcc failed on {src}:\n{' '.join(cmd)}\n{proc.stdout}{proc.stderr}")
        for sm in sms:
            # nvcc 13 names a kept cubin NAME.compute_XX.cubin, NAME.compute_XX.sm_XX.cubin
            # (when PTX of the same arch is built too) or NAME.sm_XX.cubin (a single target)
            a = _sass_arch(sm)
            names = (f"compute_{a}", f"compute_{a}.sm_{a}", f"sm_{a}")
            cubin = next((c for c in (Path(keep) / f"{src.stem}.{n}.cubin" for n in names)
                          if c.is_file()), None)
            if cubin is None:
                raise BuildError(f"nvcc left no sm_{sm} cubin for {src}")
            shutil.copyfile(cubin, out.with_name(f"{src.stem}.sm_{sm}.cubin"))


# ----------------------------------------------------------------------------------------------
# kernel signatures and limits

# C parameter type (qualifiers and name removed) -> signature char; LP64 (long is 64-bit)
PARAM_KINDS = {
    "int": "i", "signed": "i", "signed int": "i", "int32_t": "i",
    "unsigned": "I", "unsigned int": "I", "uint32_t": "I",
    "long long": "q", "long long int": "q", "signed long long": "q",
    "signed long long int": "q", "long": "q", "long int": "q", "int64_t": "q",
    "ptrdiff_t": "q",
    "unsigned long long": "Q", "unsigned long long int": "Q", "unsigned long": "Q",
    "unsigned long int": "Q", "uint64_t": "Q", "size_t": "Q",
    "float": "f", "double": "d",
}
_QUALIFIERS = {"const", "volatile", "__restrict__", "__restrict", "restrict"}
_TYPE_WORDS = {"int", "signed", "unsigned", "long", "short", "char", "float", "double", "bool",
               "void"} | set(PARAM_KINDS)
_EXTERN_C = re.compile(r'\bextern\s+"C"\s*')
_ATTRIBUTE = re.compile(r"\b(__attribute__|__launch_bounds__|__declspec)\s*\(")
_GLOBAL = re.compile(r"\b__global__\b|__attribute__\s*\(\(\s*global\s*\)\)")
_DECL = re.compile(r"(?:\b(?:static|inline|__noinline__|__forceinline__)\s+)*"
                   r"void\s+([A-Za-z_]\w*)\s*\((.*)\)\s*$", re.S)
_LIMIT = re.compile(r"^[ \t]*#[ \t]*define[ \t]+REFLEX_([A-Za-z0-9_]+)[ \t]+"
                    r"(-?(?:0[xX][0-9a-fA-F]+|\d+))[ \t]*(?:(?://|/\*).*)?$", re.M)
_COMMENT_OR_STRING = re.compile(r'("(?:\\.|[^"\\\n])*")|/\*.*?\*/|//[^\n]*', re.S)


def _strip_comments(text: str) -> str:
    return _COMMENT_OR_STRING.sub(lambda m: m.group(1) or " ", text)


def _drop_attributes(text: str) -> str:
    """``text`` without ``__attribute__((...))`` / ``__launch_bounds__(...)`` groups."""
    out = []
    pos = 0
    for m in _ATTRIBUTE.finditer(text):
        if m.start() < pos:
            continue
        out.append(text[pos:m.start()])
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        pos = i
    out.append(text[pos:])
    return " ".join(out)


def _split_params(text: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "(<[":
            depth += 1
        elif ch in ")>]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    parts = [p.strip() for p in parts]
    return [] if parts in ([""], ["void"]) else parts


def param_kind(param: str) -> str | None:
    """The signature char of one C parameter declaration (``const float* __restrict__ x`` ->
    ``P``), or None when a launch cannot pass it (a struct, a reference, a small integer)."""
    param = param.split("=", 1)[0]  # a default argument
    if "&" in param:
        return None
    if "*" in param or "[" in param:
        return "P"
    words = [w for w in re.findall(r"[A-Za-z_]\w*", param) if w not in _QUALIFIERS]
    if len(words) > 1 and words[-1] not in _TYPE_WORDS:
        words = words[:-1]  # the parameter's name
    return PARAM_KINDS.get(" ".join(words))


def parse_kernel_signatures(text: str, where: str = "source") -> dict[str, str]:
    """{kernel name: signature} of every ``extern "C"`` ``__global__`` function declared or
    defined in ``text`` (C++ source, preprocessed or not; a macro-generated kernel is only seen
    in the preprocessed text). BuildError for a parameter a launch cannot pass, or one kernel
    declared with two different signatures."""
    text = "\n".join(line for line in _strip_comments(text).splitlines()
                      if not line.lstrip().startswith("#"))  # line markers, pragmas
    sigs: dict[str, str] = {}
    for m in _EXTERN_C.finditer(text):
        i, depth = m.end(), 0
        while i < len(text):  # the declaration runs to its body or its ';'
            ch = text[i]
            if ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
            elif ch in "{;" and depth == 0:
                break
            i += 1
        head = text[m.end():i]
        if not head.strip() or not _GLOBAL.search(head):
            continue  # extern "C" { ... } blocks, host functions
        head = _GLOBAL.sub(" ", head)
        d = _DECL.search(_drop_attributes(head).strip())
        if d is None:
            raise BuildError(f"{where}: cannot read the kernel declaration "
                             f"{' '.join(head.split())[:120]!r}")
        name, params = d.group(1), _split_params(d.group(2))
        sig = ""
        for k, p in enumerate(params):
            c = param_kind(p)
            if c is None:
                raise BuildError(
                    f"{where}: kernel {name} parameter {k + 1} ({' '.join(p.split())!r}) is of a "
                    f"type a launch cannot pass; use a pointer, int, unsigned, long long, "
                    f"unsigned long long, float or double")
            sig += c
        if sigs.get(name, sig) != sig:
            raise BuildError(f"{where}: kernel {name} is declared with two signatures "
                             f"({sigs[name]!r} and {sig!r})")
        sigs[name] = sig
    return sigs


def parse_limits(text: str, where: str = "source") -> dict[str, int]:
    """{NAME: value} of the ``#define REFLEX_<NAME> <int>`` lines of ``text``."""
    out: dict[str, int] = {}
    for m in _LIMIT.finditer(text):
        name, value = m.group(1), int(m.group(2), 0)
        if out.get(name, value) != value:
            raise BuildError(f"{where}: REFLEX_{name} is defined as {out[name]} and {value}")
        out[name] = value
    return out


def preprocess(nvcc: str, src: Path, includes: list[Path], sm: int) -> str:
    """``src`` after the C preprocessor (nvcc -E, the device pass for sm_XX)."""
    cmd = [nvcc, "-E", "-std=c++17", f"-arch=sm_{sm}"]
    cmd += [f"-I{inc}" for inc in includes]
    cmd.append(str(src))
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"nvcc -E failed on {src}:\n{' '.join(cmd)}\n{proc.stderr}")
    return proc.stdout


def module_signatures(nvcc: str, src: Path, includes: list[Path], sm: int) -> dict[str, str]:
    """{kernel: signature} of one module: its preprocessed kernels (BuildError when it has
    none: a module nothing can launch is a mistake)."""
    sigs = parse_kernel_signatures(preprocess(nvcc, src, includes, sm), str(src))
    if not sigs:
        raise BuildError(f"{src}: no extern \"C\" __global__ kernel found")
    return sigs


def source_limits(src_dir: Path) -> dict[str, int]:
    """The ``REFLEX_*`` limits of a source folder: its ``.cu`` files and every ``.cuh`` below
    it (the core's cuda/include/reflex/ headers; a plugin's own headers). BuildError when two
    files disagree."""
    out: dict[str, int] = {}
    files = sorted(Path(src_dir).glob("*.cu")) + sorted(Path(src_dir).rglob("*.cuh"))
    for f in files:
        for name, value in parse_limits(f.read_text(), str(f)).items():
            if out.get(name, value) != value:
                raise BuildError(f"{f}: REFLEX_{name} = {value}, but {out[name]} elsewhere")
            out[name] = value
    return out


def build_kernels(src_dir: Path, out_dir: Path, includes: list[Path] | None = None,
                  log=print) -> dict | None:
    """Compile every ``src_dir/*.cu`` into ``out_dir/NAME.fatbin`` and write ``manifest.json``.

    Returns the manifest, or None when REFLEX_SKIP_CUDA is set or there are no sources.
    """
    sources = sorted(Path(src_dir).glob("*.cu"))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if skip_requested():
        log("reflex build: REFLEX_SKIP_CUDA set, no kernels compiled")
        (out_dir / "manifest.json").write_text(json.dumps({"skipped": True, "modules": {}}))
        return None
    if not sources:
        return None
    nvcc = find_nvcc()
    sms, ptx_sm = sass_targets(nvcc)
    threads = int(os.environ.get("REFLEX_NVCC_THREADS", "0") or 0) or (os.cpu_count() or 1)
    includes = [Path(p) for p in (includes or [])]
    log(f"reflex build: {len(sources)} CUDA module(s) from {src_dir} with {nvcc}, "
        f"SASS sm_{',sm_'.join(map(str, sms))}, PTX compute_{ptx_sm}")
    # Modules compile in parallel; each nvcc also parallelises over its targets.
    workers = max(1, min(len(sources), (os.cpu_count() or 1)))
    per = max(1, threads // workers)
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        futs = [pool.submit(compile_module, nvcc, s, out_dir / (s.stem + ".fatbin"), includes,
                            sms, ptx_sm, per) for s in sources]
        sig_futs = [pool.submit(module_signatures, nvcc, s, includes, sms[0]) for s in sources]
        for fut in concurrent.futures.as_completed(futs):
            fut.result()
        kernels: dict[str, str] = {}
        for s, fut in zip(sources, sig_futs):
            for name, sig in fut.result().items():
                if kernels.get(name, sig) != sig:
                    raise BuildError(f"{s}: kernel {name} is also in another module with "
                                     f"signature {kernels[name]!r}")
                kernels[name] = sig
    manifest = {
        "skipped": False,
        "nvcc": nvcc_version(nvcc),
        "sass": [f"sm_{s}" for s in sms],
        "ptx": f"compute_{ptx_sm}",
        "cubins": True,  # NAME.sm_XX.cubin beside each fatbin, one per SASS target
        "modules": {
            s.stem: hashlib.sha256((out_dir / (s.stem + ".fatbin")).read_bytes()).hexdigest()
            for s in sources
        },
        "kernels": kernels,
        "limits": source_limits(Path(src_dir)),
    }
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return manifest


def main(argv: list[str]) -> int:
    """python reflex_core/_build.py SRC_DIR OUT_DIR [INCLUDE...]: compile in place (dev loop)."""
    if len(argv) < 2:
        print(main.__doc__, file=sys.stderr)
        return 2
    try:
        build_kernels(Path(argv[0]), Path(argv[1]), [Path(p) for p in argv[2:]])
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


def core_include_dir() -> Path:
    """The core's shared device headers: packaged (installed core) or in the source tree."""
    here = Path(__file__).resolve().parent
    for cand in (here / "include", here.parent / "cuda" / "include"):
        if (cand / "reflex").is_dir():
            return cand
    raise BuildError("the Reflex core's CUDA headers (reflex/*.cuh) were not found")


def plugin_cmdclass(plugin_root: Path, package: str) -> dict:
    """setuptools ``cmdclass`` for an architecture plugin: its ``build_py`` first compiles
    ``<plugin_root>/cuda/*.cu`` (if any) into ``<package>/kernels/`` against the core's headers."""
    from setuptools.command.build_py import build_py

    root = Path(plugin_root)

    class BuildPyWithKernels(build_py):
        def run(self):
            if list((root / "cuda").glob("*.cu")):
                pkg = root / package if self.editable_mode else Path(self.build_lib) / package
                build_kernels(root / "cuda", pkg / "kernels", [core_include_dir(), root / "cuda"])
            super().run()

    return {"build_py": BuildPyWithKernels}
