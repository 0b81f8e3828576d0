"""The agent's side of the control-plane HTTP API (CONTRACTS.md section 1, agent endpoints).

HTTP failures become three domain errors at this one boundary:
``LeaseLost`` (409: our fencing token is stale), ``ApiUnavailable`` (transport error, timeout,
5xx: try again later) and ``ApiRejected`` (any other 4xx: a bug or bad config, not retried).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from controlplane import clock, defects
from controlplane.agent.hedge import hedged

log = logging.getLogger(__name__)


class ApiError(Exception):
    """Root of agent API errors."""


class LeaseLost(ApiError):
    """The control plane refused our fencing token: another owner has the attempt now."""


class ApiUnavailable(ApiError):
    """The control plane could not be reached or failed (5xx); the call may be retried."""


class ApiRejected(ApiError):
    """The control plane rejected the call (4xx other than 409)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Registration:
    agent_id: str
    lease_seconds: float
    heartbeat_seconds: float


@dataclass(frozen=True)
class AttemptHeartbeat:
    cancel: bool
    lease_expires_at: str | None


class TokenFile:
    """The agent's token, read from a file that credential rotation replaces (atomically: a
    rename). Re-read whenever the file changed (one stat per request: cheaper than a round
    trip) and on demand after a 401, so a rotated token is picked up by the next request and
    the old one can be revoked without the agent losing a lease. A token kept in memory
    forever would fail every call from the moment the old one is revoked."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._token = ""
        self.get()  # a missing or empty file fails at start, not at the first request

    def get(self) -> str:
        with self._lock:
            if self._token and defects.enabled("token-cached-forever"):
                return self._token  # seeded defect: the first token, forever
            try:
                st = self.path.stat()
            except OSError as exc:
                if self._token:  # mid-rotation or unmounted for a moment: keep the last one
                    return self._token
                raise ApiRejected(f"agent token file {self.path}: {exc}", 401) from exc
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
            if stamp != self._stamp:
                value = self.path.read_text().strip()
                if not value:
                    if self._token:
                        return self._token
                    raise ApiRejected(f"agent token file {self.path} is empty", 401)
                if self._token and value != self._token:
                    log.info("agent token file %s changed: using the rotated token", self.path)
                self._token, self._stamp = value, stamp
            return self._token


# Calls that fit in one lease. An attempt's heartbeats, events and report share one loop, so
# any call stuck on a connection that never answers (a gray network: accepted, then silence)
# delays the next heartbeat: each must give up early enough for the heartbeat to be sent
# again, on a new connection, several times before the lease runs out. Every call of the
# agent is safe to repeat (heartbeats, spooled events, reports answered as duplicates).
TRIES_PER_LEASE = 5


def call_deadline(lease_seconds: float, default: float | None) -> float:
    """How long one API call may wait for its answer: a fifth of the lease, at most the
    client's usual timeout (a long-poll claim adds its wait to this)."""
    if defects.enabled("deadline-beyond-lease"):  # seeded defect: wait longer than the lease
        return 2.0 * lease_seconds
    deadline = lease_seconds / TRIES_PER_LEASE
    return min(deadline, default) if default else deadline


