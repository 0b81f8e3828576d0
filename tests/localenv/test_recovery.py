"""Recovery end to end on the real environment: API replica loss and database primary loss.

These run last among the environment tests (file order), and the last test tears the
environment down and checks that no process is left.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Self

import pytest

from environments.local import procs
from environments.local.env import LocalEnvironment
from tests.localenv.helpers import Client, operation_spec

pytestmark = pytest.mark.slow


def _unplaceable(env: LocalEnvironment) -> dict:
    # No agent holds this dataset: submissions exercise the write path without starting
    # hundreds of workload processes on a 2-core machine.
    return operation_spec(env, steps=2, placement={"regions": None, "dataset": "localenv-nowhere"})


class Load:
    """Client threads submitting continuously; every acknowledged operation id is kept."""

    def __init__(self, env: LocalEnvironment, threads: int = 4) -> None:
        self.env = env
        self.acked: dict[str, str] = {}  # idempotency key -> operation id
        self.failed: list[str] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _run(self) -> None:
        client = Client(self.env)
        try:
            while not self.stop.is_set():
                key = str(uuid.uuid4())
                try:
                    op = client.submit(_unplaceable(self.env), key=key, deadline=30)
                except AssertionError as exc:
                    with self.lock:
                        self.failed.append(str(exc))
                    continue
                with self.lock:
                    self.acked[key] = op["id"]
                time.sleep(0.05)
        finally:
            client.close()

    def __enter__(self) -> Self:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=60)

    def count(self) -> int:
        with self.lock:
            return len(self.acked)


def _all_acked_exist(env: LocalEnvironment, acked: dict[str, str]) -> None:
    client = Client(env)
    try:
        for key, operation_id in acked.items():
            op = client.get(operation_id)
            assert op["id"] == operation_id and op["idempotency_key"] == key
    finally:
        client.close()


def test_api_replica_sigkill_under_load_fails_no_submission(env: LocalEnvironment) -> None:
    with Load(env) as load:
        time.sleep(1.5)
        before = load.count()
        env.faults.kill("api-1")
        time.sleep(3)
        during = load.count() - before
        env.faults.start("api-1")
        time.sleep(1)
    assert load.failed == []
    assert during > 5, "submissions stalled while one replica was down"
    assert len(set(load.acked.values())) == len(load.acked)  # one operation per key
    _all_acked_exist(env, load.acked)
    print(f"\nAPI replica SIGKILL: {len(load.acked)} acknowledged, 0 failed, {during} while api-1 was down")


def test_primary_sigkill_writes_back_within_20s_and_no_ack_lost(env: LocalEnvironment) -> None:
    env.db.wait_sync_standby(30)
    old = env.db.leader()
    with Load(env, threads=2) as load:
        time.sleep(1.5)
        killed = env.faults.kill("primary")  # the whole node: Patroni and postgres
        t0 = time.monotonic()
        acked_at_kill = load.count()
        probe = Client(env)
        # A fresh submission, started after the kill, retried with one key until acknowledged.
        op = probe.submit(_unplaceable(env), deadline=40)
        write_back = time.monotonic() - t0
        probe.close()
        while load.count() < acked_at_kill + 5:
            time.sleep(0.1)
    assert killed["target"] == old and env.db.leader() not in (None, old)
    assert write_back <= 20, f"writes accepted again only after {write_back:.1f} s"
    assert load.failed == []
    acked = dict(load.acked)
    acked[op["idempotency_key"]] = op["id"]
    _all_acked_exist(env, acked)
    print(f"\nprimary SIGKILL: API accepted a new submission after {write_back:.2f} s; "
          f"{len(acked)} acknowledged submissions all present")
    env.faults.start(old)
    env.db.wait_sync_standby(30)


def test_zz_down_stops_everything_within_5s(local_env: LocalEnvironment) -> None:
    pids = procs.marked_processes(local_env.state_dir)
    assert len(pids) > 20
    started = time.monotonic()
    local_env.down()
    took = time.monotonic() - started
    assert procs.marked_processes(local_env.state_dir) == []
    assert not any(procs.is_alive(p) for p in pids)
    assert took <= 5, f"down took {took:.1f} s"
    assert local_env.state_dir.exists()  # state kept unless purge
    events = local_env.faults.timeline.read()
    assert events[-1]["fault"] == "env_down"
    starts = sum(e["event"] == "fault_start" for e in events)
    ends = sum(e["event"] == "fault_end" for e in events)
    assert starts == ends, "every fault that began also ended"
    print(f"\ndown: {took:.2f} s, {len(pids)} processes stopped")
