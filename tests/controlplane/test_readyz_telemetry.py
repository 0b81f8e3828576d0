"""The API's readiness never depends on telemetry (Prometheus scrapes it); only the seeded
defect readyz-needs-telemetry makes it, which the telemetry-loss experiment must catch."""

from __future__ import annotations

import asyncio
import json
import socket
from contextlib import asynccontextmanager
from typing import Any

import pytest

from controlplane import defects
from controlplane.api import health


class _Pool:
    @asynccontextmanager
    async def connection(self, timeout: float) -> Any:
        class Conn:
            async def execute(self, query: str) -> None:
                assert query == "SELECT 1"
        yield Conn()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ready(monkeypatch: pytest.MonkeyPatch, url: str, defect: str) -> tuple[int, dict[str, Any]]:
    monkeypatch.setenv(health.TELEMETRY_URL_ENV, url)
    monkeypatch.setenv(defects.ENV, defect)
    defects.active.cache_clear()
    try:
        res = asyncio.run(health.readyz(_Pool()))  # type: ignore[arg-type]
    finally:
        defects.active.cache_clear()
    return res.status_code, json.loads(res.body)


def test_readiness_ignores_telemetry_unless_the_defect_is_seeded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    down = f"http://127.0.0.1:{_closed_port()}"
    assert _ready(monkeypatch, down, "") == (200, {"status": "ready"})
    status, body = _ready(monkeypatch, down, "readyz-needs-telemetry")
    assert status == 503 and body["detail"].startswith(f"telemetry {down}"), body
    with socket.socket() as up:
        up.bind(("127.0.0.1", 0))
        up.listen()
        url = f"http://127.0.0.1:{up.getsockname()[1]}"
        assert _ready(monkeypatch, url, "readyz-needs-telemetry") == (200, {"status": "ready"})
