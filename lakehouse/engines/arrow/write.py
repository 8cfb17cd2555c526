"""The Arrow engine's audited write: the split by the acting rules, the branch writes, the quarantine
writes and the audit on Arrow tables through PyIceberg."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from lakehouse.engines.arrow.rules import _sample, evaluate, failed_rules_column, tag_failures
from lakehouse.engines.audited import BranchWrite, QuarantineBranch
from lakehouse.engines.types import UTC_US
from lakehouse.table.iceberg import WriteResult
from lakehouse.validation.rules import (
    FAILED_RULES_COLUMN,
    SAMPLE_ROWS,
    SCOPE_APPENDED,
    SCOPE_TABLE,
    CheckOutcome,
    acting_rules,
)

if TYPE_CHECKING:
    from lakehouse.stage.core import Batch


class ArrowQuarantineWriter(QuarantineBranch):
    """Quarantined rows to the quarantine table's branch through PyIceberg (same columns as Spark's)."""

    def write(self, bad: pa.Table, batch_properties: dict[str, str] | None = None) -> int:
        n = bad.num_rows
        rows = (bad.append_column("_run_id", pa.array([self.runner.run_id] * n, pa.string()))
                .append_column("_quarantined_at", pa.array([dt.datetime.now(dt.UTC)] * n, UTC_US))
                .append_column("_quarantine_id", pa.array([str(uuid.uuid4()) for _ in range(n)], pa.string())))
        return self.append(rows, rows.schema, batch_properties)

    def align(self, rows: pa.Table) -> pa.Table:
        return rows  # ArrowTables.write matches the table's columns by name


class ArrowAuditedWrite(BranchWrite):
    """A write session on Arrow batches: the split, the branch writes and the audit on Arrow; the
    branch bookkeeping and the exactly-once publish are `BranchWrite`'s (PyIceberg metadata)."""

    def write(self, batch: Batch) -> WriteResult:
        from lakehouse.runtime import retry
        from lakehouse.runtime.outage import is_connection_failure

        df: pa.Table = batch.df
        keep = self._split(df, batch)
        if not self.created:
            self._start_branch(keep.schema)
        head = self.tables.snapshot_id(self.ident, self.branch)
        res = retry.call(retry.BRANCH_WRITE,
                         lambda: self.tables.write(keep, self.target, branch=self.branch,
                                                   snapshot_properties=batch.snapshot_properties, spec=batch.write),
                         what=f"write to {self.ident}@{self.branch}", also=is_connection_failure,
                         only=lambda _exc: self.tables.snapshot_id(self.ident, self.branch) == head)
        if res.operation != "append":  # the branch's rows are all new: the audit reads the whole branch
            self.appends_only = False
        return res

    def _split(self, df: pa.Table, batch: Batch) -> pa.Table:
        """Drop / quarantine rows by the acting rules (a row failing both is quarantined); count them."""
        acting = acting_rules(self.rules)
        if not acting or self.actions is None:
            return df
        fails = tag_failures(df, self.rules, self.actions.errors, self._time_zone())
        acting = [r for r in acting if r.name in fails]
        if not acting:
            return df
        self.actions.total += df.num_rows
        for r in acting:
            n = pc.sum(fails[r.name].cast(pa.int64())).as_py() or 0
            self.actions.failed[r.name] = self.actions.failed.get(r.name, 0) + n
            if n and len(self.actions.samples.get(r.name, [])) < SAMPLE_ROWS:
                self.actions.samples.setdefault(r.name, []).extend(_sample(df, fails[r.name]))
        any_acting = _any([fails[r.name] for r in acting], df.num_rows)
        q_names = [r.name for r in acting if r.action == "quarantine"]
        if q_names and self.quarantine_enabled:
            bad_mask = _any([fails[n] for n in q_names], df.num_rows)
            if pc.any(bad_mask).as_py():
                # the names of every rule each quarantined row fails (those rows only)
                bad = df.filter(bad_mask).append_column(FAILED_RULES_COLUMN, failed_rules_column(fails, bad_mask))
                self.quarantined_rows += self._quarantine_writer().write(bad, batch.snapshot_properties)
        return df.filter(pc.invert(any_acting))

    def _time_zone(self) -> str:
        """Spark's session time zone as the platform configures it: an expression over timestamps
        gives the same answer on both engines."""
        return self.runner.platform.settings.session_time_zone

    def _new_quarantine(self) -> ArrowQuarantineWriter:
        return ArrowQuarantineWriter(self.runner, self.tables, self.branch)

    def _new_rows(self) -> pa.Table:
        """The rows this run added on its branch: its own data files (or the whole branch when a
        write replaced data), read by PyIceberg."""
        from pyiceberg.expressions import AlwaysTrue
        from pyiceberg.io.pyarrow import ArrowScan

        head = self.tables.snapshot_id(self.ident, self.branch)
        table = self.tables.meta.load_table(self.ident)
        if head is None or (self.appends_only and head == self.fork_snapshot):
            return table.schema().as_arrow().empty_table()
        found = self.tables.data_files(self.ident, head, self.fork_snapshot if self.appends_only else None)
        tasks = list(table.scan(snapshot_id=head).plan_files())
        if found is not None:
            mine = {f.file_path for f in found[1]}
            tasks = [t for t in tasks if t.file.file_path in mine]
        return ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue()).to_table(tasks)

    def content_fingerprint(self, snapshot_id: int) -> tuple | None:
        """DuckDB over the snapshot's rows (read by PyIceberg): count(*) and the sum of each row's hash."""
        import duckdb

        rows = self.tables.meta.load_table(self.ident).scan(snapshot_id=snapshot_id).to_arrow()
        con = duckdb.connect()
        try:
            con.register("t", rows)
            n, h = con.execute("SELECT count(*), sum(hash(t)) FROM t").fetchone()
        finally:
            con.close()
        return (tuple(rows.schema.names), n, h)

    def audit(self) -> list[CheckOutcome]:
        head = self.tables.snapshot_id(self.ident, self.branch)
        context: dict[str, Any] = {"previous_row_count": self.previous_rows,
                                   "row_count_after": self._total_records(self.branch),
                                   "row_actions": self.actions, "time_zone": self._time_zone(),
                                   "scope": SCOPE_APPENDED if self.appends_only else SCOPE_TABLE}
        keys = sorted({c for r in self.rules if r.type == "unique" for c in r.columns})
        if keys:
            table = self.tables.meta.load_table(self.ident)
            names = {f.name.lower(): f.name for f in table.schema().fields}
            context["table"] = table.scan(snapshot_id=head, selected_fields=tuple(names.get(k.lower(), k) for k in keys)
                                          ).to_arrow()
        return evaluate(self._new_rows(), self.rules, context)


def _any(masks: list, n: int):
    out = None
    for m in masks:
        out = m if out is None else pc.or_(out, m)
    return out if out is not None else pa.array([False] * n)

