"""Validation rules evaluated on Spark DataFrames; outcomes become Dagster asset check results.

Importing the package registers the `check_results` history table on the control DB metadata.
"""

from lakehouse.validation.history import check_history, pass_rates, record_outcomes
from lakehouse.validation.rules import CheckOutcome, RuleError, evaluate_rules, split_row_actions

__all__ = ["CheckOutcome", "RuleError", "check_history", "evaluate_rules", "pass_rates", "record_outcomes",
           "split_row_actions"]
