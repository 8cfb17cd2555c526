"""Validation rules evaluated on Spark DataFrames; outcomes become Dagster asset check results."""

from lakehouse.validation.rules import CheckOutcome, evaluate_rules, split_row_actions

__all__ = ["CheckOutcome", "evaluate_rules", "split_row_actions"]
