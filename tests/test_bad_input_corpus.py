"""A corpus of landing files — good ones mixed with corrupt, drifted and hostile ones — through a
files source and through an S3 source (moto over HTTP), in parquet, JSON lines and CSV. One run per
source loads every good file exactly (read back with PyIceberg, an independent reader), quarantines
every bad one with a reason naming the problem, records the empty ones, and succeeds.
Real Spark + Iceberg. The corpus is generated here; every file is a few hundred bytes."""

from __future__ import annotations

import decimal
import gzip
import io
import json
import os
import stat
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lakehouse.ingest.checkpoints import Checkpoints
from lakehouse.metadata.loader import load_metadata
from lakehouse.stage.runner import StageRunner

pytestmark = pytest.mark.slow

LOAD, QUARANTINE, EMPTY = "load", "quarantine", "empty"


@dataclass
class Corpus:
    files: dict[str, bytes] = field(default_factory=dict)
    expect: dict[str, tuple[str, object]] = field(default_factory=dict)  # key -> (outcome, rows | reason)

    def add(self, key: str, data: bytes, outcome: str, detail: object = None) -> None:
        self.files[key] = data
        self.expect[key] = (outcome, detail)


def pq_bytes(rows: list[dict] | None = None, schema: pa.Schema | None = None, table: pa.Table | None = None) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table if table is not None else pa.Table.from_pylist(rows, schema=schema), buf)
    return buf.getvalue()


BASE = pa.schema([("id", pa.string()), ("amount", pa.float64()), ("event_type", pa.string()), ("qty", pa.int64())])


def rows(stem: str, n: int = 3, **extra) -> list[dict]:
    return [{"id": f"{stem}-{i}", "amount": i + 0.5, "event_type": "view", "qty": i, **extra} for i in range(n)]


def deep_struct(levels: int) -> pa.DataType:
    t = pa.int64()
    for _ in range(levels):
        t = pa.struct([("x", t)])
    return t


