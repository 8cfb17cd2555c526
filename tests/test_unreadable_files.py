"""A file that cannot be read is that file's problem (issue 40, item 1), on both engines: a Parquet
file with an intact footer and a corrupt data page, JSON-lines and CSV files compressed with gzip,
bzip2 or zstd (named so, or not), files deleted or rewritten between the plan and the read (and a
flicker loop deleting and rewriting one during the run). Each time, with good files beside it: the
good rows land exactly once (read back with PyIceberg, an independent reader), each bad file is
quarantined with its reason where the operator looks (`lakehouse checkpoints show --status
quarantined`, the run's `files_quarantined`), a vanished or changed file is left for the next run
with its reason, and no audit branch is left.

The Arrow engine's cases are the fast lane's (no JVM); Spark's are `slow` (the session's `spark`)."""

from __future__ import annotations

import bz2
import gzip
import json
import os
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lakehouse import cli
from lakehouse.control import faults
from lakehouse.control.healing import matches
from lakehouse.engines.isolate import find_unreadable, reason_of
from lakehouse.errors import CORRUPT_INPUT, classify
from lakehouse.ingest.checkpoints import Checkpoints
from lakehouse.metadata.loader import load_metadata
from lakehouse.metadata.model import HealingAction
from lakehouse.metadata.store import MetadataStore
from lakehouse.platform import Platform
from lakehouse.stage.runner import StageRunner

META = """
pipelines:
  - {{pipeline_id: p}}
sources:
  - {{source_id: raw, kind: files, format: {fmt}, path: in, glob: "{glob}", batch_files: 50}}
targets:
  - {{target_id: t, namespace: u_{ns}, table: events, engine: {engine}}}
stages:
  - {{pipeline_id: p, stage_order: 1, stage_name: ingest, layer: bronze, source_id: raw, target_id: t}}
"""


@pytest.fixture(autouse=True)
def _no_faults(monkeypatch):
    monkeypatch.delenv(faults.ENV, raising=False)
    faults.reset()
    yield
    faults.reset()


@pytest.fixture
def lake(settings):
    """A platform with no SparkSession behind it (the Arrow engine's cases)."""
    return Platform(settings, MetadataStore(settings.control_db_url))


def setup(platform, tmp_path, ns: str, engine: str, fmt: str = "parquet", glob: str | None = None) -> str:
    path = tmp_path / f"meta_{engine}_{fmt}.yaml"
    path.write_text(META.format(fmt=fmt, glob=glob or f"*.{fmt}*", ns=ns, engine=engine))
    platform.store.apply(load_metadata(path))
    (platform.settings.landing_dir / "in").mkdir(parents=True, exist_ok=True)
    return f"u_{ns}.events"


def landing(platform):
    return platform.settings.landing_dir / "in"


def good_parquet(path, stem: str, n: int = 4000) -> list[str]:
    ids = [f"{stem}-{i}" for i in range(n)]
    pq.write_table(pa.table({"id": ids, "amount": [float(i) for i in range(n)]}), path, row_group_size=1000)
    return ids


#: corrupt data pages behind an intact footer, each at row group 2 of a 4,000-row file
#: (row_group_size=1000); what pyarrow says of each is in the comment
CORRUPTIONS = {
    # issue 40's repro: 200 bytes overwritten 40 bytes after the first data_page_offset
    # ("Deserializing page header failed" / Spark: "can not read class ...PageHeader")
    "page_header_garbage": lambda d, cc: d.__setitem__(slice(cc.data_page_offset + 40, cc.data_page_offset + 240),
                                                       b"\xff" * 200),
    # a page header whose sizes are negative ("Invalid page header" / "PageHeader: Negative length")
    "negative_page_size": lambda d, cc: d.__setitem__(slice(cc.data_page_offset, cc.data_page_offset + 6),
                                                      b"\x15\x00\x15\x01\x15\x01"),
    # the dictionary page's compressed bytes zeroed ("Corrupt snappy compressed data")
    "corrupt_compressed_page": lambda d, cc: d.__setitem__(
        slice(cc.dictionary_page_offset + 40, cc.dictionary_page_offset + 90), b"\x00" * 50),
}


def corrupt_parquet(path, variant: str) -> None:
    good_parquet(path, "bad")
    cc = pq.read_metadata(path).row_group(2).column(0)
    data = bytearray(path.read_bytes())
    CORRUPTIONS[variant](data, cc)
    path.write_bytes(bytes(data))
    pq.read_metadata(path)  # the footer is intact: the probe passes it


