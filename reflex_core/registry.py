"""Plugin host: finds architecture plugins through entry points and resolves a file's architecture.

Only the plugin whose entry point is named after the file's ``general.architecture`` is imported
on the load path; ``reflex plugins`` imports them all to list them.

Environment:
  REFLEX_LOAD_PLUGINS=a,b   load only these plugins ("" loads none)
  REFLEX_DISABLE_PLUGINS=a  never load these plugins
      (each name: a distribution, e.g. reflex-infer-qwen3, or an architecture, e.g. qwen3; a
      name that matches nothing installed gets a notice on stderr)
  REFLEX_TRACE_PLUGINS=1    print every hook call to stderr
"""

from __future__ import annotations

import importlib
import os
import stat
import sys
from dataclasses import dataclass, field
from typing import Any

import pluggy

from . import hookspecs
from .hookspecs import ArchSpec
from .errors import PluginConflict, ReflexError, UnsupportedArchitecture, pip_install

GROUP = "reflex"
CORE_DIST = "reflex-infer"


@dataclass
class PluginInfo:
    name: str  # plugin (pluggy) name: the distribution name, or the name it was registered with
    version: str | None
    module: str
    architectures: list[ArchSpec] = field(default_factory=list)


def _env_list(var: str) -> set[str] | None:
    raw = os.environ.get(var)
    if raw is None:
        return None
    return {p.strip() for p in raw.split(",") if p.strip()}


def _norm(dist: str) -> str:
    return dist.lower().replace("_", "-")


@dataclass(frozen=True)
class PluginEntry:
    """An entry point of group ``reflex``: ``name`` (the architecture it serves) -> ``value``
    (the plugin module), published by distribution ``dist`` at ``version``, whose metadata
    folder (``.../site-packages/<dist>-<version>.dist-info``) is ``source`` (None when the
    distribution is not a folder on sys.path, e.g. one found by a custom finder)."""

    name: str
    value: str
    dist: str
    version: str | None
    source: str | None = None

    def load(self) -> Any:
        mod, _, attr = self.value.partition(":")
        obj = importlib.import_module(mod)
        return getattr(obj, attr) if attr else obj


# ----------------------------------------------------------------------------------------------
# Entry-point discovery and its cache
#
# Scanning every installed distribution's metadata (importlib.metadata) costs 50-100 ms with a
# few hundred packages, on the cold path, so the entry points of group ``reflex`` are kept in
# ``$XDG_CACHE_HOME/reflex/entry-points.json``:
#
#   {"format": 2, "stamp": STAMP, "entries": [[name, value, dist, version, source], ...]}
#
# STAMP says what the scan depended on (``_stamp``): the interpreter, sys.path in order and, for
# each of its directories, its mtime and the entry_points.txt of every distribution metadata
# folder in it (``foo-1.0.dist-info/entry_points.txt``: name and version in the folder's name)
# with its mtime and size. Installing, upgrading or removing a distribution adds or removes a
# folder, which changes the directory's mtime; editing an entry_points.txt in place changes its
# own. (Not seen: an entry_points.txt created by hand in an existing folder; pip never does it.)
# A hit costs a stat per sys.path entry and per entry_points.txt, no directory listing
# (measured on the 2-core dev VM: ~0.25 ms for this venv's 30 distributions, ~0.5 ms for 330),
# plus reading each plugin distribution's entry_points.txt and METADATA, to check that every
# cached entry is one that it declares (``_verified``): the cache can only choose among
# installed entry points, never name another module. A cache of any other shape, a stale stamp
# or an entry that does not check out means a rescan and a rewrite.

CACHE_FILE = "entry-points.json"
_CACHE_FORMAT = 2
_MAX_CACHE_BYTES = 8 << 20  # a stamp of thousands of distributions is < 1 MB
_MAX_METADATA_BYTES = 1 << 20
_METADATA_DIRS = (".dist-info", ".egg-info")


def _is_metadata_dir(name: str) -> bool:
    return name.endswith(_METADATA_DIRS) or name == "EGG-INFO"  # EGG-INFO: inside an .egg


def _path_dirs() -> list[str]:
    # The current directory ("" for ``python -c``) is left out: it changes all the time, may be
    # huge, and holds no installed distributions.
    return [p for p in sys.path if p not in ("", ".")]


def _mtime(path: str) -> tuple[int | None, int | None, bool]:
    """(mtime in ns, size, is a directory), or (None, None, False) when missing."""
    try:
        st = os.stat(path)
    except OSError:
        return None, None, False
    return st.st_mtime_ns, st.st_size, stat.S_ISDIR(st.st_mode)


