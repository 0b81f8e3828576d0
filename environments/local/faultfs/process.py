"""Start and stop a faultfs process from the harness or a test: ``with FaultFsProcess(src, mnt)
as ffs: ffs.client.set(fsync_delay_ms=200)``. The process dies with the owner (watchdog.py)
and never leaves a mount behind: SIGTERM, then SIGKILL, then ``fusermount3 -u -z``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from environments.local.faultfs.client import FaultFsClient
from environments.local.faultfs.errors import MountFailed
from environments.local.faultfs.mount import (
    FUSERMOUNT,
    check_dirs,
    check_fuse,
    clear_stale,
    is_mounted,
)


class FaultFsProcess:
    def __init__(self, source: str | Path, mount: str | Path, *, port: int | None = None,
                 log_path: str | Path | None = None, max_unsynced_mib: int = 1024,
                 page_cache: bool = False, start_timeout: float = 15.0) -> None:
        self.source, self.mount = os.path.realpath(source), os.path.realpath(mount)
        self.port = port
        self._log_path = Path(log_path) if log_path else None
        self.max_unsynced_mib = max_unsynced_mib
        self.page_cache = page_cache
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def client(self) -> FaultFsClient:
        return FaultFsClient(self.url)

    @property
    def log_path(self) -> Path:
        if self._log_path is None:  # chosen on first use: a refused start leaves no file
            fd, name = tempfile.mkstemp(prefix="faultfs-", suffix=".log")
            os.close(fd)
            self._log_path = Path(name)
        return self._log_path

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def start(self) -> FaultFsProcess:
        # the same checks the process makes, here for a clear error without a process
        check_dirs(self.source, self.mount)
        check_fuse()
        clear_stale(self.mount)
        if self.port is None:
            from environments.local.ports import reserve_port

            self.port = reserve_port()
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "environments.local.faultfs", "--source", self.source,
                 "--mount", self.mount, "--control-port", str(self.port),
                 "--max-unsynced-mib", str(self.max_unsynced_mib),
                 *(["--page-cache"] if self.page_cache else [])],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        finally:
            log.close()
        from environments.local.watchdog import watch

        self._watchdog = watch(self.proc.pid)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            rc = self.proc.poll()
            if rc is not None:
                self._reap_watchdog()
                raise MountFailed(f"faultfs exited with {rc} before mounting {self.mount}:\n"
                                  f"{self.log_tail()}")
            if is_mounted(self.mount) and self._answers():
                return self
            time.sleep(0.05)
        self.stop()
        raise MountFailed(f"faultfs did not mount {self.mount} within {self.start_timeout} s:\n"
                          f"{self.log_tail()}")

    def _answers(self) -> bool:
        try:
            return httpx.get(self.url + "/healthz", timeout=0.5).status_code == 200
        except httpx.HTTPError:
            return False

    def _reap_watchdog(self) -> None:
        if self._watchdog is not None:
            if self._watchdog.poll() is None:
                self._watchdog.terminate()
            self._watchdog.wait(5)
            self._watchdog = None

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM (unsynced data is written back), SIGKILL after ``timeout``; the mount is
        gone afterwards in every case. Returns the exit code."""
        rc = None
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.kill()
            rc = self.proc.returncode
        self._reap_watchdog()
        deadline = time.monotonic() + 2.0  # auto_unmount's helper works asynchronously
        while is_mounted(self.mount) and time.monotonic() < deadline:
            time.sleep(0.05)
        if is_mounted(self.mount):
            subprocess.run([FUSERMOUNT, "-u", "-z", self.mount], check=False, capture_output=True)
        return rc

    def kill(self) -> None:
        """SIGKILL: what a crash of the filesystem process looks like (unsynced data lost)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:  # a thread stuck in the kernel; the mount goes
                pass

    def __enter__(self) -> FaultFsProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
