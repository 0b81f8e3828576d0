"""The agent's side of the warm parent (``controlplane.runtimes.zygote``).

``ForkServer`` starts the zygote, asks it for a child per attempt and learns each child's
exit from it (only the zygote can wait for its children). ``ForkedProcess`` is the part of
``subprocess.Popen`` the local runtime uses (pid, poll, wait), so both start paths share
one handle.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Mapping

from controlplane.runtimes.zygote import MAX_MESSAGE, TITLE_ROOM

log = logging.getLogger(__name__)


class ForkServerError(RuntimeError):
    """The warm parent could not be started, or died before answering."""


class ForkedProcess:
    """A zygote's child as the local runtime sees it: Popen's pid/poll/wait/returncode."""

    def __init__(self, pid: int, args: list[str]) -> None:
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self.lost_reason: str | None = None  # set when the exit is unknown (zygote died)
        self._done = threading.Event()

    def mark_exited(self, code: int, lost_reason: str | None = None) -> None:
        """Called by the ForkServer when the zygote reports the exit (or dies: lost_reason)."""
        if self._done.is_set():
            return
        self.lost_reason = lost_reason
        self.returncode = code
        self._done.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        assert self.returncode is not None
        return self.returncode


class ForkServer:
    """One running zygote. Start it with ``start()``; when ``alive`` is False, make a new one."""

    def __init__(self, python: str, env: Mapping[str, str], ready_timeout: float = 60.0) -> None:
        self.python = python
        self.env = dict(env)
        self.ready_timeout = ready_timeout
        self.pid = 0
        self._sock: socket.socket | None = None
        self._popen: subprocess.Popen[bytes] | None = None
        self._send_lock = threading.Lock()
        self._state = threading.Lock()  # guards the tables below
        self._next_id = 0
        self._waiting: dict[int, tuple[threading.Event, list[object]]] = {}
        self._children: dict[int, ForkedProcess] = {}
        self._dead = threading.Event()

    @property
    def alive(self) -> bool:
        return self._sock is not None and not self._dead.is_set()

    def start(self) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            # Not a new session: `kill` of the agent's process group reaches the zygote too.
            self._popen = subprocess.Popen(
                [self.python, "-u", "-m", "controlplane.runtimes.zygote", "--fd",
                 str(theirs.fileno()), "--agent-pid", str(os.getpid()), " " * TITLE_ROOM],
                pass_fds=[theirs.fileno()], env=self.env, stdin=subprocess.DEVNULL)
        finally:
            theirs.close()
        mine.settimeout(self.ready_timeout)
        try:
            hello = json.loads(mine.recv(MAX_MESSAGE) or b"{}")
        except (OSError, ValueError) as exc:
            self._abort(mine)
            raise ForkServerError(f"warm parent did not become ready: {exc}") from exc
        if hello.get("op") != "ready":
            code = self._abort(mine)
            raise ForkServerError(f"warm parent exited before it was ready (exit {code})")
        mine.settimeout(None)
        self.pid = int(hello["pid"])
        self._sock = mine
        threading.Thread(target=self._read, name=f"forkserver-{self.pid}", daemon=True).start()

    def _abort(self, sock: socket.socket) -> int | None:
        sock.close()
        assert self._popen is not None
        with contextlib.suppress(OSError):
            self._popen.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self._popen.wait(timeout=5)
        return None

    def spawn(self, argv: list[str], env: Mapping[str, str], title: list[str], out_fd: int,
              timeout: float = 30.0, nice: int = 0) -> ForkedProcess:
        """A child running the workload with ``argv``; its stdout/stderr go to ``out_fd``; its
        niceness ``nice`` above the warm parent's."""
        if not self.alive:
            raise ForkServerError("warm parent is not running")
        assert self._sock is not None
        event, box = threading.Event(), []
        with self._state:
            self._next_id += 1
            rid = self._next_id
            self._waiting[rid] = (event, box)
        msg = {"op": "spawn", "id": rid, "argv": argv, "env": dict(env), "title": title,
               "nice": nice}
        try:
            with self._send_lock:
                socket.send_fds(self._sock, [json.dumps(msg).encode()], [out_fd])
        except OSError as exc:
            with self._state:
                self._waiting.pop(rid, None)
            raise ForkServerError(f"warm parent pid {self.pid} unreachable: {exc}") from exc
        if not event.wait(timeout):
            with self._state:
                self._waiting.pop(rid, None)
            raise ForkServerError(f"warm parent pid {self.pid} did not answer in {timeout} s")
        answer = box[0]
        if isinstance(answer, ForkedProcess):
            return answer
        raise ForkServerError(f"warm parent pid {self.pid} could not start the workload: {answer}")

    def _read(self) -> None:
        sock = self._sock
        assert sock is not None
        try:
            while True:
                data = sock.recv(MAX_MESSAGE)
                if not data:
                    break
                self._dispatch(json.loads(data))
        except (OSError, ValueError) as exc:
            log.warning("warm parent pid %s: reading its messages failed: %s", self.pid, exc)
        sock.close()
        self._on_death()

    def _dispatch(self, msg: dict) -> None:
        op = msg.get("op")
        with self._state:
            if op == "spawned":
                child = ForkedProcess(int(msg["pid"]), ["controlplane.workload"])
                self._children[child.pid] = child  # before its exit can be read
                waiter = self._waiting.pop(msg.get("id"), None)
                if waiter is None:  # the caller gave up: nobody will ever stop this one
                    with contextlib.suppress(OSError):
                        os.killpg(child.pid, signal.SIGKILL)
                else:
                    waiter[1].append(child)
                    waiter[0].set()
            elif op == "error":
                waiter = self._waiting.pop(msg.get("id"), None)
                if waiter is not None:
                    waiter[1].append(str(msg.get("error")))
                    waiter[0].set()
            elif op == "exit":
                child = self._children.pop(int(msg["pid"]), None)
                if child is not None:
                    child.mark_exited(int(msg["code"]))

    def _on_death(self) -> None:
        self._dead.set()
        code = None
        if self._popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = self._popen.wait(timeout=5)
        with self._state:
            children, self._children = self._children, {}
            waiting, self._waiting = self._waiting, {}
        if children or code not in (0, None):
            log.warning("warm parent (forkserver) pid %s died (exit %s); %d running workload(s) "
                        "lost with it", self.pid, code, len(children))
        reason = f"the runtime's warm parent pid {self.pid} died (exit {code})"
        for child in children.values():
            # Their exit statuses died with the zygote; PR_SET_PDEATHSIG kills them, and the
            # group kill here reaches grandchildren too.
            with contextlib.suppress(OSError):
                os.killpg(child.pid, signal.SIGKILL)
            child.mark_exited(-signal.SIGKILL, lost_reason=reason)
        for event, box in waiting.values():
            box.append(reason)
            event.set()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the zygote (it SIGKILLs its children's groups first, as on agent death)."""
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # EOF for both; the reader thread closes it
        if self._popen is not None:
            try:
                self._popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._popen.kill()
                self._popen.wait(timeout=5)
        deadline = time.monotonic() + timeout
        while not self._dead.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
