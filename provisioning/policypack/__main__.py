"""Thin PolicyPack for `pulumi preview --policy-pack provisioning/policypack`.

The policies live in provisioning/policies.py so tests can run them without starting the
policy gRPC server that constructing a PolicyPack starts.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pulumi_policy import EnforcementLevel, PolicyPack

from provisioning.policies import ALL_POLICIES

PolicyPack(name="mlplatform-guardrails", enforcement_level=EnforcementLevel.MANDATORY, policies=ALL_POLICIES)
