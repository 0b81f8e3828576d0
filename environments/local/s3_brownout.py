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

This module is the model (the state, its validation, the pure decisions, the status and
metrics documents); the middleware is environments/local/s3_brownout_server.py, the client
environments/local/s3_brownout_client.py.
"""

from __future__ import annotations

import ipaddress
import json
import math
from collections.abc import Callable, Iterable
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
