"""An S3 brownout in the local S3 API server: throttling, errors, latency and a bandwidth cap,
switched at run time, in front of moto's application (environments/local/motoserver.py).

A brownout is the store being up but degraded: some requests answered ``503 SlowDown`` (S3's
throttling answer) or another 5xx, every answer late, bodies trickling in. Each injected
error answers instead of moto: the request never reaches it, so moto's state is never touched.

Control, on the server's own port, with a path no S3 request can have (see ``is_control``)::

    GET    /_gameday/brownout           -> 200 status: the state and the counters
    PUT    /_gameday/brownout  {json}   -> 200 status; the body replaces the whole state
                                           (omitted fields take their defaults); a bad body
                                           -> 422 {"field", "reason", "message"}, nothing changed
    DELETE /_gameday/brownout           -> 200 status, healthy again (counters are kept)
    GET    /_gameday/brownout/metrics   -> Prometheus text

State fields (``Brownout``): ``error_rate`` 0..1, ``error_code`` SlowDown (503) /
InternalError (500) / ServiceUnavailable (503), ``latency_ms`` and ``jitter_ms`` (each
affected request waits latency +- uniform jitter, at least 0), ``bandwidth_kbps`` (response
bodies paced to this many kilobits per second, 0 = no cap), ``methods`` (only these HTTP
methods are affected; null = all) and ``retry_after_s`` (null: no ``Retry-After``, as AWS S3,
which does not send one; MinIO sends ``Retry-After: 120`` with SlowDown).

moto's own API (``/moto-api/``, the environment's health check) is never affected: a brownout
is of S3, not of the process.
"""

from __future__ import annotations

import ipaddress
import json
import math
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from xml.sax.saxutils import escape

CONTROL_PATH = "/_gameday/brownout"
METRICS_PATH = CONTROL_PATH + "/metrics"
# code -> (status line, message), as AWS S3 answers them (ErrorResponses in the S3 API reference)
ERRORS: dict[str, tuple[str, str]] = {
    "SlowDown": ("503 Slow Down", "Please reduce your request rate."),
    "InternalError": ("500 Internal Server Error",
                      "We encountered an internal error. Please try again."),
    "ServiceUnavailable": ("503 Service Unavailable", "Service is unable to handle request."),
}
METHODS = ("DELETE", "GET", "HEAD", "POST", "PUT")
MAX_DELAY_MS = 60_000.0  # longer is a hang (a read timeout), not a brownout: SIGSTOP does that
MAX_RETRY_AFTER_S = 86_400
MAX_CONTROL_BODY = 64 * 1024
WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


# --- state and its validation ----------------------------------------------------------------


@dataclass(frozen=True)
class Brownout:
    error_rate: float = 0.0
    error_code: str = "SlowDown"
    latency_ms: float = 0.0
    jitter_ms: float = 0.0
    bandwidth_kbps: float = 0.0
    methods: frozenset[str] | None = None
    retry_after_s: int | None = None

    @property
    def active(self) -> bool:
        return (self.error_rate > 0 or self.latency_ms > 0 or self.jitter_ms > 0
                or self.bandwidth_kbps > 0)

    def applies_to(self, method: str) -> bool:
        return self.methods is None or method in self.methods

    def to_json(self) -> dict[str, Any]:
        return {"error_rate": self.error_rate, "error_code": self.error_code,
                "latency_ms": self.latency_ms, "jitter_ms": self.jitter_ms,
                "bandwidth_kbps": self.bandwidth_kbps,
                "methods": None if self.methods is None else sorted(self.methods),
                "retry_after_s": self.retry_after_s}


HEALTHY = Brownout()