class AgentApi:
    def __init__(self, base_url: str, token: str | TokenFile, *, agent_name: str = "unknown",
                 timeout: float = 3.0, transport: httpx.BaseTransport | None = None) -> None:
        # a fixed string (--token / $CONTROLPLANE_AGENT_TOKEN) or a file re-read on change
        self._token = token
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            # X-Agent-Name: the API records it as the actor of our events and stale reports.
            headers={"X-Agent-Name": agent_name},
            # Short timeouts: a hung API must not hold heartbeats of other attempts hostage.
            timeout=httpx.Timeout(timeout, connect=min(timeout, 2.0)),
            transport=transport,
        )
        # Set from the lease at registration (call_deadline): None until then.
        self.deadline: float | None = None

    def _bearer(self) -> str:
        return self._token if isinstance(self._token, str) else self._token.get()

    def close(self) -> None:
        self._http.close()

    def _post(self, path: str, body: dict[str, Any], *, params: dict[str, Any] | None = None,
              extra_seconds: float = 0.0) -> dict[str, Any]:
        timeout: Any = httpx.USE_CLIENT_DEFAULT
        if self.deadline is not None:
            timeout = httpx.Timeout(self.deadline + extra_seconds,
                                    connect=min(self.deadline, 2.0))
        elif extra_seconds:
            # the server may hold the request this much longer on purpose (long poll)
            base = self._http.timeout
            timeout = httpx.Timeout(connect=base.connect, read=(base.read or 0) + extra_seconds,
                                    write=base.write, pool=base.pool)
        sent = self._bearer()
        try:
            response = self._http.post(path, json=body, params=params, timeout=timeout,
                                       headers={"Authorization": f"Bearer {sent}"})
            if response.status_code == 401 and self._bearer() != sent:
                # rotated between reading the token and the answer: once more with the new one
                response = self._http.post(path, json=body, params=params, timeout=timeout,
                                           headers={"Authorization": f"Bearer {self._bearer()}"})
        except httpx.TransportError as exc:
            raise ApiUnavailable(f"POST {path}: {type(exc).__name__}: {exc}") from exc
        if response.status_code == 409:
            raise LeaseLost(f"POST {path}: 409 {_detail(response)}")
        if response.status_code >= 500:
            raise ApiUnavailable(f"POST {path}: {response.status_code} {_detail(response)}")
        if response.status_code >= 400:
            raise ApiRejected(f"POST {path}: {response.status_code} {_detail(response)}",
                              response.status_code)
        return response.json() if response.content else {}

    def register(self, name: str, pool: str, zone: str, region: str,
                 capabilities: dict[str, Any]) -> Registration:
        body = self._post("/v1/agents/register", {"name": name, "pool": pool, "zone": zone,
                                                  "region": region, "capabilities": capabilities})
        reg = Registration(str(body["agent_id"]), float(body["lease_seconds"]),
                           float(body["heartbeat_seconds"]))
        self.deadline = call_deadline(reg.lease_seconds, self._http.timeout.read)
        return reg

    def heartbeat(self, agent_id: str) -> None:
        self._post(f"/v1/agents/{agent_id}/heartbeat", {})

    def claim(self, agent_id: str, max_items: int, wait: float = 0.0,
              claim_id: str | None = None) -> list[dict[str, Any]]:
        """Claim routed work; ``wait`` > 0 lets the API hold the call that long for work to
        arrive (an API that does not know the parameter answers at once). ``claim_id``: the
        same id again after a failed call gets back what that call may have been granted."""
        params = {"wait": f"{wait:.3f}"} if wait > 0 else None
        # our wall clock, reported (the API records our offset); the lease is on its clock
        body: dict[str, Any] = {"max": max_items, "agent_time": clock.wall()}
        if claim_id is not None:
            body["claim_id"] = claim_id
        return list(self._post(f"/v1/agents/{agent_id}/claim", body,
                               params=params, extra_seconds=wait).get("items", []))

    def attempt_heartbeat(self, attempt_id: str, fencing_token: int,
                          progress: dict[str, Any] | None) -> AttemptHeartbeat:
        """Hedged once the deadline is known: unanswered after half of it, the heartbeat goes
        again on another connection (controlplane/agent/hedge.py): the lease hangs on it."""
        body_sent = {"fencing_token": fencing_token, "progress": progress,
                     "agent_time": clock.wall()}

        def call() -> dict[str, Any]:
            return self._post(f"/v1/attempts/{attempt_id}/heartbeat", body_sent)

        body = (call() if self.deadline is None else
                hedged(call, retry_on=ApiUnavailable, every=self.deadline / 2,
                       within=self.deadline, name=f"heartbeat-{attempt_id[:8]}"))
        return AttemptHeartbeat(bool(body.get("cancel", False)), body.get("lease_expires_at"))

    def send_events(self, attempt_id: str, fencing_token: int, events: list[dict[str, Any]]) -> None:
        self._post(f"/v1/attempts/{attempt_id}/events",
                   {"fencing_token": fencing_token, "events": events})

    def agent_events(self, agent_id: str, attempt_id: str, events: list[dict[str, Any]]) -> None:
        """Agent-level evidence (``evidence_dropped``) recorded on an attempt this agent held,
        whatever its state now: for when the agent owns no live attempt to send it on."""
        self._post(f"/v1/agents/{agent_id}/events", {"attempt_id": attempt_id, "events": events})

    def side_effect(self, operation_id: str, action_id: str, kind: str,
                    payload: dict[str, Any]) -> dict[str, Any]:
        """Record an external action once: the same ``action_id`` again (a retry after a lost
        answer, another attempt) gets the first receipt back."""
        return self._post(f"/v1/operations/{operation_id}/side-effects",
                          {"action_id": action_id, "kind": kind, "payload": payload})

    def report(self, attempt_id: str, fencing_token: int, state: str, reason: str,
               error: dict[str, str] | None = None, result: dict[str, Any] | None = None,
               events: list[dict[str, Any]] | None = None) -> None:
        body: dict[str, Any] = {"fencing_token": fencing_token, "state": state, "reason": reason,
                                "error": error, "result": result}
        if events:
            body["events"] = events
        self._post(f"/v1/attempts/{attempt_id}/report", body)


def _detail(response: httpx.Response) -> str:
    try:
        return str(response.json().get("detail", response.text))[:500]
    except ValueError:
        return response.text[:500]
