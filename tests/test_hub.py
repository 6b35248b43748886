"""--quickstart and --model REPO[:FILE] without network: a Hugging Face cache laid out by the test."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reflex_core import hub
from reflex_core.errors import ReflexError
from reflex_core.testing.modelwriter import ModelShape, write_model

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def place(cache: Path, repo: str, files: dict[str, Path], commit: str = COMMIT) -> Path:
    """Put ``files`` (name -> source) into ``cache`` as the snapshot of ``repo`` at main."""
    root = cache / ("models--" + repo.replace("/", "--"))
    snap = root / "snapshots" / commit
    snap.mkdir(parents=True, exist_ok=True)
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / "main").write_text(commit)
    for name, src in files.items():
        shutil.copyfile(src, snap / name)
    return snap


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return write_model(tmp_path_factory.mktemp("hubm") / "m.gguf", ModelShape(), weight_type="Q8_0",
                       tokenizer="qwen3", seed=5)


@pytest.fixture
def cache(tmp_path, model) -> Path:
    c = tmp_path / "hub"
    place(c, hub.DEFAULT_REPO, {hub.DEFAULT_FILE: model})
    place(c, "someone/tiny-GGUF", {"tiny-Q4_K_M.gguf": model})
    place(c, "someone/many-GGUF", {"many-F16.gguf": model, "many-Q4_K_M.gguf": model,
                                    "many-Q8_0.gguf": model})
    place(c, "someone/split-GGUF", {"big-00001-of-00003.gguf": model})
    return c


def reflex(cache: Path, *args: str, offline: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_CACHE=str(cache), HF_HUB_DISABLE_TELEMETRY="1")
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    return subprocess.run([sys.executable, "-m", "reflex_core", *args], capture_output=True,
                          text=True, env=env, timeout=120)


def test_quickstart_offline_uses_the_cached_default_model(cache):
    p = reflex(cache, "generate", "--quickstart", "Once upon a time", "-n", "3", "--backend", "cpu",
               "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["n_prompt_tokens"] == 4 and 1 <= d["n_tokens"] <= 3


def test_model_repo_with_one_gguf_and_with_explicit_file(cache):
    for spec in ("someone/tiny-GGUF", "someone/tiny-GGUF:tiny-Q4_K_M.gguf"):
        p = reflex(cache, "generate", "--model", spec, "Hi", "-n", "2", "--backend", "cpu")
        assert p.returncode == 0, p.stderr
        assert "REFLEX_GENERATE_OK" in p.stdout


def test_several_ggufs_pick_q8_0_and_say_so(cache):
    p = reflex(cache, "system1", "--model", "someone/many-GGUF", "The capital of France is",
               "--candidate", " Paris", "--candidate", " Rome", "--backend", "cpu")
    assert p.returncode == 0, p.stderr
    assert "using many-Q8_0.gguf" in p.stderr
    assert "REFLEX_SYSTEM1_OK" in p.stdout


def test_missing_file_offline_names_repo_file_and_download_command(cache):
    p = reflex(cache, "generate", "--model", "someone/tiny-GGUF:tiny-Q8_0.gguf", "Hi")
    assert p.returncode == 1 and "Traceback" not in p.stderr
    line = p.stderr.strip()
    assert "\n" not in line
    assert "someone/tiny-GGUF:tiny-Q8_0.gguf" in line
    assert "hf download someone/tiny-GGUF tiny-Q8_0.gguf" in line
    p = reflex(cache, "generate", "--model", "nobody/nothing-GGUF", "Hi")
    assert p.returncode == 1 and "hf download nobody/nothing-GGUF" in p.stderr


def test_quickstart_missing_offline(tmp_path):
    p = reflex(tmp_path / "empty-cache", "generate", "--quickstart", "Hi")
    assert p.returncode == 1
    assert f"hf download {hub.DEFAULT_REPO} {hub.DEFAULT_FILE}" in p.stderr


def test_the_advised_download_command_runs_as_printed(tmp_path):
    """The advice names a command a user's shell finds: with only the system's folders on PATH
    (the venv not activated), the printed command line runs (asked for its help, offline)."""
    p = reflex(tmp_path / "empty-cache", "generate", "--quickstart", "Hi")
    advice = p.stderr.strip().split("download it with: ", 1)[1]
    assert advice.endswith(f"download {hub.DEFAULT_REPO} {hub.DEFAULT_FILE}"), advice
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env["PATH"] = "/usr/bin:/bin"
    q = subprocess.run(["sh", "-c", advice + " --help"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert q.returncode == 0, (advice, q.stderr)
    assert "download" in q.stdout.lower()


def test_split_gguf_is_refused_clearly(cache):
    p = reflex(cache, "generate", "--model", "someone/split-GGUF", "Hi")
    assert p.returncode == 1 and "split GGUF" in p.stderr and "Traceback" not in p.stderr


def test_usage(cache, model):
    assert reflex(cache, "generate", "--quickstart").returncode == 2  # no prompt
    assert reflex(cache, "generate", "--quickstart", "--model", "a/b", "Hi").returncode == 2
    assert reflex(cache, "generate", str(model), "Hi", "--revision", "abc").returncode == 2
    p = reflex(cache, "generate", "--model", "not a repo", "Hi")
    assert p.returncode == 1 and "ORG/NAME" in p.stderr


def test_revision_pins_a_commit(cache, model):
    place(cache, "someone/pinned-GGUF", {"p-Q8_0.gguf": model}, commit="f" * 40)
    p = reflex(cache, "generate", "--model", "someone/pinned-GGUF:p-Q8_0.gguf", "--revision",
               "f" * 40, "Hi", "-n", "1", "--backend", "cpu")
    assert p.returncode == 0, p.stderr
    p = reflex(cache, "generate", "--model", "someone/pinned-GGUF:p-Q8_0.gguf", "--revision",
               "e" * 40, "Hi", "-n", "1", "--backend", "cpu")
    assert p.returncode == 1 and f"--revision {'e' * 40}" in p.stderr


def test_online_branch_downloads_through_huggingface_hub(monkeypatch, tmp_path, model):
    """Online: list the repo, pick the file, download it with huggingface_hub (which draws its
    progress bar on a terminal) into the cache; no local_files_only."""
    import huggingface_hub

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hub, "_hub_reachable", lambda *a: True)
    calls = []
    monkeypatch.setattr(hub, "_ask_hub", lambda *a: calls.append(("ask",) + a))

    def fake_list(self, repo_id, revision=None, **kw):
        calls.append(("list", repo_id, revision))
        return ["README.md", "x-F16.gguf", "x-Q8_0.gguf"]

    def fake_download(repo_id, filename, revision=None, local_files_only=False, **kw):
        calls.append(("download", repo_id, filename, revision, local_files_only))
        return str(model)

    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_files", fake_list)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    notes = []
    path = hub.resolve("org/x-GGUF", revision="v1", log=notes.append)
    assert path == str(model)
    assert calls == [("list", "org/x-GGUF", "v1"), ("ask", "org/x-GGUF", "x-Q8_0.gguf", "v1"),
                     ("download", "org/x-GGUF", "x-Q8_0.gguf", "v1", False)]
    assert notes and "x-Q8_0.gguf" in notes[0]


def test_dead_network_falls_back_to_the_cache_or_fails_in_one_line(monkeypatch, tmp_path, model):
    import huggingface_hub

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hub, "_hub_reachable", lambda *a: True)  # the probe passes, the GET fails
    monkeypatch.setattr(hub, "_ask_hub", lambda *a: None)

    def dead(repo_id, filename, revision=None, local_files_only=False, **kw):
        if local_files_only:
            if filename == "cached.gguf":
                return str(model)
            raise huggingface_hub.errors.LocalEntryNotFoundError("not cached")
        raise ConnectionError("network is unreachable")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", dead)
    assert hub.resolve("org/y-GGUF:cached.gguf") == str(model)
    with pytest.raises(ReflexError) as e:
        hub.resolve("org/y-GGUF:other.gguf")
    assert "hf download org/y-GGUF other.gguf" in str(e.value) and "\n" not in str(e.value)


def test_a_hub_that_never_answers_costs_a_bounded_wait(monkeypatch, model):
    """A Hub that accepts connections and never answers: the file's metadata is asked within
    ASK_DEADLINE_S (huggingface_hub's own retries of a file not cached took minutes), then the
    cache serves the file or the one-line error names the download command; a listing that
    times out makes the Hub unreachable for the rest of the call."""
    import threading
    import time

    import huggingface_hub

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hub, "_hub_reachable", lambda *a: True)
    monkeypatch.setattr(hub, "ASK_DEADLINE_S", 0.3)
    monkeypatch.setattr(hub, "LIST_DEADLINE_S", 0.3)
    hang = threading.Event()
    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", lambda *a, **kw: hang.wait(30))
    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_files",
                        lambda *a, **kw: hang.wait(30))
    online = []

    def download(repo_id, filename, revision=None, local_files_only=False, **kw):
        if not local_files_only:
            online.append(filename)
            hang.wait(30)
        if filename == "cached.gguf":
            return str(model)
        raise huggingface_hub.errors.LocalEntryNotFoundError("not cached")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    monkeypatch.setattr(hub, "_cached_ggufs", lambda *a: ["cached.gguf"])
    try:
        t0 = time.monotonic()
        assert hub.resolve("org/y-GGUF:cached.gguf") == str(model)
        with pytest.raises(ReflexError) as e:
            hub.resolve("org/y-GGUF:other.gguf")
        assert "hf download org/y-GGUF other.gguf" in str(e.value)
        assert "took longer than" in str(e.value)
        assert hub.resolve("org/y-GGUF", log=lambda m: None) == str(model)  # listing timed out
        assert time.monotonic() - t0 < 5 and online == []
    finally:
        hang.set()


def test_behind_a_proxy_the_hub_is_not_probed_directly(monkeypatch):
    import socket

    def no_direct(*a, **kw):
        raise AssertionError("a direct connection behind a proxy")

    monkeypatch.setattr(socket, "create_connection", no_direct)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    assert hub._hub_reachable(0.5) is True


def test_an_unreadable_cache_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr(hub, "_cache_dir", lambda: tmp_path)
    root = tmp_path / "models--org--x-GGUF"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").mkdir()  # read_text fails: a folder, as an unreadable file would
    from pathlib import Path

    real = Path.is_file
    monkeypatch.setattr(Path, "is_file", lambda self: True if self.name == "main" else real(self))
    with pytest.raises(ReflexError, match="cannot read the Hugging Face cache"):
        hub._cached_ggufs("org/x-GGUF", None)


def test_download_command_is_shell_quoted():
    import shlex

    cmd = hub.download_command("org/x-GGUF", "x (1).gguf", "my branch")
    assert shlex.split(cmd)[-4:] == ["org/x-GGUF", "x (1).gguf", "--revision", "my branch"]


def test_choose_file_rules():
    assert hub.choose_file(["a.gguf"], "r") == ("a.gguf", None)
    assert hub.choose_file(["m-Q4_K_M.gguf", "m-F16.gguf"], "r")[0] == "m-Q4_K_M.gguf"
    with pytest.raises(ReflexError, match="none is Q8_0 or Q4_K_M"):
        hub.choose_file(["a-F16.gguf", "a-BF16.gguf"], "r")
    with pytest.raises(ReflexError, match="no .gguf"):
        hub.choose_file(["README.md"], "r")
    # Q8_0 before Q4_K_M; among several hits the shortest name (the plain quantization, not a
    # variant of it); the parts of a split file are never picked
    files = ["m-Q4_K_M.gguf", "m-Q8_0-imatrix-v2.gguf", "m-Q8_0.gguf", "x-Q8_0-00001-of-00002.gguf"]
    pick, notice = hub.choose_file(files, "r")
    assert pick == "m-Q8_0.gguf" and "using m-Q8_0.gguf" in notice
    assert hub.choose_file(["b-Q8_0-00001-of-00002.gguf", "b-Q8_0-00002-of-00002.gguf",
                            "b-Q4_K_M.gguf"], "r")[0] == "b-Q4_K_M.gguf"
    # only split files of the preferred types: said so, not "none is Q8_0 or Q4_K_M"
    with pytest.raises(ReflexError, match="are split files.*llama-gguf-split --merge"):
        hub.choose_file(["b-Q8_0-00001-of-00002.gguf", "b-Q8_0-00002-of-00002.gguf",
                         "b-F16.gguf"], "r")


def test_parse_spec():
    assert hub.parse_spec("Org/Name") == ("Org/Name", None)
    assert hub.parse_spec(" org/name.v2 : m-Q8_0.GGUF ") == ("org/name.v2", "m-Q8_0.GGUF")
    for bad in ("name", "a/b/c", "a b/c", "/name", "org/"):
        with pytest.raises(ReflexError, match="ORG/NAME"):
            hub.parse_spec(bad)
    with pytest.raises(ReflexError, match="is not a .gguf file"):
        hub.parse_spec("org/name:model.bin")


@pytest.mark.parametrize("value,offline", [("1", True), ("true", True), (" YES ", True),
                                           ("on", True), ("0", False), ("", False),
                                           ("off", False)])
def test_offline_switch_values(monkeypatch, value, offline):
    monkeypatch.setenv("HF_HUB_OFFLINE", value)
    assert hub._offline() is offline


def test_local_path_does_not_import_huggingface_hub(model):
    code = ("import sys; from reflex_core import engine\n"
            f"engine.load({str(model)!r}, 'cpu', prompt='hi')\n"
            "print('huggingface_hub' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_unreachable_hub_uses_the_cache_without_downloading(monkeypatch, model):
    import huggingface_hub

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hub, "_hub_reachable", lambda *a: False)
    seen = []

    def cached_only(repo_id, filename, revision=None, local_files_only=False, **kw):
        seen.append(local_files_only)
        return str(model)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", cached_only)
    assert hub.resolve("org/z-GGUF:z.gguf") == str(model)
    assert seen == [True]
