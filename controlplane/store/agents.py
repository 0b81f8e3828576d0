"""Agent-facing queries: registration, liveness, claims with fencing, attempt reports."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from controlplane import defects
from controlplane.policy import ErrorKind, decide_retry
from controlplane.states import ActiveAttemptStates, OpState
from controlplane.store import Conflict, NotFound, StaleReport, columns
from controlplane.store.operations import NOTIFY_CHANNEL
from controlplane.store.transitions import db_now, record_event, transition

BREAKER_THRESHOLD = 3  # consecutive transient failures on one agent before it stops getting work
BREAKER_COOLDOWN = timedelta(seconds=30)
# Wakes long-polling claims (controlplane/api/claimwait.py): payload = comma-separated ids of
# agents with unclaimed dispatched attempts, "" = wake every waiter.
CLAIM_CHANNEL = "controlplane_claimable"
NOTIFY_MAX_AGENTS = 200  # pg_notify payloads stop at 8000 bytes: more ids -> wake everyone


# Fleet records have no operation: events keep them under the nil operation id (events has no
# foreign key on it), apart from every operation's own (platforms/controlplane.py writes them to
# snapshot/agent_liveness.jsonl). A new table would be a schema change that release N (which
# runs on revision 0006, controlplane/release.py) does not know.
FLEET_OPERATION = "00000000-0000-0000-0000-000000000000"
HEARD_AGAIN = "agent_heard_again"


async def _note_heard_again(conn: AsyncConnection, name: str, silent_since: Any,
                            silence_seconds: float | None) -> None:
    """Record an agent heard from after a silence of more than ``silence_seconds`` (the
    liveness timeout routing uses): while it was silent routing knew it dead, and this is the
    first moment it may take work again (what the routed-to-live-agents invariant judges
    dispatches against). Stamped by the database's clock, like the heartbeats and dispatches."""
    if silence_seconds is None or silent_since is None:
        return
    await conn.execute(
        "INSERT INTO events (operation_id, actor, kind, reason, data)"
        " SELECT %(fleet)s::uuid, 'agent:' || %(name)s, %(kind)s,"
        "        'agent heard again after ' || round(extract(epoch FROM now() - %(since)s)::numeric, 1)"
        "        || 's of silence',"
        "        jsonb_build_object('agent', %(name)s::text, 'silent_since', %(since)s::timestamptz,"
        "                           'timeout_seconds', %(timeout)s::float8)"
        " WHERE now() - %(since)s::timestamptz > make_interval(secs => %(timeout)s)",
        {"fleet": FLEET_OPERATION, "name": name, "kind": HEARD_AGAIN, "since": silent_since,
         "timeout": silence_seconds})


async def register(conn: AsyncConnection, reg: dict[str, Any],
                   silence_seconds: float | None = None) -> str:
    caps = reg["capabilities"]
    async with conn.cursor() as cur:
        await cur.execute("SELECT last_heartbeat_at FROM agents WHERE name = %s FOR UPDATE",
                          (reg["name"],))
        before = await cur.fetchone()
        await cur.execute(
            """INSERT INTO agents (name, pool, zone, region, cpu_slots, accelerator_type,
                                   accelerator_count, datasets, registries)
               VALUES (%(name)s, %(pool)s, %(zone)s, %(region)s, %(cpu)s, %(at)s, %(ac)s,
                       %(ds)s, %(rg)s)
               ON CONFLICT (name) DO UPDATE SET pool = EXCLUDED.pool, zone = EXCLUDED.zone,
                   region = EXCLUDED.region, cpu_slots = EXCLUDED.cpu_slots,
                   accelerator_type = EXCLUDED.accelerator_type,
                   accelerator_count = EXCLUDED.accelerator_count, datasets = EXCLUDED.datasets,
                   registries = EXCLUDED.registries, last_heartbeat_at = now()
               RETURNING id::text""",
            {"name": reg["name"], "pool": reg["pool"], "zone": reg["zone"],
             "region": reg["region"], "cpu": caps["cpu_slots"], "at": caps.get("accelerator_type"),
             "ac": caps.get("accelerator_count", 0), "ds": caps.get("datasets", []),
             "rg": caps.get("registries", [])})
        row = await cur.fetchone()
        # new capacity may unblock waiting work: wake the scheduler
        await cur.execute("SELECT pg_notify(%s, 'agent')", (NOTIFY_CHANNEL,))
    assert row is not None
    if before is not None:  # a restarted agent registers again: its first sign of life
        await _note_heard_again(conn, reg["name"], before[0], silence_seconds)
    return row[0]


