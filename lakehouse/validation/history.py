"""Check history: every rule evaluation is one row in the control DB's `check_results` table.

A dedicated table (not only `audit_log` JSON) so that pass rates per dataset and rule are one
indexed SQL query on SQLite and PostgreSQL alike. `check_history` and `pass_rates` are the
stable read API (a dashboard builds on them): keep their signatures.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from lakehouse.metadata.schema import check_results

if TYPE_CHECKING:
    from lakehouse.metadata.store import MetadataStore
    from lakehouse.stage.core import StageContext
    from lakehouse.validation.rules import CheckOutcome


_COLUMNS = ("id", "ts", "run_id", "pipeline_id", "stage_name", "dataset", "rule", "rule_type", "severity",
            "action", "passed", "failed_rows", "total_rows", "message", "details")


def record_results(store: MetadataStore, outcomes: list[CheckOutcome], *, run_id: str | None, dataset: str,
                   pipeline_id: str | None = None, stage_name: str | None = None,
                   ts: datetime | None = None) -> int:
    """Store one row per evaluation, all in one transaction. Returns the number of rows."""
    if not outcomes:
        return 0
    store.create_all()
    ts = ts or datetime.now(UTC)
    rows = [
        {
            "ts": ts, "run_id": run_id, "pipeline_id": pipeline_id, "stage_name": stage_name, "dataset": dataset,
            "rule": o.rule.name, "rule_type": o.rule.type, "severity": o.rule.severity, "action": o.rule.action,
            "passed": bool(o.passed), "failed_rows": int(o.failed_rows), "total_rows": int(o.total_rows),
            "message": (o.message or "")[:4000],
            "details": json.dumps({"expression": o.expression, **o.details,
                                   **({"scope": o.scope} if o.scope else {})}, default=str),
        }
        for o in outcomes
    ]
    with store.engine.begin() as conn:
        conn.execute(sa.insert(check_results), rows)
    return len(rows)


def record_outcomes(runner: StageContext, outcomes: list[CheckOutcome]) -> None:
    """History rows for a stage run, plus one `checks` audit_log event summarising them."""
    record_results(runner.platform.store, outcomes, run_id=runner.run_id, dataset=runner.target.identifier,
                   pipeline_id=runner.stage.pipeline_id, stage_name=runner.stage.stage_name)
    if outcomes:
        failed = [o.rule.name for o in outcomes if not o.passed]
        runner.audit("check", outcome="failed" if failed else "passed",
                     message=(f"failed: {', '.join(failed)}" if failed else f"{len(outcomes)} rule(s) passed"),
                     details={"rules": {o.rule.name: {"passed": o.passed, "severity": o.rule.severity,
                                                      "failed_rows": o.failed_rows, "total_rows": o.total_rows,
                                                      "scope": o.scope}
                                        for o in outcomes}})


def _as_dict(row: Any) -> dict[str, Any]:
    d = {c: row[c] for c in _COLUMNS}
    d["passed"] = bool(d["passed"])
    d["details"] = json.loads(d["details"]) if d["details"] else {}
    if isinstance(d["ts"], datetime) and d["ts"].tzinfo is None:  # SQLite drops the zone; we store UTC
        d["ts"] = d["ts"].replace(tzinfo=UTC)
    return d


def check_history(store: MetadataStore, dataset: str | None = None, rule: str | None = None,
                  limit: int | None = None) -> list[dict]:
    """Check evaluations, newest first; each a dict with the `check_results` columns
    (id, ts, run_id, pipeline_id, stage_name, dataset, rule, rule_type, severity, action, passed,
    failed_rows, total_rows, message, details)."""
    store.create_all()
    q = sa.select(check_results).order_by(check_results.c.ts.desc(), check_results.c.id.desc())
    if dataset is not None:
        q = q.where(check_results.c.dataset == dataset)
    if rule is not None:
        q = q.where(check_results.c.rule == rule)
    if limit is not None:
        q = q.limit(int(limit))
    with store.engine.connect() as conn:
        return [_as_dict(r) for r in conn.execute(q).mappings()]


def pass_rates(store: MetadataStore, last_n: int = 20) -> list[dict]:
    """Pass rate per (dataset, rule) over each rule's last `last_n` evaluations.

    Each dict: dataset, rule, severity, evaluations, passed, failed, pass_rate (0..1),
    last_ts, last_passed. Sorted by dataset, rule.
    """
    if last_n < 1:
        raise ValueError(f"last_n must be >= 1, got {last_n}")
    store.create_all()
    c = check_results.c
    rn = sa.func.row_number().over(partition_by=(c.dataset, c.rule), order_by=(c.ts.desc(), c.id.desc()))
    recent = sa.select(c.dataset, c.rule, c.severity, c.passed, c.ts, rn.label("rn")).subquery()
    q = (sa.select(recent.c.dataset, recent.c.rule, recent.c.severity, recent.c.passed, recent.c.ts, recent.c.rn)
         .where(recent.c.rn <= int(last_n)).order_by(recent.c.dataset, recent.c.rule, recent.c.rn))
    out: dict[tuple[str, str], dict[str, Any]] = {}
    with store.engine.connect() as conn:
        for r in conn.execute(q).mappings():
            key = (r["dataset"], r["rule"])
            d = out.get(key)
            if d is None:  # rn == 1: the newest evaluation
                ts = r["ts"].replace(tzinfo=UTC) if isinstance(r["ts"], datetime) and r["ts"].tzinfo is None else r["ts"]
                d = out[key] = {"dataset": r["dataset"], "rule": r["rule"], "severity": r["severity"],
                                "evaluations": 0, "passed": 0, "failed": 0, "pass_rate": 0.0,
                                "last_ts": ts, "last_passed": bool(r["passed"])}
            d["evaluations"] += 1
            d["passed" if r["passed"] else "failed"] += 1
    for d in out.values():
        d["pass_rate"] = d["passed"] / d["evaluations"]
    return [out[k] for k in sorted(out)]
