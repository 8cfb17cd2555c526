"""Alerts: a failed audit, a failed or killed run, a kill switch thrown and a source unreachable
past its retries, sent to the channels of the `alert_channels` metadata (Slack through
dagster-slack's client, or a generic JSON webhook).

Each alert names the dataset, the stage, the rule, the failing count and the next step, and its
message is the run's own failure message, word for word.

**Exactly one message per trigger.** Every trigger has a dedupe key (an audit failure: run +
stage; a run failure: the run; a kill switch: the flag's flip, however many steps and runs it
stops; an unreachable source: run + stage). The control DB is the outbox: `alerts` holds one row
per key (a unique column, so two processes noticing the same trigger record it once),
`alert_deliveries` one row per (alert, channel), and `alert_runs` every run an alert covers, so
the run-failure sensor does not send a second, vaguer message for a run whose failure was already
explained. A delivery is claimed with a conditional UPDATE before it is sent, so two senders never
post it twice.

**A channel that is down fails nothing.** `notify` never raises; it records the alert, tries each
channel once with a short timeout, and leaves what failed pending with a backoff. The
`lakehouse_alerts_delivery` sensor (and `lakehouse alerts retry`) sends what is due; after
`MAX_ATTEMPTS` a delivery is marked failed and shown as such on the dashboard and by
`lakehouse alerts list`. Secrets (the Slack token, a webhook's token or secret URL) come from the
environment variables the channel names and never reach the database, a log or an error text.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from lakehouse.metadata.model import AlertChannel, MetadataCatalog
from lakehouse.metadata.schema import alert_deliveries, alert_runs, alerts_table
from lakehouse.metadata.store import MetadataStore
from lakehouse.settings import RunSettings, current, named_secret

if TYPE_CHECKING:
    from lakehouse.stage.core import AuditFailed, StageContext

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 20
BASE_BACKOFF_S = 30.0
MAX_BACKOFF_S = 3600.0
STALE_CLAIM = timedelta(minutes=5)  # a sender that died mid-send: the delivery is tried again
DEFAULT_SLACK_TOKEN_ENV = "SLACK_BOT_TOKEN"



def _now() -> datetime:
    return datetime.now(UTC)


def _utc(ts: datetime | None) -> datetime | None:
    return ts.replace(tzinfo=UTC) if isinstance(ts, datetime) and ts.tzinfo is None else ts


# --------------------------------------------------------------------------- the alert


@dataclass
class Alert:
    kind: str  # one of lakehouse.metadata.model.AlertEvent
    dedupe_key: str
    message: str  # the run's failure message, verbatim
    next_step: str
    pipeline_id: str | None = None
    stage: str | None = None  # pipeline.stage
    dataset: str | None = None
    rule: str | None = None
    failing_count: int | None = None
    run_id: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    TITLES = {"audit_failed": "Failed audit", "run_failed": "Run failed", "run_canceled": "Run killed",
              "kill_switch": "Kill switch thrown", "source_unavailable": "Source unreachable"}

    @property
    def title(self) -> str:
        what = self.dataset or self.pipeline_id or self.run_id or ""
        return f"{self.TITLES.get(self.kind, self.kind)}: {what}" + (f" (stage {self.stage})" if self.stage else "")

    def fields(self) -> list[tuple[str, str]]:
        return [("dataset", self.dataset or "—"), ("stage", self.stage or "—"), ("rule", self.rule or "—"),
                ("failing count", "—" if self.failing_count is None else str(self.failing_count)),
                ("run", self.run_id or "—"), ("next step", self.next_step)]

    def text(self) -> str:
        lines = [self.title, self.message, *(f"{k}: {v}" for k, v in self.fields())]
        return "\n".join(lines)

    def slack_blocks(self) -> list[dict]:
        def esc(s: str) -> str:
            return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")

        return [
            {"type": "header", "text": {"type": "plain_text", "text": self.title[:150]}},
            {"type": "section", "text": {"type": "mrkdwn", "text": esc(self.message)[:2900]}},
            {"type": "section", "fields": [{"type": "mrkdwn", "text": f"*{k}*\n{esc(v)}"[:1900]}
                                           for k, v in self.fields()[:5]]},
            {"type": "section", "text": {"type": "mrkdwn", "text": f"*next step*\n{esc(self.next_step)}"[:2900]}},
        ]

    def payload(self) -> dict[str, Any]:
        """The webhook body: every field under a stable name, plus a plain-text rendering."""
        return {"kind": self.kind, "title": self.title, "pipeline_id": self.pipeline_id, "stage": self.stage,
                "dataset": self.dataset, "rule": self.rule, "failing_count": self.failing_count,
                "run_id": self.run_id, "message": self.message, "next_step": self.next_step, "text": self.text(),
                "dedupe_key": self.dedupe_key}


# --------------------------------------------------------------------------- channels


class ChannelConfigError(RuntimeError):
    """A channel that cannot send as configured (e.g. its token env var is not set)."""


def _redact(text: str, *secrets: str | None) -> str:
    for s in secrets:
        if s:
            text = text.replace(s, "<redacted>")
    return re.sub(r"(xox[abprs]-)[A-Za-z0-9-]+", r"\1<redacted>", text)[:1000]


def send_slack(channel: AlertChannel, alert: Alert) -> None:
    """chat.postMessage through dagster-slack's SlackResource client (slack_sdk's WebClient)."""
    from dagster_slack import SlackResource

    env = channel.token_env or DEFAULT_SLACK_TOKEN_ENV
    token = named_secret(env)
    if not token:
        raise ChannelConfigError(f"env var {env} (the Slack bot token of channel {channel.channel_id!r}) is not set")
    client = SlackResource(token=token).get_client()
    client.timeout = int(max(1, channel.timeout_seconds))
    if channel.api_url:
        client.base_url = channel.api_url.rstrip("/") + "/"
    try:
        client.chat_postMessage(channel=channel.slack_channel, text=alert.text(), blocks=alert.slack_blocks())
    except Exception as exc:  # slack_sdk errors carry the response, never the token; redact anyway
        raise RuntimeError(_redact(f"{type(exc).__name__}: {exc}", token)) from None


def send_webhook(channel: AlertChannel, alert: Alert) -> None:
    """POST the alert as JSON; any 2xx is delivered. An optional bearer token comes from token_env."""
    import requests

    url = named_secret(channel.url_env) if channel.url_env else channel.url
    if not url:
        raise ChannelConfigError(f"env var {channel.url_env} (the URL of channel {channel.channel_id!r}) is not set")
    headers = {"Content-Type": "application/json", **channel.headers}
    token = named_secret(channel.token_env)
    if channel.token_env and not token:
        raise ChannelConfigError(f"env var {channel.token_env} (the token of channel {channel.channel_id!r}) is not set")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        resp = requests.post(url, json=alert.payload(), headers=headers, timeout=channel.timeout_seconds)
        resp.raise_for_status()
    except Exception as exc:  # requests puts the URL in its messages: a URL from url_env may be a secret
        raise RuntimeError(_redact(f"{type(exc).__name__}: {exc}", url, token)) from None


SENDERS = {"slack": send_slack, "webhook": send_webhook}


# --------------------------------------------------------------------------- recording


def channels_for(catalog: MetadataCatalog, alert: Alert) -> list[AlertChannel]:
    criticality = next((p.criticality for p in catalog.pipelines if p.pipeline_id == alert.pipeline_id), None)
    return [c for c in catalog.alert_channels if c.wants(alert.kind, alert.pipeline_id, criticality)]


def record(store: MetadataStore, alert: Alert, catalog: MetadataCatalog | None = None) -> tuple[int, bool]:
    """Store the alert once per dedupe key and its deliveries; (alert id, newly recorded)."""
    store.create_all()
    catalog = catalog or store.load()
    row = {k: v for k, v in asdict(alert).items() if k != "details"}
    row.update(created_at=_now(), details=json.dumps(alert.details, default=str))
    new = True
    try:
        with store.engine.begin() as conn:
            alert_id = conn.execute(sa.insert(alerts_table).values(**row)).inserted_primary_key[0]
            channels = channels_for(catalog, alert)
            if channels:
                conn.execute(sa.insert(alert_deliveries), [
                    {"alert_id": alert_id, "channel_id": c.channel_id, "status": "pending", "attempts": 0,
                     "next_attempt_at": _now()} for c in channels])
    except sa.exc.IntegrityError:  # the same trigger, already recorded (by this or another process)
        new = False
        with store.engine.connect() as conn:
            alert_id = conn.execute(sa.select(alerts_table.c.id).where(
                alerts_table.c.dedupe_key == alert.dedupe_key)).scalar_one()
    if alert.run_id:
        try:
            with store.engine.begin() as conn:
                conn.execute(sa.insert(alert_runs).values(alert_id=alert_id, run_id=alert.run_id))
        except sa.exc.IntegrityError:
            pass
    return alert_id, new


def covered(store: MetadataStore, run_id: str) -> bool:
    """Has a more specific alert (audit, kill switch, source) already explained this run?"""
    store.create_all()
    with store.engine.connect() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(alert_runs).where(
            alert_runs.c.run_id == run_id)).scalar_one() > 0


@dataclass
class NotifyResult:
    alert_id: int | None = None
    new: bool = False
    sent: int = 0
    pending: int = 0
    error: str | None = None


def notify(store: MetadataStore, alert: Alert, catalog: MetadataCatalog | None = None) -> NotifyResult:
    """Record the alert (once per trigger) and try its channels now. Never raises."""
    try:
        alert_id, new = record(store, alert, catalog)
        res = NotifyResult(alert_id, new)
        if new:
            log.warning("alert %s: %s", alert.kind, alert.title)
            outcome = deliver_due(store, alert_id=alert_id, catalog=catalog)
            res.sent, res.pending = outcome.sent, outcome.pending
        return res
    except Exception as exc:  # noqa: BLE001 - an alert must never fail the run it reports on
        log.warning("could not record/send alert %s (%s): %s", alert.kind, alert.dedupe_key, exc, exc_info=True)
        return NotifyResult(error=str(exc))


# --------------------------------------------------------------------------- delivery


@dataclass
class DeliveryOutcome:
    sent: int = 0
    pending: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)


def backoff(attempts: int) -> timedelta:
    """Wait before the next try: LAKEHOUSE_ALERT_BACKOFF_SECONDS (default 30) doubling, at most 1 h."""
    base = current(RunSettings).alert_backoff_seconds  # read when the delivery fails (LAKEHOUSE_ALERT_BACKOFF_SECONDS)
    return timedelta(seconds=min(base * (2 ** max(0, attempts - 1)), MAX_BACKOFF_S))


def _claim(store: MetadataStore, delivery_id: int, token: str) -> bool:
    d = alert_deliveries.c
    now = _now()
    with store.engine.begin() as conn:
        res = conn.execute(sa.update(alert_deliveries).where(
            d.id == delivery_id,
            sa.or_(d.status == "pending", sa.and_(d.status == "sending", d.claimed_at < now - STALE_CLAIM)),
        ).values(status="sending", claimed_at=now, claim=token))
        return res.rowcount == 1


def deliver_due(store: MetadataStore, *, alert_id: int | None = None, catalog: MetadataCatalog | None = None,
                force: bool = False, limit: int = 200) -> DeliveryOutcome:
    """Send every delivery that is due (or those of one alert); a failure is rescheduled, never raised."""
    store.create_all()
    d = alert_deliveries.c
    now = _now()
    a = alerts_table.c
    q = sa.select(d.id.label("delivery_id"), d.channel_id, d.attempts, a.kind, a.dedupe_key, a.message, a.next_step,
                  a.pipeline_id, a.stage, a.dataset, a.rule, a.failing_count, a.run_id
                  ).join(alerts_table, a.id == d.alert_id)
    if alert_id is not None:
        q = q.where(d.alert_id == alert_id)
    due = sa.or_(d.status == "pending", sa.and_(d.status == "sending", d.claimed_at < now - STALE_CLAIM))
    if not force:
        due = sa.and_(due, sa.or_(d.next_attempt_at.is_(None), d.next_attempt_at <= now))
    with store.engine.connect() as conn:
        rows = conn.execute(q.where(due).order_by(d.id).limit(limit)).mappings().all()
    out = DeliveryOutcome()
    if not rows:
        return out
    catalog = catalog or store.load()
    channels = {c.channel_id: c for c in catalog.alert_channels}
    for r in rows:
        token = uuid.uuid4().hex
        if not _claim(store, r["delivery_id"], token):
            continue  # another process is sending it
        alert = Alert(**{k: r[k] for k in ("kind", "dedupe_key", "message", "next_step", "pipeline_id", "stage",
                                           "dataset", "rule", "failing_count", "run_id")})
        channel = channels.get(r["channel_id"])
        try:
            if channel is None:
                raise ChannelConfigError(f"alert channel {r['channel_id']!r} is no longer in the metadata")
            SENDERS[channel.kind](channel, alert)
        except Exception as exc:  # noqa: BLE001 - recorded and retried later
            attempts = int(r["attempts"] or 0) + 1
            status = "failed" if attempts >= MAX_ATTEMPTS else "pending"
            err = str(exc)[:1000]
            with store.engine.begin() as conn:
                conn.execute(sa.update(alert_deliveries).where(d.id == r["delivery_id"], d.claim == token).values(
                    status=status, attempts=attempts, last_error=err, next_attempt_at=_now() + backoff(attempts)))
            out.failed += status == "failed"
            out.pending += status == "pending"
            out.errors.append(f"{r['channel_id']}: {err}")
            log.warning("alert %s to channel %s not delivered (attempt %d): %s", r["kind"], r["channel_id"],
                        attempts, err)
            continue
        with store.engine.begin() as conn:
            conn.execute(sa.update(alert_deliveries).where(d.id == r["delivery_id"], d.claim == token).values(
                status="sent", attempts=int(r["attempts"] or 0) + 1, sent_at=_now(), last_error=None))
        out.sent += 1
    return out


def recent(store: MetadataStore, limit: int = 50) -> list[dict[str, Any]]:
    """Newest alerts first, each with its deliveries: what the dashboard and `alerts list` show."""
    store.create_all()
    with store.engine.connect() as conn:
        rows = conn.execute(sa.select(alerts_table).order_by(alerts_table.c.id.desc()).limit(limit)).mappings().all()
        ids = [r["id"] for r in rows]
        deliveries: dict[int, list[dict]] = {}
        if ids:
            for d in conn.execute(sa.select(alert_deliveries).where(alert_deliveries.c.alert_id.in_(ids))
                                  .order_by(alert_deliveries.c.id)).mappings():
                deliveries.setdefault(d["alert_id"], []).append(
                    {"channel_id": d["channel_id"], "status": d["status"], "attempts": d["attempts"],
                     "last_error": d["last_error"], "sent_at": _utc(d["sent_at"])})
    out = []
    for r in rows:
        item = dict(r)
        item["created_at"] = _utc(item["created_at"])
        item["details"] = json.loads(item["details"] or "{}")
        item["deliveries"] = deliveries.get(r["id"], [])
        out.append(item)
    return out


# --------------------------------------------------------------------------- triggers


def _stage_fields(runner: StageContext) -> dict[str, Any]:
    return {"pipeline_id": runner.stage.pipeline_id, "stage": f"{runner.stage.pipeline_id}.{runner.stage.stage_name}",
            "dataset": runner.target.identifier, "run_id": runner.run_id}


def audit_failed(runner: StageContext, exc: AuditFailed) -> NotifyResult:
    """A blocking rule kept a stage's data from main."""
    failures = [c for c in exc.outcomes if c.blocking_failure]
    alert = Alert(
        kind="audit_failed", dedupe_key=f"audit_failed:{runner.run_id}:{runner.stage.pipeline_id}.{runner.stage.stage_name}",
        message=str(exc), rule=", ".join(c.rule.name for c in failures) or None,
        failing_count=sum(int(c.failed_rows or 0) for c in failures),
        next_step=f"lakehouse branches show {runner.target.identifier} {exc.branch}; fix the input or the rule, "
                  "then re-run the stage",
        details={"branch": exc.branch}, **_stage_fields(runner))
    return notify(runner.platform.store, alert, runner.catalog)


