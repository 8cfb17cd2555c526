"""`lakehouse backfill PIPELINE --from DAY --to DAY`: rewrite those days of a pipeline's
time-partitioned targets (metadata `time_partition`), each stage with write-audit-publish.

The same run a Dagster backfill of the range makes (single-run policy): the stage gets the range as
its partition run tags, recomputes those days from their upstream rows and replaces exactly those
partitions (lakehouse.incremental.IncrementalRead.window_batches). Stages of other targets are left
alone: they have no days to rewrite.
"""

from __future__ import annotations

from datetime import date

from lakehouse.cli import EXTRA_COMMANDS, _print_table
from lakehouse.runner import Platform

COLUMNS = ["stage", "table", "days", "rows_written", "snapshot_id", "published", "skipped"]


def _day(text: str) -> date:
    import argparse

    try:
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a day (YYYY-MM-DD)") from None


def cmd_backfill(args) -> int:
    from lakehouse.incremental import RANGE_END_TAG, RANGE_START_TAG
    from lakehouse.runner import StageRunner

    if args.end < args.start:
        print(f"--to {args.end} is before --from {args.start}")
        return 2
    platform = Platform.from_env()
    catalog = platform.catalog()
    stages = [s for s in sorted(catalog.stages, key=lambda s: s.stage_order) if s.pipeline_id == args.pipeline
              and catalog.target(s.target_id).time_partition is not None
              and (args.stage is None or s.stage_name == args.stage)]
    if not stages:
        print(f"pipeline {args.pipeline!r} has no stage writing a time-partitioned target"
              + (f" named {args.stage!r}" if args.stage else "") + " (metadata targets[].time_partition)")
        return 2
    for stage in stages:
        first = catalog.target(stage.target_id).time_partition.start_date
        if args.start < first:
            print(f"--from {args.start} is before the first partition of {catalog.target(stage.target_id).identifier}, "
                  f"{first} (time_partition.start_date)")
            return 2
    tags = {RANGE_START_TAG: args.start.isoformat(), RANGE_END_TAG: args.end.isoformat(), "lakehouse/backfill": "cli"}
    rows = []
    for stage in stages:
        runner = StageRunner(platform, stage.pipeline_id, stage.stage_name)
        runner.run_tags = dict(tags)
        outcome = runner.load(runner.extract())
        rows.append({"stage": stage.stage_name, "table": outcome.target.identifier,
                     "days": f"{args.start}..{args.end}", "rows_written": outcome.rows_written,
                     "snapshot_id": outcome.snapshot_id, "published": outcome.published,
                     "skipped": outcome.skipped_reason or ""})
    _print_table(rows, COLUMNS)
    return 0 if all(r["published"] for r in rows) else 1


def register(sub) -> None:
    b = sub.add_parser("backfill", help="rewrite days of a pipeline's time-partitioned targets (write-audit-publish)")
    b.add_argument("pipeline")
    b.add_argument("--from", dest="start", type=_day, required=True, help="first day, YYYY-MM-DD")
    b.add_argument("--to", dest="end", type=_day, required=True, help="last day (included), YYYY-MM-DD")
    b.add_argument("--stage", help="only this stage of the pipeline")
    b.set_defaults(func=cmd_backfill)


EXTRA_COMMANDS.append(register)
