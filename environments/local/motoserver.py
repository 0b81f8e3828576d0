"""The local S3 API server: moto's application, served with keep-alive, one lookup memoized.

``python -m environments.local.motoserver -H 127.0.0.1 -p PORT`` serves what ``moto_server`` serves
(the same application and request handling), with two differences measured on this machine
(docs/local-environment.md, "The S3 API server"), and a brownout that is off until set:

* The dispatcher remembers which backend answers a host. moto 5.2 works that out on every
  request, twice, under a global lock, by listing its package directory (about 180 ``stat``
  calls) and then trying the backends' URL patterns in turn: 36 % of the CPU of an S3 PUT or
  GET. The answer depends only on the host and on moto's installed files.
* It is served by gevent's WSGI server (one thread, a greenlet per connection, HTTP/1.1
  keep-alive) instead of werkzeug's development server, which answers every request with
  ``Connection: close`` and starts a thread per connection: each S3 call of an agent or a
  workload then paid a TCP connection of its own on both sides.
* ``/_gameday/brownout`` on the same port throttles, fails, delays or slows S3 requests while
  set (environments/local/s3_brownout.py); healthy, it passes every request to moto unchanged.

gevent's monkey-patching is applied only when this file runs as the server process, never
when another process imports it (for ``command()``).
"""

from __future__ import annotations

if __name__ == "__main__":  # before moto and werkzeug load threading, socket and ssl
    from gevent import monkey

    monkey.patch_all()

import argparse
import os
import signal
import socket
import sys
from typing import Any

from gevent.pywsgi import WSGIHandler, WSGIServer
from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    create_backend_app,
)

from environments.local.s3_brownout_server import BrownoutMiddleware

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


class QuietHandler(WSGIHandler):
    """A request line is logged only for an error answer (>= 400): six lines per short
    operation of the local runtime would make a log that grows for as long as the environment
    runs. Errors of the server itself still go to stderr."""

    def log_request(self) -> None:
        if isinstance(self.code, int) and self.code >= 400:
            super().log_request()


class KeepAliveServer(WSGIServer):
    handler_class = QuietHandler

    def handle(self, sock: socket.socket, address: Any) -> None:
        # Without TCP_NODELAY a kept-alive connection waits ~40 ms per request: the response's
        # body is held back (Nagle) until the client acknowledges its headers, and the client
        # delays that acknowledgement.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().handle(sock, address)


def command(port: int, host: str = "127.0.0.1") -> list[str]:
    """The argv that starts this server with the running interpreter."""
    return [sys.executable, "-m", "environments.local.motoserver", "-H", host, "-p", str(port)]


def main(argv: list[str] | None = None) -> int:
    import gevent

    p = argparse.ArgumentParser(prog="python -m environments.local.motoserver", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-H", "--host", default="127.0.0.1", help="address to bind")
    p.add_argument("-p", "--port", type=int, required=True, help="port to listen on")
    args = p.parse_args(argv)
    # as moto_server: its port for the URLs moto writes, debug on
    os.environ.setdefault("MOTO_PORT", str(args.port))
    dispatcher = MemoizedDispatcher(create_backend_app)
    dispatcher.debug = True  # type: ignore[attr-defined]
    app = BrownoutMiddleware(dispatcher)
    # SERVER_NAME given: gevent would otherwise look the address up in DNS when it starts
    server = KeepAliveServer((args.host, args.port), app, environ={"SERVER_NAME": args.host})
    # SIGTERM is a clean exit, as for moto_server; open keep-alive connections are closed
    gevent.signal_handler(signal.SIGTERM, server.stop, 1)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
