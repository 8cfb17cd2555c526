"""`lakehouse` command line: metadata, runs, demo data, control plane and inspection."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from lakehouse.metadata.loader import MetadataError, load_metadata
from lakehouse.platform import Platform

COMMANDS: dict[str, Callable[[argparse.ArgumentParser], None]] = {}


def _print_table(rows: list[dict], columns: list[str] | None = None) -> None:
    if not rows:
        print("(none)")
        return
    columns = columns or list(rows[0])
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns))
    print("  ".join("-" * widths[c] for c in columns))
    for r in rows:
        print("  ".join(str(r.get(c, "")).ljust(widths[c]) for c in columns))


# ---------------------------------------------------------------- metadata
def _live_tables(settings, *, readonly: bool):
    """Schemas of the tables that exist now (for the static checks), or None without a catalog."""
    from lakehouse.table.catalog import LiveTables, pyiceberg_catalog, readonly_catalog

    cat = readonly_catalog(settings) if readonly else pyiceberg_catalog(settings)
    return LiveTables(cat) if cat is not None else None


def cmd_metadata(args) -> int:
    if args.action == "reference":
        from lakehouse.metadata.reference import render

        print(render())
        return 0
    if args.action in ("validate", "apply"):  # Python transformation modules next to the metadata import
        from lakehouse.metadata.python_ref import search_in

        search_in(Path(args.path) if Path(args.path).is_dir() else Path(args.path).parent)
    if args.action == "validate":  # reads the files (and the catalog, if there is one): writes nothing
        from lakehouse.metadata.checks import unchecked
        from lakehouse.settings import load_settings

        settings = load_settings()
        live = _live_tables(settings, readonly=True)
        loaded = load_metadata(args.path, live=live, limits=settings)
        counts = {k: len(v) for k, v in loaded.catalog.model_dump().items() if v}
        print(f"{args.path}: valid ({', '.join(f'{n} {k}' for k, n in counts.items())})")
        for note in unchecked(loaded.catalog, live):
            print(f"note: {note}")
        return 0
    platform = Platform.from_env()
    if args.action in ("upgrade", "revision"):
        from lakehouse.metadata import migrate

        if args.action == "revision":
            print(f"wrote {migrate.revision(platform.store.engine, args.message)}: read it, then commit it")
            return 0
        before = migrate.current(platform.store.engine)
        migrate.upgrade(platform.store.engine)
        print(f"control DB {platform.store!r}: at revision {migrate.current(platform.store.engine)} "
              f"(was {before or 'not migrated'})")
        return 0
    if args.action == "derive":
        from lakehouse.metadata.derived import derive_now

        report = derive_now(platform.store, force=args.all)
        print(f"derived {len(report.rederived)} of {report.total} stage(s) again"
              + (f", dropped {len(report.removed)} of stages that no longer exist" if report.removed else "")
              + ("" if report.rederived or report.removed else ": everything was up to date"))
        return 0
    if args.action == "show":
        catalog = platform.store.load()
        data = catalog.model_dump(mode="json", exclude_defaults=True)
        if args.section:
            data = {args.section: data.get(args.section, [])}
        import yaml

        print(yaml.safe_dump(data, sort_keys=False))
        return 0
    # apply checks references against the merged catalog (a file may refer to rows already applied)
    loaded = load_metadata(args.path, check_refs=False, limits=platform.settings)
    from lakehouse.metadata.locations import touched_locations

    changes = platform.store.apply_changes(loaded, replace=args.replace,
                                           live=_live_tables(platform.settings, readonly=True))
    applied = dict(changes.counts)
    derived = applied.pop("derived_stages", 0)
    print(f"applied {args.path} to {platform.store!r}: " + ", ".join(f"{n} {k}" for k, n in applied.items() if n))
    touched = touched_locations(changes.before, changes.after)
    # what to reload (the UI's "Reload" on these locations, or `dagster dev` picks it up on restart)
    print("code locations changed: " + (", ".join(sorted(touched)) if touched else "none (nothing to reload)"))
    print(f"derived: {derived} stage(s) derived again (SQL tables, column lineage, output columns, checks); the "
          "others were unchanged")
    from lakehouse.stage.entity_raw import ensure_tables_at_startup

    ensure_tables_at_startup(platform)  # entity_raw.<app> for every registered application
    from lakehouse.orchestration.instance import sync_pools

    sync_pools(platform)  # the instance headless runs, the UI and the daemon share; says what it cannot enforce
    from lakehouse.lineage.graph import sync as sync_lineage

    routes = sync_lineage(platform.store)  # dataset_lineage holds every route; recovery paths recomputed
    print(f"lineage: {routes['dataset_lineage']} edge(s), {routes['dataset_recovery_paths']} recovery path(s)")
    for note in _modules_outside_metadata_dir(loaded.catalog, Path(args.path), platform.settings.metadata_dir):
        print(f"note: {note}")
    return 0


def _modules_outside_metadata_dir(catalog, path: Path, metadata_dir: Path) -> list[str]:
    """Python transformation modules found next to the applied files but outside the metadata
    directory that runs import them from (LAKEHOUSE_METADATA_DIR): they would not be found there."""
    import importlib.util

    here = (path if path.is_dir() else path.parent).resolve()
    if here == Path(metadata_dir).resolve():
        return []
    notes = []
    for st in catalog.stages:
        if st.python_transformation is None:
            continue
        top = st.python_transformation.function.partition(":")[0].split(".")[0]
        spec = importlib.util.find_spec(top)
        origin = Path(spec.origin).resolve() if spec is not None and spec.origin else None
        if origin is not None and here in origin.parents:
            notes.append(f"stage {st.pipeline_id}.{st.stage_name}'s module {top!r} is in {here}, but runs import "
                         f"transformation modules from the metadata directory {metadata_dir} (LAKEHOUSE_METADATA_DIR): "
                         f"set LAKEHOUSE_METADATA_DIR={here} for the CLI, dagster dev and lakehouse serve")
    return notes


def cmd_workspace(args) -> int:
    """workspace.yaml naming every code location the control DB's pipelines are served by."""
    from lakehouse.metadata.locations import code_locations, write_workspace

    platform = Platform.from_env()
    found = code_locations(platform.store)
    out = Path(args.output)
    write_workspace(out, found)
    print(f"wrote {out}: {len(found)} code location(s): "
          + ", ".join(f"{name} ({n} pipeline(s))" for name, n in sorted(found.items())))
    return 0


