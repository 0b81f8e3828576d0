"""Load is only pointed at this machine unless the operator says otherwise."""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit


class UnsafeTargetError(Exception):
    """The target is not loopback and --allow-remote was not given."""


def _addresses(host: str) -> list[str]:
    try:
        return [info[4][0] for info in socket.getaddrinfo(host, None)]
    except socket.gaierror as exc:
        raise UnsafeTargetError(f"cannot resolve host {host!r}: {exc}") from None


def check_target(url: str, *, allow_remote: bool, what: str = "--host") -> None:
    """Refuse a URL whose host resolves to anything but 127.0.0.0/8 or ::1."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UnsafeTargetError(f"{what} {url!r}: expected an http(s)://host[:port] URL")
    if allow_remote:
        return
    addrs = _addresses(parts.hostname)
    remote = sorted({a for a in addrs if not ipaddress.ip_address(a.split("%")[0]).is_loopback})
    if remote or not addrs:
        raise UnsafeTargetError(
            f"refusing to send load to {what} {url}: {parts.hostname} resolves to "
            f"{', '.join(remote) or 'nothing'}, not loopback (127.0.0.0/8 or ::1). "
            "Pass --allow-remote if you really mean to load that system.")
