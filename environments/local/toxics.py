"""Toxics: gray network faults of the fault proxy's routes, as Toxiproxy models them.

A toxic is applied by the fault proxy (environments/local/proxy.py) to one direction of every
connection of a route: ``upstream`` is client -> target, ``downstream`` is target -> client.
``toxicity`` (0..1) is the fraction of *connections* it applies to, decided once per connection
(a connection keeps its draw when the toxicity is changed later). The JSON form is Toxiproxy's::

    {"name": "slow_db", "type": "latency", "stream": "downstream", "toxicity": 1.0,
     "attributes": {"latency": 100, "jitter": 20}}

``name`` defaults to ``<type>_<stream>``, ``stream`` to ``downstream``, ``toxicity`` to 1.

Types and attributes (Toxiproxy's names and units; ``*`` = required):

* ``latency``    - ``latency``* ms, ``jitter`` ms (default 0): every chunk is delayed by
                   latency +- uniform jitter (never below 0), in order.
* ``bandwidth``  - ``rate``* KB/s (1 KB = 1024 bytes, > 0): cap of the stream's rate.
* ``slicer``     - ``average_size``* bytes (>= 1), ``size_variation`` bytes, ``delay`` us: every
                   chunk is written in small pieces with a delay between them.
* ``limit_data`` - ``bytes``*: the connection is closed (FIN, both sides) once that many bytes
                   have passed in the stream since the toxic applied to it.
* ``reset_peer`` - ``timeout`` ms after the *connection* started (0 = at once) and/or
                   ``after_bytes`` (once that many bytes have passed since the toxic applied):
                   the connection is reset (RST, both sides). Neither given = ``timeout`` 0.
* ``timeout``    - ``timeout``* ms: data of the stream is dropped (Toxiproxy drops it: it does
                   not arrive when the toxic is removed) and its end (FIN) held back; the
                   connection is closed that long after the toxic applied to it, never when 0.

Time attributes are at most one day (``MAX_MS``); names are 1-64 letters, digits, '-', '_'.

Public API:

* ``ToxicType``, ``Stream`` - enums of the JSON values;
* ``Latency``, ``Bandwidth``, ``Slicer``, ``LimitData``, ``ResetPeer``, ``Timeout`` - frozen
  attribute records (``Attributes`` is their union);
* ``Toxic`` - frozen record (``name``, ``stream``, ``toxicity``, ``attributes``; ``type`` is
  derived from the attributes) with ``to_json()``, which ``parse_toxic`` reads back unchanged;
* ``parse_toxic(doc, where)`` - validate a JSON document; ``update_toxic(toxic, doc, where)`` -
  apply a partial update (``toxicity`` and/or ``attributes``, merged; an attribute set to null
  returns to its default, e.g. ``"timeout": null`` for a reset_peer on ``after_bytes`` alone;
  ``name``/``type``/``stream`` may be repeated, not changed). Both raise
  ``ToxicError`` (a ``ValueError``) whose message starts with ``where`` joined by "." to the
  path of the offending field: ``"<where>.attributes.latency: must be a number >= 0, got 'abc'"``;
* pure arithmetic used by the proxy: ``applies``, ``latency_delay``, ``bandwidth_delay``,
  ``slice_size`` / ``slice_sizes``; ``KB`` (1024).

No I/O here: the experiment validator and the fault driver import this module as well.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from enum import Enum
from typing import Any

KB = 1024  # bytes in the KB of a bandwidth rate
MAX_MS = 86_400_000.0  # one day: a longer wait is a unit mistake (seconds for ms, us for ms)
NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")


class ToxicError(ValueError):
    """An invalid toxic; the message names the field (its path) and the reason."""


class ToxicType(str, Enum):
    LATENCY = "latency"
    BANDWIDTH = "bandwidth"
    SLICER = "slicer"
    LIMIT_DATA = "limit_data"
    RESET_PEER = "reset_peer"
    TIMEOUT = "timeout"


class Stream(str, Enum):
    UPSTREAM = "upstream"  # client -> target
    DOWNSTREAM = "downstream"  # target -> client


def _num(*, integer: bool = False, positive: bool = False, maximum: float | None = None,
         default: Any = MISSING) -> Any:
    """A numeric attribute: its constraints travel in the dataclass field's metadata."""
    return field(default=default, metadata={"integer": integer, "positive": positive,
                                            "maximum": maximum})


