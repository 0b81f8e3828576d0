"""The agent's event spool, courier and flusher against an in-memory fake of the agent API:
order across an outage, the size bound, refusals, leftovers of a killed agent, evidence."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from controlplane.agent.api import ApiRejected, ApiUnavailable, LeaseLost
from controlplane.agent.counters import EvidenceCounters
from controlplane.agent.delivery import EVENTS_PER_REQUEST, Courier, Delivery
from controlplane.agent.flusher import SpoolFlusher
from controlplane.agent.metrics import AgentMetrics
from controlplane.agent.spool import ClaimKey, Spool, SpoolBusy

REPO = Path(__file__).resolve().parents[2]


class EventsApi:
    """The events endpoints only. ``down``: unreachable; ``refuse``: attempt ids answered 409
    (or 404 with ``missing``); ``calls`` records every delivered request."""

    def __init__(self) -> None:
        self.down = False
        self.refuse: set[str] = set()
        self.missing: set[str] = set()
        self.calls: list[tuple[str, int, list[dict[str, Any]]]] = []
        self.agent_calls: list[tuple[str, str, list[dict[str, Any]]]] = []

    def send_events(self, attempt_id: str, token: int, events: list[dict[str, Any]]) -> None:
        if self.down:
            raise ApiUnavailable("connection refused")
        if attempt_id in self.refuse:
            raise LeaseLost(f"409 fencing token {token} is stale")
        if attempt_id in self.missing:
            raise ApiRejected(f"404 attempt {attempt_id} not found", 404)
        assert len(events) <= EVENTS_PER_REQUEST
        self.calls.append((attempt_id, token, list(events)))

    def agent_events(self, agent_id: str, attempt_id: str, events: list[dict[str, Any]]) -> None:
        if self.down:
            raise ApiUnavailable("connection refused")
        self.agent_calls.append((agent_id, attempt_id, list(events)))

    def delivered(self, attempt_id: str) -> list[int]:
        return [e["data"]["i"] for a, _, batch in self.calls if a == attempt_id for e in batch]


def key(token: int = 1) -> ClaimKey:
    return ClaimKey(str(uuid.uuid4()), str(uuid.uuid4()), token)


def logs(start: int, stop: int, pad: int = 0) -> list[dict[str, Any]]:
    return [{"kind": "log", "message": "x" * pad, "data": {"i": i}} for i in range(start, stop)]


def open_spool(path: Path, metrics: AgentMetrics | None = None, max_bytes: int = 1 << 20,
               **kw: Any) -> Spool:
    return Spool(path, max_bytes=max_bytes, max_age_seconds=kw.pop("max_age", 3600.0),
                 metrics=metrics or AgentMetrics(), **kw)


def sample(metrics: AgentMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_outage_spools_on_disk_then_delivers_oldest_first_across_a_restart(tmp_path: Path) -> None:
    api, k = EventsApi(), key(token=7)
    spool = open_spool(tmp_path)
    courier = Courier(api, spool, spool.metrics)  # type: ignore[arg-type]
    api.down = True
    assert courier.forward(k, logs(0, 300)) is Delivery.UNAVAILABLE
    assert courier.forward(k, logs(300, 450)) is Delivery.UNAVAILABLE
    assert spool.pending_events() == 450 and api.calls == []
    assert sample(spool.metrics, "controlplane_agent_events_spooled_total") == 450
    segment = tmp_path / "segments" / f"{k.attempt_id}.jsonl"
    first = json.loads(segment.read_text().splitlines()[0])  # claim and token on every line
    assert (first["attempt_id"], first["fencing_token"], first["event"]["data"]) == \
        (k.attempt_id, 7, {"i": 0})

    api.down = False
    assert courier.flush(k, max_batches=1) is Delivery.MORE  # part of it, then the agent stops
    spool.close()
    spool = open_spool(tmp_path)  # restart: the delivered part is not sent again
    courier = Courier(api, spool, spool.metrics)  # type: ignore[arg-type]
    assert courier.forward(k, logs(450, 460)) is Delivery.DONE  # behind the spooled ones

    assert api.delivered(k.attempt_id) == list(range(460))
    assert {token for _, token, _ in api.calls} == {7}
    assert spool.pending_events() == 0 and not segment.exists()
    assert sample(spool.metrics, "controlplane_agent_events_dropped_total",
                  reason="spool_full") == 0


def check_bound_drops_oldest_and_counts(tmp_path: Path) -> None:
    """Every event ends delivered or counted dropped, the dropped ones are the oldest."""
    api, a, b = EventsApi(), key(), key()
    metrics = AgentMetrics()
    spool = open_spool(tmp_path, metrics, max_bytes=8 * 1024)
    courier = Courier(api, spool, metrics)  # type: ignore[arg-type]
    api.down = True
    for start in range(0, 200, 20):  # two attempts interleaved, far more than 8 KiB
        courier.forward(a if start % 40 == 0 else b, logs(start, start + 20, pad=40))
    assert 0 < spool.pending_bytes() <= 8 * 1024
    api.down = False
    courier.flush(a)
    courier.flush(b)

    delivered = sorted(api.delivered(a.attempt_id) + api.delivered(b.attempt_id))
    dropped = 200 - len(delivered)
    assert dropped > 0 and delivered == list(range(dropped, 200))  # the oldest went first
    assert sample(metrics, "controlplane_agent_events_dropped_total", reason="spool_full") == dropped
    counters = json.loads((tmp_path / "counters.json").read_text())
    assert counters["dropped"]["spool_full"] == dropped
    assert counters["unreported"]["spool_full"] == dropped  # still to be announced
    spool.close()
    restarted = AgentMetrics()
    open_spool(tmp_path, restarted).close()  # a restarted agent keeps counting from there
    assert sample(restarted, "controlplane_agent_events_dropped_total",
                  reason="spool_full") == dropped


def test_bound_hit_drops_the_oldest_and_counts_them(tmp_path: Path) -> None:
    check_bound_drops_oldest_and_counts(tmp_path)


def test_drop_check_fails_when_drops_are_not_counted(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutation: the same check must catch a spool that drops silently."""
    monkeypatch.setattr(EvidenceCounters, "drop", lambda self, reason, count, attempt_id: None)
    with pytest.raises(AssertionError):
        check_bound_drops_oldest_and_counts(tmp_path)


