"""Thin PolicyPack for `pulumi preview --policy-pack infra/policypack`.

The policies live in infra/policies.py so tests can run them without starting the
policy gRPC server that constructing a PolicyPack starts.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pulumi_policy import EnforcementLevel, PolicyPack

from infra.policies import ALL_POLICIES

PolicyPack(name="mlplatform-guardrails", enforcement_level=EnforcementLevel.MANDATORY, policies=ALL_POLICIES)
