"""What a disk fault asks of a member's faultfs (pure): the harness's parameters (``fsync_ms``,
``glob`` relative to the data directory ...) turned into a faultfs fault spec, each bad
parameter named by *its* name, so that `gameday validate`, the CLI and the fault component
refuse the same things with the same words."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from environments.local.faultfs.errors import InvalidFaultSpec
from environments.local.faultfs.spec import parse_spec

MODES = ("slow", "full", "errors")
# the data directory's place on the mount (environments/local/storage.py): globs are relative to it
DATA = "data"
# harness parameter -> faultfs field, per mode
_FIELDS: dict[str, dict[str, str]] = {
    "slow": {"read_ms": "read_delay_ms", "write_ms": "write_delay_ms",
             "fsync_ms": "fsync_delay_ms"},
    "full": {},
    "errors": {"read": "read_eio", "write": "write_eio", "fsync": "fsync_eio"},
}
_JITTER = {"read_ms": "read_jitter_ms", "write_ms": "write_jitter_ms",
           "fsync_ms": "fsync_jitter_ms"}


class DiskSpecInvalid(ValueError):
    def __init__(self, field: str, reason: str) -> None:
        self.field, self.reason = field, reason
        super().__init__(f"{field}: {reason}")


def params_of(mode: str) -> tuple[str, ...]:
    extra = ("jitter_ms",) if mode == "slow" else ()
    return (*_FIELDS.get(mode, {}), *extra, "glob")


def faultfs_glob(glob: object) -> str | None:
    """``pg_wal/**`` (relative to the data directory) -> ``data/pg_wal/**`` (to the mount)."""
    if glob is None:
        return None
    if not isinstance(glob, str) or not glob.strip("/ "):
        raise DiskSpecInvalid("glob", f"a path glob relative to the data directory such as "
                                      f"'pg_wal/**', or null; got {glob!r}")
    return f"{DATA}/{glob.strip().lstrip('/')}"


def build(mode: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """The faultfs spec (only the fields set) for ``mode`` with ``params``; DiskSpecInvalid
    naming the parameter otherwise."""
    if mode not in MODES:
        raise DiskSpecInvalid("mode", f"one of {', '.join(MODES)}, got {mode!r}")
    unknown = sorted(set(params) - set(params_of(mode)))
    if unknown:
        raise DiskSpecInvalid(unknown[0], f"not a parameter of a {mode} disk "
                                          f"(known: {', '.join(params_of(mode))})")
    fields = _FIELDS[mode]
    spec: dict[str, Any] = {fields[k]: v for k, v in params.items() if k in fields and v}
    jitter = params.get("jitter_ms")
    if jitter:
        spec.update({_JITTER[k]: jitter for k in fields if params.get(k)})
    if mode == "full":
        spec["enospc"] = 1.0
    elif not spec:
        raise DiskSpecInvalid(next(iter(fields)), f"a {mode} disk needs at least one of "
                                                  f"{', '.join(fields)} above 0")
    glob = faultfs_glob(params.get("glob"))
    if glob is not None:
        spec["path_glob"] = glob
    back = {v: k for k, v in fields.items()} | {v: "jitter_ms" for v in _JITTER.values()} | {
        "path_glob": "glob"}
    try:
        parse_spec(spec)
    except InvalidFaultSpec as exc:
        raise DiskSpecInvalid(back.get(exc.field, exc.field), exc.reason) from None
    return spec


def problems(mode: str, params: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(parameter, reason) of what `build` would refuse; empty when it would build."""
    try:
        build(mode, params)
    except DiskSpecInvalid as exc:
        return [(exc.field, exc.reason)]
    return []
