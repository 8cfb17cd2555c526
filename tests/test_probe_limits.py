"""Probing landing files in Python before Spark: limits, hostile content, per-file schemas, and
roots that no symlink, `..` or absolute path leaves (fast lane: no Spark)."""

from __future__ import annotations

import gzip
import io
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql.types import (
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    TimestampNTZType,
    TimestampType,
)

from lakehouse.ingest.files import EMPTY, PROCESSED, QUARANTINED, landing_root, list_local_files
from lakehouse.ingest.limits import BoundedLines, LimitExceeded
from lakehouse.ingest.paths import PathEscape, confine, key_problem, walk_files
from lakehouse.ingest.probe import probe_file
from lakehouse.metadata.model import FileLimits, Source

L = FileLimits()


def write(tmp_path, name: str, data) -> str:
    p = tmp_path / name
    p.write_bytes(data if isinstance(data, bytes) else data.encode())
    return str(p)


def deep_json(levels: int) -> str:
    return '{"id": 1, "d": ' + '{"x": ' * levels + "1" + "}" * levels + "}\n"


# --------------------------------------------------------------------------- JSON lines


def test_json_schema_is_inferred_per_file_with_sparks_rules(tmp_path):
    p = probe_file(write(tmp_path, "a.jsonl", '{"a": 1, "b": "x", "c": {"d": 1.5, "e": [1, 2]}, "n": null}\n'
                                               '{"a": 2.5, "c": {"f": true}, "m": 1}\n{"m": "text"}\n\n'),
                   "jsonl", limits=L)
    assert p.status == PROCESSED and p.rows == 3
    # int+double -> double; struct fields merged; a number and a string -> string; an all-null field is left out
    assert p.schema.simpleString() == "struct<a:double,b:string,c:struct<d:double,e:array<bigint>,f:boolean>,m:string>"


@pytest.mark.parametrize(("content", "reason"), [
    (deep_json(300), "nesting depth 65 at d.x.x"),
    (deep_json(5000), "nesting deeper than the JSON parser can follow"),
    ('{"a": 1}\n{"a": \n', "line 2: not valid JSON"),
    ("[1, 2]\n", "line 1: a JSON list, not an object"),
    (b'{"a": "\xff"}\n', "line 1: not UTF-8 text"),
    ('{"id": 1, "ID": 2}\n', "field names 'id' and 'ID' differ only in case"),
    ('{"": 1}\n', "an empty field name"),
])
def test_hostile_json_is_refused_with_the_reason(tmp_path, content, reason):
    p = probe_file(write(tmp_path, "x.jsonl", content), "jsonl", limits=L)
    assert p.status == QUARANTINED and reason in p.error, p.error
    if "nesting" in reason:
        assert "max_depth=64" in p.error


def test_json_limits_field_line_columns(tmp_path):
    big = write(tmp_path, "big.jsonl", json.dumps({"id": 1, "v": "x" * 5000}) + "\n")
    p = probe_file(big, "jsonl", limits=FileLimits(max_field_chars=1000))
    assert p.status == QUARANTINED and "a value of 5000 characters in v exceeds the limit max_field_chars=1000" in p.error
    p = probe_file(big, "jsonl", limits=FileLimits(max_line_bytes=1000))
    assert p.status == QUARANTINED and "max_line_bytes=1000" in p.error
    wide = write(tmp_path, "wide.jsonl", json.dumps({f"c{i}": i for i in range(50)}) + "\n")
    p = probe_file(wide, "jsonl", limits=FileLimits(max_columns=20))
    assert p.status == QUARANTINED and "max_columns=20" in p.error
    # Spark's JSON parser refuses strings over 20,000,000 characters whatever the limit says
    assert probe_file(big, "jsonl", limits=FileLimits(max_field_chars=10**9)).status == PROCESSED


