"""The disk's own commit latency: what every durable acknowledgement waits for.

A durable 201 waits for PostgreSQL's WAL flush, so no control-plane change can make its tail
shorter than the disk's. `DiskWatch` times an 8 KiB write + fdatasync at a low, steady rate in
a thread while a benchmark round runs, on the filesystem that holds the database, so each
round's latency can be read next to the stalls the disk had meanwhile. `gameday bench disk`
runs the same probe alone.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click

from gameday.bench_runtime import percentile

BLOCK = 8192  # one PostgreSQL WAL page
FILE_BYTES = 1 << 20  # written in full first, so a sample never allocates blocks
STALL_MS = 50.0  # the half-load p99 target of the submit path


class DiskProbeFailed(click.ClickException):
    """The probe could not write or flush: a clear error (exit 1), never a traceback nor a
    round shown without the disk figures it claims to have next to it."""


@dataclass(frozen=True)
class DiskFigures:
    samples: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    stalls: int  # samples over the threshold
    stalled_s: float  # their summed duration: time the disk held every commit
    threshold_ms: float

    def line(self) -> str:
        return f"disk fdatasync p50 {self.p50_ms:.2f} ms, {stalls_text(asdict(self))}"


def stalls_text(figures: Mapping[str, Any]) -> str:
    """The stall part of a disk line, from `DiskFigures` as a dict (as the JSON keeps it)."""
    return (f"max {figures['max_ms']:.0f} ms, {figures['stalls']} over "
            f"{figures['threshold_ms']:g} ms ({figures['stalled_s']:.2f} s)")


def disk_figures(latencies_ms: Sequence[float], threshold_ms: float = STALL_MS) -> DiskFigures:
    """Summary of timed write + fdatasync samples (milliseconds)."""
    if not latencies_ms:
        raise ValueError("no disk sample was taken")
    over = [x for x in latencies_ms if x > threshold_ms]
    return DiskFigures(samples=len(latencies_ms),
                       p50_ms=round(percentile(latencies_ms, 50), 2),
                       p99_ms=round(percentile(latencies_ms, 99), 2),
                       max_ms=round(max(latencies_ms), 2), stalls=len(over),
                       stalled_s=round(sum(over) / 1000, 3), threshold_ms=threshold_ms)


class DiskWatch:
    """``with DiskWatch(dir) as w: ...; w.figures()``: samples in a thread while the block runs.

    At the default 20 samples/s a stall of 50 ms or more always catches a sample (the next
    one starts within 50 ms and waits out the rest), and the probe adds a few per cent to
    the hundreds of WAL flushes a loaded PostgreSQL does per second.
    """

    def __init__(self, directory: Path, rate: float = 20.0, threshold_ms: float = STALL_MS):
        if rate <= 0:
            raise ValueError(f"rate must be > 0 samples/s, got {rate}")
        self.directory = Path(directory)
        self.interval = 1.0 / rate
        self.threshold_ms = threshold_ms
        self.latencies_ms: list[float] = []
        self.cpu_seconds = 0.0  # the probe thread's own CPU: callers subtract it from theirs
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._fd = -1
        self._path: Path | None = None
        self._error: BaseException | None = None

    def __enter__(self) -> DiskWatch:
        try:
            fd, name = tempfile.mkstemp(prefix=".gameday-disk-", dir=self.directory)
            self._fd, self._path = fd, Path(name)
            os.write(fd, b"\0" * FILE_BYTES)
            os.fsync(fd)
        except BaseException as exc:
            self._close()
            if isinstance(exc, OSError):
                raise self._failed(exc) from exc
            raise
        self._thread = threading.Thread(target=self._sample, name="disk-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._close()
        if self._error is not None and exc[0] is None:
            raise self._failed(self._error)

    def _failed(self, error: BaseException) -> DiskProbeFailed:
        return DiskProbeFailed(f"disk probe in {self.directory} failed: {error}")

    def _close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._path is not None:
            self._path.unlink(missing_ok=True)
            self._path = None

    def _sample(self) -> None:
        page = b"\x5a" * BLOCK
        offset = 0
        next_at = time.monotonic()
        try:
            while not self._stop.is_set():
                t0 = time.monotonic()
                os.pwrite(self._fd, page, offset)
                os.fdatasync(self._fd)
                self.latencies_ms.append((time.monotonic() - t0) * 1000)
                offset = (offset + BLOCK) % FILE_BYTES
                next_at = max(next_at + self.interval, time.monotonic())
                self._stop.wait(next_at - time.monotonic())
        except OSError as exc:
            self._error = exc
        finally:
            self.cpu_seconds = time.thread_time()

    def figures(self) -> DiskFigures:
        return disk_figures(list(self.latencies_ms), self.threshold_ms)


@click.command("disk")
@click.option("--seconds", default=60.0, show_default=True, help="How long to sample.")
@click.option("--rate", default=300.0, show_default=True,
              help="Write + fdatasync samples per second (a loaded PostgreSQL flushes its WAL "
              "a few hundred times a second).")
@click.option("--dir", "directory", type=click.Path(file_okay=False, exists=True, path_type=Path),
              default=Path(tempfile.gettempdir()), show_default=True,
              help="Directory on the filesystem to probe (the benchmark's PostgreSQL lives in "
              "the temporary directory).")
@click.option("--json-out", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the figures as JSON here.")
def disk_cmd(seconds: float, rate: float, directory: Path, json_out: Path | None) -> None:
    """The disk's commit latency alone: 8 KiB write + fdatasync at a steady rate.

    Every durable acknowledgement waits for one such flush, so a stall here is a floor under
    the submit path's tail latency that no control-plane change can lower. Run it on a quiet
    machine to see what the disk does by itself."""
    if seconds <= 0:
        raise click.BadParameter(f"must be > 0, got {seconds}", param_hint="--seconds")
    if rate <= 0:
        raise click.BadParameter(f"must be > 0, got {rate}", param_hint="--rate")
    click.echo(f"sampling {directory} for {seconds:g} s at {rate:g}/s ...", err=True)
    with DiskWatch(directory, rate=rate) as watch:
        time.sleep(seconds)
    figures = watch.figures()
    click.echo(figures.line(), err=True)
    doc = {"directory": str(directory), "rate_per_s": rate, **asdict(figures)}
    click.echo(json.dumps(doc, indent=2))
    if json_out:
        json_out.write_text(json.dumps(doc, indent=2))
