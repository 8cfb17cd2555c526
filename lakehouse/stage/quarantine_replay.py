"""Replaying quarantined rows: re-validate them with the current rules and move the passing ones
into the dataset through the stage's own write-audit-publish (so it sits above the runner)."""

from __future__ import annotations

import logging
import uuid

from lakehouse.platform import Platform
from lakehouse.runtime import coordination
from lakehouse.stage.core import Batch
from lakehouse.stage.runner import StageRunner
from lakehouse.stage.wap_service import require_enabled
from lakehouse.table.iceberg import quote
from lakehouse.validation.quarantine import (
    META_COLUMNS,
    ReplayResult,
    _delete_ids,
    quarantine_identifier,
    read_quarantine,
    resolve_dataset,
)
from lakehouse.validation.rules import FAILED_RULES_COLUMN, acting_rules, tag_failures


def replay(platform: Platform, dataset: str, run_id: str | None = None, logger: logging.Logger | None = None
           ) -> ReplayResult:
    """Re-validate quarantined rows with the current rules; move the passing ones into the
    dataset through write-audit-publish, then delete exactly those rows from quarantine.

    Rows still failing a drop/quarantine rule stay in quarantine as they are. If the audit of the replayed rows fails, nothing moves (AuditFailed propagates).
    """
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    target = resolve_dataset(platform, dataset)
    catalog = platform.catalog()
    stage = catalog.stage_for_target(target.target_id)
    if stage is None:
        raise KeyError(f"no stage writes dataset {dataset!r}: nothing to replay through")
    run_id = run_id or f"replay_{uuid.uuid4().hex[:16]}"
    result = ReplayResult(target.identifier, run_id)
    q = read_quarantine(platform, dataset)
    if q is None:
        return result
    runner = StageRunner(platform, stage.pipeline_id, stage.stage_name, run_id, logger)
    rules = [r for r in runner.rules if r.enabled]
    data_cols = [c for c in q.columns if c not in META_COLUMNS]
    retagged = tag_failures(q.select(*[F.col(quote(c)) for c in data_cols], "_quarantine_id"), rules)
    acting = F.array(*[F.lit(r.name) for r in acting_rules(rules)]) if acting_rules(rules) else None
    passes = ~F.arrays_overlap(F.col(FAILED_RULES_COLUMN), acting) if acting is not None else F.lit(True)
    retagged = retagged.withColumn("__passes", passes).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        counts = retagged.groupBy("__passes").count().collect()
        by = {r["__passes"]: r["count"] for r in counts}
        result.candidates = sum(by.values())
        result.still_failing = by.get(False, 0)
        for r in (retagged.where(~F.col("__passes")).select(F.explode(FAILED_RULES_COLUMN).alias("rule"))
                  .groupBy("rule").count().collect()):
            result.still_failing_by_rule[r["rule"]] = r["count"]
        ok = retagged.where(F.col("__passes"))
        ids = [r["_quarantine_id"] for r in ok.select("_quarantine_id").collect()]
        if not ids:
            return result
        rows = ok.select(*[F.col(quote(c)) for c in data_cols])
        require_enabled(runner, "before quarantine replay")
        runner.audit("quarantine_replay_started", details={"rows": len(ids)})
        outcome = runner.wap(quarantine=False).run(
            [Batch(rows, {"lakehouse.run_id": run_id, "lakehouse.replay_of": quarantine_identifier(target.identifier)},
                   label="quarantine replay")])
        result.replayed = outcome.rows_written
        result.snapshot_id = outcome.snapshot_id
        result.published = outcome.published
        _delete_ids(platform, quarantine_identifier(target.identifier), ids)
        runner.audit("quarantine_replayed", outcome="success",
                     details={"replayed": result.replayed, "still_failing": result.still_failing})
    finally:
        retagged.unpersist()
        coordination.release_lease(platform, run_id, target.identifier)  # taken by the write-audit-publish service
    return result