def _stamp() -> list:
    """The stamp of the installed distributions (see above), listing each sys.path directory."""
    out: list = [sys.executable]
    for p in _path_dirs():
        mtime, _, is_dir = _mtime(p)  # before the listing: a change during it shows next time
        folders = None
        if is_dir:
            try:
                names = sorted(e.name for e in os.scandir(p) if _is_metadata_dir(e.name))
            except OSError:
                names = []
            folders = []
            for n in names:
                mtime_ep, size, _ = _mtime(os.path.join(p, n, "entry_points.txt"))
                if mtime_ep is not None:
                    folders.append([n, mtime_ep, size])
        out.append([p, mtime, folders])
    return out


def _stamp_holds(stamp: Any) -> bool:
    """Whether ``stamp`` (as read from the cache: any JSON) still describes the installed
    distributions, checked with stat calls only."""
    dirs = _path_dirs()
    if not (isinstance(stamp, list) and len(stamp) == len(dirs) + 1
            and stamp[0] == sys.executable):
        return False
    for p, entry in zip(dirs, stamp[1:]):
        if not (isinstance(entry, list) and len(entry) == 3 and entry[0] == p):
            return False
        mtime, _, is_dir = _mtime(p)
        folders = entry[2]
        if entry[1] != mtime or is_dir != isinstance(folders, list):
            return False
        for f in folders or ():
            if not (isinstance(f, list) and len(f) == 3 and isinstance(f[0], str)
                    and _is_metadata_dir(f[0]) and os.sep not in f[0]):
                return False
            if f[1:] != list(_mtime(os.path.join(p, f[0], "entry_points.txt"))[:2]):
                return False
    return True


def _read_installed(path: str) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks, size = [], 0
        while size <= _MAX_METADATA_BYTES:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    if size > _MAX_METADATA_BYTES:
        return None
    return b"".join(chunks).decode("utf-8", "replace")


def _declared(source: str) -> tuple[str | None, str | None, set[tuple[str, str]]] | None:
    """(Name, Version, {(name, value)} of group ``reflex``) as the metadata folder ``source``
    declares them, parsed as importlib.metadata does; None when unreadable."""
    text = _read_installed(os.path.join(source, "entry_points.txt"))
    meta = (_read_installed(os.path.join(source, "METADATA"))
            or _read_installed(os.path.join(source, "PKG-INFO")))
    if text is None or meta is None:
        return None
    eps, group = set(), None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            group = line[1:-1].strip()
        elif group == GROUP and "=" in line:
            name, value = (x.strip() for x in line.split("=", 1))
            eps.add((name, value))
    headers: dict[str, str] = {}
    for line in meta.splitlines():
        if not line.strip():
            break  # the headers end at the first blank line
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("name", "version"):
            headers.setdefault(key.strip().lower(), value.strip())
    return headers.get("name"), headers.get("version"), eps


def _verified(entries: list[PluginEntry], stamp: list) -> bool:
    """Whether every cached entry is declared, as cached, by an installed distribution: its
    ``source`` is a metadata folder of the (already checked) ``stamp``, whose entry_points.txt
    declares exactly the cached entries of that folder and whose METADATA has the cached name
    and version."""
    # normpath: importlib.metadata names a folder through pathlib, which drops a trailing "/"
    folders = {os.path.normpath(os.path.join(p, f[0])) for p, _, fs in stamp[1:] for f in fs or ()}
    by_source: dict[str, list[PluginEntry]] = {}
    for e in entries:
        source = os.path.normpath(e.source) if e.source is not None else None
        if source not in folders:  # None included: nothing to check it against
            return False
        by_source.setdefault(source, []).append(e)
    for source, eps in by_source.items():
        declared = _declared(source)
        if declared is None:
            return False
        name, version, pairs = declared
        if {(e.name, e.value) for e in eps} != pairs:
            return False
        if any(e.dist != name or e.version != version for e in eps):
            return False
    return True


def _from_cache(data: Any) -> list[PluginEntry] | None:
    """The entries of a cache file's JSON when it has exactly the expected shape, a stamp that
    still holds and entries that check out; else None."""
    if not (isinstance(data, dict) and data.keys() == {"format", "stamp", "entries"}
            and data["format"] == _CACHE_FORMAT and isinstance(data["entries"], list)):
        return None
    if not _stamp_holds(data["stamp"]):
        return None
    entries = []
    for e in data["entries"]:
        if not (isinstance(e, list) and len(e) == 5 and all(isinstance(x, str) for x in e[:3])
                and all(x is None or isinstance(x, str) for x in e[3:])):
            return None
        entries.append(PluginEntry(*e))
    return entries if _verified(entries, data["stamp"]) else None


def _scan() -> list[PluginEntry]:
    from importlib.metadata import entry_points

    found = []
    for ep in entry_points(group=GROUP):
        d = ep.dist
        # PathDistribution keeps its folder in _path (no public accessor); other kinds of
        # distribution get no source, so a cache holding them is rescanned every time.
        src = getattr(d, "_path", None) if d is not None else None
        if d is None:
            found.append(PluginEntry(ep.name, ep.value, ep.value.split(".")[0], None))
        else:
            found.append(PluginEntry(ep.name, ep.value, d.name, d.version,
                                     str(src) if src is not None else None))
    return found


