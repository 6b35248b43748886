"""The cache directory (reflex_core.cachedir): created 0700, refused when another user could
write to it (one notice, no cache for the process), written without following symlinks.

The finding "Temp-file hijack": ``write_atomic`` opened a predictable ``<file>.<pid>.tmp``
without O_EXCL/O_NOFOLLOW and accepted a cache directory owned by another user; in a
world-writable cache another user's symlinks made a root run overwrite root-owned files.
(These tests run as root in CI, like that run; the ownership ones chown to another uid.)
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from reflex_core import cachedir

OTHER_UID = 12345

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


@pytest.fixture
def xdg(tmp_path, monkeypatch):
    """A fresh XDG_CACHE_HOME, and cachedir's per-process memory of refused roots reset."""
    d = tmp_path / "xdg"
    monkeypatch.setenv("XDG_CACHE_HOME", str(d))
    monkeypatch.setattr(cachedir, "_refused", {}, raising=False)  # (raising: for old code)
    return d


def mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def test_cache_dirs_are_created_0700(xdg):
    assert cachedir.cache_dir("index") == str(xdg / "reflex" / "index")
    assert mode(xdg / "reflex") == 0o700 and mode(xdg / "reflex" / "index") == 0o700
    target = xdg / "reflex" / "a" / "b" / "file"
    assert cachedir.write_atomic(str(target), b"data")
    assert target.read_bytes() == b"data" and mode(target) == 0o600
    assert mode(xdg / "reflex" / "a") == 0o700 and mode(xdg / "reflex" / "a" / "b") == 0o700
    assert os.listdir(target.parent) == ["file"]  # no temporary file left


def plant(victims: Path, where: Path, names: list[str]) -> list[Path]:
    """Symlinks ``where/name`` -> a victim file of ours holding b"precious"."""
    out = []
    victims.mkdir(exist_ok=True)
    for i, name in enumerate(names):
        victim = victims / f"victim{i}"
        victim.write_bytes(b"precious")
        os.symlink(victim, where / name)
        out.append(victim)
    return out


def test_symlinks_planted_in_a_world_writable_cache_are_not_followed(xdg, tmp_path, capsys):
    """A cache folder anyone can write to (like /tmp) with symlinks at the names a write would
    use (the old predictable temporary name, the target): no victim is written, and the cache
    is refused, with one notice."""
    index = xdg / "reflex" / "index"
    index.mkdir(parents=True)
    os.chmod(xdg / "reflex", 0o777)
    os.chmod(index, 0o777)
    target = index / "model.rxi"
    victims = plant(tmp_path / "victims", index,
                    [f"{target.name}.{os.getpid()}.tmp", target.name])
    for _ in range(3):
        cachedir.write_atomic(str(target), b"attacker-chosen? no: ours")
    assert [v.read_bytes() for v in victims] == [b"precious", b"precious"]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "other users can write to it" in err, err
    assert cachedir.cache_dir("index") is None and cachedir.read_file(str(target), 100) is None


def test_symlinks_in_our_own_cache_are_replaced_not_followed(xdg, tmp_path):
    index = xdg / "reflex" / "index"
    index.mkdir(parents=True, mode=0o700)
    os.chmod(xdg / "reflex", 0o700)
    target = index / "model.rxi"
    victims = plant(tmp_path / "victims", index,
                    [f"{target.name}.{os.getpid()}.tmp", target.name])
    assert cachedir.write_atomic(str(target), b"new")
    assert [v.read_bytes() for v in victims] == [b"precious", b"precious"]
    assert not target.is_symlink() and target.read_bytes() == b"new"


WHY = {"symlink": "it is a symbolic link", "file": "it is not a directory",
       "group-writable": "other users can write to it", "other-user": "it is owned by uid 12345"}


@pytest.mark.parametrize("how", sorted(WHY))
def test_an_unsafe_cache_dir_is_refused_with_one_notice(xdg, tmp_path, capsys, how):
    root = xdg / "reflex"
    xdg.mkdir()
    if how == "symlink":  # even to a folder of ours that would pass
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        os.symlink(tmp_path / "elsewhere", root)
    elif how == "file":
        root.write_bytes(b"")
    else:
        root.mkdir(mode=0o700)
        if how == "group-writable":
            os.chmod(root, 0o770)
        else:
            if os.geteuid() != 0:
                pytest.skip("chown to another uid needs root")
            os.chown(root, OTHER_UID, OTHER_UID)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    assert cachedir.cache_dir() is None
    assert cachedir.cache_dir("index") is None
    assert not cachedir.write_atomic(str(root / "index" / "x.rxi"), b"x")
    assert not cachedir.write_atomic(str(root / "entry-points.json"), b"x")
    assert cachedir.read_file(str(root / "entry-points.json"), 100) is None
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written anywhere
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("notice: not using the cache directory"), err
    assert WHY[how] in err, err


