"""Reflex's on-disk caches (the plugin entry-point list, GGUF indexes): where they live, when
they may be used, and how they are read and written. Stdlib only; on the cold path.

A cache is only as trustworthy as its directory. ``$XDG_CACHE_HOME/reflex`` (``~/.cache/reflex``)
and every folder below it are created by Reflex with mode 0700, and checked before use: each
level must be a real directory (not a symlink), owned by this process's effective uid (root
included: a root run does not use another user's cache) and writable by nobody else. Otherwise
another user could plant files or symlinks in it (read as our data, or followed by our writes),
so the process runs with no cache at all (every read misses, every write is skipped) and says so
once on stderr. The parent of ``reflex`` (``~/.cache``, or ``$XDG_CACHE_HOME``) is the user's
and is not checked.

Reads and writes go through directory descriptors opened level by level with O_NOFOLLOW, so the
directory checked is the one used, even if the path is swapped meanwhile. A write creates a
temporary file of unpredictable name with O_EXCL|O_NOFOLLOW, mode 0600, and renames it over the
target: a reader sees the old file or the whole new one, never a symlink's target. No fsync: a
cache is derived data and every reader validates what it reads, so a file torn by a power cut is
a miss, while an fsync would put a disk flush on the command's path.
"""

from __future__ import annotations

import os
import stat
import sys

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_refused: dict[str, str] = {}  # cache root -> why it is not used (this process)
_in_flight: dict[str, int] = {}  # temporary file name -> descriptor of its directory