def flip_key(store: MetadataStore, pipeline_id: str | None, stage_names: tuple[str, ...] = (),
             datasets: tuple[tuple[str, str | None], ...] = ()) -> str:
    """Identity of the flag flip that stops this now: the first `false` flag in the order the checks
    run (platform, pipeline, stage, sources, target) with its updated_at, so every step and run the
    same flip stops shares one alert, and the next flip gets a new one."""
    candidates = [("platform", "*")]
    if pipeline_id:
        candidates.append(("pipeline", pipeline_id))
        candidates += [("stage", f"{pipeline_id}.{s}") for s in stage_names]
    candidates += [(t, i) for t, i in datasets if i]
    catalog = store.load()
    current = {(f.entity_type, f.entity_id): f for f in catalog.control_flags if f.flag_name == "enabled"}
    for c in candidates:
        f = current.get(c)
        if f is not None and not f.flag_value:
            return f"{c[0]}/{c[1]}@{f.updated_at.isoformat() if f.updated_at else ''}"
    # no flag row: the `enabled` column of pipelines / stages was set false (e.g. by plain SQL)
    if any(p.pipeline_id == pipeline_id and not p.enabled for p in catalog.pipelines):
        return f"pipelines.enabled/{pipeline_id}"
    off = [s.stage_name for s in catalog.stages if s.pipeline_id == pipeline_id and s.stage_name in stage_names
           and not s.enabled]
    return f"stages.enabled/{pipeline_id}.{off[0]}" if off else f"unknown/{pipeline_id}"


