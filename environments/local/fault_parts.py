"""The fault components of the local environment, built for its composition root
(``LocalEnvironment.faults``) and handed to the fault driver (environments/local/faults.py): process
faults, proxy routes, clocks, zones, releases, credential rotation, model rollouts, the
database's failover, and the fault layers that own state of their own (toxics on the fault
proxy's routes, the S3 brownout, CPU starvation, memory pressure, the database disks, an agent
host's power). Each is given what it needs here and none reaches into another. A new fault
layer is one more entry.
"""

from __future__ import annotations

from environments.local.clock_faults import Clocks
from environments.local.cpu_starvation import CpuStarvation
from environments.local.credentials import CredentialRotation, LocalCredentials
from environments.local.database import LocalDatabase
from environments.local.disk_faults import DiskFaults
from environments.local.fault_ledger import FaultLedger
from environments.local.faults import FaultInjector
from environments.local.memory_pressure import MemoryPressure
from environments.local.power_loss import PowerLoss
from environments.local.process_faults import ProcessFaults
from environments.local.processes import Processes
from environments.local.releases import Releases
from environments.local.rollout_faults import Rollouts
from environments.local.route_faults import ProxyRoutes
from environments.local.route_toxics import RouteToxics
from environments.local.serving_scale import ServingScale
from environments.local.state import EnvState
from environments.local.store_brownout import StoreBrownout
from environments.local.zone_faults import ZoneFaults


def fault_driver(state: EnvState, processes: Processes, db: LocalDatabase) -> FaultInjector:
    """The driver over every fault component, for the environment ``state`` records."""
    ledger = FaultLedger(state.timeline_file, state.dir / "faults_active.json")
    process_faults = ProcessFaults(state, processes, db, ledger)
    routes = ProxyRoutes(state, ledger)
    moto = state.components.get("moto")
    return FaultInjector(ledger, {
        "processes": process_faults,
        "routes": routes,
        "database": db,
        "clocks": Clocks(state, ledger, process_faults.resolve),
        "zones": ZoneFaults(state, processes, db, ledger, routes, process_faults),
        "releases": Releases(state, processes, ledger),
        "credentials": CredentialRotation(LocalCredentials(state, processes, db), ledger),
        "rollouts": Rollouts(state, processes, ledger),  # a model version rolled out (serving)
        # the fault layers with state of their own
        "network": RouteToxics(state.endpoints.get("fault_proxy"), ledger),
        "store": StoreBrownout(f"http://127.0.0.1:{moto.ports['s3']}" if moto else None, ledger),
        "cpu": CpuStarvation(ledger, processes.component_pids, str(state.dir)),
        "memory": MemoryPressure(ledger, processes.component_pids, str(state.dir)),
        "disks": DiskFaults.for_components(state.components, ledger,
                                           lambda target: process_faults.resolve(target)[0]),
        "power": PowerLoss.for_components(state.components, ledger, process_faults.power_off,
                                          lambda agent: process_faults.start(agent)),
        # not a fault: the serving replicas scaled at run time, back to `up`'s on restore
        "serving": ServingScale(state, processes),
    })