def test_json_values_checked_against_the_tables_types(tmp_path):
    f = write(tmp_path, "t.jsonl", '{"a": 1, "b": 3000000000, "c": 12.5, "d": "2026-01-01T00:00:00Z"}\n')
    p = probe_file(f, "jsonl", limits=L, expect={"a": IntegerType(), "c": DecimalType(5, 2), "d": TimestampType()})
    assert p.status == PROCESSED
    assert p.schema.simpleString() == "struct<a:int,b:bigint,c:decimal(5,2),d:timestamp>"
    p = probe_file(f, "jsonl", limits=L, expect={"b": IntegerType()})
    assert p.status == QUARANTINED and p.error == "line 1: column b: value 3000000000 cannot be read as int"
    p = probe_file(f, "jsonl", limits=L, expect={"c": DecimalType(3, 2)})
    assert p.status == QUARANTINED and "cannot be read as decimal(3,2)" in p.error


def test_json_checks_find_the_column_whatever_its_case_and_wherever_it_appears(tmp_path):
    """The checked column is matched case-insensitively, named as the file spells it, and checked
    on every line: also on lines that lack it at first or carry it after other fields."""
    lines = ['{"x": "a"}', '{"x": "b", "Qty": 7}', '{"Qty": null, "x": "c"}', '{"x": "d", "y": 1, "Qty": "n/a"}']
    f = write(tmp_path, "q.jsonl", "\n".join(lines) + "\n")
    p = probe_file(f, "jsonl", limits=L, expect={"qty": LongType()})
    assert p.status == QUARANTINED and p.error == 'line 4: column Qty: value "n/a" cannot be read as bigint'
    ok = write(tmp_path, "ok.jsonl", "\n".join(lines[:3]) + "\n")
    p = probe_file(ok, "jsonl", limits=L, expect={"qty": LongType()})
    assert p.status == PROCESSED and p.rows == 3 and p.schema.simpleString() == "struct<x:string,Qty:bigint>"


def test_datetimes_are_checked_with_sparks_grammar(tmp_path):
    """A zone or a JSON number cannot go into a timestamp_ntz column, Spark's lenient "2024-1-1" can,
    and a JSON string of digits is a date (days since the epoch); test_bad_input_cases.py holds the
    probe to Spark's own readers spelling by spelling."""
    def verdict(value, dtype, fmt="jsonl"):
        body = f'{{"v": {json.dumps(value)}}}\n' if fmt == "jsonl" else f"v\n{value}\n"
        p = probe_file(write(tmp_path, f"x.{fmt}", body), fmt, limits=L, expect={"v": dtype})
        assert p.status in (PROCESSED, QUARANTINED), p.error
        return p.status == PROCESSED

    ntz, ts, date = TimestampNTZType(), TimestampType(), DateType()
    assert verdict("2024-01-01T10:00:00", ntz) and verdict("2024-1-1 1:2:3", ntz)
    assert not verdict("2024-01-01T10:00:00Z", ntz) and not verdict(1700000000, ntz)
    assert verdict("2024-01-01T10:00:00Z", ts) and verdict(1700000000, ts) and verdict("12:30:00", ts)
    assert not verdict("2024-01-01T10:00:00 Mars/Olympus", ts) and not verdict("2024-02-30", ts)
    assert verdict("20240101", date) and not verdict("20240101", date, "csv") and not verdict("2024/01/01", date)
    assert verdict("-0044-03-15", date) and not verdict(19000, date)


