"""The local S3 API server: moto's own application, one lookup memoized, connections kept alive.

``python -m infra.local.motoserver -H 127.0.0.1 -p PORT`` serves what ``moto_server`` serves
(the same application, with the environ moto's request handler makes), with two differences:

* the dispatcher remembers which backend answers a host. moto 5.2 works that out on every
  request, twice, under a global lock, by listing its package directory (about 180 ``stat``
  calls) and then trying the backends' URL patterns in turn: measured on this machine, 36 % of
  the CPU of an S3 PUT or GET (docs/local-environment.md, "The S3 API server"). The answer
  depends only on the host and on moto's installed files, so it never changes while the
  server runs;
* it runs under uvicorn (httptools, through a2wsgi) instead of werkzeug's development server,
  which closes the connection after every answer: a client's next request reuses its
  connection instead of opening one, and the server starts no thread per connection.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

import uvicorn
from a2wsgi import WSGIMiddleware
from moto.core.request import (
    PRESERVED_HEADER_NAMES_ENVIRON_KEY,
    environ_key_for_header,
    should_preserve_original_header_name,
)
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

from controlplane.api.server import QuietServer

log = logging.getLogger("infra.local.motoserver")

_UNSET = object()
KEEP_ALIVE_SECONDS = 120
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


def preserve_header_names(environ: dict[str, Any]) -> None:
    """What moto's own request handler adds to the environ: the original spelling of S3
    metadata headers with an underscore in their name (``x-amz-meta-a_b``), which WSGI folds
    into the same key as ``x-amz-meta-a-b`` (``MotoRequestHandler.make_environ``, done here
    from the ASGI scope's headers)."""
    scope = environ.get("asgi.scope") or {}
    headers = [(n.decode("latin1"), v.decode("latin1")) for n, v in scope.get("headers", [])]
    dashed = {environ_key_for_header(n) for n, _ in headers if "_" not in n}
    names: dict[str, str] = {}
    values: dict[str, list[str]] = {}
    for name, value in headers:
        key = environ_key_for_header(name)
        if not should_preserve_original_header_name(name) or key in dashed:
            continue  # never let an underscored header stand in for a dashed one
        names.setdefault(key, name)
        values.setdefault(key, []).append(value.replace("\r\n", ""))
    for key, key_values in values.items():
        environ[key] = ",".join(key_values)
    environ[PRESERVED_HEADER_NAMES_ENVIRON_KEY] = names


class MotoWSGI:
    """The dispatcher with moto's environ additions, logging a request line only for an error
    answer (>= 400).

    werkzeug logged one line per request: six lines per short operation of the local runtime,
    a log that grew for as long as the environment ran, and about 7 % of the server's CPU per
    request (2.37 against 2.20 ms, medians of 3 runs of 600 requests on 2026-12-02)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        preserve_header_names(environ)

        def start(status: str, headers: Any, exc_info: Any = None) -> Any:
            if int(status.split(" ", 1)[0]) >= 400:
                query = environ.get("QUERY_STRING")
                log.info('%s - - "%s %s%s %s" %s -', environ.get("REMOTE_ADDR", "-"),
                         environ.get("REQUEST_METHOD"), environ.get("PATH_INFO"),
                         f"?{query}" if query else "", environ.get("SERVER_PROTOCOL"),
                         status.split(" ", 1)[0])
            return start_response(status, headers, exc_info)

        return self.app(environ, start)


def make_app() -> Any:
    """The ASGI application the server runs: moto's, memoized, through a2wsgi."""
    app = MemoizedDispatcher(create_backend_app)
    app.debug = True  # type: ignore[attr-defined]  # as moto_server
    return WSGIMiddleware(MotoWSGI(app))


def command(port: int, host: str = "127.0.0.1") -> list[str]:
    """The argv that starts this server with the running interpreter."""
    return [sys.executable, "-m", "infra.local.motoserver", "-H", host, "-p", str(port)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m infra.local.motoserver", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-H", "--host", default="127.0.0.1", help="address to bind")
    p.add_argument("-p", "--port", type=int, required=True, help="port to listen on")
    args = p.parse_args(argv)
    # as moto_server: its port for the URLs moto writes
    os.environ.setdefault("MOTO_PORT", str(args.port))
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    # uvicorn stops cleanly on SIGTERM; its idle main loop wakes once a second (QuietServer)
    server = QuietServer(uvicorn.Config(
        make_app(), host=args.host, port=args.port, http="httptools", loop="uvloop",
        lifespan="off", access_log=False, log_level="warning",
        # uvicorn closes a connection idle for 5 s by default. boto3 never expires one, so a
        # request sent just as the server closes it fails and waits out a retry (a "store
        # unavailable" pause in a workload's events): with 120 s that needs an idle agent
        timeout_keep_alive=KEEP_ALIVE_SECONDS))
    server.run()
    return 0 if server.started else 3


if __name__ == "__main__":
    sys.exit(main())
