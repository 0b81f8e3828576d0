from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.policy import ErrorKind, backoff_seconds, decide_retry
from controlplane.states import (
    TERMINAL,
    TRANSITIONS,
    IllegalTransition,
    OpState,
    check_transition,
    sources_of,
)


def test_terminal_states_have_no_exit() -> None:
    for s in TERMINAL:
        assert TRANSITIONS[s] == frozenset()
        for dst in OpState:
            with pytest.raises(IllegalTransition):
                check_transition(s, dst)


def test_required_paths_are_legal() -> None:
    path = ["accepted", "queued", "dispatched", "running", "retrying", "queued", "dispatched",
            "running", "succeeded"]
    for a, b in itertools.pairwise(path):
        check_transition(a, b)
    check_transition("accepted", "blocked")
    check_transition("blocked", "queued")


def test_sources_of_matches_table() -> None:
    for dst in OpState:
        assert set(sources_of(dst)) == {s.value for s, t in TRANSITIONS.items() if dst in t}
    assert "succeeded" not in sources_of(OpState.RUNNING)
    assert sources_of(OpState.ACCEPTED) == []  # only a submission creates 'accepted'


def test_backoff_doubles_and_caps() -> None:
    assert [backoff_seconds(n, 1, 10) for n in range(1, 6)] == [1, 2, 4, 8, 10]
    with pytest.raises(ValueError):
        backoff_seconds(0)


@given(made=st.integers(1, 30), max_retries=st.integers(0, 20))
def test_transient_errors_retry_exactly_max_retries_times(made: int, max_retries: int) -> None:
    d = decide_retry(error_kind="transient", attempts_made=made, max_retries=max_retries)
    assert d.retry is (made - 1 < max_retries)
    if d.retry:
        assert d.delay_seconds > 0


@given(made=st.integers(1, 30), max_retries=st.integers(0, 20))
def test_deterministic_errors_never_retry(made: int, max_retries: int) -> None:
    d = decide_retry(error_kind=ErrorKind.DETERMINISTIC, attempts_made=made,
                     max_retries=max_retries)
    assert not d.retry and "deterministic" in d.reason
