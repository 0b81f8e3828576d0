"""A typed client of the control API (control.py)."""

from __future__ import annotations

from typing import Any

import httpx

from environments.local.faultfs.errors import ControlUnreachable, FaultFsError, InvalidFaultSpec


class FaultFsClient:
    """``FaultFsClient("http://127.0.0.1:PORT")``. Short timeouts: the API answers at once,
    except ``crash``/``sync`` which touch the backing directory."""

    def __init__(self, base_url: str, timeout: float = 2.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None,
              timeout: float | None = None) -> httpx.Response:
        url = self.base_url + path
        try:
            r = httpx.request(method, url, json=body, timeout=timeout or self.timeout)
        except httpx.TransportError as exc:
            raise ControlUnreachable(f"faultfs control API at {url} is unreachable: "
                                     f"{type(exc).__name__}: {exc}") from exc
        if r.status_code == 422:
            detail = r.json()
            raise InvalidFaultSpec(detail.get("field", "?"), detail.get("error", r.text))
        if r.status_code >= 400:
            raise FaultFsError(f"{method} {url} -> {r.status_code}: {r.text[:500]}")
        return r

    def set(self, **faults: Any) -> dict[str, Any]:
        """Replace the faults, e.g. ``set(fsync_delay_ms=200)`` or ``set(enospc=1.0,
        path_glob="pg_wal/*")``: fields left out are off. Returns the new state."""
        result: dict[str, Any] = self._call("PUT", "/faults", faults).json()
        return result

    def clear(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("DELETE", "/faults").json()
        return result

    def crash(self) -> dict[str, Any]:
        """Power loss: ``{"dropped_bytes", "dropped_files": [{path, bytes, truncated}],
        "removed_files": [...]}``."""
        result: dict[str, Any] = self._call("POST", "/crash", timeout=30.0).json()
        return result

    def sync(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", "/sync", timeout=60.0).json()
        return result

    def state(self) -> dict[str, Any]:
        """``{"faults": {...}, "active", "unsynced_bytes", "unsynced_files", "source",
        "mount"}``."""
        result: dict[str, Any] = self._call("GET", "/faults").json()
        return result

    def metrics(self) -> str:
        return self._call("GET", "/metrics").text
