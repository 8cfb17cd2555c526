"""`lakehouse maintain [TABLE] [--dry-run]`: table maintenance (lakehouse.table.maintenance) on demand."""

from __future__ import annotations

import json

from lakehouse.cli.app import EXTRA_COMMANDS, _print_table
from lakehouse.stage.runner import Platform

COLUMNS = ["table", "due", "files_before", "files_after", "data_files_rewritten", "snapshots_expired",
           "orphan_files_removed", "orphan_files_found", "manifests_rewritten", "duration_ms", "skipped"]


def cmd_maintain(args) -> int:
    from lakehouse.table import maintenance

    platform = Platform.from_env()
    results = maintenance.maintain_all(platform, namespace=args.namespace,
                                       tables=[args.table] if args.table else None, dry_run=args.dry_run)
    if args.json:
        print(json.dumps(results, indent=2, default=str))
        return 0
    _print_table([{c: (", ".join(r[c]) if isinstance(r.get(c), list) else r.get(c, "")) for c in COLUMNS}
                  for r in results], COLUMNS)
    for r in results:
        for step, why in (r.get("reasons") or {}).items():
            print(f"{r['table']}: {step}: {why}")
    return 0


def register(sub) -> None:
    m = sub.add_parser("maintain", help="compact, expire snapshots, remove orphan files and rewrite manifests "
                                        "of Iceberg targets, as their maintenance metadata says")
    m.add_argument("table", nargs="?", help="namespace.table or target id (default: every Iceberg target)")
    m.add_argument("--namespace", help="only the targets of this namespace")
    m.add_argument("--dry-run", action="store_true", help="say what is due (and which orphan files there are), "
                                                         "change nothing")
    m.add_argument("--json", action="store_true", help="print the full results as JSON")
    m.set_defaults(func=cmd_maintain)


EXTRA_COMMANDS.append(register)
