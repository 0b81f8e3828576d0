"""The operation and attempt state machines: pure data and checks, no I/O."""

from __future__ import annotations

from enum import StrEnum


class OpState(StrEnum):
    ACCEPTED = "accepted"
    QUEUED = "queued"
    DISPATCHED = "dispatched"
    RUNNING = "running"
    RETRYING = "retrying"
    BLOCKED = "blocked"
    CANCELED = "canceled"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class AttemptState(StrEnum):
    DISPATCHED = "dispatched"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    LOST = "lost"
    CANCELED = "canceled"


TERMINAL: frozenset[OpState] = frozenset({OpState.CANCELED, OpState.SUCCEEDED, OpState.FAILED})
ACTIVE_ATTEMPT: frozenset[AttemptState] = frozenset({AttemptState.DISPATCHED, AttemptState.RUNNING})
ActiveAttemptStates: list[str] = sorted(s.value for s in ACTIVE_ATTEMPT)  # for SQL ANY(%s)

# Legal operation transitions. Everything not listed is refused: the store enforces this table
# inside the UPDATE itself (``WHERE state = ANY(sources_of(dst))``), so a race cannot slip past it.
TRANSITIONS: dict[OpState, frozenset[OpState]] = {
    OpState.ACCEPTED: frozenset({OpState.QUEUED, OpState.BLOCKED, OpState.CANCELED, OpState.FAILED}),
    OpState.QUEUED: frozenset({OpState.DISPATCHED, OpState.BLOCKED, OpState.CANCELED}),
    OpState.BLOCKED: frozenset({OpState.QUEUED, OpState.CANCELED, OpState.FAILED}),
    # dispatched -> queued is a reroute (destination never claimed the attempt)
    OpState.DISPATCHED: frozenset(
        {OpState.RUNNING, OpState.QUEUED, OpState.RETRYING, OpState.FAILED, OpState.CANCELED}
    ),
    OpState.RUNNING: frozenset(
        {OpState.SUCCEEDED, OpState.FAILED, OpState.RETRYING, OpState.CANCELED}
    ),
    OpState.RETRYING: frozenset({OpState.QUEUED, OpState.BLOCKED, OpState.CANCELED, OpState.FAILED}),
    OpState.CANCELED: frozenset(),
    OpState.SUCCEEDED: frozenset(),
    OpState.FAILED: frozenset(),
}


class IllegalTransition(Exception):
    def __init__(self, src: OpState | str, dst: OpState | str) -> None:
        super().__init__(f"illegal transition {src} -> {dst}")
        self.src, self.dst = str(src), str(dst)


def is_legal(src: OpState | str, dst: OpState | str) -> bool:
    return OpState(dst) in TRANSITIONS[OpState(src)]


def check_transition(src: OpState | str, dst: OpState | str) -> None:
    if not is_legal(src, dst):
        raise IllegalTransition(src, dst)


def sources_of(dst: OpState | str) -> list[str]:
    """States from which ``dst`` may be entered (used in SQL guards)."""
    d = OpState(dst)
    return sorted(s.value for s, targets in TRANSITIONS.items() if d in targets)
