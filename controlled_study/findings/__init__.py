"""`make findings`: the controlled study's thirteen findings, each tested on the rows with a coded verdict rule.

One module per finding (``f_a`` .. ``f_m``: the function that reads its parts, its references, what it declares
about the convergence gate), the shared rule they all follow (``rule``: parts, the verdict rule, the evidence),
the ordered list (``claims``) and the report (``report``: Holm, seeds part by part, the gate's sensitivity, the
files). The rule itself is written out in ``rule``'s docstring and in every report's header."""
from __future__ import annotations

from controlled_study.findings.claims import (  # noqa: F401  (the package's front)
    FINDINGS,
    GATE_BIAS,
    GATE_QUANTITY,
    MODULES,
)
from controlled_study.findings.report import (  # noqa: F401  (the package's front)
    REAL_FINDINGS,
    SEED_RULE,
    combine_seeds,
    correct,
    count_line,
    evaluate,
    real_model_sections,
    report,
    seed_differences,
    seeded,
    sensitivity,
    study_model,
    write,
)
from controlled_study.findings.rule import (  # noqa: F401  (the package's front)
    CONTRADICTED,
    CONTROL,
    DASH,
    DEFAULT_MODEL,
    INCONCLUSIVE,
    LONG_F,
    MIXED,
    REPRODUCED,
    RULER_STYLE,
    SAME_DATA,
    TRAIN_F,
    VERDICTS,
    WINDOW_REF,
    Evidence,
    Finding,
    Part,
    approx,
    exact_ft,
    ft_32k,
    grouped,
    label_of,
    members,
    missing_rows,
    needle_missing,
    part_prop,
    ppl_part,
    prop_diff,
    verdict,
)
