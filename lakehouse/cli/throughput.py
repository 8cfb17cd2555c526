"""`lakehouse profile ...` and `lakehouse pools ...`: scheduling profiles and Dagster pool limits."""

from __future__ import annotations

import sys

from lakehouse.cli.app import EXTRA_COMMANDS, _print_table
from lakehouse.metadata.model import PipelineProfile
from lakehouse.orchestration.instance import instance_from_env
from lakehouse.orchestration.pools import current_limits, desired_limits, sync_instance
from lakehouse.orchestration.queue import retag_queued_runs
from lakehouse.platform import Platform
from lakehouse.throughput.profiles import GLOBAL, PROFILES, active_profile, kind_of


def cmd_profile(args) -> int:
    platform = Platform.from_env()
    catalog = platform.catalog()
    if args.action == "show":
        rows = [{"pipeline": "* (global)", "profile": active_profile(catalog), "behaves_as":
                 kind_of(catalog, active_profile(catalog)), "criticality": ""}]
        for p in catalog.pipelines:
            prof = active_profile(catalog, p.pipeline_id)
            rows.append({"pipeline": p.pipeline_id, "profile": prof, "behaves_as": kind_of(catalog, prof),
                         "criticality": p.criticality})
        _print_table(rows)
        return 0
    known = set(PROFILES) | {p.profile_id for p in catalog.profiles}
    if args.profile not in known:
        print(f"error: unknown profile {args.profile!r}; known: {sorted(known)}", file=sys.stderr)
        return 2
    if args.pipeline:
        catalog.pipeline(args.pipeline)  # KeyError naming the known pipelines
    platform.store.upsert([PipelineProfile(pipeline_id=args.pipeline or GLOBAL, profile_id=args.profile)])
    print(f"profile of {args.pipeline or 'all pipelines (global)'} set to {args.profile}")
    instance = instance_from_env()
    if instance is not None:  # take effect at once for runs already waiting in the queue
        changes = retag_queued_runs(instance, platform.store)
        for c in changes:
            print(f"  re-tagged queued run {c.run_id[:8]} ({c.pipeline_id}): priority {c.old_priority} -> {c.new_priority}")
        print(f"re-tagged {len(changes)} queued run(s)")
    else:
        print("DAGSTER_HOME is not set: queued runs will be re-tagged by the throughput sensor")
    return 0


def cmd_pools(args) -> int:
    platform = Platform.from_env()
    catalog = platform.catalog()
    instance = instance_from_env()
    if args.action == "sync":
        if instance is None:
            print("error: DAGSTER_HOME is not set (or does not exist): no Dagster instance to sync", file=sys.stderr)
            return 2
        print(sync_instance(instance, catalog).summary())
        return 0
    desired = desired_limits(catalog)
    current = current_limits(instance) if instance is not None else {}
    rows = []
    for name in sorted(set(desired) | {n for n in current if n.startswith(("source:", "target:"))}):
        have = current.get(name)
        rows.append({"pool": name, "metadata_limit": desired.get(name, "-"),
                     "instance_limit": "-" if have is None else have[0] if not have[1] else f"{have[0]} (default)",
                     "in_sync": "yes" if have is not None and have[0] == desired.get(name) and not have[1] else "no"})
    _print_table(rows)
    return 0


def register(sub) -> None:
    p = sub.add_parser("profile", help="scheduling profile: balanced or focus, global or per pipeline")
    psub = p.add_subparsers(dest="action", required=True)
    s = psub.add_parser("set")
    s.add_argument("profile", help="balanced, focus, or a profile id from the profiles metadata")
    s.add_argument("--pipeline", help="override for one pipeline (default: the global profile)")
    psub.add_parser("show")
    p.set_defaults(func=cmd_profile)

    pl = sub.add_parser("pools", help="Dagster pool limits from throttles (max_concurrent)")
    pl.add_argument("action", choices=["sync", "show"])
    pl.set_defaults(func=cmd_pools)


EXTRA_COMMANDS.append(register)
