"""Per-file isolation for a files / S3 load: every planned file is probed and reconciled with the
target's schema on its own before any of them joins a batch, then each batch is read with
explicit schemas, so Spark never infers a schema from one file and never drops or reorders a column.

1. probe (`lakehouse.ingest.probe`): readable? within the source's limits? its own schema;
2. parquet footers → Spark types, one small Spark job per distinct footer schema;
3. reconcile (`lakehouse.ingest.reconcile`, plain Python) against the table's schema (plus the
   declared columns), or — for a new table — the schema most of the run's files agree on;
4. the table gets the new columns and widenings before the first write (policy evolve);
5. `read`: files grouped by identical schema, each group read with its schema and conformed to
   the reconciled one by name (casts, nested fields, NULL for what a file lacks), then unioned.

A file that fails 1–3 is quarantined alone with the reason (checkpoint table, audit_log, the
run's materialization metadata); the others load. Policy `fail` fails the stage instead.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lakehouse.errors import SCHEMA_DRIFT, PlatformError
from lakehouse.ingest.files import EMPTY, PROCESSED, QUARANTINED, FileRef, gone_or_changed, note_deferred_files
from lakehouse.ingest.probe import FileProbe, probe_file
from lakehouse.ingest.reconcile import FAIL, QUARANTINE, Decision, compare, merge, reconcile_files, vote
from lakehouse.metadata.spark_types import parse_ddl_type as _parse_ddl_type
from lakehouse.table.iceberg import ddl_type, quote, retry_metadata_commit

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType, StructType

    from lakehouse.metadata.model import Source
    from lakehouse.stage.core import StageContext

log = logging.getLogger(__name__)
LINEAGE_COLUMNS = ("_source_file", "_ingested_at")


class SchemaPolicyViolation(PlatformError):
    """Files do not fit the table and the schema policy is `fail`."""

    code = SCHEMA_DRIFT


@dataclass
class PreparedFiles:
    """The run's files with their statuses, and how to read the loadable ones."""

    source: Source
    files: list[FileRef]
    schema: StructType | None  # what every batch is read as (file columns only: no lineage/promoted columns)
    read_schemas: dict[str, StructType] = field(default_factory=dict)  # key -> the file's own schema
    read_keys: dict[str, str] = field(default_factory=dict)  # key -> group of files read together
    decisions: dict[str, Decision] = field(default_factory=dict)
    inferred: bool = False  # direct s3a:// reads: nothing local to probe, Spark infers (no isolation)

    def read(self, spark: SparkSession, files: list[FileRef],
             each: Callable[[DataFrame], DataFrame] | None = None) -> DataFrame:
        """One frame over `files` (all loadable), exactly in the reconciled schema. `each`: applied to
        each reader's frame before they are united (Spark's hidden `_metadata` column, which
        `lakehouse.ingest.checkpoints.spark_frame` reads, does not pass a union)."""
        each = each or (lambda df: df)
        if self.inferred or self.schema is None:
            from lakehouse.ingest.files import read_files

            return each(read_files(spark, self.source, files))
        groups: dict[str, list[FileRef]] = {}
        for f in files:
            groups.setdefault(self.read_keys[f.key], []).append(f)
        frames = []
        for refs in groups.values():
            own = self.read_schemas[refs[0].key]
            df = _reader(spark, self.source, own, [f.local_path or f.key for f in refs])
            frames.append(each(conform(df, own, self.schema)))
        out = frames[0]
        for other in frames[1:]:
            out = out.unionByName(other)
        return _promote(out, self.source)


def _reader(spark: SparkSession, source: Source, schema: StructType, paths: list[str]) -> DataFrame:
    reader = spark.read.schema(schema)
    if source.format == "parquet":
        return reader.parquet(*paths)
    if source.format == "csv":
        # the schema is this group's header, in its order: positional = by name here. RFC 4180 quotes
        # ("" inside a quoted field), as the probe parsed them; quoted fields may span lines.
        return (reader.option("header", str(source.csv_header).lower()).option("mode", "FAILFAST")
                .option("escape", '"').option("multiLine", source.options.get("csv_multiline", "true"))
                .csv(paths))
    return reader.option("mode", "FAILFAST").json(paths)


def _promote(df: DataFrame, source: Source) -> DataFrame:
    from pyspark.sql import functions as F

    for pf in source.promote_fields:
        df = df.withColumn(pf.column, F.col(pf.path))
    return df


# --------------------------------------------------------------------------- conforming a frame