def parquet_corpus() -> Corpus:
    c = Corpus()
    # sorts first: a new table's types come from what most files agree on, not from the first file
    c.add("p00_drift_type_change.parquet", pq_bytes([{"id": "p00-0", "amount": "12.50", "event_type": "view"}]),
          QUARANTINE, "unsafe type change: column amount: expected double, found string")
    for stem in ("p01", "p02"):
        c.add(f"{stem}_good.parquet", pq_bytes(rows(stem), BASE), LOAD, rows(stem))
    r = [{k: v for k, v in x.items() if k != "event_type"} for x in rows("p03")]
    c.add("p03_missing_event_type.parquet", pq_bytes(r), LOAD, r)
    r = rows("p04", coupon_code="SAVE10")
    c.add("p04_coupon.parquet", pq_bytes(r), LOAD, r)
    r = rows("p05", extra={"channel": "web", "score": 0.5})
    c.add("p05_nested_extra.parquet", pq_bytes(r), LOAD, r)
    r = rows("p06", extra={"channel": "app", "score": 1.5, "campaign": "c7"})
    c.add("p06_nested_more.parquet", pq_bytes(r), LOAD, r)
    r = rows("p07", **{"größe": "XL", "select": "kw", "a.b c-d": "punct", "we`ird": "tick"})
    c.add("p07_hostile_names.parquet", pq_bytes(r), LOAD, r)
    narrow = pa.schema([("id", pa.string()), ("amount", pa.float32()), ("event_type", pa.string()), ("qty", pa.int32())])
    c.add("p08_narrow_types.parquet", pq_bytes(rows("p08"), narrow), LOAD, rows("p08"))
    good = pq_bytes(rows("p09"), BASE)
    c.add("p09_truncated.parquet", good[: len(good) // 2], QUARANTINE, "truncated or corrupt footer")
    c.add("p10_wrong_magic.parquet", b"id,amount\n1,2\n", QUARANTINE, "no PAR1 magic")
    c.add("p11_zero_byte.parquet", b"", EMPTY)
    c.add("p12_gzip.parquet", gzip.compress(pq_bytes(rows("p12"), BASE)), QUARANTINE, "gzip-compressed")
    c.add("p13_no_rows.parquet", pq_bytes([], BASE), EMPTY)
    ns = pa.table({"id": ["p14-0"], "ts": pa.array([1], pa.int64()).cast(pa.timestamp("ns"))})
    c.add("p14_nanos.parquet", pq_bytes(table=ns), QUARANTINE, "Spark cannot read this parquet schema")
    c.add("p15_dup_case.parquet", pq_bytes(table=pa.Table.from_arrays([pa.array(["a"]), pa.array(["b"])],
                                                                       names=["id", "ID"])),
          QUARANTINE, "column names 'id' and 'ID' differ only in case")
    c.add("p16_too_deep.parquet", pq_bytes(table=pa.table({"id": ["p16-0"], "d": pa.array([None], deep_struct(70))})),
          QUARANTINE, "exceeds the limit max_depth=64")
    unsigned = pa.schema([("id", pa.string()), ("qty", pa.uint32())])
    r = [{"id": f"p17-{i}", "qty": 4_000_000_000 + i} for i in range(2)]
    c.add("p17_unsigned.parquet", pq_bytes(r, unsigned), LOAD, r)
    for stem, prec in (("p18", 9), ("p19", 12)):
        r = [{"id": f"{stem}-0", "price": decimal.Decimal("1234.56")}]
        c.add(f"{stem}_decimal_{prec}.parquet", pq_bytes(r, pa.schema([("id", pa.string()),
                                                                         ("price", pa.decimal128(prec, 2))])), LOAD, r)
    c.add("p20_reserved_column.parquet", pq_bytes([{"id": "p20-0", "_source_file": "forged"}]), QUARANTINE,
          "_source_file are written by the platform")
    return c


def jl(*objs) -> bytes:
    return "".join(json.dumps(o) + "\n" for o in objs).encode()


def jrows(stem: str, n: int = 3, **extra) -> list[dict]:
    return [{"id": f"{stem}-{i}", "amount": i + 1.5, "event_type": "click", "qty": i, **extra} for i in range(n)]


def jsonl_corpus() -> Corpus:
    c = Corpus()
    c.add("j01_good.jsonl", jl(*jrows("j01")), LOAD, jrows("j01"))
    c.add("j02_crlf.jsonl", jl(*jrows("j02")).replace(b"\n", b"\r\n"), LOAD, jrows("j02"))
    c.add("j03_bom.jsonl", b"\xef\xbb\xbf" + jl(*jrows("j03")), LOAD, jrows("j03"))
    r = [{k: v for k, v in x.items() if k != "event_type"} for x in jrows("j04")]
    c.add("j04_missing_field.jsonl", jl(*r), LOAD, r)
    r = jrows("j05", extra={"channel": "web", "tags": ["a", "b"]})
    c.add("j05_nested.jsonl", jl(*r), LOAD, r)
    deep = '{"id": "j06-0", "d": ' + '{"x": ' * 300 + "1" + "}" * 300 + "}\n"
    c.add("j06_deep_300.jsonl", deep.encode(), QUARANTINE, "exceeds the limit max_depth=64")
    c.add("j07_big_field.jsonl", jl(jrows("j07")[0], {"id": "j07-1", "note": "x" * 150_000}), QUARANTINE,
          "a value of 150000 characters in note exceeds the limit max_field_chars=100000")
    c.add("j08_malformed.jsonl", jl(jrows("j08")[0]) + b'{"id": "j08-1", "amo', QUARANTINE, "line 2: not valid JSON")
    c.add("j09_array_line.jsonl", b"[1, 2, 3]\n", QUARANTINE, "line 1: a JSON list, not an object")
    c.add("j10_bad_utf8.jsonl", b'{"id": "j10-0", "event_type": "\xff\xfe"}\n', QUARANTINE, "line 1: not UTF-8 text")
    c.add("j11_gzip_wrong_ext.jsonl", gzip.compress(jl(*jrows("j11"))), QUARANTINE,
          "gzip-compressed but the file name 'j11_gzip_wrong_ext.jsonl' does not say so")
    c.add("j12_blank_lines.jsonl", b"\n   \n\n", EMPTY)
    c.add("j13_zero_byte.jsonl", b"", EMPTY)
    c.add("j14_drift.jsonl", jl({"id": "j14-0", "amount": "abc"}), QUARANTINE,
          "unsafe type change: column amount: expected double, found string")
    c.add("j15_compressed.jsonl.gz", gzip.compress(jl(*jrows("j15"))), LOAD, jrows("j15"))
    c.add("j16_case_dup.jsonl", jl({"id": "j16-0", "ID": "j16-x"}), QUARANTINE, "field names 'id' and 'ID' differ only in case")
    r = [{"id": "j17-0", "note": 1}, {"id": "j17-1", "note": "text"}]
    c.add("j17_mixed_types.jsonl", jl(*r), LOAD, [{"id": "j17-0", "note": "1"}, {"id": "j17-1", "note": "text"}])
    r = [{"id": "j18-0", "amount": 10}]
    c.add("j18_int_amount.jsonl", jl(*r), LOAD, r)
    c.add("j19_long_line.jsonl", jl({"id": "j19-0", **{f"f{i}": "y" * 1000 for i in range(300)}}), QUARANTINE,
          "exceeds the limit max_line_bytes=200000")
    c.add("j20_wide.jsonl", jl({"id": "j20-0", **{f"w{i}": i for i in range(250)}}), QUARANTINE,
          "exceeds the limit max_columns=200")
    return c


def csv_corpus() -> Corpus:
    c = Corpus()

    def crow(stem, n=2, **extra):
        return [{"id": f"{stem}-{i}", "amount": i + 2.25, "event_type": "buy", **extra} for i in range(n)]

    c.add("c01_good.csv", b"id,amount,event_type\nc01-0,2.25,buy\nc01-1,3.25,buy\n", LOAD, crow("c01"))
    c.add("c02_bom_crlf.csv", b"\xef\xbb\xbfid,amount,event_type\r\nc02-0,2.25,buy\r\nc02-1,3.25,buy\r\n", LOAD,
          crow("c02"))
    c.add("c03_reordered.csv", b"event_type,amount,id\nbuy,2.25,c03-0\nbuy,3.25,c03-1\n", LOAD, crow("c03"))
    c.add("c04_mixed_types.csv", b"id,amount,event_type\nc04-0,2.25,buy\nc04-1,n/a,buy\n", QUARANTINE,
          'row 3: column amount: value "n/a" cannot be read as double')
    c.add("c05_dup_header.csv", b"id,amount,id\nc05-0,1,x\n", QUARANTINE, "duplicate column name 'id' in the header")
    c.add("c06_header_only.csv", b"id,amount,event_type\n", EMPTY)
    c.add("c07_ragged.csv", b"id,amount,event_type\nc07-0,1,buy\nc07-1,2\n", QUARANTINE,
          "row 3 has 2 fields, expected 3")
    c.add("c08_bad_utf8.csv", b"id,amount,event_type\nc08-0,1,\xff\xfe\n", QUARANTINE, "not UTF-8 text")
    c.add("c09_new_column.csv", b"id,amount,event_type,coupon_code\nc09-0,2.25,buy,SAVE\nc09-1,3.25,buy,SAVE\n", LOAD,
          crow("c09", coupon_code="SAVE"))
    c.add("c10_quoted.csv", b'id,amount,note\nc10-0,1.5,"a ""quoted"", multi\nline value"\n', LOAD,
          [{"id": "c10-0", "amount": 1.5, "note": 'a "quoted", multi\nline value'}])
    c.add("c11_zero_byte.csv", b"", EMPTY)
    c.add("c12_gzip_wrong_ext.csv", gzip.compress(b"id,amount\nc12-0,1\n"), QUARANTINE, "gzip-compressed")
    c.add("c13_missing_column.csv", b"id,amount\nc13-0,2.25\n", LOAD, [{"id": "c13-0", "amount": 2.25}])
    return c


CORPORA = {"parquet": parquet_corpus, "jsonl": jsonl_corpus, "csv": csv_corpus}
GLOBS = {"parquet": "*.parquet", "jsonl": "*.jsonl*", "csv": "*.csv"}
SOURCE_EXTRA = {
    "parquet": "",
    "jsonl": "limits: {max_field_chars: 100000, max_line_bytes: 200000, max_columns: 200}",
    "csv": "columns: [{name: id, type: string}, {name: amount, type: double}]",
}


def metadata(kind: str, ns: str, bucket: str | None) -> str:
    out = ["pipelines:"] + [f"  - {{pipeline_id: corpus_{fmt}}}" for fmt in CORPORA] + ["sources:"]
    for fmt in CORPORA:
        where = (f"kind: s3, bucket: {bucket}, prefix: corpus/{fmt}/" if kind == "s3"
                 else f"kind: files, path: corpus/{fmt}")
        extra = f", {SOURCE_EXTRA[fmt]}" if SOURCE_EXTRA[fmt] else ""
        out.append(f"  - {{source_id: src_{fmt}, {where}, format: {fmt}, glob: \"{GLOBS[fmt]}\", "
                   f"batch_files: 4{extra}}}")
    out.append("targets:")
    out += [f"  - {{target_id: t_{fmt}, namespace: c_{ns}, table: {fmt}_events}}" for fmt in CORPORA]
    out.append("stages:")
    out += [f"  - {{pipeline_id: corpus_{fmt}, stage_order: 1, stage_name: ingest, layer: bronze, "
            f"source_id: src_{fmt}, target_id: t_{fmt}}}" for fmt in CORPORA]
    return "\n".join(out) + "\n"


def same(expected, got) -> bool:
    if isinstance(expected, dict):
        return isinstance(got, dict) and all(same(v, got.get(k)) for k, v in expected.items())
    if isinstance(expected, float):
        return got is not None and abs(float(got) - expected) < 1e-9
    return expected == got


def check_corpus(platform, fmt: str, corpus: Corpus, uri_of, extra_expect: dict | None = None) -> None:
    expect = {**corpus.expect, **(extra_expect or {})}
    runner = StageRunner(platform, f"corpus_{fmt}", "ingest")
    plan = runner.extract()
    outcome = runner.load(plan)  # the run succeeds: nothing above raised
    assert outcome.published

    ident = runner.target.identifier
    table = platform.pyiceberg_catalog().load_table(ident).scan().to_arrow().to_pylist()
    by_id = {r["id"]: r for r in table}
    loaded = {k: d for k, (o, d) in expect.items() if o == LOAD}
    want_ids = sorted(r["id"] for d in loaded.values() for r in d)
    assert sorted(r["id"] for r in table) == want_ids  # every good row once, nothing else
    for key, file_rows in loaded.items():
        for r in file_rows:
            got = by_id[r["id"]]
            assert same(r, got), (key, r, got)
            assert got["_source_file"] == uri_of(key), (key, got["_source_file"])
        if fmt != "parquet" or key != "p03_missing_event_type.parquet":
            continue
        assert all(by_id[r["id"]]["event_type"] is None for r in file_rows)  # a column a file lacks is NULL

    states = {r["file_key"]: r for r in Checkpoints(platform, ident).rows()}
    quarantined = {k: d for k, (o, d) in expect.items() if o == QUARANTINE}
    for key, reason in quarantined.items():
        assert states[key]["status"] == "quarantined", (key, states.get(key))
        assert reason in states[key]["error"], (key, states[key]["error"])
    for key in (k for k, (o, _) in expect.items() if o == EMPTY):
        assert states[key]["status"] == "empty", (key, states.get(key))
    for key in loaded:
        assert states[key]["status"] == "processed", (key, states.get(key))
    events = platform.store.audit_entries(run_id=runner.run_id, event="file_quarantined")
    assert sorted(e.details["key"] for e in events) == sorted(quarantined)
    assert all(e.message.startswith(e.details["key"] + ": ") for e in events)  # the reason names the file
    md = outcome.metadata()
    assert md["quarantined_files"] == len(quarantined)
    assert md["rows_written"] == len(want_ids)


@pytest.fixture
def restore_umask():
    old = os.umask(0o077)
    os.umask(old)
    yield
    os.umask(old)


def test_corpus_through_a_files_source(platform, tmp_path, unique_ns, restore_umask):
    meta = tmp_path / "corpus.yaml"
    meta.write_text(metadata("files", unique_ns, None))
    platform.store.apply(load_metadata(meta))
    landing = platform.settings.landing_dir
    corpora = {fmt: build() for fmt, build in CORPORA.items()}
    for fmt, corpus in corpora.items():
        root = landing / "corpus" / fmt
        root.mkdir(parents=True, exist_ok=True)
        for key, data in corpus.files.items():
            (root / key).write_bytes(data)
    # roots are walls: a symlink out of the landing root is refused; one that stays inside is read
    outside = tmp_path / "outside.parquet"
    outside.write_bytes(pq_bytes(rows("secret"), BASE))
    proot = landing / "corpus" / "parquet"
    os.symlink(outside, proot / "p21_symlink_out.parquet")
    (proot / "store").mkdir()
    (proot / "store" / "real.bin").write_bytes(pq_bytes(rows("p22"), BASE))
    os.symlink(proot / "store" / "real.bin", proot / "p22_symlink_in.parquet")
    extra = {"parquet": {"p21_symlink_out.parquet": (QUARANTINE, f"refused: symlink -> {outside} leaves the source root"),
                         "p22_symlink_in.parquet": (LOAD, rows("p22"))}}
    cases = sum(len(c.files) for c in corpora.values()) + 2
    assert cases >= 50

    for fmt, corpus in corpora.items():
        root = (landing / "corpus" / fmt).resolve()
        check_corpus(platform, fmt, corpus, lambda key, root=root: (root / key).as_uri(), extra.get(fmt))

    # what the platform created is owner-only: control DB, catalog, every warehouse file and directory
    home = platform.settings.home
    created = [home / "control.db", home / "catalog.db", *platform.settings.warehouse_path.rglob("*")]
    assert len(created) > 20
    loose = [(str(p), oct(stat.S_IMODE(p.stat().st_mode))) for p in created if stat.S_IMODE(p.stat().st_mode) & 0o077]
    assert loose == []


def test_corpus_through_an_s3_source(platform, tmp_path, unique_ns, s3_server, monkeypatch):
    monkeypatch.setenv("LAKEHOUSE_S3_ENDPOINT_URL", s3_server.endpoint_url)
    client = s3_server.client()
    bucket = s3_server.new_bucket()
    meta = tmp_path / "corpus.yaml"
    meta.write_text(metadata("s3", unique_ns, bucket))
    platform.store.apply(load_metadata(meta))
    corpora = {fmt: build() for fmt, build in CORPORA.items()}
    for fmt, corpus in corpora.items():
        for key, data in corpus.files.items():
            client.put_object(Bucket=bucket, Key=f"corpus/{fmt}/{key}", Body=data)
    # a key with a '..' segment is refused, never read (s3a:// would normalise it out of the prefix)
    escape = "corpus/jsonl/sub/../../parquet/j21_escape.jsonl"
    client.put_object(Bucket=bucket, Key=escape, Body=jl({"id": "j21-0"}))
    keys = {o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="corpus/jsonl/")["Contents"]}
    assert escape in keys
    extra = {"jsonl": {"sub/../../parquet/j21_escape.jsonl": (QUARANTINE, "has a '.' or '..' segment")}}

    for fmt, corpus in corpora.items():
        prefixed = Corpus({f"corpus/{fmt}/{k}": v for k, v in corpus.files.items()},
                          {f"corpus/{fmt}/{k}": v for k, v in corpus.expect.items()})
        more = {f"corpus/{fmt}/{k}": v for k, v in extra.get(fmt, {}).items()}
        check_corpus(platform, fmt, prefixed, lambda key: f"s3://{bucket}/{key}", more)
