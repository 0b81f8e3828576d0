"""When the agent's main loop calls the control plane and how long it sleeps (pure functions).

An idle agent long-polls its claim: the API holds the call until work is routed to it or
``wait`` runs out. The claim's query also heartbeats the agent, so a long poll no longer
than the heartbeat interval keeps the agent alive in the control plane's eyes with one
request per interval instead of a claim every ``poll_seconds`` plus heartbeats.
"""

from __future__ import annotations


def claim_wait(heartbeat_seconds: float, long_poll_seconds: float | None,
               margin: float = 0.1) -> float:
    """Seconds a claim may wait on the server: at most the heartbeat interval (less a margin
    for the round trip), since the claim's query is the only heartbeat while it waits."""
    upper = max(0.0, heartbeat_seconds - margin)
    if long_poll_seconds is None:
        return upper
    return max(0.0, min(long_poll_seconds, upper))


def next_claim_at(started: float, claimed: int, poll_seconds: float) -> float:
    """A claim that got work is followed at once (more may be waiting); otherwise the next one
    comes ``poll_seconds`` after this one *started*: a long poll that waited its time out is
    followed at once, one the server answered early (no long poll there) is paced as before."""
    return started if claimed else started + poll_seconds


def sleep_seconds(now: float, deadlines: list[float], cap: float) -> float:
    """Sleep until the earliest deadline, never longer than ``cap`` nor below zero."""
    return max(0.0, min([cap, *(d - now for d in deadlines)]))

