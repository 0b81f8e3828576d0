"""The declared price table (slo/specs/prices.yaml, docs/cost.md): per node pool, the instance
type, capacity type (on-demand / spot), price per node-hour, vCPUs and accelerators per node.

Prices are declared inputs, never measured. Validated here, at the edge: a bad file raises one
``PriceError`` naming the file and the field.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

DEFAULT_PRICES = Path(__file__).resolve().parent / "specs" / "prices.yaml"


class PriceError(Exception):
    """The price table is missing or invalid; the message names the file and the field."""


class CapacityType(StrEnum):
    ON_DEMAND = "on-demand"
    SPOT = "spot"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PoolPrice(_Strict):
    instance_type: str = Field(min_length=1)
    capacity_type: CapacityType
    price_per_hour: float = Field(gt=0)  # per node; a free pool is not declared with 0
    vcpus_per_node: int = Field(gt=0)
    accelerators_per_node: int = Field(default=0, ge=0)

    def node_share(self, cpus: float, accelerators: int) -> float:
        """The fraction of one node that ``cpus`` vCPUs and ``accelerators`` accelerators
        reserve: the larger of the two shares (dominant share)."""
        acc = accelerators / self.accelerators_per_node if self.accelerators_per_node else 0.0
        return max(cpus / self.vcpus_per_node, acc)

    @property
    def price_per_accelerator_hour(self) -> float | None:
        if not self.accelerators_per_node:
            return None
        return self.price_per_hour / self.accelerators_per_node


class PriceTable(_Strict):
    currency: str = Field(min_length=1)
    source: str = Field(min_length=1)  # where the declared figures come from
    pools: dict[str, PoolPrice] = Field(min_length=1)
    path: str = ""  # the file it was read from (set by load_prices)


def load_prices(path: str | Path | None = None) -> PriceTable:
    """Read and validate a price table (default: the packaged slo/specs/prices.yaml)."""
    p = Path(path) if path is not None else DEFAULT_PRICES
    shown = str(p) if path is not None else "slo/specs/prices.yaml"  # stable in verdicts
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PriceError(f"{p}: price table does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PriceError(f"{p}: cannot read: {exc}") from None
    except yaml.YAMLError as exc:
        raise PriceError(f"{p}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise PriceError(f"{p}: must be a mapping with currency, source and pools")
    if "path" in raw:
        raise PriceError(f"{p}: field path: not allowed (set from the file name)")
    try:
        return PriceTable.model_validate({**raw, "path": shown})
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(x) for x in err["loc"]) or "?"
        raise PriceError(f"{p}: field {field}: {err['msg']}") from None
