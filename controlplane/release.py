"""Which release of the control plane this process runs: ``N`` or ``N+1`` (docs/upgrades.md).

The reference control plane carries two adjacent releases in one code base so a rolling
upgrade can be rehearsed for real: old and new processes run side by side on one database.
Each process picks its release once, at start, from ``CONTROLPLANE_RELEASE`` (default ``N``);
an unknown value refuses to start.

The one schema change between them is the rename of ``operations.pending_reason`` to
``operations.wait_reason``, done expand/contract (migration 0009_wait_reason_expand):

- ``N`` reads and writes ``pending_reason`` only and never looks at ``wait_reason``.
- ``N+1`` writes ``wait_reason`` and reads it, falling back to ``pending_reason`` for a row
  the expand has not reached; it needs the expand migration applied before it starts.
- The expand keeps the two columns equal with a trigger, so each release sees what the other
  wrote. The contract (dropping ``pending_reason``) is for the release after N+1, once no
  ``N`` process is left and rolling back to ``N`` is no longer an option.
"""

from __future__ import annotations

import os
from functools import cache
from typing import Any

ENV = "CONTROLPLANE_RELEASE"
RELEASES = ("N", "N+1")
DEFAULT = "N"
# the expand migration N+1 needs; `migrate` under release N stops just before it
EXPAND_REVISION = "0009"
OLD_COLUMN = "pending_reason"
NEW_COLUMN = "wait_reason"


class UnknownRelease(ValueError):
    pass


def parse(value: str | None) -> str:
    release = (value or DEFAULT).strip()
    if release not in RELEASES:
        raise UnknownRelease(f"{ENV}={value!r}: unknown release; known: {', '.join(RELEASES)}")
    return release


@cache
def current() -> str:
    return parse(os.environ.get(ENV))


def wait_reason_column(release: str | None = None) -> str:
    """The column this release writes an operation's wait reason to."""
    return NEW_COLUMN if (release or current()) == "N+1" else OLD_COLUMN


def wait_reason(row: dict[str, Any], release: str | None = None) -> str | None:
    """An operation row's wait reason as this release reads it. ``N`` reads its own column
    only (a row without it is an error, as it was before the upgrade existed); ``N+1`` reads
    the new column and falls back to the old one."""
    if (release or current()) == "N+1":
        value = row.get(NEW_COLUMN)
        return value if value is not None else row.get(OLD_COLUMN)
    return row[OLD_COLUMN]