def run(platform, run_id: str | None = None):
    runner = StageRunner(platform, "p", "ingest", run_id)
    plan = runner.extract()
    return runner, runner.load(plan)


def ids(platform, ident: str) -> list[str]:
    return sorted(platform.pyiceberg_catalog().load_table(ident).scan(selected_fields=("id",)).to_arrow()
                  .column("id").to_pylist())


def refs(platform, ident: str) -> set[str]:
    return set(platform.pyiceberg_catalog().load_table(ident).metadata.refs)


def statuses(platform, ident: str) -> dict[str, tuple[str, str | None]]:
    return {r["file_key"]: (r["status"], r["error"]) for r in Checkpoints(platform, ident).rows()}


def assert_quarantined(platform, ident: str, runner, outcome, expected: dict[str, str]) -> None:
    """Each file of `expected` quarantined with its reason: in the checkpoints (what `lakehouse
    checkpoints show --status quarantined` lists), the audit log and the run's metadata."""
    got = statuses(platform, ident)
    for key, reason in expected.items():
        assert got[key][0] == "quarantined", (key, got.get(key))
        assert reason.lower() in (got[key][1] or "").lower(), (key, got[key][1])
    events = platform.store.audit_entries(run_id=runner.run_id, event="file_quarantined")
    assert sorted({e.details["key"] for e in events}) == sorted(expected)
    if expected:
        assert outcome.metadata()["files_quarantined"] == len(expected)


def assert_listed_by_the_cli(ident: str, keys: list[str], capsys) -> None:
    assert cli.main(["checkpoints", "show", ident, "--status", "quarantined"]) in (0, None)
    out = capsys.readouterr().out
    for key in keys:
        assert key in out


# --------------------------------------------------------------------------- the shared pieces


def test_every_unreadable_file_error_is_corrupt_input_and_the_healing_rule_matches_it():
    rule = HealingAction(healing_id="corrupt", error_code=CORRUPT_INPUT, actions=["quarantine_input"])
    for text in ("Couldn't deserialize thrift: don't know what type: 15\nDeserializing page header failed.",
                 "java.io.IOException: can not read class org.apache.parquet.format.PageHeader: Negative length",
                 "PageHeader: Negative length: -1",
                 "Invalid page header", "Corrupt snappy compressed data.",
                 "java.io.IOException: FAILED_TO_UNCOMPRESS(5)",
                 "in/a.jsonl.gz: pyarrow cannot read this file as its probe planned: JSON parse error: Invalid value.",
                 "[PATH_NOT_FOUND] Path does not exist: file:/landing/in/b.json.",
                 "org.apache.spark.SparkFileNotFoundException: File file:/landing/in/b.json does not exist",
                 "java.lang.RuntimeException: native zStandard library not available: this version of "
                 "libhadoop was built without zstd support."):
        info = classify(RuntimeError(text))
        assert info.code == CORRUPT_INPUT, text
        assert matches(rule, info)


def test_bisection_finds_every_failing_file_and_reads_a_lone_one_once():
    from lakehouse.stage.core import FileRef

    files = [FileRef(f"f{i}", 1, "e") for i in range(16)]
    bad = {"f3", "f11"}
    reads = []

    def check(group):
        reads.append(len(group))
        hit = bad & {f.key for f in group}
        if hit:
            raise ValueError(f"cannot read {sorted(hit)[0]}")

    found = find_unreadable(files, check)
    assert sorted(found) == sorted(bad)
    assert len(reads) <= 2 * len(bad) * 4 + 2  # ~2·k·log2(n), not one read per file
    reads.clear()
    assert list(find_unreadable([files[3]], check)) == ["f3"] and reads == [1]


def test_a_spark_reason_is_the_innermost_cause_on_one_line():
    text = ("An error occurred while calling o63.save.\n: org.apache.spark.SparkException: Job aborted due to "
            "stage failure: ...\n\tat org.apache.spark.x(X.scala:1)\nCaused by: java.io.IOException: can not read "
            "class org.apache.parquet.format.PageHeader: x\nCaused by: shaded.parquet.org.apache.thrift.protocol."
            "TProtocolException: don't know what type: 15\n\tat y")
    assert reason_of(RuntimeError(text)).endswith("TProtocolException: don't know what type: 15")


# --------------------------------------------------------------------------- corrupt pages


