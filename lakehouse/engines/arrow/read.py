"""Files read by pyarrow as Spark reads them, in the schema the shared probe and reconciliation
planned (lakehouse.ingest.prepare), with the promoted fields and the lineage columns."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from lakehouse.engines import isolate
from lakehouse.engines.arrow.conform import conform
from lakehouse.engines.types import UTC_US, arrow_schema
from lakehouse.ingest import files as file_ingest
from lakehouse.ingest.checkpoints import checked_files
from lakehouse.ingest.files import FileRef
from lakehouse.ingest.limits import CODEC_SUFFIXES
from lakehouse.ingest.prepare import PreparedFiles, prepare_files
from lakehouse.ingest.probe import longest_line

if TYPE_CHECKING:
    from lakehouse.engines.arrow.tables import ArrowTables
    from lakehouse.metadata.model import Source
    from lakehouse.stage.core import Batch, ExtractPlan, StageContext


def _field_path(table: pa.Table, path: str) -> pa.ChunkedArray:
    """A dotted path into struct columns, matched case-insensitively (Spark's `col("a.b")`)."""
    parts = path.split(".")
    by_name = {n.lower(): n for n in table.column_names}
    if parts[0].lower() not in by_name:
        raise ValueError(f"promote_fields: column {parts[0]!r} of path {path!r} is not in the data")
    arr = table.column(by_name[parts[0].lower()])
    for p in parts[1:]:
        names = {arr.type.field(i).name.lower(): arr.type.field(i).name for i in range(arr.type.num_fields)} \
            if pa.types.is_struct(arr.type) else {}
        if p.lower() not in names:
            raise ValueError(f"promote_fields: {path!r} has no field {p!r}")
        arr = pc.struct_field(arr, names[p.lower()])
    return arr


#: JSON-lines files from twice this size up are parsed in blocks of it, in parallel
READ_BLOCK_BYTES = 1 << 20


#: the codecs a JSON-lines or CSV file is decompressed with, by its name's ending (as Spark and the
#: probe pick them: lakehouse.ingest.probe.OPENERS), in pyarrow's names
ARROW_CODECS = {"gzip": "gzip", "bzip2": "bz2", "zstd": "zstd"}


def _codec(name: str) -> str | None:
    suffix = Path(name).suffix.lower()
    return ARROW_CODECS.get(CODEC_SUFFIXES.get(suffix, ""))


def _read_file(source: Source, path: str, own: pa.Schema, name: str | None = None) -> pa.Table:
    """One file read with its own (probed) schema, the way Spark reads it with that schema; `name`
    (the file's key: a staged copy's own name is opaque) says its codec."""
    import pyarrow.csv as pcsv
    import pyarrow.json as pjson
    import pyarrow.parquet as pq

    if source.format == "parquet":
        return pq.read_table(path)
    codec = _codec(name or path)
    # timestamps and dates are read as text and parsed by `conform` with Spark's grammar
    types = {f.name: (pa.string() if pa.types.is_timestamp(f.type) or pa.types.is_date(f.type) else f.type)
             for f in own}
    if source.format == "jsonl":
        if codec:
            with pa.input_stream(path, compression=codec) as stream:
                data = stream.read()
        else:
            data = Path(path).read_bytes()
        # from 2 MB up, blocks parse in parallel (half the time on two cores at 15 MB); with an explicit
        # schema the table is the one a single block gives. A block is at least twice the longest
        # line, as the probe's: a line straddling more than one block boundary is refused by
        # pyarrow, and that refusal can abort the process as its threads unwind (pyarrow 21)
        block = len(data) + 1 if len(data) < 2 * READ_BLOCK_BYTES else max(READ_BLOCK_BYTES, 2 * longest_line(data) + 2)
        return pjson.read_json(pa.BufferReader(data), read_options=pjson.ReadOptions(block_size=block),
                               parse_options=pjson.ParseOptions(explicit_schema=pa.schema(types.items()),
                                                                unexpected_field_behavior="ignore"))
    # CSV: the names in file order (the probe's header), RFC 4180 quotes, quoted newlines, "" is NULL
    with pa.input_stream(path, compression=codec) as stream:  # codec None: the file as it is
        return pcsv.read_csv(
            stream, read_options=pcsv.ReadOptions(column_names=own.names, skip_rows=1 if source.csv_header else 0),
            parse_options=pcsv.ParseOptions(newlines_in_values=source.options.get("csv_multiline", "true") == "true"),
            convert_options=pcsv.ConvertOptions(column_types=types, strings_can_be_null=True, null_values=[""],
                                                quoted_strings_can_be_null=False))


def read_prepared(prepared: PreparedFiles, files: list[FileRef], object_uri: Callable[[FileRef], str] | None
                  ) -> pa.Table:
    """The loadable `files` as one Arrow table in the reconciled schema, with the promoted fields
    and the lineage columns (what `PreparedFiles.read` + `read_batch` give on Spark)."""
    source = prepared.source
    want = arrow_schema(prepared.schema)  # the shared reconciliation speaks Spark's types
    parts = []
    for f in files:
        local = f.local_path or f.key
        try:
            t = conform(_read_file(source, local, arrow_schema(prepared.read_schemas[f.key]), f.key), want)
        except (pa.ArrowException, OSError, ValueError) as exc:  # what the probe passed and pyarrow still refuses
            # (a corrupt data page behind a good footer, a file gone since the plan): this file's
            # problem alone, which lakehouse.engines.isolate finds and sets aside
            detail = " ".join(str(exc).split()) or type(exc).__name__
            raise ValueError(f"{f.key}: pyarrow cannot read this file as its probe planned: {detail}") from exc
        if source.lineage_columns:
            name = object_uri(f) if object_uri is not None and f.local_path and f.local_path != f.key \
                else Path(local).resolve().as_uri()
            t = t.append_column("_source_file", pa.repeat(pa.scalar(name, pa.string()), t.num_rows))
        parts.append(t)
    out = pa.concat_tables(parts)
    if source.lineage_columns:  # promoted fields come before the lineage columns, as on Spark
        src_file = out.column("_source_file")
        out = out.drop_columns(["_source_file"])
    for pf in source.promote_fields:
        out = out.append_column(pf.column, _field_path(out, pf.path))
    if source.path_columns:  # Hive-style `name=value` segments of each file's key (lakehouse.ingest.dated)
        out = _with_path_columns(out, source, files, [len(t) for t in parts])
    if source.lineage_columns:
        now = pa.scalar(dt.datetime.now(dt.UTC), UTC_US)
        out = out.append_column("_source_file", src_file)
        out = out.append_column("_ingested_at", pa.repeat(now, out.num_rows))
    return out



def file_batches(ctx: StageContext, plan: ExtractPlan, tables: ArrowTables) -> Iterator[Batch]:
    """The planned files probed and reconciled on their own (the shared prepare step), then read by
    pyarrow in batches of `batch_files`, one checkpointed commit per batch (FileSourceAdapter.batches)."""
    from lakehouse.engines.arrow.tables import ArrowSchemaIO
    from lakehouse.stage.core import Batch

    src = ctx.source
    object_uri = ctx.adapter().object_uri(ctx)
    todo = [f for f in plan.files if f.key not in ctx.healing.quarantined_files
            and f.key not in ctx.healing.skipped_files]
    done = 0
    prepared = prepare_files(ctx, None, src, todo, schema_io=ArrowSchemaIO(tables))
    for chunk in file_ingest.batches(prepared.files, ctx.healing.effective_batch(src.batch_files),
                                      ctx.healing.effective_batch(src.batch_bytes)):
        checked, good = checked_files(ctx, chunk)
        done += len(chunk)
        reader = ArrowFilesReader(prepared, object_uri)
        # a file pyarrow cannot read (a corrupt page, a file gone since the plan) is set aside alone
        read = isolate.read_isolating(ctx, good, reader) if good else None
        if read is None:
            continue
        frame, read_files = read
        props = {file_ingest.CHECKPOINT_PROPERTY: file_ingest.checkpoint_value(_final(checked, ctx, read_files)),
                 "lakehouse.run_id": ctx.run_id}
        yield Batch(frame, props, read_files, label=f"{len(read_files)} files, {done}/{len(todo)} files done",
                    reader=reader)


def _final(checked: list[FileRef], ctx: StageContext, read: list[FileRef]) -> list[FileRef]:
    """The chunk's checkpoint entries after its read: files read, files recorded before (empty,
    quarantined by the probe), files the read quarantined; not those left for the next run."""
    from lakehouse.ingest.files import PROCESSED, QUARANTINED

    keys = {f.key for f in read}
    out = []
    for f in checked:
        if f.status != PROCESSED or f.key in keys:
            out.append(f)
        elif f.key in ctx.healing.quarantined_files:
            out.append(f.with_status(QUARANTINED, ctx.healing.quarantined_files[f.key]))
    return out


class ArrowFilesReader:
    """The Arrow engine's `lakehouse.stage.core.FileReader` of prepared files (pyarrow reads eagerly:
    a frame is read to its last value, so `check` is `frame`)."""

    def __init__(self, prepared: PreparedFiles, object_uri: Callable[[FileRef], str] | None):
        self.prepared, self.object_uri = prepared, object_uri

    def frame(self, files: list[FileRef]) -> pa.Table:
        return read_prepared(self.prepared, files, self.object_uri)

    def check(self, files: list[FileRef]) -> None:
        self.frame(files)


PATH_COLUMN_ARROW = {"int": pa.int32(), "bigint": pa.int64(), "string": pa.string(), "date": pa.date32()}


def _with_path_columns(out: pa.Table, source, files: list[FileRef], rows: list[int]) -> pa.Table:
    """The declared path columns, typed as on Spark (a missing or unfitting value is null)."""
    from lakehouse.ingest.dated import path_value, typed_value

    for col in source.path_columns:
        values = []
        for f, n in zip(files, rows, strict=True):
            values += [typed_value(path_value(f.key, col.name), col.type)] * n
        arr = pa.array(values, PATH_COLUMN_ARROW[col.type])
        at = out.schema.get_field_index(col.name)  # the table's own column (reconciled as null): replaced
        out = out.set_column(at, col.name, arr) if at >= 0 else out.append_column(col.name, arr)
    return out

