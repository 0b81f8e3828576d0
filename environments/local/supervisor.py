"""The per-environment supervisor: spawns every component, reaps every exit, kills on shutdown.

One small daemon per environment (``python -m environments.local.supervisor --state DIR``):

* it is a *child subreaper* (``PR_SET_CHILD_SUBREAPER``), so processes that double-fork away
  from their parent (Patroni starts postgres that way) are re-parented to it and reaped at
  once. This machine's PID 1 reaps late, and a zombie postmaster makes a restart fail with
  "lock file already exists" (docs/DESIGN.md section 8.4);
* every component is started in its own session (``start_new_session=True``), so its
  process group can be signalled as one; logs go to ``<state>/logs/<name>.log``;
* while ``up`` is running it watches the launching process (``--owner-pid``): if the
  launcher dies before it calls ``detach`` (crash, SIGKILL, Ctrl-C), the supervisor kills
  everything it started and exits, so a crashed ``up`` leaves no orphan;
* ``shutdown`` sends SIGCONT + SIGTERM to every descendant, SIGKILL after a grace period,
  reaps, and exits.

Protocol: one JSON object per line over a Unix socket, one JSON answer per request.
Imports are kept to the standard library so the daemon starts in ~50 ms.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from environments.local import procs

PR_SET_CHILD_SUBREAPER = 36


class SupervisorError(RuntimeError):
    """The supervisor could not be reached or refused a request."""


def socket_address(state_dir: Path) -> str:
    """Unix socket path, or an abstract-namespace name when the path would be too long."""
    path = state_dir.resolve() / "run" / "supervisor.sock"
    if len(str(path)) < 100:
        return str(path)
    return "\0gameday-supervisor-" + hashlib.sha1(str(path).encode()).hexdigest()[:16]


class Daemon:
    def __init__(self, state_dir: Path, owner_pid: int | None) -> None:
        self.state_dir = state_dir.resolve()
        self.owner_pid = owner_pid
        self.children: dict[int, dict[str, Any]] = {}  # pid -> {name, returncode}
        self.popens: dict[int, subprocess.Popen[bytes]] = {}
        self.exits: dict[int, int] = {}  # reaped pid -> status (children and adopted orphans)
        self.lock = threading.Lock()
        self.stopping = threading.Event()

    # -- requests ---------------------------------------------------------------------------
    def spawn(self, req: dict[str, Any]) -> dict[str, Any]:
        log_path = Path(req["log"])
        log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(req.get("env") or {})
        env[procs.MARKER_VAR] = str(self.state_dir)
        kwargs: dict[str, Any] = {}
        user = req.get("user")
        if user and os.geteuid() == 0:
            import pwd

            entry = pwd.getpwnam(user)
            kwargs.update(user=entry.pw_uid, group=entry.pw_gid, extra_groups=[])
            env.update(HOME=entry.pw_dir, USER=user, LOGNAME=user)
        # Started and registered under the lock: the reaper records an exit only while holding
        # it, so an exit already in `exits` for this pid belongs to an earlier process that had
        # the same pid (pids are reused; thousands of workload processes are reaped here), and
        # must not be taken for this one's. This one's exit, however early, is recorded after.
        with open(log_path, "ab", buffering=0) as log, self.lock:
            log.write(f"\n--- {time.strftime('%Y-%m-%dT%H:%M:%S')} start {req['name']}: "
                      f"{' '.join(req['argv'])}\n".encode())
            proc = subprocess.Popen(
                req["argv"], cwd=req.get("cwd") or str(self.state_dir), env=env,
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, close_fds=True, **kwargs,
            )
            # Keep the Popen object: dropping it would let subprocess reap the pid behind the
            # reaper thread's back and lose the exit status.
            self.popens[proc.pid] = proc
            self.exits.pop(proc.pid, None)
            self.children[proc.pid] = {"name": req["name"], "returncode": None}
        info = procs.read_stat(proc.pid)
        return {"pid": proc.pid, "pgid": proc.pid, "start_ticks": info.start_ticks if info else None}

    def ps(self, _req: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            return {"children": {str(pid): dict(c) for pid, c in self.children.items()},
                    "owner_pid": self.owner_pid}

    def detach(self, _req: dict[str, Any]) -> dict[str, Any]:
        self.owner_pid = None
        return {"ok": True}

    def shutdown(self, req: dict[str, Any]) -> dict[str, Any]:
        left = self.kill_all(float(req.get("grace", 3.0)))
        self.stopping.set()
        return {"ok": True, "left": left}

    # -- machinery --------------------------------------------------------------------------
    def kill_all(self, grace: float) -> list[int]:
        me = os.getpid()
        pids = procs.descendants(me)
        groups = {info.pgid for info in map(procs.read_stat, pids) if info is not None}
        groups.discard(os.getpgid(me))
        for pgid in groups:
            procs.signal_group(pgid, signal.SIGCONT)
        procs.signal_pids(pids, signal.SIGCONT)
        for pgid in groups:
            procs.signal_group(pgid, signal.SIGTERM)
        procs.signal_pids(pids, signal.SIGTERM)
        alive = procs.wait_gone(pids, grace)
        # Late descendants (e.g. a postmaster forked during shutdown) are killed too.
        alive = sorted(set(alive) | set(procs.descendants(me)))
        for pgid in groups:
            procs.signal_group(pgid, signal.SIGKILL)
        procs.signal_pids(alive, signal.SIGKILL)
        return procs.wait_reaped(alive + pids, 3.0)

    def reap_forever(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                time.sleep(0.05)
                continue
            except InterruptedError:
                continue
            code = os.waitstatus_to_exitcode(status)
            with self.lock:
                self.exits[pid] = code
                if pid in self.children:
                    self.children[pid]["returncode"] = code

    def watch_owner(self) -> None:
        while not self.stopping.is_set():
            owner = self.owner_pid
            if owner is not None and not procs.is_alive(owner):
                sys.stderr.write(f"owner {owner} died before detach: killing everything\n")
                self.kill_all(1.0)
                self.stopping.set()
                return
            time.sleep(0.2)


def serve(state_dir: Path, owner_pid: int | None) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - non-Linux
        sys.stderr.write("warning: could not become a child subreaper\n")
    daemon = Daemon(state_dir, owner_pid)
    handlers = {"spawn": daemon.spawn, "ps": daemon.ps, "detach": daemon.detach,
                "shutdown": daemon.shutdown, "ping": lambda _r: {"ok": True, "pid": os.getpid()}}

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            for line in self.rfile:
                try:
                    req = json.loads(line)
                    answer = handlers[req["op"]](req)
                except Exception as exc:  # noqa: BLE001 - a bad request becomes an answer, never a crash
                    answer = {"error": f"{type(exc).__name__}: {exc}"}
                self.wfile.write((json.dumps(answer) + "\n").encode())

    address = socket_address(state_dir)
    if not address.startswith("\0"):
        Path(address).parent.mkdir(parents=True, exist_ok=True)
        Path(address).unlink(missing_ok=True)

    class Server(socketserver.ThreadingUnixStreamServer):
        daemon_threads = True

    server = Server(address, Handler)
    signal.signal(signal.SIGTERM, lambda *_: daemon.stopping.set())
    for target in (daemon.reap_forever, daemon.watch_owner, server.serve_forever):
        threading.Thread(target=target, daemon=True).start()
    (state_dir / "run").mkdir(parents=True, exist_ok=True)
    (state_dir / "run" / "supervisor.ready").write_text(str(os.getpid()))
    daemon.stopping.wait()
    if procs.descendants(os.getpid()):
        daemon.kill_all(2.0)
    server.shutdown()
    if not address.startswith("\0"):
        Path(address).unlink(missing_ok=True)
    (state_dir / "run" / "supervisor.ready").unlink(missing_ok=True)


class SupervisorClient:
    def __init__(self, state_dir: Path, timeout: float = 15.0) -> None:
        self.address = socket_address(state_dir)
        self.timeout = timeout

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(self.timeout)
                sock.connect(self.address)
                sock.sendall((json.dumps({"op": op, **fields}) + "\n").encode())
                data = b""
                while not data.endswith(b"\n"):
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    data += chunk
        except OSError as exc:
            raise SupervisorError(f"supervisor at {self.address!r} unreachable: {exc}") from exc
        if not data:
            raise SupervisorError(f"supervisor closed the connection during {op!r}")
        answer = json.loads(data)
        if "error" in answer:
            raise SupervisorError(f"supervisor refused {op!r}: {answer['error']}")
        return answer

    def alive(self) -> bool:
        try:
            self.call("ping")
        except SupervisorError:
            return False
        return True


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state", required=True, type=Path)
    parser.add_argument("--owner-pid", type=int)
    args = parser.parse_args(argv)
    serve(args.state, args.owner_pid)


if __name__ == "__main__":
    main()
