"""Preflight checks, stale-mount cleanup and the serving process (``python -m
environments.local.faultfs``).

The FUSE loop (mfusepy over libfuse3, one thread per request) runs in a thread; the main
thread keeps Python's signal handling. SIGTERM/SIGINT/SIGHUP = clean shutdown: unsynced data is
written back and fsynced (as umount of a real filesystem would), the loop is told to exit, and
libfuse unmounts. A SIGKILL loses the unsynced data (a power loss); the ``auto_unmount``
helper (fusermount3, its own process) then removes the mount, and ``clear_stale`` removes any
stale one left by other means (``fusermount3 -u -z``) before the next mount.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from types import ModuleType

from environments.local.faultfs.control import ControlServer
from environments.local.faultfs.errors import FuseUnavailable, MountFailed
from environments.local.faultfs.fs import FaultFs
from environments.local.faultfs.stats import Stats

FUSERMOUNT = "fusermount3"
FUSE_DEVICE = "/dev/fuse"
WAKE_SIGNAL = signal.SIGUSR1


def check_fuse() -> None:
    """Everything the mount needs from the machine, or FuseUnavailable naming what is not."""
    try:
        st = os.stat(FUSE_DEVICE)
    except FileNotFoundError:
        raise FuseUnavailable(f"{FUSE_DEVICE} does not exist (no FUSE in this kernel or "
                              "container; containers need --device /dev/fuse)") from None
    if not stat.S_ISCHR(st.st_mode) or not os.access(FUSE_DEVICE, os.R_OK | os.W_OK):
        raise FuseUnavailable(f"{FUSE_DEVICE} is not a read-write character device for uid "
                              f"{os.geteuid()}")
    if shutil.which(FUSERMOUNT) is None:
        raise FuseUnavailable(f"{FUSERMOUNT} not found: apt-get install fuse3")
    if ctypes.util.find_library("fuse3") is None:
        raise FuseUnavailable("libfuse3 not found: apt-get install libfuse3-3 (package fuse3)")
    if os.geteuid() != 0:
        # allow_other (so that the postgres user can use a mount made by the harness)
        with contextlib.suppress(OSError), open("/etc/fuse.conf") as conf:
            if any(line.strip() == "user_allow_other" for line in conf):
                return
        raise FuseUnavailable("allow_other needs root or user_allow_other in /etc/fuse.conf")


def load_binding() -> ModuleType:
    # mfusepy picks libfuse2 when both are installed; the options used here are libfuse3's
    os.environ["FUSE_LIBRARY_NAME"] = "fuse3"
    try:
        import mfusepy
    except ImportError as exc:
        raise FuseUnavailable(f"the mfusepy binding is not installed ({exc}): "
                              "pip install -e '.[harness]'") from exc
    except OSError as exc:  # mfusepy loads libfuse when imported
        raise FuseUnavailable(f"mfusepy could not load libfuse3: {exc}") from exc
    if mfusepy.fuse_version_major != 3:
        raise FuseUnavailable(f"mfusepy loaded libfuse {mfusepy.fuse_version_major}, not 3")
    return mfusepy


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def fuse_mounts() -> dict[str, str]:
    """Mount point -> filesystem type of every FUSE mount in this mount namespace."""
    out: dict[str, str] = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fstype = right.split(" ", 1)[0]
            if fstype == "fuse" or fstype.startswith(("fuse.", "fuseblk")):
                out[_unescape(left.split(" ")[4])] = fstype
    return out


def is_mounted(mount: str) -> bool:
    return os.path.realpath(mount) in fuse_mounts()


def _probe_within(probe: Callable[[str], object], path: str,
                  timeout: float) -> OSError | None | str:
    """``probe(path)`` in a thread: a hung FUSE server must not hang the caller. None = it
    answered, an OSError = it failed, "timeout" = no answer."""
    result: list[OSError | None] = []

    def run() -> None:
        try:
            probe(path)
            result.append(None)
        except OSError as exc:
            result.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    return result[0] if result else "timeout"


def clear_stale(mount: str) -> bool:
    """Lazily unmount a dead FUSE mount left on ``mount`` (its server was killed: "transport
    endpoint is not connected"). A live one is an error: it belongs to someone."""
    mount = os.path.realpath(mount)
    if mount not in fuse_mounts():
        return False
    probe = _probe_within(os.statvfs, mount, 2.0)  # statfs always reaches the server
    if probe is None:
        raise MountFailed(f"{mount} is already a live FUSE mount (another faultfs?); "
                          f"unmount it first: {FUSERMOUNT} -u {mount}")
    if probe == "timeout":
        raise MountFailed(f"{mount} is a FUSE mount that does not answer (server stopped?); "
                          f"{FUSERMOUNT} -u -z {mount} detaches it")
    if isinstance(probe, OSError) and probe.errno != errno.ENOTCONN:
        raise MountFailed(f"cannot inspect the mount on {mount}: {probe}")
    subprocess.run([FUSERMOUNT, "-u", "-z", mount], check=False, capture_output=True, timeout=10)
    if mount in fuse_mounts():
        raise MountFailed(f"{FUSERMOUNT} -u -z {mount} left the stale mount in place")
    return True


def check_dirs(source: str, mount: str) -> tuple[str, str]:
    src, mnt = os.path.realpath(source), os.path.realpath(mount)
    for name, path in (("source", src), ("mount", mnt)):
        if not os.path.isdir(path):
            raise MountFailed(f"--{name} {path} is not a directory")
    if src == mnt or mnt.startswith(src + os.sep) or src.startswith(mnt + os.sep):
        raise MountFailed(f"--source {src} and --mount {mnt} must not contain each other")
    return src, mnt


def _close_fuse_fds() -> None:
    """Close this process's /dev/fuse descriptors: once no thread reads it any more, the kernel
    aborts the connection (waiting callers get ENOTCONN) instead of waiting for answers."""
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{name}") == FUSE_DEVICE:
                os.close(int(name))


def _libfuse_controls() -> tuple[Callable[[], None], Callable[[str], None]]:
    """fuse_exit and fuse_invalidate_path bound to the mounted filesystem's struct fuse,
    captured from a request context (fuse_get_context() is only valid on a libfuse thread)."""
    lib = ctypes.CDLL(ctypes.util.find_library("fuse3"))
    lib.fuse_get_context.restype = ctypes.POINTER(ctypes.c_void_p)  # first field: struct fuse *
    lib.fuse_exit.argtypes = [ctypes.c_void_p]
    lib.fuse_invalidate_path.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    fuse_ptr = lib.fuse_get_context().contents.value

    def invalidate(path: str) -> None:
        lib.fuse_invalidate_path(fuse_ptr, os.fsencode(path))  # -ENOENT if never looked up

    return (lambda: lib.fuse_exit(fuse_ptr)), invalidate


def serve(source: str, mount: str, port: int, max_unsynced: int, *, page_cache: bool = False,
          announce: Callable[[str], None] = print) -> None:
    """Mount and serve until a signal. Without ``page_cache`` every read and write reaches
    the filesystem (direct_io: faults are never bypassed by cached pages, but shared mmap of
    files fails with ENODEV); with it the kernel caches pages as usual."""
    src, mnt = check_dirs(source, mount)
    check_fuse()
    fuse = load_binding()
    clear_stale(mnt)
    os.umask(0)  # modes pass through exactly as the caller asked (the kernel applied its umask)
    fs = FaultFs(src, stats=Stats(), max_unsynced=max_unsynced, context=fuse.fuse_get_context)
    server = ControlServer(port, fs, src, mnt)  # bound now: a taken port fails before mounting
    stop, mounted = threading.Event(), threading.Event()
    exit_loop: list[Callable[[], None]] = []

    def on_init() -> None:
        fuse_exit, fs.invalidate = _libfuse_controls()
        exit_loop.append(fuse_exit)
        threading.Thread(target=server.serve_forever, name="faultfs-control", daemon=True).start()
        mounted.set()
        announce(f"faultfs: mounted {src} on {mnt}; control http://127.0.0.1:{server.port}")

    fs.on_init = on_init
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())  # libfuse leaves non-default handlers alone
    signal.signal(WAKE_SIGNAL, lambda *_: None)  # only to interrupt the loop's sem_wait
    failure: list[BaseException] = []

    def loop() -> None:
        try:
            fuse.FUSE(fs, mnt, foreground=True, allow_other=True, default_permissions=True,
                      use_ino=True, direct_io=not page_cache, auto_unmount=True, fsname="faultfs",
                      subtype="faultfs", max_threads=64)
        except BaseException as exc:  # noqa: BLE001 (the main thread reports it)
            failure.append(exc)

    worker = threading.Thread(target=loop, name="faultfs-fuse")
    worker.start()
    try:
        while worker.is_alive() and not stop.wait(0.2):
            pass
        if stop.is_set() and worker.is_alive():
            fs.stopping.set()  # injected delays end now
            try:
                fs.sync_all()
            except OSError as exc:  # still unmount: a failed write-back is reported, not fatal
                print(f"faultfs: write-back at shutdown failed: {exc}", file=sys.stderr)
            if exit_loop:
                exit_loop[0]()
            # libfuse's loop thread sleeps in sem_wait until a worker finishes a request; a
            # signal interrupts it. (A request to our own mount from here could be read and
            # dropped by a worker that is exiting: this thread would then wait for an answer
            # forever, and the process could never exit.)
            deadline = time.monotonic() + 10.0
            while worker.is_alive() and time.monotonic() < deadline:
                if worker.ident is not None:
                    signal.pthread_kill(worker.ident, WAKE_SIGNAL)
                worker.join(0.2)
            if worker.is_alive():  # a request still running: abort the connection, detach
                _close_fuse_fds()
                subprocess.run([FUSERMOUNT, "-u", "-z", mnt], check=False, capture_output=True)
                os._exit(1)
    finally:
        if mounted.is_set():
            server.shutdown()
        server.server_close()
    if not mounted.is_set():
        reason = f"{type(failure[0]).__name__}: {failure[0]}" if failure else "no reason given"
        raise MountFailed(f"libfuse did not mount {src} on {mnt} ({reason}); "
                          "libfuse's own message is on stderr above")
