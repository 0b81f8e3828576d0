"""faultfs: a fault-injecting passthrough FUSE filesystem for storage gray faults (Chaos Mesh
IOChaos and LazyFS's power-loss model, in Python). docs/faultfs.md has the model, the API and
the measurements.

* ``python -m environments.local.faultfs --source DIR --mount DIR --control-port N`` serves it;
* ``FaultFsProcess`` starts/stops that process, ``FaultFsClient`` drives its control API;
* ``spec`` (what to inject, the decision) and ``cache`` (the unsynced writes) are pure.

Importing this package does not load libfuse: only the serving process does.
"""

from __future__ import annotations

from environments.local.faultfs.cache import CrashReport, UnsyncedCache
from environments.local.faultfs.client import FaultFsClient
from environments.local.faultfs.errors import (
    ControlUnreachable,
    FaultFsError,
    FuseUnavailable,
    InvalidFaultSpec,
    MountFailed,
)
from environments.local.faultfs.process import FaultFsProcess
from environments.local.faultfs.spec import NO_FAULTS, Decision, FaultSpec, decide, parse_spec

__all__ = [
    "NO_FAULTS",
    "ControlUnreachable",
    "CrashReport",
    "Decision",
    "FaultFsClient",
    "FaultFsError",
    "FaultFsProcess",
    "FaultSpec",
    "FuseUnavailable",
    "InvalidFaultSpec",
    "MountFailed",
    "UnsyncedCache",
    "decide",
    "parse_spec",
]
