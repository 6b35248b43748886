"""Plugin host: finds architecture plugins through entry points and resolves a file's architecture.

Only the plugin whose entry point is named after the file's ``general.architecture`` is imported
on the load path; ``reflex plugins`` imports them all to list them.

Environment:
  REFLEX_LOAD_PLUGINS=a,b   load only these distributions' plugins ("" loads none)
  REFLEX_DISABLE_PLUGINS=a  never load these distributions' plugins
  REFLEX_TRACE_PLUGINS=1    print every hook call to stderr
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass, field
from typing import Any

import pluggy

from . import hookspecs
from .hookspecs import ArchSpec
from .errors import PluginConflict, ReflexError, UnsupportedArchitecture

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
    (the plugin module), published by distribution ``dist`` at ``version``."""

    name: str
    value: str
    dist: str
    version: str | None

    def load(self) -> Any:
        mod, _, attr = self.value.partition(":")
        obj = importlib.import_module(mod)
        return getattr(obj, attr) if attr else obj


def _path_stamp() -> list:
    """sys.path entries with their modification times: installing, removing or upgrading a
    distribution changes the mtime of the directory that holds its .dist-info."""
    stamp = [sys.executable]
    for p in sys.path:
        if p in ("", "."):  # the current directory: it changes all the time and holds no dists
            continue
        try:
            stamp.append([p, os.stat(p or ".").st_mtime_ns])
        except OSError:
            stamp.append([p, None])
    return stamp


def _cache_file() -> str:
    from .cachedir import cache_root

    return os.path.join(cache_root(), "entry-points.json")


def discover_entry_points() -> list[PluginEntry]:
    """All entry points of group ``reflex``.

    Scanning every installed distribution's metadata (importlib.metadata) costs 50-100 ms with
    a few hundred packages, on the cold path. The result is cached on disk keyed by sys.path and
    the mtimes of its entries, so an unchanged environment costs a few stat calls; any install or
    uninstall invalidates it. REFLEX_NO_PLUGIN_CACHE=1 always scans.
    """
    import json

    use_cache = os.environ.get("REFLEX_NO_PLUGIN_CACHE", "") in ("", "0")
    stamp = _path_stamp()
    path = _cache_file()
    if use_cache:
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
            if data.get("stamp") == stamp:
                return [PluginEntry(*e) for e in data["entries"]]
        except (OSError, ValueError, TypeError, KeyError):
            pass
    from importlib.metadata import entry_points

    found = []
    for ep in entry_points(group=GROUP):
        dist = ep.dist.name if ep.dist is not None else ep.value.split(".")[0]
        found.append(PluginEntry(ep.name, ep.value, dist,
                                 ep.dist.version if ep.dist is not None else None))
    if use_cache:  # a read-only home: scan every time
        from .cachedir import write_atomic

        write_atomic(path, json.dumps({"stamp": stamp, "entries": [list(vars(e).values())
                                                                   for e in found]}).encode())
    return found


class PluginHost:
    """The plugin manager plus the architecture table built from ``reflex_register_architectures``."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager("reflex")
        self.pm.add_hookspecs(hookspecs)
        self._loaded_modules: dict[str, str] = {}  # module -> plugin name
        self._versions: dict[str, str | None] = {}
        self._eps: list[Any] | None = None
        if os.environ.get("REFLEX_TRACE_PLUGINS"):
            self.pm.trace.root.setwriter(lambda s: sys.stderr.write(s))
            self.pm.enable_tracing()

    # --- discovery --------------------------------------------------------------------
    def entry_points(self) -> list["PluginEntry"]:
        """Entry points of group ``reflex`` that the allow/deny lists permit (no import)."""
        if self._eps is None:
            allow = _env_list("REFLEX_LOAD_PLUGINS")
            deny = {_norm(d) for d in (_env_list("REFLEX_DISABLE_PLUGINS") or set())}
            allowed = None if allow is None else {_norm(a) for a in allow}
            eps, seen = [], set()
            for ep in discover_entry_points():
                key = (_norm(ep.dist), ep.name, ep.value)
                if key in seen:  # the same dist visible twice on sys.path
                    continue
                seen.add(key)
                if allowed is not None and _norm(ep.dist) not in allowed:
                    continue
                if _norm(ep.dist) in deny:
                    continue
                eps.append(ep)
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
        raise UnsupportedArchitecture(
            f"no installed plugin serves architecture {arch!r} (installed architectures: {have}); "
            f"install the plugin for it, e.g. pip install {suggest_plugin(arch)}")


KNOWN_PLUGINS = {
    "qwen3": "reflex-infer-qwen3",
    "qwen3moe": "reflex-infer-qwen3-moe",
    "qwen35": "reflex-infer-qwen35-hybrid",
    "qwen35moe": "reflex-infer-qwen35-hybrid",
    "deepseek2": "reflex-infer-deepseek-mla",
}


def suggest_plugin(arch: str) -> str:
    if arch in KNOWN_PLUGINS:
        return KNOWN_PLUGINS[arch]
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
