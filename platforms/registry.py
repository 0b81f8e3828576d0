"""The platform registry: a platform's name maps to its adapter, its local-environment
components and its load generator. Platforms are plugins, found the Python way: each is a
``Platform`` declared under the entry-point group ``gameday.platforms`` of some installed
distribution (``[project.entry-points."gameday.platforms"]`` in its pyproject.toml), so a third
party adds one with ``pip install``. This house's own are declared in gameday/builtin_platforms.py,
the top floor, whose ordinary imports the floor checker sees; this low floor imports no code
by name.

A platform is loaded when first asked for and checked then: an unknown name, an entry point
that cannot be imported, one that is no ``Platform``, one whose ``Platform`` has another name,
a name two distributions declare, or a part whose code cannot be loaded, is refused with a
message that says which and why.

Until an editable install of this checkout is re-run (``pip install -e .``, as
scripts/setup.sh does whenever pyproject.toml changes), its metadata lacks the group: the
entry points are then read from the checkout's own pyproject.toml.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from platforms.base import PlatformAdapter, PlatformError

GROUP = "gameday.platforms"
HOUSE = "mlplatform-gameday"  # this checkout's distribution (pyproject.toml [project] name)
PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"
Loader = Callable[[], Any]  # imports a part when called and returns it


@dataclass(frozen=True)
class Platform:
    """One platform, as its plugin declares it. Each part is a function that imports it when
    called, so declaring a platform imports none of its code."""

    name: str
    description: str
    adapter: Loader  # -> (endpoints, tokens) -> PlatformAdapter
    local: Loader | None  # -> module implementing environments/local/platform.py LocalPlatform, or None
    load: Loader  # -> (env, adapter_factory, run_dir, scenario, allow_remote) -> a load run
    cloud: bool = False  # live game days against a stack (provisioning/ deploys this platform)
    # a held queue (accepted, never run) the durability stream can submit to, and an adapter
    # that cancels it (``cancel_held``): gameday/durability_stream.py
    held_queue: bool = False

    def resolve(self, field: str) -> Any:
        """The code one field names, imported now."""
        loader = getattr(self, field)
        if loader is None:
            raise PlatformError(f"platform {self.name!r} has no {field} (platforms/registry.py)")
        ref = f"{getattr(loader, '__module__', '?')}:{getattr(loader, '__qualname__', loader)}"
        try:
            return loader()
        except (ImportError, AttributeError) as exc:
            raise PlatformError(f"platform {self.name!r}: its {field} ({ref}) cannot be loaded "
                                f"({type(exc).__name__}: {exc})") from exc

    def make_adapter(self, endpoints: dict[str, Any], tokens: dict[str, Any]) -> PlatformAdapter:
        adapter = self.resolve("adapter")(endpoints, tokens)
        missing = [m for m in ("submit", "get", "snapshot", "healthy", "applicability")
                   if not callable(getattr(adapter, m, None))]
        if missing:
            raise PlatformError(f"platform {self.name!r}: its adapter lacks {missing} "
                                "(platforms/base.py PlatformAdapter)")
        return adapter


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def source_tree_entry_points(group: str = GROUP, pyproject: Path = PYPROJECT
                             ) -> list[metadata.EntryPoint]:
    """The group as this checkout's pyproject.toml declares it (none without the file)."""
    try:
        project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
    except OSError:
        return []
    declared = project.get("entry-points", {}).get(group, {})
    return [metadata.EntryPoint(name, value, group) for name, value in declared.items()]


def declared_entry_points(group: str = GROUP) -> list[metadata.EntryPoint]:
    """Every installed distribution's entry points of ``group``; while this checkout's own
    install predates them, the ones its pyproject.toml declares."""
    found = list(metadata.entry_points(group=group))
    if not any(ep.dist is not None and _canonical(ep.dist.name) == HOUSE for ep in found):
        found += source_tree_entry_points(group)
    return found


def _origin(ep: metadata.EntryPoint) -> str:
    where = (f"distribution {ep.dist.name} {ep.dist.version}" if ep.dist is not None
             else "pyproject.toml of this checkout")
    return f"{ep.value!r} ({where})"


class Registry(MutableMapping[str, Platform]):
    """The platforms by name, in name order; each loaded and checked when first asked for.
    Assigning a name (tests) puts a ``Platform`` in directly."""

    def __init__(self, source: Callable[[], Iterable[metadata.EntryPoint]] = declared_entry_points
                 ) -> None:
        self._source = source
        self._entries: dict[str, list[metadata.EntryPoint]] | None = None
        self._loaded: dict[str, Platform] = {}
        self._hidden: set[str] = set()

    def _declared(self) -> dict[str, list[metadata.EntryPoint]]:
        if self._entries is None:
            entries: dict[str, list[metadata.EntryPoint]] = {}
            for ep in self._source():
                same = entries.setdefault(ep.name, [])
                if all(ep.value != other.value for other in same):
                    same.append(ep)
            self._entries = entries
        return self._entries

    def _load(self, name: str, eps: list[metadata.EntryPoint]) -> Platform:
        if len(eps) > 1:
            raise PlatformError(f"platform {name!r} is declared more than once: "
                                f"{' and '.join(_origin(ep) for ep in eps)}; uninstall all but one")
        (ep,) = eps
        try:
            platform = ep.load()
        except Exception as exc:  # any failure of a plugin's import refuses it, by name
            raise PlatformError(f"platform {name!r}: its entry point {_origin(ep)} cannot be "
                                f"loaded ({type(exc).__name__}: {exc})") from exc
        if not isinstance(platform, Platform):
            raise PlatformError(f"platform {name!r}: its entry point {_origin(ep)} is of type "
                                f"{type(platform).__name__}, not a platforms.registry.Platform")
        if platform.name != name:
            raise PlatformError(f"platform {name!r}: its entry point {_origin(ep)} declares "
                                f"the platform {platform.name!r}: the names must match")
        return platform

    def __getitem__(self, name: str) -> Platform:
        if name in self._hidden:
            raise KeyError(name)
        if name not in self._loaded:
            eps = self._declared().get(name)
            if not eps:
                raise KeyError(name)
            self._loaded[name] = self._load(name, eps)
        return self._loaded[name]

    def __setitem__(self, name: str, platform: Platform) -> None:
        self._hidden.discard(name)
        self._loaded[name] = platform

    def __delitem__(self, name: str) -> None:
        if name not in self:
            raise KeyError(name)
        self._loaded.pop(name, None)
        self._hidden.add(name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name not in self._hidden and (
            name in self._loaded or name in self._declared())

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(n for n in {*self._declared(), *self._loaded} if n not in self._hidden))

    def __len__(self) -> int:
        return sum(1 for _ in self)


REGISTRY = Registry()


def get(name: str) -> Platform:
    try:
        return REGISTRY[name]
    except KeyError:
        raise PlatformError(f"unknown platform {name!r}; known: {', '.join(REGISTRY)} "
                            "(platforms/registry.py)") from None
