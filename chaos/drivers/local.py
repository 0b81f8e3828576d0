"""The local environment's fault driver: a thin adapter over infra.local's FaultInjector."""

from __future__ import annotations

from typing import Any

from chaos.drivers.base import FaultResult


class LocalFaults:
    name = "local"

    def __init__(self, env: Any) -> None:  # infra.local.env.LocalEnvironment
        self.env = env
        self.f = env.faults

    def kill(self, target: str) -> FaultResult:
        return self.f.kill(target)

    def hang(self, target: str) -> FaultResult:
        return self.f.hang(target)

    def resume(self, target: str) -> FaultResult:
        return self.f.resume(target)

    def stop(self, target: str) -> FaultResult:
        return self.f.stop(target)

    def start(self, target: str) -> FaultResult:
        # idempotent: starting what runs already only waits for it to be healthy
        if self.env.main_pid(self.f.resolve(target)[0]) and not self._down(target):
            self.env.wait_healthy([self.f.resolve(target)[0]], 60.0)
            return {"target": target, "already": True}
        return self.f.start(target)

    def _down(self, target: str) -> bool:
        active = self.f.active()
        return any(k in active for k in (f"kill:{target}", f"stop:{target}"))

    def failover_db(self) -> FaultResult:
        return self.f.failover_db()

    def artifact_store_unreachable(self) -> FaultResult:
        return self.f.artifact_store_unreachable()

    def artifact_store_restore(self) -> FaultResult:
        return self.f.artifact_store_restore()

    def registry_unreachable(self) -> FaultResult:
        return self.f.registry_unreachable()

    def registry_restore(self) -> FaultResult:
        return self.f.registry_restore()

    def withdraw_pool(self, pool: str) -> FaultResult:
        return self.f.withdraw_pool(pool)

    def restore_pool(self, pool: str) -> FaultResult:
        if f"withdraw_pool:{pool}" not in self.f.active():
            return {"target": pool, "already": True}
        return self.f.restore_pool(pool)

    def partition_agent(self, agent: str) -> FaultResult:
        return self.f.partition_agent(agent)

    def heal_agent(self, agent: str) -> FaultResult:
        return self.f.heal_agent(agent)

    def partition_database(self, component: str) -> FaultResult:
        return self.f.partition_database(component)

    def heal_database(self, component: str) -> FaultResult:
        return self.f.heal_database(component)

    def restore_all(self) -> list[str]:
        return self.f.restore_everything()
