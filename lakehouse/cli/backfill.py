"""`lakehouse backfill PIPELINE --from PERIOD --to PERIOD`: rewrite those periods (days, hours or
months) of a pipeline's time-partitioned targets (metadata `time_partition`), each stage with
write-audit-publish.

The same run a Dagster backfill of the range makes (single-run policy): the stage gets the range as
its partition run tags (Dagster partition keys of its granularity), recomputes those periods from
their upstream rows and replaces exactly those partitions
(lakehouse.stage.incremental.IncrementalRead.window_batches). Stages of other targets are left alone: they
have no periods to rewrite.

The periods rewritten are recorded on the Dagster instance (`$DAGSTER_HOME`, the one `lakehouse run`,
the UI and the daemon share) as one materialization per partition, as a Dagster backfill's run
records them: the asset's Partitions tab shows them as just materialized.
"""

from __future__ import annotations

from lakehouse.cli.app import EXTRA_COMMANDS, _print_table
from lakehouse.metadata import periods
from lakehouse.stage.periods_written import window_keys
from lakehouse.stage.runner import Platform

COLUMNS = ["stage", "table", "partitions", "rows_written", "snapshot_id", "published", "skipped"]


def cmd_backfill(args) -> int:
    from lakehouse.stage.incremental import RANGE_END_TAG, RANGE_START_TAG
    from lakehouse.stage.runner import StageRunner

    platform = Platform.from_env()
    catalog = platform.catalog()
    stages = [s for s in sorted(catalog.stages, key=lambda s: s.stage_order) if s.pipeline_id == args.pipeline
              and catalog.target(s.target_id).time_partition is not None
              and (args.stage is None or s.stage_name == args.stage)]
    if not stages:
        print(f"pipeline {args.pipeline!r} has no stage writing a time-partitioned target"
              + (f" named {args.stage!r}" if args.stage else "") + " (metadata targets[].time_partition)")
        return 2
    windows = {}
    for stage in stages:  # every stage's range is checked before any runs
        target = catalog.target(stage.target_id)
        tp = target.time_partition
        g = tp.granularity
        try:
            start, end = periods.parse(g, args.start), periods.parse(g, args.end)
        except ValueError as exc:
            print(f"{target.identifier} has {periods.ADJECTIVE[g]} partitions: --from/--to {exc}")
            return 2
        if end < start:
            print(f"--to {args.end} is before --from {args.start}")
            return 2
        first = periods.first(g, tp.start_date)
        if start < first:
            print(f"--from {args.start} is before the first partition of {target.identifier}, "
                  f"{periods.key(g, first)} (time_partition.start_date)")
            return 2
        windows[stage.stage_name] = (periods.key(g, start), periods.key(g, end))
    rows = []
    for stage in stages:
        first_key, last_key = windows[stage.stage_name]
        runner = StageRunner(platform, stage.pipeline_id, stage.stage_name)
        runner.run_tags = {RANGE_START_TAG: first_key, RANGE_END_TAG: last_key, "lakehouse/backfill": "cli"}
        outcome = runner.load(runner.extract())
        if outcome.published and not outcome.skipped_reason:
            record_partitions(stage, outcome, window_keys(outcome.target.time_partition.granularity,
                                                          first_key, last_key))
        rows.append({"stage": stage.stage_name, "table": outcome.target.identifier,
                     "partitions": f"{first_key}..{last_key}", "rows_written": outcome.rows_written,
                     "snapshot_id": outcome.snapshot_id, "published": outcome.published,
                     "skipped": outcome.skipped_reason or ""})
    _print_table(rows, COLUMNS)
    return 0 if all(r["published"] for r in rows) else 1


def record_partitions(stage, outcome, keys: list[str]) -> None:
    """One runless materialization per rewritten partition on the persistent Dagster instance (none
    when there is no instance: nothing shows partitions then)."""
    import dagster as dg

    from lakehouse.orchestration.instance import instance_from_env

    instance = instance_from_env()
    if instance is None:
        return
    key = dg.AssetKey([stage.layer, outcome.target.table])
    md = {**outcome.metadata(), "backfill": "lakehouse backfill"}
    for k in keys:
        instance.report_runless_asset_event(dg.AssetMaterialization(asset_key=key, partition=k, metadata=md))


def register(sub) -> None:
    b = sub.add_parser("backfill", help="rewrite periods (days, hours, months) of a pipeline's time-partitioned "
                       "targets (write-audit-publish)")
    b.add_argument("pipeline")
    b.add_argument("--from", dest="start", required=True,
                   help="first period: a day YYYY-MM-DD, an hour YYYY-MM-DDTHH (UTC) or a month YYYY-MM, as the "
                   "target's time_partition.granularity says (Dagster's partition keys work too)")
    b.add_argument("--to", dest="end", required=True, help="last period (included), in the same form")
    b.add_argument("--stage", help="only this stage of the pipeline")
    b.set_defaults(func=cmd_backfill)


EXTRA_COMMANDS.append(register)
