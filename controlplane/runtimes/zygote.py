"""The local runtime's warm parent (``python -m controlplane.runtimes.zygote``).

One per agent. It imports the workload once (numpy, boto3, a first S3 client: ~0.5 s of CPU)
and then forks a child per attempt that runs ``controlplane.workload.__main__.main`` without
exec, so an attempt costs a fork instead of an interpreter start and those imports. The
first attempt for an S3 endpoint has that endpoint's client made here too; later ones inherit
it (``warm_client``).

It stays single-threaded in Python (forking a process whose other threads hold locks is
unsafe) and talks to the agent over one SOCK_SEQPACKET socket, one JSON message per packet:

* agent -> zygote: ``{"op": "spawn", "id", "argv", "env", "title"}`` with the write end of
  the workload's stdout pipe attached (SCM_RIGHTS);
* zygote -> agent: ``{"op": "ready", "pid"}`` once, ``{"op": "spawned", "id", "pid"}`` or
  ``{"op": "error", "id", "error"}`` per request, ``{"op": "exit", "pid", "code"}`` per
  reaped child (``code`` as ``Popen.returncode``: negative = killed by that signal).

It dies with the agent: end of file on the socket (the kernel closes it when the agent dies,
even by SIGKILL) or a new parent pid makes it SIGKILL every child's process group and exit.
Children set PR_SET_PDEATHSIG against the zygote (``--parent-pid``), so the chain
agent -> zygote -> workload holds even if the zygote itself is killed.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import itertools
import json
import os
import select
import signal
import socket
import sys
import traceback

MAX_MESSAGE = 1 << 20
TITLE_ROOM = 4096  # bytes of argv a child may rewrite so `ps` shows the workload's command


def preload() -> None:
    """Everything a workload imports or builds before its first step, done once here."""
    import controlplane.workload.__main__
    import controlplane.workload.run  # numpy, boto3 via controlplane.storage
    from controlplane import storage

    controlplane.workload.__main__.parser()

    # The first client loads botocore's S3 model (~150 ms); later ones reuse the loader cache
    # of boto3's default session. Explicit keys: no credential lookup is cached here.
    storage.make_s3_client(storage.StorageConfig(endpoint_url="http://127.0.0.1:9"))


_primed: set[tuple[str, str]] = set()


def warm_client(argv: list[str]) -> None:
    """Make the attempt's S3 client here, once per endpoint, and prime it once per bucket, so
    every fork inherits it ready (storage.shared_s3_client, storage.prime_s3_client). Only for
    an explicit endpoint: its keys are explicit, so no credential lookup is cached in the warm
    parent."""
    from controlplane import storage

    flags = dict(itertools.pairwise(argv))
    endpoint = flags.get("--s3-endpoint")
    if not endpoint:
        return
    bucket = flags.get("--bucket") or storage.DEFAULT_BUCKET
    if (endpoint, bucket) in _primed:
        return
    _primed.add((endpoint, bucket))  # tried once: a failure is not retried per attempt
    client = storage.shared_s3_client(storage.StorageConfig(endpoint_url=endpoint))
    storage.prime_s3_client(client, bucket)
    gc.freeze()  # as after preload(): children's collections skip the new client


def set_cmdline(title: list[str]) -> None:
    """Rewrite /proc/self/cmdline in place (what setproctitle does), so tools that find a
    workload by its command line (ps, tests) see the same argv as a plain subprocess."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[48 - 3]), int(fields[49 - 3])  # arg_start, arg_end (man 5 proc)
    except (OSError, IndexError, ValueError):
        return
    size = end - start
    if size <= 1:
        return
    data = b"\0".join(os.fsencode(a) for a in title)[: size - 1]
    ctypes.memmove(start, data.ljust(size, b"\0"), size)


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def _child(msg: dict, out_fd: int, sync_w: int, keep_closed: list[int]) -> None:
    """In the forked child: become the workload. Never returns."""
    code = 1
    try:
        os.setsid()  # own session and group: stop() signals the group (pgid == pid)
        if msg.get("nice"):
            os.nice(int(msg["nice"]))  # before "spawned": no line of the workload runs ahead
        os.write(sync_w, b"1")  # the zygote answers "spawned" only after this
        os.close(sync_w)
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a fresh interpreter
        for fd in keep_closed:
            with contextlib.suppress(OSError):
                os.close(fd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        os.close(devnull)
        os.close(out_fd)
        os.environ.clear()
        os.environ.update(msg["env"])
        set_cmdline(msg["title"])
        from controlplane.workload.__main__ import main

        sys.argv = [main.__module__, *msg["argv"]]
        try:
            code = main(msg["argv"])
        except SystemExit as exc:
            code = _exit_code(exc)
    except BaseException:  # noqa: BLE001  (as an uncaught exception in `python -m`: exit 1)
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code & 0xFF if code >= 0 else 1)


