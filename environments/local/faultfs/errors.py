"""Errors of the fault-injecting filesystem, each naming its reason."""

from __future__ import annotations

from environments.local.errors import EnvError


class FaultFsError(EnvError):
    """Root of every faultfs error."""


class FuseUnavailable(FaultFsError):
    """FUSE cannot be used here: no /dev/fuse, no libfuse3, no fusermount3, or not root."""


class MountFailed(FaultFsError):
    """The mount did not come up (bad directories, libfuse refused, process died early)."""


class ControlUnreachable(FaultFsError):
    """The control API did not answer (process gone, wrong port)."""


class InvalidFaultSpec(FaultFsError, ValueError):
    """A fault spec field is wrong; ``field`` names it (the API answers 422 with it)."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")
