"""The reconciler's passes: admit and route waiting work, expire leases, wake retries,
enforce timeouts, and read the gauges. Each pass is one transaction and safe to run from two
reconcilers at once (row locks with SKIP LOCKED, guarded transitions, one advisory lock for
routing so capacity is never double-booked)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from psycopg import AsyncConnection, sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from controlplane import defects, release, routing
from controlplane.routing import Destination, Outcome, Requirement
from controlplane.states import ActiveAttemptStates, OpState
from controlplane.store import Conflict, NotFound, columns
from controlplane.store.agents import fail_or_retry, note_agent_failure
from controlplane.store.operations import NOTIFY_CHANNEL, get
from controlplane.store.transitions import block_many, db_now, record_event, transition

SCHEDULER_LOCK = 7_301_002
ACTOR = "reconciler"


@dataclass
class PassStats:
    dispatched: list[float] = field(default_factory=list)  # queue wait (s) of each dispatch
    blocked: int = 0
    waiting: int = 0
    expired: int = 0
    retried: int = 0
    rerouted: int = 0
    failed: int = 0
    timed_out: int = 0
    requeued: int = 0
    swept: int = 0  # blocked operations read again by the sweep (their routing changed)
    lost_pools: list[str] = field(default_factory=list)  # pool of each lost claimed attempt


def requirement(spec: dict[str, Any]) -> Requirement:
    """What ``spec`` needs of a destination. Reads only resources, placement and the workload's
    image: routing reads just those of a waiting operation's spec (_ROUTED_SPEC below)."""
    res = spec.get("resources") or {}
    acc = res.get("accelerator") or None
    pl = spec.get("placement") or {}
    return Requirement(
        cpu=int(res.get("cpu", 1)),
        accelerator_type=acc["type"] if acc else None,
        accelerator_count=int(acc["count"]) if acc else 0,
        regions=tuple(pl["regions"]) if pl.get("regions") else None,
        dataset=pl.get("dataset"),
        registry=routing.image_registry(spec["workload"]["image"]),
    )


async def destinations(conn: AsyncConnection, alive_seconds: float) -> dict[str, Destination]:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            f"""SELECT {columns.of("agents", "a")},
                      a.last_heartbeat_at > now() - make_interval(secs => %(alive)s) AS alive,
                      CASE WHEN a.breaker_override IS NOT NULL THEN a.breaker_override = 'open'
                           ELSE coalesce(a.breaker_open_until > now(), false) END AS breaker_open,
                      coalesce(u.cpu, 0) AS used_cpu, coalesce(u.acc, 0) AS used_acc,
                      coalesce(u.waiting, 0) AS waiting
               FROM agents a LEFT JOIN (
                   SELECT t.agent_id,
                          sum(coalesce((o.spec->'resources'->>'cpu')::int, 1)) AS cpu,
                          sum(coalesce((o.spec->'resources'->'accelerator'->>'count')::int, 0)) AS acc,
                          count(*) FILTER (WHERE t.state = 'dispatched') AS waiting
                   FROM attempts t JOIN operations o ON o.id = t.operation_id
                   WHERE t.state = ANY(%(active)s) GROUP BY t.agent_id) u ON u.agent_id = a.id""",
            {"alive": alive_seconds, "active": ActiveAttemptStates})
        rows = await cur.fetchall()
    ignore_liveness = defects.enabled("liveness-ignored")  # seeded defect: test only
    return {
        r["name"]: Destination(
            agent_id=str(r["id"]), name=r["name"], pool=r["pool"], zone=r["zone"],
            region=r["region"], cpu_slots=r["cpu_slots"], accelerator_type=r["accelerator_type"],
            accelerator_count=r["accelerator_count"], datasets=tuple(r["datasets"]),
            registries=tuple(r["registries"]), alive=r["alive"] or ignore_liveness,
            breaker_open=r["breaker_open"],
            used_cpu=int(r["used_cpu"]), used_accelerators=int(r["used_acc"]),
            waiting=int(r["waiting"]), recent_failures=r["consecutive_failures"])
        for r in rows
    }


