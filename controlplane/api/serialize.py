"""Rows -> API documents (docs/CONTRACTS.md section 1)."""

from __future__ import annotations

from typing import Any

from controlplane import release

OP_FIELDS = ("name", "queue", "priority", "workload", "resources", "placement", "max_retries",
             "timeout_seconds", "labels", "workload_class")


def operation(row: dict[str, Any], project: str | None) -> dict[str, Any]:
    spec = row["spec"]
    doc = {k: spec.get(k) for k in OP_FIELDS}
    doc["datasets"] = spec.get("datasets", [])  # left out of the stored document when none
    doc.update({
        "id": str(row["id"]), "project": project, "state": row["state"],
        "state_reason": row["state_reason"], "pending_reason": release.wait_reason(row),
        "attempt_count": row["attempt_count"], "idempotency_key": row["idempotency_key"],
        "current_attempt_id": _s(row["current_attempt_id"]), "pinned_agent": row["pinned_agent"],
        "created_at": row["created_at"].isoformat(), "updated_at": row["updated_at"].isoformat(),
        "result": row["result"], "last_error": row["last_error"], "first_error": row["first_error"],
    })
    if "pipeline" in spec:  # a pipeline step: its inputs, cache key and action identity
        doc["pipeline"] = spec["pipeline"]
    return doc


def event(row: dict[str, Any]) -> dict[str, Any]:
    return {"id": row["id"], "operation_id": str(row["operation_id"]),
            "attempt_id": _s(row["attempt_id"]), "time": row["time"].isoformat(),
            "actor": row["actor"], "kind": row["kind"], "from_state": row["from_state"],
            "to_state": row["to_state"], "reason": row["reason"], "data": row["data"]}


def attempt(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": str(row["id"]), "operation_id": str(row["operation_id"]), "number": row["number"],
        "agent_id": str(row["agent_id"]), "agent_name": row.get("agent_name"),
        "state": row["state"], "fencing_token": row["fencing_token"],
        "lease_expires_at": _t(row["lease_expires_at"]), "created_at": _t(row["created_at"]),
        "claimed_at": _t(row["claimed_at"]), "started_at": _t(row["started_at"]),
        "finished_at": _t(row["finished_at"]), "progress": row["progress"],
        "error": row["error"], "result": row["result"],
    }


def agent(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": str(row["id"]), "name": row["name"], "pool": row["pool"], "zone": row["zone"],
        "region": row["region"], "alive": row["alive"], "breaker_open": row["breaker_open"],
        "consecutive_failures": row["consecutive_failures"],
        "capabilities": {"cpu_slots": row["cpu_slots"],
                         "accelerator_type": row["accelerator_type"],
                         "accelerator_count": row["accelerator_count"],
                         "datasets": row["datasets"], "registries": row["registries"]},
        "last_heartbeat_at": _t(row["last_heartbeat_at"]),
    }


def _s(v: Any) -> str | None:
    return None if v is None else str(v)


def _t(v: Any) -> str | None:
    return None if v is None else v.isoformat()
