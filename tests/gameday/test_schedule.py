"""Freeze windows and the game-day lock (pure logic + a real file lock)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from environments.schedule import (
    DEFAULT_FREEZE_FILE,
    GameDayLock,
    ScheduleError,
    active_freeze,
    load_freeze_windows,
)


def _windows(tmp_path: Path, text: str) -> list:  # type: ignore[type-arg]
    f = tmp_path / "freeze.yaml"
    f.write_text(text)
    return load_freeze_windows(f)


def test_absolute_window_applies_only_to_its_envs(tmp_path: Path) -> None:
    ws = _windows(tmp_path, """windows:
  - {name: release, envs: [prod], start: "2026-12-01T00:00:00Z", end: "2026-12-02T00:00:00Z"}
""")
    inside = datetime(2026, 12, 1, 12, tzinfo=UTC)
    assert active_freeze(inside, "prod", ws).name == "release"  # type: ignore[union-attr]
    assert active_freeze(inside, "staging", ws) is None
    assert active_freeze(datetime(2026, 12, 2, tzinfo=UTC), "prod", ws) is None


def test_weekly_window_including_one_spanning_midnight(tmp_path: Path) -> None:
    ws = _windows(tmp_path, """windows:
  - {name: business, envs: ["*"], weekly: {days: [mon], from: "08:00", to: "18:00"}}
  - {name: night, envs: [prod], weekly: {days: [fri], from: "22:00", to: "02:00"}}
""")
    monday_noon = datetime(2026, 11, 30, 12, tzinfo=UTC)  # a Monday
    assert active_freeze(monday_noon, "local", ws).name == "business"  # type: ignore[union-attr]
    assert active_freeze(monday_noon.replace(hour=19), "local", ws) is None
    saturday_1am = datetime(2026, 12, 5, 1, tzinfo=UTC)
    assert active_freeze(saturday_1am, "prod", ws).name == "night"  # type: ignore[union-attr]
    assert active_freeze(saturday_1am.replace(hour=3), "prod", ws) is None


def test_bad_freeze_file_names_field(tmp_path: Path) -> None:
    with pytest.raises(ScheduleError, match=r"field windows\.0\.weekly\.days\.0"):
        _windows(tmp_path, "windows:\n  - {name: x, envs: [prod], weekly: {days: [funday], from: '1:00', to: '2:00'}}\n")
    with pytest.raises(ScheduleError, match="give start\\+end or weekly"):
        _windows(tmp_path, "windows:\n  - {name: x, envs: [prod]}\n")


def test_shipped_freeze_file_is_valid() -> None:
    assert {w.name for w in load_freeze_windows(DEFAULT_FREEZE_FILE)}


def test_lock_refuses_a_second_game_day(tmp_path: Path) -> None:
    first = GameDayLock(tmp_path / "gameday.lock")
    first.acquire({"run_id": "one"})
    with pytest.raises(ScheduleError, match=r"already running.*one"):
        GameDayLock(tmp_path / "gameday.lock").acquire({"run_id": "two"})
    first.release()
    second = GameDayLock(tmp_path / "gameday.lock")
    second.acquire({"run_id": "two"})
    second.release()