def _corrupt_page_case(platform, tmp_path, ns, engine, variant, capsys):
    ident = setup(platform, tmp_path, ns, engine)
    want = good_parquet(landing(platform) / "a_good.parquet", "good")
    corrupt_parquet(landing(platform) / "b_corrupt.parquet", variant)
    runner, outcome = run(platform)
    assert outcome.published
    assert ids(platform, ident) == sorted(want)  # the good file's 4,000 rows, once
    assert_quarantined(platform, ident, runner, outcome, {"b_corrupt.parquet": "unreadable"})
    assert refs(platform, ident) == {"main"}  # no audit branch left
    assert not runner.healing.events  # found by the read itself, not by a healing rule
    assert_listed_by_the_cli(ident, ["b_corrupt.parquet"], capsys)
    _, again = run(platform)  # the quarantined file is not planned again
    assert again.skipped_reason and ids(platform, ident) == sorted(want)


@pytest.mark.parametrize("variant", sorted(CORRUPTIONS))
def test_arrow_a_corrupt_page_quarantines_its_file_and_the_good_file_publishes(lake, tmp_path, unique_ns, variant,
                                                                               capsys):
    _corrupt_page_case(lake, tmp_path, unique_ns, "arrow", variant, capsys)


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(CORRUPTIONS))
def test_spark_a_corrupt_page_quarantines_its_file_and_the_good_file_publishes(platform, tmp_path, unique_ns, variant,
                                                                               capsys):
    _corrupt_page_case(platform, tmp_path, unique_ns, "spark", variant, capsys)


# --------------------------------------------------------------------------- compressed inputs


def _zstd(data: bytes) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.CompressedOutputStream(sink, "zstd") as out:
        out.write(data)
    return sink.getvalue().to_pybytes()


def _compressed_landing(platform, fmt: str, engine: str) -> tuple[list[str], dict[str, str]]:
    """Good plain and compressed files (by name), and compressed content under a plain name."""
    ext = "jsonl" if fmt == "jsonl" else "csv"

    def body(stem: str) -> bytes:
        if fmt == "jsonl":
            return "".join(json.dumps({"id": f"{stem}-{i}", "amount": i + 0.5}) + "\n" for i in range(3)).encode()
        return ("id,amount\n" + "".join(f"{stem}-{i},{i + 0.5}\n" for i in range(3))).encode()

    root = landing(platform)
    want: list[str] = []
    files = {f"plain.{ext}": body("plain"), f"gz.{ext}.gz": gzip.compress(body("gz")),
             f"bz.{ext}.bz2": bz2.compress(body("bz")), f"zs.{ext}.zst": _zstd(body("zs")),
             f"gzmagic.{ext}": gzip.compress(body("gzmagic")), f"bzmagic.{ext}": bz2.compress(body("bzmagic")),
             f"zsmagic.{ext}": _zstd(body("zsmagic"))}
    for name, data in files.items():
        (root / name).write_bytes(data)
    quarantined = {f"gzmagic.{ext}": "gzip-compressed but the file name", f"bzmagic.{ext}": "bzip2-compressed but",
                   f"zsmagic.{ext}": "zstd-compressed but"}
    for stem in ("plain", "gz", "bz", "zs"):  # Spark reads .zst with aircompressor's pure-Java codec
        want += [f"{stem}-{i}" for i in range(3)]
    return sorted(want), quarantined


def _compressed_case(platform, tmp_path, ns, engine, fmt):
    ident = setup(platform, tmp_path, ns, engine, fmt=fmt)
    want, quarantined = _compressed_landing(platform, fmt, engine)
    runner, outcome = run(platform)
    assert outcome.published
    assert ids(platform, ident) == want
    assert_quarantined(platform, ident, runner, outcome, quarantined)
    ext = "jsonl" if fmt == "jsonl" else "csv"
    for name in (f"gz.{ext}.gz", f"bz.{ext}.bz2", f"zs.{ext}.zst"):  # recorded under its own name
        assert statuses(platform, ident)[name][0] == "processed", name
    assert refs(platform, ident) == {"main"}


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_arrow_reads_gzip_bzip2_and_zstd_by_name_and_quarantines_unnamed_compression(lake, tmp_path, unique_ns, fmt):
    _compressed_case(lake, tmp_path, unique_ns, "arrow", fmt)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_spark_reads_gzip_bzip2_and_zstd_by_name_and_quarantines_unnamed_compression(platform, tmp_path, unique_ns, fmt):
    _compressed_case(platform, tmp_path, unique_ns, "spark", fmt)


