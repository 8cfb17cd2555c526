"""`lakehouse checkpoints ...` and `lakehouse entity-raw ...`: file checkpoints and the entity_raw namespace.

* `checkpoints show TABLE [--status quarantined]`: processed / empty / quarantined files of a table
  (synced from the snapshot summaries first);
* `checkpoints rebuild TABLE`: re-derive the checkpoint table from main's snapshot summaries;
* `entity-raw apps` / `entity-raw ensure [APP]`: registered applications and their tables;
* `entity-raw load APP --tenant T (--file-key K | --pattern GLOB)... [--mode APPEND|UPSERT]`;
* `ingest SOURCE [--date YYYY-MM-DD]`: run every stage reading a source now; with `--date`, only that
  day's prefix of its `dated_layout` (lakehouse.ingest.dated), exactly once by the file checkpoints.
"""

from __future__ import annotations

import json
import sys

from lakehouse.cli.app import EXTRA_COMMANDS, _print_table
from lakehouse.platform import Platform


def cmd_checkpoints(args) -> int:
    from lakehouse.ingest.checkpoints import Checkpoints

    platform = Platform.from_env()
    tables = platform.tables()
    if not tables.exists(args.table):
        print(f"error: no Iceberg table {args.table!r} in catalog {platform.settings.catalog_name!r}", file=sys.stderr)
        return 2
    cp = Checkpoints(platform, args.table)
    if args.action == "rebuild":
        n = cp.rebuild(tables)
        print(f"{args.table}: rebuilt {n} processed-file checkpoint(s) from the snapshot summaries; {cp.counts()}")
        return 0
    cp.sync(tables)
    rows = cp.rows(status=args.status, limit=args.limit)
    _print_table([{"file": r["file_key"], "status": r["status"], "size": r["size"], "etag": r["etag"],
                   "run_id": r["run_id"] or "", "snapshot_id": r["snapshot_id"] or "",
                   "error": (r["error"] or "")[:80]} for r in rows])
    mark, _ = cp.mark()
    print(f"\n{cp.counts()}  (checkpoint table synced to snapshot {mark})")
    return 0


def cmd_entity_raw(args) -> int:
    from lakehouse.stage import entity_raw

    platform = Platform.from_env()
    if args.action == "apps":
        catalog = platform.catalog()
        cat = platform.pyiceberg_catalog()
        _print_table([{"application": a.application_id, "enabled": a.enabled, "source": a.source_id or "",
                       "table": entity_raw.table_identifier(a.application_id),
                       "exists": cat.table_exists(entity_raw.table_identifier(a.application_id))}
                      for a in catalog.applications])
        return 0
    try:
        if args.action == "ensure":
            if args.application:
                created = entity_raw.ensure_table(platform, args.application)
                print(f"{entity_raw.table_identifier(args.application)}: {'created' if created else 'exists'}")
            else:
                print("created: " + (", ".join(entity_raw.ensure_all_tables(platform)) or "(none needed)"))
            return 0
        req = entity_raw.LoadRequest(application=args.application, tenant_id=args.tenant, mode=args.mode.upper(),
                                     file_keys=args.file_key or [], patterns=args.pattern or [], bucket=args.bucket,
                                     typename=args.typename, workflow_id=args.workflow_id,
                                     workflow_run_id=args.workflow_run_id,
                                     connection_qualified_name=args.connection_qualified_name)
        res = entity_raw.load(platform, req)
    except entity_raw.UnknownApplication as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(res.metadata(), indent=2))
    return 0


def cmd_ingest(args) -> int:
    from lakehouse.ingest import dated
    from lakehouse.stage.runner import StageRunner

    platform = Platform.from_env()
    catalog = platform.catalog()
    source = next((s for s in catalog.sources if s.source_id == args.source), None)
    if source is None:
        print(f"error: no source {args.source!r} in the metadata", file=sys.stderr)
        return 2
    tags = {}
    if args.date:
        if not source.dated_layout:
            print(f"error: source {args.source!r} has no dated_layout: --date cannot name its files "
                  f"(metadata sources[].dated_layout, e.g. year={{yyyy}}/month={{mm}}/day={{dd}})", file=sys.stderr)
            return 2
        try:
            day = dated.parse_date(args.date)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        tags = {dated.DATE_TAG: day.isoformat(), "lakehouse/ingest": "cli"}
    stages = [s for s in sorted(catalog.stages, key=lambda s: (s.pipeline_id, s.stage_order))
              if s.source_id == args.source and (args.pipeline is None or s.pipeline_id == args.pipeline)]
    if not stages:
        print(f"error: no stage reads source {args.source!r}" + (f" in pipeline {args.pipeline!r}"
              if args.pipeline else ""), file=sys.stderr)
        return 2
    rows = []
    for stage in stages:
        runner = StageRunner(platform, stage.pipeline_id, stage.stage_name, run_tags=tags)
        outcome = runner.load(runner.extract())
        rows.append({"pipeline": stage.pipeline_id, "stage": stage.stage_name, "table": outcome.target.identifier,
                     "day": tags.get(dated.DATE_TAG, ""), "rows_written": outcome.rows_written,
                     "snapshot_id": outcome.snapshot_id or "", "published": outcome.published,
                     "skipped": outcome.skipped_reason or ""})
    _print_table(rows)
    return 0 if all(r["published"] or r["skipped"] for r in rows) else 1


def register(sub) -> None:
    i = sub.add_parser("ingest", help="run the stages reading a source now (--date: one day of its dated_layout)")
    i.add_argument("source")
    i.add_argument("--date", help="a day YYYY-MM-DD: only the files under that day's prefix (dated_layout)")
    i.add_argument("--pipeline", help="only the stages of this pipeline")
    i.set_defaults(func=cmd_ingest)

    c = sub.add_parser("checkpoints", help="file checkpoints of an ingested table")
    csub = c.add_subparsers(dest="action", required=True)
    show = csub.add_parser("show", help="list processed / empty / quarantined files")
    show.add_argument("table", help="namespace.table")
    show.add_argument("--status", choices=["processed", "empty", "quarantined"])
    show.add_argument("--limit", type=int, default=200)
    rb = csub.add_parser("rebuild", help="re-derive the checkpoint table from the snapshot summaries")
    rb.add_argument("table")
    c.set_defaults(func=cmd_checkpoints)

    e = sub.add_parser("entity-raw", help="entity_raw tables of registered applications")
    esub = e.add_subparsers(dest="action", required=True)
    esub.add_parser("apps", help="registered applications and their tables")
    en = esub.add_parser("ensure", help="create entity_raw tables (all registered apps, or one)")
    en.add_argument("application", nargs="?")
    ld = esub.add_parser("load", help="load raw parquet files into entity_raw.<application>")
    ld.add_argument("application")
    ld.add_argument("--tenant", required=True)
    ld.add_argument("--mode", default="APPEND", choices=["APPEND", "UPSERT", "append", "upsert"])
    ld.add_argument("--file-key", action="append", help="an object key (repeatable)")
    ld.add_argument("--pattern", action="append", help="a glob over keys (repeatable)")
    ld.add_argument("--bucket")
    ld.add_argument("--typename")
    ld.add_argument("--workflow-id")
    ld.add_argument("--workflow-run-id")
    ld.add_argument("--connection-qualified-name")
    e.set_defaults(func=cmd_entity_raw)


EXTRA_COMMANDS.append(register)