def test_a_single_batch_larger_than_the_bound_keeps_its_newest(tmp_path: Path) -> None:
    spool = open_spool(tmp_path, max_bytes=2048)
    spool.append(key(), logs(0, 100, pad=20))
    assert 0 < spool.pending_events() < 100
    dropped = sample(spool.metrics, "controlplane_agent_events_dropped_total", reason="spool_full")
    assert dropped + spool.pending_events() == 100


@pytest.mark.parametrize("answer", ["409", "404"])
def test_refusal_counts_refused_not_dropped_and_forgets_the_claim(tmp_path: Path,
                                                                  answer: str) -> None:
    api, k = EventsApi(), key()
    spool = open_spool(tmp_path)
    courier = Courier(api, spool, spool.metrics)  # type: ignore[arg-type]
    api.down = True
    courier.forward(k, logs(0, 30))
    api.down = False
    (api.refuse if answer == "409" else api.missing).add(k.attempt_id)

    with pytest.raises(LeaseLost, match="refused"):
        courier.forward(k, logs(30, 35))

    direct = key()  # nothing spooled: refused on the way out
    (api.refuse if answer == "409" else api.missing).add(direct.attempt_id)
    with pytest.raises(LeaseLost, match="refused"):
        courier.forward(direct, logs(0, 3))

    assert api.calls == [] and spool.pending_events() == 0
    assert sample(spool.metrics, "controlplane_agent_events_refused_total") == 38
    for reason in ("spool_full", "expired", "unreadable"):
        assert sample(spool.metrics, "controlplane_agent_events_dropped_total", reason=reason) == 0
    assert json.loads((tmp_path / "counters.json").read_text())["refused"] == 38


def test_malformed_batch_is_dropped_as_unreadable_instead_of_blocking(tmp_path: Path) -> None:
    class Rejecting(EventsApi):
        def send_events(self, attempt_id: str, token: int, events: list[dict[str, Any]]) -> None:
            if any(e["data"].get("i") == 3 for e in events):
                raise ApiRejected("422 events.0.kind: bad", 422)
            super().send_events(attempt_id, token, events)

    api, k = Rejecting(), key()
    spool = open_spool(tmp_path)
    courier = Courier(api, spool, spool.metrics)  # type: ignore[arg-type]
    assert courier.forward(k, logs(0, 5)) is Delivery.DONE
    assert courier.forward(k, logs(5, 7)) is Delivery.DONE
    assert api.delivered(k.attempt_id) == [5, 6]
    assert sample(spool.metrics, "controlplane_agent_events_dropped_total", reason="unreadable") == 5


KILLED_AGENT = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path
    from controlplane.agent.metrics import AgentMetrics
    from controlplane.agent.spool import ClaimKey, Spool
    spool = Spool(Path(sys.argv[1]), max_bytes=1 << 20, max_age_seconds=3600,
                  metrics=AgentMetrics(), clock=lambda: time.time() - float(sys.argv[3]))
    for i, (attempt, token) in enumerate([("a" * 8, 11), ("b" * 8, 12), ("c" * 8, 13)]):
        key = ClaimKey(attempt + "-0000-4000-8000-000000000000", "op-" + attempt, token)
        spool.append(key, [{"kind": "log", "message": "", "data": {"i": i * 10 + j}}
                           for j in range(int(sys.argv[2]))])
    with open(Path(sys.argv[1]) / "segments" / (("c" * 8) + "-0000-4000-8000-000000000000.jsonl"),
              "ab") as f:
        f.write(b'{"seq": 99, "torn')  # killed in the middle of a write
    os.kill(os.getpid(), signal.SIGKILL)
