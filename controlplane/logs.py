"""Structured JSON logs: one object per line, stable id fields, an ``action`` field."""

from __future__ import annotations

import json
import logging
import sys
import time

from controlplane import clock

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        # stamped by this process's wall clock, skewed like the host's would be (clock.py)
        created = record.created + clock.offset()
        out = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
            + f".{int(created % 1 * 1000):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        # extra={...} fields: operation_id, attempt_id, project, queue, agent, pool, action
        out.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("uvicorn.access", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
