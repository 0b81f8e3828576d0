"""A stopped process is one whose every thread is stopped (environments/local/procs.py): a SIGSTOP
reaches a busy thread on another core after the main one, and a frozen server that still
answered in between failed a frozen-registry test once in CI."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from environments.local import procs

# the main thread sleeps while two others spin: a main-thread-only check calls it stopped
# as soon as the main thread is, whatever the others do
THREADS = """
import threading, time
for _ in range(2):
    threading.Thread(target=lambda: [None for _ in iter(int, 1)], daemon=True).start()
time.sleep(600)
"""


def test_stopped_means_every_thread_and_wait_stopped_waits_for_them() -> None:
    proc = subprocess.Popen([sys.executable, "-c", THREADS], start_new_session=True)
    try:
        time.sleep(0.5)
        assert len(list((procs.Path(f"/proc/{proc.pid}/task")).iterdir())) == 3
        assert procs.read_stat(proc.pid).state == "S"  # main thread asleep ...
        assert not procs.stopped(proc.pid)  # ... but two threads run: not stopped
        proc.send_signal(signal.SIGSTOP)
        assert procs.wait_stopped([proc.pid], 5.0)
        assert procs.stopped(proc.pid)
        proc.send_signal(signal.SIGCONT)
        time.sleep(0.2)
        assert not procs.stopped(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert procs.stopped(proc.pid)  # gone counts as stopped: nothing left to answer
