"""What a platform adds to the local environment (platforms/registry.py names the module).

A module implementing this protocol is all ``LocalEnvironment.up`` knows of a platform: no
``if platform == ...`` anywhere else. The shared components (database, HAProxy, S3, registry,
Prometheus, fault proxy) are always there; ``CONTROLPLANE`` says whether the reference control
plane's own processes (API replicas, reconciler, agents) run too.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any, Protocol, runtime_checkable

from environments.local.errors import EnvError
from environments.local.spec import ComponentSpec
from platforms import PlatformError, registry


@runtime_checkable
class LocalPlatform(Protocol):
    CONTROLPLANE: bool  # the reference control plane's processes run in this environment

    def missing(self) -> str | None: ...  # what must be installed first, or None
    def port_names(self) -> list[str]: ...  # ports beyond the shared components'
    def prepare(self, previous: dict[str, Any]) -> dict[str, Any]: ...  # kept in env.json
    def build_components(self, state: Path, ports: dict[str, int],
                         info: dict[str, Any]) -> dict[str, ComponentSpec]: ...
    def endpoints(self, ports: dict[str, int]) -> dict[str, Any]: ...
    def up(self, env: LocalEnv, say: Any, timeout: float) -> None: ...  # after the shared ones


class LocalEnv(Protocol):
    """What a platform's ``up`` is given of the environment (environments/local/env.py)."""

    @property
    def info(self) -> dict[str, Any]: ...  # env.json (``platform_info``, ``ports`` ...)
    @property
    def endpoints(self) -> dict[str, Any]: ...  # what it adds is recorded in env.json
    def spawn(self, component: str) -> int: ...
    def wait_healthy(self, components: list[str], timeout: float,
                     reporter: Any = None) -> None: ...


HOOKS = ("missing", "port_names", "prepare", "build_components", "endpoints", "up")


def local_platform(name: str) -> ModuleType:
    """The local-environment module of platform ``name``, checked for every hook."""
    try:
        module = registry.get(name).resolve("local")
    except PlatformError as exc:
        raise EnvError(str(exc)) from None
    if not isinstance(module, ModuleType):
        raise EnvError(f"platform {name!r}: its local part is a {type(module).__name__}, not a "
                       "module; it does not implement the local platform hooks "
                       "(environments/local/platform.py)")
    lacking = [h for h in HOOKS if not callable(getattr(module, h, None))]
    if lacking or not isinstance(getattr(module, "CONTROLPLANE", None), bool):
        raise EnvError(f"platform {name!r}: {module.__name__} does not implement the local "
                       f"platform hooks (missing: {lacking or ['CONTROLPLANE']}; "
                       "environments/local/platform.py)")
    return module
