"""The platform registry: a name maps to an adapter, a local-environment module and a load
generator; an unknown or broken platform is refused with a message that says which and why,
and nothing else in the harness names a platform."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from infra.local.errors import EnvError
from infra.local.platform import HOOKS, local_platform
from platforms import PLATFORMS, PlatformError, get_adapter, registry

ROOT = Path(__file__).resolve().parents[2]


def test_every_registered_platform_resolves_all_its_parts() -> None:
    assert set(PLATFORMS) >= {"controlplane", "prefect"}
    for name, p in registry.REGISTRY.items():
        assert callable(p.resolve("adapter")) and callable(p.resolve("load")), name
        module = local_platform(name)
        assert all(callable(getattr(module, h)) for h in HOOKS), name


def test_an_unknown_platform_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(PlatformError, match=r"unknown platform 'airflow'; known: controlplane"):
        get_adapter("airflow", {}, {})
    with pytest.raises(EnvError, match="unknown platform 'airflow'"):
        local_platform("airflow")


def test_a_broken_entry_is_refused_naming_the_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = registry.Platform("broken", "a typo in its adapter path",
                               adapter="platforms.prefect:PrefectAdaptr.from_env",
                               local="infra.local.topology", load="loadtests.nope:start")
    monkeypatch.setitem(registry.REGISTRY, "broken", broken)
    with pytest.raises(PlatformError, match=r"platform 'broken': its adapter "
                                            r"'platforms.prefect:PrefectAdaptr.from_env' cannot"):
        get_adapter("broken", {}, {})
    with pytest.raises(PlatformError, match="its load 'loadtests.nope:start' cannot be loaded"):
        broken.resolve("load")
    with pytest.raises(EnvError, match="does not implement the local platform hooks"):
        local_platform("broken")  # infra.local.topology is not a LocalPlatform module


def test_nothing_outside_the_registry_names_a_platform() -> None:
    """No `platform == "prefect"`-style branch anywhere: adding a platform is one module and
    one registry line."""
    pattern = re.compile(r"""(platform|opts\.platform)\s*[!=]=\s*["'](controlplane|prefect)["']""")
    hits = [f"{f}:{n}" for pkg in ("gameday", "chaos", "infra", "loadtests", "platforms", "slo")
            for f in (ROOT / pkg).rglob("*.py")
            for n, line in enumerate(f.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == []
