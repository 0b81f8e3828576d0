"""Group commit keeps each submission's own answer: created, duplicate, 409 or unknown queue,
exactly as one by one, per project; and the API's grouping never leaves a request unanswered."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from controlplane.api.group_commit import GroupCommit
from controlplane.store import Conflict, InvalidReference, StoreUnavailable, auth
from controlplane.store.submissions import SubmitItem, SubmitResult, submit_many


def _seed(dsn: str) -> tuple[str, str]:
    with psycopg.connect(dsn) as conn:
        auth.seed(conn, {"projects": [{"name": "p", "token": "t" * 20},
                                      {"name": "q", "token": "u" * 20}],
                         "queues": [{"name": "default"}]})
        ids = dict(conn.execute("SELECT name, id::text FROM projects").fetchall())
        return ids["p"], ids["q"]


def _spec(name: str, queue: str = "default") -> dict[str, Any]:
    return {"name": name, "queue": queue, "priority": 0, "max_retries": 1,
            "timeout_seconds": 10, "workload": {"image": "a:1"}}


def _group(dsn: str, items: list[SubmitItem]) -> list[SubmitResult | Exception]:
    async def run() -> list[SubmitResult | Exception]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            return await submit_many(conn, items)
    return asyncio.run(run())


def test_one_group_answers_each_item_as_one_by_one(pg_dsn: str) -> None:
    p, q = _seed(pg_dsn)
    [before] = _group(pg_dsn, [SubmitItem(p, "old", _spec("old"), "user:p")])
    assert isinstance(before, SubmitResult) and before.created
    out = _group(pg_dsn, [
        SubmitItem(p, "a", _spec("a"), "user:p"),
        SubmitItem(p, "a", _spec("a"), "user:p"),        # same key, same payload: duplicate
        SubmitItem(p, "a", _spec("other"), "user:p"),    # same key, other payload: 409
        SubmitItem(q, "a", _spec("a"), "user:q"),        # same key in another project: its own
        SubmitItem(p, "old", _spec("old"), "user:p"),    # committed by an earlier group
        SubmitItem(p, "old", _spec("changed"), "user:p"),
    ])
    # an unknown queue fails its statement: the group is redone one by one, only it fails
    bad, b, b2 = _group(pg_dsn, [
        SubmitItem(p, "bad", _spec("bad", queue="nope"), "user:p"),
        SubmitItem(p, "b", _spec("b"), "user:p"),
        SubmitItem(p, "b", _spec("b"), "user:p"),
    ])
    a1, a2, a3, qa, old1, old2 = out
    assert isinstance(a1, SubmitResult) and a1.created
    assert isinstance(a2, SubmitResult) and not a2.created
    assert a2.operation["id"] == a1.operation["id"]
    assert isinstance(a3, Conflict) and "different payload" in str(a3)
    assert isinstance(qa, SubmitResult) and qa.created and qa.operation["id"] != a1.operation["id"]
    assert isinstance(old1, SubmitResult) and not old1.created
    assert old1.operation["id"] == before.operation["id"]
    assert isinstance(old2, Conflict)
    assert isinstance(bad, InvalidReference) and "nope" in str(bad)
    assert isinstance(b, SubmitResult) and b.created
    assert isinstance(b2, SubmitResult) and not b2.created
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute("SELECT idempotency_key, count(*) FROM operations"
                            " GROUP BY project_id, idempotency_key ORDER BY 1").fetchall()
        events = conn.execute("SELECT count(*) FROM events WHERE to_state = 'accepted'"
                              ).fetchone()[0]
    assert sorted(k for k, _ in rows) == ["a", "a", "b", "old"] and {n for _, n in rows} == {1}
    assert events == 4  # one 'accepted' event per created operation, none for duplicates


class _Recorder:
    """Stands in for submit_many: records the groups, answers after a delay (a commit)."""

    def __init__(self) -> None:
        self.groups: list[int] = []

    async def __call__(self, conn: Any, items: list[SubmitItem]) -> list[SubmitResult]:
        self.groups.append(len(items))
        await asyncio.sleep(0.01)
        return [SubmitResult({"key": i.key}, True) for i in items]


class _Pool:
    def connection(self, timeout: float | None = None) -> Any:
        from contextlib import asynccontextmanager

        @asynccontextmanager
        async def cm() -> Any:
            yield object()
        return cm()


def test_concurrent_requests_share_groups_and_all_get_their_own_answer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from controlplane.api import group_commit

    rec = _Recorder()
    monkeypatch.setattr(group_commit, "submit_many", rec)

    async def run() -> list[SubmitResult]:
        gc = GroupCommit(lambda: _Pool(), max_group=16, max_inflight=2)  # type: ignore[arg-type]
        first = await asyncio.gather(*(gc.submit(SubmitItem("p", f"k{i}", {}, "a"))
                                       for i in range(100)))
        alone = await gc.submit(SubmitItem("p", "late", {}, "a"))  # nothing in flight
        return [*first, alone]

    out = asyncio.run(run())
    assert [r.operation["key"] for r in out] == [f"k{i}" for i in range(100)] + ["late"]
    assert sum(rec.groups) == 101 and max(rec.groups) == 16 and rec.groups[-1] == 1
    assert len(rec.groups) < 20  # grouped: 100 requests did not make 100 statements


def test_a_failed_group_fails_each_of_its_requests_and_the_next_group_runs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from controlplane.api import group_commit

    calls: list[int] = []

    async def flaky(conn: Any, items: list[SubmitItem]) -> list[SubmitResult]:
        calls.append(len(items))
        await asyncio.sleep(0.01)
        if len(calls) == 1:
            raise psycopg.OperationalError("server closed the connection")
        return [SubmitResult({"key": i.key}, True) for i in items]

    monkeypatch.setattr(group_commit, "submit_many", flaky)

    async def run() -> tuple[list[Any], SubmitResult]:
        gc = GroupCommit(lambda: _Pool(), max_group=64, max_inflight=1)  # type: ignore[arg-type]
        first = await asyncio.gather(*(gc.submit(SubmitItem("p", f"k{i}", {}, "a"))
                                       for i in range(10)), return_exceptions=True)
        return first, await gc.submit(SubmitItem("p", "next", {}, "a"))

    first, after = asyncio.run(run())
    # the whole first group failed as one (a 503 each, retried by the route), nothing hangs
    assert calls[0] == 10 and len(first) == 10
    assert all(isinstance(e, StoreUnavailable) and "closed" in str(e) for e in first)
    assert after.operation == {"key": "next"} and calls == [10, 1]


def _spaced(gc: GroupCommit, n: int, gap: float) -> Any:
    async def run() -> list[SubmitResult]:
        tasks = []
        for i in range(n):
            tasks.append(asyncio.create_task(gc.submit(SubmitItem("p", f"k{i}", {}, "a"))))
            await asyncio.sleep(gap)
        return await asyncio.gather(*tasks)
    return run()


def test_a_steady_stream_gathers_fuller_groups_and_a_lone_request_waits_for_nobody(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The gather window: at a rate where groups of one or two would form, it makes them several
    times fuller (the CPU per submission falls); after an idle spell, no gather at all."""
    from controlplane.api import group_commit

    sizes: dict[float, list[int]] = {}
    for window in (0.0, 0.02):  # wide, so a slow machine's sleeps still make a stream
        rec = _Recorder()
        monkeypatch.setattr(group_commit, "submit_many", rec)
        gc = GroupCommit(lambda: _Pool(), window=window)  # type: ignore[arg-type]
        out = asyncio.run(_spaced(gc, 150, 0.001))
        assert [r.operation["key"] for r in out] == [f"k{i}" for i in range(150)]
        sizes[window] = rec.groups
    mean = {w: sum(g) / len(g) for w, g in sizes.items()}
    assert mean[0.02] > 2.5 * mean[0.0], sizes

    gathers: list[int] = []
    rec = _Recorder()
    monkeypatch.setattr(group_commit, "submit_many", rec)
    gc = GroupCommit(lambda: _Pool(), window=0.005)  # type: ignore[arg-type]
    real = gc._gather

    async def counted() -> None:
        gathers.append(len(gc._waiting))
        await real()
    monkeypatch.setattr(gc, "_gather", counted)

    async def lone() -> list[SubmitResult]:
        first = await gc.submit(SubmitItem("p", "one", {}, "a"))
        await asyncio.sleep(0.05)  # idle: two requests 50 ms apart are no stream
        return [first, await gc.submit(SubmitItem("p", "two", {}, "a"))]
    assert [r.operation["key"] for r in asyncio.run(lone())] == ["one", "two"]
    assert gathers == [] and rec.groups == [1, 1]


