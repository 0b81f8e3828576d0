"""The local S3 API server: moto's own server with one lookup memoized.

``python -m infra.local.motoserver -H 127.0.0.1 -p PORT`` serves what ``moto_server`` serves
(the same application, werkzeug's threaded server, moto's request handler), except that the
dispatcher remembers which backend answers a host. moto 5.2 works that out on every request,
twice, under a global lock, by listing its package directory (about 180 ``stat`` calls) and
then trying the backends' URL patterns in turn: measured on this machine, 36 % of the CPU of an
S3 PUT or GET (docs/local-environment.md, "The S3 API server"). The answer depends only on the
host and on moto's installed files, so it never changes while the server runs.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import run_simple

_UNSET = object()
_MAX_HOSTS = 1024  # hosts come from requests: the memo stays bounded whatever they send


class MemoizedDispatcher(DomainDispatcherApplication):
    """moto's dispatcher; ``get_backend_for_host`` is a pure function of its argument."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._backend_of: dict[str | None, Any] = {}

    def get_backend_for_host(self, host: str | None) -> Any:
        # moto calls this holding self.lock; the dict is only touched there
        backend = self._backend_of.get(host, _UNSET)
        if backend is _UNSET:
            backend = super().get_backend_for_host(host)
            if len(self._backend_of) < _MAX_HOSTS:
                self._backend_of[host] = backend
        return backend


class QuietRequestHandler(MotoRequestHandler):
    """moto's request handler, logging a request line only for an error answer (>= 400).

    werkzeug logs one line per request through `logging`: six lines per short operation of
    the local runtime, a log that grows for as long as the environment runs, and about 7 % of
    the server's CPU per request (2.37 against 2.20 ms, medians of 3 runs of 600 requests on
    2026-12-02). A failed request is still logged, and so is every error werkzeug reports."""

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        if isinstance(code, int) and code < 400:
            return
        super().log_request(code, size)


def command(port: int, host: str = "127.0.0.1") -> list[str]:
    """The argv that starts this server with the running interpreter."""
    return [sys.executable, "-m", "infra.local.motoserver", "-H", host, "-p", str(port)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m infra.local.motoserver", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-H", "--host", default="127.0.0.1", help="address to bind")
    p.add_argument("-p", "--port", type=int, required=True, help="port to listen on")
    args = p.parse_args(argv)
    # as moto_server: its port for the URLs moto writes, a SIGTERM is a clean exit, debug on
    os.environ.setdefault("MOTO_PORT", str(args.port))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    app = MemoizedDispatcher(create_backend_app)
    app.debug = True  # type: ignore[attr-defined]
    run_simple(args.host, args.port, app, threaded=True, request_handler=QuietRequestHandler)
    return 0


if __name__ == "__main__":
    sys.exit(main())
