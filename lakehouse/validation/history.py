"""Check history: every rule evaluation is kept so pass rates over time can be queried."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lakehouse.runner import StageRunner
    from lakehouse.validation.rules import CheckOutcome


def record_outcomes(runner: StageRunner, outcomes: list[CheckOutcome]) -> None:
    for o in outcomes:
        runner.audit(
            "check",
            action=o.rule.name,
            outcome="passed" if o.passed else "failed",
            message=o.message,
            details={"rule_type": o.rule.type, "severity": o.rule.severity, "failed_rows": o.failed_rows,
                     "total_rows": o.total_rows},
        )