def discover_entry_points() -> list[PluginEntry]:
    """All entry points of group ``reflex``, from the cache when it is valid (see above).
    REFLEX_NO_PLUGIN_CACHE=1 always scans (and neither reads nor writes the cache)."""
    import json

    from . import cachedir

    if os.environ.get("REFLEX_NO_PLUGIN_CACHE", "") not in ("", "0"):
        return _scan()
    path = os.path.join(cachedir.cache_root(), CACHE_FILE)
    raw = cachedir.read_file(path, _MAX_CACHE_BYTES)
    if raw is not None:
        try:
            cached = _from_cache(json.loads(raw))
        except (ValueError, RecursionError):  # not JSON (UnicodeDecodeError is a ValueError)
            cached = None
        if cached is not None:
            return cached
    stamp = _stamp()  # before the scan: an install during it makes the stamp stale, not wrong
    found = _scan()
    cachedir.write_atomic(path, json.dumps({
        "format": _CACHE_FORMAT, "stamp": stamp,
        "entries": [[e.name, e.value, e.dist, e.version, e.source] for e in found]}).encode())
    return found


class PluginHost:
    """The plugin manager plus the architecture table built from ``reflex_register_architectures``."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager("reflex")
        self.pm.add_hookspecs(hookspecs)
        self._loaded_modules: dict[str, str] = {}  # module -> plugin name
        self._versions: dict[str, str | None] = {}
        self._eps: list[Any] | None = None
        self._filtered: dict[str, str] = {}  # architecture -> why its entry point was left out
        if os.environ.get("REFLEX_TRACE_PLUGINS"):
            self.pm.trace.root.setwriter(lambda s: sys.stderr.write(s))
            self.pm.enable_tracing()

    # --- discovery --------------------------------------------------------------------
    def entry_points(self) -> list["PluginEntry"]:
        """Entry points of group ``reflex`` that the allow/deny lists permit (no import)."""
        if self._eps is None:
            allow = _env_list("REFLEX_LOAD_PLUGINS")
            deny = _env_list("REFLEX_DISABLE_PLUGINS") or set()
            found = discover_entry_points()
            eps, seen, used = [], set(), set()
            for ep in found:
                key = (_norm(ep.dist), ep.name, ep.value)
                if key in seen:  # the same dist visible twice on sys.path
                    continue
                seen.add(key)
                names = {_norm(ep.dist), _norm(ep.name)}
                if allow is not None:
                    hit = {a for a in allow if _norm(a) in names}
                    used |= hit
                    if not hit:
                        self._filtered[ep.name] = (f"it is not in REFLEX_LOAD_PLUGINS="
                                                   f"{os.environ['REFLEX_LOAD_PLUGINS']!r}")
                        continue
                hit = {d for d in deny if _norm(d) in names}
                if hit:
                    used |= hit
                    self._filtered[ep.name] = (f"REFLEX_DISABLE_PLUGINS="
                                               f"{os.environ['REFLEX_DISABLE_PLUGINS']!r} "
                                               "disables it")
                    continue
                eps.append(ep)
            for var, names in (("REFLEX_LOAD_PLUGINS", allow or set()),
                               ("REFLEX_DISABLE_PLUGINS", deny)):
                for name in sorted(names - used):
                    if not any(_norm(name) in (_norm(ep.dist), _norm(ep.name)) for ep in found):
                        sys.stderr.write(f"notice: {var}: {name!r} matches no installed plugin "
                                         "or architecture\n")
            self._eps = eps
        return self._eps

    def _load_ep(self, ep: "PluginEntry") -> None:
        dist = ep.dist
        if ep.value in self._loaded_modules:
            return
        try:
            module = ep.load()
        except Exception as e:  # a broken plugin must not take the core down silently
            raise ReflexError(f"plugin {dist} failed to import {ep.value}: {e}") from e
        name = dist
        if self.pm.has_plugin(name):  # one dist, several modules
            name = f"{dist}:{ep.value}"
        self.pm.register(module, name=name)
        self._loaded_modules[ep.value] = name
        self._versions[name] = ep.version

    def register(self, plugin: Any, name: str, version: str | None = None) -> None:
        """Register a plugin object directly (tests, embedding applications)."""
        self.pm.register(plugin, name=name)
        self._versions[name] = version

    def unregister(self, name: str) -> None:
        self.pm.unregister(name=name)
        self._versions.pop(name, None)

    def load_all(self) -> None:
        for ep in self.entry_points():
            self._load_ep(ep)
        self.pm.check_pending()
        self.register_ops()

    def register_ops(self) -> None:
        """Put the ops of every loaded plugin into the op registry (reflex_core.opreg)."""
        from . import opreg

        for impl in self.pm.hook.reflex_register_ops.get_hookimpls():
            impl.function(register=lambda op, _owner=impl.plugin_name: opreg.register(op, _owner))

    def load_for(self, arch: str) -> None:
        """Import only the plugins whose entry point is named ``arch``."""
        eps = [ep for ep in self.entry_points() if ep.name == arch]
        dists = sorted({ep.dist for ep in eps})
        if len(dists) > 1:
            raise PluginConflict(
                f"architecture {arch!r} is claimed by several plugins: {', '.join(dists)}; "
                f"uninstall all but one (or set REFLEX_DISABLE_PLUGINS={dists[-1]})")
        for ep in eps:
            self._load_ep(ep)

    def filtered(self) -> dict[str, str]:
        """Architectures whose installed plugin REFLEX_LOAD_PLUGINS / REFLEX_DISABLE_PLUGINS
        leave out -> why."""
        self.entry_points()
        return dict(self._filtered)

    # --- the architecture table --------------------------------------------------------
    def plugins(self) -> list[PluginInfo]:
        infos: dict[str, PluginInfo] = {}
        for name, plugin in self.pm.list_name_plugin():
            if plugin is hookspecs or name is None:
                continue
            infos[name] = PluginInfo(name=name.split(":")[0], version=self._versions.get(name),
                                     module=getattr(plugin, "__name__", type(plugin).__name__))
        for impl in self.pm.hook.reflex_register_architectures.get_hookimpls():
            specs: list[ArchSpec] = []

            def register(spec: ArchSpec, _specs=specs) -> None:
                if not isinstance(spec, ArchSpec):
                    raise ReflexError(f"plugin {impl.plugin_name} registered {spec!r}, not an "
                                      f"ArchSpec")
                _specs.append(spec)

            impl.function(register=register)
            if impl.plugin_name in infos:
                infos[impl.plugin_name].architectures.extend(specs)
        return sorted(infos.values(), key=lambda p: p.name)

    def architectures(self) -> dict[str, tuple[ArchSpec, PluginInfo]]:
        table: dict[str, tuple[ArchSpec, PluginInfo]] = {}
        for info in self.plugins():
            for spec in info.architectures:
                if spec.name in table and table[spec.name][1].name != info.name:
                    other = table[spec.name][1].name
                    a, b = sorted([other, info.name])
                    raise PluginConflict(
                        f"architecture {spec.name!r} is claimed by two plugins: {a} and {b}; "
                        f"uninstall one (or set REFLEX_DISABLE_PLUGINS={b})")
                table[spec.name] = (spec, info)
        return table

    def resolve(self, arch: str) -> ArchSpec:
        """The ArchSpec serving ``arch``, importing only the plugin(s) named for it."""
        self.load_for(arch)
        table = self.architectures()
        if arch in table:
            self.register_ops()
            return table[arch][0]
        # Not found: say what is installed (names from metadata; nothing more is imported).
        installed = sorted({ep.name for ep in self.entry_points()} | set(table))
        have = ", ".join(installed) if installed else "none"
        if arch in self._filtered:
            raise UnsupportedArchitecture(
                f"the plugin for architecture {arch!r} is installed but not loaded: "
                f"{self._filtered[arch]} (enabled architectures: {have})")
        raise UnsupportedArchitecture(
            f"no installed plugin serves architecture {arch!r} (installed architectures: {have}); "
            f"install the plugin for it: {suggest_plugin(arch)}")


KNOWN_PLUGINS = {
    "qwen3": "reflex-infer-qwen3",
    "qwen3moe": "reflex-infer-qwen3-moe",
    "qwen35": "reflex-infer-qwen35-hybrid",
    "qwen35moe": "reflex-infer-qwen35-hybrid",
    "deepseek2": "reflex-infer-deepseek-mla",
}


def suggest_plugin(arch: str) -> str:
    """How to install the plugin serving ``arch``: its distribution from a package index, or its
    folder of Reflex's source tree (plugins/<name>)."""
    if arch in KNOWN_PLUGINS:
        dist = KNOWN_PLUGINS[arch]
        folder = "plugins/" + dist.removeprefix("reflex-infer-").replace("-", "_")
        return f"{pip_install(dist)} (or, from Reflex's source tree, {pip_install(folder)})"
    return f"a Reflex plugin for {arch!r} (none is known; see README 'Write an architecture plugin')"


_HOST: PluginHost | None = None


def get_host() -> PluginHost:
    """The process-wide plugin host (created lazily; nothing is loaded until asked)."""
    global _HOST
    if _HOST is None:
        _HOST = PluginHost()
    return _HOST


def reset_host() -> None:
    global _HOST
    _HOST = None
