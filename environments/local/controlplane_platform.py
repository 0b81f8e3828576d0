"""The reference control plane in the local environment (environments/local/platform.py hooks): its
processes are the environment's own control-plane components (environments/local/components.py), so
it adds nothing beyond saying so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from environments.local.spec import ComponentSpec

CONTROLPLANE = True


def missing() -> str | None:
    return None


def port_names() -> list[str]:
    return []


def prepare(previous: dict[str, Any]) -> dict[str, Any]:
    return {}


def build_components(state: Path, ports: dict[str, int],
                     info: dict[str, Any]) -> dict[str, ComponentSpec]:
    return {}


def endpoints(ports: dict[str, int]) -> dict[str, Any]:
    return {}


def up(env: Any, say: Any, timeout: float) -> None:
    return None
