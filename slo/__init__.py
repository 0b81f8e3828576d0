"""SLOs, recovery objectives, evidence, gate and report (docs/DESIGN.md section 2).

specs/      OpenSLO + RecoveryObjective specs and their loader (`load_specs`)
evidence    run-directory loader (docs/EVIDENCE.md)
sli, budget, scoring   pure math
evaluate    evidence + specs -> Verdict;  report/junit/charts: outputs;  rules: Prometheus rules
"""
