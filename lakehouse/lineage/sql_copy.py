"""Redshift `COPY table [(columns)] FROM 's3://bucket/prefix' <options>` → an S3 source and a bronze stage.

The seed's pipelines start with COPY statements. One becomes:

* a `sources` row: kind s3, the bucket, the key prefix and a glob (Redshift loads every key that
  starts with the prefix; a `*`/`?` in the path becomes the glob), the format (`JSON` → jsonl,
  `CSV` → csv with `IGNOREHEADER 1` → csv_header, `PARQUET`), and the column types of a
  `CREATE TABLE` of the same table earlier in the file (else the files' own schema is used);
* a `targets` row for the table (append, as COPY appends) and a bronze `stages` row reading the
  source, plus the lineage edge source → table.

Credentials in the statement (IAM_ROLE, CREDENTIALS, ACCESS_KEY_ID, SECRET_ACCESS_KEY,
SESSION_TOKEN) are never copied into metadata, nor echoed: the platform reads S3 with its own AWS
credentials. Options the platform has no equivalent for are listed as notes in the output, not
dropped silently; those that would change what is loaded and cannot be honoured (MANIFEST,
jsonpaths files, other delimiters, fixed-width, ORC/Avro) are errors naming the option.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from sqlglot import exp

from lakehouse.lineage.graph import STAGE_PREFIX
from lakehouse.metadata.model import ColumnSpec, DatasetLineage, Source, Stage
from lakehouse.sql.parse import table_name

if TYPE_CHECKING:
    from lakehouse.metadata.model import MetadataCatalog


class ImportState(Protocol):
    """What a COPY statement needs of the SQL importer's state (lakehouse.lineage.sql_import
    passes its own): typed here, so this module never imports the importer that calls it."""

    catalog: MetadataCatalog
    file_name: str
    res: Any
    ddl: dict[str, tuple[list, str]]
    copied: set[str]

    def target_for(self, ns: str | None, tbl: str, layer: str, write_mode: str) -> tuple[str, str, str, bool]: ...

    def place(self, where: str, identifier: str, layer: str, table: str, target_id: str,
              upstream_ids: list[str]) -> tuple[str, int, str]: ...

    def added(self, stage: Stage, names: list[str], identifier: str) -> None: ...

SECRET_OPTIONS = {"IAM_ROLE", "CREDENTIALS", "ACCESS_KEY_ID", "SECRET_ACCESS_KEY", "SESSION_TOKEN",
                  "MASTER_SYMMETRIC_KEY", "WITH"}
#: options followed by a value (an optional AS in between)
VALUED = {"DELIMITER", "IGNOREHEADER", "QUOTE", "NULL", "REGION", "TIMEFORMAT", "DATEFORMAT", "MAXERROR",
          "ENCODING", "FIXEDWIDTH", *SECRET_OPTIONS - {"WITH"}}
#: options whose value is optional: a string after them (JSON 'auto'), or ON/OFF after the *UPDATE ones
OPTIONAL_VALUE = {"JSON", "AVRO", "ACCEPTINVCHARS"}
OPTIONAL_SWITCH = {"COMPUPDATE", "STATUPDATE"}
SWITCHES = {"ON", "OFF", "TRUE", "FALSE", "PRESET"}
FORMATS = {"JSON": "jsonl", "CSV": "csv", "PARQUET": "parquet"}
HARMLESS = {"GZIP", "BZIP2"}  # Spark decompresses .gz / .bz2 files by their extension


class CopyImportError(ValueError):
    """A COPY the platform cannot load the way Redshift would; names the statement and the option."""


def _tokens(stmt: exp.Copy) -> list[tuple[str, bool]]:
    """COPY's options as (text, is_string) in statement order (sqlglot pairs them loosely)."""
    out: list[tuple[str, bool]] = []

    def add(node) -> None:
        if node is None:
            return
        if isinstance(node, exp.Literal):
            out.append((str(node.this), bool(node.is_string)))
        elif isinstance(node, (exp.Var, exp.Identifier, exp.Column)):
            out.extend((part, False) for part in str(node.name).split())
        else:
            out.append((node.sql(), False))

    for p in stmt.args.get("params") or []:
        add(p.this)
        add(p.args.get("expression"))
        for e in p.args.get("expressions") or []:
            add(e)
    return out