def _room(dests: dict[str, Destination]) -> bool:
    """Whether any destination could take an operation now (models.Resources, routing.route):
    every operation needs a cpu slot on a destination that is up and not in a reserved pool
    (which never runs work: a control-plane node's slots are always free), and an accelerator
    destination takes only work that needs one of its accelerators."""
    return any(d.alive and not d.breaker_open and d.free_cpu >= 1
               and d.pool not in routing.RESERVED_POOLS
               and (d.accelerator_count == 0 or d.free_accelerators >= 1)
               for d in dests.values())


def fleet_fingerprint(dests: dict[str, Destination]) -> tuple[tuple[str, bool, bool], ...]:
    """What blocked work's eligibility depends on: which agents exist, are up, and are open."""
    return tuple(sorted((d.name, d.alive, d.breaker_open) for d in dests.values()))


# position of the last blocked operation a sweep looked at, in routing order:
# (-queue priority, -operation priority, created_at, id)
Cursor = tuple[Any, Any, Any, Any]


# What routing reads of each waiting operation (_place, _wait, the blocked sweep's cursor),
# and of its spec only the part `requirement` reads, built by PostgreSQL (blocked work is also
# grouped by it). The whole row (every column; the spec, errors and result as JSON) cost the
# reconciler a JSON parse of each (docs/performance.md, 2026-12-07).
_ROUTED = ("id", "queue", "priority", "state", "state_reason", "pending_reason",
           "attempt_count", "pinned_agent", "created_at")
_ROUTED_SPEC = ("jsonb_build_object('resources', o.spec->'resources', 'placement',"
                " o.spec->'placement', 'workload', jsonb_build_object('image',"
                " o.spec->'workload'->'image'))")


def _routed_columns() -> str:
    return columns.some("operations", _ROUTED, "o")


async def _changed_groups(c: Any, routed: list[str], dests: dict[str, Destination],
                          limits: dict[str, int], active: dict[str, int], stats: PassStats,
                          ) -> list[tuple[str, Any, str | None, str | None]]:
    """The groups of blocked work (queue, the spec's routed part, pinned agent, stated reason)
    whose routing would change now; the others' operations are counted, never read.

    An operation's routing decision depends on nothing else of it (`_place`: its queue's
    concurrency, then `routing.route` of its requirement and pinned agent), and a decision that
    stays "blocked" does not depend on the capacity booked during the pass. So a group routed
    once stands for all its operations. Reading and locking every blocked operation on each
    sweep instead sorted the whole backlog once per batch of 500: with 43,000 blocked, the
    sweep never finished within its 10 s recheck and kept PostgreSQL at 90 % of a core while
    nothing was submitted (docs/performance.md, 2026-12-07)."""
    await c.execute(
        f"""SELECT o.queue, {_ROUTED_SPEC} AS spec, o.pinned_agent, o.state_reason,
                  count(*) AS n
           FROM operations o
           WHERE o.state = 'blocked' AND o.queue = ANY(%s)
           GROUP BY 1, 2, 3, 4""", (routed,))
    changed = []
    every = defects.enabled("zone-sticky-retry")  # per-operation candidates: route each one
    for g in await c.fetchall():
        queue = g["queue"]
        if not every and active.get(queue, 0) < limits.get(queue, 1):
            decision = routing.route(requirement(g["spec"]), list(dests.values()),
                                     pinned=g["pinned_agent"])
            if decision.outcome is Outcome.BLOCKED and decision.reason == g["state_reason"]:
                stats.blocked += g["n"]  # as if each had been routed again: still blocked
                continue
        changed.append((queue, g["spec"], g["pinned_agent"], g["state_reason"]))
    return changed


