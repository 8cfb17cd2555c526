"""Data-quality overview across all datasets, built from the stored check history.

Per dataset and rule: last result, pass rate over the last N evaluations, the failing-row trend;
per dataset: quarantine size and open audit branches (data a failed audit left unpublished);
beside them, the alert history (`lakehouse.ops.alerts`): what was raised, about which dataset, stage
and rule, and whether each channel got it. Everything is read without Spark (control DB +
PyIceberg metadata), so the dashboard asset is cheap enough to refresh after every pipeline run.
"""

from __future__ import annotations

import base64
import io
import json
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from lakehouse.validation.history import check_history, pass_rates
from lakehouse.validation.quarantine import quarantine_identifier

if TYPE_CHECKING:
    from lakehouse.platform import Platform

log = logging.getLogger(__name__)
AUDIT_BRANCH_PREFIX = "audit_"


@dataclass
class RuleRow:
    dataset: str
    rule: str
    severity: str
    last_passed: bool
    last_ts: datetime | None
    last_message: str
    evaluations: int
    pass_rate: float
    failed_rows_trend: list[int]  # oldest → newest, over the same last N evaluations
    #: why the newest run of its stage did not evaluate it (its stage skipped, ...): its status is then
    #: "not evaluated", as in the run summary and the Dagster UI; the pass rate counts evaluations only
    not_evaluated: str | None = None

    @property
    def status(self) -> str:
        return "not evaluated" if self.not_evaluated is not None else "pass" if self.last_passed else "FAIL"


@dataclass
class DatasetRow:
    dataset: str
    quarantine_rows: int | None  # None: no quarantine table
    open_audit_branches: list[str] = field(default_factory=list)


@dataclass
class AlertRow:
    ts: datetime | None
    kind: str
    dataset: str
    stage: str
    rule: str
    failing_count: int | None
    delivery: str  # per channel: "slack_x: sent; hook: pending (2 attempts)"
    delivered: bool  # every channel took it


@dataclass
class QualityOverview:
    last_n: int
    rules: list[RuleRow]
    datasets: list[DatasetRow]
    alerts: list[AlertRow] = field(default_factory=list)

    @property
    def failing(self) -> list[RuleRow]:
        return [r for r in self.rules if r.status == "FAIL"]

    def dataset(self, name: str) -> DatasetRow | None:
        return next((d for d in self.datasets if d.dataset == name), None)

    def rule(self, dataset: str, rule: str) -> RuleRow | None:
        return next((r for r in self.rules if r.dataset == dataset and r.rule == rule), None)


def compute_overview(platform: Platform, last_n: int = 20) -> QualityOverview:
    """Every (dataset, rule) with history, plus every target dataset of the metadata."""
    store = platform.store
    rows: list[RuleRow] = []
    for pr in pass_rates(store, last_n=last_n):
        hist = check_history(store, dataset=pr["dataset"], rule=pr["rule"], limit=last_n)
        newest = hist[0] if hist else {}
        rows.append(RuleRow(
            dataset=pr["dataset"], rule=pr["rule"], severity=pr["severity"] or "",
            last_passed=pr["last_passed"], last_ts=pr["last_ts"], last_message=newest.get("message") or "",
            evaluations=pr["evaluations"], pass_rate=pr["pass_rate"],
            failed_rows_trend=[int(h["failed_rows"] or 0) for h in reversed(hist)],
        ))
    catalog = platform.catalog()
    skipped = not_evaluated(platform, catalog)
    for r in rows:
        ts, why = skipped.pop((r.dataset, r.rule), (None, None))
        if ts is not None and (r.last_ts is None or ts > r.last_ts):
            r.not_evaluated = why
    for (dataset, rule), (_ts, why) in sorted(skipped.items()):  # never evaluated yet
        rows.append(RuleRow(dataset, rule, "", False, None, "", 0, 0.0, [], not_evaluated=why))
    rows.sort(key=lambda r: (r.dataset, r.rule))
    names = {r.dataset for r in rows} | {t.identifier for t in catalog.targets}
    return QualityOverview(last_n, rows, [_dataset_row(platform, n) for n in sorted(names)],
                           alert_rows(platform, last_n))


