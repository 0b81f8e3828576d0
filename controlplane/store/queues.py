"""Held queues: a queue whose concurrency is 0 holds its work. Submissions to it are accepted
and stored like any other (committed before they are acknowledged), but the scheduler never
reads them (controlplane/store/scheduling.py), so they cost the API and the database their
insert and nothing else: no routing pass, no agent, no queue age (they are not eligible work).
An operator releases them by giving the queue a concurrency, or cancels them in bulk here.

The harness submits its cheap probes there (the durability stream, the overload load): many
acknowledged submissions that need no agent, so that a durability audit has the events to
demonstrate its objective without the agents' capacity limiting it."""

from __future__ import annotations

from psycopg import AsyncConnection, sql

from controlplane import release
from controlplane.states import OpState, sources_of
from controlplane.store import Conflict, NotFound

# the held queue the local environment seeds (environments/local/topology.py)
HELD_QUEUE = "held"
# states a held operation can be in: accepted (never read by the scheduler), or queued/blocked
# if the queue was held after they were routed; never a live attempt
WAITING = ("accepted", "queued", "blocked", "retrying")


async def cancel_held(conn: AsyncConnection, queue: str, *, actor: str, reason: str,
                      limit: int = 10_000) -> int:
    """Cancel up to ``limit`` waiting operations of the held queue ``queue`` (oldest first),
    each with its transition event, in one statement; the number canceled. A queue that is
    not held is refused (Conflict): its work may be routed at any moment, and cancelling it
    in bulk is not what this is for."""
    async with conn.transaction():
        # the queue row locked: nobody releases the queue while its work is being canceled
        cur = await conn.execute("SELECT concurrency FROM queues WHERE name = %s FOR SHARE",
                                 (queue,))
        row = await cur.fetchone()
        if row is None:
            raise NotFound(f"queue {queue!r} does not exist")
        if int(row[0]) != 0:
            raise Conflict(f"queue {queue!r} is not held (concurrency {row[0]}): only a held "
                           "queue's work is canceled in bulk")
        src = [s for s in sources_of(OpState.CANCELED) if s in WAITING]
        query = sql.SQL("""
            WITH picked AS (
                SELECT id FROM operations WHERE queue = %(queue)s AND state = ANY(%(src)s)
                ORDER BY created_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED
            ), t AS (
                UPDATE operations o SET state = 'canceled', state_reason = %(reason)s,
                       updated_at = now(), {wait_col} = NULL
                FROM operations prev
                WHERE o.id = prev.id AND o.id IN (SELECT id FROM picked)
                  AND o.state = ANY(%(src)s)
                RETURNING o.id, prev.state AS from_state
            ), e AS (
                INSERT INTO events (operation_id, actor, kind, from_state, to_state, reason)
                SELECT id, %(actor)s, 'transition', from_state, 'canceled', %(reason)s FROM t
            )
            SELECT count(*) FROM t
        """).format(wait_col=sql.Identifier(release.wait_reason_column()))
        cur = await conn.execute(query, {"queue": queue, "src": src, "limit": limit,
                                         "reason": reason, "actor": actor})
        return int((await cur.fetchone())[0])  # type: ignore[index]
