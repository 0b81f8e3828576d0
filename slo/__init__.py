"""SLOs, recovery objectives, evidence, gate and report (docs/DESIGN.md section 2).

specs/      OpenSLO + RecoveryObjective specs and their loader (`load_specs`)
evidence    run-directory loader (docs/EVIDENCE.md)
sli, budget, scoring, invariants, dropped   pure math on evidence records
evaluate    evidence + specs -> Verdict;  checks: objective rows;  decision: exit code/result
report/junit/charts: outputs;  rules: Prometheus rules
"""