def not_evaluated(platform: Platform, catalog, runs: int = 200) -> dict[tuple[str, str], tuple[datetime, str]]:
    """{(dataset, rule): (when, why)} of the checks the newest run summary of their stage
    (`audit_log` event run_summary, the one `lakehouse run` prints and the summary sensor writes
    for UI runs) lists as not evaluated; a check that summary evaluated is left out."""
    import sqlalchemy as sa

    from lakehouse.metadata.schema import audit_log

    ident = {f"{s.pipeline_id}.{s.stage_name}": t.identifier for s in catalog.stages
             for t in [next((t for t in catalog.targets if t.target_id == s.target_id), None)] if t is not None}
    q = (sa.select(audit_log.c.ts, audit_log.c.details).where(audit_log.c.event == "run_summary")
         .order_by(audit_log.c.id.desc()).limit(runs))
    platform.store.create_all()
    with platform.store.engine.connect() as conn:
        entries = conn.execute(q).all()
    seen: set[tuple[str, str]] = set()
    out: dict[tuple[str, str], tuple[datetime, str]] = {}
    for ts, details in entries:  # newest first: the first summary naming a check decides
        ts = ts.replace(tzinfo=UTC) if isinstance(ts, datetime) and ts.tzinfo is None else ts
        for st in (json.loads(details or "{}").get("stages") or []):
            dataset = ident.get(st.get("stage") or "")
            for c in st.get("checks") or [] if dataset else []:
                key = (dataset, c.get("name"))
                if key in seen:
                    continue
                seen.add(key)
                if not c.get("evaluated", True):
                    out[key] = (ts, c.get("message") or st.get("skipped_reason") or "not evaluated")
    return out


def alert_rows(platform: Platform, limit: int) -> list[AlertRow]:
    from lakehouse.ops.alerts import recent

    out = []
    for a in recent(platform.store, limit=limit):
        deliveries = a["deliveries"]
        text = "; ".join(f"{d['channel_id']}: {d['status']}" + (f" ({d['attempts']} attempts)"
                                                                if d["status"] != "sent" else "")
                         for d in deliveries) or "no channel configured"
        out.append(AlertRow(a["created_at"], a["kind"], a["dataset"] or "", a["stage"] or "", a["rule"] or "",
                            a["failing_count"], text, all(d["status"] == "sent" for d in deliveries)))
    return out


def _dataset_row(platform: Platform, identifier: str) -> DatasetRow:
    from pyiceberg.exceptions import NoSuchTableError

    row = DatasetRow(identifier, None)
    try:
        cat = platform.pyiceberg_catalog()
    except Exception as exc:  # the catalog database is down: show the table, say why numbers are missing
        log.warning("dashboard: Iceberg catalog unavailable (%s)", exc)
        return row
    try:
        table = cat.load_table(identifier)
        row.open_audit_branches = sorted(n for n in table.metadata.refs if n.startswith(AUDIT_BRANCH_PREFIX))
    except NoSuchTableError:
        pass
    try:
        q = cat.load_table(quarantine_identifier(identifier))
        snap = q.current_snapshot()
        row.quarantine_rows = int(snap.summary.additional_properties.get("total-records", 0)) if snap else 0
    except NoSuchTableError:
        pass
    return row