def conform(df: DataFrame, have: StructType, want: StructType) -> DataFrame:
    """`df` (schema `have`) as exactly `want`: columns matched by name, case-insensitively; casts,
    nested fields rebuilt, NULL for what `df` lacks. A plain select when nothing differs."""
    from pyspark.sql import functions as F

    if _same(have, want):
        return df
    by_name = {f.name.lower(): f for f in have.fields}
    cols = []
    for f in want.fields:
        src = by_name.get(f.name.lower())
        if src is None:
            cols.append(F.lit(None).cast(f.dataType).alias(f.name))
        else:
            cols.append(_conform_col(F.col(quote(src.name)), src.dataType, f.dataType).alias(f.name))
    return df.select(*cols)


def _same(a: DataType, b: DataType) -> bool:
    """Equal names and types (nullability aside: every column the platform writes is nullable)."""
    return a.simpleString() == b.simpleString()


def _conform_col(col: Column, have: DataType, want: DataType) -> Column:
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, MapType, NullType, StructType

    if _same(have, want):
        return col
    if isinstance(have, NullType):
        return F.lit(None).cast(want)
    if isinstance(want, StructType) and isinstance(have, StructType):
        by_name = {f.name.lower(): f for f in have.fields}
        parts = []
        for f in want.fields:
            src = by_name.get(f.name.lower())
            parts.append((F.lit(None).cast(f.dataType) if src is None
                          else _conform_col(col.getField(src.name), src.dataType, f.dataType)).alias(f.name))
        return F.when(col.isNull(), F.lit(None).cast(want)).otherwise(F.struct(*parts))
    if isinstance(want, ArrayType) and isinstance(have, ArrayType):
        return F.transform(col, lambda x: _conform_col(x, have.elementType, want.elementType))
    if isinstance(want, MapType) and isinstance(have, MapType):
        return F.transform_values(col, lambda _k, v: _conform_col(v, have.valueType, want.valueType))
    return col.cast(want)


# --------------------------------------------------------------------------- preparing a run's files


def _parse_type(text: str) -> DataType:
    """A declared column type in Spark SQL DDL (`bigint`, `decimal(10,2)`, `array<struct<a:int>>`),
    parsed in plain Python: pyspark's own parser needs a JVM, which the Arrow engine does not start.
    What this grammar lacks is left to Spark's parser when a session is up."""
    try:
        return _parse_ddl_type(text)
    except ValueError:
        from lakehouse.compat import pyspark as pyspark_compat

        if not pyspark_compat.context_active():
            raise
        from pyspark.sql.types import StructType

        try:
            parsed = pyspark_compat.parse_type(text)
        except Exception as exc:  # Spark's ParseException: the same error as without a session
            detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ValueError(f"cannot parse type {text!r}: {detail}") from exc
        if isinstance(parsed, StructType) and not text.strip().lower().startswith("struct"):
            # pyspark reads what is not a type as a list of struct fields (`int int` is struct<int:int>):
            # a column type, like the one grammar here, it is not
            raise ValueError(f"cannot parse type {text!r}: a list of fields, not one type") from None
        return parsed


def _reference(table: StructType | None, declared: StructType | None) -> StructType | None:
    """The table's schema with the declared columns it lacks (the table's own types win)."""
    if table is None:
        return declared
    if declared is None:
        return table
    from pyspark.sql.types import StructType

    have = {f.name.lower() for f in table.fields}
    return StructType(table.fields + [f for f in declared.fields if f.name.lower() not in have])


def _only(schema: StructType, names: set[str]) -> StructType:
    from pyspark.sql.types import StructType

    return StructType([f for f in schema.fields if f.name.lower() in names])


def quarantine_class(error: str | None) -> str:
    """The audit-log error class of a quarantined file, from its reason."""
    text = error or ""
    if text.startswith("over a limit"):
        return "LimitExceeded"
    if text.startswith("refused:"):
        return "PathEscape"
    if text.startswith("unsafe type change") or "(schema policy " in text:
        return "SchemaDrift"
    return "UnreadableFile"


