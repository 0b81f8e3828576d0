"""Counters of the filesystem and their Prometheus text rendering."""

from __future__ import annotations

import errno
import threading
from collections import Counter


class Stats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.ops: Counter[str] = Counter()
        self.errors: Counter[tuple[str, str]] = Counter()  # (op, errno name)
        self.delays: Counter[str] = Counter()
        self.delay_seconds: Counter[str] = Counter()
        self.events: Counter[str] = Counter()  # crashes, dropped bytes, writeback bytes

    def op(self, name: str) -> None:
        with self._lock:
            self.ops[name] += 1

    def injected(self, op: str, delay_s: float, err: int | None) -> None:
        with self._lock:
            if delay_s:
                self.delays[op] += 1
                self.delay_seconds[op] += delay_s
            if err is not None:
                self.errors[(op, errno.errorcode.get(err, str(err)))] += 1

    def event(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self.events[name] += amount

    def render(self, unsynced_bytes: int, unsynced_files: int, faults_active: bool) -> str:
        with self._lock:
            ops, errors = dict(self.ops), dict(self.errors)
            delays, seconds, events = dict(self.delays), dict(self.delay_seconds), dict(self.events)
        lines = [
            "# HELP faultfs_ops_total Filesystem operations served, by operation.",
            "# TYPE faultfs_ops_total counter",
            *(f'faultfs_ops_total{{op="{k}"}} {v}' for k, v in sorted(ops.items())),
            "# HELP faultfs_injected_errors_total Errors injected, by operation class and errno.",
            "# TYPE faultfs_injected_errors_total counter",
            *(f'faultfs_injected_errors_total{{op="{op}",errno="{name}"}} {v}'
              for (op, name), v in sorted(errors.items())),
            "# HELP faultfs_injected_delays_total Operations delayed, by operation class.",
            "# TYPE faultfs_injected_delays_total counter",
            *(f'faultfs_injected_delays_total{{op="{k}"}} {v}' for k, v in sorted(delays.items())),
            "# HELP faultfs_injected_delay_seconds_total Delay injected, by operation class.",
            "# TYPE faultfs_injected_delay_seconds_total counter",
            *(f'faultfs_injected_delay_seconds_total{{op="{k}"}} {v:.6f}'
              for k, v in sorted(seconds.items())),
            "# HELP faultfs_unsynced_bytes Written bytes held in memory, not yet fsynced.",
            "# TYPE faultfs_unsynced_bytes gauge",
            f"faultfs_unsynced_bytes {unsynced_bytes}",
            "# HELP faultfs_unsynced_files Files with unsynced writes or truncations.",
            "# TYPE faultfs_unsynced_files gauge",
            f"faultfs_unsynced_files {unsynced_files}",
            "# HELP faultfs_faults_active 1 while any fault is set.",
            "# TYPE faultfs_faults_active gauge",
            f"faultfs_faults_active {int(faults_active)}",
        ]
        for name, help_text in (("crashes", "Simulated power losses."),
                                ("dropped_bytes", "Unsynced bytes dropped by crashes."),
                                ("writeback_bytes",
                                 "Bytes written back (not fsynced) over the memory cap.")):
            lines += [f"# HELP faultfs_{name}_total {help_text}",
                      f"# TYPE faultfs_{name}_total counter",
                      f"faultfs_{name}_total {events.get(name, 0)}"]
        return "\n".join(lines) + "\n"