def _enable_hint(message: str) -> str:
    m = re.search(r"Re-enable with (.+?)\.?$", message)
    return f"when ready, re-enable with {m.group(1)}" if m else "re-enable the flag when ready"


def kill_switch_stopped(runner: StageContext, message: str) -> NotifyResult:
    """A stage stopped (pipeline/stage flag) or skipped (source/target flag) by the kill switch."""
    key = flip_key(runner.platform.store, runner.stage.pipeline_id, (runner.stage.stage_name,),
                   (("source", runner.stage.source_id), ("source", runner.source_override),
                    ("target", runner.target.target_id)))
    alert = Alert(kind="kill_switch", dedupe_key=f"kill_switch:{key}", message=message, rule=key.split("@")[0],
                  next_step=_enable_hint(message), details={"flag": key}, **_stage_fields(runner))
    return notify(runner.platform.store, alert, runner.catalog)


def kill_switch_run(store: MetadataStore, run_id: str, pipeline_id: str, reason: str, action: str,
                    stages: tuple[str, ...] = ()) -> NotifyResult:
    """The kill-switch enforcer cancelled or terminated a run."""
    stage_name = stages[0] if len(stages) == 1 else None
    key = flip_key(store, pipeline_id, stages)
    message = (f"{reason}; run {run_id} was {'cancelled in the queue' if action == 'cancel' else 'terminated'} "
               f"by the kill switch. Re-enable with `lakehouse pipeline enable {pipeline_id}`.")
    alert = Alert(kind="kill_switch", dedupe_key=f"kill_switch:{key}", message=message, rule=key.split("@")[0],
                  pipeline_id=pipeline_id, stage=f"{pipeline_id}.{stage_name}" if stage_name else None,
                  run_id=run_id, next_step=_enable_hint(message), details={"flag": key, "action": action})
    return notify(store, alert)