class SparkSchemaIO:
    """What `prepare_files` asks of the table and of parquet footers, answered by Spark (the Arrow
    engine answers the same with PyIceberg and pyarrow: lakehouse.engines.arrow.tables.ArrowSchemaIO)."""

    def __init__(self, spark: SparkSession | None, tables):
        self.spark = spark
        self.tables = tables

    def exists(self, ident: str) -> bool:
        return self.tables.exists(ident)

    def table_schema(self, ident: str) -> StructType:
        return self.tables.read(ident).schema

    def footer_schema(self, path: str) -> StructType:
        """Spark's own parquet type mapping (NTZ timestamps, unsigned integers...); raises when
        Spark cannot read the footer."""
        return (self.spark or self.tables.spark).read.parquet(path).schema

    def evolve(self, ident: str, changes: list) -> None:
        """New columns and promotable widenings, as ALTER TABLE statements."""
        tables = self.tables
        qualified = tables.qualified(ident)
        statements = []
        for c in changes:
            path = ".".join(quote(p) for p in c.path)
            if c.kind == "new":
                statements.append(f"ALTER TABLE {qualified} ADD COLUMN {path} {ddl_type(c.found)}")
            else:
                statements.append(f"ALTER TABLE {qualified} ALTER COLUMN {path} TYPE {ddl_type(c.found)}")

        def apply() -> None:
            current = tables.read(ident).schema
            for c, sql in zip(changes, statements, strict=True):
                if c.kind == "new" and _has_path(current, c.path):
                    continue  # a concurrent run or a healing retry added it already
                tables.spark.sql(sql)

        retry_metadata_commit(tables, ident, apply)


def prepare_files(runner: StageContext, spark: SparkSession | None, source: Source, files: list[FileRef],
                  schema_io=None) -> PreparedFiles:
    """Probe and reconcile every file of the run; evolve the table for the loadable ones.
    `schema_io`: how table and footer schemas are read and the table evolved (default: Spark)."""
    from pyspark.sql.types import StructField, StructType

    if any(f.status == PROCESSED and f.size and "://" in (f.local_path or f.key)
           and not (f.local_path or "").startswith("file:") for f in files):
        # read_mode direct: the objects are not local, so they cannot be probed before Spark
        return PreparedFiles(source, [f if f.status != PROCESSED or f.size else f.with_status(EMPTY)
                                      for f in files], None, inferred=True)
    io = schema_io if schema_io is not None else SparkSchemaIO(spark, runner.platform.tables())
    ident = runner.target.identifier
    platform_cols = {c.lower() for c in LINEAGE_COLUMNS} if source.lineage_columns else set()
    platform_cols |= {pf.column.lower() for pf in source.promote_fields}
    table = None
    if io.exists(ident):
        table = StructType([f for f in io.table_schema(ident).fields if f.name.lower() not in platform_cols])
    declared = StructType([StructField(c.name, _parse_type(c.type)) for c in source.columns]) if source.columns else None
    reference = _reference(table, declared)
    policy = runner.schema_policy()
    contract = {c.name.lower() for r in runner.rules if r.enabled and r.type == "schema_contract"
                for c in r.expected_columns}
    allowed = contract | {c.name.lower() for c in source.columns}

    prepared, probes = _probe_all(runner, source, files, reference)
    if source.format == "parquet":
        _resolve_parquet(io, prepared, probes)
    else:
        prepared.read_schemas.update({key: p.schema for key, p in probes.items()})
    reserved = _reserved_columns(prepared, platform_cols)
    prepared.files = [f.with_status(QUARANTINED, reserved[f.key]) if f.key in reserved else f for f in prepared.files]
    good = [f for f in prepared.files if f.status == PROCESSED and f.key in prepared.read_schemas]
    if not good:
        prepared.schema = reference
        return prepared

    schemas = [(f.key, prepared.read_schemas[f.key]) for f in good]
    if table is None:  # a new table: what most files agree on (the declared columns as declared)
        voted = vote([s for _, s in schemas])
        if policy != "evolve" and allowed:
            voted = _only(voted, allowed)
        reference = voted if declared is None else merge(declared, _only(voted, {
            f.name.lower() for f in voted.fields} - {f.name.lower() for f in declared.fields}))
    decisions, table_target = reconcile_files(reference, schemas, policy, allowed)
    # policy fail with a schema_contract rule: a file's new top-level columns go to the contract,
    # which keeps them off the branch and fails its check (blocking when the rule is `error`)
    contract_fail = policy == "fail" and any(r.enabled and r.type == "schema_contract" for r in runner.rules)
    kept_for_contract = _apply_decisions(prepared, decisions, ident, contract_fail)
    final = table_target
    for d in kept_for_contract:  # read, so that the contract sees them; never added to the table
        final = merge(final, prepared.read_schemas[d.key])
        runner.audit("schema_drift", outcome="kept_off_branch", message=f"{d.key}: {d.reason}",
                     details={"key": d.key, "columns": [c.column for c in d.of("new")]})
    prepared.schema = final
    for f in prepared.files:
        if f.status == PROCESSED and f.key in prepared.read_schemas:
            own = prepared.read_schemas[f.key]
            if source.format == "jsonl":  # read straight into the reconciled schema, in the file's casing
                prepared.read_schemas[f.key] = _recase(final, own)
                prepared.read_keys[f.key] = "jsonl|" + prepared.read_schemas[f.key].json()
            else:
                prepared.read_keys[f.key] = probes[f.key].read_key + "|" + own.json()
    if table is not None:
        _evolve_table(runner, io, ident, table, table_target)
    _report(runner, prepared)
    return prepared


