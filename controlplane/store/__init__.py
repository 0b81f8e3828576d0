"""All SQL of the control plane, grouped by concern. Callers pass an open async connection."""

from __future__ import annotations


class StoreError(Exception):
    """Root of the store's domain errors."""


class NotFound(StoreError):
    pass


class Conflict(StoreError):
    pass


class InvalidReference(StoreError):
    """The payload names something that does not exist (e.g. an unknown queue); ``loc`` is
    the field, as a validation error locates it (``("body", "queue")``)."""

    def __init__(self, message: str, loc: tuple[str, ...] = ("body",)) -> None:
        super().__init__(message)
        self.loc = loc


class StaleReport(StoreError):
    """A report/heartbeat carried a fencing token that no longer owns the attempt."""

    def __init__(self, message: str, operation_id: str | None = None) -> None:
        super().__init__(message)
        self.operation_id = operation_id


class StoreUnavailable(StoreError):
    """The database could not be reached, gave no pooled connection in time, or lost the
    connection mid-statement (controlplane.db.connection raises it). Transient: the same
    request may succeed on a retry."""
