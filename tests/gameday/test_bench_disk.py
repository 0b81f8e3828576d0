"""The disk probe: its arithmetic, that it really samples the directory, and that it cleans up."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from gameday.bench_disk import DiskProbeFailed, DiskWatch, disk_figures
from gameday.bench_submit import submit_summary


def test_stalls_are_the_samples_over_the_threshold_and_their_time() -> None:
    f = disk_figures([0.3] * 97 + [40.0, 60.0, 1200.0], threshold_ms=50.0)
    assert (f.samples, f.stalls, f.stalled_s, f.max_ms, f.p50_ms) == (100, 2, 1.26, 1200.0, 0.3)
    assert f.p99_ms == 60.0  # nearest rank: the 99th of 100
    assert "max 1200 ms, 2 over 50 ms (1.26 s)" in f.line()
    with pytest.raises(ValueError, match="no disk sample"):
        disk_figures([])


def test_the_watch_times_flushes_in_the_directory_and_leaves_nothing(tmp_path: Path) -> None:
    with DiskWatch(tmp_path, rate=50) as watch:
        probe = list(tmp_path.iterdir())
        assert len(probe) == 1 and probe[0].stat().st_size == 1 << 20
        time.sleep(0.5)
    assert list(tmp_path.iterdir()) == []  # the probe file is gone
    n = len(watch.latencies_ms)
    assert 10 <= n <= 30, n  # ~25 at 50/s over 0.5 s: paced, not a busy loop
    assert all(x > 0 for x in watch.latencies_ms)
    assert 0 < watch.cpu_seconds < 0.5  # the thread's own CPU, for the client's figure
    time.sleep(0.1)
    assert len(watch.latencies_ms) == n  # the thread stopped with the block


def test_a_failing_disk_is_an_error_not_a_quiet_zero(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", broken)
    with (pytest.raises(DiskProbeFailed, match="disk probe .* failed: .*Input/output error"),
          DiskWatch(tmp_path, rate=50)):
        time.sleep(0.1)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("fails", ["fsync", "fdatasync"])
def test_a_failing_disk_ends_the_command_with_a_message_not_a_traceback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails: str) -> None:
    """While the probe starts (fsync of its file) or while it samples (fdatasync)."""
    from gameday.cli import main

    def broken(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, fails, broken)
    r = CliRunner().invoke(main, ["bench", "disk", "--seconds", "0.2", "--rate", "50",
                                  "--dir", str(tmp_path)])
    assert r.exit_code == 1, r.output
    assert isinstance(r.exception, SystemExit)  # click's error exit, not an exception escaping
    assert f"Error: disk probe in {tmp_path} failed: [Errno 28] No space left on device" in r.output
    assert "Traceback" not in r.output and "{" not in r.output  # no figures printed
    assert list(tmp_path.iterdir()) == []


def test_bench_disk_prints_json_and_refuses_bad_input(tmp_path: Path) -> None:
    from gameday.cli import main

    runner = CliRunner()
    out = tmp_path / "disk.json"
    r = runner.invoke(main, ["bench", "disk", "--seconds", "0.3", "--rate", "50",
                             "--dir", str(tmp_path), "--json-out", str(out)])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert doc["directory"] == str(tmp_path) and doc["samples"] >= 5
    assert 0 < doc["p50_ms"] <= doc["p99_ms"] <= doc["max_ms"]
    r = runner.invoke(main, ["bench", "disk", "--seconds", "0", "--dir", str(tmp_path)])
    assert r.exit_code == 2 and "--seconds" in r.output


def test_the_summary_shows_each_round_beside_its_disk() -> None:
    lat = {"submissions_per_s": 800.0, "p50_ms": 20.0, "p95_ms": 30.0, "p99_ms": 40.0,
           "errors": 0, "rounds": 2}
    stalled = {"max_ms": 420.0, "stalls": 3, "stalled_s": 0.71, "threshold_ms": 50.0}
    calm = {"max_ms": 3.0, "stalls": 0, "stalled_s": 0.0, "threshold_ms": 50.0}
    text = submit_summary({
        "saturation": {**lat, "concurrency": 32, "per_round": [
            {"submissions_per_s": 512.0, "p99_ms": 390.0, "disk": stalled}]},
        "half_saturation": {**lat, "target_per_s": 400.0, "per_round": [
            {"submissions_per_s": 399.0, "p99_ms": 180.2, "disk": stalled},
            {"submissions_per_s": 400.0, "p99_ms": 31.0, "disk": calm}]},
        "cpu_ms_per_submission": {"api": 0.6}, "acknowledged": 1,
        "acknowledged_and_committed": 1, "rss_mib": {"api": 60.0}, "pss_mib": {"api": 50.0},
    })
    lines = text.splitlines()
    sat_at = next(i for i, x in enumerate(lines) if x.startswith("saturation"))
    half_at = next(i for i, x in enumerate(lines) if x.startswith("half of it"))
    assert lines[sat_at + 1] == ("  round 1: 512/s, p99 390.0 ms; disk fdatasync max 420 ms, "
                                 "3 over 50 ms (0.71 s)")
    assert lines[half_at + 1:half_at + 3] == [
        "  round 1: 399/s, p99 180.2 ms; disk fdatasync max 420 ms, 3 over 50 ms (0.71 s)",
        "  round 2: 400/s, p99 31.0 ms; disk fdatasync max 3 ms, 0 over 50 ms (0.00 s)"]


def test_each_round_keeps_its_own_disk_figures() -> None:
    from gameday.bench_submit import LoadResult, _latency_figures

    def run(ok: int, worst_s: float) -> LoadResult:
        return LoadResult(ok=ok, latencies=[0.001] * (ok - 1) + [worst_s], seconds=1.0)

    calm, stalled = disk_figures([0.3, 0.4]), disk_figures([0.3, 420.0])
    figures = _latency_figures([run(100, 0.001), run(200, 0.5)], [calm, stalled])
    assert [(r["submissions_per_s"], r["p99_ms"], r["disk"]["max_ms"])
            for r in figures["per_round"]] == [(100.0, 1.0, 0.4), (200.0, 1.0, 420.0)]
    with pytest.raises(ValueError):  # a round without its disk figures is an error, not a gap
        _latency_figures([run(100, 0.001)], [])