def cache_root() -> str:
    """``$XDG_CACHE_HOME/reflex`` (``~/.cache/reflex``): the path only, nothing checked."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(os.path.abspath(root), "reflex")


def cache_dir(sub: str = "", create: bool = True) -> str | None:
    """The checked cache directory ``cache_root()/sub`` (``sub`` may be ``""`` or hold several
    levels, e.g. ``"index"``), created with mode 0700 where missing (unless ``create`` is
    False). None when caching is off for this process (an unsafe directory, with one notice on
    stderr) or the directory cannot be created (a read-only home) or is missing."""
    path = os.path.join(cache_root(), sub) if sub else cache_root()
    fd = _open_dir(path, create)
    if fd is None:
        return None
    os.close(fd)
    return path


def write_atomic(path: str, data: bytes, create_dirs: bool = True) -> bool:
    """Write ``data`` to ``path``, a file in a cache directory (below ``cache_root()``), through
    a temporary file and a rename (see the module docstring). Missing directories are created
    (0700) unless ``create_dirs`` is False: a process that runs after the command returned
    (the detached index writer) must not bring back a cache directory the user deleted.

    Best effort: False, and no file left behind, when the cache is off or cannot be written
    (unsafe or missing directory, read-only home, full disk, a directory at ``path``)."""
    dir_path, name = os.path.split(os.path.abspath(path))
    dfd = _open_dir(dir_path, create_dirs)
    if dfd is None:
        return False
    tmp = f".{name[:100]}.{os.urandom(8).hex()}.tmp"  # hidden, and no one can guess it
    _in_flight[tmp] = dfd
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=dfd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        # Replaces whatever is at ``name``, a symlink included (the link, not what it points to).
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        return True
    except BaseException as e:  # also an exception raised by a signal handler: no temp left
        try:
            os.unlink(tmp, dir_fd=dfd)
        except OSError:
            pass
        if isinstance(e, OSError):
            return False
        raise
    finally:
        del _in_flight[tmp]
        os.close(dfd)


def open_file(path: str) -> int | None:
    """A read-only descriptor of the regular file ``path`` in a checked cache directory, or
    None: no such file, caching off, or not a regular file. A symlink, FIFO or device at
    ``path`` is refused without being opened (opening a FIFO blocks, a device may act)."""
    dir_path, name = os.path.split(os.path.abspath(path))
    dfd = _open_dir(dir_path, create=False)
    if dfd is None:
        return None
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode):
            return None
        # O_NOFOLLOW | O_NONBLOCK: something swapped in since the stat is not followed or
        # waited for; the fstat below says whether it is still the file we looked at.
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=dfd)
    except OSError:
        return None
    finally:
        os.close(dfd)
    st2 = os.fstat(fd)
    if not stat.S_ISREG(st2.st_mode) or (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino):
        os.close(fd)
        return None
    return fd


def read_file(path: str, max_bytes: int) -> bytes | None:
    """The content of ``path`` (see :func:`open_file`), or None when it cannot be read or is
    larger than ``max_bytes`` (a cache file is never trusted to be of sane size)."""
    fd = open_file(path)
    if fd is None:
        return None
    try:
        if os.fstat(fd).st_size > max_bytes:
            return None
        chunks, size = [], 0
        while size <= max_bytes:  # (os.read: a file object's read(n) allocates n bytes first)
            chunk = os.read(fd, min(max_bytes + 1 - size, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks) if size <= max_bytes else None
    except OSError:
        return None
    finally:
        os.close(fd)


def discard_writes_in_flight() -> None:
    """Remove the temporary files of the writes under way. For a signal handler about to end
    the process with ``os._exit`` (reflex_core.lifecycle): the ``finally`` above will not run."""
    for tmp, dfd in list(_in_flight.items()):
        try:
            os.unlink(tmp, dir_fd=dfd)
        except OSError:
            pass


# ----------------------------------------------------------------------------------------------
# The directory check


def _open_dir(path: str, create: bool) -> int | None:
    """A descriptor of the directory ``path`` (``cache_root()`` or below it), each level from
    ``reflex`` down opened with O_NOFOLLOW and checked; created (0700) where missing when
    ``create``. None when ``path`` is outside the cache, missing, not creatable or unsafe."""
    root = cache_root()
    if root in _refused:
        return None
    path = os.path.normpath(path)
    if path != root and not path.startswith(root + os.sep):
        return None  # the caches live under the root; nothing else is written or read here
    levels = [os.path.basename(root)] + (path[len(root) + 1:].split(os.sep) if path != root
                                         else [])
    if any(part in ("", ".", "..") for part in levels):
        return None
    parent = os.path.dirname(root)
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC  # the parent is the user's: followed
    try:
        try:
            fd = os.open(parent, flags)
        except FileNotFoundError:
            if not create:
                return None
            os.makedirs(parent, mode=0o700, exist_ok=True)
            fd = os.open(parent, flags)
    except OSError:
        return None
    here = parent
    for name in levels:
        here = os.path.join(here, name)
        try:
            nfd = _open_level(fd, name, create)
        except OSError:
            nfd = None
        if nfd is not None:
            why = _unsafe(os.fstat(nfd))
        else:  # missing (not to be created), or not a directory we can open: say which
            try:
                why = _unsafe(os.stat(name, dir_fd=fd, follow_symlinks=False))
            except OSError:
                why = None
        os.close(fd)
        if why is not None:
            if nfd is not None:
                os.close(nfd)
            _refuse(root, here, why)
            return None
        if nfd is None:
            return None
        fd = nfd
    return fd


def _open_level(parent_fd: int, name: str, create: bool) -> int | None:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except FileNotFoundError:
        if not create:
            return None
    try:
        os.mkdir(name, 0o700, dir_fd=parent_fd)
    except FileExistsError:  # another process made it meanwhile: check it like any other
        pass
    return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)


def _unsafe(st: os.stat_result) -> str | None:
    """Why a cache directory with this lstat must not be used, or None."""
    if stat.S_ISLNK(st.st_mode):
        return "it is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    uid = os.geteuid()
    if st.st_uid != uid:
        return f"it is owned by uid {st.st_uid}, not by this user (uid {uid})"
    if st.st_mode & 0o022:
        return f"other users can write to it (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _refuse(root: str, where: str, why: str) -> None:
    """Turn the caches under ``root`` off for this process, saying so once."""
    _refused[root] = why
    try:
        sys.stderr.write(f"notice: not using the cache directory {where}: {why}; running "
                         f"without a cache (remove it, or make it a directory of yours with "
                         f"mode 700, to use the cache)\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # no stderr (the detached index writer's is /dev/null)
        pass