# ---------------------------------------------------------------- runs
def cmd_demo(args) -> int:
    from lakehouse.cli.demo import generate_user_events

    platform = Platform.from_env()
    out = Path(args.out) if args.out else platform.settings.landing_dir / "user_events"
    summary = generate_user_events(out, rows=args.rows, files=args.files, seed=args.seed)
    print(f"wrote {summary['rows']} user events in {summary['files']} files to {out}")
    return 0


# ---------------------------------------------------------------- control plane
def cmd_pipeline(args) -> int:
    platform = Platform.from_env()
    platform.catalog().pipeline(args.pipeline_id)  # unknown id -> KeyError naming the known ones
    platform.store.set_enabled("pipeline", args.pipeline_id, args.action == "enable", by="cli")
    print(f"pipeline {args.pipeline_id} {args.action}d")
    return 0


def cmd_stage(args) -> int:
    platform = Platform.from_env()
    platform.catalog().stage(args.pipeline_id, args.stage_name)
    platform.store.set_enabled("stage", f"{args.pipeline_id}.{args.stage_name}", args.action == "enable", by="cli")
    print(f"stage {args.pipeline_id}.{args.stage_name} {args.action}d")
    return 0


def cmd_audit(args) -> int:
    from datetime import datetime

    platform = Platform.from_env()
    since = datetime.fromisoformat(args.since) if args.since else None
    rows = [e.model_dump() for e in platform.store.audit_entries(pipeline_id=args.pipeline, since=since,
                                                                  run_id=args.run_id, event=args.event,
                                                                  limit=args.limit)]
    _print_table(rows, ["ts", "run_id", "pipeline_id", "stage_name", "event", "action", "outcome",
                        "error_class", "message", "duration_ms"])
    return 0


