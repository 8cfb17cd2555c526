"""What a run did, per stage, in a few lines: the end of `lakehouse run` and the run's Dagster tags.

Plain data in, plain data out: the Dagster layer (`lakehouse_assets/run_summary.py`) turns a
run's events into `StageReport`s; this module decides each stage's status, the run's outcome and
exit code, and renders the table.

Exit codes follow dbt's and SQLMesh's convention: a run that did what its metadata says exits 0,
also when rules quarantined rows or warn-severity checks failed (the summary says so); those
warnings exit 3 only with `--warn-error` (or the platform setting `run.warn_error: true`); a
failure exits 1; a run a kill switch stopped before it started exits 4 (not a failure).

Counts are logical, what the stage's logic did (lakehouse.stage.core.StageOutcome.metadata): rows read =
what the stage's input delivered (the source's own count when it gives one, JDBC; else the rows of
its batches: a merge's change set), rows inserted, updated (a merge's matched keys) and deleted (a
replace-where overwrite), rows quarantined; the physical rows of the data files Iceberg rewrote
(a copy-on-write MERGE rewrites whole files) stay in the run's tags and its materialization
metadata (`rows_rewritten`), not in the table. Files quarantined in the run are a column; their
reasons are one command away (`lakehouse audit --run-id R --event file_quarantined`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

SUCCESS, WARNINGS, FAILED, STOPPED = "success", "success_with_warnings", "failed", "stopped"
#: exit codes of `lakehouse run` (2 is the CLI's "bad input / configuration"); warnings exit 0
#: unless they are errors (`--warn-error`, platform setting `run.warn_error`): then WARN_ERROR_EXIT
EXIT_CODES = {SUCCESS: 0, WARNINGS: 0, FAILED: 1, STOPPED: 4}
WARN_ERROR_EXIT = 3
#: the platform setting (metadata `platform_settings`) that makes warnings exit WARN_ERROR_EXIT
WARN_ERROR_SETTING = "run.warn_error"
#: materialization metadata: {check name: why it was not evaluated} (a skipped stage, a disabled rule)
NOT_EVALUATED = "checks_not_evaluated"


@dataclass
class CheckReport:
    name: str
    passed: bool
    severity: str  # warn | error
    failed_rows: int | None = None
    message: str = ""
    evaluated: bool = True  # False: not evaluated in this run (its stage skipped or failed first); message says why

    def text(self) -> str:
        if not self.evaluated:
            return f"{self.name} not evaluated"
        if self.passed:
            return f"{self.name} ok"
        n = f" {self.failed_rows} failing" if self.failed_rows else ""
        return f"{self.name} {'FAILED' if self.severity == 'error' else 'warn'}{n}"


@dataclass
class StageReport:
    asset: str  # layer/table
    stage: str = ""  # pipeline.stage
    materialized: bool = False
    failed: bool = False
    failure: str = ""  # first line of the error
    rows_read: int | None = None
    rows_written: int | None = None  # logical: inserted + updated
    quarantined: int = 0
    dropped: int = 0
    rows_inserted: int | None = None  # None: metadata from before these counts (then = rows_written)
    rows_updated: int | None = None
    rows_deleted: int | None = None
    rows_rewritten: int | None = None  # physical: rows of the data files the commits wrote
    files_quarantined: int = 0
    files_deferred: int = 0  # vanished or changed during the run: left for the next run
    skipped_reason: str | None = None
    snapshot_id: str | None = None
    branch: str | None = None  # the audit branch kept by a failed audit
    checks: list[CheckReport] = field(default_factory=list)

    @property
    def status(self) -> str:
        if self.failed:
            return "failed"
        if not self.materialized:
            return "not run"
        return "skipped" if self.skipped_reason else "published"

    @property
    def read(self) -> int | None:
        if self.rows_read is not None:
            return self.rows_read
        if self.rows_written is None:
            return None
        return self.rows_written + self.quarantined + self.dropped

    @property
    def inserted(self) -> int | None:
        return self.rows_written if self.rows_inserted is None else self.rows_inserted

    @property
    def warnings(self) -> bool:
        return any(c.evaluated and not c.passed for c in self.checks) or self.quarantined > 0


@dataclass
class RunSummary:
    run_id: str
    job: str
    stages: list[StageReport]
    run_failed: bool = False
    run_error: str = ""
    warn_error: bool = False  # warnings are errors: exit WARN_ERROR_EXIT (the outcome stays what happened)
    stopped: str = ""  # a kill switch stopped the run before it started: who and when

    @property
    def outcome(self) -> str:
        if self.stopped:
            return STOPPED
        if self.run_failed or any(s.status in ("failed", "not run") for s in self.stages):
            return FAILED
        return WARNINGS if any(s.warnings for s in self.stages) else SUCCESS

    @property
    def exit_code(self) -> int:
        if self.outcome == WARNINGS and self.warn_error:
            return WARN_ERROR_EXIT
        return EXIT_CODES[self.outcome]

    def rows(self) -> list[dict[str, Any]]:
        out = []
        for s in self.stages:
            where = (f"snapshot {s.snapshot_id}" if s.snapshot_id and s.snapshot_id != "none" and not s.failed
                     else f"branch {s.branch} kept" if s.branch else "-")
            ran = s.materialized or s.quarantined
            out.append({"asset": s.asset, "status": s.status, "read": _n(s.read), "inserted": _n(s.inserted),
                        "updated": _n(s.rows_updated if s.rows_updated is not None or s.rows_written is None else 0),
                        "deleted": _n(s.rows_deleted if s.rows_deleted is not None or s.rows_written is None else 0),
                        "quarantined": s.quarantined if ran else "-",
                        "files q.": s.files_quarantined if ran or s.files_quarantined else "-",
                        "snapshot / branch": where})
        return out

    def table(self) -> str:
        """The table `lakehouse run` prints: one line per stage, its checks and why it skipped or failed."""
        rows = self.rows()
        cols = ["asset", "status", "read", "inserted", "updated", "deleted", "quarantined", "files q.",
                "snapshot / branch"]
        width = {c: max([len(c), *(len(str(r[c])) for r in rows)]) for c in cols}
        right = {"read", "inserted", "updated", "deleted", "quarantined", "files q."}

        def line(r: dict) -> str:
            return "  ".join(str(r[c]).rjust(width[c]) if c in right else str(r[c]).ljust(width[c])
                             for c in cols).rstrip()

        if self.stopped:
            return f"stopped: {self.stopped}"
        label = {SUCCESS: "SUCCESS", WARNINGS: "SUCCESS with warnings", FAILED: "FAILURE"}[self.outcome]
        if self.outcome == WARNINGS and self.warn_error:
            label += " (warnings are errors: --warn-error)"
        out = [f"run {self.run_id} ({self.job}): {label}", line({c: c for c in cols}),
               line({c: "-" * width[c] for c in cols})]
        for s, r in zip(self.stages, rows, strict=True):
            out.append(line(r))
            if s.checks:
                out.append("    checks: " + "; ".join(c.text() for c in s.checks))
                why = sorted({c.message for c in s.checks if not c.evaluated and c.message and c.message != s.skipped_reason})
                out.extend(f"    not evaluated: {w}" for w in why)
            if s.files_quarantined:
                out.append(f"    files quarantined: {s.files_quarantined} (why: lakehouse audit --run-id "
                           f"{self.run_id} --event file_quarantined)")
            if s.files_deferred:
                out.append(f"    files left for the next run (vanished or changed while read): {s.files_deferred} "
                           f"(why: lakehouse audit --run-id {self.run_id} --event file_deferred)")
            if s.skipped_reason:
                out.append(f"    skipped: {s.skipped_reason}")
            if s.failure:
                out.append(f"    failed: {s.failure}")
            elif s.status == "not run":
                out.append("    not run: an upstream stage failed, or the run stopped before it")
        if self.run_error and not any(s.failure for s in self.stages):
            out.append(f"run failed: {self.run_error}")
        return "\n".join(out)

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "job": self.job, "outcome": self.outcome,
                "stages": [{**asdict(s), "status": s.status, "rows_read": s.read} for s in self.stages]}

    def tags(self) -> dict[str, str]:
        """The run's Dagster tags: the outcome, and per stage a compact line (the UI shows tags)."""
        compact = [{"asset": s.asset, "status": s.status, "read": s.read, "written": s.rows_written,
                    "inserted": s.inserted, "updated": s.rows_updated, "deleted": s.rows_deleted,
                    "rewritten": s.rows_rewritten, "quarantined": s.quarantined,
                    "files_quarantined": s.files_quarantined, "skipped": s.skipped_reason, "snapshot": s.snapshot_id,
                    "branch": s.branch,
                    "checks": {c.name: ("ok" if c.passed else f"{c.severity}:{c.failed_rows or 0}") if c.evaluated
                               else "not evaluated" for c in s.checks}} for s in self.stages]
        if self.stopped:
            compact = [{"stopped": self.stopped}]
        return {"lakehouse/outcome": self.outcome,
                "lakehouse/summary": json.dumps(compact, separators=(",", ":"), default=str)}


def _n(v: int | None) -> str:
    return "-" if v is None else str(v)