# ---------------------------------------------------------------- rendering
def _trend(values: list[int]) -> str:
    if not values:
        return ""
    shown = values[-8:]
    return ("… " if len(values) > len(shown) else "") + " → ".join(str(v) for v in shown)


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(ov: QualityOverview) -> str:
    """The table a person reads first: failing rules on top, then everything else."""
    lines = [
        f"### Checks (pass rate over the last {ov.last_n} evaluations)",
        "",
        "| dataset | rule | severity | last result | pass rate | failing rows (oldest → newest) | last message |",
        "|---|---|---|---|---|---|---|",
    ]
    rank = {"FAIL": 0, "not evaluated": 1, "pass": 2}
    ordered = sorted(ov.rules, key=lambda r: (rank[r.status], r.dataset, r.rule))
    for r in ordered:
        result = {"pass": "✅ pass", "FAIL": "❌ FAIL", "not evaluated": "⏸ not evaluated"}[r.status]
        rate = f"{r.pass_rate:.0%} ({r.evaluations})" if r.evaluations else "—"
        message = f"not evaluated: {r.not_evaluated}" if r.not_evaluated is not None else r.last_message
        lines.append(
            f"| {_cell(r.dataset)} | {_cell(r.rule)} | {r.severity} | {result} | "
            f"{rate} | {_trend(r.failed_rows_trend)} | {_cell(message[:120])} |"
        )
    if not ov.rules:
        lines.append("| — | no check has run yet | | | | | |")
    lines += [
        "",
        "### Datasets",
        "",
        "| dataset | quarantined rows | open audit branches |",
        "|---|---|---|",
    ]
    for d in ov.datasets:
        q = "—" if d.quarantine_rows is None else str(d.quarantine_rows)
        branches = ", ".join(d.open_audit_branches) or "none"
        lines.append(f"| {_cell(d.dataset)} | {q} | {_cell(branches)} |")
    if any(d.open_audit_branches for d in ov.datasets):
        lines += ["", "An open audit branch holds data a blocking rule kept from main: inspect it with "
                      "`lakehouse branches show <table> <branch>`, fix the input or the rule and re-run the stage, "
                      "then drop the branch with `lakehouse branches drop <table> <branch>`."]
    lines += ["", f"### Alerts (last {ov.last_n})", "",
              "| raised | kind | dataset | stage | rule | failing | delivered to |", "|---|---|---|---|---|---|---|"]
    for a in ov.alerts:
        ts = a.ts.strftime("%Y-%m-%d %H:%M:%S") if a.ts else ""
        failing = "" if a.failing_count is None else str(a.failing_count)
        lines.append(f"| {ts} | {a.kind} | {_cell(a.dataset)} | {_cell(a.stage)} | {_cell(a.rule)} | {failing} | "
                     f"{'' if a.delivered else '⚠️ '}{_cell(a.delivery)} |")
    if not ov.alerts:
        lines.append("| — | no alert raised | | | | | |")
    return "\n".join(lines)


def render_png(ov: QualityOverview) -> bytes:
    """Pass rate per rule (bars, failing last result in red) and the failing-row trend per rule."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    labels = [f"{r.dataset}.{r.rule}" for r in ov.rules] or ["(no checks yet)"]
    rates = [r.pass_rate * 100 for r in ov.rules] or [0]
    colors = [{"pass": "#2e7d32", "FAIL": "#c62828"}.get(r.status, "#9e9e9e") for r in ov.rules] or ["#9e9e9e"]
    height = max(3.0, 0.35 * len(labels) + 1.5)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, height), gridspec_kw={"width_ratios": [3, 2]})
    try:
        ax1.barh(labels, rates, color=colors)
        for y, rate in enumerate(rates):
            ax1.text(min(rate, 88) + 1, y, f"{rate:.0f}%", va="center", fontsize=8)
        ax1.set_xlim(0, 100)
        ax1.set_xlabel(f"pass rate % (last {ov.last_n}; red = last result failed, grey = not evaluated)")
        ax1.invert_yaxis()
        ax1.tick_params(axis="y", labelsize=8)
        plotted = False
        for r in ov.rules:
            if any(r.failed_rows_trend):
                ax2.plot(range(1, len(r.failed_rows_trend) + 1), r.failed_rows_trend, marker="o",
                         label=f"{r.dataset}.{r.rule}")
                plotted = True
        from matplotlib.ticker import MaxNLocator

        ax2.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax2.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax2.set_title("failing rows per evaluation")
        ax2.set_xlabel("evaluation (oldest → newest)")
        if plotted:
            ax2.legend(fontsize=7, loc="upper left")
        else:
            ax2.text(0.5, 0.5, "no failing rows", ha="center", va="center", transform=ax2.transAxes)
        fig.suptitle("Data quality overview")
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=80)
        return buf.getvalue()
    finally:
        plt.close(fig)


def png_data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def summary(ov: QualityOverview) -> dict[str, Any]:
    return {
        "rules": len(ov.rules),
        "failing_rules": len(ov.failing),
        "not_evaluated_rules": sum(r.status == "not evaluated" for r in ov.rules),
        "datasets": len(ov.datasets),
        "quarantined_rows": sum(d.quarantine_rows or 0 for d in ov.datasets),
        "open_audit_branches": sum(len(d.open_audit_branches) for d in ov.datasets),
        "alerts": len(ov.alerts),
        "alerts_undelivered": sum(not a.delivered for a in ov.alerts),
    }