""")


def killed_agent(spool_dir: Path, per_segment: int, age: float = 0.0) -> None:
    proc = subprocess.run([sys.executable, "-c", KILLED_AGENT, str(spool_dir), str(per_segment),
                           str(age)], cwd=REPO, capture_output=True, timeout=30, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()


def flusher(spool: Spool, api: EventsApi) -> SpoolFlusher:
    return SpoolFlusher(spool=spool, courier=Courier(api, spool, spool.metrics),  # type: ignore[arg-type]
                        api=api, agent_name="agent-x", agent_id="agent-id",  # type: ignore[arg-type]
                        interval=0.05)


def test_leftovers_of_a_killed_agent_are_delivered_or_refused_after_restart(tmp_path: Path) -> None:
    killed_agent(tmp_path, per_segment=4)
    api = EventsApi()
    metrics = AgentMetrics()
    spool = open_spool(tmp_path, metrics)  # the lock died with the killed process
    a, b, c = (f"{x * 8}-0000-4000-8000-000000000000" for x in "abc")
    api.refuse.add(b)  # b's lease moved on while the agent was dead
    api.down = True
    flusher(spool, api).pass_once()
    assert spool.pending_events() == 12  # unreachable: nothing given up

    api.down = False
    flusher(spool, api).pass_once()

    assert api.delivered(a) == [0, 1, 2, 3] and api.delivered(c) == [20, 21, 22, 23]
    assert {(attempt, token) for attempt, token, _ in api.calls} == {(a, 11), (c, 13)}
    assert sample(metrics, "controlplane_agent_events_refused_total") == 4
    assert sample(metrics, "controlplane_agent_events_dropped_total", reason="unreadable") == 1
    assert spool.pending_events() == 0 and list((tmp_path / "segments").iterdir()) == []


def test_old_leftovers_expire_and_the_drop_is_announced(tmp_path: Path) -> None:
    killed_agent(tmp_path, per_segment=3, age=7200)
    api = EventsApi()
    spool = open_spool(tmp_path, max_age=3600)
    f = flusher(spool, api)
    api.down = True
    f.pass_once()  # expiry needs no API; the announcement does
    assert spool.pending_events() == 0
    assert sample(spool.metrics, "controlplane_agent_events_dropped_total", reason="expired") == 9

    api.down = False
    f.pass_once()  # no attempt owned: the agent-level endpoint, on an attempt that lost events
    [(agent_id, attempt_id, events)] = api.agent_calls
    assert agent_id == "agent-id" and attempt_id.endswith("-0000-4000-8000-000000000000")
    assert {e["kind"] for e in events} == {"evidence_dropped"}
    # the torn last line of the killed write counts as well
    assert sorted((e["data"]["reason"], e["data"]["count"], e["data"]["agent"]) for e in events) \
        == [("expired", 9, "agent-x"), ("unreadable", 1, "agent-x")]
    assert json.loads((tmp_path / "counters.json").read_text())["unreported"] == \
        {"spool_full": 0, "expired": 0, "unreadable": 0}
    f.pass_once()
    assert len(api.agent_calls) == 1  # announced once


def test_drops_are_announced_on_an_owned_attempt_when_there_is_one(tmp_path: Path) -> None:
    api, old, live = EventsApi(), key(), key(token=5)
    spool = open_spool(tmp_path, max_bytes=2048)
    api.down = True
    Courier(api, spool, spool.metrics).forward(old, logs(0, 100, pad=20))  # type: ignore[arg-type]
    dropped = int(sample(spool.metrics, "controlplane_agent_events_dropped_total",
                         reason="spool_full"))
    assert dropped > 0
    spool.own(live)
    api.refuse.add(old.attempt_id)
    api.down = False
    flusher(spool, api).pass_once()

    [(attempt_id, token, [event])] = [c for c in api.calls if c[0] == live.attempt_id]
    assert (attempt_id, token) == (live.attempt_id, 5)
    assert event == {"kind": "evidence_dropped",
                     "message": f"agent agent-x dropped {dropped} undelivered events (spool_full)",
                     "data": {"count": dropped, "reason": "spool_full", "agent": "agent-x"}}
    assert api.agent_calls == []


def test_one_spool_directory_one_agent_process(tmp_path: Path) -> None:
    spool = open_spool(tmp_path)
    with pytest.raises(SpoolBusy, match=f"pid {os.getpid()}"):
        open_spool(tmp_path)
    spool.close()
    open_spool(tmp_path).close()


def test_segments_are_reclaimed_while_a_long_backlog_drains(tmp_path: Path) -> None:
    api, k = EventsApi(), key()
    spool = open_spool(tmp_path)
    courier = Courier(api, spool, spool.metrics)  # type: ignore[arg-type]
    api.down = True
    courier.forward(k, logs(0, 3000, pad=30))
    segment = tmp_path / "segments" / f"{k.attempt_id}.jsonl"
    full = segment.stat().st_size
    api.down = False
    courier.flush(k, max_batches=10)
    assert segment.stat().st_size < full  # the delivered prefix was compacted away
    courier.flush(k)
    assert api.delivered(k.attempt_id) == list(range(3000))
