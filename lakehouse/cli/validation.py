"""`lakehouse quarantine show|replay DATASET` and `lakehouse checks report|history`."""

from __future__ import annotations

from lakehouse.cli.app import EXTRA_COMMANDS, _print_table
from lakehouse.platform import Platform


def cmd_quarantine(args) -> int:
    from lakehouse.validation import quarantine as q

    platform = Platform.from_env()
    if args.action == "show":
        target = q.resolve_dataset(platform, args.dataset)
        rows = q.summary(platform, args.dataset)
        print(f"quarantine of {target.identifier} ({q.quarantine_identifier(target.identifier)}):")
        _print_table(rows, ["rule", "run_id", "rows", "latest"])
        df = q.read_quarantine(platform, args.dataset)
        if df is not None and args.rows:
            df.orderBy("_quarantined_at").show(args.rows, truncate=False)
        return 0
    from lakehouse.stage.core import AuditFailed
    from lakehouse.stage.quarantine_replay import replay

    try:
        res = replay(platform, args.dataset)
    except AuditFailed as exc:
        print(f"replay not published: {exc}")
        return 1
    print(f"replayed {res.replayed} of {res.candidates} quarantined row(s) of {res.dataset} "
          f"(run {res.run_id}, snapshot {res.snapshot_id}); {res.still_failing} still failing"
          + (": " + ", ".join(f"{k}={v}" for k, v in sorted(res.still_failing_by_rule.items()))
             if res.still_failing_by_rule else ""))
    return 0


def cmd_checks(args) -> int:
    from lakehouse.validation.history import check_history, pass_rates

    platform = Platform.from_env()
    if args.action == "report":
        rows = pass_rates(platform.store, last_n=args.last)
        if args.dataset:
            rows = [r for r in rows if r["dataset"] == args.dataset]
        for r in rows:
            r["pass_rate"] = f"{100 * r['pass_rate']:.1f}%"
            r["last"] = "passed" if r["last_passed"] else "FAILED"
            r["last_ts"] = r["last_ts"].isoformat(timespec="seconds") if r["last_ts"] else ""
        print(f"check pass rates over the last {args.last} evaluations per rule")
        _print_table(rows, ["dataset", "rule", "severity", "evaluations", "passed", "failed", "pass_rate", "last",
                            "last_ts"])
        return 0
    rows = check_history(platform.store, dataset=args.dataset, rule=args.rule, limit=args.limit)
    for r in rows:
        r["passed"] = "passed" if r["passed"] else "FAILED"
        r["ts"] = r["ts"].isoformat(timespec="seconds")
    _print_table(rows, ["ts", "run_id", "dataset", "rule", "severity", "passed", "failed_rows", "total_rows",
                        "message"])
    return 0


def register(sub) -> None:
    q = sub.add_parser("quarantine", help="inspect and replay quarantined rows")
    qsub = q.add_subparsers(dest="action", required=True)
    qs = qsub.add_parser("show", help="quarantined rows per rule and run")
    qs.add_argument("dataset", help="target_id or namespace.table")
    qs.add_argument("--rows", type=int, default=10, help="also print this many rows (0: none)")
    qr = qsub.add_parser("replay", help="re-validate quarantined rows and publish the passing ones")
    qr.add_argument("dataset", help="target_id or namespace.table")
    q.set_defaults(func=cmd_quarantine)

    c = sub.add_parser("checks", help="check history and pass rates")
    csub = c.add_subparsers(dest="action", required=True)
    cr = csub.add_parser("report", help="pass rate per dataset and rule")
    cr.add_argument("--last", type=int, default=20, help="evaluations per rule to count")
    cr.add_argument("--dataset")
    ch = csub.add_parser("history", help="individual check evaluations, newest first")
    ch.add_argument("--dataset")
    ch.add_argument("--rule")
    ch.add_argument("--limit", type=int, default=50)
    c.set_defaults(func=cmd_checks)


EXTRA_COMMANDS.append(register)
