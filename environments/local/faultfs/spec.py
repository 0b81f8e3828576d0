"""The fault spec (what to inject) and the decision for one operation (pure: the caller passes
the random draws, so a decision is reproducible and testable)."""

from __future__ import annotations

import errno
import fnmatch
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields

from environments.local.faultfs.errors import InvalidFaultSpec

# Operation classes the faults are keyed by. "create" (create, mkdir) only takes ENOSPC.
OP_CLASSES = ("read", "write", "fsync", "create")
MAX_DELAY_MS = 600_000.0  # longer than any client timeout worth testing
MAX_GLOB_LEN = 1024


@dataclass(frozen=True)
class FaultSpec:
    """Faults in effect. Delays in milliseconds (jitter: uniform +-jitter around the delay);
    error fields are probabilities 0..1 per operation; ``path_glob`` limits every fault to paths
    (relative to the mount root, ``*`` also matches ``/``) that match it."""

    read_delay_ms: float = 0.0
    write_delay_ms: float = 0.0
    fsync_delay_ms: float = 0.0
    read_jitter_ms: float = 0.0
    write_jitter_ms: float = 0.0
    fsync_jitter_ms: float = 0.0
    read_eio: float = 0.0
    write_eio: float = 0.0
    fsync_eio: float = 0.0
    enospc: float = 0.0  # write, create, mkdir, fallocate: a full disk
    path_glob: str | None = None
    seed: int | None = None  # reseeds the injector's rng when set

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @property
    def active(self) -> bool:
        return any(getattr(self, f.name) for f in fields(self) if f.name not in ("path_glob",
                                                                               "seed"))


NO_FAULTS = FaultSpec()
_DELAYS = {f.name for f in fields(FaultSpec) if f.name.endswith("_ms")}
_PROBABILITIES = {"read_eio", "write_eio", "fsync_eio", "enospc"}


def _number(name: str, value: object) -> float:
    # bool is an int to Python, never a sensible delay or probability
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidFaultSpec(name, f"must be a number, got {type(value).__name__}")
    if math.isnan(value) or math.isinf(value):
        raise InvalidFaultSpec(name, "must be a finite number")
    return float(value)


def parse_spec(raw: object) -> FaultSpec:
    """Validate a JSON object into a FaultSpec; fields left out take their default (no fault).
    Raises InvalidFaultSpec naming the first bad field."""
    if not isinstance(raw, Mapping):
        raise InvalidFaultSpec("body", "must be a JSON object")
    known = {f.name for f in fields(FaultSpec)}
    values: dict[str, object] = {}
    for name, value in raw.items():
        if name not in known:
            raise InvalidFaultSpec(str(name), f"unknown field (known: {', '.join(sorted(known))})")
        if name in _DELAYS:
            v = _number(name, value)
            if not 0.0 <= v <= MAX_DELAY_MS:
                raise InvalidFaultSpec(name, f"must be between 0 and {MAX_DELAY_MS:g} ms")
            values[name] = v
        elif name in _PROBABILITIES:
            v = _number(name, value)
            if not 0.0 <= v <= 1.0:
                raise InvalidFaultSpec(name, "must be a probability between 0 and 1")
            values[name] = v
        elif name == "path_glob":
            if value is not None and (not isinstance(value, str) or not value
                                      or len(value) > MAX_GLOB_LEN):
                raise InvalidFaultSpec(name, f"must be null or a glob of 1..{MAX_GLOB_LEN} chars")
            values[name] = value.lstrip("/") if isinstance(value, str) else None
        elif name == "seed":
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 0):
                raise InvalidFaultSpec(name, "must be null or a non-negative integer")
            values[name] = value
    return FaultSpec(**values)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Decision:
    delay_s: float = 0.0
    errno: int | None = None


NOTHING = Decision()


def matches(spec: FaultSpec, path: str) -> bool:
    return spec.path_glob is None or fnmatch.fnmatchcase(path.lstrip("/"), spec.path_glob)


def decide(spec: FaultSpec, op: str, path: str, error_draw: float,
           jitter_draw: float) -> Decision:
    """What to inject into one ``op`` on ``path``: draws are uniform in [0, 1). For a write one
    draw decides between ENOSPC (first ``enospc`` of the range) and EIO (the next
    ``write_eio``), so the two never stack."""
    if op not in OP_CLASSES:
        raise ValueError(f"unknown operation class {op!r}")
    if not matches(spec, path):
        return NOTHING
    delay_ms = 0.0
    if op != "create":
        base = getattr(spec, f"{op}_delay_ms")
        jitter = getattr(spec, f"{op}_jitter_ms")
        delay_ms = max(0.0, base + jitter * (2.0 * jitter_draw - 1.0)) if base or jitter else 0.0
    err: int | None = None
    if op in ("write", "create"):
        if error_draw < spec.enospc:
            err = errno.ENOSPC
        elif op == "write" and error_draw < spec.enospc + spec.write_eio:
            err = errno.EIO
    elif error_draw < getattr(spec, f"{op}_eio"):
        err = errno.EIO
    if not delay_ms and err is None:
        return NOTHING
    return Decision(delay_s=delay_ms / 1000.0, errno=err)