def source_unavailable(runner_or_store: Any, *, pipeline_id: str, stage_name: str, run_id: str,
                       error: BaseException, retries: int, reason: str) -> NotifyResult:
    """A stage's source could not be read and the retry policy is spent."""
    store: MetadataStore = getattr(getattr(runner_or_store, "platform", None), "store", None) or runner_or_store
    catalog = store.load()
    stage = catalog.stage(pipeline_id, stage_name)
    target = catalog.target(stage.target_id)
    alert = Alert(
        kind="source_unavailable", dedupe_key=f"source_unavailable:{run_id}:{pipeline_id}.{stage_name}",
        message=str(error) or type(error).__name__, pipeline_id=pipeline_id, stage=f"{pipeline_id}.{stage_name}",
        dataset=target.identifier, rule=f"source {stage.source_id}" if stage.source_id else None,
        failing_count=retries, run_id=run_id,
        next_step=f"check that source {stage.source_id!r} is reachable (`lakehouse lineage paths {stage.target_id}` "
                  "lists every route and why each is unavailable), or declare a replica; then re-run the stage",
        details={"retry": reason, "error_class": type(error).__name__})
    return notify(store, alert, catalog)


def run_finished(store: MetadataStore, *, run_id: str, status: str, job_name: str, tags: dict[str, str],
                 message: str, failed: list[tuple[str, str | None]] | None = None) -> NotifyResult | None:
    """A run failed or was killed; `failed` = (step or stage, dataset) of each failed step. None when a
    more specific alert (audit, kill switch, source) already covers the run."""
    if covered(store, run_id):
        return None
    kind = "run_canceled" if status.upper() in ("CANCELED", "CANCELLED", "CANCELING") else "run_failed"
    pipeline_id = tags.get("lakehouse/pipeline")
    load_job = tags.get("lakehouse/load_job")
    if load_job:
        nxt = f"GET /load/{load_job} shows the error; fix the request or the files, then POST /load again"
    elif pipeline_id:
        nxt = (f"open run {run_id} in the Dagster UI (Runs) for the failing step's error, fix the cause, then "
               f"re-execute it from failure or run `lakehouse run {pipeline_id}`")
    else:
        nxt = f"open run {run_id} in the Dagster UI (Runs) for the error, fix the cause, then re-execute it"
    failed = failed or []
    datasets = [d for _, d in failed if d]
    alert = Alert(kind=kind, dedupe_key=f"run:{run_id}", message=message, next_step=nxt, pipeline_id=pipeline_id,
                  dataset=", ".join(dict.fromkeys(datasets)) or tags.get("lakehouse/dataset"),
                  stage=", ".join(dict.fromkeys(s for s, _ in failed)) or None,
                  failing_count=len(failed) or None, run_id=run_id, details={"job": job_name, "status": status})
    return notify(store, alert)
