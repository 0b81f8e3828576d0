"""Store-level rules that the API cannot reach directly: guarded transitions, migrations, seed."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import psycopg
import pytest

from controlplane.states import OpState
from controlplane.store import auth, operations
from controlplane.store.transitions import transition
from environments.local.launch import gameday_cmd


def _seed(dsn: str) -> str:
    with psycopg.connect(dsn) as conn:
        auth.seed(conn, {"projects": [{"name": "p", "token": "t" * 20}],
                         "queues": [{"name": "default"}]})
        return str(conn.execute("SELECT id FROM projects").fetchone()[0])


def test_illegal_transitions_are_refused_and_leave_no_event(pg_dsn: str) -> None:
    project = _seed(pg_dsn)

    async def run() -> None:
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
            spec = {"name": "x", "queue": "default", "priority": 0, "max_retries": 1,
                    "timeout_seconds": 10, "workload": {"image": "a:1"}}
            res = await operations.submit(conn, project_id=project, key="k", spec=spec,
                                          actor="test")
            op_id = res.operation["id"]
            assert await transition(conn, op_id, OpState.SUCCEEDED, actor="t", reason="x") is None
            assert await transition(conn, op_id, OpState.RUNNING, actor="t", reason="x") is None
            ok = await transition(conn, op_id, OpState.QUEUED, actor="t", reason="admitted")
            assert ok is not None and ok["from_state"] == "accepted" and ok["state"] == "queued"
            evs = await operations.events(conn, op_id)
            assert [(e["from_state"], e["to_state"]) for e in evs] == [
                (None, "accepted"), ("accepted", "queued")]
            with pytest.raises(ValueError, match="not settable"):
                await transition(conn, op_id, OpState.BLOCKED, actor="t", reason="x", spec={})

    asyncio.run(run())


def test_migrate_is_idempotent_and_seed_validates(pg_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    dsn = pg_server.create_database("migr")
    env = {"CONTROLPLANE_DSN": dsn, "PATH": "/usr/bin:/bin"}
    for _ in range(2):
        out = subprocess.run(gameday_cmd("controlplane", "migrate"), env=env,
                             capture_output=True, text=True, check=False)
        assert out.returncode == 0, out.stderr
        assert "schema at revision 0006" in out.stdout
    bad = tmp_path / "seed.yaml"
    bad.write_text("projects: [{name: p, token: short}]\n")
    out = subprocess.run(gameday_cmd("controlplane", "seed", "--file", str(bad)), env=env,
                         capture_output=True, text=True, check=False)
    assert out.returncode != 0 and "token too short" in out.stderr
    bad.write_text("projets: []\n")
    out = subprocess.run(gameday_cmd("controlplane", "seed", "--file", str(bad)), env=env,
                         capture_output=True, text=True, check=False)
    assert out.returncode != 0 and "unknown keys ['projets']" in out.stderr


def test_blocked_backlog_never_starves_new_work_and_is_swept_in_batches(pg_dsn: str) -> None:
    from controlplane.store import agents as agent_store
    from controlplane.store import scheduling

    project = _seed(pg_dsn)
    spec = {"name": "x", "queue": "default", "priority": 0, "max_retries": 1,
            "timeout_seconds": 10, "workload": {"image": "a:1"},
            "placement": {"dataset": "nowhere"}}

    async def run() -> None:
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
            for i in range(25):
                await operations.submit(conn, project_id=project, key=f"b{i}", spec=spec,
                                        actor="t")
            st, fleet, cursor = await scheduling.schedule(conn, alive_seconds=30,
                                                          lease_seconds=5, batch=30)
            assert st.blocked == 25 and cursor is None  # no eligible destination anywhere
            await agent_store.register(conn, {"name": "a1", "pool": "cpu", "zone": "z",
                                              "region": "r", "capabilities": {"cpu_slots": 4}})
            new = await operations.submit(conn, project_id=project, key="new",
                                          spec={**spec, "placement": {}}, actor="t")
            # the fleet changed: a sweep of the (old) blocked work starts, but the new op is
            # routed in this very pass, ahead of the backlog
            passes = 0
            while True:
                st, fleet, cursor = await scheduling.schedule(
                    conn, alive_seconds=30, lease_seconds=5, batch=10, last_fleet=fleet,
                    blocked_after=cursor)
                passes += 1
                if passes == 1:
                    assert len(st.dispatched) == 1
                if cursor is None and passes > 1:
                    break
            assert passes <= 6
            row = await operations.get(conn, str(new.operation["id"]), None)
            assert row["state"] == "dispatched"
            # with the fleet unchanged and the sweep done, blocked work is left alone
            st, _, cursor = await scheduling.schedule(conn, alive_seconds=30, lease_seconds=5,
                                                      batch=10, last_fleet=fleet)
            assert st.blocked == 0 and cursor is None

    asyncio.run(run())


def test_a_full_fleet_leaves_queued_work_alone_but_admits_new_work_and_fills_a_freed_slot(
        pg_dsn: str) -> None:
    """With no free slot anywhere and the fleet unchanged, a pass reads only new (accepted)
    work: the queued backlog is neither re-read nor re-routed. A freed slot goes to the
    oldest queued operation, and a changed fleet routes the backlog again."""
    from controlplane.store import agents as agent_store
    from controlplane.store import scheduling

    project = _seed(pg_dsn)
    spec = {"name": "x", "queue": "default", "priority": 0, "max_retries": 0,
            "timeout_seconds": 10, "workload": {"image": "a:1"}}

    async def run() -> None:
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
            async def submit(key: str) -> str:
                res = await operations.submit(conn, project_id=project, key=key, spec=spec,
                                              actor="t")
                return str(res.operation["id"])

            async def state(op_id: str) -> tuple[str, str]:
                row = await operations.get(conn, op_id, None)
                return row["state"], row["state_reason"]

            async def schedule(fleet: tuple | None) -> tuple[scheduling.PassStats, tuple]:
                st, fleet, _ = await scheduling.schedule(conn, alive_seconds=30,
                                                         lease_seconds=60, last_fleet=fleet)
                return st, fleet

            await agent_store.register(conn, {"name": "a1", "pool": "cpu", "zone": "z",
                                              "region": "r", "capabilities": {"cpu_slots": 1}})
            # a control-plane node: free slots that never take work, as in every real fleet
            await agent_store.register(conn, {"name": "sys", "pool": "system", "zone": "z",
                                              "region": "r", "capabilities": {"cpu_slots": 4}})
            # and a GPU node with free cpu slots but its one GPU busy: nothing it may take fits
            await agent_store.register(conn, {"name": "g1", "pool": "gpu", "zone": "z",
                                              "region": "r", "capabilities": {
                                                  "cpu_slots": 4, "accelerator_type": "t4",
                                                  "accelerator_count": 1}})
            gpu = await operations.submit(
                conn, project_id=project, key="gpu", actor="t",
                spec={**spec, "resources": {"accelerator": {"type": "t4", "count": 1}}})
            first = await submit("first")
            st, fleet = await schedule(None)
            assert len(st.dispatched) == 2 and (await state(first))[0] == "dispatched"
            assert (await state(str(gpu.operation["id"])))[0] == "dispatched"
            backlog = [await submit(f"q{i}") for i in range(3)]
            st, fleet = await schedule(fleet)  # admitted: queued, with the reason
            assert st.waiting == 3 and not st.dispatched
            for op_id in backlog:
                assert (await state(op_id))[0] == "queued"
            # marks what a pass re-routes (it would write the real reason back)
            await conn.execute("UPDATE operations SET state_reason = 'marked' WHERE id = ANY(%s)",
                               (backlog,))
            new = await submit("new")
            st, fleet = await schedule(fleet)
            assert (st.waiting, st.dispatched) == (1, [])  # only the new one was routed
            got = await state(new)
            assert got[0] == "queued" and "waiting for capacity" in got[1], got
            assert [await state(o) for o in backlog] == [("queued", "marked")] * 3
            # the slot frees: the oldest queued operation takes it, in this very pass
            await conn.execute("UPDATE attempts SET state = 'succeeded', finished_at = now()"
                               " WHERE operation_id = %s", (first,))
            st, fleet = await schedule(fleet)
            assert len(st.dispatched) == 1
            assert (await state(backlog[0]))[0] == "dispatched"
            # full again: the rest were not routed again after the slot was taken
            assert [await state(o) for o in backlog[1:]] == [("queued", "marked")] * 2
            # a fleet the pass has not seen (None: the reconciler's periodic re-check, or an
            # agent that came, went or tripped its breaker) routes the whole backlog again
            st, fleet = await schedule(None)
            assert not st.dispatched
            for op_id in [*backlog[1:], new]:
                got = await state(op_id)
                assert got[0] == "queued" and "waiting for capacity" in got[1], got

    asyncio.run(run())