def test_auto_engine_loads_a_gzipped_jsonl_beside_a_plain_one(lake, tmp_path, unique_ns):
    ident = setup(lake, tmp_path, unique_ns, "auto", fmt="jsonl")
    root = landing(lake)
    (root / "a.jsonl").write_text("".join(json.dumps({"id": f"a-{i}"}) + "\n" for i in range(3)))
    (root / "b.jsonl.gz").write_bytes(gzip.compress(b"".join(json.dumps({"id": f"b-{i}"}).encode() + b"\n"
                                                             for i in range(3))))
    _, outcome = run(lake)
    assert outcome.metadata()["engine"] == "arrow"
    assert ids(lake, ident) == sorted([f"a-{i}" for i in range(3)] + [f"b-{i}" for i in range(3)])


# --------------------------------------------------------------------------- vanished and changed files


def jsonl(path, stem: str, n: int = 3) -> list[str]:
    path.write_text("".join(json.dumps({"id": f"{stem}-{i}", "amount": 1.0}) + "\n" for i in range(n)))
    return [f"{stem}-{i}" for i in range(n)]


def _deferred(platform, runner) -> dict[str, str]:
    return {e.details["key"]: e.message for e in platform.store.audit_entries(run_id=runner.run_id,
                                                                              event="file_deferred")}


def _vanish_between_plan_and_read(platform, tmp_path, ns, engine):
    ident = setup(platform, tmp_path, ns, engine, fmt="jsonl")
    root = landing(platform)
    want = jsonl(root / "a.jsonl", "a") + jsonl(root / "d.jsonl", "d")
    jsonl(root / "b.jsonl", "b")
    jsonl(root / "c.jsonl", "c")
    runner = StageRunner(platform, "p", "ingest")
    plan = runner.extract()
    (root / "b.jsonl").unlink()  # deleted after the plan
    time.sleep(0.01)
    new_c = jsonl(root / "c.jsonl", "c2", n=4)  # rewritten after the plan
    outcome = runner.load(plan)
    assert outcome.published and ids(platform, ident) == sorted(want)
    deferred = _deferred(platform, runner)
    assert "vanished" in deferred["b.jsonl"] and "changed" in deferred["c.jsonl"]
    assert outcome.metadata()["files_deferred"] == 2
    got = statuses(platform, ident)
    assert "b.jsonl" not in got and "c.jsonl" not in got  # nothing recorded: left for the next run
    assert refs(platform, ident) == {"main"}
    _, again = run(platform)  # the next run loads the rewritten file as it is now
    assert again.published and ids(platform, ident) == sorted(want + new_c)


def test_arrow_a_file_deleted_or_rewritten_after_the_plan_is_left_for_the_next_run(lake, tmp_path, unique_ns):
    _vanish_between_plan_and_read(lake, tmp_path, unique_ns, "arrow")


@pytest.mark.slow
def test_spark_a_file_deleted_or_rewritten_after_the_plan_is_left_for_the_next_run(platform, tmp_path, unique_ns):
    _vanish_between_plan_and_read(platform, tmp_path, unique_ns, "spark")


@pytest.mark.slow
def test_spark_a_file_deleted_under_sparks_read_is_left_for_the_next_run(platform, tmp_path, unique_ns, monkeypatch):
    """The file is there when the batch is checked and gone when Spark's task opens it
    ([PATH_NOT_FOUND] inside the branch write): the batch is written without it."""
    ident = setup(platform, tmp_path, unique_ns, "spark", fmt="jsonl")
    root = landing(platform)
    want = jsonl(root / "a.jsonl", "a") + jsonl(root / "c.jsonl", "c")
    jsonl(root / "b.jsonl", "b")
    pause = tmp_path / "pause"
    pause.mkdir()
    monkeypatch.setenv("LAKEHOUSE_PAUSE_AT", "batch")  # right before the branch write, after the check
    monkeypatch.setenv("LAKEHOUSE_PAUSE_DIR", str(pause))
    monkeypatch.setenv("LAKEHOUSE_PAUSE_SECONDS", "60")

    def delete_when_paused():
        deadline = time.monotonic() + 120
        while not list(pause.glob("batch.*")) and time.monotonic() < deadline:
            time.sleep(0.05)
        (root / "b.jsonl").unlink()
        (pause / "release").write_text("")

    t = threading.Thread(target=delete_when_paused, daemon=True)
    t.start()
    runner, outcome = run(platform)
    t.join(5)
    assert outcome.published and ids(platform, ident) == sorted(want)
    assert "vanished" in _deferred(platform, runner)["b.jsonl"]
    assert "b.jsonl" not in statuses(platform, ident)
    assert refs(platform, ident) == {"main"}