def _probe_all(runner: StageContext, source: Source, files: list[FileRef], reference: StructType | None
               ) -> tuple[PreparedFiles, dict[str, FileProbe]]:
    """Every file probed (results kept on the runner, so a healing retry does not probe again)."""
    expect = {f.name.lower(): f.dataType for f in (reference.fields if reference is not None else [])}
    cache: dict = runner.__dict__.setdefault("_file_probes", {})
    sig = json.dumps({k: t.simpleString() for k, t in sorted(expect.items())})
    checked: list[FileRef] = []
    probes: dict[str, FileProbe] = {}
    for f in files:
        if f.status != PROCESSED:  # refused at listing, or quarantined by healing
            checked.append(f)
            continue
        if f.size == 0:
            checked.append(f.with_status(EMPTY))
            continue
        ck = (f.key, f.etag, sig)
        if ck not in cache:
            cache[ck] = probe_file(f.local_path or f.key, source.format, limits=source.limits,
                                   csv_header=source.csv_header, expect=expect,
                                   declared_names=[c.name for c in source.columns] or None, name=f.key)
        p = cache[ck]
        if p.status != PROCESSED:
            why = gone_or_changed(f)
            if why is not None:  # not the file's fault: it vanished or changed while it was probed
                del cache[ck]
                note_deferred_files(runner, [f], {f.key: why})
                runner.healing.skipped_files[f.key] = why
                continue
            checked.append(f.with_status(p.status, p.error))
            continue
        probes[f.key] = p
        checked.append(f)
    return PreparedFiles(source, checked, None), probes


def _apply_decisions(prepared: PreparedFiles, decisions: list[Decision], ident: str,
                     contract_fail: bool) -> list[Decision]:
    """Quarantine the files that do not fit; raise for policy `fail`; return the files whose new
    columns are left to a `fail` schema contract."""
    failed, kept_for_contract = [], []
    prepared.decisions = {d.key: d for d in decisions}
    for i, f in enumerate(prepared.files):
        d = prepared.decisions.get(f.key)
        if d is None:
            continue
        if d.action == QUARANTINE:
            prepared.files[i] = f.with_status(QUARANTINED, d.reason)
        elif d.action == FAIL:
            drift = [c for c in d.changes if c.kind in ("new", "widen")]
            if contract_fail and all(c.kind == "new" and len(c.path) == 1 for c in drift):
                kept_for_contract.append(d)
            else:
                failed.append(d)
    if failed:
        raise SchemaPolicyViolation(
            f"{ident}: {len(failed)} file(s) do not fit the table and the schema policy is 'fail': "
            + "; ".join(f"{d.key}: {d.reason}" for d in failed[:20])
            + ". Nothing was written. Fix or remove the files, or change the policy (evolve adds new columns, "
            "freeze quarantines such files).")
    return kept_for_contract


def _reserved_columns(prepared: PreparedFiles, reserved: set[str]) -> dict[str, str]:
    """Files with a column the platform writes itself (lineage columns, promoted fields): it would
    be overwritten, so the file is quarantined instead."""
    out = {}
    for key, schema in prepared.read_schemas.items():
        clash = [f.name for f in schema.fields if f.name.lower() in reserved]
        if clash:
            out[key] = (f"column(s) {', '.join(clash)} are written by the platform for this source "
                        "(lineage_columns / promote_fields) and would overwrite the file's values")
    return out


