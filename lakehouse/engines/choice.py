"""Which engine writes a stage's target: Spark, or PyIceberg + Arrow (no JVM) for small file loads
and for the results of SQL stages whose query runs on DuckDB.

Seed 001's write-audit-publish needs no JVM: a small load pays seconds of Spark start-up for
milliseconds of work. A target says `engine: spark | arrow | auto` (default: the platform setting
`engine.default`, else `BUILT_IN_DEFAULT`); `auto` writes with Arrow when the stage is one the Arrow engine
can do (`arrow_blockers`) and its planned input is at most `arrow_max_bytes` (the target's, else
the setting `engine.arrow_max_bytes`, else `DEFAULT_ARROW_MAX_BYTES`, chosen from
bench/bench_small_batches.py). The choice and its reason go to the audit log and the run's
materialization metadata. Both engines honour one write-audit-publish contract
(lakehouse.stage.wap_service), so they can write the same table turn and turn about.

Plain data and rules only: the engines themselves are `lakehouse.engines.spark.SparkEngine` and
`lakehouse.engines.arrow.ArrowEngine` (`lakehouse.engines.engine_for`), imported only when chosen.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lakehouse.metadata.engine_support import ARROW_SOURCES, arrow_blockers, duckdb_sql_stage, entity_raw_blockers
from lakehouse.metadata.model import ENGINES, Target
from lakehouse.stage.core import SQL

if TYPE_CHECKING:
    from lakehouse.metadata.model import Application, MetadataCatalog, Rule, Stage
    from lakehouse.stage.core import ExtractPlan, StageContext

#: the engine of a target when neither it nor the platform setting `engine.default` names one.
#: Spark for now: `auto` as the built-in default would move every existing file load (and the
#: tests that hold them) onto the Arrow path at once; opt in per target or with the setting.
BUILT_IN_DEFAULT = "spark"
#: auto's threshold when neither the target nor the platform sets one (bytes of planned input):
#: bench/bench_small_batches.py found Arrow faster end to end at every size it ran, up to its
#: largest input (1M rows, 150 MB of JSON lines: 2.3x); past that nothing is measured, and the
#: Arrow engine holds a batch in memory, so the default stops there (BENCHMARKS.md, issue 21)
DEFAULT_ARROW_MAX_BYTES = 150_000_000


@dataclass(frozen=True)
class EngineChoice:
    """The engine a step writes with, what was asked for, and why."""

    engine: str  # spark | arrow
    asked: str  # spark | arrow | auto
    reason: str

    def metadata(self) -> dict[str, str]:
        return {"engine": self.engine, "engine_reason": self.reason}


def _asked(catalog: MetadataCatalog, engine: str | None, owner: str) -> tuple[str, str]:
    """(spark | arrow | auto, where that came from): the owner's own `engine`, else the platform
    setting engine.default, else the built-in default."""
    if engine:
        return engine, f"{owner} engine"
    value = (catalog.setting("engine.default") or "").strip()
    if value in ENGINES:
        return value, "platform setting engine.default"
    return BUILT_IN_DEFAULT, "built-in default"


def _max_bytes(catalog: MetadataCatalog, limit: int | None, owner: str) -> tuple[int, str]:
    """auto's threshold: the owner's own `arrow_max_bytes`, else engine.arrow_max_bytes, else the default."""
    if limit is not None:
        return limit, f"{owner} arrow_max_bytes"
    raw = (catalog.setting("engine.arrow_max_bytes") or "").strip()
    if raw.isdigit():
        return int(raw), "platform setting engine.arrow_max_bytes"
    return DEFAULT_ARROW_MAX_BYTES, "platform default"


def asked_engine(catalog: MetadataCatalog, target: Target) -> tuple[str, str]:
    """(spark | arrow | auto, where that came from)."""
    return _asked(catalog, target.engine, f"target {target.target_id}")


def arrow_max_bytes(catalog: MetadataCatalog, target: Target) -> tuple[int, str]:
    return _max_bytes(catalog, target.arrow_max_bytes, f"target {target.target_id}")


def _decide(asked: str, origin: str, blockers: list[str], limit: Callable[[], tuple[int, str]], size: int,
            measured: str, refusal: str | None) -> EngineChoice:
    """The one decision of every engine choice: blockers keep the work on Spark (an explicit `arrow`
    of the owner itself is refused with `refusal`), `arrow` is taken as asked, and `auto` compares
    `size` (`measured`: what the bytes are) with the threshold `limit()` gives."""
    if asked == "spark":
        return EngineChoice("spark", asked, f"{origin} is spark")
    if blockers:
        if asked == "arrow" and refusal is not None:
            raise ValueError(f"{refusal}: {'; '.join(blockers)}. Set engine: spark or auto")
        return EngineChoice("spark", asked, f"{origin} is {asked}, but {'; '.join(blockers)}")
    if asked == "arrow":
        return EngineChoice("arrow", asked, f"{origin} is arrow")
    cap, cap_origin = limit()
    if size <= cap:
        return EngineChoice("arrow", asked, f"auto: {size} {measured} <= {cap} ({cap_origin})")
    return EngineChoice("spark", asked, f"auto: {size} {measured} > {cap} ({cap_origin})")


def choose(ctx: StageContext, plan: ExtractPlan) -> EngineChoice:
    """The engine for this step's load of `plan` (read at run time: a metadata update applies to
    the next run). An explicit `arrow` the stage cannot honour raises (static validation names it
    first: lakehouse.metadata.checks); `auto` and the platform default fall back to Spark, saying why."""
    asked, origin = asked_engine(ctx.catalog, ctx.target)
    blockers = [] if asked == "spark" else arrow_blockers(ctx.stage, ctx.target, ctx.source, ctx.rules)
    duck = duckdb_sql_stage(ctx.stage)
    readable = plan.kind == SQL if duck else plan.kind in ARROW_SOURCES
    if asked != "spark" and not readable and not plan.skipped_reason:  # a skipped plan writes nothing
        blockers.append(f"the plan reads {plan.kind!r}")
    refusal = (f"target {ctx.target.target_id} asks for engine arrow, which cannot write stage "
               f"{ctx.stage.pipeline_id}.{ctx.stage.stage_name}") if ctx.target.engine else None
    if duck and asked == "auto" and not blockers:  # what DuckDB reads into memory: the pinned upstreams
        size, measured = upstream_bytes(ctx, plan), "bytes of upstream data files"
    else:
        size, measured = sum(f.size for f in plan.files), "bytes planned"
    return _decide(asked, origin, blockers, lambda: arrow_max_bytes(ctx.catalog, ctx.target), size, measured, refusal)


def upstream_bytes(ctx: StageContext, plan: ExtractPlan) -> int:
    """Bytes of data files of the upstream snapshots the run pinned (their summaries' total-files-size,
    PyIceberg metadata only): what a DuckDB SQL stage reads into memory."""
    tables = ctx.platform.tables()
    overrides = plan.details.get("table_overrides", {})
    total = 0
    for ident, snap in plan.upstream_snapshots.items():
        if snap is not None:
            total += int(tables.snapshot_summary(overrides.get(ident, ident), snap).get("total-files-size", 0) or 0)
    return total


def choose_for_application(catalog: MetadataCatalog, app: Application, rules: list[Rule], size: int) -> EngineChoice:
    """The engine of an entity_raw load of `size` bytes of files into entity_raw.<app>: the
    application's `engine` (else engine.default, else the built-in default), `auto` by the
    application's `arrow_max_bytes` (else engine.arrow_max_bytes, else the default), as `choose`."""
    owner = f"application {app.application_id}"
    asked, origin = _asked(catalog, app.engine, owner)
    blockers = [] if asked == "spark" else entity_raw_blockers(app, rules)
    refusal = (f"{owner} asks for engine arrow, which cannot load entity_raw.{app.application_id.lower()}"
               if app.engine else None)
    return _decide(asked, origin, blockers, lambda: _max_bytes(catalog, app.arrow_max_bytes, owner), size,
                   "bytes of files", refusal)