@dataclass(frozen=True)
class Latency:
    latency: float = _num(maximum=MAX_MS)
    jitter: float = _num(maximum=MAX_MS, default=0.0)


@dataclass(frozen=True)
class Bandwidth:
    rate: float = _num(positive=True)


@dataclass(frozen=True)
class Slicer:
    average_size: int = _num(integer=True, positive=True)
    size_variation: int = _num(integer=True, default=0)
    delay: float = _num(maximum=MAX_MS * 1000, default=0.0)  # microseconds


@dataclass(frozen=True)
class LimitData:
    bytes: int = _num(integer=True)


@dataclass(frozen=True)
class ResetPeer:
    timeout: float | None = _num(maximum=MAX_MS, default=None)
    after_bytes: int | None = _num(integer=True, default=None)


@dataclass(frozen=True)
class Timeout:
    timeout: float = _num(maximum=MAX_MS)


Attributes = Latency | Bandwidth | Slicer | LimitData | ResetPeer | Timeout

_CLASSES: dict[ToxicType, type[Attributes]] = {
    ToxicType.LATENCY: Latency, ToxicType.BANDWIDTH: Bandwidth, ToxicType.SLICER: Slicer,
    ToxicType.LIMIT_DATA: LimitData, ToxicType.RESET_PEER: ResetPeer, ToxicType.TIMEOUT: Timeout,
}
_TYPES = {cls: kind for kind, cls in _CLASSES.items()}
_FIELDS = ("name", "type", "stream", "toxicity", "attributes")


@dataclass(frozen=True)
class Toxic:
    name: str
    stream: Stream
    toxicity: float
    attributes: Attributes

    @property
    def type(self) -> ToxicType:
        return _TYPES[type(self.attributes)]

    def to_json(self) -> dict[str, Any]:
        attrs = {f.name: getattr(self.attributes, f.name) for f in fields(self.attributes)}
        return {"name": self.name, "type": self.type.value, "stream": self.stream.value,
                "toxicity": self.toxicity,
                "attributes": {k: v for k, v in attrs.items() if v is not None}}


# -- validation ------------------------------------------------------------------------------
def _at(where: str, path: str) -> str:
    return f"{where}.{path}" if where else path


def _number(value: Any, spec: Mapping[str, Any], path: str) -> float | int:
    integer, positive, maximum = spec["integer"], spec["positive"], spec["maximum"]
    ok = (isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
          and (not integer or float(value).is_integer())
          and (value > 0 if positive else value >= 0))
    if not ok:
        kind = "an integer" if integer else "a number"
        raise ToxicError(f"{path}: must be {kind} {'> 0' if positive else '>= 0'}, got {value!r}")
    if maximum is not None and value > maximum:
        raise ToxicError(f"{path}: must be <= {maximum:.0f} (one day), got {value!r}")
    return int(value) if integer else float(value)


def _attributes(kind: ToxicType, doc: Any, path: str) -> Attributes:
    cls = _CLASSES[kind]
    specs: dict[str, Field[Any]] = {f.name: f for f in fields(cls)}
    if doc is None:
        doc = {}
    if not isinstance(doc, Mapping):
        raise ToxicError(f"{path}: must be an object, got {doc!r}")
    for key in doc:
        if key not in specs:
            raise ToxicError(f"{path}.{key}: unknown attribute of a {kind.value} toxic; known: "
                             f"{', '.join(specs)}")
    values: dict[str, Any] = {}
    for name, spec in specs.items():
        value = doc.get(name)
        if value is None:  # absent or null: the default
            if spec.default is MISSING:
                raise ToxicError(f"{path}.{name}: required for a {kind.value} toxic")
            continue
        values[name] = _number(value, spec.metadata, f"{path}.{name}")
    attrs = cls(**values)
    if isinstance(attrs, ResetPeer) and attrs.timeout is None and attrs.after_bytes is None:
        attrs = ResetPeer(timeout=0.0)  # Toxiproxy's reset_peer: at once
    return attrs