# ---------------------------------------------------------------- branches
def cmd_branches(args) -> int:
    from lakehouse.table import branches as hygiene

    platform = Platform.from_env()
    tables = platform.tables()
    catalog = platform.catalog()
    targets = {t.identifier: t for t in catalog.targets if t.kind == "iceberg"}
    idents = [args.table] if getattr(args, "table", None) else list(targets)
    if args.action == "list":  # a run's quarantine rows sit on the same-named branch of the quarantine table
        from lakehouse.validation.quarantine import quarantine_identifier

        idents += [quarantine_identifier(i) for i in list(idents) if not i.endswith("__quarantine")]
        rows = []
        for ident in idents:
            data = ident[: -len("__quarantine")] if ident.endswith("__quarantine") else ident
            retention = hygiene.retention_s(catalog, targets.get(data))
            for st in hygiene.branch_states(platform, tables, ident, lease_table=data, retention=retention):
                rows.append({"table": ident, "branch": st.branch, "state": st.state, "run_id": st.run_id or "",
                             "kept_until": st.kept_until, "snapshot_id": st.snapshot_id,
                             "added_records": st.added_records})
        _print_table(rows)
    elif args.action == "show":
        df = tables.read(args.table, args.branch)
        print(f"{args.table} @ {args.branch}: {df.count()} rows (main: {tables.read(args.table).count()})")
        df.show(args.rows, truncate=False)
    elif args.action == "drop":
        refs = tables.refs_if_exists(args.table)
        if refs is None or args.branch not in refs:  # nothing to drop: say so, and what there is
            there = ", ".join(sorted(b for b in refs or {} if b != "main")) or "none but main"
            print(f"error: {args.table} has no branch {args.branch!r}" if refs is not None else
                  f"error: no table {args.table!r}", file=sys.stderr)
            if refs is not None:
                print(f"its branches: {there} (`lakehouse branches list {args.table}`)", file=sys.stderr)
            return 1
        n = hygiene.drop_branch_and_commits(tables, args.table, args.branch)
        print(f"dropped branch {args.branch} of {args.table} ({n} commit(s) only it held expired)")
    elif args.action == "prune":
        report = hygiene.prune(platform, tables, catalog, [args.table] if args.table else None,
                               orphans=args.orphans, orphan_min_age_hours=args.orphan_min_age_hours)
        for row in report:
            row["dropped"] = ", ".join(row["dropped"]) or "-"
            row["published"] = ", ".join(row["published"]) or "-"
        _print_table(report)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lakehouse", description=__doc__)
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO; `run` prints Dagster's event stream")
    sub = p.add_subparsers(dest="command", required=True)

    m = sub.add_parser("metadata", help="validate, apply or show metadata")
    msub = m.add_subparsers(dest="action", required=True)
    for action in ("validate", "apply"):
        a = msub.add_parser(action)
        a.add_argument("path", help="a metadata YAML file or a directory of them")
        if action == "apply":
            a.add_argument("--replace", action="store_true", help="replace all metadata instead of merging by key")
    s = msub.add_parser("show")
    s.add_argument("section", nargs="?")
    dv = msub.add_parser("derive", help="derive again what apply stores per stage (SQL tables, column lineage, "
                                        "columns, checks) for stages changed outside apply, e.g. by plain SQL")
    dv.add_argument("--all", action="store_true", help="derive every stage again, changed or not")
    msub.add_parser("reference", help="print the Markdown reference of every metadata table and field")
    msub.add_parser("upgrade", help="create or upgrade the control DB's tables to the newest migration "
                                    "(apply and the first use of a process do it too)")
    rv = msub.add_parser("revision", help="for developers: write a migration for the tables or model fields "
                                          "added since the newest one (Alembic autogenerate)")
    rv.add_argument("-m", "--message", required=True)
    m.set_defaults(func=cmd_metadata)


    w = sub.add_parser("workspace", help="write a workspace.yaml with one entry per code location of the pipelines "
                                         "(`code_location`); `dagster dev -w <file>` loads them")
    w.add_argument("--output", default="workspace.yaml")
    w.set_defaults(func=cmd_workspace)

    d = sub.add_parser("demo", help="generate deterministic demo landing data")
    d.add_argument("--rows", type=int, default=200_000)
    d.add_argument("--files", type=int, default=8)
    d.add_argument("--seed", type=int, default=42)
    d.add_argument("--out")
    d.set_defaults(func=cmd_demo)

    pl = sub.add_parser("pipeline", help="kill switch for a pipeline")
    pl.add_argument("action", choices=["enable", "disable"])
    pl.add_argument("pipeline_id")
    pl.set_defaults(func=cmd_pipeline)

    st = sub.add_parser("stage", help="kill switch for one stage")
    st.add_argument("action", choices=["enable", "disable"])
    st.add_argument("pipeline_id")
    st.add_argument("stage_name")
    st.set_defaults(func=cmd_stage)

    au = sub.add_parser("audit", help="print the audit log")
    au.add_argument("--pipeline")
    au.add_argument("--since", help="ISO timestamp")
    au.add_argument("--run-id")
    au.add_argument("--event", help="only this event, e.g. file_quarantined (a run's quarantined files and why)")
    au.add_argument("--limit", type=int, default=200)
    au.set_defaults(func=cmd_audit)

    b = sub.add_parser("branches", help="audit branches of Iceberg tables")
    bsub = b.add_subparsers(dest="action", required=True)
    bl = bsub.add_parser("list")
    bl.add_argument("table", nargs="?")
    bs = bsub.add_parser("show")
    bs.add_argument("table")
    bs.add_argument("branch")
    bs.add_argument("--rows", type=int, default=10)
    bd = bsub.add_parser("drop")
    bd.add_argument("table")
    bd.add_argument("branch")
    bp = bsub.add_parser("prune", help="drop branches of dead runs and failed audits past their retention")
    bp.add_argument("table", nargs="?")
    bp.add_argument("--orphans", action="store_true",
                    help="also remove files no commit references (older than orphan_files.min_age_hours)")
    bp.add_argument("--orphan-min-age-hours", type=float, default=None,
                    help="override the minimum age of orphan files to remove")
    b.set_defaults(func=cmd_branches)

    for register in EXTRA_COMMANDS:
        register(sub)
    return p