class Zygote:
    def __init__(self, sock: socket.socket, agent_pid: int) -> None:
        self.sock = sock
        self.agent_pid = agent_pid
        self.children: set[int] = set()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)

    def send(self, msg: dict) -> None:
        self.sock.sendmsg([json.dumps(msg).encode()])

    def spawn(self, msg: dict, fds: list[int]) -> None:
        if len(fds) != 1:
            for fd in fds:
                os.close(fd)
            self.send({"op": "error", "id": msg.get("id"), "error": f"expected 1 fd, got {len(fds)}"})
            return
        out_fd = fds[0]
        try:
            warm_client(list(msg.get("argv") or []))
        except Exception:  # noqa: BLE001  (the child then makes its own and reports any error)
            traceback.print_exc()
        sync_r, sync_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError as exc:  # e.g. EAGAIN at the process limit: this attempt fails, not us
            for fd in (sync_r, sync_w, out_fd):
                os.close(fd)
            self.send({"op": "error", "id": msg.get("id"), "error": f"fork failed: {exc}"})
            return
        if pid == 0:
            os.close(sync_r)
            _child(msg, out_fd, sync_w, [self.sock.fileno(), self.wake_r, self.wake_w])
        os.close(sync_w)
        os.close(out_fd)
        self.children.add(pid)
        os.read(sync_r, 1)  # b"" if the child died first: its exit is reported anyway
        os.close(sync_r)
        self.send({"op": "spawned", "id": msg.get("id"), "pid": pid})

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.children.discard(pid)
            self.send({"op": "exit", "pid": pid, "code": os.waitstatus_to_exitcode(status)})

    def kill_children(self) -> None:
        for pid in list(self.children):
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)  # the group: grandchildren too

    def serve(self) -> int:
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes select via the wakeup fd
        self.send({"op": "ready", "pid": os.getpid()})
        while True:
            ready, _, _ = select.select([self.sock, self.wake_r], [], [], 1.0)
            if self.wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(self.wake_r, 512)
            self.reap()
            if os.getppid() != self.agent_pid:  # agent gone but its socket somehow still open
                self.kill_children()
                return 0
            if self.sock not in ready:
                continue
            data, fds, _, _ = socket.recv_fds(self.sock, MAX_MESSAGE, 4)
            if not data:  # the agent closed the socket or died
                self.kill_children()
                return 0
            msg = json.loads(data)
            if msg.get("op") == "spawn":
                self.spawn(msg, fds)
            else:
                for fd in fds:
                    os.close(fd)
                self.send({"op": "error", "id": msg.get("id"), "error": f"unknown op {msg!r}"})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m controlplane.runtimes.zygote")
    p.add_argument("--fd", type=int, required=True, help="SOCK_SEQPACKET socket to the agent")
    p.add_argument("--agent-pid", type=int, required=True)
    p.add_argument("title_room", nargs="?", help="padding: room for the children's argv")
    args = p.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C is the agent's to handle
    sock = socket.socket(fileno=args.fd)
    if os.getppid() != args.agent_pid:
        return 1
    preload()
    # Children's garbage collections then skip everything preloaded: fewer copy-on-write
    # page copies per fork (gc.freeze's documented use).
    gc.collect()
    gc.freeze()
    return Zygote(sock, args.agent_pid).serve()


if __name__ == "__main__":
    sys.exit(main())
