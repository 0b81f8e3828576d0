"""The platforms this house ships, declared as plugins (entry-point group ``gameday.platforms``
in pyproject.toml names each object below; platforms/registry.py reads the group).

They live on the top floor because each ties together parts from three floors: its adapter
(platforms/), its local-environment module (environments/local/) and its load generator
(loadtests/). Every part is an ordinary import inside a small function: the floor checker
(import-linter) sees it, and declaring a platform imports none of its code.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from platforms.registry import Platform


def _controlplane_adapter() -> Any:
    from platforms.controlplane import ControlPlaneAdapter

    return ControlPlaneAdapter.from_env


def _controlplane_local() -> ModuleType:
    from environments.local import controlplane_platform

    return controlplane_platform


def _locust_load() -> Any:
    from loadtests.runner import start_for_platform

    return start_for_platform


def _prefect_adapter() -> Any:
    from platforms.prefect import PrefectAdapter

    return PrefectAdapter.from_env


def _prefect_local() -> ModuleType:
    from environments.local import prefect

    return prefect


def _adapter_load() -> Any:
    from loadtests.adapter_load import start_for_platform

    return start_for_platform


CONTROLPLANE = Platform("controlplane", "the reference ML control plane (controlplane/)",
                        adapter=_controlplane_adapter, local=_controlplane_local,
                        load=_locust_load, cloud=True, held_queue=True)
PREFECT = Platform("prefect", "Prefect 3 server and process workers",
                   adapter=_prefect_adapter, local=_prefect_local, load=_adapter_load)