def parse_options(stmt: exp.Copy, where: str) -> tuple[dict[str, str | None], list[str]]:
    """({OPTION: value or None}, names of credential options present)."""
    toks = _tokens(stmt)
    opts: dict[str, str | None] = {}
    secrets = [k.upper() for k, v in (stmt.args.get("credentials") or exp.Credentials()).args.items() if v]
    i = 0
    while i < len(toks):
        text, is_str = toks[i]
        key = text.upper()
        i += 1
        if is_str:
            raise CopyImportError(f"{where}: unexpected value in the COPY options (after "
                                  f"{next(reversed(opts), 'FROM')})")
        if key == "FORMAT":
            if i < len(toks) and toks[i][0].upper() == "AS":
                i += 1
            if i >= len(toks):
                raise CopyImportError(f"{where}: FORMAT without a format")
            key = toks[i][0].upper()
            i += 1
        nxt = toks[i] if i < len(toks) else None
        if key in VALUED or (key in OPTIONAL_VALUE and nxt and (nxt[1] or nxt[0].upper() == "AS")) or (
                key in OPTIONAL_SWITCH and nxt and nxt[0].upper() in SWITCHES):
            if i < len(toks) and toks[i][0].upper() == "AS" and not toks[i][1]:
                i += 1
            if i >= len(toks):
                raise CopyImportError(f"{where}: option {key} needs a value")
            value = toks[i][0]
            i += 1
        else:
            value = None
        if key in SECRET_OPTIONS:
            secrets.append(key)  # the value is a credential: never kept, never printed
            continue
        opts[key] = value
    return opts, secrets


def _s3_location(path: str, where: str) -> tuple[str, str, str]:
    """(bucket, prefix, glob): Redshift loads every key starting with the path; globs are honoured too."""
    m = re.match(r"^s3://([^/]+)/?(.*)$", path)
    if not m:
        raise CopyImportError(f"{where}: only COPY ... FROM 's3://bucket/prefix' can be imported, not {path!r}")
    bucket, rest = m.group(1), m.group(2)
    wild = re.search(r"[*?\[]", rest)
    cut = rest.rfind("/", 0, wild.start() if wild else len(rest)) + 1
    prefix, tail = rest[:cut], rest[cut:]
    glob = tail if wild else (tail + "*" if tail else "*")
    return bucket, prefix, glob


def _spark_type(kind: exp.DataType) -> str:
    if kind.is_type(*exp.DataType.TEXT_TYPES):
        return "string"
    return kind.sql(dialect="spark").lower().replace(" ", "")


