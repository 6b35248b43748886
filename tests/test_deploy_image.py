"""The container image (Dockerfile, .dockerignore, scripts/build-wheels.sh,
scripts/runtime-install.sh), checked without a container engine: the Dockerfile lints clean
(hadolint, a test dependency: missing, these tests fail); its stages are the builder with the
CUDA toolkit and a runtime without it, wired to the two scripts; the build context leaves out
what a local build left in the tree; and the runtime stage's install step, run as the script it
is in a fresh venv with nvcc hidden from PATH, installs wheels built by the builder's script
from that context and gives a working ``reflex`` (``plugins``, ``index``, a CPU ``generate``).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def required_tool(name: str) -> str:
    """A test tool of the test extras (pyproject.toml): beside this Python, or on PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.is_file() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is missing: install the test extras (pip install '.[test]'; "
                    "scripts/test.sh does)", pytrace=False)
    return found


# ----------------------------------------------------------------------------------------------
# The Dockerfile


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    out, cur = [], ""
    for line in text.splitlines():
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.lstrip().startswith("#"):  # a comment inside a continued instruction
            continue
        cur += line.rstrip()
        if cur.endswith("\\"):
            cur = cur[:-1] + " "
            continue
        word, _, rest = cur.strip().partition(" ")
        out.append((word.upper(), " ".join(rest.split())))
        cur = ""
    return out


def stages() -> tuple[dict[str, str], dict[str, list[tuple[str, str]]]]:
    """(the ARG defaults before the first FROM, {stage name: its instructions, FROM first})."""
    args: dict[str, str] = {}
    found: dict[str, list] = {}
    cur = None
    for word, rest in instructions((ROOT / "Dockerfile").read_text()):
        if word == "FROM":
            m = re.fullmatch(r"(\S+) AS (\S+)", rest, re.I)
            assert m, rest
            cur = found.setdefault(m.group(2), [])
        if cur is None:
            assert word == "ARG", (word, rest)
            name, _, value = rest.partition("=")
            args[name] = value.strip('"')
        else:
            cur.append((word, rest))
    return args, found


def resolve(ref: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], ref)


