"""The Iceberg IO manager for PySpark DataFrames: every stage output is written through it.

Outputs. A stage's load op yields a `StageWrite`: the stage's input as a stream of batches (the
plan its extract made; each batch one commit carrying its file checkpoints) and the step's
context. `handle_output` runs, synchronously while the op waits at its `yield`, the stage's load:
the one write-audit-publish service (`lakehouse.wap_service`: audit branch, rules, quarantine,
throttle, healing, the kill switch re-read, the exactly-once publish) and the after-publish
bookkeeping. It records the outcome on the `StageWrite`; the op then yields the rules' outcomes
as asset check results (an IO manager cannot emit those). A plain DataFrame written to a
stage's table (an asset of user code) goes through the same service as one batch.

A batch stream rather than one DataFrame: a file stage writes one commit per batch with that
batch's checkpoints, and the exactly-once publish may have to write only the remainder of the
input again; one DataFrame of everything would lose both.

Inputs. A downstream stage receives each upstream table as a Spark DataFrame of `main` at the
snapshot the run pinned (`lakehouse.pins`; pinned when the stage's extract planned, first pin of
a table in a run wins), never at whatever `main` is when the input is loaded, and never an
unaudited branch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from lakehouse import pins
from lakehouse.core import AuditFailed, Batch, ExtractPlan, StageDisabled, StageOutcome
from lakehouse.metadata.model import MetadataCatalog, Stage, Target
from lakehouse.runner import StageRunner
from resources.lakehouse import LakehouseResource
from resources.spark import LakehouseSparkResource


@dataclass
class StageWrite:
    """A stage's output as its load op hands it to the IO manager, and what became of it.

    `retry(exc)`: the stage's retry policy, read when the error happens (a RetryRequested, or None
    to fail). After `handle_output`: `outcome` (published or skipped), or `audit_failed` (main
    unchanged, branch kept; the op reports the failed checks and fails the step)."""

    runner: StageRunner
    plan: ExtractPlan
    retry: Callable[[Exception], BaseException | None] = field(default=lambda exc: None)
    outcome: StageOutcome | None = None
    audit_failed: AuditFailed | None = None


def stage_for_key(catalog: MetadataCatalog, key: dg.AssetKey) -> tuple[Stage, Target]:
    """The stage whose asset this is, and its target: a stage's key is [layer, table] and its
    table's namespace need not be the layer, so the metadata says which table it is."""
    targets = {t.target_id: t for t in catalog.targets}
    for st in catalog.stages:
        t = targets.get(st.target_id)
        if t is not None and t.kind == "iceberg" and [st.layer, (t.table or "").lower()] == \
                [p.lower() for p in key.path]:
            return st, t
    raise KeyError(f"asset {key.to_user_string()} is not a stage's table in the metadata: the IO manager reads and "
                   "writes stage tables only")


def _run_id(context: dg.InputContext) -> str | None:
    """The run loading the input (whose pins apply); None outside a run."""
    try:
        return context.step_context.run_id  # no public accessor on InputContext
    except Exception:  # noqa: BLE001 - a context built outside a run has no step
        return None


class IcebergIOManager(dg.ConfigurableIOManager):
    lakehouse: LakehouseResource  # the platform, as every asset gets it (the code location's one resource)
    pyspark: LakehouseSparkResource

    # ------------------------------------------------------------------ outputs
    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        if isinstance(obj, StageWrite):
            self._write_stage(context, obj)
            return
        from pyspark.sql import DataFrame

        if not isinstance(obj, DataFrame):
            raise TypeError(f"IcebergIOManager stores stage outputs (StageWrite) and Spark DataFrames, "
                            f"got {type(obj).__name__} for {context.asset_key.to_user_string()}")
        self._write_frame(context, obj)

    def _write_stage(self, context: dg.OutputContext, write: StageWrite) -> None:
        try:
            outcome = write.runner.load(write.plan)
        except AuditFailed as exc:  # the op yields the failed checks, then fails the step
            write.audit_failed = exc
            context.add_output_metadata({"table": write.runner.target.identifier, "published": False,
                                         "audit_branch": exc.branch, "snapshot_id": "none"})
            return
        except StageDisabled as exc:
            raise dg.Failure(description=str(exc)) from exc
        except Exception as exc:  # unhealed: the stage's retry policy (read now) decides
            retry = write.retry(exc)
            if retry is None:
                raise
            raise retry from exc
        write.outcome = outcome
        context.add_output_metadata(outcome.metadata())

    def _write_frame(self, context: dg.OutputContext, df) -> None:
        """A DataFrame for a stage's table: one batch through the same write-audit-publish, as
        that stage (its rules; their outcomes land in the check history, not as asset checks)."""
        platform = self.lakehouse.platform()
        stage, _ = stage_for_key(platform.catalog(), context.asset_key)
        runner = StageRunner(platform, stage.pipeline_id, stage.stage_name, context.run_id)
        outcome = runner.wap().run([Batch(df, {"lakehouse.run_id": context.run_id}, label="dataframe")])
        context.add_output_metadata(outcome.metadata())

    # ------------------------------------------------------------------ inputs
    def load_input(self, context: dg.InputContext):
        platform = self.lakehouse.platform()
        ident = stage_for_key(platform.catalog(), context.asset_key)[1].identifier.lower()
        run_id = _run_id(context)
        pin = pins.pinned(platform, run_id, ident) if run_id else pins.NOT_PINNED
        if pin is pins.NOT_PINNED:  # nothing of this run read it yet: pin it now, for the rest of the run
            tables = platform.tables()
            snap = tables.snapshot_id(ident) if tables.exists(ident) else None
            if run_id:
                snap = pins.record(platform, run_id, {ident: snap})[ident]
            pin = {"snapshot_id": snap, "table": ident}
        context.log.info(f"{ident}: read at snapshot {pin['snapshot_id']} (pinned by run {run_id})")
        return pins.read_pinned(platform, ident, pin["snapshot_id"], pin["table"], spark=self.pyspark.spark_session)
