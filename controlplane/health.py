"""Health of the reconciler process, and the small HTTP server that exposes it with /metrics.

``/healthz`` (liveness): the reconcile loop finished an iteration within ``stall_seconds``.
The loop wakes at least every pass interval, so a loop silent for many intervals is stuck
(a hung query, a blocked event loop) and restarting the process is the remedy. A database
outage does *not* fail liveness: the loop keeps iterating (connect, fail, back off).

``/readyz`` (readiness): the loop's last database round trip succeeded, and that was within
``ready_seconds``. Answers 503 with the reason otherwise. Passive on purpose: it reports the
connection the reconciler really uses, and a probe never costs the database a connection.

``/metrics``: Prometheus exposition (prometheus_client's WSGI app: gzip, OpenMetrics and
``name[]`` filters as before). Any other path: 404.

The server runs in daemon threads, independent of the asyncio loop it watches, so it still
answers (503) when that loop is blocked.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import REGISTRY, CollectorRegistry, make_wsgi_app


def default_stall_seconds(interval: float) -> float:
    """Liveness bound from the pass interval: many missed wake-ups, never below 10 s (a pass
    that reconnects may spend the 3 s connect timeout plus the 0.5 s back-off)."""
    return max(10.0, 20.0 * interval)


class ReconcilerHealth:
    """Written by the reconcile loop, read by the HTTP threads."""

    def __init__(self, stall_seconds: float, ready_seconds: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stall_seconds = stall_seconds
        self.ready_seconds = stall_seconds if ready_seconds is None else ready_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._beat = clock()  # the loop counts as alive from start-up
        self._iterations = 0
        self._db_ok_at: float | None = None
        self._db_error: str | None = None

    # -- written by the loop ----------------------------------------------------------------
    def beat(self) -> None:
        """One reconcile loop iteration completed (whatever its outcome)."""
        with self._lock:
            self._beat = self._clock()
            self._iterations += 1

    def db_succeeded(self) -> None:
        with self._lock:
            self._db_ok_at, self._db_error = self._clock(), None

    def db_failed(self, error: str) -> None:
        with self._lock:
            self._db_error = error or "error"

    # -- read by the probes -----------------------------------------------------------------
    def liveness(self) -> tuple[bool, dict[str, Any]]:
        with self._lock:
            age, iterations = self._clock() - self._beat, self._iterations
        body: dict[str, Any] = {"last_iteration_seconds_ago": round(age, 3),
                                "bound_seconds": self.stall_seconds, "iterations": iterations}
        if age > self.stall_seconds:
            return False, {"status": "stalled", **body, "detail": (
                f"reconcile loop has not completed an iteration for {age:.1f}s "
                f"(bound {self.stall_seconds:g}s)")}
        return True, {"status": "ok", **body}

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        with self._lock:
            now, ok_at, error = self._clock(), self._db_ok_at, self._db_error
        if error is not None:
            return False, {"status": "unavailable", "detail": f"database: {error}"}
        if ok_at is None:
            return False, {"status": "unavailable",
                           "detail": "database: no successful round trip yet"}
        age = now - ok_at
        if age > self.ready_seconds:
            return False, {"status": "unavailable", "detail": (
                f"database: last successful round trip {age:.1f}s ago "
                f"(bound {self.ready_seconds:g}s)")}
        return True, {"status": "ready", "last_db_round_trip_seconds_ago": round(age, 3)}


_Start = Callable[[str, list[tuple[str, str]]], Any]


def health_app(health: ReconcilerHealth, registry: CollectorRegistry = REGISTRY
               ) -> Callable[[dict[str, Any], _Start], Iterable[bytes]]:
    metrics_app = make_wsgi_app(registry)
    checks = {"/healthz": health.liveness, "/readyz": health.readiness}

    def app(environ: dict[str, Any], start_response: _Start) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        if path == "/metrics":
            return metrics_app(environ, start_response)  # type: ignore[no-any-return]
        check = checks.get(path)
        if check is None:
            return _json(start_response, "404 Not Found",
                         {"detail": "not found; try /healthz, /readyz or /metrics"})
        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            return _json(start_response, "405 Method Not Allowed", {"detail": "GET only"},
                         [("Allow", "GET, HEAD")])
        ok, body = check()
        out = _json(start_response, "200 OK" if ok else "503 Service Unavailable", body)
        return [] if environ["REQUEST_METHOD"] == "HEAD" else out

    return app


def _json(start_response: _Start, status: str, body: dict[str, Any],
          headers: list[tuple[str, str]] | None = None) -> list[bytes]:
    data = json.dumps(body).encode()
    start_response(status, [("Content-Type", "application/json"),
                            ("Content-Length", str(len(data))),
                            ("Cache-Control", "no-store"), *(headers or [])])
    return [data]


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # probes every few seconds would flood the logs


def serve(health: ReconcilerHealth, host: str, port: int,
          registry: CollectorRegistry = REGISTRY) -> WSGIServer:
    """Serve /healthz, /readyz and /metrics on host:port in a daemon thread; returns the
    server (``server.server_address`` has the bound port; ``shutdown()`` stops it)."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    server_cls = type("_HealthServer", (_Server,), {"address_family": family})
    server = make_server(host, port, health_app(health, registry), server_cls, _QuietHandler)
    threading.Thread(target=server.serve_forever, name="reconciler-health", daemon=True).start()
    return server
