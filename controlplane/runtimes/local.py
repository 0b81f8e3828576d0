"""The ``local`` runtime: the workload as a process group of its own on the agent's machine.

Attempts start in one of two ways (docs/local-environment.md, "How attempts start"):

* ``forkserver`` (default): a warm parent per runtime (``controlplane.runtimes.zygote``) has
  the workload's imports done and forks a child per attempt, a few ms of CPU instead of an
  interpreter start plus numpy/boto3 imports (~0.5 s). If the warm parent dies the next
  start makes a new one; if it cannot start, attempts fall back to ``subprocess`` (logged).
* ``subprocess``: ``python -u -m controlplane.workload`` per attempt. Forced with
  ``GAMEDAY_LOCAL_RUNTIME_START=subprocess`` (or ``LocalRuntime(start_method=...)``).

Either way each workload runs at a lower CPU priority than the agent (``nice`` 10 by default,
``GAMEDAY_LOCAL_RUNTIME_NICE``), as Kubernetes reserves CPU for the kubelet: a busy workload
cannot starve the agent that claims, starts, heartbeats and reports for it. Each workload gets
its own session (so a stop reaches any grandchildren) and dies with the agent: the workload
sets PR_SET_PDEATHSIG on itself (``--parent-pid``) against its parent. Linux delivers that
signal when the *thread* that forked exits: the zygote forks from its only thread, and it
exits when its socket to the agent closes (agent death); on the ``subprocess`` path the caller
must start the workload from a thread that outlives it (the agent's per-attempt runner does).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import IO

from controlplane.runtimes.base import LaunchSpec, Outcome, RunResult, workload_args
from controlplane.runtimes.forkserver import ForkedProcess, ForkServer, ForkServerError
from controlplane.workload.events import WorkloadEvent, parse_line

log = logging.getLogger(__name__)

EXIT_INVALID = 2
_REPO_ROOT = str(Path(__file__).resolve().parents[2])
START_ENV = "GAMEDAY_LOCAL_RUNTIME_START"
START_METHODS = ("forkserver", "subprocess")
NICE_ENV = "GAMEDAY_LOCAL_RUNTIME_NICE"
DEFAULT_NICE = 10
RETRY_FORKSERVER_SECONDS = 60.0  # after a failed start of the warm parent: plain path meanwhile


class LocalRunHandle:
    def __init__(self, process: subprocess.Popen[str] | ForkedProcess,
                 stdout: IO[str] | None = None) -> None:
        self.process = process
        self._stdout = stdout if stdout is not None else process.stdout  # type: ignore[union-attr]
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
        assert self._stdout is not None
        with self._stdout:
            for line in self._stdout:
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
            lost = getattr(self.process, "lost_reason", None)
            why = f": {lost}" if lost and not self._stopped_by_agent else ""
            return RunResult(Outcome.FAILED, f"workload {who} (signal {-code}){why}",
                             exit_code=code)
        return RunResult(Outcome.FAILED, f"workload exited {code}: {tail}", exit_code=code)

    def pending_reason(self) -> str | None:
        return None

    def wait(self, timeout: float) -> None:
        # ForkedProcess waits on an event set by the zygote's exit message; Popen polls
        # waitpid with short sleeps. Either way the runner learns of the exit at once.
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=timeout)

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


def workload_nice(value: int | None = None) -> int:
    """Workloads' niceness increment: ``value``, else $GAMEDAY_LOCAL_RUNTIME_NICE, else 10."""
    raw: object = value if value is not None else os.environ.get(NICE_ENV, DEFAULT_NICE)
    try:
        nice = int(str(raw))
    except ValueError:
        nice = -1
    if not 0 <= nice <= 19:
        raise ValueError(f"{NICE_ENV}={raw!r}: expected a whole number from 0 (the agent's "
                         "priority) to 19 (the lowest)")
    return nice