def import_copy(st: ImportState, stmt: exp.Copy, i: int, where: str) -> None:
    """Add the source, target, bronze stage and lineage edge one COPY implies to `st.res`."""
    if not stmt.args.get("kind"):
        raise CopyImportError(f"{where}: COPY ... TO (an unload) is not a load; only COPY ... FROM is imported")
    files = stmt.args.get("files") or []
    if len(files) != 1 or not isinstance(files[0], exp.Literal):
        raise CopyImportError(f"{where}: COPY must name exactly one 's3://...' location")
    bucket, prefix, glob = _s3_location(str(files[0].this), where)
    opts, secrets = parse_options(stmt, where)
    tgt = stmt.this
    col_list: list[str] = []
    if isinstance(tgt, exp.Schema):
        col_list = [c.name for c in tgt.expressions]
        tgt = tgt.this
    if not isinstance(tgt, exp.Table) or not tgt.name:
        raise CopyImportError(f"{where}: cannot tell which table the COPY loads")
    name = Path(st.file_name).name
    for bad, why in (("MANIFEST", "a manifest file lists the objects to load"),
                     ("FIXEDWIDTH", "fixed-width files"), ("ORC", "ORC files"), ("AVRO", "Avro files"),
                     ("SHAPEFILE", "shapefiles"), ("ENCRYPTED", "client-side encrypted files")):
        if bad in opts:
            raise CopyImportError(f"{where}: COPY option {bad} ({why}) cannot be imported; load the objects "
                                  "through an S3 source by prefix and glob instead")
    formats = [f for f in FORMATS if f in opts]
    if len(formats) > 1:
        raise CopyImportError(f"{where}: COPY names several formats: {', '.join(formats)}")
    if not formats:
        raise CopyImportError(f"{where}: COPY without JSON, CSV or PARQUET is Redshift's pipe-delimited text, which "
                              "the platform does not read; convert the files or say FORMAT AS CSV / JSON / PARQUET")
    fmt = formats[0]
    notes: list[str] = []
    if fmt == "JSON" and (opts["JSON"] or "auto").lower() not in ("auto", "auto ignorecase"):
        raise CopyImportError(f"{where}: JSON with a jsonpaths file cannot be imported; only JSON 'auto'")
    if fmt == "JSON" and (opts["JSON"] or "").lower() == "auto ignorecase":
        notes.append("JSON 'auto ignorecase': keys are matched to columns by Spark's (case-insensitive) resolution")
    delimiter = opts.get("DELIMITER")
    if delimiter is not None and delimiter != ",":
        raise CopyImportError(f"{where}: DELIMITER {delimiter!r} cannot be imported; the platform reads "
                              "comma-separated CSV")
    header = opts.get("IGNOREHEADER")
    if header not in (None, "0", "1"):
        raise CopyImportError(f"{where}: IGNOREHEADER {header} cannot be imported; only a one-line header")
    handled = {fmt, "FORMAT", "DELIMITER", "IGNOREHEADER", *HARMLESS}
    ignored = sorted(k for k in opts if k not in handled)
    if ignored:
        notes.append(f"COPY option(s) {', '.join(ignored)} not imported: the stage reads with Spark's defaults "
                     "(use validation_rules for what MAXERROR-like options checked)")
    if secrets:
        notes.append(f"credentials in the COPY ({', '.join(sorted(set(secrets)))}) were not imported: the platform "
                     "reads S3 with its own AWS credentials (environment or instance profile)")
    st.res.notes.extend(f"{where}: {n}" for n in notes)

    # the table: bronze, appended to, with the column types of an earlier CREATE TABLE when there is one
    ns = tgt.db or None
    identifier, table, target_id, _ = st.target_for(ns, tgt.name, "bronze", "append")
    columns: list[ColumnSpec] = []
    ddl = st.ddl.get(table_name(tgt))
    if ddl is not None:
        st.copied.add(table_name(tgt))
        defs = {c.name.lower(): c for c in ddl[0]}
        wanted = [c.lower() for c in col_list] or list(defs)
        missing = [c for c in wanted if c not in defs]
        if missing:
            raise CopyImportError(f"{where}: COPY names column(s) {missing} that CREATE TABLE {table_name(tgt)} lacks")
        columns = [ColumnSpec(name=defs[c].name, type=_spark_type(defs[c].args["kind"])) for c in wanted]
    elif col_list:
        st.res.notes.append(f"{where}: the COPY column list has no types (no CREATE TABLE of {table_name(tgt)} in "
                            f"{name}): the files' own schema is read")
    source_id = _source_id(st, bucket, prefix, glob, f"{table}_s3")
    if source_id not in {s.source_id for s in st.catalog.sources}:
        st.res.sources.append(Source(
            source_id=source_id, kind="s3", format=FORMATS[fmt], bucket=bucket, prefix=prefix, glob=glob,
            **({"csv_header": header == "1"} if fmt == "CSV" else {}), columns=columns,
            description=f"S3 objects of COPY {table_name(tgt)} (statement {i} of {name})"))
    pid, order, stage_name = st.place(where, identifier, "bronze", table, target_id, [])
    st.added(Stage(pipeline_id=pid, stage_order=order, stage_name=stage_name, layer="bronze", source_id=source_id,
                   target_id=target_id, description=f"COPY from s3://{bucket}/{prefix}{glob}, imported from {name} "
                                                    f"(statement {i})"),
             [table_name(tgt), identifier, target_id], identifier)
    st.res.dataset_lineage.append(DatasetLineage(
        from_dataset_id=source_id, to_dataset_id=target_id, transform_name=f"{STAGE_PREFIX}{pid}.{stage_name}",
        cost=1.0, is_default=True))


def _source_id(st: ImportState, bucket: str, prefix: str, glob: str, wanted: str) -> str:
    """An existing source reading the same objects, else a fresh id based on the (safe) table name."""
    for s in [*st.catalog.sources, *st.res.sources]:
        if s.kind == "s3" and (s.bucket, s.prefix, s.glob) == (bucket, prefix, glob):
            return s.source_id
    taken = {s.source_id for s in [*st.catalog.sources, *st.res.sources]}
    base = wanted
    candidate, n = base, 1
    while candidate in taken:
        n += 1
        candidate = f"{base}_{n}"
    return candidate
