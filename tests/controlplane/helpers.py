"""Small HTTP helpers over a running control plane (tests only)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx

IMAGE = "127.0.0.1:5000/ml/trainer:1.0"


def spec(name: str = "train", **over: Any) -> dict[str, Any]:
    s: dict[str, Any] = {"name": name, "workload": {"kind": "train", "image": IMAGE,
                                                   "params": {"steps": 10}}}
    s.update(over)
    return s


class Api:
    def __init__(self, url: str, token: str, agent_name: str = "test-agent") -> None:
        self.c = httpx.Client(base_url=url, timeout=10.0,
                              headers={"Authorization": f"Bearer {token}",
                                       "X-Agent-Name": agent_name})

    def submit(self, body: dict[str, Any], key: str | None = None) -> httpx.Response:
        return self.c.post("/v1/operations", json=body,
                           headers={"Idempotency-Key": key or str(uuid.uuid4())})

    def op(self, op_id: str) -> dict[str, Any]:
        r = self.c.get(f"/v1/operations/{op_id}")
        r.raise_for_status()
        return r.json()

    def events(self, op_id: str) -> list[dict[str, Any]]:
        return self.c.get(f"/v1/operations/{op_id}/events").json()["items"]

    def attempts(self, op_id: str) -> list[dict[str, Any]]:
        return self.c.get(f"/v1/operations/{op_id}/attempts").json()["items"]

    def register(self, name: str, pool: str = "cpu", zone: str = "zone-a",
                 region: str = "region-1", **caps: Any) -> str:
        body = {"name": name, "pool": pool, "zone": zone, "region": region,
                "capabilities": {"cpu_slots": 4, **caps}}
        r = self.c.post("/v1/agents/register", json=body)
        r.raise_for_status()
        return r.json()["agent_id"]

    def claim(self, agent_id: str, n: int = 8) -> list[dict[str, Any]]:
        r = self.c.post(f"/v1/agents/{agent_id}/claim", json={"max": n})
        r.raise_for_status()
        return r.json()["items"]

    def report(self, claim: dict[str, Any], state: str, **extra: Any) -> httpx.Response:
        return self.c.post(f"/v1/attempts/{claim['attempt_id']}/report",
                           json={"fencing_token": claim["fencing_token"], "state": state, **extra})

    def heartbeat(self, claim: dict[str, Any]) -> httpx.Response:
        return self.c.post(f"/v1/attempts/{claim['attempt_id']}/heartbeat",
                           json={"fencing_token": claim["fencing_token"]})


def wait_for(pred: Any, timeout: float = 15.0, every: float = 0.1, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def wait_state(api: Api, op_id: str, *states: str, timeout: float = 15.0) -> dict[str, Any]:
    return wait_for(lambda: (o := api.op(op_id))["state"] in states and o, timeout,
                    what=f"operation {op_id} in {states}")


def claim_one(api: Api, agent_id: str, timeout: float = 10.0) -> dict[str, Any]:
    return wait_for(lambda: (api.claim(agent_id, 1) or [None])[0], timeout, what="a claim")
