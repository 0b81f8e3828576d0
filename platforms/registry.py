"""The platform registry: a platform's name maps to its adapter, its local-environment
components and its load generator, as Krkn registers scenario plugins.

Adding a platform is writing its module(s) and adding **one line** to ``REGISTRY``. Entries name
code by dotted path (``"package.module:attribute"``) and are imported only when used, so this
low floor never imports the floors above it (the local environment in infra/, the load
generators in loadtests/). An unknown name, or an entry whose code cannot be loaded, is refused
with a message that says which and why.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from platforms.base import PlatformAdapter, PlatformError


@dataclass(frozen=True)
class Platform:
    name: str
    description: str
    adapter: str  # "module:Class.factory" -> (endpoints, tokens) -> PlatformAdapter
    local: str | None  # module implementing infra/local/platform.py LocalPlatform, or None
    load: str  # "module:function" -> (env, adapter_factory, run_dir, scenario, allow_remote)
    cloud: bool = False  # live game days against a stack (infra/ deploys this platform)
    # a held queue (accepted, never run) the durability stream can submit to, and an adapter
    # that cancels it (``cancel_held``): gameday/durability_stream.py
    held_queue: bool = False

    def resolve(self, field: str) -> Any:
        """The code one field names, imported now."""
        ref = getattr(self, field)
        if ref is None:
            raise PlatformError(f"platform {self.name!r} has no {field} (platforms/registry.py)")
        module_name, _, attr = ref.partition(":")
        try:
            obj: Any = importlib.import_module(module_name)
            for part in filter(None, attr.split(".")):
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as exc:
            raise PlatformError(f"platform {self.name!r}: its {field} {ref!r} cannot be loaded "
                                f"({type(exc).__name__}: {exc}); see platforms/registry.py") from exc
        return obj

    def make_adapter(self, endpoints: dict[str, Any], tokens: dict[str, Any]) -> PlatformAdapter:
        adapter = self.resolve("adapter")(endpoints, tokens)
        missing = [m for m in ("submit", "get", "snapshot", "healthy", "applicability")
                   if not callable(getattr(adapter, m, None))]
        if missing:
            raise PlatformError(f"platform {self.name!r}: its adapter lacks {missing} "
                                "(platforms/base.py PlatformAdapter)")
        return adapter


REGISTRY: dict[str, Platform] = {p.name: p for p in (
    Platform("controlplane", "the reference ML control plane (controlplane/)",
             adapter="platforms.controlplane:ControlPlaneAdapter.from_env",
             local="infra.local.controlplane_platform",
             load="loadtests.runner:start_for_platform", cloud=True, held_queue=True),
    Platform("prefect", "Prefect 3 server and process workers",
             adapter="platforms.prefect:PrefectAdapter.from_env",
             local="infra.local.prefect", load="loadtests.adapter_load:start_for_platform"),
)}


def get(name: str) -> Platform:
    try:
        return REGISTRY[name]
    except KeyError:
        raise PlatformError(f"unknown platform {name!r}; known: {', '.join(REGISTRY)} "
                            "(platforms/registry.py)") from None
