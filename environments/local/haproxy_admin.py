"""HAProxy's runtime API (the admin stats socket, ``run/haproxy.sock``): one command a
connection, as HAProxy's non-interactive mode answers it. Used for a backend's server weights
and states (environments/local/serving.py)."""

from __future__ import annotations

import socket
from pathlib import Path


class HaproxyAdminError(RuntimeError):
    pass


def command(socket_path: str | Path, line: str, timeout: float = 2.0) -> str:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(str(socket_path))
            sock.sendall(line.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except OSError as exc:
            raise HaproxyAdminError(f"HAProxy admin socket {socket_path}: {line!r}: {exc}") from exc
    return b"".join(chunks).decode(errors="replace")


def set_weight(socket_path: str | Path, backend: str, server: str, weight: int) -> None:
    """``weight`` 0-256 (HAProxy's range; 0: no new requests, the server stays checked)."""
    if not 0 <= weight <= 256:
        raise ValueError(f"weight {weight} for {backend}/{server}: HAProxy takes 0..256")
    answer = command(socket_path, f"set server {backend}/{server} weight {weight}").strip()
    if answer:  # silent on success
        raise HaproxyAdminError(f"set server {backend}/{server} weight {weight}: {answer}")


def servers(socket_path: str | Path, backend: str) -> dict[str, dict[str, str]]:
    """server -> its ``show servers state`` fields (``srv_op_state`` 2 = up, ``srv_uweight``)."""
    text = command(socket_path, f"show servers state {backend}")
    lines = [ln for ln in text.splitlines() if ln.strip()]
    header = next((ln for ln in lines if ln.startswith("# be_id")), None)
    if header is None:
        raise HaproxyAdminError(f"show servers state {backend}: unexpected answer {text[:200]!r}")
    names = header[2:].split()
    # the first line is the format's version ("1"), then the header, then one line a server
    rows = [dict(zip(names, ln.split())) for ln in lines
            if not ln.startswith("#") and len(ln.split()) == len(names)]
    return {row["srv_name"]: row for row in rows}


COUNTERS = ("stot", "hrsp_2xx", "hrsp_4xx", "hrsp_5xx")


def counters(socket_path: str | Path, backend: str) -> dict[str, dict[str, int]]:
    """server -> HAProxy's own counts since it started (``show stat``): ``stot`` sessions
    (requests, in HTTP mode), ``hrsp_2xx`` / ``hrsp_4xx`` / ``hrsp_5xx`` answers by class."""
    text = command(socket_path, "show stat")
    lines = text.splitlines()
    if not lines or not lines[0].startswith("# pxname"):
        raise HaproxyAdminError(f"show stat: unexpected answer {text[:200]!r}")
    names = lines[0][2:].split(",")
    rows = [dict(zip(names, ln.split(","))) for ln in lines[1:] if ln.strip()]
    return {r["svname"]: {c: int(r.get(c) or 0) for c in COUNTERS} for r in rows
            if r["pxname"] == backend and r["svname"] not in ("FRONTEND", "BACKEND")}


def sessions(socket_path: str | Path, backend: str) -> dict[str, int]:
    """server -> the requests HAProxy has sent it: the traffic split, counted by the load
    balancer itself."""
    return {server: c["stot"] for server, c in counters(socket_path, backend).items()}
