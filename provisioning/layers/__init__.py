"""The program's two layers (docs/infra.md "Stacks in layers"): ``platform`` (AWS only) and
``application`` (in the cluster), joined by the outputs named in ``outputs``."""