class LocalRuntime:
    name = "local"

    def __init__(self, python: str = sys.executable, extra_env: dict[str, str] | None = None,
                 start_method: str | None = None, nice: int | None = None) -> None:
        self.python = python
        self.extra_env = extra_env or {}
        method = start_method or os.environ.get(START_ENV) or "forkserver"
        if method not in START_METHODS:
            raise ValueError(f"{START_ENV}={method!r}: expected one of {list(START_METHODS)}")
        self.start_method = method
        self.nice = workload_nice(nice)
        self._server: ForkServer | None = None
        self._server_lock = threading.Lock()
        self._retry_forkserver_at = 0.0
        self._fallback_logged = False
        self.forkservers_started = 0  # > 1: a warm parent died and was replaced

    def _base_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.extra_env)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_REPO_ROOT, env.get("PYTHONPATH")]))
        return env

    def start(self, spec: LaunchSpec) -> LocalRunHandle:
        args = workload_args(spec)
        env = self._base_env()
        env.update({
            "GAMEDAY_OPERATION_ID": spec.operation_id,
            "GAMEDAY_ATTEMPT_ID": spec.attempt_id,
            "GAMEDAY_IMAGE": spec.image,  # the resolved digest: evidence of what "ran"
        })
        if self.start_method == "forkserver":
            for _ in range(2):  # a second try: the warm parent may have died just now
                server = self._forkserver()
                if server is None:
                    break
                try:
                    return self._start_forked(server, args, env)
                except ForkServerError as exc:
                    log.warning("local runtime: %s; trying again (a dead warm parent is replaced)", exc)
        return self._start_plain(args, env)

    def prepare(self) -> None:
        """Start the warm parent now rather than at the first attempt. Its start (imports of
        numpy and boto3, about 0.5 s of CPU) otherwise delays every attempt that arrives while
        it runs: under a steady stream, the first second's worth of a fresh agent's work."""
        if self.start_method == "forkserver":
            self._forkserver()

    def _forkserver(self) -> ForkServer | None:
        """The running warm parent, started (or restarted) here; None: use the plain path."""
        with self._server_lock:
            if self._server is not None and self._server.alive:
                return self._server
            if time.monotonic() < self._retry_forkserver_at:
                return None
            if self._server is not None:
                log.warning("local runtime: warm parent pid %s is gone; starting a new one",
                            self._server.pid)
            server = ForkServer(self.python, self._base_env())
            try:
                server.start()
            except (ForkServerError, OSError) as exc:
                self._server = None
                self._retry_forkserver_at = time.monotonic() + RETRY_FORKSERVER_SECONDS
                level = logging.DEBUG if self._fallback_logged else logging.WARNING
                log.log(level, "local runtime: warm parent could not start (%s); attempts start "
                        "as plain subprocesses (retried in %.0f s)", exc, RETRY_FORKSERVER_SECONDS)
                self._fallback_logged = True
                return None
            self._server = server
            self.forkservers_started += 1
            log.info("local runtime: warm parent pid %s ready", server.pid)
            return server

    def _start_forked(self, server: ForkServer, args: list[str], env: dict[str, str]
                      ) -> LocalRunHandle:
        argv = [*args, "--parent-pid", str(server.pid)]
        read_fd, write_fd = os.pipe()
        try:
            process = server.spawn(argv, env, [self.python, "-u", "-m", "controlplane.workload",
                                               *argv], write_fd, nice=self.nice)
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)  # the child has its own copy: EOF when it (and its group) exit
        return LocalRunHandle(process, open(read_fd, encoding=None))

    def _start_plain(self, args: list[str], env: dict[str, str]) -> LocalRunHandle:
        argv = [self.python, "-u", "-m", "controlplane.workload", *args,
                "--parent-pid", str(os.getpid())]
        process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            text=True, bufsize=1, env=env, start_new_session=True,
        )
        # Set from here, not by a preexec_fn (unsafe in the agent's threads). Not atomic with
        # the start: the new interpreter normally spends tens of ms starting up before the
        # workload's own code (or any child of it) runs, and a child started earlier would
        # keep the agent's priority.
        with contextlib.suppress(ProcessLookupError):
            os.setpriority(os.PRIO_PROCESS, process.pid, os.getpriority(os.PRIO_PROCESS, 0)
                           + self.nice)
        return LocalRunHandle(process)

    def close(self) -> None:
        """Stop the warm parent (its running workloads are killed with it)."""
        with self._server_lock:
            server, self._server = self._server, None
        if server is not None:
            server.close()
