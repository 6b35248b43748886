"""Whether a change leaves the GPU's machine code as it was, without a GPU: every CUDA module of
this tree and of a git revision compiled for one SASS target with the build's own code flags
(reflex_core/_build.py code_flags), the cubins compared, and where two differ, their ELF
sections, so the report names the kernels whose code, attributes or constants changed.

    python bench/sass_same.py [--base REV] [--sm 90] [--jobs N] [MODULE.cu ...]

For a change meant not to alter what the GPU runs (device code refactored, a helper shared, a
comment): identical cubins mean the kernels execute the same instructions with the same
resources, so the change needs no device run to be trusted. It says nothing about a change that
does alter the code: that one is measured on the GPU. The modules: the core's cuda/*.cu, each
plugin's plugins/*/cuda/*.cu (with its own folder on the include path, as its build has), the
labs' bench/*.cu and tests/plugins/*/cuda/*.cu; MODULE arguments (paths in the tree) narrow that.
Exit status 0: every module the same (or compiling on neither tree for the target); 1: a module
differs, is new or is gone; 2: usage, or nvcc failed on one tree only.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _load_build():
    spec = importlib.util.spec_from_file_location("reflex_build", ROOT / "reflex_core" / "_build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    return build


def modules(tree: Path) -> dict[str, list[Path]]:
    """Each CUDA module of ``tree`` (its path in the tree) -> its include folders."""
    core_inc = tree / "cuda" / "include"
    found = {}
    for src in sorted((tree / "cuda").glob("*.cu")):
        found[str(src.relative_to(tree))] = [core_inc]
    for pattern in ("plugins/*/cuda/*.cu", "tests/plugins/*/cuda/*.cu"):
        for src in sorted(tree.glob(pattern)):
            found[str(src.relative_to(tree))] = [core_inc, src.parent]
    for src in sorted((tree / "bench").glob("*.cu")):
        found[str(src.relative_to(tree))] = [core_inc]
    return found


def compile_cubin(build, nvcc: str, tree: Path, rel: str, includes: list[Path], sm: int,
                  out: Path) -> str | None:
    """``tree/rel`` compiled to ``out``; None, or nvcc's complaint."""
    cmd = [nvcc, "-cubin", *build.code_flags(includes), f"-arch=sm_{build._sass_arch(sm)}",
           "-o", str(out), str(tree / rel)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    return None if proc.returncode == 0 else (proc.stdout + proc.stderr).strip()


def elf_sections(data: bytes) -> dict[str, tuple]:
    """A cubin's (64-bit little-endian ELF) sections: name -> (type, flags, info, link, entsize,
    contents); sh_info carries a kernel's register count, so it is part of what is compared."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    heads = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    str_off, str_size = heads[shstrndx][4], heads[shstrndx][5]
    names = data[str_off:str_off + str_size]
    out = {}
    for i, (name, typ, flags, _addr, off, size, link, info, _align, entsize) in enumerate(heads):
        label = names[name:names.index(b"\0", name)].decode() or f"#{i}"
        body = b"" if typ == 8 else data[off:off + size]  # SHT_NOBITS: the size alone
        out[label if label not in out else f"{label}#{i}"] = (typ, flags, info, link, entsize,
                                                              size, body)
    return out


def section_report(base: bytes, new: bytes) -> list[str]:
    """What differs between two cubins, a line per kernel or module-wide section."""
    a, b = elf_sections(base), elf_sections(new)
    kernels_a = {n[len(".text."):] for n in a if n.startswith(".text.")}
    kernels_b = {n[len(".text."):] for n in b if n.startswith(".text.")}
    lines = [f"new kernel {k}" for k in sorted(kernels_b - kernels_a)]
    lines += [f"kernel gone {k}" for k in sorted(kernels_a - kernels_b)]
    changed: dict[str, list[str]] = {}
    both = sorted(kernels_a & kernels_b, key=len, reverse=True)  # the longest name that fits wins
    for name in sorted(set(a) | set(b)):
        if a.get(name) == b.get(name):
            continue
        owner = next((k for k in both if name.endswith("." + k)), None)
        if owner is None:
            if not any(name.endswith("." + k) for k in kernels_a ^ kernels_b):
                changed.setdefault("(module)", []).append(name)
        else:
            changed.setdefault(owner, []).append(name[:-len(owner) - 1] or name)
    for owner, names in changed.items():
        lines.append(f"{'module sections' if owner == '(module)' else 'kernel ' + owner}: "
                     f"{', '.join(names)} differ")
    return lines or ["the files differ, their sections do not (section order or padding)"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="HEAD", help="git revision to compare with (default HEAD)")
    ap.add_argument("--sm", type=int, default=90, help="SASS target (default 90: sm_90a)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("module", nargs="*", help="only these modules (paths in the tree)")
    args = ap.parse_args(argv)
    build = _load_build()
    try:
        nvcc = build.find_nvcc()
    except build.BuildError as e:
        print(f"sass_same: {e}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="reflex-sass-") as tmp:
        base_tree = Path(tmp) / "base"
        base_tree.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.base], capture_output=True)
        if archive.returncode != 0:
            print(f"sass_same: git archive {args.base}: {archive.stderr.decode().strip()}",
                  file=sys.stderr)
            return 2
        subprocess.run(["tar", "-x", "-C", str(base_tree)], input=archive.stdout, check=True)
        trees = {"base": base_tree, "new": ROOT}
        mods = {name: modules(tree) for name, tree in trees.items()}
        wanted = sorted(set(mods["base"]) | set(mods["new"]))
        if args.module:
            unknown = [m for m in args.module if m not in wanted]
            if unknown:
                print(f"sass_same: not a CUDA module of either tree: {', '.join(unknown)}",
                      file=sys.stderr)
                return 2
            wanted = args.module
        jobs = {}
        with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
            for rel in wanted:
                for name, tree in trees.items():
                    if rel in mods[name]:
                        out = Path(tmp) / name / (rel.replace("/", "__") + ".cubin")
                        out.parent.mkdir(exist_ok=True)
                        jobs[name, rel] = (out, pool.submit(compile_cubin, build, nvcc, tree, rel,
                                                            mods[name][rel], args.sm, out))
        errors = {key: fut.result() for key, (_out, fut) in jobs.items()}
        # a module that compiles on neither tree for this target (an sm_90-only lab on sm_80)
        # is the same on both; one that compiles on one side only is an error
        neither = [rel for rel in wanted
                   if errors.get(("base", rel)) is not None and errors.get(("new", rel)) is not None]
        failed = [(name, rel) for (name, rel), err in sorted(errors.items())
                  if err is not None and rel not in neither]
        for name, rel in failed:
            err = errors[name, rel].splitlines()
            print(f"sass_same: nvcc failed on {rel} ({name}):\n" + "\n".join(err[:20])
                  + (f"\n... ({len(err) - 20} more lines)" if len(err) > 20 else ""),
                  file=sys.stderr)
        if failed:
            return 2
        print(f"sass_same: sm_{build._sass_arch(args.sm)}, this tree against {args.base}")
        differ = False
        for rel in wanted:
            if rel in neither:
                first = next((ln for ln in errors["new", rel].splitlines() if "error" in ln), "")
                print(f"  {rel}: compiles on neither tree for this target ({first.strip()})")
                continue
            if (("base", rel) in jobs) != (("new", rel) in jobs):
                differ = True
                print(f"  {rel}: {'new module' if ('new', rel) in jobs else 'module gone'}")
                continue
            base = jobs["base", rel][0].read_bytes()
            new = jobs["new", rel][0].read_bytes()
            if base == new:
                print(f"  {rel}: same ({len(new)} bytes)")
                continue
            differ = True
            print(f"  {rel}: DIFFERS")
            for line in section_report(base, new):
                print(f"    {line}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
