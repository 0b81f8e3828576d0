"""The S3 brownout's client side (environments/local/s3_brownout.py has the model): set, clear and
read the brownout of a local S3 server over its control path (environments/local/store_brownout.py
uses it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from environments.local.s3_brownout import (
    CONTROL_PATH,
    Brownout,
    Counters,
    parse_brownout,
)


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