#: Other modules add subcommands here (quarantine, checks, sql, lineage...): each is a function
#: taking the subparsers object.
EXTRA_COMMANDS: list[Callable] = []


#: Packages above the domain add their commands through this entry-point group (pyproject's
#: `[project.entry-points."lakehouse.cli"]`): the Dagster layer adds `lakehouse run`, which
#: executes a job. The domain never imports that layer (import-linter checks it).
ENTRY_POINT_GROUP = "lakehouse.cli"


#: the modules of lakehouse.cli that register no commands
NOT_COMMANDS = frozenset({"__init__", "__main__", "app", "demo"})


def _load_extra_commands() -> None:
    """Import every command module of `lakehouse/cli/` (each registers its subcommands in EXTRA_COMMANDS), then
    add the commands other installed packages register in the `lakehouse.cli` entry points."""
    import importlib
    from importlib.metadata import entry_points

    for path in sorted(Path(__file__).parent.glob("*.py")):
        if path.stem not in NOT_COMMANDS:
            importlib.import_module(f"lakehouse.cli.{path.stem}")
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        register = ep.load()
        if register not in EXTRA_COMMANDS:
            EXTRA_COMMANDS.append(register)


def main(argv: list[str] | None = None) -> int:
    """The command line; `argv` None (the `lakehouse` process itself) ends the process here
    (`exit_without_teardown`), a list (a caller in the same process, e.g. a test) returns the code."""
    _load_extra_commands()
    args = build_parser().parse_args(argv)
    # whether the command owns its process: only then may it change process-wide state (`lakehouse
    # run`'s answer to pyarrow's pandas probes, lakehouse.runtime.pyarrow_probes); a caller in the same process may not
    args.own_process = argv is None
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        code = args.func(args) or 0
    except MetadataError as exc:
        print(str(exc), file=sys.stderr)
        code = 2
    except KeyError as exc:
        print(f"error: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        code = 2
    if argv is None:
        exit_without_teardown(code)
    return code


def exit_without_teardown(code: int) -> None:
    """End the process with `code`: threads waited for, every exit handler run, streams flushed,
    no module teardown (lakehouse.runtime.startup.end_after_exit_handlers)."""
    from lakehouse.runtime.startup import end_after_exit_handlers

    end_after_exit_handlers(code)


__all__ = ["main", "EXTRA_COMMANDS", "json"]
