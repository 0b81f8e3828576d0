"""The columns every store statement returns, named: no statement returns ``*``.

Why: psycopg prepares a statement on the server after it has run a few times on a connection,
and a prepared ``SELECT *`` (or ``RETURNING *``, ``o.*``) fails for good on that connection
with "cached plan must not change result type" once an expand migration adds a column to its
table. In a rolling upgrade that is every connection of every release-N process the moment
N+1's expand runs (docs/upgrades.md). A named list keeps its result type whatever is added, so
prepared statements stay on: turning them off instead cost PostgreSQL about 0.3-0.5 ms of CPU
per submission in `gameday bench controlplane` (docs/upgrades.md, "Expand-safe SQL").

The lists are the schema release N runs on (migrations up to 0006). A column an expand adds
is read only by the release that knows it, in place of the column it replaces (``RENAMED``), so
that release also runs once the contract has dropped the old one. tests/controlplane/test_store_columns.py
checks these lists against the migrated schema and that no store statement returns ``*``.
"""

from __future__ import annotations

from functools import cache

from controlplane import release

TABLES: dict[str, tuple[str, ...]] = {
    "operations": (
        "id", "project_id", "idempotency_key", "payload_hash", "name", "queue", "priority",
        "spec", "state", "state_reason", "pending_reason", "attempt_count", "max_retries",
        "timeout_seconds", "current_attempt_id", "pinned_agent", "next_eligible_at",
        "waiting_since", "last_error", "first_error", "result", "created_at", "updated_at"),
    "attempts": (
        "id", "operation_id", "number", "agent_id", "state", "fencing_token",
        "lease_expires_at", "created_at", "claimed_at", "started_at", "finished_at",
        "last_progress_at", "progress", "error", "result"),
    "agents": (
        "id", "name", "pool", "zone", "region", "cpu_slots", "accelerator_type",
        "accelerator_count", "datasets", "registries", "registered_at", "last_heartbeat_at",
        "consecutive_failures", "breaker_open_until", "breaker_override"),
    "events": (
        "id", "operation_id", "attempt_id", "time", "actor", "kind", "from_state", "to_state",
        "reason", "data"),
    "side_effects": ("operation_id", "action_id", "kind", "payload", "receipt", "created_at"),
    "operation_redirects": (
        "old_id", "new_id", "project_id", "idempotency_key", "restore_id", "acknowledged_at",
        "created_at"),
    "pipelines": (
        "id", "project_id", "idempotency_key", "payload_hash", "name", "spec", "state",
        "state_reason", "report", "created_at", "updated_at"),
    "pipeline_steps": (
        "pipeline_id", "name", "position", "state", "state_reason", "operation_id", "cache_key",
        "inputs", "manifest", "report", "started_at", "finished_at", "updated_at"),
    "pipeline_cache": (
        "project_id", "cache_key", "components", "manifest", "source_pipeline_id", "source_step",
        "source_operation_id", "created_at"),
}

# release -> table -> {column of N: the column that release reads instead} (controlplane/release.py)
RENAMED: dict[str, dict[str, dict[str, str]]] = {
    "N+1": {"operations": {release.OLD_COLUMN: release.NEW_COLUMN}},
}


def names(table: str, of_release: str | None = None) -> tuple[str, ...]:
    renamed = RENAMED.get(of_release or release.current(), {}).get(table, {})
    return tuple(renamed.get(c, c) for c in TABLES[table])


def _listed(table: str, alias: str, rel: str) -> str:
    return _some(table, alias, rel, TABLES[table])


def of(table: str, alias: str = "") -> str:
    """``o.id, o.project_id, ...`` for this process's release. Plain text on purpose: the names
    are the constants above, never input."""
    return _listed(table, alias, release.current())


@cache
def _some(table: str, alias: str, rel: str, wanted: tuple[str, ...]) -> str:
    renamed = RENAMED.get(rel, {}).get(table, {})
    unknown = [c for c in wanted if c not in TABLES[table]]
    if unknown:
        raise ValueError(f"{table} has no column(s) {unknown}")
    prefix = f"{alias}." if alias else ""
    return ", ".join(prefix + renamed.get(c, c) for c in wanted)


def some(table: str, wanted: tuple[str, ...], alias: str = "") -> str:
    """Only ``wanted`` of ``table``'s columns (named as release N names them), as this
    process's release reads them: for a statement that reads few columns of many rows."""
    return _some(table, alias, release.current(), wanted)