def _flicker_case(platform, tmp_path, ns, engine):
    """A thread deletes and rewrites one file (new content each time) while runs load it and good
    files: every run succeeds, the good rows land once, each version of the flickering file at most
    once, and once it holds still the next run loads its last version."""
    ident = setup(platform, tmp_path, ns, engine, fmt="jsonl")
    root = landing(platform)
    want = []
    for i in range(6):
        want += jsonl(root / f"good{i}.jsonl", f"good{i}", n=20)
    flick = root / "flicker.jsonl"
    jsonl(flick, "v0")
    stop = threading.Event()
    versions = [0]

    def flicker():
        while not stop.is_set():
            flick.unlink(missing_ok=True)
            time.sleep(0.003)
            versions[0] += 1
            tmp = root / ".flicker.tmp"  # dot files are not listed; the rename is atomic
            jsonl(tmp, f"v{versions[0]}")
            os.replace(tmp, flick)
            time.sleep(0.003)

    t = threading.Thread(target=flicker, daemon=True)
    t.start()
    try:
        for _ in range(2):
            _runner, outcome = run(platform)
            assert outcome.published
            assert refs(platform, ident) == {"main"}
    finally:
        stop.set()
        t.join(5)
    time.sleep(0.01)
    last = jsonl(flick, "final")
    run(platform)
    got = ids(platform, ident)
    assert sorted(x for x in got if x.startswith("good")) == sorted(want)  # the good rows once
    flickered = [x for x in got if not x.startswith("good")]
    assert len(flickered) == len(set(flickered))  # no version of the flickering file twice
    assert set(last) <= set(flickered)
    assert refs(platform, ident) == {"main"}


def test_arrow_a_flickering_file_never_fails_the_run(lake, tmp_path, unique_ns):
    _flicker_case(lake, tmp_path, unique_ns, "arrow")


@pytest.mark.slow
def test_spark_a_flickering_file_never_fails_the_run(platform, tmp_path, unique_ns):
    _flicker_case(platform, tmp_path, unique_ns, "spark")


def test_the_run_summary_shows_quarantined_and_deferred_files_and_where_to_read_why():
    from lakehouse.stage.run_summary import RunSummary, StageReport

    s = StageReport("bronze/events", "p.ingest", materialized=True, rows_written=3, files_quarantined=2,
                    files_deferred=1)
    text = RunSummary("r1", "p", [s]).table()
    assert "files q." in text and "files quarantined: 2" in text and "--event file_quarantined" in text
    assert "left for the next run" in text and "--event file_deferred" in text


def _only_bad_files_case(platform, tmp_path, ns, engine):
    """Every file of the run unreadable: the run still ends well, quarantines them, leaves no branch."""
    ident = setup(platform, tmp_path, ns, engine)
    corrupt_parquet(landing(platform) / "a_corrupt.parquet", "page_header_garbage")
    corrupt_parquet(landing(platform) / "b_corrupt.parquet", "corrupt_compressed_page")
    runner, outcome = run(platform)
    assert outcome.published
    assert_quarantined(platform, ident, runner, outcome, {"a_corrupt.parquet": "unreadable",
                                                          "b_corrupt.parquet": "unreadable"})
    if platform.pyiceberg_catalog().table_exists(ident):
        assert ids(platform, ident) == [] and refs(platform, ident) <= {"main"}


def test_arrow_a_run_of_only_unreadable_files_quarantines_them_all(lake, tmp_path, unique_ns):
    _only_bad_files_case(lake, tmp_path, unique_ns, "arrow")


@pytest.mark.slow
def test_spark_a_run_of_only_unreadable_files_quarantines_them_all(platform, tmp_path, unique_ns):
    _only_bad_files_case(platform, tmp_path, unique_ns, "spark")


def test_spark_is_told_to_read_zst_with_a_codec_its_own_jars_hold(settings):
    """`.zst` on Spark rests on aircompressor's pure-Java ZstdCodec, which Spark ships (for ORC); a
    Spark whose jars lack it would quarantine every `.zst` file again: this says so first."""
    import zipfile
    from pathlib import Path

    import pyspark

    from lakehouse.runtime.spark import ZSTD_CODEC, spark_conf

    assert spark_conf(settings)["spark.hadoop.io.compression.codecs"] == ZSTD_CODEC
    entry = ZSTD_CODEC.replace(".", "/") + ".class"
    jars = sorted((Path(pyspark.__file__).parent / "jars").glob("aircompressor-*.jar"))
    assert any(entry in zipfile.ZipFile(j).namelist() for j in jars), jars