async def schedule(conn: AsyncConnection, *, alive_seconds: float, lease_seconds: float,
                   batch: int = 500, last_fleet: tuple | None = None,
                   blocked_after: Cursor | None = None,
                   ) -> tuple[PassStats, tuple, Cursor | None]:
    """Route accepted and queued work first, in priority order. Blocked work is swept again
    (in batches, oldest first, resuming at ``blocked_after``) only while the fleet changed
    since ``last_fleet`` (agents came or went, a breaker flipped): re-routing thousands of
    blocked operations on every pass would starve new work. A held queue (concurrency 0,
    controlplane/store/queues.py) is never read: its work stays accepted, at no routing cost.

    Returns the stats, the fleet seen, and where the blocked sweep should resume (None when
    it is complete)."""
    stats = PassStats()
    async with conn.transaction():
        cur = await conn.execute("SELECT pg_try_advisory_xact_lock(%s)", (SCHEDULER_LOCK,))
        if not (await cur.fetchone())[0]:  # type: ignore[index]
            return stats, last_fleet or (), blocked_after  # the other reconciler is routing
        dests = await destinations(conn, alive_seconds)
        fleet = fleet_fingerprint(dests)
        if fleet != last_fleet:
            sweep, after = True, None  # eligibility may have changed for every blocked op
        else:
            sweep, after = blocked_after is not None, blocked_after
        # With no free slot on any destination that is up, nothing can be dispatched, and a
        # queued operation would only be routed again to the same wait: read just the new
        # (accepted) work then. Re-reading the whole backlog on every wake-up cost 40 ms per
        # pass at 500 queued, so a backlog made every operation dearer (docs/performance.md).
        # Only while the fleet is the one the last pass saw: a change may block queued work
        # (and the reconciler forgets the fleet every blocked_recheck_seconds, so a queued
        # operation's stated reason is never older than that).
        same_fleet = fleet == last_fleet
        # literal states, not a parameter: the planner can then use the partial index
        # operations_waiting, whose predicate it must prove from the query text
        wanted = ("o.state = 'accepted'" if same_fleet and not _room(dests)
                  else "o.state IN ('accepted', 'queued')")
        async with conn.cursor(row_factory=dict_row) as c:
            await c.execute("SELECT name, concurrency FROM queues")
            limits = {r["name"]: r["concurrency"] for r in await c.fetchall()}
            # a held queue's work is never read: by name, so that the planner reads the
            # waiting work of the other queues only (index operations_waiting_queue)
            routed = [name for name, n in limits.items() if n > 0]
            await c.execute("SELECT queue, count(*) AS n FROM operations"
                            " WHERE state IN ('dispatched', 'running') GROUP BY queue")
            active = {r["queue"]: r["n"] for r in await c.fetchall()}
            await c.execute(
                f"""SELECT {_routed_columns()}, {_ROUTED_SPEC} AS spec,
                          extract(epoch FROM now() - o.waiting_since) AS waited
                   FROM operations o JOIN queues q ON q.name = o.queue
                   WHERE {wanted} AND o.queue = ANY(%s)
                   ORDER BY q.priority DESC, o.priority DESC, o.created_at
                   LIMIT %s FOR UPDATE OF o SKIP LOCKED""", (routed, batch))
            ops = await c.fetchall()
            blocked: list[dict[str, Any]] = []
            if sweep and not defects.enabled("blocked-never-drain"):  # seeded defect: test only
                changed = await _changed_groups(c, routed, dests, limits, active, stats)
                if changed:
                    # same order as routing (priorities first), resumable at the cursor; only
                    # the operations of groups whose routing would change
                    await c.execute(
                        f"""SELECT {_routed_columns()}, {_ROUTED_SPEC} AS spec,
                                  extract(epoch FROM now() - o.waiting_since) AS waited,
                                  -q.priority AS nq, -o.priority AS no
                           FROM operations o JOIN queues q ON q.name = o.queue
                           WHERE o.state = 'blocked' AND o.queue = ANY(%(routed)s)
                             AND (%(started)s::boolean IS NOT TRUE
                                  OR (-q.priority, -o.priority, o.created_at, o.id)
                                     > (%(nq)s::int, %(no)s::int, %(ts)s::timestamptz,
                                        %(id)s::uuid))
                             AND EXISTS (
                                 SELECT 1 FROM unnest(%(g_queue)s::text[], %(g_spec)s::jsonb[],
                                                      %(g_pinned)s::text[], %(g_reason)s::text[])
                                     AS g(queue, spec, pinned, reason)
                                 WHERE g.queue = o.queue AND g.spec = {_ROUTED_SPEC}
                                   AND g.pinned IS NOT DISTINCT FROM o.pinned_agent
                                   AND g.reason IS NOT DISTINCT FROM o.state_reason)
                           ORDER BY -q.priority, -o.priority, o.created_at, o.id
                           LIMIT %(n)s FOR UPDATE OF o SKIP LOCKED""",
                        {"started": after is not None, "nq": after[0] if after else None,
                         "no": after[1] if after else None, "ts": after[2] if after else None,
                         "id": after[3] if after else None, "n": batch, "routed": routed,
                         "g_queue": [g[0] for g in changed],
                         "g_spec": [Jsonb(g[1]) for g in changed],
                         "g_pinned": [g[2] for g in changed], "g_reason": [g[3] for g in changed]})
                    blocked = await c.fetchall()
                    stats.swept += len(blocked)
        to_block: list[tuple[Any, str, str, dict[str, Any]]] = []
        for op in [*ops, *blocked]:
            if op["state"] == OpState.QUEUED and same_fleet and not _room(dests):
                stats.waiting += 1  # as above: the fleet filled up during this pass
                continue
            await _place(conn, op, dests, limits, active, stats, lease_seconds, to_block)
        # one statement for all that became blocked in this pass (nothing else in the pass
        # reads them again: a blocked operation books no capacity)
        await block_many(conn, to_block, actor=ACTOR)
    last = blocked[-1] if len(blocked) >= batch else None
    resume = (last["nq"], last["no"], last["created_at"], last["id"]) if last else None
    return stats, fleet, resume


