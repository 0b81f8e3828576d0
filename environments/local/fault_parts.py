"""The fault layers of the local environment that own state of their own, built by its
composition root (``LocalEnvironment.faults``) and handed to the fault driver: toxics on the
fault proxy's routes, the S3 brownout, CPU starvation, memory pressure, the database disks, an agent host's power. The driver asks
each to undo what it did (``restore_all`` / ``close_all``); none reaches into another."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from environments.local.cpu_starvation import CpuStarvation
from environments.local.disk_faults import DiskFaults
from environments.local.memory_pressure import MemoryPressure
from environments.local.power_loss import PowerLoss
from environments.local.route_toxics import RouteToxics
from environments.local.store_brownout import StoreBrownout

if TYPE_CHECKING:
    from environments.local.faults import FaultInjector


def local_fault_parts(driver: FaultInjector) -> dict[str, Any]:
    """name -> part, for the environment the driver acts on (what its env.json describes)."""
    env, ledger = driver.env, driver.ledger
    moto = env.components.get("moto")
    return {
        "network": RouteToxics(env.endpoints.get("fault_proxy"), ledger),
        "store": StoreBrownout(f"http://127.0.0.1:{moto.ports['s3']}" if moto else None, ledger),
        "cpu": CpuStarvation(ledger, env.component_pids, str(env.state_dir)),
        "memory": MemoryPressure(ledger, env.component_pids, str(env.state_dir)),
        "disks": DiskFaults.for_components(env.components, ledger,
                                           lambda target: driver.resolve(target)[0]),
        "power": PowerLoss.for_components(env.components, ledger, driver.power_off,
                                          lambda agent: driver.start(agent)),
    }