def test_quoted_decimals_are_read_as_spark_reads_them(tmp_path):
    """Spark's JSON reader takes a decimal given as a string ("12.50", "1,234.5"): such a file loads
    into a decimal column; text BigDecimal cannot parse, or a value that needs more digits once
    rounded half-up to the scale, quarantines it (tests/test_bad_input_cases.py runs the same
    spellings through Spark)."""
    want = {"amount": DecimalType(6, 2)}
    f = write(tmp_path, "q.jsonl", '{"id": 1, "amount": "12.50"}\n{"id": 2, "amount": "-1,234.5"}\n'
                                   '{"id": 3, "amount": 7}\n{"id": 4, "amount": ".5"}\n{"id": 5, "amount": "1E+2"}\n'
                                   '{"id": 6, "amount": "9999.994"}\n{"id": 7, "amount": null}\n')
    p = probe_file(f, "jsonl", limits=L, expect=want)
    assert p.status == PROCESSED, p.error
    assert p.schema.simpleString() == "struct<id:bigint,amount:decimal(6,2)>"
    for bad in ('"9999.995"', '" 12.5"', '"12.5 "', '""', '"NaN"', '"1_000"', '"abc"', '"0x10"', "true", '{"v": 1}'):
        p = probe_file(write(tmp_path, "b.jsonl", f'{{"amount": {bad}}}\n'), "jsonl", limits=L, expect=want)
        assert p.status == QUARANTINED and "cannot be read as decimal(6,2)" in p.error, (bad, p.error)
    p = probe_file(write(tmp_path, "c.csv", "id,amount\n1,\"1,234.5\"\n2,12.50\n3,\n"), "csv", limits=L, expect=want)
    assert p.status == PROCESSED and p.schema.simpleString() == "struct<id:string,amount:decimal(6,2)>"
    p = probe_file(write(tmp_path, "d.csv", "id,amount\n1, 12.5\n"), "csv", limits=L, expect=want)
    assert p.status == QUARANTINED and 'value " 12.5" cannot be read as decimal(6,2)' in p.error


def test_json_bom_crlf_gzip_and_empty(tmp_path):
    p = probe_file(write(tmp_path, "b.jsonl", b'\xef\xbb\xbf{"a": 1}\r\n{"a": 2}\r\n'), "jsonl", limits=L)
    assert p.status == PROCESSED and p.rows == 2
    p = probe_file(write(tmp_path, "g.jsonl", gzip.compress(b'{"a": 1}\n')), "jsonl", limits=L)
    assert p.status == QUARANTINED and "gzip-compressed but the file name 'g.jsonl' does not say so" in p.error
    p = probe_file(write(tmp_path, "g.jsonl.gz", gzip.compress(b'{"a": 1}\n')), "jsonl", limits=L)
    assert p.status == PROCESSED and p.schema.simpleString() == "struct<a:bigint>"
    assert probe_file(write(tmp_path, "e.jsonl", "\n  \n\n"), "jsonl", limits=L).status == EMPTY


def test_bounded_lines_never_holds_more_than_the_limit():
    class Source(io.RawIOBase):  # an endless line; counts what was read
        read_bytes = 0

        def readable(self):
            return True

        def read(self, n=-1):
            Source.read_bytes += n
            return b"x" * n

    reader = io.BufferedReader(BoundedLines(Source(), 3 * 1024**2), buffer_size=1 << 20)
    with pytest.raises(LimitExceeded, match="max_line_bytes=3145728"):
        reader.readline()
    assert Source.read_bytes <= 5 * 1024**2


# --------------------------------------------------------------------------- CSV


def test_csv_header_types_and_hostile_files(tmp_path):
    ok = probe_file(write(tmp_path, "a.csv", b'\xef\xbb\xbfid,note,amount\r\n1,"x, ""y""\nz",2.5\r\n2,w,3\r\n'),
                    "csv", limits=L, expect={"amount": DoubleType(), "id": LongType()})
    assert ok.status == PROCESSED and ok.rows == 2 and ok.header == ["id", "note", "amount"]
    assert ok.schema.simpleString() == "struct<id:bigint,note:string,amount:double>"
    cases = {
        "mixed.csv": ("id,amount\n1,2.5\n2,n/a\n", 'row 3: column amount: value "n/a" cannot be read as double'),
        "dup.csv": ("id,amount,id\n1,2,3\n", "duplicate column name 'id' in the header"),
        "case.csv": ("id,ID\n1,2\n", "column names 'id' and 'ID' in the header differ only in case"),
        "ragged.csv": ("id,amount\n1,2\n3\n", "row 3 has 1 fields, expected 2"),
        "utf8.csv": (b"id,amount\n\xff,1\n", "not UTF-8 text"),
        "gz.csv": (gzip.compress(b"id\n1\n"), "gzip-compressed"),
    }
    for name, (content, reason) in cases.items():
        p = probe_file(write(tmp_path, name, content), "csv", limits=L, expect={"amount": DoubleType()})
        assert p.status == QUARANTINED and reason in p.error, (name, p.error)
    p = probe_file(write(tmp_path, "h.csv", "id,amount\n"), "csv", limits=L)
    assert (p.status, p.error) == (EMPTY, "only a header")
    assert probe_file(write(tmp_path, "z.csv", ""), "csv", limits=L).status == EMPTY
    mixed = probe_file(write(tmp_path, "m.csv", "id,amount\n1,2.5\n2,n/a\n"), "csv", limits=L)
    assert mixed.status == PROCESSED and mixed.schema.simpleString() == "struct<id:string,amount:string>"
    p = probe_file(write(tmp_path, "w.csv", "a,b\n" + "x" * 300 + ",1\n"), "csv", limits=FileLimits(max_field_chars=100))
    assert p.status == QUARANTINED and "max_field_chars=100" in p.error