class BrownoutInvalid(ValueError):
    """A control body that does not describe a brownout; names the offending field."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


def _number(name: str, value: object, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BrownoutInvalid(name, f"must be a number, got {json.dumps(value)}")
    if not math.isfinite(value) or not 0 <= value <= high:
        raise BrownoutInvalid(name, f"must be between 0 and {high:g}, got {value}")
    return float(value)


def _error_code(value: object) -> str:
    if value not in ERRORS:
        raise BrownoutInvalid("error_code", f"must be one of {', '.join(ERRORS)}, "
                                            f"got {json.dumps(value)}")
    return str(value)


def _methods(value: object) -> frozenset[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(m, str) for m in value):
        raise BrownoutInvalid("methods", "must be a list of HTTP methods or null")
    if not value:
        raise BrownoutInvalid("methods", "must not be empty (null affects every method)")
    methods = frozenset(m.upper() for m in value)
    unknown = sorted(methods - set(METHODS))
    if unknown:
        raise BrownoutInvalid("methods", f"unknown {', '.join(unknown)}; S3 uses "
                                         f"{', '.join(METHODS)}")
    return methods


def _retry_after(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_RETRY_AFTER_S:
        raise BrownoutInvalid("retry_after_s", f"must be an integer between 0 and "
                                               f"{MAX_RETRY_AFTER_S} or null, got {value!r}")
    return value


def parse_brownout(doc: object) -> Brownout:
    """The brownout a control document describes; omitted fields keep their defaults."""
    if not isinstance(doc, dict):
        raise BrownoutInvalid("body", "must be a JSON object")
    unknown = sorted(set(doc) - set(HEALTHY.to_json()))
    if unknown:
        raise BrownoutInvalid(unknown[0], "unknown field")
    d = HEALTHY
    return Brownout(
        error_rate=_number("error_rate", doc.get("error_rate", d.error_rate), 1.0),
        error_code=_error_code(doc.get("error_code", d.error_code)),
        latency_ms=_number("latency_ms", doc.get("latency_ms", d.latency_ms), MAX_DELAY_MS),
        jitter_ms=_number("jitter_ms", doc.get("jitter_ms", d.jitter_ms), MAX_DELAY_MS),
        bandwidth_kbps=_number("bandwidth_kbps", doc.get("bandwidth_kbps", d.bandwidth_kbps),
                               math.inf),
        methods=_methods(doc.get("methods")),
        retry_after_s=_retry_after(doc.get("retry_after_s")),
    )


def parse_body(raw: bytes) -> Brownout:
    if len(raw) > MAX_CONTROL_BODY:
        raise BrownoutInvalid("body", f"larger than {MAX_CONTROL_BODY} bytes")
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BrownoutInvalid("body", f"not JSON: {exc}") from None
    return parse_brownout(doc)


# --- decisions (pure: the draws come from the caller's generator) -----------------------------


def injected_error(state: Brownout, method: str, draw: float) -> str | None:
    """The error code to answer with instead of moto, for a draw in [0, 1), or None."""
    if state.applies_to(method) and draw < state.error_rate:
        return state.error_code
    return None


def delay_seconds(state: Brownout, draw: float) -> float:
    """latency +- jitter, the jitter uniform over the whole range for a draw in [0, 1)."""
    return max(0.0, state.latency_ms + state.jitter_ms * (2.0 * draw - 1.0)) / 1000.0


def error_response(code: str, method: str, request_id: str, host_id: str,
                   retry_after_s: int | None = None) -> tuple[str, list[tuple[str, str]], bytes]:
    """(status line, headers, body) of S3's answer ``code``: an XML error document, which
    botocore parses into ClientError's Error.Code. A HEAD answer has no body (as S3: botocore
    then takes the code from the status)."""
    status, message = ERRORS[code]
    body = b"" if method == "HEAD" else (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{escape(message)}</Message>"
        f"<RequestId>{escape(request_id)}</RequestId><HostId>{escape(host_id)}</HostId>"
        "</Error>").encode()
    headers = [("Content-Type", "application/xml"), ("Content-Length", str(len(body))),
               ("x-amz-request-id", request_id), ("x-amz-id-2", host_id)]
    if retry_after_s is not None:
        headers.append(("Retry-After", str(retry_after_s)))
    return status, headers, body


def bytes_per_second(kbps: float) -> float:
    return kbps * 125.0  # 1 kbps = 1000 bit/s


def chunk_size(rate: float) -> int:
    """Bytes released at a time: about 20 per second, so a capped body arrives smoothly."""
    return max(256, int(rate / 20))


def pace_delay(sent: int, elapsed: float, rate: float) -> float:
    """Seconds to wait before releasing data that brings the total to ``sent`` bytes: a chunk
    goes out when a link of ``rate`` bytes/s would have finished carrying it."""
    return max(0.0, sent / rate - elapsed)


def is_control(path: str, host: str) -> bool:
    """True for the control paths on a host that moto reads path-style (an IP address, or a
    name without a dot such as ``localhost``): there the first segment is the bucket, and
    ``_gameday`` is no valid bucket name (S3 requires a letter or digit first). On a
    virtual-hosted host (``bucket.s3.example``) the same path is an object key: moto's."""
    if path != CONTROL_PATH and path != METRICS_PATH:
        return False
    if host.startswith("["):
        return True  # an IPv6 literal
    name = host.rsplit(":", 1)[0]
    if "." not in name:
        return True
    try:
        ipaddress.IPv4Address(name)
    except ValueError:
        return False
    return True