async def _place(conn: AsyncConnection, op: dict[str, Any], dests: dict[str, Destination],
                 limits: dict[str, int], active: dict[str, int], stats: PassStats,
                 lease_seconds: float,
                 to_block: list[tuple[Any, str, str, dict[str, Any]]]) -> None:
    """Route one operation; one that newly becomes blocked is appended to ``to_block`` (the
    caller moves them all in one statement, `block_many`)."""
    state = OpState(op["state"])
    queue = op["queue"]
    if active.get(queue, 0) >= limits.get(queue, 1):
        await _wait(conn, op, "queue_concurrency",
                    f"queue {queue} is at its concurrency limit ({limits.get(queue)})")
        stats.waiting += 1
        return
    candidates = list(dests.values())
    if op["attempt_count"] and defects.enabled("zone-sticky-retry"):  # seeded defect: test only
        # "keep a retry near its checkpoints": only the zone of the previous attempt
        cur = await conn.execute(
            "SELECT a.zone FROM attempts t JOIN agents a ON a.id = t.agent_id"
            " WHERE t.operation_id = %s ORDER BY t.number DESC LIMIT 1", (op["id"],))
        last = await cur.fetchone()
        if last is not None:
            candidates = [d for d in candidates if d.zone == last[0]]
    decision = routing.route(requirement(op["spec"]), candidates, pinned=op["pinned_agent"])
    if decision.outcome is Outcome.BLOCKED:
        stats.blocked += 1
        if state is not OpState.BLOCKED:
            to_block.append((op["id"], decision.reason,
                             decision.pending_reason.value,  # type: ignore[union-attr]
                             {"rejected": decision.rejected}))
        elif op["state_reason"] != decision.reason:
            await conn.execute(
                sql.SQL("UPDATE operations SET state_reason = %s, {} = %s WHERE id = %s").format(
                    sql.Identifier(release.wait_reason_column())),
                (decision.reason, decision.pending_reason.value, op["id"]))  # type: ignore[union-attr]
        return
    if decision.outcome is Outcome.WAIT:
        stats.waiting += 1
        await _wait(conn, op, decision.pending_reason.value, decision.reason)  # type: ignore[union-attr]
        return
    dest = decision.destination
    assert dest is not None
    if state is not OpState.QUEUED:
        await transition(conn, op["id"], OpState.QUEUED, actor=ACTOR,
                         reason="admitted: eligible destination available")
    number = op["attempt_count"] + 1
    async with conn.cursor() as cur:
        await cur.execute(
            """INSERT INTO attempts (operation_id, number, agent_id, state, lease_expires_at)
               VALUES (%s, %s, %s, 'dispatched', now() + make_interval(secs => %s))
               RETURNING id""", (op["id"], number, dest.agent_id, lease_seconds))
        attempt_id = (await cur.fetchone())[0]  # type: ignore[index]
    await transition(conn, op["id"], OpState.DISPATCHED, actor=ACTOR, attempt_id=attempt_id,
                     reason=decision.reason, current_attempt_id=attempt_id,
                     attempt_count=number,
                     data={"agent": dest.name, "pool": dest.pool, "zone": dest.zone,
                           "region": dest.region, "rejected": decision.rejected})
    dests[dest.name] = _book(dest, requirement(op["spec"]))
    active[queue] = active.get(queue, 0) + 1
    stats.dispatched.append(float(op["waited"]))


