"""The thirteen findings in the paper's order, each one module (``f_a`` .. ``f_m``: its function, its references,
and what it declares about the convergence gate); the tables below are read from those modules, never kept here."""
from __future__ import annotations

from controlled_study.findings import f_a, f_b, f_c, f_d, f_e, f_f, f_g, f_h, f_i, f_j, f_k, f_l, f_m

MODULES = (f_a, f_b, f_c, f_d, f_e, f_f, f_g, f_h, f_i, f_j, f_k, f_l, f_m)
FINDINGS = tuple(getattr(m, m.__name__.rsplit(".", 1)[1]) for m in MODULES)

# The convergence gate (``harness.evals.convergence``) admits a fine-tuned row when, inside C, its PPL on held-out
# books is within 10% of the base's and its passkey accuracy is >= 0.9. A finding that tests one of those quantities
# could never come out contradicted on gated rows: it is read on every row, gate-failed included.
GATE_QUANTITY = {f.__name__.removeprefix("f_"): m.GATE_QUANTITY for f, m in zip(FINDINGS, MODULES) if m.GATE_QUANTITY}
# How the gate could bias each finding read on gated rows (the report's "gate" line).
GATE_BIAS = {f.__name__.removeprefix("f_"): m.GATE_BIAS for f, m in zip(FINDINGS, MODULES)}