def test_a_group_logs_one_line_naming_each_operation_it_created(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The log line is per group (a line per submission was the API's largest remaining cost
    of its own, docs/performance.md), but no created operation goes unnamed, and a duplicate
    or a refusal is not logged as created."""
    import logging

    from controlplane.api import group_commit

    async def answers(conn: Any, items: list[SubmitItem]) -> list[SubmitResult | Exception]:
        return [Conflict("taken") if i.key.startswith("c") else
                SubmitResult({"id": f"id-{i.key}"}, created=not i.key.startswith("d"))
                for i in items]

    monkeypatch.setattr(group_commit, "submit_many", answers)

    async def run() -> list[Any]:
        gc = GroupCommit(lambda: _Pool(), max_group=64, max_inflight=1)  # type: ignore[arg-type]
        return await asyncio.gather(*(gc.submit(SubmitItem("p", k, {}, "a"))
                                      for k in ("a1", "d1", "c1", "a2", "a3")),
                                    return_exceptions=True)

    with caplog.at_level(logging.INFO, logger="controlplane.api"):
        out = asyncio.run(run())
    assert isinstance(out[2], Conflict) and out[1].created is False
    lines = [r for r in caplog.records if getattr(r, "action", None) == "submit"]
    named = [i for r in lines for i in r.operation_ids]  # type: ignore[attr-defined]
    assert sorted(named) == ["id-a1", "id-a2", "id-a3"]
    assert sum(r.count for r in lines) == 3 and len(lines) < 5  # type: ignore[attr-defined]
