"""The Iceberg IO manager for PySpark DataFrames: every stage output is published through it.

Outputs. A stage's load op first writes its input to the run's audit branch and evaluates the
stage's rules there (`StageRunner.write_and_audit`, the first half of the one write-audit-publish
service, `lakehouse.stage.wap_service`), and reports them as asset check results. A failed blocking
rule fails the step right there, before any output: no materialization, main untouched, the audit
branch kept. Otherwise the op yields a `StageWrite`: the reference to the audited write (a
`lakehouse.stage.values.StagedWrite`, serialisable: table, branch, run id, counts, checks) and the
step's retry policy. `handle_output` stores the reference (JSON), loads it, and publishes from it
(`lakehouse.stage.steps.publish`: the kill switch read again, the exactly-once publish, the
after-publish bookkeeping) in a working context of its own; the materialization Dagster records
then is the publish.
A plain DataFrame written to a stage's table (an asset of user code) goes through the same service
as one batch.

The input stays a batch stream up to the publish rather than one DataFrame: a file stage writes
one commit per batch with that batch's checkpoints, and the exactly-once publish may have to write
(and audit) only the remainder of the input again; one DataFrame of everything would lose both.

Inputs. A downstream stage receives each upstream table at the snapshot the run pinned
(`lakehouse.stage.pins`; pinned when the stage's extract planned, first pin of a table in a run wins),
never at whatever `main` is when the input is loaded, and never an unaudited branch. The stage
load op's inputs (`In` metadata `LAZY`) are loaders, read only when the stage's SQL or Python runs:
a load that a kill switch skips starts no Spark for them. Any other consumer gets a DataFrame.
The run's id (whose pins apply) comes from the resource's set-up for the run
(`setup_for_execution`), Dagster's public way for a resource to know its run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import dagster as dg
from pydantic import PrivateAttr

from lakehouse.metadata.model import MetadataCatalog, Stage, Target
from lakehouse.platform import Platform
from lakehouse.stage import pins, steps
from lakehouse.stage.core import AuditFailed, Batch, StageContext, StageDisabled, StageOutcome
from lakehouse.stage.runner import StageRunner
from lakehouse.stage.values import PublishResult, StagedWrite
from resources.lakehouse import LakehouseResource
from resources.spark import LakehouseSparkResource

#: `In` metadata of an input that the IO manager hands over as a loader (read when called), not a DataFrame
LAZY = "lakehouse/lazy"


@dataclass
class StageWrite:
    """A stage's audited write as its load op hands it to the IO manager, and what became of it.

    `staged`: the reference to the write on its audit branch (`lakehouse.stage.values.StagedWrite`,
    serialisable; it is all the publish needs, no live runner comes with it). `retry(exc)`: the
    stage's retry policy, read when the error happens (a RetryRequested, or None to fail). After
    `handle_output`: `result` (published or skipped)."""

    staged: StagedWrite
    retry: Callable[[Exception], BaseException | None] = field(default=lambda exc: None)
    result: PublishResult | None = None

    @property
    def outcome(self) -> StageOutcome | None:
        """The stage's final outcome once published (None before)."""
        return self.result.outcome if self.result is not None else None


@contextmanager
def step_errors(retry: Callable[[Exception], BaseException | None]) -> Iterator[None]:
    """How a stage step's errors reach Dagster, in its ops and in `handle_output` alike: a failed
    audit passes as is (the caller reports it), a kill switch that reaches here fails the step (a stage's
    runner skips its step instead: a kill switch is not a failure), a retry request passes as is,
    and any other error goes to the stage's retry policy (read now: a RetryRequested, or the error
    itself). The step's own wrapper (lakehouse.control.attempt) offers its errors to the same policy
    first; `Once` keeps an error from being decided twice."""
    try:
        yield
    except (AuditFailed, dg.RetryRequested):
        raise
    except StageDisabled as exc:
        raise dg.Failure(description=str(exc)) from exc
    except Exception as exc:
        retry_request = retry(exc)
        if retry_request is None:
            raise
        raise retry_request from exc


def audit_failure(ctx: StageContext, exc: AuditFailed) -> dg.Failure:
    """The step's failure for a failed blocking rule: what failed, where the data is, what to do."""
    ident = ctx.target.identifier
    return dg.Failure(description=str(exc), metadata={
        "dataset": ident, "stage": f"{ctx.stage.pipeline_id}.{ctx.stage.stage_name}",
        "audit_branch": exc.branch,
        "failed_rules": ", ".join(o.rule.name for o in exc.outcomes if o.blocking_failure),
        "next_step": f"lakehouse branches show {ident} {exc.branch}"})


def publish_write(write: StageWrite, platform: Platform, logger=None) -> PublishResult:
    """Publish a stage's audited write from its reference (`lakehouse.stage.steps.publish`, in a
    working context of its own) and keep the result on it. The IO manager does this for an output;
    the load op itself for a step that records no materialization (nothing new). A remainder
    written again (another run published part of the input meanwhile) that fails its audit fails
    the step here, before any materialization."""
    staged = write.staged
    ctx = steps.restored(staged, steps.context_for(staged.request, platform, logger))
    try:
        with step_errors(write.retry):
            result = steps.publish(staged, platform, ctx=ctx, retry=write.retry)
    except AuditFailed as exc:
        raise audit_failure(ctx, exc) from exc
    write.result = result
    return result


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


class IcebergIOManager(dg.ConfigurableIOManager):
    lakehouse: LakehouseResource  # the platform, as every asset gets it (the code location's one resource)
    pyspark: LakehouseSparkResource
    _run_id: str | None = PrivateAttr(default=None)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        """Remember the run this resource serves: its pins apply to every input it loads."""
        self._run_id = context.run.run_id if context.run is not None else None

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
        """Store the staged-write reference, load it, and publish what it refers to (`publish_write`):
        the reference alone is enough (a JSON text; nothing live crosses). Its outcome is the
        materialization's metadata."""
        loaded = StageWrite(StagedWrite.from_json(write.staged.to_json()), retry=write.retry)
        result = publish_write(loaded, self.lakehouse.platform(), context.log)
        write.result = result
        context.add_output_metadata(result.metadata())

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
        read = partial(self._read_pinned, platform, ident, context.log)
        return read if (context.definition_metadata or {}).get(LAZY) else read()

    def _read_pinned(self, platform, ident: str, log) -> Any:
        """`ident` at the run's pin (pinned now, for the rest of the run, if nothing pinned it yet)."""
        run_id = self._run_id
        pin = pins.pinned(platform, run_id, ident) if run_id else pins.NOT_PINNED
        if pin is pins.NOT_PINNED:  # nothing of this run read it yet: pin it now, for the rest of the run
            tables = platform.tables()
            snap = tables.snapshot_id(ident) if tables.exists(ident) else None
            if run_id:
                snap = pins.record(platform, run_id, {ident: snap})[ident]
            pin = {"snapshot_id": snap, "table": ident}
        log.info(f"{ident}: read at snapshot {pin['snapshot_id']} (pinned by run {run_id})")
        return pins.read_pinned(platform, ident, pin["snapshot_id"], pin["table"], spark=self.pyspark.spark_session)