@dataclass
class Counters:
    requests: int = 0  # S3 requests seen (moto's own API and the control paths not counted)
    injected: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ERRORS, 0))
    delayed: int = 0
    bandwidth_limited: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"requests": self.requests, "injected": dict(self.injected),
                "delayed": self.delayed, "bandwidth_limited": self.bandwidth_limited}


def status_document(state: Brownout, counters: Counters) -> dict[str, Any]:
    return {"state": state.to_json(), "active": state.active, "counters": counters.to_json()}


def render_metrics(state: Brownout, counters: Counters) -> str:
    p = "gameday_s3_brownout"
    lines = [
        f"# HELP {p}_requests_total S3 requests that reached the brownout layer.",
        f"# TYPE {p}_requests_total counter",
        f"{p}_requests_total {counters.requests}",
        f"# HELP {p}_injected_total S3 requests answered with an injected error, by S3 code.",
        f"# TYPE {p}_injected_total counter",
        *(f'{p}_injected_total{{code="{code}"}} {n}' for code, n in counters.injected.items()),
        f"# HELP {p}_delayed_total S3 requests held back by the brownout's latency.",
        f"# TYPE {p}_delayed_total counter",
        f"{p}_delayed_total {counters.delayed}",
        f"# HELP {p}_bandwidth_limited_total S3 responses paced by the bandwidth cap.",
        f"# TYPE {p}_bandwidth_limited_total counter",
        f"{p}_bandwidth_limited_total {counters.bandwidth_limited}",
        f"# HELP {p}_error_rate Fraction of affected S3 requests answered with an error.",
        f"# TYPE {p}_error_rate gauge",
        f"{p}_error_rate {state.error_rate:g}",
        f"# HELP {p}_active 1 while a brownout is set.",
        f"# TYPE {p}_active gauge",
        f"{p}_active {int(state.active)}",
    ]
    return "\n".join(lines) + "\n"


# --- the middleware ----------------------------------------------------------------------------


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
            import gevent  # here, not at import: the client side of this module needs none

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


# --- the client ------------------------------------------------------------------------------


class BrownoutUnreachable(ConnectionError):
    """The S3 server's control path could not be reached."""


class BrownoutRejected(ValueError):
    """The server refused a brownout (422); ``field`` and ``reason`` say why."""

    def __init__(self, url: str, field: str, reason: str) -> None:
        super().__init__(f"{url}: {field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass(frozen=True)
class BrownoutStatus:
    state: Brownout
    active: bool
    counters: Counters


def parse_status(doc: Mapping[str, Any]) -> BrownoutStatus:
    c = doc["counters"]
    counters = Counters(int(c["requests"]), {k: int(v) for k, v in c["injected"].items()},
                        int(c["delayed"]), int(c["bandwidth_limited"]))
    return BrownoutStatus(parse_brownout(doc["state"]), bool(doc["active"]), counters)


class BrownoutClient:
    """Sets and reads the brownout of a local S3 server; ``base_url`` is its S3 endpoint
    (``http://127.0.0.1:PORT``)."""

    def __init__(self, base_url: str, timeout: float = 2.0) -> None:
        self.url = base_url.rstrip("/") + CONTROL_PATH
        self.timeout = timeout

    def set(self, **fields: Any) -> BrownoutStatus:
        """Replace the brownout with these fields (the others at their defaults)."""
        if isinstance(fields.get("methods"), set | frozenset | tuple):
            fields["methods"] = sorted(fields["methods"])
        return parse_status(self._call("PUT", self.url, fields).json())

    def clear(self) -> BrownoutStatus:
        return parse_status(self._call("DELETE", self.url).json())

    def state(self) -> BrownoutStatus:
        return parse_status(self._call("GET", self.url).json())

    def metrics(self) -> str:
        return self._call("GET", self.url + "/metrics").text

    def _call(self, method: str, url: str, body: dict[str, Any] | None = None) -> Any:
        import httpx  # here: the server imports this module and never needs httpx

        try:
            # verify only for https: building the TLS context costs ~85 ms a call, for nothing
            # on the usual http://127.0.0.1 endpoint
            answer = httpx.request(method, url, json=body, verify=url.startswith("https:"),
                                   timeout=httpx.Timeout(self.timeout, connect=min(1.0, self.timeout)))
        except httpx.TransportError as exc:
            raise BrownoutUnreachable(f"S3 brownout control at {url} unreachable: "
                                      f"{type(exc).__name__}: {exc}") from exc
        if answer.status_code == 422:
            doc = answer.json()
            raise BrownoutRejected(url, doc["field"], doc["reason"])
        if answer.status_code != 200:
            raise RuntimeError(f"S3 brownout control at {url} answered {answer.status_code} "
                               f"(a server without the brownout layer?): {answer.text[:200]}")
        return answer
