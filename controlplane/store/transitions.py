"""The one way an operation changes state: a guarded UPDATE plus its event, in one statement."""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection, sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from controlplane import release
from controlplane.states import OpState, sources_of
from controlplane.store import columns

# Columns a transition may set besides state/state_reason (kept explicit: no SQL from input).
SETTABLE = frozenset({
    "pending_reason", "current_attempt_id", "next_eligible_at", "waiting_since", "last_error",
    "first_error", "result", "attempt_count", "pinned_agent",
})


async def transition(
    conn: AsyncConnection, op_id: Any, dst: OpState, *, actor: str, reason: str,
    attempt_id: Any = None, data: dict[str, Any] | None = None, kind: str = "transition",
    **sets: Any,
) -> dict[str, Any] | None:
    """Move ``op_id`` to ``dst`` if the state machine allows it from its current state.

    Returns the updated row (with ``from_state``), or None when the move is illegal from the
    current state (or the operation does not exist). The guard is in the UPDATE, so concurrent
    writers (two reconcilers, an agent and a cancel) cannot both win.
    """
    unknown = set(sets) - SETTABLE
    if unknown:
        raise ValueError(f"not settable in a transition: {sorted(unknown)}")
    assignments = [sql.SQL("state = %(dst)s"), sql.SQL("state_reason = %(reason)s"),
                   sql.SQL("updated_at = now()")]
    params: dict[str, Any] = {
        "dst": dst.value, "reason": reason, "id": op_id, "src": sources_of(dst),
        "actor": actor, "attempt_id": attempt_id, "kind": kind,
        "data": Jsonb(data) if data is not None else None,
    }
    wait_col = release.wait_reason_column()  # pending_reason is renamed in N+1
    for col, value in sets.items():
        if isinstance(value, dict):
            value = Jsonb(value)
        name = wait_col if col == "pending_reason" else col
        assignments.append(sql.SQL("{} = {}").format(sql.Identifier(name), sql.Placeholder(col)))
        params[col] = value
    if dst in (OpState.QUEUED, OpState.SUCCEEDED, OpState.FAILED, OpState.CANCELED,
               OpState.RUNNING, OpState.DISPATCHED) and "pending_reason" not in sets:
        assignments.append(sql.SQL("{} = NULL").format(sql.Identifier(wait_col)))
    query = sql.SQL("""
        WITH t AS (
            UPDATE operations o SET {assignments}
            FROM operations prev
            WHERE o.id = prev.id AND o.id = %(id)s AND o.state = ANY(%(src)s)
            RETURNING prev.state AS from_state, {o_ops}
        ), e AS (
            INSERT INTO events (operation_id, attempt_id, actor, kind, from_state, to_state,
                                reason, data)
            SELECT id, %(attempt_id)s, %(actor)s, %(kind)s, from_state, %(dst)s, %(reason)s,
                   %(data)s
            FROM t
        )
        SELECT from_state, {ops} FROM t
    """).format(assignments=sql.SQL(", ").join(assignments),
               o_ops=sql.SQL(columns.of("operations", "o")), ops=sql.SQL(columns.of("operations")))
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query, params)
        return await cur.fetchone()


async def record_event(
    conn: AsyncConnection, op_id: Any, *, actor: str, kind: str, reason: str = "",
    attempt_id: Any = None, data: dict[str, Any] | None = None,
) -> None:
    await conn.execute(
        "INSERT INTO events (operation_id, attempt_id, actor, kind, reason, data)"
        " VALUES (%s, %s, %s, %s, %s, %s)",
        (op_id, attempt_id, actor, kind, reason, Jsonb(data) if data is not None else None),
    )


async def db_now(conn: AsyncConnection) -> Any:
    """The database's ``now()`` (the transaction's start): the clock every stored instant that
    is compared with ``now()`` must come from. A process's own clock may be stepped (clock
    skew): a backoff computed from it would end early or late by the step
    (controlplane/clock.py)."""
    cur = await conn.execute("SELECT now()")
    return (await cur.fetchone())[0]  # type: ignore[index]


async def block_many(conn: AsyncConnection, items: list[tuple[Any, str, str, dict[str, Any]]],
                     *, actor: str) -> int:
    """Move each (op_id, reason, pending_reason, data) to ``blocked``, as `transition` would one
    by one (same guard, same columns, one event each), in one statement: routing a group of
    submissions that no destination can take cost a statement per operation, the reconciler's
    largest share of a submission's CPU (docs/performance.md). Returns how many moved."""
    if not items:
        return 0
    query = sql.SQL("""
        WITH v AS (
            -- binary parameters: a text array is dumped by escaping every element with a
            -- regular expression (store/submissions.py), most of this statement's CPU
            SELECT * FROM unnest(%(id)b::uuid[], %(reason)b::text[], %(pending)b::text[],
                                 %(data)b::jsonb[]) AS v(id, reason, pending, data)
        ), t AS (
            UPDATE operations o SET state = %(dst)s, state_reason = v.reason,
                   updated_at = now(), {wait} = v.pending
            FROM operations prev, v
            WHERE o.id = prev.id AND o.id = v.id AND o.state = ANY(%(src)s)
            RETURNING o.id, prev.state AS from_state, v.reason, v.data
        ), e AS (
            INSERT INTO events (operation_id, attempt_id, actor, kind, from_state, to_state,
                                reason, data)
            SELECT id, NULL, %(actor)s, 'transition', from_state, %(dst)s, reason, data FROM t
        )
        SELECT count(*) FROM t
    """).format(wait=sql.Identifier(release.wait_reason_column()))
    params = {"id": [i[0] for i in items], "reason": [i[1] for i in items],
              "pending": [i[2] for i in items], "data": [Jsonb(i[3]) for i in items],
              "dst": OpState.BLOCKED.value, "src": sources_of(OpState.BLOCKED), "actor": actor}
    cur = await conn.execute(query, params)
    return (await cur.fetchone())[0]  # type: ignore[index]