def test_dockerfile_lints_clean(tmp_path):
    hadolint = required_tool("hadolint")
    env = dict(os.environ, HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path))  # no user config
    r = subprocess.run([hadolint, "--no-color", "Dockerfile"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    # the linter is at work: a Dockerfile with the faults it knows is refused
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu\nRUN apt-get update && apt-get install -y curl\n")
    r = subprocess.run([hadolint, "--no-color", str(bad)], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0 and {"DL3006", "DL3008", "DL3009", "DL3015"} <= \
        set(re.findall(r"DL\d{4}", r.stdout)), r.stdout


def test_builder_compiles_runtime_has_no_toolkit():
    args, st = stages()
    assert list(st) == ["builder", "runtime"]
    builder, runtime = st["builder"], st["runtime"]
    assert re.fullmatch(r"nvidia/cuda:[\d.]+-devel-\S+", resolve(builder[0][1].split()[0], args))
    assert re.fullmatch(r"python:3\.\d+-slim\S*", resolve(runtime[0][1].split()[0], args))
    # the SM list and the plugins are build arguments; the default plugins are every folder
    assert ("ARG", 'REFLEX_CUDA_ARCH=""') in builder
    assert ("ARG", "REFLEX_PLUGINS") in builder and ("ARG", "REFLEX_PLUGINS") in runtime
    assert sorted(args["REFLEX_PLUGINS"].split()) == \
        sorted(p.name for p in (ROOT / "plugins").iterdir() if (p / "pyproject.toml").is_file())
    builder_runs = " ".join(rest for word, rest in builder if word == "RUN")
    assert "sh scripts/build-wheels.sh /wheels" in builder_runs
    # the runtime: the install script over the builder's wheels, nothing of the toolkit
    runs = [rest for word, rest in runtime if word == "RUN"]
    assert len(runs) == 2 and "sh /tmp/runtime-install.sh /opt/reflex /wheels" in runs[0]
    assert "from=builder,source=/wheels" in runs[0]
    assert "source=scripts/runtime-install.sh,target=/tmp/runtime-install.sh" in runs[0]
    assert not any(re.search(r"nvcc|cuda-toolkit|apt-get|\bcuda\b", rest)
                   for word, rest in runtime if word in ("RUN", "COPY", "ADD"))
    assert ("ENV", "NVIDIA_DRIVER_CAPABILITIES=compute,utility PATH=/opt/reflex/bin:$PATH") \
        in runtime
    assert json.loads(dict(runtime)["ENTRYPOINT"]) == ["reflex", "generate"]
    user = dict(runtime)["USER"]
    assert user.split(":")[0].isdigit() and int(user.split(":")[0]) != 0
    # the plugins' entry points are found at build time, as the image's user, into its cache
    assert runtime.index(("RUN", '["reflex", "plugins"]')) > runtime.index(("USER", user))


# ----------------------------------------------------------------------------------------------
# The build context


def ignore_patterns() -> list[re.Pattern]:
    """.dockerignore's patterns as regular expressions (the subset it uses: *, **, no '!')."""
    pats = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        assert not line.startswith("!"), "exceptions are not modelled here"
        rx = re.escape(line.strip("/")).replace(r"\*\*/", "(?:.*/)?").replace(r"\*", "[^/]*")
        pats.append(re.compile(rx))
    return pats


def in_context(rel: str, pats: list[re.Pattern]) -> bool:
    """Whether the path ``rel`` (relative to the repository) goes into the build context: not
    when it, or a folder above it, matches a pattern."""
    parts = rel.split("/")
    return not any(p.fullmatch("/".join(parts[:i])) for p in pats for i in range(1, len(parts) + 1))


def copied_sources(stage: list[tuple[str, str]]) -> list[str]:
    """The context paths a stage's COPY (without --from) and RUN bind mounts take."""
    out = []
    for word, rest in stage:
        if word == "COPY" and "--from" not in rest:
            out += [a for a in rest.split()[:-1] if not a.startswith("--")]
        if word == "RUN":
            out += [m.group(1) for m in re.finditer(r"--mount=type=bind,source=([^, ]+)", rest)]
    return out


def test_context_has_the_sources_and_not_local_build_outputs():
    pats = ignore_patterns()
    _, st = stages()
    taken = copied_sources(st["builder"]) + copied_sources(st["runtime"])
    assert {"reflex_core", "cuda", "plugins", "scripts/build-wheels.sh",
            "scripts/runtime-install.sh", "deploy/fanout.py"} <= set(taken)
    for rel in taken:
        assert (ROOT / rel).exists() and in_context(rel, pats), rel
    for rel in ["reflex_core/gguf_index.py", "cuda/core.cu", "cuda/include/reflex/common.cuh",
                "plugins/qwen35_hybrid/cuda/qwen35.cu", "plugins/qwen3/setup.py"]:
        assert (ROOT / rel).exists() and in_context(rel, pats), rel
    for rel in ["reflex_core/kernels/core.sm_90.cubin", "reflex_core/include/reflex/common.cuh",
                "plugins/qwen35_hybrid/reflex_qwen35_hybrid/kernels/manifest.json",
                "plugins/qwen3/build/lib/reflex_qwen3/plugin.py", "build/lib/reflex_core/ops.py",
                "reflex_infer.egg-info/PKG-INFO", "plugins/qwen3/reflex_infer_qwen3.egg-info/x",
                "reflex_core/__pycache__/ops.cpython-312.pyc", ".venv/bin/python", ".git/HEAD",
                "tests/test_api.py"]:
        assert not in_context(rel, pats), rel


def copy_context(dest: Path, sources: list[str]) -> None:
    """What the builder stage's COPY instructions see: ``sources`` less what .dockerignore
    leaves out."""
    pats = ignore_patterns()
    for rel in sources:
        src = ROOT / rel
        files = [src] if src.is_file() else [p for p in src.rglob("*") if p.is_file()]
        for f in files:
            r = f.relative_to(ROOT).as_posix()
            if in_context(r, pats):
                (dest / r).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, dest / r)


# ----------------------------------------------------------------------------------------------
# The install steps, run as scripts


def without_nvcc(path: str) -> str:
    """PATH less every folder holding an nvcc."""
    keep = [d for d in path.split(os.pathsep) if d and not (Path(d) / "nvcc").exists()]
    return os.pathsep.join(keep)


def run(cmd: list[str], env: dict, timeout: float = 600, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, **kw)
    assert r.returncode == 0, f"{shlex.join(cmd)}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def test_runtime_install_in_a_fresh_venv_without_nvcc(tmp_path, qwen_tok_file):
    _, st = stages()
    ctx = tmp_path / "context"
    copy_context(ctx, copied_sources(st["builder"]))
    base = {k: v for k, v in os.environ.items()
            if k not in ("CUDA_HOME", "CUDA_PATH", "REFLEX_NVCC", "VIRTUAL_ENV", "PYTHONPATH")}
    base["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    # the builder's step (nvcc skipped: the kernels' compilation is scripts/test.sh's install)
    wheels = tmp_path / "wheels"
    run(["sh", str(ctx / "scripts" / "build-wheels.sh"), str(wheels)],
        dict(base, REFLEX_SKIP_CUDA="1", REFLEX_PLUGINS="qwen3", PYTHON=sys.executable))
    assert sorted(w.name.split("-")[0] for w in wheels.glob("*.whl")) == \
        ["reflex_infer", "reflex_infer_qwen3"]
    # the runtime's step, in a fresh venv, with no nvcc to be found
    env = dict(base, PATH=without_nvcc(base["PATH"]), REFLEX_PLUGINS="qwen3",
               PYTHON=sys.executable)
    assert shutil.which("nvcc", path=env["PATH"]) is None
    venv = tmp_path / "venv"
    r = run(["sh", str(ROOT / "scripts" / "runtime-install.sh"), str(venv), str(wheels)], env)
    assert "reflex-infer-qwen3 0.1.0: qwen3" in r.stdout
    assert not list(venv.rglob("nvcc"))
    # modules byte-compiled at install (a read-only image could not cache them at run time)
    site = next(venv.glob("lib/python3*/site-packages"))
    assert list((site / "reflex_core" / "__pycache__").glob("gguf_index.*.pyc"))
    reflex = str(venv / "bin" / "reflex")
    plugins = json.loads(run([reflex, "plugins", "--json"], env).stdout)
    assert [p["name"] for p in plugins] == ["reflex-infer-qwen3"]
    model = tmp_path / "models" / "m.gguf"
    model.parent.mkdir()
    shutil.copyfile(qwen_tok_file, model)
    run([reflex, "index", str(model)], env)
    r = run([reflex, "generate", str(model), "The capital of France is", "-n", "3",
             "--backend", "cpu", "--json", "--timings"], env)
    out = json.loads(r.stdout)
    assert out["status"] == "ok" and out["n_tokens"] == 3 and out["backend"] == "cpu"
    assert f"gguf index: hit, prebuilt {model}.rxi" in r.stderr
