"""The fault timeline as Prometheus metrics (environments/timeline_metrics.py): a real HTTP GET of
the endpoint while a fault is active and after it was healed, parsed with prometheus_client's
own text parser."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from environments.timeline import Timeline
from environments.timeline_metrics import FaultMetricsServer, FaultTimelineCollector


def _scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    return {f.name: [(s.labels, s.value) for s in f.samples]
            for f in text_string_to_metric_families(text)}


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Timeline, FaultMetricsServer]]:
    timeline = Timeline(tmp_path / "faults.jsonl")
    # a fault of an earlier run in the same environment's timeline: never exported
    timeline.record("fault_start", "kill", "api-2", {})
    time.sleep(0.01)
    collector = FaultTimelineCollector(timeline, "run-1", "local", "ci", since=time.time())
    server = FaultMetricsServer(collector, 0)  # port 0: any free port
    yield timeline, server
    server.close()


def test_an_active_fault_then_its_healing(served) -> None:
    timeline, server = served
    assert server.url.startswith("http://127.0.0.1:")
    got = _scrape(server.url)
    assert got["gameday_run_info"] == [({"run_id": "run-1", "env": "local", "suite": "ci"}, 1.0)]
    assert got.get("gameday_fault_active", []) == []

    server.collector.begin_experiment("db-primary-loss")
    start = timeline.record("fault_start", "failover-db", "pg-0", {})
    labels = {"run_id": "run-1", "experiment": "db-primary-loss", "fault": "failover-db",
              "target": "pg-0"}
    got = _scrape(server.url)
    assert got["gameday_fault_active"] == [(labels, 1.0)]
    (injected,) = got["gameday_fault_injected_timestamp_seconds"]
    assert injected[0] == labels and abs(injected[1] - _ts(start["time"])) < 1e-3
    assert got.get("gameday_fault_healed_timestamp_seconds", []) == []

    end = timeline.record("fault_end", "failover-db", "pg-0", {})
    got = _scrape(server.url)
    assert got["gameday_fault_active"] == [(labels, 0.0)]
    (healed,) = got["gameday_fault_healed_timestamp_seconds"]
    assert healed[0] == labels and abs(healed[1] - _ts(end["time"])) < 1e-3


def test_the_same_fault_in_two_experiments_is_two_series(served) -> None:
    timeline, server = served
    server.collector.begin_experiment("a")
    timeline.record("fault_start", "kill", "api-1", {})
    timeline.record("fault_end", "kill", "api-1", {})
    server.collector.begin_experiment("b")
    timeline.record("fault_start", "kill", "api-1", {})
    got = {s[0]["experiment"]: s[1] for s in _scrape(server.url)["gameday_fault_active"]}
    assert got == {"a": 0.0, "b": 1.0}


def test_closed_server_no_longer_answers(served) -> None:
    _, server = served
    url = server.url
    server.close()
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=2)
    server.close = lambda: None  # the fixture closes again


def _ts(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text).timestamp()