@needs_root
def test_a_subfolder_owned_by_another_user_is_refused_and_not_read(xdg, capsys):
    index = xdg / "reflex" / "index"
    assert cachedir.cache_dir("index")
    (index / "model.rxi").write_bytes(b"planted")
    os.chown(index, OTHER_UID, OTHER_UID)
    assert cachedir.read_file(str(index / "model.rxi"), 100) is None
    assert "owned by uid 12345" in capsys.readouterr().err


def test_paths_outside_the_cache_are_neither_written_nor_read(xdg, tmp_path):
    outside = tmp_path / "outside"
    assert not cachedir.write_atomic(str(outside), b"x") and not outside.exists()
    assert not cachedir.write_atomic(str(xdg / "reflex" / ".." / "escape"), b"x")
    assert not (xdg / "escape").exists()
    outside.write_bytes(b"x")
    assert cachedir.read_file(str(outside), 100) is None


def test_create_dirs_false_creates_nothing(xdg):
    """The detached index writer's writes: into existing folders only."""
    target = xdg / "reflex" / "index" / "m.rxi"
    assert not cachedir.write_atomic(str(target), b"x", create_dirs=False)
    assert not xdg.exists()
    assert cachedir.cache_dir("index", create=False) is None and not xdg.exists()
    assert cachedir.cache_dir("index")
    assert cachedir.write_atomic(str(target), b"x", create_dirs=False)
    assert target.read_bytes() == b"x"


def test_special_files_and_oversized_files_are_not_read(xdg):
    index = Path(cachedir.cache_dir("index"))
    os.mkfifo(index / "fifo")  # opening it for reading would block
    os.symlink("/dev/zero", index / "zero")
    (index / "big").write_bytes(b"x" * 101)
    (index / "ok").write_bytes(b"x" * 100)
    for name in ("fifo", "zero", "big", "missing"):
        assert cachedir.read_file(str(index / name), 100) is None
        assert name == "big" or cachedir.open_file(str(index / name)) is None
    assert cachedir.read_file(str(index / "ok"), 100) == b"x" * 100


def test_a_write_interrupted_by_an_exception_leaves_no_temporary_file(xdg, monkeypatch):
    folder = Path(cachedir.cache_dir("index"))

    class Boom(BaseException):
        pass

    def fail(*a, **k):
        raise Boom

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(Boom):
        cachedir.write_atomic(str(folder / "f"), b"x")
    assert os.listdir(folder) == [] and cachedir._in_flight == {}


@needs_root
def test_reflex_with_a_cache_owned_by_another_user_runs_uncached_with_one_notice(
        tmp_path, model_files):
    """End to end: a command still works, says once why it uses no cache, and writes nothing
    into the other user's folder (before the fix: it wrote its caches there, silently)."""
    from reflex_core.testing.modelwriter import ModelShape

    model = model_files(ModelShape(n_layer=1), tokenizer="qwen3")
    xdg = tmp_path / "xdg"
    root = xdg / "reflex"
    root.mkdir(parents=True, mode=0o700)
    os.chown(root, OTHER_UID, OTHER_UID)
    env = dict(os.environ, XDG_CACHE_HOME=str(xdg))
    env.pop("REFLEX_NO_INDEX", None)
    p = subprocess.run([sys.executable, "-m", "reflex_core", "generate", str(model), "Hello",
                        "-n", "2", "--backend", "cpu"], capture_output=True, text=True, env=env,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith(f"notice: not using the cache directory {root}: it is owned by "
                               f"uid {OTHER_UID}"), p.stderr
    assert os.listdir(root) == []


def test_nothing_outside_the_cache_root_is_written_or_read(xdg):
    """A path beside the root that shares its name's beginning (reflex-other next to reflex) or
    leaves it through "..": refused."""
    assert cachedir.cache_dir() is not None
    beside = xdg / "reflex-other" / "f"
    beside.parent.mkdir(mode=0o700)
    assert not cachedir.write_atomic(str(beside), b"x") and not beside.exists()
    up = xdg / "reflex" / ".." / "g"
    assert not cachedir.write_atomic(str(up), b"x") and not (xdg / "g").exists()
    (xdg / "h").write_bytes(b"outside")
    assert cachedir.read_file(str(xdg / "reflex" / ".." / "h"), 100) is None
