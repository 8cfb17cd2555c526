"""`lakehouse alerts list|retry|test`: the alert outbox from the command line."""

from __future__ import annotations

from lakehouse.cli.app import EXTRA_COMMANDS, _print_table
from lakehouse.platform import Platform


def cmd_alerts(args) -> int:
    from lakehouse.ops import alerts

    platform = Platform.from_env()
    if args.action == "list":
        rows = []
        for a in alerts.recent(platform.store, limit=args.limit):
            rows.append({"id": a["id"], "at": a["created_at"].isoformat(timespec="seconds") if a["created_at"] else "",
                         "kind": a["kind"], "dataset": a["dataset"] or "", "stage": a["stage"] or "",
                         "rule": a["rule"] or "", "failing": "" if a["failing_count"] is None else a["failing_count"],
                         "deliveries": "; ".join(f"{d['channel_id']}: {d['status']}"
                                                 + (f" ({d['attempts']} attempts)" if d["status"] != "sent" else "")
                                                 for d in a["deliveries"]) or "(no channel)"})
        _print_table(rows)
        return 0
    if args.action == "retry":
        out = alerts.deliver_due(platform.store, force=args.now)
        print(f"sent {out.sent}, still pending {out.pending}, given up {out.failed}")
        for e in out.errors:
            print(f"  {e}")
        return 0 if not out.errors else 1
    channel = platform.catalog().alert_channels
    ch = next((c for c in channel if c.channel_id == args.channel_id), None)
    if ch is None:
        raise KeyError(f"unknown alert channel {args.channel_id!r}; known: {sorted(c.channel_id for c in channel)}")
    test = alerts.Alert(kind="run_failed", dedupe_key="test", message="Test alert from `lakehouse alerts test`.",
                        next_step="nothing to do: this checks that the channel receives alerts")
    alerts.SENDERS[ch.kind](ch, test)
    print(f"sent a test alert to {ch.channel_id} ({ch.kind})")
    return 0


def register(sub) -> None:
    a = sub.add_parser("alerts", help="alerts sent to Slack / webhooks (alert_channels metadata)")
    asub = a.add_subparsers(dest="action", required=True)
    ls = asub.add_parser("list", help="recent alerts and where each was delivered")
    ls.add_argument("--limit", type=int, default=50)
    rt = asub.add_parser("retry", help="send the alerts a channel could not take yet")
    rt.add_argument("--now", action="store_true", help="do not wait for each delivery's backoff")
    ts = asub.add_parser("test", help="send a test message to one channel")
    ts.add_argument("channel_id")
    a.set_defaults(func=cmd_alerts)


EXTRA_COMMANDS.append(register)