async def heartbeat(conn: AsyncConnection, agent_id: str,
                    silence_seconds: float | None = None) -> None:
    """``silence_seconds``: the liveness timeout; a heartbeat after a longer silence is
    recorded (_note_heard_again). The row is read and updated in one statement (the read
    locks it), so two heartbeats at once never both see the old silence; the usual heartbeat
    costs no second statement (every claim heartbeats)."""
    cur = await conn.execute(
        "WITH before AS (SELECT id, name, last_heartbeat_at FROM agents"
        "                WHERE id = %s::uuid FOR UPDATE)"
        " UPDATE agents a SET last_heartbeat_at = now() FROM before b WHERE a.id = b.id"
        " RETURNING b.name, b.last_heartbeat_at,"
        "           now() - b.last_heartbeat_at > make_interval(secs => %s::float8)",
        (agent_id, silence_seconds))
    row = await cur.fetchone()
    if row is None:
        raise NotFound(f"agent {agent_id} is not registered; register again")
    if row[2]:  # NULL (no timeout given) or false: nothing to record
        await _note_heard_again(conn, row[0], row[1], silence_seconds)


def _lease_base(agent_time: float | None) -> str:
    """SQL for the instant a lease is measured from: the database's ``now()``, the one clock
    every grant, renewal and expiry is compared on (controlplane/clock.py). The seeded defect
    ``lease-from-agent-clock`` measures it from the agent's own clock instead."""
    if agent_time is not None and defects.enabled("lease-from-agent-clock"):  # test only
        return "to_timestamp(%(agent_time)s)"
    return "now()"


_CLAIMED_COLUMNS = """t.id AS attempt_id, t.operation_id, t.number, t.fencing_token,
                             t.lease_expires_at, o.spec, p.name AS project,
                             extract(epoch FROM now())::float8 AS db_now"""


