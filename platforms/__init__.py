"""Platform adapters: everything the harness needs from the control plane under test."""

from __future__ import annotations

from platforms.base import Ack, PlatformAdapter, PlatformError, SubmitRequest, Workload

__all__ = ["PLATFORMS", "Ack", "PlatformAdapter", "PlatformError", "SubmitRequest", "Workload",
           "get_adapter"]


def get_adapter(platform: str, endpoints: dict, tokens: dict) -> PlatformAdapter:
    """Build the adapter named ``platform`` from an environment's endpoints and tokens."""
    if platform == "controlplane":
        from platforms.controlplane import ControlPlaneAdapter

        return ControlPlaneAdapter.from_env(endpoints, tokens)
    if platform == "prefect":  # [platform adapters] Prefect 3 over its REST API
        from platforms.prefect import PrefectAdapter

        return PrefectAdapter.from_env(endpoints, tokens)
    raise PlatformError(f"unknown platform {platform!r}; known: {', '.join(PLATFORMS)}")


PLATFORMS = ("controlplane", "prefect")
