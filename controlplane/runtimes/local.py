"""The ``local`` runtime: the workload as a child process group of the agent.

The workload gets its own process group (so a stop reaches any grandchildren) and dies with
the agent: the workload sets PR_SET_PDEATHSIG on itself (``--parent-pid``). Linux delivers
that signal when the *thread* that forked exits, so the caller must start the workload from
a thread that outlives it (the agent's per-attempt runner does).
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from collections import deque
from pathlib import Path

from controlplane.runtimes.base import LaunchSpec, Outcome, RunResult, workload_args
from controlplane.workload.events import WorkloadEvent, parse_line

EXIT_INVALID = 2
_REPO_ROOT = str(Path(__file__).resolve().parents[2])


class LocalRunHandle:
    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self._events: queue.SimpleQueue[WorkloadEvent] = queue.SimpleQueue()
        self._tail: deque[str] = deque(maxlen=5)  # last log lines: the failure reason
        self._reader = threading.Thread(target=self._read, name=f"workload-{process.pid}-out",
                                        daemon=True)
        self._reader.start()
        self._stopped_by_agent = False

    @property
    def pid(self) -> int:
        return self.process.pid

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            event = parse_line(line)
            if event.kind == "log":
                self._tail.append(event.message)
            self._events.put(event)

    def drain_events(self) -> list[WorkloadEvent]:
        out: list[WorkloadEvent] = []
        while True:
            try:
                out.append(self._events.get_nowait())
            except queue.Empty:
                return out

    def result(self) -> RunResult | None:
        code = self.process.poll()
        if code is None:
            return None
        self._reader.join(timeout=2)  # every event is drained before the result is final
        if code == 0:
            return RunResult(Outcome.SUCCEEDED, "workload exited 0", exit_code=0)
        tail = " | ".join(self._tail)
        if code == EXIT_INVALID:
            return RunResult(Outcome.FAILED, f"invalid workload input: {tail}", transient=False,
                             exit_code=code)
        if code < 0:
            who = "stopped by agent" if self._stopped_by_agent else "killed"
            return RunResult(Outcome.FAILED, f"workload {who} (signal {-code})", exit_code=code)
        return RunResult(Outcome.FAILED, f"workload exited {code}: {tail}", exit_code=code)

    def pending_reason(self) -> str | None:
        return None

    def stop(self, grace_seconds: float = 2.0) -> None:
        if self.process.poll() is not None:
            return
        self._stopped_by_agent = True
        self._signal_group(signal.SIGTERM)
        try:
            self.process.wait(timeout=grace_seconds)
        except subprocess.TimeoutExpired:
            self._signal_group(signal.SIGKILL)
            self.process.wait(timeout=5)

    def _signal_group(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.process.pid, sig)  # pgid == pid: started with start_new_session
        except ProcessLookupError:
            pass


class LocalRuntime:
    name = "local"

    def __init__(self, python: str = sys.executable, extra_env: dict[str, str] | None = None) -> None:
        self.python = python
        self.extra_env = extra_env or {}

    def start(self, spec: LaunchSpec) -> LocalRunHandle:
        argv = [self.python, "-u", "-m", "controlplane.workload", *workload_args(spec),
                "--parent-pid", str(os.getpid())]
        env = dict(os.environ)
        env.update(self.extra_env)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_REPO_ROOT, env.get("PYTHONPATH")]))
        env.update({
            "GAMEDAY_OPERATION_ID": spec.operation_id,
            "GAMEDAY_ATTEMPT_ID": spec.attempt_id,
            "GAMEDAY_IMAGE": spec.image,  # the resolved digest: evidence of what "ran"
        })
        process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            text=True, bufsize=1, env=env, start_new_session=True,
        )
        return LocalRunHandle(process)
