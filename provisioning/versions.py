"""Which Kubernetes versions a stack may pin, and which Karpenter goes with them: data, checked
before any resource is declared (provisioning/config.py ``parse_stack_config``).

* ``EKS_CALENDAR``: per minor version, the end of standard and of extended support, from the
  "Amazon EKS Kubernetes release calendar" (EKS user guide, "Understand the Kubernetes
  version lifecycle on EKS", https://docs.aws.amazon.com/eks/latest/userguide/kubernetes-versions.html;
  dates in UTC; billing for extended support starts at the beginning of the end-of-standard
  day). Past standard support a cluster is billed extended support, about 6x the control-plane
  fee ($0.60 instead of $0.10 per cluster hour, EKS pricing); past extended support EKS
  upgrades the control plane by itself and refuses to create the version.
* ``KARPENTER_MIN``: per Kubernetes minor version, the oldest Karpenter that supports it
  (Karpenter's compatibility matrix, https://karpenter.sh/docs/upgrading/compatibility/).
  ``KARPENTER_MAX_KUBERNETES``: per Karpenter minor, the newest Kubernetes it supports.

Add a row when AWS or Karpenter publish one; a version with no row is refused, not guessed.
The date the check uses is a parameter (``today()`` by default) so tests can pin it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime

# Karpenter's chart and controller (provisioning/components/autoscaling.py installs it)
KARPENTER_CHART_VERSION = "1.5.4"
EXTENDED_SUPPORT_COST = ("extended support costs about 6x the control-plane fee "
                         "($0.60 instead of $0.10 per cluster hour)")


@dataclass(frozen=True)
class EksSupport:
    standard_until: date  # first day billed as extended support
    extended_until: date  # first day EKS no longer runs it


EKS_CALENDAR: dict[str, EksSupport] = {
    "1.29": EksSupport(date(2025, 3, 23), date(2026, 3, 23)),
    "1.30": EksSupport(date(2025, 7, 23), date(2026, 7, 23)),
    "1.31": EksSupport(date(2025, 11, 26), date(2026, 11, 26)),
    "1.32": EksSupport(date(2026, 3, 23), date(2027, 3, 23)),
    "1.33": EksSupport(date(2026, 7, 29), date(2027, 7, 29)),
    "1.34": EksSupport(date(2026, 12, 2), date(2027, 12, 2)),
    # not in the stored copy of the AWS page read for this table (it ends at 1.34): from
    # https://endoflife.date/amazon-eks; check it against the AWS page before relying on it
    "1.35": EksSupport(date(2027, 3, 27), date(2028, 3, 27)),
}

KARPENTER_MIN: dict[str, str] = {
    "1.29": "0.34", "1.30": "0.37", "1.31": "1.0.5", "1.32": "1.2", "1.33": "1.5",
    "1.34": "1.6", "1.35": "1.9",
}
KARPENTER_MAX_KUBERNETES: dict[str, str] = {
    "1.5": "1.33", "1.6": "1.34", "1.7": "1.34", "1.8": "1.34", "1.9": "1.35",
}


class VersionError(ValueError):
    """A version pin outside what EKS supports (at standard cost) or Karpenter supports."""


def today() -> date:
    return datetime.now(UTC).date()


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def check_eks_support(kubernetes: str, allow_extended: bool, on: date, source: str) -> None:
    field = f"{source}: mlplatform:cluster.kubernetesVersion {kubernetes!r}"
    support = EKS_CALENDAR.get(kubernetes)
    if support is None:
        raise VersionError(f"{field} is not in the EKS release calendar this program knows "
                           f"({', '.join(EKS_CALENDAR)}): add its dates to provisioning/versions.py "
                           "EKS_CALENDAR from the EKS user guide")
    if on >= support.extended_until:
        raise VersionError(f"{field} reached the end of EKS extended support on "
                           f"{support.extended_until.isoformat()}: EKS creates no such cluster "
                           "and upgrades existing ones; pin a newer version")
    if on >= support.standard_until and not allow_extended:
        raise VersionError(
            f"{field} left EKS standard support on {support.standard_until.isoformat()} "
            f"(extended support until {support.extended_until.isoformat()}): "
            f"{EXTENDED_SUPPORT_COST}. Pin a version in standard support "
            f"({', '.join(standard_versions(on)) or 'none known: update EKS_CALENDAR'}), or "
            f"accept the cost with mlplatform:cluster.allowExtendedSupport: true in {source}")


def standard_versions(on: date) -> list[str]:
    return [v for v, s in EKS_CALENDAR.items() if on < s.standard_until]


def check_karpenter(kubernetes: str, karpenter: str, source: str) -> None:
    lowest = KARPENTER_MIN.get(kubernetes)
    newest = KARPENTER_MAX_KUBERNETES.get(_minor(karpenter))
    where = (f"{source}: mlplatform:cluster.kubernetesVersion {kubernetes!r} with Karpenter "
             f"{karpenter} (provisioning/versions.py KARPENTER_CHART_VERSION)")
    if lowest is None or newest is None:
        raise VersionError(f"{where}: not in Karpenter's compatibility matrix as this program "
                           "knows it (provisioning/versions.py KARPENTER_MIN, KARPENTER_MAX_KUBERNETES)")
    if _key(karpenter) < _key(lowest):
        raise VersionError(f"{where}: Kubernetes {kubernetes} needs Karpenter >= {lowest}")
    if _key(kubernetes) > _key(newest):
        raise VersionError(f"{where}: Karpenter {_minor(karpenter)} supports Kubernetes up to "
                           f"{newest}")


def check_versions(kubernetes: str, allow_extended: bool, source: str, *,
                   karpenter: str = KARPENTER_CHART_VERSION, on: date | None = None) -> None:
    """Raise VersionError unless ``kubernetes`` is in EKS standard support ``on`` that day
    (default today, UTC; extended support only with ``allow_extended``) and Karpenter
    ``karpenter`` supports it."""
    check_karpenter(kubernetes, karpenter, source)
    check_eks_support(kubernetes, allow_extended, on or today(), source)

# Progressive delivery add-ons of the serving layer (provisioning/components/delivery.py):
# Argo Rollouts' chart (argoproj/argo-helm `argo-rollouts`; 2.40.2 ships controller v1.8.3)
# and KEDA's (kedacore/charts `keda`). Neither version was checked against a cluster here.
ARGO_ROLLOUTS_CHART_VERSION = "2.40.2"
KEDA_CHART_VERSION = "2.17.2"