def _book(dest: Destination, req: Requirement) -> Destination:
    from dataclasses import replace

    return replace(dest, used_cpu=dest.used_cpu + req.cpu,
                   used_accelerators=dest.used_accelerators + req.accelerator_count,
                   waiting=dest.waiting + 1)


async def _wait(conn: AsyncConnection, op: dict[str, Any], pending: str, reason: str) -> None:
    if op["state"] != OpState.QUEUED:
        await transition(conn, op["id"], OpState.QUEUED, actor=ACTOR, reason=reason,
                         pending_reason=pending)
    elif release.wait_reason(op) != pending or op["state_reason"] != reason:
        await conn.execute(
            sql.SQL("UPDATE operations SET {} = %s, state_reason = %s WHERE id = %s").format(
                sql.Identifier(release.wait_reason_column())),
            (pending, reason, op["id"]))


async def expire_leases(conn: AsyncConnection, *, retry_base: float = 1.0,
                        batch: int = 100) -> PassStats:
    """Attempts whose lease ran out: never claimed -> reroute; claimed -> retry or fail."""
    stats = PassStats()
    async with conn.transaction():
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(
                f"""SELECT {columns.of("attempts", "t")}, a.name AS agent_name, a.pool,
                          a.last_heartbeat_at
                   FROM attempts t JOIN operations o ON o.id = t.operation_id
                   JOIN agents a ON a.id = t.agent_id
                   WHERE t.state = ANY(%s) AND t.lease_expires_at < now()
                   ORDER BY t.lease_expires_at LIMIT %s FOR UPDATE OF t, o SKIP LOCKED""",
                (ActiveAttemptStates, batch))
            expired = await cur.fetchall()
        for t in expired:
            stats.expired += 1
            msg = (f"lease of attempt {t['number']} expired on agent {t['agent_name']} "
                   f"(last agent heartbeat {t['last_heartbeat_at'].isoformat()})")
            error = {"kind": "transient", "message": msg}
            from psycopg.types.json import Jsonb

            await conn.execute(
                "UPDATE attempts SET state = 'lost', finished_at = now(), error = %s"
                " WHERE id = %s", (Jsonb(error), t["id"]))
            await record_event(conn, t["operation_id"], attempt_id=t["id"], actor=ACTOR,
                               kind="lease_expired", reason=msg,
                               data={"agent": t["agent_name"], "fencing_token": t["fencing_token"]})
            await note_agent_failure(conn, t["agent_id"], t["operation_id"], t["agent_name"], ACTOR)
            if t["claimed_at"] is None:
                row = await transition(
                    conn, t["operation_id"], OpState.QUEUED, actor=ACTOR, attempt_id=t["id"],
                    kind="rerouted", reason=f"reroute: agent {t['agent_name']} did not claim "
                    f"attempt {t['number']} before its lease expired", current_attempt_id=None)
                stats.rerouted += row is not None
                continue
            stats.lost_pools.append(t["pool"])
            outcome = await fail_or_retry(conn, t["operation_id"], t, error, actor=ACTOR,
                                          retry_base=retry_base)
            stats.retried += outcome == "retrying"
            stats.failed += outcome == "failed"
    return stats