def _resolve_parquet(io: SparkSchemaIO, prepared: PreparedFiles, probes: dict[str, FileProbe]) -> None:
    """The Spark schema of each distinct footer schema (Spark's own parquet type mapping: NTZ
    timestamps, unsigned integers...); a footer Spark cannot map quarantines its files."""
    by_key: dict[str, list[str]] = {}
    for key, p in probes.items():
        by_key.setdefault(p.read_key, []).append(key)
    local = {f.key: f.local_path or f.key for f in prepared.files}
    refused: dict[str, str] = {}
    for keys in by_key.values():
        try:
            schema = io.footer_schema(local[keys[0]])
        except Exception as exc:  # noqa: BLE001 - Spark cannot read files of this schema
            lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()] or [type(exc).__name__]
            line = next((ln for ln in reversed(lines) if "Exception: " in ln and not ln.startswith("at ")), lines[0])
            for k in keys:  # the innermost message: "Illegal Parquet type: INT64 (TIMESTAMP(NANOS,false))."
                refused[k] = f"Spark cannot read this parquet schema: {line.rsplit('Exception: ', 1)[-1][:400]}"
            continue
        for k in keys:
            prepared.read_schemas[k] = schema
    if refused:
        prepared.files = [f.with_status(QUARANTINED, refused[f.key]) if f.key in refused else f for f in prepared.files]


def _recase(want: DataType, have: DataType) -> DataType:
    """`want` with field names spelled as in `have` (JSON fields are matched case-sensitively by the reader)."""
    from pyspark.sql.types import ArrayType, MapType, StructField, StructType

    if isinstance(want, StructType) and isinstance(have, StructType):
        by_name = {f.name.lower(): f for f in have.fields}
        out = []
        for f in want.fields:
            src = by_name.get(f.name.lower())
            out.append(StructField(src.name if src else f.name,
                                   _recase(f.dataType, src.dataType) if src else f.dataType, True))
        return StructType(out)
    if isinstance(want, ArrayType) and isinstance(have, ArrayType):
        return ArrayType(_recase(want.elementType, have.elementType), True)
    if isinstance(want, MapType) and isinstance(have, MapType):
        return MapType(want.keyType, _recase(want.valueType, have.valueType), True)
    return want


def _evolve_table(runner: StageContext, io: SparkSchemaIO, ident: str, table: StructType, final: StructType) -> None:
    """New columns (nested ones too) and promotable widenings, before the first write."""
    changes = [c for c in compare(table, final) if c.kind in ("new", "widen")]
    if not changes:
        return
    io.evolve(ident, changes)
    described = [c.describe() for c in changes]
    runner.audit("schema_evolved", outcome="applied", message="; ".join(described)[:2000],
                 details={"changes": [{"kind": c.kind, "column": c.column, "type": c.found.simpleString()}
                                      for c in changes]})
    runner.log.info("%s: schema evolved before the write: %s", ident, "; ".join(described))
    report = runner.report
    report["schema_changes"] = described
    report["schema_added_columns"] = [c.column for c in changes if c.kind == "new" and len(c.path) == 1]


def _has_path(schema, path: tuple[str, ...]) -> bool:
    from pyspark.sql.types import ArrayType, MapType, StructType

    t = schema
    for p in path:
        if isinstance(t, StructType):
            f = next((x for x in t.fields if x.name.lower() == p.lower()), None)
            if f is None:
                return False
            t = f.dataType
        elif isinstance(t, ArrayType) and p == "element":
            t = t.elementType
        elif isinstance(t, MapType) and p == "value":
            t = t.valueType
        else:
            return False
    return True


def _report(runner: StageContext, prepared: PreparedFiles) -> None:
    """What reconciliation decided for loaded files (casts, NULL columns), for the run's metadata."""
    notes = []
    report = runner.report
    report["schema_quarantined"] = [{"key": k, "reason": d.reason} for k, d in prepared.decisions.items()
                                    if d.action == QUARANTINE]
    for key, d in prepared.decisions.items():
        if d.action != "load" or not d.changes:
            continue
        kinds: dict[str, list[str]] = {}
        for c in d.changes:
            kinds.setdefault(c.kind, []).append(c.column)
        notes.append({"key": key, **kinds})
    if notes:
        report["schema_notes"] = notes


def read_alone(spark: SparkSession, source: Source, f: FileRef) -> DataFrame:
    """One file read on its own with its own schema (healing's per-file readability check); raises
    if it cannot be read."""
    path = f.local_path or f.key
    if source.format == "parquet":
        return spark.read.parquet(path)
    p = probe_file(path, source.format, limits=source.limits, csv_header=source.csv_header)
    if p.status == QUARANTINED:
        raise ValueError(f"{f.key}: {p.error}")
    if p.schema is None:  # empty: nothing to read
        return spark.createDataFrame([], "empty int")
    return _reader(spark, source, p.schema, [path])
