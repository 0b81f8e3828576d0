"""The Kubernetes pin against the EKS release calendar and Karpenter's compatibility matrix
(provisioning/versions.py, issue 49 item 6). The date the check uses is injected: these tests do not
change with the calendar."""

from __future__ import annotations

from datetime import date

import pytest

from provisioning import versions
from provisioning.config import ConfigError
from provisioning.versions import (
    EKS_CALENDAR,
    KARPENTER_CHART_VERSION,
    KARPENTER_MIN,
    VersionError,
    check_eks_support,
    check_karpenter,
    check_versions,
)
from tests.infra.harness import run_program, stack_config

STACKS = ("dev", "staging", "prod")
SRC = "Pulumi.dev.yaml"


def _cluster(stack: str) -> dict:
    return stack_config(stack)["mlplatform:cluster"]


@pytest.mark.parametrize("stack", STACKS)
def test_current_pins_pass(stack: str) -> None:
    """Today's pin with today's date: 1.33 is past standard support since 2026-07-29, so the
    committed stacks pass only because they accept extended support explicitly."""
    cluster = _cluster(stack)
    check_karpenter(cluster["kubernetesVersion"], KARPENTER_CHART_VERSION, SRC)
    check_versions(cluster["kubernetesVersion"], cluster.get("allowExtendedSupport", False),
                   f"Pulumi.{stack}.yaml")


def test_current_pin_was_in_standard_support_until_its_end_date() -> None:
    check_eks_support("1.33", False, date(2026, 7, 28), SRC)
    with pytest.raises(VersionError):
        check_eks_support("1.33", False, date(2026, 7, 29), SRC)


def test_past_standard_support_refused_naming_file_field_and_cost() -> None:
    with pytest.raises(VersionError) as info:
        check_eks_support("1.33", False, date(2026, 12, 6), SRC)
    msg = str(info.value)
    assert "Pulumi.dev.yaml" in msg and "mlplatform:cluster.allowExtendedSupport: true" in msg
    assert "left EKS standard support on 2026-07-29" in msg and "6x" in msg
    assert "(1.35)" in msg  # what is in standard support that day
    check_eks_support("1.33", True, date(2026, 12, 6), SRC)  # explicitly allowed


def test_past_extended_support_refused_even_when_allowed() -> None:
    with pytest.raises(VersionError, match="end of EKS extended support on 2027-07-29"):
        check_eks_support("1.33", True, date(2027, 7, 29), SRC)


def test_version_missing_from_the_calendar_refused() -> None:
    with pytest.raises(VersionError, match="not in the EKS release calendar"):
        check_eks_support("1.28", True, date(2024, 1, 1), SRC)


def test_calendar_dates_are_ordered() -> None:
    for version, support in EKS_CALENDAR.items():
        assert support.standard_until < support.extended_until, version
        assert version in KARPENTER_MIN, version  # the pair check knows every version


@pytest.mark.parametrize(("kubernetes", "karpenter", "ok"), [
    ("1.33", "1.5.4", True),
    ("1.34", "1.5.4", False),  # needs >= 1.6
    ("1.32", "1.1.4", False),  # needs >= 1.2
    ("1.34", "1.6.3", True),
    ("1.35", "1.6.3", False),  # 1.6 supports up to 1.34
    ("1.35", "1.9.0", True),
    ("1.33", "1.4.1", False),
    ("1.33", "2.0.0", False),  # unknown Karpenter minor: refused, not guessed
])
def test_karpenter_pair(kubernetes: str, karpenter: str, ok: bool) -> None:
    if ok:
        check_karpenter(kubernetes, karpenter, SRC)
    else:
        with pytest.raises(VersionError, match="Karpenter"):
            check_karpenter(kubernetes, karpenter, SRC)


def test_program_refuses_extended_support_without_the_field(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(versions, "today", lambda: date(2026, 12, 6))
    with pytest.raises(ConfigError) as info:
        run_program("dev", {"mlplatform:cluster": {"allowExtendedSupport": None}},
                    layers=("platform",))
    assert "Pulumi.dev.yaml" in str(info.value)
    assert "mlplatform:cluster.allowExtendedSupport" in str(info.value)


def test_program_refuses_an_incompatible_karpenter_pair(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(versions, "today", lambda: date(2026, 8, 1))
    with pytest.raises(ConfigError, match=r"'1.34' with Karpenter 1.5.4.*needs Karpenter >= 1.6"):
        run_program("dev", {"mlplatform:cluster": {"kubernetesVersion": "1.34"}},
                    layers=("platform",))