async def wake_retries(conn: AsyncConnection, batch: int = 200) -> int:
    n = 0
    async with conn.transaction():
        async with conn.cursor() as cur:
            await cur.execute(
                "SELECT id FROM operations WHERE state = 'retrying' AND next_eligible_at <= now()"
                " ORDER BY next_eligible_at LIMIT %s FOR UPDATE SKIP LOCKED", (batch,))
            ids = [r[0] for r in await cur.fetchall()]
        for op_id in ids:
            row = await transition(conn, op_id, OpState.QUEUED, actor=ACTOR,
                                   reason="backoff elapsed: queued for a new attempt",
                                   waiting_since=await db_now(conn), next_eligible_at=None)
            n += row is not None
    return n


async def enforce_timeouts(conn: AsyncConnection, batch: int = 100) -> int:
    n = 0
    async with conn.transaction():
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(
                """SELECT t.id, t.operation_id, o.timeout_seconds FROM attempts t
                   JOIN operations o ON o.id = t.operation_id
                   WHERE t.state = 'running'
                     AND t.started_at + make_interval(secs => o.timeout_seconds) < now()
                   LIMIT %s FOR UPDATE OF t, o SKIP LOCKED""", (batch,))
            rows = await cur.fetchall()
        from psycopg.types.json import Jsonb

        for r in rows:
            error = {"kind": "deterministic",
                     "message": f"timeout: running longer than {r['timeout_seconds']}s"}
            await conn.execute("UPDATE attempts SET state = 'failed', finished_at = now(),"
                               " error = %s WHERE id = %s", (Jsonb(error), r["id"]))
            row = await transition(conn, r["operation_id"], OpState.FAILED, actor=ACTOR,
                                   attempt_id=r["id"], reason=error["message"],
                                   last_error=error, first_error=error)
            n += row is not None
    return n


async def pin_route(conn: AsyncConnection, op_id: str, agent: str, *, actor: str,
                    alive_seconds: float) -> dict[str, Any]:
    """Operator override: pin an operation to one agent. Hard eligibility still applies."""
    async with conn.transaction():
        op = await get(conn, op_id, None)
        dests = await destinations(conn, alive_seconds)
        if agent not in dests:
            raise NotFound(f"agent {agent} not found")
        why = routing.ineligibility(requirement(op["spec"]), dests[agent])
        if why is not None:
            raise Conflict(f"agent {agent} is not eligible for operation {op_id}: {why}")
        if op["state"] not in (OpState.ACCEPTED, OpState.QUEUED, OpState.BLOCKED,
                               OpState.RETRYING):
            raise Conflict(f"operation {op_id} is {op['state']}; only waiting work can be routed")
        await conn.execute("UPDATE operations SET pinned_agent = %s, updated_at = now()"
                           " WHERE id = %s", (agent, op["id"]))
        await record_event(conn, op["id"], actor=actor, kind="route_override",
                           reason=f"operator pinned to {agent}", data={"agent": agent})
        await conn.execute("SELECT pg_notify(%s, 'route')", (NOTIFY_CHANNEL,))
    return await get(conn, op_id, None)


