"""TEST ONLY, never in a deployment (Settings.unsafe_ack_before_commit, seeded defect
`ack-before-commit`): acknowledge a submission before committing it and insert it later, so
the harness can prove it sees acknowledged work lost with an API replica."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from typing import Any

from psycopg_pool import AsyncConnectionPool

from controlplane import metrics
from controlplane.api import serialize
from controlplane.api.deps import log
from controlplane.store import auth as auth_store
from controlplane.store import operations as op_store


class WriteBehind:
    def __init__(self) -> None:
        self._pending: list[tuple[str, str, str, dict[str, Any], str]] = []

    def ack(self, p: auth_store.Principal, key: str, doc: dict[str, Any]) -> dict[str, Any]:
        """The 201 document of a submission that is only queued in this process's memory."""
        op_id = str(uuid.uuid4())
        self._pending.append((op_id, p.project_id or "", key, doc, f"user:{p.project}"))
        metrics.SUBMISSIONS.labels(p.project, doc["queue"], "accepted").inc()
        now = datetime.now(UTC)
        row = {"id": op_id, "spec": doc, "state": "accepted", "state_reason": "acknowledged",
               "pending_reason": None, "attempt_count": 0, "idempotency_key": key,
               "current_attempt_id": None, "pinned_agent": None, "created_at": now,
               "updated_at": now, "result": None, "last_error": None, "first_error": None}
        return serialize.operation(row, p.project)

    async def flush_forever(self, pool: AsyncConnectionPool, every: float) -> None:
        while True:
            await asyncio.sleep(every)
            batch, self._pending[:] = list(self._pending), []
            for op_id, project_id, key, doc, actor in batch:
                try:
                    async with pool.connection() as c:
                        await op_store.submit(c, project_id=project_id, key=key, spec=doc,
                                              actor=actor, op_id=op_id)
                except Exception:  # noqa: BLE001 - logged; one bad row must not stop the loop
                    log.exception("write-behind insert failed", extra={"operation_id": op_id})