# --------------------------------------------------------------------------- parquet


def test_parquet_footer_probe(tmp_path):
    good = tmp_path / "g.parquet"
    pq.write_table(pa.table({"id": ["a"], "amount": [1.0]}), good)
    p = probe_file(good, "parquet", limits=L)
    assert p.status == PROCESSED and p.rows == 1 and p.read_key.startswith("parquet:")
    raw = good.read_bytes()
    cases = {
        "trunc.parquet": (raw[: len(raw) // 2], "truncated or corrupt footer"),
        "magic.parquet": (b"hello, not parquet", "no PAR1 magic"),
        "gz.parquet": (gzip.compress(raw), "gzip-compressed"),
    }
    for name, (content, reason) in cases.items():
        p = probe_file(write(tmp_path, name, content), "parquet", limits=L)
        assert p.status == QUARANTINED and reason in p.error, (name, p.error)
    dup = tmp_path / "dup.parquet"
    pq.write_table(pa.Table.from_arrays([pa.array([1]), pa.array([2])], names=["id", "ID"]), dup)
    assert "differ only in case" in probe_file(dup, "parquet", limits=L).error
    empty = tmp_path / "e.parquet"
    pq.write_table(pa.table({"id": pa.array([], pa.string())}), empty)
    assert probe_file(empty, "parquet", limits=L).status == EMPTY
    t = pa.int64()
    for _ in range(70):
        t = pa.struct([("x", t)])
    deep = tmp_path / "deep.parquet"
    pq.write_table(pa.table({"d": pa.array([None], t)}), deep)
    p = probe_file(deep, "parquet", limits=L)
    assert p.status == QUARANTINED and "max_depth=64" in p.error


def test_parquet_files_of_one_footer_schema_share_one_read_key(tmp_path):
    """Files whose footers have the same schema are resolved by Spark once and read in one scan;
    any difference Spark's type mapping sees (a physical or logical type, a name) keeps them apart."""
    def key(name: str, table: pa.Table, **kw) -> str:
        pq.write_table(table, tmp_path / name, **kw)
        p = probe_file(tmp_path / name, "parquet", limits=L)
        assert p.status == PROCESSED, p.error
        return p.read_key

    base = {"id": pa.array([1, 2]), "ts": pa.array([1, 2], pa.timestamp("ms"))}
    first = key("a.parquet", pa.table(base))
    assert key("b.parquet", pa.table({"id": pa.array([7]), "ts": pa.array([9], pa.timestamp("ms"))})) == first
    assert "0x" not in first  # no object address in the key
    others = [
        key("c.parquet", pa.table({**base, "id": pa.array([1, 2], pa.int32())})),
        key("d.parquet", pa.table({**base, "ts": pa.array([1, 2], pa.timestamp("us"))})),
        key("e.parquet", pa.table(base), use_deprecated_int96_timestamps=True),
        key("f.parquet", pa.table({"ID": base["id"], "ts": base["ts"]})),
    ]
    assert len({first, *others}) == 5


# --------------------------------------------------------------------------- roots are walls


def test_confine_and_object_keys(tmp_path):
    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    assert confine(root, "a/x.parquet") == root / "a" / "x.parquet"
    for bad in ("../x", "a/../../x", "/etc/passwd", "..\\x"):
        with pytest.raises(PathEscape, match="is refused"):
            confine(root, bad, "file key")
    os.symlink("/etc", root / "a" / "out")
    with pytest.raises(PathEscape, match="resolves to /etc"):
        confine(root, "a/out/passwd")
    assert key_problem("logs/2026/x.parquet", "logs/") is None
    assert "'..' segment" in key_problem("logs/../secret/x.parquet", "logs/")
    assert "'..' segment" in key_problem("logs/./x.parquet", "logs/")
    assert "starts with '/'" in key_problem("/logs/x.parquet")
    assert "not under the source's prefix" in key_problem("other/x.parquet", "logs/")


def test_landing_listing_refuses_symlinks_out_of_the_root(tmp_path):
    landing = tmp_path / "landing"
    root = landing / "events"
    (root / "sub").mkdir(parents=True)
    outside = tmp_path / "secret.jsonl"
    outside.write_text('{"secret": 1}\n')
    (root / "good.jsonl").write_text('{"a": 1}\n')
    (root / "store.data").write_text('{"a": 2}\n')
    os.symlink(outside, root / "evil.jsonl")  # leaves the root: refused
    os.symlink(root / "store.data", root / "inside.jsonl")  # stays inside: read
    os.symlink(tmp_path, root / "sub" / "up")  # a directory out of the root: never entered
    os.symlink(root / "missing.jsonl", root / "dangling.jsonl")
    os.mkfifo(root / "pipe.jsonl")  # reading it would block forever
    src = Source(source_id="s", kind="files", format="jsonl", path="events", glob="*.jsonl")
    files = {f.key: f for f in list_local_files(src, landing)}
    assert sorted(files) == ["evil.jsonl", "good.jsonl", "inside.jsonl"]
    assert files["evil.jsonl"].status == QUARANTINED and files["evil.jsonl"].local_path is None
    assert f"refused: symlink -> {outside} leaves the source root" in files["evil.jsonl"].error
    assert files["inside.jsonl"].status == PROCESSED and files["good.jsonl"].status == PROCESSED
    walked = {rel: why for rel, _, why in walk_files(root)}
    assert "leaves the source root" in walked["sub/up"]
    with pytest.raises(PathEscape, match="would leave the landing directory"):
        landing_root(Source(source_id="t", kind="files", format="jsonl", path="../../etc"), landing)


def test_entity_raw_load_requests_cannot_leave_the_landing_root(settings, tmp_path):
    from lakehouse.metadata.store import MetadataStore
    from lakehouse.stage.entity_raw import LoadRequest, resolve_files
    from lakehouse.stage.runner import Platform

    platform = Platform(settings, MetadataStore(settings.control_db_url))  # no Spark needed to resolve files
    root = settings.landing_dir / "apps"
    (root / "wf" / "run" / "raw" / "table").mkdir(parents=True)
    (root / "wf" / "run" / "raw" / "table" / "ok.parquet").write_bytes(b"PAR1")
    secret = tmp_path / "secret.parquet"
    secret.write_bytes(b"PAR1")
    os.symlink(secret, root / "wf" / "run" / "raw" / "table" / "link.parquet")
    src = Source(source_id="apps", kind="files", format="parquet", path="apps")
    for key in ("../../secret.parquet", str(secret), "wf/run/raw/table/link.parquet"):
        with pytest.raises(PathEscape, match="is refused"):
            resolve_files(platform, src, LoadRequest(application="a", tenant_id="t", file_keys=[key]))
    found, _ = resolve_files(platform, src, LoadRequest(application="a", tenant_id="t", patterns=["**/*.parquet"]))
    assert [f.key for f in found] == ["wf/run/raw/table/ok.parquet"]  # the symlink out is not matched