async def open_work(conn: AsyncConnection) -> bool:
    """Whether anything a timed pass acts on exists: waiting or retrying operations, active
    attempts (leases, timeouts) or running pipelines. Each test is one partial index probe."""
    cur = await conn.execute(
        "SELECT EXISTS (SELECT 1 FROM operations"
        "               WHERE state IN ('accepted', 'queued', 'blocked', 'retrying'))"
        "    OR EXISTS (SELECT 1 FROM attempts WHERE state IN ('dispatched', 'running'))"
        "    OR EXISTS (SELECT 1 FROM pipelines WHERE state = 'running')")
    row = await cur.fetchone()
    return bool(row and row[0])


async def gauges(conn: AsyncConnection, progress_stale_seconds: float, *,
                 finished: bool = True) -> dict[str, Any]:
    """The reconciler's gauges. ``states`` counts the open states (each read is as large as
    the work in that state, through the partial indexes) and, only when ``finished``, the
    finished states too: that count reads every finished operation ever kept, so the
    reconciler asks for it less often (ReconcilerSettings.finished_gauge_interval)."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute("SELECT state, count(*) AS n FROM operations"
                          " WHERE state IN ('dispatched', 'running') GROUP BY state")
        active = {r["state"]: r["n"] for r in await cur.fetchall()}
        if finished:
            await cur.execute("SELECT state, count(*) AS n FROM operations"
                              " WHERE state IN ('canceled', 'succeeded', 'failed') GROUP BY state")
            active.update({r["state"]: r["n"] for r in await cur.fetchall()})
        await cur.execute(
            "SELECT count(*) AS n FROM attempts WHERE state = 'running'"
            " AND coalesce(last_progress_at, started_at) < now() - make_interval(secs => %s)",
            (progress_stale_seconds,))
        stale = (await cur.fetchone())["n"]  # type: ignore[index]
        await cur.execute("SELECT extract(epoch FROM now())::float8 AS t")
        db_time = (await cur.fetchone())["t"]  # type: ignore[index]
        # the waiting work's age per queue and count per (queue, wait reason) from one read
        # of it: three reads (the states' count, the ages, the reasons) cost PostgreSQL 6 % of
        # a core at 50,000 blocked operations, every gauge_interval (docs/performance.md)
        await cur.execute(sql.SQL(
            "SELECT queue, state, coalesce({col}, 'none') AS reason, count(*) AS n,"
            " extract(epoch FROM now() - min(waiting_since)) AS age FROM operations"
            " WHERE state IN ('accepted', 'queued', 'blocked', 'retrying')"
            " GROUP BY queue, state, {col}").format(
                col=sql.Identifier(release.wait_reason_column())))
        waiting = await cur.fetchall()
        # a held queue's work is not eligible (held on purpose): no age of its own
        await cur.execute("SELECT name FROM queues WHERE concurrency > 0")
        eligible = [r["name"] for r in await cur.fetchall()]
    states = {**_sums(waiting, "state"), **active}
    pending = [(q, r, n) for (q, r), n in _sums(waiting, "queue", "reason").items()]
    ages: dict[str, float] = {}
    for r in waiting:  # retrying work waits for its backoff, not for a destination
        if r["state"] != "retrying":
            ages[r["queue"]] = max(ages.get(r["queue"], float(r["age"])), float(r["age"]))
    return {"states": states, "queue_age": {q: ages.get(q, 0.0) for q in eligible},
            "pending": pending, "progress_stale": stale, "db_time": db_time}


def _sums(rows: list[dict[str, Any]], *key: str) -> dict[Any, int]:
    out: dict[Any, int] = {}
    for r in rows:
        k = r[key[0]] if len(key) == 1 else tuple(r[c] for c in key)
        out[k] = out.get(k, 0) + r["n"]
    return out