async def _claimed_again(conn: AsyncConnection, agent_id: str, claim_id: str,
                         lease_seconds: float) -> list[dict[str, Any]]:
    """The attempts an earlier claim with this ``claim_id`` granted this agent and that it
    has not started yet (still ``dispatched``, lease live): the answer of that claim was lost
    on its way (a reset connection), and the agent asks again with the same id. Same fencing
    token; the lease is renewed, as by a heartbeat of the agent that holds it."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            """UPDATE attempts t SET lease_expires_at = now() + make_interval(secs => %(lease)s)
               FROM operations o, projects p
               WHERE t.agent_id = %(agent)s::uuid AND t.state = 'dispatched'
                 AND t.claimed_at IS NOT NULL AND t.lease_expires_at > now()
                 AND EXISTS (SELECT 1 FROM events e
                             WHERE e.operation_id = t.operation_id AND e.attempt_id = t.id
                               AND e.kind = 'claimed' AND e.data->>'claim_id' = %(claim)s)
                 AND o.id = t.operation_id AND p.id = o.project_id
               RETURNING """ + _CLAIMED_COLUMNS,
            {"agent": agent_id, "claim": claim_id, "lease": lease_seconds})
        rows = await cur.fetchall()
    for r in rows:
        await record_event(conn, r["operation_id"], attempt_id=r["attempt_id"],
                           actor=f"agent:{agent_id}", kind="claim_redelivered",
                           reason=f"attempt {r['number']}: claim {claim_id} asked again "
                                  "(its answer was lost)",
                           data={"fencing_token": r["fencing_token"], "claim_id": claim_id,
                                 "lease_seconds": lease_seconds,
                                 "lease_expires_at": r["lease_expires_at"].isoformat()})
    return rows


async def claim(conn: AsyncConnection, agent_id: str, max_items: int,
                lease_seconds: float, agent_time: float | None = None,
                claim_id: str | None = None) -> list[dict[str, Any]]:
    """Take the attempts routed to this agent. Each claim gets a new, higher fencing token.

    ``agent_time`` (the agent's wall clock when it asked) is only recorded on the claim event
    as the agent's clock offset; the lease is measured on the database's clock. ``claim_id``
    (the agent's id of this claim, the same when it asks again after a lost answer) first
    hands back what an earlier claim with that id granted and the agent never started."""
    async with conn.transaction():
        # the agent's liveness timeout is the lease (the reconciler's --agent-timeout defaults
        # to it; the local environment sets both to LEASE_SECONDS)
        await heartbeat(conn, agent_id, lease_seconds)
        redeliver = claim_id and not defects.enabled("claim-redelivery-skipped")  # seeded defect
        again = await _claimed_again(conn, agent_id, claim_id, lease_seconds) if redeliver else []
        max_items -= len(again)
        if max_items <= 0:
            return _claim_answer(again, lease_seconds)
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(
                """UPDATE attempts t SET claimed_at = now(),
                       fencing_token = nextval('fencing_tokens'),
                       lease_expires_at = """ + _lease_base(agent_time) + """
                                          + make_interval(secs => %(lease)s)
                   FROM operations o, projects p
                   WHERE t.id IN (SELECT id FROM attempts
                                  WHERE agent_id = %(agent)s::uuid AND state = 'dispatched'
                                    AND claimed_at IS NULL
                                  ORDER BY created_at LIMIT %(max)s FOR UPDATE SKIP LOCKED)
                     AND o.id = t.operation_id AND p.id = o.project_id
                   RETURNING """ + _CLAIMED_COLUMNS,
                {"agent": agent_id, "max": max_items, "lease": lease_seconds,
                 "agent_time": agent_time})
            rows = await cur.fetchall()
        for r in rows:
            # the lease as granted (slo/invariants.py lease-granted-once judges on these)
            data: dict[str, Any] = {"fencing_token": r["fencing_token"],
                                    "lease_seconds": lease_seconds,
                                    "lease_expires_at": r["lease_expires_at"].isoformat()}
            if agent_time is not None:
                data["agent_clock_offset"] = round(agent_time - r["db_now"], 3)
            if claim_id:
                data["claim_id"] = claim_id
            await record_event(conn, r["operation_id"], attempt_id=r["attempt_id"],
                               actor=f"agent:{agent_id}", kind="claimed",
                               reason=f"attempt {r['number']} claimed", data=data)
    return _claim_answer(again + rows, lease_seconds)


def _claim_answer(rows: list[dict[str, Any]], lease_seconds: float) -> list[dict[str, Any]]:
    for r in rows:
        r["lease_seconds"] = lease_seconds
        r.pop("db_now", None)
    return rows


async def notify_claimable(conn: AsyncConnection) -> int:
    """Tell long-polling claimers which agents have work waiting; returns how many agents."""
    async with conn.cursor() as cur:
        await cur.execute("SELECT DISTINCT agent_id::text FROM attempts"
                          " WHERE state = 'dispatched' AND claimed_at IS NULL")
        ids = [r[0] for r in await cur.fetchall()]
        if ids:
            await cur.execute("SELECT pg_notify(%s, %s)", (CLAIM_CHANNEL, claimable_payload(ids)))
    return len(ids)


def claimable_payload(agent_ids: list[str]) -> str:
    return "" if len(agent_ids) > NOTIFY_MAX_AGENTS else ",".join(sorted(agent_ids))


def claimable_agents(payload: str) -> set[str] | None:
    """The agents a notification is for; None = all of them (empty or oversized payload)."""
    ids = {a.strip() for a in payload.split(",") if a.strip()}
    return ids or None


async def _fenced_attempt(conn: AsyncConnection, attempt_id: str, token: int) -> dict[str, Any]:
    """Lock the attempt and check the caller still owns it; raise StaleReport if not."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            f"SELECT {columns.of('attempts', 't')}, o.state AS op_state, o.max_retries,"
            " a.name AS agent_name, a.pool,"
            " extract(epoch FROM now() - t.created_at) AS age_seconds"
            " FROM attempts t JOIN operations o ON o.id = t.operation_id"
            " JOIN agents a ON a.id = t.agent_id WHERE t.id = %s::uuid FOR UPDATE OF t, o",
            (attempt_id,))
        row = await cur.fetchone()
    if row is None:
        raise NotFound(f"attempt {attempt_id} not found")
    if defects.enabled("fencing-off"):  # seeded defect: any holder of any token may report
        return row
    if row["fencing_token"] != token:
        raise StaleReport(
            f"fencing token {token} is stale for attempt {attempt_id} "
            f"(current {row['fencing_token']})", str(row["operation_id"]))
    if row["state"] not in ActiveAttemptStates:
        raise StaleReport(
            f"attempt {attempt_id} is {row['state']}: its lease was lost or it was ended; "
            "the report is refused", str(row["operation_id"]))
    return row


async def record_stale(conn: AsyncConnection, exc: StaleReport, attempt_id: str,
                       actor: str) -> None:
    if exc.operation_id:
        await record_event(conn, exc.operation_id, attempt_id=attempt_id, actor=actor,
                           kind="stale_report_refused", reason=str(exc))


async def attempt_heartbeat(conn: AsyncConnection, attempt_id: str, token: int,
                            progress: dict[str, Any] | None, lease_seconds: float,
                            agent_time: float | None = None) -> dict[str, Any]:
    async with conn.transaction():
        try:
            row = await _fenced_attempt(conn, attempt_id, token)
        except StaleReport:
            # a canceled attempt still owned by this token: tell the agent to stop cleanly
            async with conn.cursor(row_factory=dict_row) as cur:
                await cur.execute("SELECT state, fencing_token FROM attempts WHERE id = %s::uuid",
                                  (attempt_id,))
                r = await cur.fetchone()
            if r and r["state"] == "canceled" and r["fencing_token"] == token:
                return {"cancel": True, "lease_expires_at": None}
            raise
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(
                """UPDATE attempts SET lease_expires_at = """ + _lease_base(agent_time) + """
                                          + make_interval(secs => %(lease)s),
                       progress = coalesce(%(progress)s, progress),
                       last_progress_at = CASE WHEN %(moved)s THEN now()
                                          ELSE last_progress_at END
                   WHERE id = %(id)s RETURNING lease_expires_at""",
                {"lease": lease_seconds, "progress": Jsonb(progress) if progress else None,
                 "moved": progress is not None, "id": row["id"], "agent_time": agent_time})
            new = await cur.fetchone()
    assert new is not None
    return {"cancel": False, "lease_expires_at": new["lease_expires_at"]}


async def attempt_events(conn: AsyncConnection, attempt_id: str, token: int,
                         events: list[dict[str, Any]], actor: str) -> int:
    async with conn.transaction():
        row = await _fenced_attempt(conn, attempt_id, token)
        await _record_attempt_events(conn, row, events, actor)
    return len(events)


async def _record_attempt_events(conn: AsyncConnection, attempt: dict[str, Any],
                                 events: list[dict[str, Any]], actor: str) -> None:
    """A fenced attempt's workload events, inside the caller's transaction."""
    for ev in events:
        await record_event(conn, attempt["operation_id"], attempt_id=attempt["id"], actor=actor,
                           kind=ev["kind"], reason=ev.get("message", ""),
                           data=ev.get("data") or {})
    progress = [ev for ev in events if ev["kind"] == "progress"]
    if progress:
        await conn.execute(
            "UPDATE attempts SET last_progress_at = now(), progress = %s WHERE id = %s",
            (Jsonb(progress[-1].get("data") or {}), attempt["id"]))


async def agent_events(conn: AsyncConnection, agent_id: str, attempt_id: str,
                       events: list[dict[str, Any]], actor: str) -> int:
    """Record agent-level evidence on an attempt this agent held; no fencing (no state change)."""
    async with conn.transaction():
        cur = await conn.execute(
            "SELECT operation_id FROM attempts WHERE id = %s::uuid AND agent_id = %s::uuid",
            (attempt_id, agent_id))
        row = await cur.fetchone()
        if row is None:
            raise NotFound(f"attempt {attempt_id} not found for agent {agent_id}")
        for ev in events:
            await record_event(conn, row[0], attempt_id=attempt_id, actor=actor, kind=ev["kind"],
                               reason=ev.get("message", ""), data=ev.get("data") or {})
    return len(events)


async def report(conn: AsyncConnection, attempt_id: str, rep: dict[str, Any], actor: str,
                 *, retry_base: float = 1.0) -> dict[str, Any]:
    """Apply an agent's report. Returns ``{"operation_state": ..., "attempt_state": ...}``.

    The report's events (the attempt's last ones) are recorded first, in the same transaction:
    they land exactly when the state does, and a retried report that finds the attempt already
    ended is refused whole (stale), so they are never recorded twice."""
    async with conn.transaction():
        try:
            a = await _fenced_attempt(conn, attempt_id, rep["fencing_token"])
        except StaleReport:
            if await _already_applied(conn, attempt_id, rep):
                return {"attempt_state": rep["state"], "duplicate": True}
            raise
        if rep.get("events"):
            await _record_attempt_events(conn, a, rep["events"], actor)
        op_id = a["operation_id"]
        state = rep["state"]
        if state == "running":
            if a["state"] != "running":
                await conn.execute("UPDATE attempts SET state = 'running', started_at = now(),"
                                   " last_progress_at = now() WHERE id = %s", (a["id"],))
                await transition(conn, op_id, OpState.RUNNING, actor=actor, attempt_id=a["id"],
                                 reason=rep.get("reason") or f"attempt {a['number']} running on "
                                 f"{a['agent_name']}")
            return {"operation_state": "running", "attempt_state": "running", "pool": a["pool"],
                    "scheduling_delay": float(a["age_seconds"]) if a["state"] != "running"
                    else None}
        if state == "succeeded":
            if a["op_state"] == OpState.DISPATCHED:
                await transition(conn, op_id, OpState.RUNNING, actor=actor, attempt_id=a["id"],
                                 reason="running (implied by success report)")
            await conn.execute(
                "UPDATE attempts SET state = 'succeeded', finished_at = now(), result = %s,"
                " started_at = coalesce(started_at, now()) WHERE id = %s",
                (Jsonb(rep.get("result") or {}), a["id"]))
            await conn.execute("UPDATE agents SET consecutive_failures = 0 WHERE id = %s",
                               (a["agent_id"],))
            row = await transition(conn, op_id, OpState.SUCCEEDED, actor=actor,
                                   attempt_id=a["id"], reason=rep.get("reason") or "succeeded",
                                   result=rep.get("result") or {})
            if row is None:
                raise Conflict(f"operation {op_id} cannot succeed from {a['op_state']}")
            await wake_routing_if_queued(conn)
            return {"operation_state": "succeeded", "attempt_state": "succeeded",
                    "pool": a["pool"]}
        # failed
        error = _report_error(rep)
        await conn.execute(
            "UPDATE attempts SET state = 'failed', finished_at = now(), error = %s WHERE id = %s",
            (Jsonb(error), a["id"]))
        if error["kind"] == ErrorKind.TRANSIENT:
            await note_agent_failure(conn, a["agent_id"], op_id, a["agent_name"], actor)
        op_state = await fail_or_retry(conn, op_id, a, error, actor=actor, retry_base=retry_base)
        await wake_routing_if_queued(conn)
        return {"operation_state": op_state, "attempt_state": "failed", "pool": a["pool"],
                "reason": error_reason(error["message"]),
                "before_running": a["state"] == "dispatched"}


async def wake_routing_if_queued(conn: AsyncConnection) -> None:
    """An attempt that ended freed a slot of its agent: when work is queued (it may be waiting
    for that slot), wake the reconciler's routing pass at commit. Without it the slot stayed
    idle until the reconciler's next tick, and a saturated pool lost that much of every slot."""
    await conn.execute("SELECT pg_notify(%s, 'freed') WHERE EXISTS "
                       "(SELECT 1 FROM operations WHERE state = 'queued')", (NOTIFY_CHANNEL,))


def _report_error(rep: dict[str, Any]) -> dict[str, Any]:
    return rep.get("error") or {"kind": "transient", "message": rep.get("reason") or "failed"}


async def _already_applied(conn: AsyncConnection, attempt_id: str, rep: dict[str, Any]) -> bool:
    """Is this terminal report the one that ended the attempt (sent again after its answer was
    lost)? Same token, same state and the same result or error: a reconciler's timeout or
    another holder's report differs in at least one."""
    if rep["state"] not in ("succeeded", "failed"):
        return False
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute("SELECT state, fencing_token, result, error FROM attempts"
                          " WHERE id = %s::uuid", (attempt_id,))
        row = await cur.fetchone()
    if row is None or row["state"] != rep["state"] or row["fencing_token"] != rep["fencing_token"]:
        return False
    if rep["state"] == "succeeded":
        return row["result"] == (rep.get("result") or {})
    return row["error"] == _report_error(rep)


def error_reason(message: str) -> str:
    """Agents prefix messages with a reason code (``registry_unreachable: ...``): a bounded
    label for metrics. Anything else is ``other``."""
    head = message.split(":", 1)[0].strip()
    return head if head.replace("_", "").isalnum() and head.islower() and len(head) <= 40 \
        else "other"


async def fail_or_retry(conn: AsyncConnection, op_id: Any, attempt: dict[str, Any],
                        error: dict[str, Any], *, actor: str, retry_base: float = 1.0) -> str:
    """After an attempt ended badly: retrying with backoff, or failed keeping the first error."""
    async with conn.cursor() as cur:
        await cur.execute(
            "SELECT count(*) FROM attempts WHERE operation_id = %s AND claimed_at IS NOT NULL"
            " AND state IN ('failed', 'lost')", (op_id,))
        made = (await cur.fetchone())[0]  # type: ignore[index]
        await cur.execute("SELECT first_error, max_retries FROM operations WHERE id = %s",
                          (op_id,))
        first_error, max_retries = await cur.fetchone()  # type: ignore[misc]
    first = first_error or error
    decision = decide_retry(error_kind=error["kind"], attempts_made=max(made, 1),
                            max_retries=max_retries, base=retry_base)
    if decision.retry:
        row = await transition(
            conn, op_id, OpState.RETRYING, actor=actor, attempt_id=attempt["id"],
            reason=f"{decision.reason} in {decision.delay_seconds:.1f}s after: {error['message']}",
            next_eligible_at=await db_now(conn) + timedelta(seconds=decision.delay_seconds),
            pending_reason="backoff",
            last_error=error, first_error=first, current_attempt_id=None)
        if row is not None:
            return "retrying"
    reason = f"{decision.reason}; original error: {first['message']}"
    row = await transition(conn, op_id, OpState.FAILED, actor=actor, attempt_id=attempt["id"],
                           reason=reason, last_error=error, first_error=first)
    return "failed" if row is not None else "unchanged"



async def note_agent_failure(conn: AsyncConnection, agent_id: Any, op_id: Any, agent_name: str,
                             actor: str) -> None:
    async with conn.cursor() as cur:
        await cur.execute(
            """UPDATE agents SET consecutive_failures = consecutive_failures + 1,
                   breaker_open_until = CASE WHEN consecutive_failures + 1 >= %s
                       THEN now() + %s ELSE breaker_open_until END
               WHERE id = %s RETURNING consecutive_failures""",
            (BREAKER_THRESHOLD, BREAKER_COOLDOWN, agent_id))
        row = await cur.fetchone()
    if row and row[0] >= BREAKER_THRESHOLD:
        await record_event(conn, op_id, actor=actor, kind="circuit_opened",
                           reason=f"agent {agent_name} had {row[0]} consecutive failures; no new "
                           f"work for {int(BREAKER_COOLDOWN.total_seconds())}s",
                           data={"agent": agent_name})


async def list_agents(conn: AsyncConnection, alive_seconds: float) -> list[dict[str, Any]]:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            f"""SELECT {columns.of("agents", "a")},
                      a.last_heartbeat_at > now() - make_interval(secs => %s) AS alive,
                      CASE WHEN a.breaker_override IS NOT NULL THEN a.breaker_override = 'open'
                           ELSE coalesce(a.breaker_open_until > now(), false) END AS breaker_open
               FROM agents a ORDER BY a.name""", (alive_seconds,))
        return await cur.fetchall()


async def set_breaker(conn: AsyncConnection, name: str, state: str) -> None:
    cur = await conn.execute(
        "UPDATE agents SET breaker_override = %s,"
        " consecutive_failures = CASE WHEN %s = 'closed' THEN 0 ELSE consecutive_failures END,"
        " breaker_open_until = CASE WHEN %s = 'closed' THEN NULL ELSE breaker_open_until END"
        " WHERE name = %s", (state, state, state, name))
    if cur.rowcount == 0:
        raise NotFound(f"agent {name} not found")
    await conn.execute("SELECT pg_notify(%s, 'breaker')", (NOTIFY_CHANNEL,))