def choose_for_export(catalog: MetadataCatalog, target: Target, size: int) -> EngineChoice:
    """What reads a published table for the warehouse export: PyIceberg + Arrow when the table's
    engine allows it and its snapshot (`size` bytes of data files) is within the Arrow threshold."""
    asked, origin = asked_engine(catalog, target)
    return _decide(asked, origin, [], lambda: arrow_max_bytes(catalog, target), size, "bytes of data files", None)


def may_need_spark(catalog: MetadataCatalog, pipeline_id: str) -> bool:
    """Whether a run of the pipeline may need Spark before its input is known: some stage the
    Arrow engine would not write (SQL, another source kind, engine spark...). `lakehouse run`
    warms a JVM up only then; an `auto` stage whose input turns out too big starts it when it gets there."""
    return stages_may_need_spark(catalog, catalog.stages_of(pipeline_id))


def stages_may_need_spark(catalog: MetadataCatalog, stages: Iterable[Stage]) -> bool:
    """`may_need_spark` for some stages (a run's selection): any of them the Arrow engine would not write."""
    for stage in stages:
        target = catalog.target(stage.target_id)
        if asked_engine(catalog, target)[0] == "spark":
            return True
        source = next((s for s in catalog.sources if s.source_id == stage.source_id), None)
        rules = catalog.rule_set(stage.validation_set_id).rules if stage.validation_set_id else []
        if arrow_blockers(stage, target, source, rules):
            return True
    return False

