"""Pulumi program (``main: provisioning/``): one project, two layers (docs/infra.md).

``mlplatform:layer`` selects what a stack deploys: ``platform`` (the default; AWS only,
``Pulumi.<env>.yaml``) or ``application`` (in the cluster, ``Pulumi.<env>-app.yaml``; reads
the platform stack through a StackReference). ``provisioning/layers/`` holds both.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Pulumi runs this directory as a script: make the repository root importable so the
# program can use the `provisioning`, `environments` and `slo` packages without an install step.
_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from provisioning.config import Layer, load_layer

if load_layer() is Layer.APPLICATION:
    from provisioning.layers import application

    application.build()
else:
    from provisioning.layers import platform

    platform.build()