def parse_toxic(doc: Any, where: str) -> Toxic:
    """Validate a toxic's JSON document; ``where`` prefixes the path in error messages."""
    if not isinstance(doc, Mapping):
        raise ToxicError(f"{where or 'toxic'}: must be an object, got {doc!r}")
    for key in doc:
        if key not in _FIELDS:
            raise ToxicError(f"{_at(where, str(key))}: unknown field; known: {', '.join(_FIELDS)}")
    raw_type = doc.get("type")
    known = ", ".join(t.value for t in ToxicType)
    if raw_type is None:
        raise ToxicError(f"{_at(where, 'type')}: required, one of {known}")
    if raw_type not in {t.value for t in ToxicType}:
        raise ToxicError(f"{_at(where, 'type')}: unknown toxic type {raw_type!r}; known: {known}")
    kind = ToxicType(raw_type)
    raw_stream = doc.get("stream", Stream.DOWNSTREAM.value)
    if raw_stream not in {s.value for s in Stream}:
        raise ToxicError(f"{_at(where, 'stream')}: must be 'upstream' or 'downstream', "
                         f"got {raw_stream!r}")
    stream = Stream(raw_stream)
    toxicity = doc.get("toxicity", 1.0)
    if (not isinstance(toxicity, int | float) or isinstance(toxicity, bool)
            or not 0.0 <= toxicity <= 1.0):
        raise ToxicError(f"{_at(where, 'toxicity')}: must be a number from 0 to 1, "
                         f"got {toxicity!r}")
    name = doc.get("name", f"{kind.value}_{stream.value}")
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise ToxicError(f"{_at(where, 'name')}: must be 1-64 letters, digits, '-' or '_', "
                         f"got {name!r}")
    attributes = _attributes(kind, doc.get("attributes"), _at(where, "attributes"))
    return Toxic(name=name, stream=stream, toxicity=float(toxicity), attributes=attributes)


def update_toxic(toxic: Toxic, doc: Any, where: str) -> Toxic:
    """``toxic`` with a partial update applied (see the module docstring); validated."""
    if not isinstance(doc, Mapping):
        raise ToxicError(f"{where or 'toxic'}: must be an object, got {doc!r}")
    current = toxic.to_json()
    for key in ("name", "type", "stream"):
        if key in doc and doc[key] != current[key]:
            raise ToxicError(f"{_at(where, key)}: cannot change ({current[key]!r} -> "
                             f"{doc[key]!r}); delete the toxic and create it again")
    attributes = doc.get("attributes") or {}
    if not isinstance(attributes, Mapping):
        raise ToxicError(f"{_at(where, 'attributes')}: must be an object, got {attributes!r}")
    merged = {**current, **doc, "attributes": {**current["attributes"], **attributes}}
    return parse_toxic(merged, where)


# -- the arithmetic of the data path ---------------------------------------------------------
def applies(toxicity: float, roll: float) -> bool:
    """Whether a toxic applies to a connection whose draw (uniform in [0, 1)) is ``roll``."""
    return roll < toxicity


def latency_delay(latency_ms: float, jitter_ms: float, rng: random.Random) -> float:
    """Seconds to delay one chunk: latency +- uniform jitter, never below 0."""
    jitter = rng.uniform(-jitter_ms, jitter_ms) if jitter_ms else 0.0
    return max(0.0, latency_ms + jitter) / 1000.0


def bandwidth_delay(nbytes: int, rate_kb: float) -> float:
    """Seconds that ``nbytes`` take at ``rate_kb`` KB/s."""
    return nbytes / (rate_kb * KB)


def slice_size(average_size: int, size_variation: int, rng: random.Random) -> int:
    """One slicer piece: average +- uniform variation, at least 1 byte."""
    if not size_variation:
        return max(1, average_size)
    return max(1, average_size + rng.randint(-size_variation, size_variation))


def slice_sizes(nbytes: int, average_size: int, size_variation: int,
                rng: random.Random) -> list[int]:
    """The pieces a slicer writes ``nbytes`` in (the last one takes the remainder)."""
    sizes: list[int] = []
    while nbytes > 0:
        sizes.append(min(nbytes, slice_size(average_size, size_variation, rng)))
        nbytes -= sizes[-1]
    return sizes
