"""Platform adapters: everything the harness needs from the platform under test, and the
registry that finds them by entry point (platforms/registry.py)."""

from __future__ import annotations

from platforms.base import Ack, PlatformAdapter, PlatformError, SubmitRequest, Workload
from platforms.registry import REGISTRY, get

__all__ = ["PLATFORMS", "Ack", "PlatformAdapter", "PlatformError", "SubmitRequest", "Workload",
           "get_adapter"]

PLATFORMS = tuple(REGISTRY)


def get_adapter(platform: str, endpoints: dict, tokens: dict) -> PlatformAdapter:
    """Build the adapter named ``platform`` from an environment's endpoints and tokens."""
    return get(platform).make_adapter(endpoints, tokens)
