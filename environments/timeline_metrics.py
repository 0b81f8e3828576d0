"""The fault timeline as Prometheus metrics while a game day runs, so dashboards can annotate
their graphs with the faults (docs/scheduling.md, "Fault timeline metrics").

The timeline file (environments/timeline.py) is written by other processes (each Chaos Toolkit
experiment); the collector reads it on every scrape, so a scrape always shows the file as it
is. Only events since the run started count. Exported, one series per injected fault:

  gameday_fault_active{run_id,experiment,fault,target}                    1 injected, 0 healed
  gameday_fault_injected_timestamp_seconds{run_id,experiment,fault,target} its fault_start
  gameday_fault_healed_timestamp_seconds{run_id,experiment,fault,target}   its fault_end (healed only)
  gameday_run_info{run_id,env,suite}                                       1 while the run serves

`experiment` is the experiment the runner had started when the fault began (the timeline
itself does not name it); a fault recorded before the first experiment has experiment="".

A local environment's Prometheus finds the endpoint through a file (``file_sd_configs``) that
the server writes when it starts and empties when it stops: the port is whatever was free, so
two environments' game days on one machine never compete for a port or scrape each other's.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from environments.timeline import Timeline

LABELS = ["run_id", "experiment", "fault", "target"]
# Where a run serves when nothing finds it by a file: the CronJob pod, an environment made
# before the local Prometheus read its targets from a file.
DEFAULT_METRICS_PORT = 9479


def write_scrape_targets(path: Path, targets: list[str]) -> None:
    """The targets of a file-discovered Prometheus job, written whole and then renamed into
    place: Prometheus re-reads the file when it changes and must never see half of it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps([{"targets": targets}] if targets else []))
    os.replace(tmp, path)


def _ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


@dataclass
class FaultState:
    experiment: str
    fault: str
    target: str
    injected: float
    healed: float | None = None


def fault_states(events: list[dict[str, Any]], since: float,
                 experiments: list[tuple[float, str]]) -> list[FaultState]:
    """Pure: timeline events -> one state per (experiment, fault, target), latest wins.
    `experiments`: (start time, name) in the order the runner started them."""
    def owner(at: float) -> str:
        name = ""
        for start, exp in experiments:
            if start <= at:
                name = exp
        return name

    states: dict[tuple[str, str], FaultState] = {}  # open faults by (fault, target)
    done: dict[tuple[str, str, str], FaultState] = {}
    for e in events:
        at = _ts(e["time"])
        if at < since or e.get("event") not in ("fault_start", "fault_end"):
            continue
        key = (str(e.get("fault", "")), str(e.get("target", "")))
        if e["event"] == "fault_start":
            s = FaultState(owner(at), key[0], key[1], at)
            states[key] = s
            done[(s.experiment, *key)] = s
        elif key in states:
            states.pop(key).healed = at
    return list(done.values())


@dataclass(eq=False)  # a registry keys collectors by identity
class FaultTimelineCollector(Collector):
    timeline: Timeline
    run_id: str
    env: str
    suite: str
    since: float = field(default_factory=time.time)
    experiments: list[tuple[float, str]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def begin_experiment(self, name: str, at: float | None = None) -> None:
        with self._lock:
            self.experiments.append((time.time() if at is None else at, name))

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            experiments = list(self.experiments)
        states = fault_states(self.timeline.read(), self.since, experiments)
        info = GaugeMetricFamily("gameday_run_info", "A game day is running (its id, env, "
                                 "suite)", labels=["run_id", "env", "suite"])
        info.add_metric([self.run_id, self.env, self.suite], 1)
        active = GaugeMetricFamily("gameday_fault_active",
                                   "1 while the fault is injected, 0 once healed", labels=LABELS)
        injected = GaugeMetricFamily("gameday_fault_injected_timestamp_seconds",
                                     "When the fault was injected (Unix time)", labels=LABELS)
        healed = GaugeMetricFamily("gameday_fault_healed_timestamp_seconds",
                                   "When the fault was healed (Unix time)", labels=LABELS)
        for s in states:
            labels = [self.run_id, s.experiment, s.fault, s.target]
            active.add_metric(labels, 0 if s.healed is not None else 1)
            injected.add_metric(labels, s.injected)
            if s.healed is not None:
                healed.add_metric(labels, s.healed)
        yield from (info, active, injected, healed)


class FaultMetricsServer:
    """The collector on its own registry, served over HTTP for the duration of a run."""

    def __init__(self, collector: FaultTimelineCollector, port: int,
                 addr: str = "127.0.0.1", targets_file: Path | None = None) -> None:
        """``port`` 0: a free one. ``targets_file``: announced there while serving (a
        Prometheus ``file_sd_configs`` file), withdrawn by ``close``."""
        self.collector = collector
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        self._server, self._thread = start_http_server(port, addr, registry=self.registry)
        self.port = self._server.server_port
        self.addr = addr
        self.targets_file = targets_file
        if targets_file is not None:
            host = "127.0.0.1" if addr in ("", "0.0.0.0") else addr  # any address: loopback too
            try:
                write_scrape_targets(targets_file, [f"{host}:{self.port}"])
            except OSError:
                self.close()
                raise

    @property
    def url(self) -> str:
        return f"http://{self.addr}:{self.port}/metrics"

    def close(self) -> None:
        if self.targets_file is not None:
            # if this fails the target shows down until the next run rewrites the file
            with contextlib.suppress(OSError):
                write_scrape_targets(self.targets_file, [])
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
