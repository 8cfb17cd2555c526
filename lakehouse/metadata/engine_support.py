"""What the Arrow engine (lakehouse.engines.arrow) can write, from metadata alone.

Low in the package so that static validation (lakehouse.metadata.checks) and the engine choice at
run time (lakehouse.engines.choice) give the same reasons: a target that asks for `engine: arrow` on a
stage the engine cannot do is refused when the metadata is applied, naming the file and field.
"""

from __future__ import annotations

from lakehouse.metadata.model import Application, Rule, Source, Stage, Target

#: rule types the Arrow engine evaluates (the shared predicates of lakehouse.validation.predicates in DuckDB,
#: unique with pyarrow); any other keeps a stage on Spark
ARROW_RULES = frozenset({"row_count", "row_count_change", "not_null", "unique", "accepted_values", "range", "regex",
                         "expression", "freshness"})
#: source kinds whose input the Arrow engine reads (local files, or S3 objects staged locally)
ARROW_SOURCES = frozenset({"files", "s3"})
ARROW_FORMATS = frozenset({"parquet", "csv", "jsonl"})


def duckdb_sql_stage(stage: Stage | None) -> bool:
    """A SQL stage whose SELECT runs on DuckDB over Arrow (lakehouse.sources.duckdb_sql): its result
    is an Arrow table the Arrow engine can write, so the whole stage may run without a JVM."""
    return stage is not None and stage.sql_engine == "duckdb" and not stage.python_transformation


def arrow_blockers(stage: Stage | None, target: Target, source: Source | None, rules: list[Rule]) -> list[str]:
    """Why the Arrow engine cannot write this stage (empty: it can); each reason names the field."""
    out = []
    duck = duckdb_sql_stage(stage)
    if stage is not None and stage.python_transformation:
        out.append("Python stages run on Spark (stage transformation)")
    elif stage is not None and (stage.transformation or stage.transformation_file) and not duck:
        out.append("SQL stages run on Spark unless their SELECT runs on DuckDB (stage sql_engine: duckdb)")
    if duck:  # it reads the upstream tables its SQL names, not source files
        source = None
    elif source is None:
        out.append("the stage has no source files to read")
    if source is not None:
        if source.kind not in ARROW_SOURCES:
            out.append(f"source kind {source.kind!r} is read by Spark (Arrow reads: {', '.join(sorted(ARROW_SOURCES))})")
        elif source.format not in ARROW_FORMATS:
            out.append(f"source format {source.format!r} is not one of {', '.join(sorted(ARROW_FORMATS))}")
        if source.kind == "s3" and source.read_mode != "stage":
            out.append("source read_mode direct reads s3a:// paths with Spark")
    if target.kind != "iceberg":
        out.append(f"target kind {target.kind!r} is not an Iceberg table")
    if target.write_mode != "append" and not (duck and target.write_mode == "overwrite"):
        out.append(f"write_mode {target.write_mode!r} (Arrow appends, and replaces a DuckDB SQL stage's table)")
    if target.sort_order:
        out.append("sort_order (PyIceberg does not sort on write)")
    if target.time_partition is not None:
        out.append("time_partition (backfills rewrite their periods with Spark)")
    if stage is not None and stage.incremental is not None:
        out.append("incremental (merge / partition replacement run on Spark)")
    out += rule_blockers(rules)
    return out


def rule_blockers(rules: list[Rule]) -> list[str]:
    """Why the Arrow engine cannot audit with these rules (an entity_raw load's only blocker: its
    parquet reads, the raw_record JSON, the size cap and UPSERT's delete all run on Arrow)."""
    bad = sorted({r.type for r in rules if r.enabled and r.type not in ARROW_RULES})
    out = [f"rule type(s) {', '.join(bad)} are evaluated by Spark (Arrow evaluates: "
           f"{', '.join(sorted(ARROW_RULES))})"] if bad else []
    for r in rules:
        if r.enabled and r.type == "expression":  # evaluated in DuckDB: its Spark SQL must carry over
            from lakehouse.sql.parse import expression_problem

            problem = expression_problem(r.expression or "")
            if problem:
                out.append(f"rule {r.name!r}: expression {r.expression!r} is evaluated by Spark ({problem})")
    return out


def entity_raw_blockers(app: Application, rules: list[Rule]) -> list[str]:
    """Why the Arrow engine cannot load entity_raw.<app> (empty: it can): its parquet reads, the
    raw_record JSON, the size cap and UPSERT's delete all run on Arrow; the rules may not, and
    PyIceberg writes the day partition (truncate transform) only with the pyiceberg-core extension."""
    out = []
    if app.partition_by_day and not _has_pyiceberg_core():
        out.append("partition_by_day (PyIceberg writes a truncate partition only with pyiceberg-core, not installed)")
    return out + rule_blockers(rules)


def _has_pyiceberg_core() -> bool:
    import importlib.util

    return importlib.util.find_spec("pyiceberg_core") is not None
