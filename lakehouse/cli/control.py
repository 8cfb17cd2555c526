"""`lakehouse control status|enforce|explain`: the control plane from the command line.

* `status`: every pipeline/stage with its effective enabled flag and the reason, then every source
  and target with its own flag;
* `source|target enable|disable ID`: the dataset kill switches (a source off is not read, a target
  off is not written; the stages touching them skip with the reason);
* `enforce`: one kill-switch pass against the Dagster instance in DAGSTER_HOME (what the
  `lakehouse_kill_switch` sensor does every few seconds);
* `explain "ERROR TEXT"`: the error code the text classifies to and the healing rules that would
  run, in order — a dry run for writing `healing_actions`.
"""

from __future__ import annotations

from lakehouse.cli.app import EXTRA_COMMANDS, _print_table
from lakehouse.platform import Platform


def cmd_control(args) -> int:
    platform = Platform.from_env()
    if args.action == "status":
        catalog = platform.catalog()
        rows = []
        for p in catalog.pipelines:
            ok, why = platform.store.enabled(p.pipeline_id)
            rows.append({"pipeline": p.pipeline_id, "stage": "*", "enabled": ok, "reason": why})
            for s in catalog.stages_of(p.pipeline_id):
                ok, why = platform.store.enabled(p.pipeline_id, s.stage_name)
                rows.append({"pipeline": p.pipeline_id, "stage": s.stage_name, "enabled": ok, "reason": why})
        _print_table(rows)
        from lakehouse.control.flags import dataset_status

        print()
        _print_table(dataset_status(catalog))  # source / target flags: off = not read / not written
        return 0
    if args.action == "enforce":
        import dagster as dg

        from lakehouse.orchestration.killswitch import enforce

        stopped = enforce(dg.DagsterInstance.get(), platform)
        _print_table([{"run_id": d.run_id, "pipeline": d.pipeline_id, "action": d.action, "was": d.status,
                       "reason": d.reason} for d in stopped])
        return 0
    from lakehouse.control.healing import matching_rules
    from lakehouse.errors import classify_text

    info = classify_text(args.text)
    print(f"error code: {info.code}; class: {info.error_class}")
    rules = matching_rules(platform.catalog().healing_actions, info)
    if not rules:
        print("no healing action matches: the step fails (then the retry policy applies)")
        return 0
    _print_table([{"priority": r.priority, "healing_id": r.healing_id, "actions": " → ".join(r.actions),
                   "max_attempts": r.max_attempts} for r in rules])
    return 0


def cmd_dataset_flag(args) -> int:
    platform = Platform.from_env()
    catalog = platform.catalog()
    (catalog.source if args.command == "source" else catalog.target)(args.dataset_id)  # unknown: KeyError
    platform.store.set_enabled(args.command, args.dataset_id, args.action == "enable", by="cli")
    print(f"{args.command} {args.dataset_id} {args.action}d")
    return 0


def register(sub) -> None:
    c = sub.add_parser("control", help="kill switch status/enforcement and healing dry runs")
    csub = c.add_subparsers(dest="action", required=True)
    csub.add_parser("status", help="effective enabled flag of every pipeline, stage, source and target")
    csub.add_parser("enforce", help="cancel/terminate runs of disabled pipelines now (DAGSTER_HOME instance)")
    e = csub.add_parser("explain", help="classify an error text and list the healing rules that would run")
    e.add_argument("text")
    c.set_defaults(func=cmd_control)
    for kind in ("source", "target"):
        f = sub.add_parser(kind, help=f"kill switch for one {kind} (every stage {'reading' if kind == 'source' else 'writing'} it skips)")
        f.add_argument("action", choices=["enable", "disable"])
        f.add_argument("dataset_id", metavar=f"{kind}_id")
        f.set_defaults(func=cmd_dataset_flag)


EXTRA_COMMANDS.append(register)
