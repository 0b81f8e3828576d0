"""Long-polling claims: an idle agent's claim waits here for work instead of asking again.

One LISTEN connection per API process (started by the first waiting claim) receives the
reconciler's ``controlplane_claimable`` notifications (store/agents.py ``notify_claimable``)
and wakes the waiting claims of the agents named in them. While that connection is down, a
waiting claim does not wait (``listening`` is False): the agent's own poll interval takes over,
so a lost listener costs claim latency never work.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import psycopg

from controlplane.db import CONNECT_TIMEOUT, ListenConnection
from controlplane.store.agents import CLAIM_CHANNEL, claimable_agents

log = logging.getLogger("controlplane.api")
RECONNECT_SECONDS = 1.0
# A LISTEN connection that died silently (a partition, a failover behind a proxy) would leave
# waiters sleeping out their full wait: probe it this often, give the probe this long.
PROBE_SECONDS = 15.0
PROBE_TIMEOUT = 5.0


class ClaimWakeups:
    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.listening = False
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start (or restart) the listener on the running event loop; idempotent."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._listen(), name="claim-listener")

    async def stop(self) -> None:
        """Cancel the listener (the app is shutting down); waiting claims answer at once."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def arm(self, agent_id: str) -> asyncio.Event:
        """Register before querying: a notification after this point is never missed."""
        event = asyncio.Event()
        self._waiters.setdefault(agent_id, set()).add(event)
        return event

    def disarm(self, agent_id: str, event: asyncio.Event) -> None:
        waiting = self._waiters.get(agent_id)
        if waiting is not None:
            waiting.discard(event)
            if not waiting:
                del self._waiters[agent_id]

    def wake(self, agent_ids: set[str] | None) -> None:
        """Wake the waiters of these agents (None: everyone)."""
        for agent_id in list(self._waiters) if agent_ids is None else agent_ids:
            for event in self._waiters.get(agent_id, ()):
                event.set()

    async def _listen(self) -> None:
        while True:
            try:
                async with await ListenConnection.connect(
                        self.dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT,
                        application_name="api-claim-listen") as conn:
                    await conn.execute(f"LISTEN {CLAIM_CHANNEL}")
                    self.listening = True
                    while True:
                        async for n in conn.notifies(timeout=PROBE_SECONDS):
                            self.wake(claimable_agents(n.payload))
                        await asyncio.wait_for(conn.execute("SELECT 1"), PROBE_TIMEOUT)
            except (psycopg.Error, OSError, TimeoutError) as exc:
                log.warning("claim listener lost; long-polling claims answer at once meanwhile",
                            extra={"action": "claim_listener", "error": str(exc)})
            finally:
                self.listening = False
                self.wake(None)  # nobody may sleep on a listener that is gone
            await asyncio.sleep(RECONNECT_SECONDS)
