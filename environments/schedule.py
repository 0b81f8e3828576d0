"""Scheduling guards: declared freeze windows (no injection inside them) and the one-game-day-
at-a-time lock of an environment."""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime, time
from pathlib import Path
from typing import IO, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

DEFAULT_FREEZE_FILE = Path(__file__).resolve().parent.parent / "chaos" / "freeze-windows.yaml"
DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


class ScheduleError(Exception):
    """A game day may not start now (freeze window, lock held, bad freeze file)."""


class Weekly(BaseModel):
    model_config = ConfigDict(extra="forbid")
    days: list[Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]]
    start: time = Field(alias="from")
    end: time = Field(alias="to")  # UTC; end < start spans midnight


class Window(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    envs: list[str]
    start: datetime | None = None
    end: datetime | None = None
    weekly: Weekly | None = None


class FreezeFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    windows: list[Window] = []


def load_freeze_windows(path: Path) -> list[Window]:
    if not path.exists():
        return []
    try:
        data = yaml.safe_load(path.read_text()) or {}
        windows = FreezeFile.model_validate(data).windows
    except yaml.YAMLError as exc:
        raise ScheduleError(f"{path}: not valid YAML: {exc}") from exc
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise ScheduleError(f"{path}: field {loc}: {err['msg']}") from exc
    for w in windows:
        if (w.start is None) != (w.end is None) or (w.start is None and w.weekly is None):
            raise ScheduleError(f"{path}: window {w.name!r}: give start+end or weekly")
    return windows


def active_freeze(now: datetime, env: str, windows: list[Window]) -> Window | None:
    """The first declared window that covers ``now`` for ``env`` (pure)."""
    now = now.astimezone(UTC)
    for w in windows:
        if env not in w.envs and "*" not in w.envs:
            continue
        if w.start is not None and w.end is not None:
            start, end = (t if t.tzinfo else t.replace(tzinfo=UTC) for t in (w.start, w.end))
            if start <= now < end:
                return w
        if w.weekly is not None:
            day, clock = DAYS[now.weekday()], now.time().replace(tzinfo=None)
            s, e = w.weekly.start, w.weekly.end
            if s <= e:
                if day in w.weekly.days and s <= clock < e:
                    return w
            else:  # spans midnight: the part after midnight belongs to the previous day
                prev = DAYS[(now.weekday() - 1) % 7]
                if (day in w.weekly.days and clock >= s) or (prev in w.weekly.days and clock < e):
                    return w
    return None


@dataclass
class GameDayLock:
    """Held for a whole game day: a second one on the same environment is refused."""

    path: Path
    _fh: IO[str] | None = None

    def acquire(self, info: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "unknown"
            fh.close()
            raise ScheduleError(f"a game day is already running on this environment ({holder}); "
                                "game days never overlap") from None
        fh.seek(0)
        fh.truncate()
        fh.write(json.dumps({**info, "pid": os.getpid()}))
        fh.flush()
        self._fh = fh

    def release(self) -> None:
        if self._fh is not None:
            self._fh.truncate(0)
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None
