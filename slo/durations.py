"""Prometheus-style duration strings ("90s", "1h30m", "28d") <-> seconds.

Specs are written by people, so they use durations; the math uses float seconds.
"""

from __future__ import annotations

import re

_UNITS: dict[str, float] = {
    "ms": 0.001,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
    "w": 604800.0,
    "y": 31536000.0,
}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")


def parse_duration(text: str | float) -> float:
    """Seconds for "1h30m"-style strings; bare numbers are seconds. ValueError if malformed."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"duration must not be negative: {text!r}")
        return float(text)
    s = str(text).strip()
    if not s:
        raise ValueError("empty duration")
    pos, total = 0, 0.0
    for match in _PART.finditer(s):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if pos != len(s):
        raise ValueError(f"not a duration: {text!r} (expected e.g. 30s, 5m, 1h30m, 28d)")
    return total


def format_duration(seconds: float) -> str:
    """Shortest Prometheus duration for `seconds`, rounded to whole seconds (>= 1s)."""
    rest = max(1, round(seconds))
    out = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if rest >= size:
            out.append(f"{rest // size}{unit}")
            rest %= size
    return "".join(out)
