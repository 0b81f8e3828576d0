"""The S3 brownout's server side (environments/local/s3_brownout.py has the model): WSGI middleware
in front of moto's application in the local S3 API server (environments/local/motoserver.py) that
answers the control path and injects the brownout into S3 requests."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from environments.local.s3_brownout import (
    HEALTHY,
    MAX_CONTROL_BODY,
    METRICS_PATH,
    Brownout,
    BrownoutInvalid,
    Counters,
    WSGIApp,
    bytes_per_second,
    chunk_size,
    delay_seconds,
    error_response,
    injected_error,
    is_control,
    pace_delay,
    parse_body,
    render_metrics,
    status_document,
)


class BrownoutMiddleware:
    """WSGI middleware around moto's application. Healthy, a request costs two string
    comparisons and a counter on its way to moto.

    Written for gevent's server (one thread, greenlets): waits use ``sleep`` (gevent.sleep by
    default) so a delayed request never holds up the others, and state and counters are
    changed without locks because a greenlet is only switched at a wait."""

    def __init__(self, app: WSGIApp, *, rng: random.Random | None = None,
                 sleep: Callable[[float], Any] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if sleep is None:
            import gevent  # here, not at import: a caller may give a sleep of its own

            sleep = gevent.sleep
        self.app = app
        self.rng = rng or random.Random()
        self.sleep = sleep
        self.clock = clock
        self.state = HEALTHY
        self.counters = Counters()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]
                 ) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path.startswith("/_") and is_control(path, environ.get("HTTP_HOST", "")):
            return self._control(path, environ, start_response)
        if path.startswith("/moto-api"):
            return self.app(environ, start_response)
        self.counters.requests += 1
        state = self.state
        if not state.active or not state.applies_to(environ["REQUEST_METHOD"]):
            return self.app(environ, start_response)
        return self._brownout(state, environ, start_response)

    def _brownout(self, state: Brownout, environ: dict[str, Any],
                  start_response: Callable[..., Any]) -> Iterable[bytes]:
        method = environ["REQUEST_METHOD"]
        if state.latency_ms > 0 or state.jitter_ms > 0:
            self.counters.delayed += 1
            self.sleep(delay_seconds(state, self.rng.random()))
        code = injected_error(state, method, self.rng.random()) if state.error_rate else None
        if code is None:
            body = self.app(environ, start_response)
        else:
            self.counters.injected[code] += 1
            _discard_input(environ)  # as moto would have read it: the connection stays usable
            status, headers, payload = error_response(
                code, method, f"{self.rng.getrandbits(64):016X}",
                f"{self.rng.getrandbits(192):048x}", state.retry_after_s)
            start_response(status, headers)
            body = [payload]
        if state.bandwidth_kbps > 0:
            self.counters.bandwidth_limited += 1
            return self._paced(body, bytes_per_second(state.bandwidth_kbps))
        return body

    def _paced(self, body: Iterable[bytes], rate: float) -> Iterator[bytes]:
        size = chunk_size(rate)
        started = self.clock()
        sent = 0
        try:
            for block in body:
                for start in range(0, len(block), size):
                    piece = block[start:start + size]
                    sent += len(piece)
                    wait = pace_delay(sent, self.clock() - started, rate)
                    if wait > 0:
                        self.sleep(wait)
                    yield piece
        finally:
            close = getattr(body, "close", None)
            if close is not None:  # WSGI: the server's close() must reach moto's iterable
                close()

    def _control(self, path: str, environ: dict[str, Any], start_response: Callable[..., Any]
                 ) -> Iterable[bytes]:
        method = environ["REQUEST_METHOD"]
        if path == METRICS_PATH:
            if method != "GET":
                return _json(start_response, "405 Method Not Allowed",
                             {"error": f"{method} not allowed"}, [("Allow", "GET")])
            text = render_metrics(self.state, self.counters).encode()
            start_response("200 OK", [("Content-Type", "text/plain; version=0.0.4; charset=utf-8"),
                                      ("Content-Length", str(len(text)))])
            return [text]
        if method == "PUT":
            try:
                self.state = parse_body(_read_input(environ, MAX_CONTROL_BODY + 1))
            except BrownoutInvalid as exc:
                return _json(start_response, "422 Unprocessable Entity",
                             {"error": "invalid brownout", "field": exc.field,
                              "reason": exc.reason, "message": str(exc)})
        elif method == "DELETE":
            self.state = HEALTHY
        elif method != "GET":
            return _json(start_response, "405 Method Not Allowed",
                         {"error": f"{method} not allowed"}, [("Allow", "GET, PUT, DELETE")])
        return _json(start_response, "200 OK", status_document(self.state, self.counters))


def _json(start_response: Callable[..., Any], status: str, doc: Mapping[str, Any],
          extra: list[tuple[str, str]] | None = None) -> list[bytes]:
    body = json.dumps(doc).encode()
    start_response(status, [("Content-Type", "application/json"),
                            ("Content-Length", str(len(body))), *(extra or [])])
    return [body]


def _read_input(environ: dict[str, Any], limit: int) -> bytes:
    stream = environ.get("wsgi.input")
    return stream.read(limit) if stream is not None else b""


def _discard_input(environ: dict[str, Any]) -> None:
    stream = environ.get("wsgi.input")
    if stream is not None:
        while stream.read(65536):
            pass


